"""The webhook's I/O edge for DRA mode: create and sweep pods' claims, read the card sizes.

``ClaimStore`` (Protocol) is what the HTTP edge (``webhook.server``) needs; ``ApiClaimStore``
does it through the Kubernetes API (resource.k8s.io/v1, plain JSON through the kubernetes
client's ``CustomObjectsApi``), connecting on first use: with ``kubeconfig`` (a path), else the
in-cluster service account. A webhook that never meets a DRA pod, in a config that makes
none, never connects (and needs no token).

- ``create_claim(claim)``: POST the pod's ResourceClaim into its namespace; 409 Already
  Exists is fine when the one there is egpu's (label ``app.kubernetes.io/managed-by:
  egpu-webhook``) with the same ``spec``: a retried review of one admission request (the
  name comes from its uid); else an error. Fields the API server defaults are ignored,
  Quantities compare by value.
- For the sweeper (``webhook.claimsweep``): ``webhook_claims()`` lists the claims of that
  label in all namespaces, ``pods_in(namespace)`` a namespace's pods (JSON), and
  ``delete_claim`` deletes one with preconditions on its uid and resourceVersion (False when
  it is gone or changed since it was read).
- RBAC: resourceclaims create, get, list, delete; pods list; resourceslices list.
- ``card_sizes_mib()``: the distinct ``memoryMiB`` of the devices of driver ``gpu.egpu.io``
  (ResourceSlices: list), cached for ``cache_s`` seconds; read only for a memory percentage.

Errors are ``ClaimStoreError`` (a claim, a listing) or ``ClaimPlanError`` (the card sizes,
which the review turns into a denial), each saying what failed; calls time out after ``timeout_s``.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Protocol

from egpu.contract import DRA_ATTR_MEMORY_MIB, DRA_DRIVER, DRA_TEMPLATE_MANAGER, LABEL_MANAGED_BY
from egpu.dra.claims import ClaimPlanError, same_template_spec

GROUP = "resource.k8s.io"
VERSION = "v1"
RESOURCE_CLAIMS = "resourceclaims"
WEBHOOK_CLAIMS_SELECTOR = f"{LABEL_MANAGED_BY}={DRA_TEMPLATE_MANAGER}"
DEFAULT_TIMEOUT_S = 3.0  # the API server gives the whole review 5 s (timeoutSeconds)
DEFAULT_CACHE_S = 30.0


class ClaimStoreError(RuntimeError):
    """A claim could not be created, listed or deleted; the message says which and why."""


class ClaimStore(Protocol):
    """What the webhook's HTTP edge needs in DRA mode."""

    def create_claim(self, claim: dict[str, Any]) -> None:
        """Create ``claim`` (with its namespace). Raises ClaimStoreError."""

    def card_sizes_mib(self) -> tuple[int, ...]:
        """The fleet's card sizes in MiB. Raises ClaimPlanError when they cannot be read."""


class ApiClaimStore:
    """``ClaimStore`` on the Kubernetes API (see the module docstring)."""

    def __init__(self, kubeconfig: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                 cache_s: float = DEFAULT_CACHE_S) -> None:
        self.kubeconfig = kubeconfig
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._custom: Any = None
        self._sizes: tuple[int, ...] = ()
        self._sizes_at = float("-inf")

    def _api(self) -> Any:
        with self._lock:
            if self._custom is None:
                from kubernetes import client, config

                if self.kubeconfig:
                    api = config.new_client_from_config(config_file=self.kubeconfig)
                else:
                    config.load_incluster_config()
                    api = client.ApiClient()
                self._custom = client.CustomObjectsApi(api)
            return self._custom

    def create_claim(self, claim: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace = claim["metadata"]["namespace"]
        name = claim["metadata"]["name"]
        where = f"ResourceClaim {namespace}/{name}"
        try:
            api = self._api()
            api.create_namespaced_custom_object(
                GROUP, VERSION, namespace, RESOURCE_CLAIMS, claim,
                _request_timeout=self.timeout_s)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise ClaimStoreError(f"{where}: creating it failed: {_api_reason(exc)}") from None
        except Exception as exc:  # no config, no route, a timeout: say which
            raise ClaimStoreError(f"{where}: creating it failed: {exc}") from None
        try:  # a retried review of the same request: its claim is there already
            existing = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, RESOURCE_CLAIMS, name,
                _request_timeout=self.timeout_s)
        except Exception as exc:
            reason = _api_reason(exc) if isinstance(exc, ApiException) else str(exc)
            raise ClaimStoreError(f"{where}: it exists and reading it failed: {reason}") from None
        labels = (existing.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_MANAGED_BY) != DRA_TEMPLATE_MANAGER or not same_template_spec(
                existing.get("spec"), claim["spec"]):
            raise ClaimStoreError(
                f"{where} exists and is not the one egpu wrote for this admission request "
                "(its name comes from the request's uid); delete it and create the pod again")

    def webhook_claims(self) -> list[dict[str, Any]]:
        try:
            listed = self._api().list_cluster_custom_object(
                GROUP, VERSION, RESOURCE_CLAIMS, label_selector=WEBHOOK_CLAIMS_SELECTOR,
                _request_timeout=self.timeout_s)
        except Exception as exc:
            raise ClaimStoreError(f"listing the webhook's ResourceClaims failed: "
                                  f"{_reason(exc)}") from None
        return list(listed.get("items") or [])

    def pods_in(self, namespace: str) -> list[dict[str, Any]]:
        from kubernetes import client

        try:
            api = self._api()
            core = client.CoreV1Api(api.api_client)
            answer: Any = core.list_namespaced_pod(  # raw: only a few fields are read
                namespace, _preload_content=False, _request_timeout=self.timeout_s)
            return list(json.loads(answer.data).get("items") or [])
        except Exception as exc:
            raise ClaimStoreError(f"listing the pods of namespace {namespace} failed: "
                                  f"{_reason(exc)}") from None

    def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self._api().delete_namespaced_custom_object(
                GROUP, VERSION, namespace, RESOURCE_CLAIMS, name,
                body={"preconditions": {"uid": uid, "resourceVersion": resource_version}},
                _request_timeout=self.timeout_s)
            return True
        except ApiException as exc:
            if exc.status in (404, 409):  # gone already, or changed since it was read
                return False
            raise ClaimStoreError(f"ResourceClaim {namespace}/{name}: deleting it failed: "
                                  f"{_api_reason(exc)}") from None
        except Exception as exc:
            raise ClaimStoreError(f"ResourceClaim {namespace}/{name}: deleting it failed: "
                                  f"{exc}") from None

    def card_sizes_mib(self) -> tuple[int, ...]:
        now = time.monotonic()
        if now - self._sizes_at < self.cache_s:
            return self._sizes
        try:
            listed = self._api().list_cluster_custom_object(
                GROUP, VERSION, "resourceslices", _request_timeout=self.timeout_s)
        except Exception as exc:
            raise ClaimPlanError(
                f"a memory percentage needs the fleet's card sizes, and reading the "
                f"ResourceSlices failed ({str(exc).strip()[:200]}); allowed: egpu.io/gpu-memory "
                "in MiB, or retry") from None
        self._sizes = card_sizes_of(listed.get("items") or [])
        self._sizes_at = now
        return self._sizes


def card_sizes_of(slices: list[dict[str, Any]]) -> tuple[int, ...]:
    """The distinct ``memoryMiB`` attributes (MiB) of the devices of driver ``gpu.egpu.io`` in
    ``slices`` (ResourceSlice objects), largest first."""
    sizes: set[int] = set()
    for body in slices:
        spec = body.get("spec") or {}
        if spec.get("driver") != DRA_DRIVER:
            continue
        for device in spec.get("devices") or []:
            value = ((device.get("attributes") or {}).get(DRA_ATTR_MEMORY_MIB) or {}).get("int")
            if isinstance(value, int) and value > 0:
                sizes.add(value)
    return tuple(sorted(sizes, reverse=True))


def _reason(exc: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    return _api_reason(exc) if isinstance(exc, ApiException) else str(exc)


def _api_reason(exc: Any) -> str:
    """The API server's message of an ApiException (its Status), else the HTTP reason."""
    try:
        body = json.loads(exc.body)
        return f"{exc.status} {body.get('reason', '')}: {body.get('message', '')}".strip()
    except (TypeError, ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"
