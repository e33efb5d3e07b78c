"""The runtime hook never follows a symlink (or a FIFO, or a hard link) on the host.

A pod that could write into the host's ``/var/run/egpu`` planted ``containers/<own-uid>_app ->
/``: the hook chmod-ed the host's folder 0777 and mounted it read-write into the pod's next
container (/tmp/break/hk/run.sh). Each test runs the installed ``egpu-hook`` on a bundle whose
host folders hold such a trap, inside ``unshare -m`` (a throwaway mount namespace: the state's
pid 0 makes the hook mount there), and checks that the hook refuses with a clear message and
the host object the trap names is untouched.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from demo.sandbox import HOOK
from egpu.records import Allocation, Card, CardShare, ContainerAllocation, PodShares

UID = "uidX"
UUID = "GPU-00000000-0000-0000-0000-000000000000"



@pytest.fixture(autouse=True)
def _prerequisites() -> None:
    """Root, unshare(1) and the built egpu-hook are on every machine `make test` runs on: their
    absence is a failure, not a skip (a skip is only for what a machine lacks: the GPU)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None or not HOOK.exists():
        pytest.fail("needs root, unshare(1) and the installed egpu-hook (make test, as root)")


class World:
    """A bundle of pod ``uidX`` container ``app`` with a share on one card, its allocation
    file, an (empty) interposer, and a victim folder and file outside egpu's folders."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.runtime = base / "run-egpu"
        self.private = base / "run-egpu-node"
        self.rootfs = base / "rootfs"
        self.bundle = base / "bundle"
        self.interposer = base / "libegpu_interpose.so"
        self.victim = base / "victim"
        self.victim_file = base / "victim-file"
        for folder in (self.runtime, self.rootfs / "etc", self.bundle, self.victim):
            folder.mkdir(parents=True)
        self.victim.chmod(0o755)
        self.victim_file.write_text("secret\n")
        self.victim_file.chmod(0o600)
        self.interposer.write_bytes(b"")
        entry = ContainerAllocation("app", False, (CardShare(UUID, 0, 4096, 30),))
        shares = PodShares("default", "p", UID, "high", "strict", False,
                           Allocation(containers=(entry,), node="n1"))
        (self.private / "allocations").mkdir(parents=True)
        (self.private / "allocations" / f"{UID}.json").write_text(shares.encode())
        (self.bundle / "config.json").write_text(json.dumps({
            "ociVersion": "1.1.0", "root": {"path": str(self.rootfs)},
            "process": {"env": [f"NVIDIA_VISIBLE_DEVICES={UUID}", "EGPU_DEVICES=x::0"]},
            "annotations": {"io.kubernetes.cri.sandbox-uid": UID,
                            "io.kubernetes.cri.container-name": "app",
                            "io.kubernetes.cri.sandbox-name": "p",
                            "io.kubernetes.cri.sandbox-namespace": "default"}}))

    def hook(self) -> tuple[int, str, list[tuple[str, str]]]:
        """Run egpu-hook in a private mount namespace: (exit status, stderr, the mounts it
        made there as (source root, mount point) under the world's base)."""
        state = json.dumps({"ociVersion": "1.1.0", "id": "cid-app", "status": "creating",
                            "pid": 0, "bundle": str(self.bundle)})
        script = (f"{HOOK} --runtime-dir {self.runtime} --private-dir {self.private} "
                  f"--interposer {self.interposer} createRuntime; echo \"rc=$?\"; "
                  "cat /proc/self/mountinfo")
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                              input=state, capture_output=True, text=True, timeout=30,
                              check=True)
        lines = done.stdout.splitlines()
        rc_line = next(i for i, line in enumerate(lines) if line.startswith("rc="))
        mounts = [(f[3], f[4]) for f in (line.split() for line in lines[rc_line + 1:])
                  if f[4].startswith(str(self.base))]
        return int(lines[rc_line][3:]), done.stderr, mounts

    def untouched(self) -> None:
        assert stat.S_IMODE(self.victim.stat().st_mode) == 0o755
        assert list(self.victim.iterdir()) == []
        assert stat.S_IMODE(self.victim_file.stat().st_mode) == 0o600
        assert self.victim_file.read_text() == "secret\n"


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_clean_node_gets_only_its_own_folder_and_card_files(world: World) -> None:
    status, err, mounts = world.hook()
    assert status == 0, err
    region = world.runtime / "containers" / f"{UID}_app"
    card = world.runtime / "cards" / UUID
    assert stat.S_IMODE(region.lstat().st_mode) == 0o777
    info = card.lstat()
    assert stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o666
    targets = {target for _, target in mounts}
    inside = f"{world.rootfs}/var/run/egpu"
    assert f"{inside}/containers/{UID}_app" in targets
    assert f"{inside}/cards/{UUID}" in targets
    assert f"{inside}/cards" not in targets and inside not in targets  # never the whole folder
    assert f"{world.rootfs}/run/egpu/config.json" in targets


def test_the_reviewers_symlinked_region_folder_is_refused(world: World) -> None:
    """/tmp/break/hk/run.sh: containers/<uid>_app -> a host folder."""
    (world.runtime / "containers").mkdir()
    os.symlink(world.victim, world.runtime / "containers" / f"{UID}_app")
    status, err, mounts = world.hook()
    assert status != 0
    assert f"containers/{UID}_app is a symlink" in err and "refusing to follow it" in err
    assert mounts == []
    world.untouched()


@pytest.mark.parametrize("trap", [
    "containers-folder-symlink", "cards-folder-symlink", "card-file-symlink",
    "card-file-hardlink", "card-file-fifo", "card-file-folder", "runtime-dir-symlink",
    "private-hook-folder-symlink", "private-config-symlink", "region-folder-is-a-file",
    "card-file-of-another-user",
])
def test_every_trap_under_the_hooks_folders_is_refused(world: World, trap: str) -> None:
    runtime, private = world.runtime, world.private
    card = runtime / "cards" / UUID
    if trap == "containers-folder-symlink":
        os.symlink(world.victim, runtime / "containers")
    elif trap == "cards-folder-symlink":
        os.symlink(world.victim, runtime / "cards")
    elif trap.startswith("card-file"):
        (runtime / "cards").mkdir()
        if trap == "card-file-symlink":
            os.symlink(world.victim_file, card)
        elif trap == "card-file-hardlink":
            os.link(world.victim_file, card)
        elif trap == "card-file-fifo":
            os.mkfifo(card)
        elif trap == "card-file-of-another-user":
            card.write_text("")
            os.chown(card, 65534, 65534)  # it could chmod it later and lock the card's shares
        else:
            card.mkdir()
    elif trap == "runtime-dir-symlink":
        runtime.rmdir()
        os.symlink(world.victim, runtime)
    elif trap == "private-hook-folder-symlink":
        (private / "hook").mkdir()
        os.symlink(world.victim, private / "hook" / f"{UID}_app")
    elif trap == "private-config-symlink":
        (private / "hook" / f"{UID}_app").mkdir(parents=True)
        os.symlink(world.victim_file, private / "hook" / f"{UID}_app" / "config.json")
    elif trap == "region-folder-is-a-file":
        (runtime / "containers").mkdir()
        (runtime / "containers" / f"{UID}_app").write_text("")
    status, err, mounts = world.hook()  # a FIFO would block it: the timeout fails the test
    assert status != 0, err
    assert "egpu-hook: container cid-app: cannot install its egpu share" in err
    assert any(word in err for word in ("symlink", "not a folder", "not a regular file",
                                        "hard links", "is a folder", "belongs to uid")), err
    assert mounts == []
    world.untouched()
    if trap == "card-file-hardlink":
        assert world.victim_file.stat().st_nlink == 2  # left as found


def test_a_rerun_keeps_the_files_and_their_modes(world: World) -> None:
    assert world.hook()[0] == 0
    card = world.runtime / "cards" / UUID
    card.write_bytes(b"x" * 100)  # an initialised region: kept as it is
    status, err, _ = world.hook()
    assert status == 0, err
    assert card.read_bytes() == b"x" * 100


def test_a_second_run_for_the_same_container_is_a_no_op_that_succeeds(world: World) -> None:
    """Both routes configured: the hook from egpu's CDI spec (its createRuntime entry, as the
    node agent writes it) and the one from base_runtime_spec run for the same container, in
    the same mount namespace. The second succeeds, mounts nothing more and rewrites no file."""
    from node_agent.cdi import cdi_spec
    from node_agent.main import hook_args

    card = Card(UUID, 0, "NVIDIA A10", 24576)
    spec = cdi_spec([card], str(HOOK), lambda _path: False,
                    hook_args(str(world.runtime), str(world.private)))
    entry = spec["containerEdits"]["hooks"][0]
    assert entry["hookName"] == "createRuntime" and entry["path"] == str(HOOK)
    cdi_hook = " ".join([str(HOOK), *entry["args"][1:]])
    base_hook = (f"{HOOK} --runtime-dir {world.runtime} --private-dir {world.private} "
                 "createRuntime")
    hook_dir = world.private / "hook" / f"{UID}_app"
    files = " ".join(str(p) for p in (hook_dir / "config.json", hook_dir / "ld.so.preload",
                                      world.runtime / "cards" / UUID))
    report = (f"echo \"rc=$?\"; grep -c ' {world.base}' /proc/self/mountinfo; "
              f"stat -c '%n %i %y %s' {files}")
    script = (f"export EGPU_INTERPOSER={world.interposer}; {cdi_hook} < state.json; {report}; "
              f"{base_hook} < state.json; {report}; cat {world.rootfs}/etc/ld.so.preload")
    (world.base / "state.json").write_text(json.dumps({
        "ociVersion": "1.1.0", "id": "cid-app", "status": "creating", "pid": 0,
        "bundle": str(world.bundle)}))
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          cwd=world.base, capture_output=True, text=True, timeout=30, check=True)
    lines = done.stdout.splitlines()
    first, second = lines[0:5], lines[5:10]
    assert first[0] == "rc=0" and second[0] == "rc=0", done.stderr
    assert int(first[1]) >= 5  # interposer, config, preload, region folder, card file
    assert second[1:] == first[1:]  # no new mount; files: same inode, mtime and size
    assert lines[10:] == ["/usr/lib/egpu/libegpu_interpose.so"]  # listed once
    assert done.stderr == ""
