"""`kubectl apply -k manifests/` is accepted by a real kube-apiserver (server-side dry run)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import E2ECluster

pytestmark = pytest.mark.e2e

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"


def test_every_manifest_passes_server_side_dry_run(cluster: E2ECluster) -> None:
    # A server-side dry run of namespaced objects needs their namespace to exist for real.
    cluster.ensure_namespace("egpu-system")
    result = subprocess.run(
        [*cluster.info.kubectl_argv("apply", "--dry-run=server", "-k", str(MANIFESTS))],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for kind in ("deployment.apps/egpu-webhook", "mutatingwebhookconfiguration",
                 "daemonset.apps/egpu-node-agent", "configmap/egpu-config",
                 "priorityclass.scheduling.k8s.io/egpu-online"):
        assert kind in result.stdout, result.stdout
