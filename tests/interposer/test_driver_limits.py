"""The driver's per-cgroup memory limit (NVML r615, nvmlDeviceSetMemoryLimits_v1) on the fake
driver, through egpu.driver_limits, the module the node agent and the runtime hook use.

Each test runs probes in a real cgroup v2 directory made for it (root: the test suite runs
as root, as the real node's tests do)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu import driver_limits
from egpu.driver_limits import DriverLimitError
from tests.probes import wait_for_hold

from .conftest import FAKE, LIB, MIB, Rig, one, parse

CARD = "GPU-00000000-0000-0000-0000-000000000000"
R615 = "615.20.fake"


def _cgroup_root() -> Path:
    with open("/proc/self/mountinfo", encoding="utf-8") as handle:
        mount = driver_limits.cgroup_v2_mount(handle.read())
    if mount is None or mount[0] != "/":
        pytest.fail("these tests need the cgroup v2 hierarchy mounted at its root")
    return Path(mount[1])


@pytest.fixture
def group() -> Iterator[Path]:
    """A fresh cgroup v2 directory, removed after the test (its processes have exited)."""
    path = _cgroup_root() / f"egpu-test-{uuidlib.uuid4().hex[:12]}"
    path.mkdir()
    try:
        yield path
    finally:
        for child in sorted(path.rglob("*"), reverse=True):
            if child.is_dir():
                child.rmdir()
        path.rmdir()


@pytest.fixture
def nvml(rig: Rig) -> _RemoteNvml:
    """The fake's NVML as a driver of r615, on the rig's card state."""
    rig.env["FAKEGPU_DRIVER_VERSION"] = R615
    return _RemoteNvml(rig)


class _RemoteNvml:
    """egpu.driver_limits.Nvml, each call in a child process: the fake reads its environment
    (driver version, state folder) once per process."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig

    def _run(self, code: str) -> str:
        env = self.rig.base_env(False)
        env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise DriverLimitError(p.stderr.strip().splitlines()[-1])
        return p.stdout.strip()

    def set_limit(self, card: str, namespace: str, hard: int) -> None:
        self._run(f"""
            from egpu.driver_limits import Nvml
            Nvml("{FAKE}/libnvidia-ml.so.1").set_limit({card!r}, {namespace!r}, {hard})""")

    def get_limit(self, card: str, namespace: str) -> tuple[int, int, int]:
        out = self._run(f"""
            from egpu.driver_limits import Nvml
            print(*Nvml("{FAKE}/libnvidia-ml.so.1").get_limit({card!r}, {namespace!r}))""")
        soft, hard, used = map(int, out.split())
        return soft, hard, used

    def supported(self, card: str, namespace: str) -> bool:
        return self._run(f"""
            from egpu.driver_limits import Nvml
            print(Nvml("{FAKE}/libnvidia-ml.so.1").supported({card!r}, {namespace!r}))""") == "True"


def _probe_in(rig: Rig, group: Path, *steps: object, preload: bool = False) -> list[dict]:
    """cuprobe ``steps`` as a process of cgroup ``group`` (it joins before it execs)."""
    command = " ".join(map(str, steps))
    p = subprocess.run(["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" {command}',
                        str(LIB / "cuprobe")], env=rig.base_env(preload), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return parse(p.stdout)


def test_the_hard_limit_refuses_a_process_that_bypasses_the_interposer(rig: Rig, nvml: _RemoteNvml,
                                                                      group: Path) -> None:
    """No interposer in the process: the driver alone stops it at the group's limit, and
    cuMemGetInfo shows the limit. Bug caught: a limit that is stored but never checked at
    allocation, or checked against the card instead of the group."""
    nvml.set_limit(CARD, str(group), 1000 * MIB)
    rows = _probe_in(rig, group, "init", "primary", "meminfo", "alloc", 900, "alloc", 200,
                     "alloc", 100, "meminfo")
    assert [r["rc"] for r in rows if r["step"] == "alloc"] == [0, 2, 0]  # 2: OUT_OF_MEMORY
    assert one(rows, "meminfo")["total"] == 1000 * MIB
    assert one(rows, "meminfo", 1)["free"] == 0
    # a process of another group is not bound by it
    rows = rig.probe("init", "primary", "alloc", 2000, preload=False)
    assert one(rows, "alloc")["rc"] == 0


def test_processes_of_one_group_share_its_limit_and_the_driver_reports_their_use(
        rig: Rig, nvml: _RemoteNvml, group: Path) -> None:
    """Two processes of the group (one in a child group: the nearest limited ancestor's limit
    applies) draw from one limit; nvmlDeviceGetMemoryLimits_v1 reports their use. Bug caught:
    a limit counted per process, or a child group escaping its parent's limit."""
    nvml.set_limit(CARD, str(group), 1500 * MIB)
    child = group / "worker"
    child.mkdir()
    holder = subprocess.Popen(
        ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$0" init primary alloc 1000 hold',
         str(LIB / "cuprobe")], env=rig.base_env(False), stdout=subprocess.PIPE, text=True)
    try:
        wait_for_hold(holder)
        assert nvml.get_limit(CARD, str(group)) == (0, 1500 * MIB, 1000 * MIB)
        rows = _probe_in(rig, child, "init", "primary", "alloc", 600, "alloc", 400)
        assert [r["rc"] for r in rows if r["step"] == "alloc"] == [2, 0]
    finally:
        holder.kill()
        holder.wait()


def test_a_cleared_limit_and_a_removed_group_bind_nothing(rig: Rig, nvml: _RemoteNvml,
                                                          group: Path) -> None:
    """Hard NO_LIMIT with soft 0 clears the limit (as NVML's "max"); a limit whose group was
    removed is dropped, so a new group at the same path starts unlimited.
    Bugs caught: a limit that outlives its container; a clear that is ignored."""
    nvml.set_limit(CARD, str(group), 500 * MIB)
    nvml.set_limit(CARD, str(group), driver_limits.NO_LIMIT)
    rows = _probe_in(rig, group, "init", "primary", "alloc", 800)
    assert one(rows, "alloc")["rc"] == 0
    assert nvml.get_limit(CARD, str(group))[1] == driver_limits.NO_LIMIT
    nvml.set_limit(CARD, str(group), 500 * MIB)
    group.rmdir()
    group.mkdir()  # another group at the same path
    assert nvml.get_limit(CARD, str(group))[1] == driver_limits.NO_LIMIT
    rows = _probe_in(rig, group, "init", "primary", "alloc", 800)
    assert one(rows, "alloc")["rc"] == 0


def test_the_limit_api_refuses_what_the_driver_refuses(rig: Rig, nvml: _RemoteNvml, group: Path,
                                                       tmp_path: Path) -> None:
    """Not a cgroup v2 directory: NOT_FOUND; a driver before r615: not supported (and
    ``supported`` says no); a caller that is not root: NO_PERMISSION."""
    with pytest.raises(DriverLimitError, match="Not Found"):
        nvml.set_limit(CARD, str(tmp_path), 500 * MIB)
    assert nvml.supported(CARD, str(group))
    rig.env["FAKEGPU_DRIVER_VERSION"] = "580.95.fake"
    assert not nvml.supported(CARD, str(group))
    with pytest.raises(DriverLimitError, match="Not Supported"):
        nvml.set_limit(CARD, str(group), 500 * MIB)
    rig.env["FAKEGPU_DRIVER_VERSION"] = R615
    shared_state = Path(tempfile.mkdtemp(prefix="egpu-fake-state-"))
    try:
        shared_state.chmod(0o777)  # the fake's card state, open to the unprivileged caller
        rig.env["FAKEGPU_STATE_DIR"] = str(shared_state)
        code = f"""
            import os
            from egpu.driver_limits import Nvml  # (the interpreter's files are root's)
            os.setgid(65534); os.setuid(65534)
            Nvml("{FAKE}/libnvidia-ml.so.1").set_limit({CARD!r}, {str(group)!r}, {500 * MIB})"""
        with pytest.raises(DriverLimitError, match="NVML error 4"):
            nvml._run(code)
    finally:
        shutil.rmtree(shared_state)


def test_cgroup_dir_joins_the_mount_point_and_the_process_path() -> None:
    """/proc/<pid>/cgroup's path under the cgroup v2 mount; a mount of a subtree (root not
    "/") is accounted for. Bug caught: a limit set on the wrong directory."""
    info = ("35 24 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n"
            "36 24 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    assert driver_limits.cgroup_v2_mount(info) == ("/", "/sys/fs/cgroup/unified")
    assert driver_limits.cgroup_v2_path("4:memory:/x\n0::/kubepods/pod1/c1\n") == \
        "/kubepods/pod1/c1"
    assert driver_limits.cgroup_v2_path("4:memory:/x\n") is None
    assert driver_limits.cgroup_dir(os.getpid()).startswith(str(_cgroup_root()))


def test_the_node_record_round_trips_and_names_a_bad_field() -> None:
    text = driver_limits.encode_cards(["GPU-b", "GPU-a"])
    assert driver_limits.decode_cards(text) == frozenset({"GPU-a", "GPU-b"})
    with pytest.raises(DriverLimitError, match="cards"):
        driver_limits.decode_cards('{"cards": "GPU-a"}')
    with pytest.raises(DriverLimitError, match="not JSON"):
        driver_limits.decode_cards('{"cards": [')


AGENT_PROBE = f"""
    import dataclasses, json, sys
    from node_agent import discovery
    discovery.use_library("{FAKE}/libnvidia-ml.so.1")
    cards = discovery.with_driver_limits(discovery.discover())
    discovery.write_driver_limits(sys.argv[1], cards)
    print(json.dumps([dataclasses.asdict(c) for c in cards]))
"""


def _agent_cards(rig: Rig, private: Path) -> list[dict[str, object]]:
    import json

    env = rig.base_env(False)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(AGENT_PROBE), str(private)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cards: list[dict[str, object]] = json.loads(p.stdout.strip().splitlines()[-1])
    return cards


def test_the_agent_finds_which_cards_take_the_limit_and_tells_the_hook_and_the_exporter(
        rig: Rig, tmp_path: Path) -> None:
    """r615: the inventory card says driver_memory_limit, the hook's record names it, the
    exporter's gauge is 1 and `kubectl egpu` marks the card; a driver before r615: none of
    that, and the last agent's record is removed (the hook then sets nothing). Bugs caught:
    a record left by an agent on the old driver; a card marked that the driver refuses."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from cli.top_cmd import format_views
    from egpu.cluster_view import cluster_view
    from egpu.contract import DRIVER_LIMITS_FILE, METRIC_CARD_DRIVER_MEMORY_LIMIT
    from egpu.records import Card, Inventory
    from node_agent.metrics.collector import EgpuCollector, Sources

    private = tmp_path / "private"
    rig.env["FAKEGPU_DRIVER_VERSION"] = R615
    [card] = _agent_cards(rig, private)
    assert card["driver_memory_limit"] is True
    assert driver_limits.decode_cards((private / DRIVER_LIMITS_FILE).read_text()) == {CARD}
    found = Card(**card)  # type: ignore[arg-type]
    assert Inventory.decode(Inventory((found,)).encode()).cards == (found,)

    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("node-1", lambda: (found,), dict, dict,
                                            lambda u: None, lambda u: None)))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    assert [s.value for s in families[METRIC_CARD_DRIVER_MEMORY_LIMIT].samples] == [1]
    node = {"metadata": {"name": "node-1", "annotations": {
        "egpu.io/inventory": Inventory((found,)).encode()}}, "status": {}}
    assert "(driver memory limit)" in format_views(cluster_view([node], []))

    rig.env["FAKEGPU_DRIVER_VERSION"] = "580.95.fake"
    [card] = _agent_cards(rig, private)
    assert card["driver_memory_limit"] is False
    assert not (private / DRIVER_LIMITS_FILE).exists()
