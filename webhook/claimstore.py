"""The webhook's I/O edge for DRA mode: create claim templates, read the fleet's card sizes.

``ClaimStore`` (Protocol) is what the HTTP edge (``webhook.server``) needs; ``ApiClaimStore``
does it through the Kubernetes API (resource.k8s.io/v1, plain JSON through the kubernetes
client's ``CustomObjectsApi``), connecting on first use: with ``kubeconfig`` (a path), else the
in-cluster service account. An extender-mode webhook never connects (and needs no token).

- ``ensure_template(template)``: POST the ResourceClaimTemplate into its namespace; 409
  Already Exists is fine when the one there has the same ``spec`` (the name is a hash of it),
  else an error (someone wrote another spec under egpu's name). RBAC: resourceclaimtemplates
  create, get. Fields the API server defaults are ignored, Quantities compare by value.
- ``card_sizes_mib()``: the distinct ``memoryMiB`` of the devices of driver ``gpu.egpu.io``
  (ResourceSlices: list), cached for ``cache_s`` seconds; read only for a memory percentage.

Errors are ``ClaimStoreError`` (a template) or ``ClaimPlanError`` (the card sizes, which the
review turns into a denial), each saying what failed; calls time out after ``timeout_s``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from egpu.contract import DRA_ATTR_MEMORY_MIB, DRA_DRIVER
from egpu.dra.claims import ClaimPlanError, same_template_spec

GROUP = "resource.k8s.io"
VERSION = "v1"
DEFAULT_TIMEOUT_S = 3.0  # the API server gives the whole review 5 s (timeoutSeconds)
DEFAULT_CACHE_S = 30.0


class ClaimStoreError(RuntimeError):
    """A claim template could not be created; the message says which and why."""


class ClaimStore(Protocol):
    """What the webhook's HTTP edge needs in DRA mode."""

    def ensure_template(self, template: dict[str, Any]) -> None:
        """Make sure ``template`` (with its namespace) exists. Raises ClaimStoreError."""

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

    def ensure_template(self, template: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        namespace = template["metadata"]["namespace"]
        name = template["metadata"]["name"]
        where = f"ResourceClaimTemplate {namespace}/{name}"
        try:
            api = self._api()
            api.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaimtemplates", template,
                _request_timeout=self.timeout_s)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise ClaimStoreError(f"{where}: creating it failed: {_api_reason(exc)}") from None
        except Exception as exc:  # no config, no route, a timeout: say which
            raise ClaimStoreError(f"{where}: creating it failed: {exc}") from None
        try:
            existing = api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaimtemplates", name,
                _request_timeout=self.timeout_s)
        except Exception as exc:
            reason = _api_reason(exc) if isinstance(exc, ApiException) else str(exc)
            raise ClaimStoreError(f"{where}: it exists and reading it failed: {reason}") from None
        if not same_template_spec(existing.get("spec"), template["spec"]):
            raise ClaimStoreError(
                f"{where} exists with another spec than egpu's for this share (the name is "
                "the hash of the spec egpu writes); delete it and create the pod again")

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


def _api_reason(exc: Any) -> str:
    """The API server's message of an ApiException (its Status), else the HTTP reason."""
    import json

    try:
        body = json.loads(exc.body)
        return f"{exc.status} {body.get('reason', '')}: {body.get('message', '')}".strip()
    except (TypeError, ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"
