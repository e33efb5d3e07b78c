"""Shared fixtures: where ../shared lives (inputs, cases, data)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ("tests.cpu_report",)

# The machines are small and shared with builds: judge properties, not timings.
settings.register_profile("egpu", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("egpu")

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("EGPU_SHARED_DIR", REPO.parent / "shared"))
# Suites that measure real time against the fake GPU: they run first, before any test starts
# a control plane or a real node (those stay up for the whole session, tests/e2e/conftest.py)
# and takes cores from their launching threads.
REALTIME_SUITES = (REPO / "tests" / "compute", REPO / "tests" / "security")
# The suite that starts control planes, real nodes and demos: last, because what its session
# fixtures start stays up until the session ends, and would idle beside every test after it.
E2E_SUITE = REPO / "tests" / "e2e"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from tests.lanes import serial_rank

    def rank(item: pytest.Item) -> tuple[int, int]:
        path = Path(str(item.path)).resolve()
        if any(path.is_relative_to(suite) for suite in REALTIME_SUITES):
            return (0, 0)
        if path.is_relative_to(E2E_SUITE):
            return (2, serial_rank(item.nodeid))
        return (1, 0)

    items.sort(key=rank)  # stable: each part keeps its order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` runs in lanes (tests/lanes.py); other modes are xdist's own."""
    if config.getoption("dist") != "loadscope":
        return None
    from tests.lanes import LaneScheduling

    return LaneScheduling(config, log)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The shared folder beside the checkout (inputs/, cases/, data/)."""
    if not SHARED.is_dir():
        pytest.fail(f"shared folder not found at {SHARED} (set EGPU_SHARED_DIR)")
    return SHARED
