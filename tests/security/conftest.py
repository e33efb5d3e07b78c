"""A hostile tenant next to two honest shares on one fake card, in real runc containers
(tests/security, issue 15; docs/security.md).

Each test gets a fresh node (its own runtime and private folders, and its own fake-GPU state,
shared by the three containers as one card's driver would be): the honest shares are pods
whose allocation files are written as the node agent writes them (one high-priority, one
low-priority, both booking cores and memory of the fake GPU's one card), each running
compute_load (libinterpose/tests/compute_load.c); the hostile pod's container runs
demo/hostile_tenant.c with one attack. The containers run concurrently; while they do, the
test runs the memory probe (demo/cuda_probe.c) inside each honest container (``runc exec``)
and reads the node agent's view of the card (node_agent.metrics.card_region.scan_cards).

The fake driver's state folder is mounted into every container at /fakegpu: it stands for the
real driver (the kernel's, out of a tenant's reach), so the hostile program does not attack
it; it attacks what egpu mounts (/var/run/egpu, /run/egpu, /etc/ld.so.preload,
/usr/lib/egpu).
"""

from __future__ import annotations

import copy
import json
import re
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from demo.sandbox import (
    FAKE_DEFAULT_UUID,
    INTERPOSER,
    REPO,
    Container,
    Mount,
    Result,
    RuncWorld,
    missing_prerequisite,
)
from egpu.contract import CARDS_SUBDIR, container_region_path
from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

COMPUTE_LOAD = REPO / "libinterpose" / "build" / "compute_load"
HOSTILE_SRC = REPO / "demo" / "hostile_tenant.c"
PREREQUISITE = " (`make test` installs and builds it; run as root, as the README says)"

# Never rerun: an attack that wins one race in three must fail the test. What a busy host
# can move is checked relative to the same run (test_hostile_tenant.py's module docstring).
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tenancy" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.runc)


@pytest.fixture(scope="session")
def security_world(tmp_path_factory: pytest.TempPathFactory) -> RuncWorld:
    """The base rootfs with the probe, compute_load at /compute_load and the hostile program
    at /hostile; fails (with the reason) without runc, root or the native build."""
    reason = missing_prerequisite()
    if reason:
        pytest.fail(reason + PREREQUISITE)
    for path in (INTERPOSER, COMPUTE_LOAD):
        if not path.exists():
            pytest.fail(f"{path} is not built (make native)")
    base: Path = tmp_path_factory.mktemp("security")
    hostile = base / "hostile_tenant"
    subprocess.run(["gcc", "-O1", "-Wall", "-Wextra", "-o", str(hostile), str(HOSTILE_SRC),
                    "-ldl", "-lpthread"], check=True)
    return RuncWorld(base, INTERPOSER, programs={"/compute_load": COMPUTE_LOAD,
                                                 "/hostile": hostile})


# --- the node of one test ----------------------------------------------------------------
CARD = FAKE_DEFAULT_UUID
KERNEL_US = 200


def owner_of(dir_name: str) -> int:
    """The share key of ``<pod-uid>_<container>``: FNV-1a 64 of its container region path as
    the container sees it (egpu_owner_id)."""
    h = 0xCBF29CE484222325
    for byte in container_region_path(dir_name).encode()[:511]:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h or 1


@dataclass
class Share:
    """One pod with one container holding a share of the card."""

    uid: str
    priority: str
    cores: int
    memory_mib: int
    container: str = "main"

    @property
    def dir_name(self) -> str:
        return f"{self.uid}_{self.container}"

    @property
    def owner(self) -> int:
        return owner_of(self.dir_name)

    def annotations(self) -> dict[str, str]:
        """What containerd's CRI plugin puts on the container."""
        return {"io.kubernetes.cri.sandbox-uid": self.uid,
                "io.kubernetes.cri.container-name": self.container,
                "io.kubernetes.cri.sandbox-name": f"pod-{self.uid[:8]}",
                "io.kubernetes.cri.sandbox-namespace": "team",
                "io.kubernetes.cri.container-type": "container"}


@dataclass
class Tenancy:
    """A fresh node for one test: the session's rootfs, this test's runtime, private and
    fake-GPU folders; the containers it started (killed and deleted at the end)."""

    world: RuncWorld
    tag: str
    fake_state: Path
    containers: list[Container] = field(default_factory=list)

    def book(self, share: Share) -> None:
        """Write the pod's allocation file as the node agent does."""
        entry = ContainerAllocation(share.container, False,
                                    (CardShare(CARD, 0, share.memory_mib, share.cores),))
        record = PodShares("team", f"pod-{share.uid[:8]}", share.uid, share.priority,
                           "strict", False, Allocation(containers=(entry,), node="node-1"))
        folder = self.world.private_dir / "allocations"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{share.uid}.json").write_text(record.encode())

    def start(self, share: Share, args: list[str]) -> Container:
        env = {"NVIDIA_VISIBLE_DEVICES": CARD, "EGPU_DEVICES": "x::0",
               "FAKEGPU_STATE_DIR": "/fakegpu", "FAKEGPU_KERNEL_US": str(KERNEL_US)}
        name = f"sec-{self.tag}-{share.uid[:8]}-{len(self.containers)}"
        c = self.world.start(args, env, share.annotations(), name=name,
                             mounts=[Mount(self.fake_state, "/fakegpu")])
        self.containers.append(c)
        return c

    @property
    def card_path(self) -> Path:
        return self.world.runtime_dir / CARDS_SUBDIR / CARD

    def attached(self, share: Share) -> bool:
        """Whether a process of ``share`` holds a pid cell of its slot on the card: in its
        share file (the card folder) or, in the previous layout, in its slot of the one card
        region file."""
        path = self.card_path
        try:
            if path.is_dir():
                data = (path / f"share-{share.owner:016x}").read_bytes()[:72]
                slots = [data]
            else:
                raw = path.read_bytes()
                slots = [raw[4096 + i * 512:4096 + i * 512 + 72] for i in range(32)]
        except OSError:
            return False
        for s in slots:
            if len(s) == 72 and struct.unpack_from("<Q", s)[0] == share.owner:
                return any(struct.unpack_from("<16i", s, 8))
        return False

    def wait_attached(self, share: Share, c: Container, timeout_s: float = 6) -> str | None:
        """Until ``share`` is attached (None), or why it is not: its container ended first,
        or the timeout (a share that is not attached by then may be running without its
        card's coordination: the test goes on, to show what that does)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.attached(share):
                return None
            if c.proc.poll() is not None:
                return f"the {share.priority} share's container ended before it attached"
            time.sleep(0.02)
        return f"the {share.priority} share was not attached after {timeout_s} s"

    def cleanup(self) -> None:
        for c in self.containers:
            if c.proc.poll() is None:
                c.kill()
            c.delete()


@pytest.fixture
def tenancy(security_world: RuncWorld, tmp_path: Path) -> Iterator[Tenancy]:
    world = copy.copy(security_world)
    world.runtime_dir = tmp_path / "run-egpu"
    world.private_dir = tmp_path / "run-egpu-node"
    world.log = tmp_path / "hook.log"
    fake_state = tmp_path / "fakegpu"
    fake_state.mkdir(mode=0o777)
    t = Tenancy(world, uuid.uuid4().hex[:6], fake_state)
    yield t
    t.cleanup()


# --- what the containers printed -----------------------------------------------------------
def load_rows(r: Result) -> list[dict]:
    """compute_load's JSON lines."""
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@dataclass(frozen=True)
class Attempt:
    """One "attempt" line of the hostile program."""

    op: str
    target: str
    ok: int
    fail: int
    errnos: dict[str, int]


_ATTEMPT = re.compile(r"^attempt attack=(\S+) op=(\S+) target=(\S+) ok=(\d+) fail=(\d+) "
                      r"errno=(\S+)$")


def attempts(r: Result) -> list[Attempt]:
    out = []
    for line in r.stdout.splitlines():
        m = _ATTEMPT.match(line)
        if m:
            errs = {} if m[6] == "-" else {
                k: int(v) for k, v in (p.split(":") for p in m[6].split(","))}
            out.append(Attempt(m[2], m[3], int(m[4]), int(m[5]), errs))
    return out

