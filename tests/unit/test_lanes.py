"""`make test`'s lanes (tests/lanes.py): which e2e tests share a worker and its cluster."""

from __future__ import annotations

from pathlib import Path

from tests.lanes import LANE_OF, SERIAL_LAST, LaneScheduling, lane_of, serial_rank

E2E = Path(__file__).resolve().parents[1] / "e2e"


def test_every_e2e_module_is_in_a_lane() -> None:
    """Bug caught: a new e2e module outside the lanes runs test by test on any worker, beside
    the lane that uses the same cluster (two workers racing `dev-cluster up`, one test's
    webhook answering another's pods)."""
    modules = {p.stem for p in E2E.glob("test_*.py")}
    assert modules - set(LANE_OF) == set()
    assert set(LANE_OF) - modules == set(), "a lane names a module that is gone"


def test_the_scheduler_puts_a_lane_in_one_scope_and_every_other_test_in_its_own() -> None:
    """Bug caught: xdist_group marks, which xdist 3.8 applies by renaming item._nodeid, a
    field pytest 9 no longer reads: every e2e test became its own unit and the lanes' modules
    ran on several workers at once."""
    scheduler = object.__new__(LaneScheduling)  # _split_scope reads nothing of its state
    scope = scheduler._split_scope
    assert scope("tests/e2e/test_real_node.py::test_a") == scope(
        "tests/e2e/test_real_node_drills.py::test_b[kubelet]") == "lane:real-node"
    assert scope("tests/e2e/test_real_node_density.py::test_c") == scope(
        "tests/e2e/test_real_node_density_restarts.py::test_d") == "lane:real-node-density"
    unit = "tests/unit/test_lanes.py::test_every_e2e_module_is_in_a_lane"
    assert scope(unit) == unit
    assert lane_of("tests/unit/test_real_node.py::test_a") is None  # same stem, not e2e


def test_a_serial_run_checks_the_background_uninstall_after_every_other_lane() -> None:
    """Bug caught: the module that checks what the helm lane's background uninstall left runs
    right after the module that begins it (no other lane overlaps its 5 min wait), or before
    it (it fails: the uninstall never began)."""
    begins = serial_rank("tests/e2e/test_real_node_helm_uninstall.py::test_a")
    checks = serial_rank("tests/e2e/test_real_node_helm_uninstalled.py::test_b")
    others = [serial_rank(f"tests/e2e/{module}.py::test_c") for module in LANE_OF
              if module not in SERIAL_LAST]
    assert checks > max(others) >= begins
    assert max(others) > begins  # some lane runs between them
    assert lane_of("tests/e2e/test_real_node_helm_uninstalled.py::test_b") == lane_of(
        "tests/e2e/test_real_node_helm_uninstall.py::test_a")  # one worker: one fixture
