"""Fixtures of the runtime-hook tests (tests/runtime_hook): the runc world."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.sandbox import INTERPOSER, RuncWorld, missing_prerequisite

PREREQUISITE = " (`make test` installs and builds it; run as root, as the README says)"


@pytest.fixture(scope="session")
def runc_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuncWorld]:
    """Real containers with egpu-hook; fails (with the reason) without runc or root: both are
    on every machine `make test` runs on (a skip is only for what a machine lacks: the GPU)."""
    reason = missing_prerequisite()
    if reason:
        pytest.fail(reason + PREREQUISITE)
    base: Path = tmp_path_factory.mktemp("runc")
    yield RuncWorld(base, INTERPOSER)


@pytest.fixture
def interposer_world(runc_world: RuncWorld) -> RuncWorld:
    """The runc world with the real interposer built (libinterpose/build)."""
    if not runc_world.real_interposer:
        pytest.fail(f"{INTERPOSER} is not built (make native)")
    return runc_world
