"""Smoke test of the node restarts benchmark (bench/node_restarts.py): one round of restarts
(the node agent's pod deleted, the kubelet and containerd restarted, in a random order) under
two share pods at a time, on the real-node cluster that egpu is installed on (the ``installed``
fixture; ``--attach``: no second cluster). No pod may start with a wrong share or none, no card
may be overbooked, nothing may be left behind; the node serves again afterwards (the bench
waits for it), so the real-node tests after this file find it as they expect.

Pods the kubelet refuses at admission while the device plugin is away are allowed
(``refused``: their controller would replace them); every other pod must start (``not_started``
0, at least one ``ok``), and so must each worker's pod created after the node served again
(``settled_ok``). A pod created while the plugin is away waits for the kube-scheduler's
next try after the node offers egpu.io/gpu again (its backoff, longer on a loaded 2-core
machine), hence POD_TIMEOUT_S.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devcluster import realnode
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "node_restarts.py"
FIGURE = re.compile(r"(\w+)=(\S+)")
WORKERS = 2  # share pods at a time
# a scheduler backoff cycle and a start, on two cores the parallel lanes keep busy (60 s cut a
# pod that was Running, its probe not done yet: the lanes run of 2026-12-05 10:18)
POD_TIMEOUT_S = 120
MUST_BE_ZERO = ("wrong_share", "missing_share", "not_started", "overbooked", "short_share",
                "stuck_deleting", "leaked_files", "leaked_mib", "fake_leaked_mib")


def test_one_round_of_node_restarts_gives_no_pod_a_wrong_share(installed: RealCluster) -> None:
    t0 = time.monotonic()
    result = subprocess.run(
        [sys.executable, str(BENCH), "--attach", "--state-dir", installed.info.state_dir,
         "--node", installed.node.name, "--rounds", "1", "--workers", str(WORKERS), "--gap", "3",
         "--sizes", "1000,2000", "--pod-timeout", str(POD_TIMEOUT_S), "--seed", "7"],
        cwd=REPO, capture_output=True, text=True, timeout=420)
    # the kubelet and containerd were restarted: their new pids
    installed.node = realnode.RealNode.load(installed.info.state_dir, installed.node.name)
    lines = result.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("rounds=1 "), result.stdout + result.stderr
    figures = dict(FIGURE.findall(lines[-1]))
    assert {k: figures[k] for k in MUST_BE_ZERO} == dict.fromkeys(MUST_BE_ZERO, "0"), \
        result.stdout
    assert [figures[f"restarts_{p}"] for p in ("agent", "kubelet", "containerd")] \
        == ["1", "1", "1"], result.stdout
    assert int(figures["pods"]) >= 1 and int(figures["ok"]) >= 1, result.stdout
    # each worker's pod created once the node served again started with its share: bug
    # caught, a node that offers its slots again before it can admit a share pod (a refusal
    # after recovery), which the refusals allowed during the restarts would hide
    assert int(figures["settled_pods"]) >= WORKERS, result.stdout
    assert figures["settled_ok"] == figures["settled_pods"], result.stdout
    assert result.returncode == 0, result.stdout + result.stderr
    print(f"{lines[-1]} ({time.monotonic() - t0:.0f} s)")
