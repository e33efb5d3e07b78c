"""Lanes: how `make test` runs the suite on parallel pytest-xdist workers (``--dist loadscope``
with the scheduler below, chosen in tests/conftest.py).

The modules of a lane share one cluster and run one after another on one worker; lanes run
side by side, so that one lane's waits (a kubelet's grace period, a roll, a burst of pods)
overlap the others' work. Each real-node lane starts its own control plane and real node
(``real_cluster``'s state folder is per worker, tests/e2e/conftest.py); the kwok lane shares
the dev cluster; each demo module starts its own demo. A test of a module in no lane is its
own unit and goes to any free worker.

Why a scheduler and not ``xdist_group`` marks: xdist (3.8) groups marked tests by renaming
``item._nodeid``, which pytest 9 no longer reads, so the marks group nothing.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from xdist.scheduler import LoadScopeScheduling

E2E_DIR = "tests/e2e"
LANES = {
    "kwok": ("test_devcluster", "test_dra_claims_e2e", "test_dra_e2e", "test_manifests",
             "test_node_e2e", "test_scheduler_e2e", "test_plugin_scheduler_e2e",
             "test_webhook_e2e"),
    "real-node": ("test_real_node", "test_real_node_drills", "test_dra_real_node",
                  "test_node_restarts_bench"),
    # one lane: two 80-pod bursts at once overload two cores (timing checks failed, 19 min)
    "real-node-density": ("test_real_node_density", "test_real_node_density_restarts"),
    # one lane: the uninstall's 5 min wait would take a real node of its own
    "real-node-helm": ("test_real_node_helm", "test_real_node_helm_uninstall",
                       "test_real_node_helm_uninstalled"),
    "demo": ("test_demo", "test_demo_dra"),
}
LANE_OF = {module: lane for lane, modules in LANES.items() for module in modules}
# The lanes in the order a serial run (no workers) takes them: the real-node lanes, which
# share one real node, the helm lane last of them as it replaces the kustomize install; then
# the kwok lane, whose shared cluster is stopped after its last test (tests/e2e/conftest.py),
# and the demos (a control plane and real node each, stopped with their module), which the
# helm lane's uninstall overlaps.
SERIAL_ORDER = ("real-node", "real-node-density", "real-node-helm", "kwok", "demo")
# Modules a serial run takes after every other test: each checks what a background task of
# an earlier module of its lane did meanwhile (on a worker they follow their lane's others).
SERIAL_LAST = ("test_real_node_helm_uninstalled",)


def serial_rank(nodeid: str) -> int:
    """Where a test of tests/e2e runs in a serial run: its lane's place in ``SERIAL_ORDER``
    (a test in no lane after them), a module of ``SERIAL_LAST`` after all of them."""
    if PurePosixPath(nodeid.split("::", 1)[0]).stem in SERIAL_LAST:
        return len(SERIAL_ORDER) + 1
    lane = lane_of(nodeid)
    return SERIAL_ORDER.index(lane) if lane in SERIAL_ORDER else len(SERIAL_ORDER)


def lane_of(nodeid: str) -> str | None:
    """The lane of a test (``tests/e2e/test_x.py::test_y[z]`` -> its module's lane), None
    for a test in no lane."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    if str(path.parent) != E2E_DIR:
        return None
    return LANE_OF.get(path.stem)


class LaneScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with one scope per lane and one per test outside the lanes.
    xdist hands out the scopes with the most tests first, so every lane starts at once when
    there are more workers than lanes."""

    def _split_scope(self, nodeid: str) -> str:
        lane = lane_of(nodeid)
        return f"lane:{lane}" if lane else nodeid
