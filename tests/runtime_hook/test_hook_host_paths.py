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
from egpu import card_roster
from egpu.card_roster import RosterEntry
from egpu.records import Allocation, Card, CardShare, ContainerAllocation, PodShares

UID = "uidX"
UUID = "GPU-00000000-0000-0000-0000-000000000000"
OWNER = card_roster.share_owner(f"{UID}_app")
SHARE = card_roster.share_file_name(OWNER)


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
        made there as (source root, mount point) under the world's base). ``self.options``:
        mount point -> its mount options (mountinfo field 6)."""
        # the container's pid: the shell's own, in the private mount namespace
        state = state_with_shell_pid({"ociVersion": "1.1.0", "id": "cid-app",
                                      "status": "creating", "bundle": str(self.bundle)})
        script = (f"{state} | {HOOK} --runtime-dir {self.runtime} --private-dir {self.private} "
                  f"--interposer {self.interposer} createRuntime; echo \"rc=$?\"; "
                  "cat /proc/self/mountinfo")
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                              capture_output=True, text=True, timeout=30, check=True)
        lines = done.stdout.splitlines()
        rc_line = next(i for i, line in enumerate(lines) if line.startswith("rc="))
        fields = [f for f in (line.split() for line in lines[rc_line + 1:])
                  if f[4].startswith(str(self.base))]
        self.options = {f[4]: f[5].split(",") for f in fields}
        return int(lines[rc_line][3:]), done.stderr, [(f[3], f[4]) for f in fields]

    def untouched(self) -> None:
        assert stat.S_IMODE(self.victim.stat().st_mode) == 0o755
        assert list(self.victim.iterdir()) == []
        assert stat.S_IMODE(self.victim_file.stat().st_mode) == 0o600
        assert self.victim_file.read_text() == "secret\n"


def state_with_shell_pid(state: dict[str, str]) -> str:
    """A shell command printing the OCI state ``state`` with ``"pid"``: the shell's own pid
    ($$), i.e. a process in the mount namespace the hook must mount into."""
    body = json.dumps(state)
    return f"printf '%s%s}}' '{body[:-1]}, \"pid\": ' \"$$\""


def test_a_state_without_the_containers_pid_is_refused_and_nothing_is_mounted(
        world: World) -> None:
    """Bug caught: a missing or malformed pid read as 0 made the hook mount in its own
    namespace, so the container started without its interposer."""
    for pid in ("", ', "pid": 0', ', "pid": "12"', ', "pid": true', ', "pid": -4'):
        state = ('{"ociVersion": "1.1.0", "id": "cid-app", "status": "creating", '
                 f'"bundle": "{world.bundle}"{pid}}}')
        done = subprocess.run([str(HOOK), "--runtime-dir", str(world.runtime), "--private-dir",
                               str(world.private), "--interposer", str(world.interposer),
                               "createRuntime"], input=state, capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 2, (pid, done.stderr)
        assert "names no container process" in done.stderr, done.stderr
        assert not (world.rootfs / "etc" / "ld.so.preload").exists()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_clean_node_gets_only_its_own_folder_and_card_files(world: World) -> None:
    status, err, mounts = world.hook()
    assert status == 0, err
    region = world.runtime / "containers" / f"{UID}_app"
    card = world.runtime / "cards" / UUID
    assert stat.S_IMODE(region.lstat().st_mode) == 0o777
    for folder in (world.runtime / "cards", card):
        info = folder.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o755
        assert info.st_uid == 0
    roster = card_roster.read_roster(str(card))
    assert roster.shares() == {0: RosterEntry(OWNER, 0, 0, 30, 0, 0, f"{UID}_app")}
    assert stat.S_IMODE((card / "roster").stat().st_mode) == 0o644
    share = (card / SHARE).lstat()
    assert stat.S_ISREG(share.st_mode) and stat.S_IMODE(share.st_mode) == 0o666
    assert share.st_size == card_roster.SHARE_FILE_SIZE
    targets = {target for _, target in mounts}
    inside = f"{world.rootfs}/var/run/egpu"
    assert f"{inside}/containers/{UID}_app" in targets
    assert f"{inside}/cards/{UUID}" in targets and f"{inside}/cards/{UUID}/{SHARE}" in targets
    assert f"{inside}/cards" not in targets and inside not in targets  # never the whole folder
    assert "ro" in world.options[f"{inside}/cards/{UUID}"]  # the folder: read-only
    assert "rw" in world.options[f"{inside}/cards/{UUID}/{SHARE}"]  # its own file: writable
    assert f"{world.rootfs}/run/egpu/config.json" in targets


def test_the_previous_versions_card_region_file_is_replaced_by_a_folder(world: World) -> None:
    """A card region of the previous version (one file per card, 0666, maybe another user's
    or linked elsewhere) is unlinked, never written: a running container keeps its mapping."""
    cards = world.runtime / "cards"
    cards.mkdir(mode=0o1777)
    os.link(world.victim_file, cards / UUID)
    status, err, _ = world.hook()
    assert status == 0, err
    assert (cards / UUID).is_dir() and (cards / UUID / SHARE).is_file()
    assert stat.S_IMODE(cards.stat().st_mode) == 0o755  # no longer world-writable
    world.untouched()
    assert world.victim_file.stat().st_nlink == 1


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
    "containers-folder-symlink", "cards-folder-symlink", "card-folder-symlink",
    "card-folder-fifo", "card-folder-of-another-user", "roster-symlink", "roster-hardlink",
    "roster-fifo", "roster-folder", "share-file-symlink", "share-file-hardlink",
    "share-file-fifo", "share-file-folder", "runtime-dir-symlink",
    "private-hook-folder-symlink", "private-config-symlink", "region-folder-is-a-file",
])
def test_every_trap_under_the_hooks_folders_is_refused(world: World, trap: str) -> None:
    runtime, private = world.runtime, world.private
    card = runtime / "cards" / UUID
    if trap == "containers-folder-symlink":
        os.symlink(world.victim, runtime / "containers")
    elif trap == "cards-folder-symlink":
        os.symlink(world.victim, runtime / "cards")
    elif trap.startswith("card-folder"):
        (runtime / "cards").mkdir()
        if trap == "card-folder-symlink":
            os.symlink(world.victim, card)
        elif trap == "card-folder-fifo":
            os.mkfifo(card)
        else:
            card.mkdir()
            os.chown(card, 65534, 65534)  # it could plant links in it or chmod it later
    elif trap.startswith(("roster", "share-file")):
        card.mkdir(parents=True)
        target = card / ("roster" if trap.startswith("roster") else SHARE)
        kind = trap.rsplit("-", 1)[1]
        if kind == "symlink":
            os.symlink(world.victim_file, target)
        elif kind == "hardlink":
            os.link(world.victim_file, target)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
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
                                        "hard links", "is a folder", "belongs to uid",
                                        "regular file")), err
    assert mounts == []
    world.untouched()
    if trap.endswith("hardlink"):
        assert world.victim_file.stat().st_nlink == 2  # left as found


def test_a_rerun_keeps_the_files_and_their_modes(world: World) -> None:
    assert world.hook()[0] == 0
    card = world.runtime / "cards" / UUID
    share = card / SHARE
    state = b"x" * card_roster.SHARE_FILE_SIZE  # the share's own state: kept as it is
    share.write_bytes(state)
    roster = (card / "roster").read_bytes()
    status, err, _ = world.hook()
    assert status == 0, err
    assert share.read_bytes() == state and (card / "roster").read_bytes() == roster


def test_a_full_card_is_refused_naming_it(world: World) -> None:
    card = world.runtime / "cards" / UUID
    card.mkdir(parents=True)
    for n in range(card_roster.NSLOTS):
        card_roster.register(str(card), UUID, RosterEntry(card_roster.share_owner(f"u{n}_c")))
    status, err, mounts = world.hook()
    assert status == 2 and mounts == []
    assert f"card {UUID}: all 32 slots" in err, err


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
    card = world.runtime / "cards" / UUID
    files = " ".join(str(p) for p in (hook_dir / "config.json", hook_dir / "ld.so.preload",
                                      card / "roster", card / SHARE))
    report = (f"echo \"rc=$?\"; grep -c ' {world.base}' /proc/self/mountinfo; "
              f"stat -c '%n %i %y %s' {files}")
    state = state_with_shell_pid({"ociVersion": "1.1.0", "id": "cid-app",
                                  "status": "creating", "bundle": str(world.bundle)})
    script = (f"export EGPU_INTERPOSER={world.interposer}; {state} > state.json; "
              f"{cdi_hook} < state.json; {report}; "
              f"{base_hook} < state.json; {report}; cat {world.rootfs}/etc/ld.so.preload")
    done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          cwd=world.base, capture_output=True, text=True, timeout=30, check=True)
    lines = done.stdout.splitlines()
    first, second = lines[0:6], lines[6:12]
    assert first[0] == "rc=0" and second[0] == "rc=0", done.stderr
    assert int(first[1]) >= 6  # interposer, config, preload, region folder, card, share file
    assert second[1:] == first[1:]  # no new mount; files: same inode, mtime and size
    assert lines[12:] == ["/usr/lib/egpu/libegpu_interpose.so"]  # listed once
    assert done.stderr == ""
