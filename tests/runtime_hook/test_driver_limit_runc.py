"""The driver's memory limit set by the runtime hook, in real runc containers: a tenant that
bypasses the interposer is stopped at its share by the driver (NVML r615 on the fake driver).

The tenant here is tests/runtime_hook/driver_bypass.c: it charges the fake card's memory
without any libcuda call, as raw ioctls would reach a real driver, so only the driver's own
wall can hold it. The fake card state is shared between the host (the hook's NVML) and the
container (mounted at /var/run/fakegpu, where the fake driver looks for it)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from demo.sandbox import FAKE_DEFAULT_UUID, INTERPOSER, Mount, RuncWorld, missing_prerequisite
from egpu import driver_limits
from egpu.contract import DRIVER_LIMITS_FILE

from .test_hook_runc import SHARE_ENV, SHARE_MIB, pod

pytestmark = pytest.mark.runc

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "fakegpu" / "build"


class _WalledWorld(RuncWorld):
    """The runc world whose hook runs with the fake driver's NVML (``driver``: its version)
    on the card state in ``state``."""

    def __init__(self, base: Path, programs: dict[str, Path], state: Path) -> None:
        self.state, self.driver = state, "615.20.fake"
        super().__init__(base, INTERPOSER, programs)

    def hook_entry(self) -> dict[str, Any]:
        entry = super().hook_entry()
        entry["env"] = [f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}",
                        f"FAKEGPU_STATE_DIR={self.state}",
                        f"FAKEGPU_DRIVER_VERSION={self.driver}",
                        f"EGPU_NVML_LIBRARY={FAKE / 'libnvidia-ml.so.1'}"]
        return entry


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_WalledWorld]:
    reason = missing_prerequisite()
    if reason:
        pytest.fail(reason)
    base = tmp_path_factory.mktemp("runc-walled")
    bypass = base / "driver_bypass"
    subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", f"-I{REPO}/fakegpu/src",
                    f"-I{REPO}/libinterpose/include", "-o", str(bypass),
                    str(Path(__file__).with_name("driver_bypass.c")),
                    str(REPO / "fakegpu" / "src" / "fake_common.c"), "-lpthread"], check=True)
    state = base / "fakegpu-state"
    state.mkdir()
    yield _WalledWorld(base, {"/bypass": bypass}, state)


def _bypass(world: _WalledWorld, uid: str, mib: int) -> str:
    ann = pod(world, uid)
    container = world.start(["/bypass", str(mib)], SHARE_ENV, ann,
                            mounts=[Mount(world.state, "/var/run/fakegpu")])
    result = container.wait()
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_the_hook_walls_a_share_that_bypasses_the_interposer_at_its_memory(
        world: _WalledWorld) -> None:
    """With the node's record naming the card, the hook sets the container cgroup's hard
    limit to the share (4096 MiB): the bypassing tenant gets 3000 MiB and is refused 5000.
    Without the record (a driver before r615), the same tenant takes 5000 MiB: the check
    fails when the hook sets no limit, sets it on another cgroup or at another size."""
    record = world.private_dir / DRIVER_LIMITS_FILE
    world.private_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(driver_limits.encode_cards([FAKE_DEFAULT_UUID]))
    try:
        assert _bypass(world, "cccccccc-0000-0000-0000-000000000001", SHARE_MIB + 904) == \
            "charged=0"
        assert _bypass(world, "cccccccc-0000-0000-0000-000000000002", SHARE_MIB - 1096) == \
            "charged=1"
    finally:
        record.unlink()
    assert _bypass(world, "cccccccc-0000-0000-0000-000000000003", SHARE_MIB + 904) == \
        "charged=1"


def test_a_node_record_on_a_driver_without_the_limit_refuses_the_container(
        world: _WalledWorld) -> None:
    """The node said the wall is there and the driver refuses it: the container does not
    start, and the message names the card and NVML's answer (fail closed)."""
    record = world.private_dir / DRIVER_LIMITS_FILE
    world.private_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(driver_limits.encode_cards([FAKE_DEFAULT_UUID]))
    world.driver = "580.95.fake"
    try:
        ann = pod(world, "cccccccc-0000-0000-0000-000000000004")
        container = world.start(["/bypass", "10"], SHARE_ENV, ann,
                                mounts=[Mount(world.state, "/var/run/fakegpu")])
        result = container.wait()
    finally:
        world.driver = "615.20.fake"
        record.unlink()
    assert result.returncode != 0
    assert "the driver's memory limit" in result.stderr and FAKE_DEFAULT_UUID in result.stderr, \
        result.stderr
    assert "Not Supported" in result.stderr, result.stderr
