"""The kubelet plugin's reads from the API server (``driver.ApiReader``), as plain JSON.

The kubernetes client's model classes would drop fields newer than the client (a claim's
``consumedCapacity`` and ``shareID``, a pod's ``extendedResourceClaimStatus``), so both reads
take the raw answer (``_preload_content=False``). RBAC: ``resourceclaims`` (resource.k8s.io)
get; ``pods`` get.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from egpu.dra.allocation import ClaimError

GROUP = "resource.k8s.io"
VERSION = "v1"
TIMEOUT_S = 10.0  # per request


class KubeReader:
    """``ApiReader`` over a kubernetes ``CoreV1Api``. Raises the client's ``ApiException``
    for an answer that is not 2xx (a 404 excepted, see the methods)."""

    def __init__(self, core_v1: Any) -> None:
        from kubernetes import client

        self.core_v1 = core_v1
        self.custom = client.CustomObjectsApi(core_v1.api_client)

    def claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The ResourceClaim; ClaimError when the API server has none of that name."""
        from kubernetes.client.exceptions import ApiException

        try:
            answer: Any = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "resourceclaims", name, _preload_content=False,
                _request_timeout=TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                raise ClaimError(f"ResourceClaim {namespace}/{name} not found") from None
            raise
        return dict(json.loads(answer.data))

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod; None when the API server has none of that name."""
        from kubernetes.client.exceptions import ApiException

        try:
            answer = self.core_v1.read_namespaced_pod(name, namespace, _preload_content=False,
                                                      _request_timeout=TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(answer.data))
