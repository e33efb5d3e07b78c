"""A ResourceClaim of driver gpu.egpu.io as the kube-scheduler allocates it, and the pod that
uses it: what the DRA tests of the core (tests/unit/test_dra_allocation.py) and of the kubelet
plugin (tests/node/test_draplugin.py) feed in."""

from __future__ import annotations

from typing import Any

from egpu.records import Card

NODE = "node-a"
CARDS = (Card("GPU-AAAA-0001", 0, "NVIDIA H100 80GB HBM3", 81559),
         Card("GPU-BBBB-0002", 1, "NVIDIA H100 80GB HBM3", 81559))
CLAIM_UID = "c0ffee00-0000-4000-8000-000000000001"
POD_UID = "90d00000-0000-4000-8000-000000000001"


def share_claim(memory: str = "4Gi", cores: str = "30", config: Any = None,
                device: str = "gpu-aaaa-0001") -> dict[str, Any]:
    entries = [] if config is None else [{"source": "FromClaim", "requests": [],
                                          "opaque": {"driver": "gpu.egpu.io",
                                                     "parameters": config}}]
    return {
        "metadata": {"name": "share-pod-gpu-x", "namespace": "ml", "uid": CLAIM_UID},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "gpu", "driver": "gpu.egpu.io", "pool": NODE,
                             "device": device, "shareID": "5a5a5a5a-0000-4000-8000-1",
                             "consumedCapacity": {"memory": memory, "cores": cores}}],
                "config": entries}},
            "reservedFor": [{"resource": "pods", "name": "share-pod", "uid": POD_UID}]},
    }


def share_pod(containers: list[dict[str, Any]] | None = None,
              annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "share-pod", "namespace": "ml", "uid": POD_UID,
                     "annotations": annotations or {}},
        "spec": {"nodeName": NODE,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "share"}],
                 "containers": containers if containers is not None else [
                     {"name": "main", "resources": {"claims": [{"name": "gpu"}]}},
                     {"name": "logger"}]},
        "status": {"resourceClaimStatuses": [{"name": "gpu",
                                              "resourceClaimName": "share-pod-gpu-x"}]},
    }
