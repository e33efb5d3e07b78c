"""The runtime hook in real runc containers (FC-05, the share enforced, others untouched).

Each test runs ``runc run`` on a tiny root filesystem (demo/sandbox.py) whose createRuntime hook is
egpu-hook. The fake GPU has one 24576 MiB card (fakegpu's default, no config needed, so that a
process with an empty environment still finds it); the pod's share on it is 4096 MiB.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from demo.sandbox import FAKE_DEFAULT_MIB, FAKE_DEFAULT_UUID, RuncWorld
from egpu import card_roster
from egpu.contract import claim_mark_path
from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

pytestmark = pytest.mark.runc

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
SHARE_MIB = 4096


def pod(world: RuncWorld, uid: str, container: str = "main", mib: int = SHARE_MIB) -> dict:
    """Write the pod's allocation file as the node agent does; return the OCI annotations
    containerd's CRI plugin puts on its container."""
    entry = ContainerAllocation(container, False, (CardShare(FAKE_DEFAULT_UUID, 0, mib, 30),))
    record = PodShares("team", f"pod-{uid[:4]}", uid, "high", "strict", False,
                       Allocation(containers=(entry,), node="node-1"))
    folder = world.private_dir / "allocations"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{uid}.json").write_text(record.encode())
    return {"io.kubernetes.cri.sandbox-uid": uid, "io.kubernetes.cri.container-name": container,
            "io.kubernetes.cri.sandbox-name": f"pod-{uid[:4]}",
            "io.kubernetes.cri.sandbox-namespace": "team",
            "io.kubernetes.cri.container-type": "container"}


SHARE_ENV = {"NVIDIA_VISIBLE_DEVICES": FAKE_DEFAULT_UUID, "EGPU_DEVICES": "x::0"}


def test_share_is_enforced_inside_the_container(interposer_world: RuncWorld) -> None:
    ann = pod(interposer_world, "aaaaaaaa-0000-0000-0000-000000000001")
    over, _ = interposer_world.run(["/probe", str(SHARE_MIB + 1024)], SHARE_ENV, ann)
    assert over.returncode == 0, over.stderr
    assert over.values["total_mib"] == SHARE_MIB, over.stdout
    assert over.values["alloc"] == CUDA_ERROR_OUT_OF_MEMORY, over.stdout
    within, _ = interposer_world.run(["/probe", "1024"], SHARE_ENV, ann)
    assert within.values["alloc"] == CUDA_SUCCESS, within.stdout


def test_config_and_preload_are_read_only(runc_world: RuncWorld) -> None:
    ann = pod(runc_world, "aaaaaaaa-0000-0000-0000-000000000002")
    result, _ = runc_world.run(["/probe", "0"], SHARE_ENV, ann)
    assert result.returncode == 0, result.stderr
    assert result.values["config_write_errno"] == errno.EROFS, result.stdout
    assert result.values["preload_write_errno"] == errno.EROFS, result.stdout
    config = runc_world.private_dir / "hook" / "aaaaaaaa-0000-0000-0000-000000000002_main"
    assert f'"memory_mib": {SHARE_MIB}' in (config / "config.json").read_text()
    region = runc_world.runtime_dir / "containers" / "aaaaaaaa-0000-0000-0000-000000000002_main"
    assert region.is_dir()


def test_empty_environment_does_not_lift_the_cap(interposer_world: RuncWorld) -> None:
    """FC-05: the process re-executes itself with an empty environment, allocates 8 GiB."""
    ann = pod(interposer_world, "aaaaaaaa-0000-0000-0000-000000000003")
    result, _ = interposer_world.run(["/probe", "--clearenv", "8192"], SHARE_ENV, ann)
    assert result.returncode == 0, result.stderr
    values = result.values
    assert values["env"] == 0, result.stdout
    assert values["alloc"] == CUDA_ERROR_OUT_OF_MEMORY, result.stdout
    assert values["total_mib"] == SHARE_MIB, result.stdout


def test_container_without_share_is_untouched(runc_world: RuncWorld) -> None:
    result, bundle = runc_world.run(["/probe", str(SHARE_MIB + 1024)], {}, {
        "io.kubernetes.cri.sandbox-uid": "bbbbbbbb-0000-0000-0000-000000000000",
        "io.kubernetes.cri.container-name": "plain"})
    assert result.returncode == 0, result.stderr
    assert result.values["total_mib"] == FAKE_DEFAULT_MIB
    assert result.values["alloc"] == CUDA_SUCCESS
    assert result.values["preload_mounts"] == 0
    rootfs = bundle / "rootfs"
    assert not (rootfs / "etc" / "ld.so.preload").exists()
    assert not (rootfs / "run" / "egpu").exists()
    assert not (rootfs / "usr" / "lib" / "egpu").exists()


def test_hook_twice_is_idempotent(runc_world: RuncWorld) -> None:
    ann = pod(runc_world, "aaaaaaaa-0000-0000-0000-000000000004")
    result, _ = runc_world.run(["/probe", "0"], SHARE_ENV, ann, hooks=2)
    assert result.returncode == 0, result.stderr
    assert result.values["preload_mounts"] == 1, result.stdout


def test_wrong_cards_are_refused_with_a_clear_message(runc_world: RuncWorld) -> None:
    ann = pod(runc_world, "aaaaaaaa-0000-0000-0000-000000000005")
    env = {**SHARE_ENV, "NVIDIA_VISIBLE_DEVICES": "GPU-ffffffff-0000-0000-0000-000000000000"}
    result, _ = runc_world.run(["/probe", "0"], env, ann)
    assert result.returncode != 0 and not result.stdout
    assert "does not match its allocation" in result.stderr


def test_allocation_error_is_refused(runc_world: RuncWorld) -> None:
    ann = pod(runc_world, "aaaaaaaa-0000-0000-0000-000000000006")
    env = {"EGPU_DEVICES": "x::0", "EGPU_ALLOCATION_ERROR": "no pod bound waits for cards X"}
    result, _ = runc_world.run(["/probe", "0"], env, ann)
    assert result.returncode != 0 and "no pod bound waits for cards X" in result.stderr


def test_symlinks_in_the_image_cannot_redirect_writes_to_the_host(
        runc_world: RuncWorld, tmp_path: Path) -> None:
    """An image whose /etc is an absolute symlink to a host folder: the hook's files land in
    the container's own <rootfs><target>, never in the host's folder."""
    outside = tmp_path / "host-etc"
    outside.mkdir()
    bundle = runc_world.new_rootfs(f"escape-{os.getpid()}")
    rootfs = bundle / "rootfs"
    (rootfs / "etc").rmdir()
    os.symlink(str(outside), rootfs / "etc")
    ann = pod(runc_world, "aaaaaaaa-0000-0000-0000-000000000007")
    result, _ = runc_world.run(["/probe", "0"], SHARE_ENV, ann, bundle=bundle)
    assert list(outside.iterdir()) == []
    assert result.returncode == 0, result.stderr
    assert (rootfs / str(outside).lstrip("/") / "ld.so.preload").exists()


# What a tenant tries on its card's folder (docs/security.md, "Node-side state"): prints
# key=errno (0 = it worked) for each attempt.
CARD_PROBE = r"""
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int try_open(const char *path, int flags)
{
    int fd = open(path, flags, 0666);
    if (fd < 0) return errno;
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 4) return 2;
    const char *card = argv[1], *own = argv[2], *other = argv[3];
    char roster[512], planted[512], magic[9] = {0};
    snprintf(roster, sizeof roster, "%s/roster", card);
    snprintf(planted, sizeof planted, "%s/share-planted", card);
    int own_write = 0, fd = open(own, O_RDWR);
    if (fd < 0 || pwrite(fd, "OWNSTATE", 8, 8) != 8) own_write = errno ? errno : -1;
    if (fd >= 0) close(fd);
    fd = open(roster, O_RDONLY);
    if (fd >= 0) { if (pread(fd, magic, 8, 0) != 8) magic[0] = 0; close(fd); }
    printf("own_write=%d other_read=%d other_write=%d other_truncate=%d other_unlink=%d "
           "roster_write=%d roster_magic=%d create=%d\n", own_write, try_open(other, O_RDONLY),
           try_open(other, O_WRONLY), truncate(other, 0) ? errno : 0,
           unlink(other) ? errno : 0, try_open(roster, O_WRONLY),
           !strcmp(magic, "EGPUROST"), try_open(planted, O_CREAT | O_WRONLY));
    return 0;
}
"""


def test_a_tenant_writes_its_own_share_file_and_nothing_else_of_its_card(
        runc_world: RuncWorld, tmp_path: Path) -> None:
    """Two pods on the card: the second one's container sees the card's folder read-only
    (its roster and the first pod's share file readable; neither writable, truncatable nor
    removable; no file can be created there: EROFS, even as root with CAP_DAC_OVERRIDE) and
    its own share file read-write."""
    first, second = ("aaaaaaaa-0000-0000-0000-000000000008",
                     "aaaaaaaa-0000-0000-0000-000000000009")
    result, _ = runc_world.run(["/probe", "0"], SHARE_ENV, pod(runc_world, first))
    assert result.returncode == 0, result.stderr
    gcc = shutil.which("gcc")
    assert gcc is not None, "README: gcc"
    (tmp_path / "card_probe.c").write_text(CARD_PROBE)
    bundle = runc_world.new_rootfs(f"card-probe-{os.getpid()}")
    subprocess.run([gcc, "-O1", "-o", str(bundle / "rootfs" / "card_probe"),
                    str(tmp_path / "card_probe.c")], check=True)
    card_in = f"/var/run/egpu/cards/{FAKE_DEFAULT_UUID}"
    own, other = (card_roster.share_file_name(card_roster.share_owner(f"{uid}_main"))
                  for uid in (second, first))
    card = runc_world.runtime_dir / "cards" / FAKE_DEFAULT_UUID
    before = (card / other).read_bytes()
    result, _ = runc_world.run(["/card_probe", card_in, f"{card_in}/{own}",
                                f"{card_in}/{other}"], SHARE_ENV, pod(runc_world, second),
                               bundle=bundle)
    assert result.returncode == 0, result.stderr
    values = {k: int(v) for k, v in (p.split("=") for p in result.stdout.split())}
    assert values == {"own_write": 0, "other_read": 0, "other_write": errno.EROFS,
                      "other_truncate": errno.EROFS, "other_unlink": errno.EROFS,
                      "roster_write": errno.EROFS, "roster_magic": 1,
                      "create": errno.EROFS}, result.stdout
    assert (card / own).read_bytes()[8:16] == b"OWNSTATE"  # the host's file, written
    assert (card / other).read_bytes() == before
    assert not (card / "share-planted").exists()
    owners = {e.owner for e in card_roster.read_roster(str(card)).shares().values()}
    assert {card_roster.share_owner(f"{uid}_main") for uid in (first, second)} <= owners


# --- issue 24: one ResourceClaim, one budget, however many containers and pods use it ---------
CLAIM = "c1a1c1a1-0000-4000-8000-000000000024"
CLAIM_FOLDER = f"claim-{CLAIM}_gpu"
CLAIM_MIB = 3000
CONTEXT_MIB = 256  # what the interposer charges a context (EGPU_CONTEXT_OVERHEAD_MIB default)


def claim_pod(world: RuncWorld, uid: str, containers: tuple[str, ...]) -> None:
    """The allocation file of a pod the claim was prepared for (the DRA plugin's: each
    container naming the claim draws on the claim's folder)."""
    card = (CardShare(FAKE_DEFAULT_UUID, 0, CLAIM_MIB, 30),)
    record = PodShares("team", f"pod-{uid[:4]}", uid, "high", "strict", False, Allocation(
        containers=tuple(ContainerAllocation(c, False, card, share=CLAIM_FOLDER)
                         for c in containers), node="node-1"))
    folder = world.private_dir / "allocations"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{uid}.json").write_text(record.encode())
    claim = record.replace(pod="shared-claim", pod_uid=CLAIM, allocation=Allocation(
        (ContainerAllocation("gpu", False, card, share=CLAIM_FOLDER),)))
    shares = world.private_dir / "claim-shares"
    shares.mkdir(parents=True, exist_ok=True)
    (shares / f"{CLAIM}.json").write_text(claim.encode())


def annotations(uid: str, container: str, namespace: str = "team") -> dict[str, str]:
    return {"io.kubernetes.cri.sandbox-uid": uid, "io.kubernetes.cri.container-name": container,
            "io.kubernetes.cri.sandbox-name": f"pod-{uid[:4]}",
            "io.kubernetes.cri.sandbox-namespace": namespace,
            "io.kubernetes.cri.container-type": "container"}


CLAIM_ENV = {"NVIDIA_VISIBLE_DEVICES": FAKE_DEFAULT_UUID, "EGPU_DEVICES": f"claim-{CLAIM}-gpu",
             f"EGPU_CLAIM_SHARE_{CLAIM}_gpu": f"{CLAIM}/gpu"}
CLAIM_MARK = (claim_mark_path(CLAIM, "gpu"),)  # the device node of the claim's CDI device


def test_containers_and_pods_on_one_claim_draw_on_one_budget(
        interposer_world: RuncWorld) -> None:
    """A 3000 MiB claim: a container of the pod it was prepared for holds 2000 MiB; then its
    sibling container and a container of a second pod that joined the claim later (no
    allocation file of its own: the claim's shares file) each see a 3000 MiB total, get
    OUT_OF_MEMORY for 2000 MiB and CUDA_SUCCESS for 400 MiB (3000 - 2000 - a context each);
    the card lists the claim once, with its 30 cores (one compute cap). A pod of another
    namespace naming the claim is refused. The bug this catches: a budget per container,
    which let 2 x 3000 MiB run on a 3000 MiB booking."""
    world = interposer_world
    first, joined = ("aaaaaaaa-0000-0000-0000-0000000000c1", "aaaaaaaa-0000-0000-0000-0000000000c2")
    claim_pod(world, first, ("server", "sidecar"))
    holder = world.start(["/probe", "2000", "hold"], CLAIM_ENV, annotations(first, "server"),
                         devices=CLAIM_MARK)
    try:
        assert holder.proc.stdout is not None
        line = holder.proc.stdout.readline()
        assert "alloc=0" in line and f"total_mib={CLAIM_MIB}" in line, (
            line, holder.proc.stderr.read() if holder.proc.poll() is not None else "")
        for uid, container in ((first, "sidecar"), (joined, "worker")):
            over, _ = world.run(["/probe", "2000"], CLAIM_ENV, annotations(uid, container),
                                devices=CLAIM_MARK)
            assert over.returncode == 0, over.stderr
            assert (over.values["total_mib"], over.values["alloc"]) == (
                CLAIM_MIB, CUDA_ERROR_OUT_OF_MEMORY), (container, over.stdout)
            assert over.values["free_mib"] == CLAIM_MIB - 2000 - 2 * CONTEXT_MIB, (
                container, over.stdout)
            within, _ = world.run(["/probe", "400"], CLAIM_ENV, annotations(uid, container),
                                  devices=CLAIM_MARK)
            assert within.values["alloc"] == CUDA_SUCCESS, (container, within.stdout)
        card = world.runtime_dir / "cards" / FAKE_DEFAULT_UUID
        shares = card_roster.read_roster(str(card)).shares()
        mine = [e for e in shares.values() if e.owner == card_roster.share_owner(CLAIM_FOLDER)]
        assert [(e.cores, e.name) for e in mine] == [(30, CLAIM_FOLDER[:31])], shares
        assert not (world.runtime_dir / "containers" / f"{joined}_worker").exists()
        stranger, _ = world.run(["/probe", "0"], CLAIM_ENV,
                                annotations("aaaaaaaa-0000-0000-0000-0000000000c3", "x",
                                            namespace="other"), devices=CLAIM_MARK)
        assert stranger.returncode != 0
        assert "is not of the pod's namespace (other)" in stranger.stderr, stranger.stderr
        # a pod of the claim's namespace that copies the claim's variables into its own env
        # but does not reference the claim (no CDI device from the kubelet) is refused, and
        # takes no roster entry
        copier, _ = world.run(["/probe", "0"], CLAIM_ENV,
                              annotations("aaaaaaaa-0000-0000-0000-0000000000c4", "y"))
        assert copier.returncode != 0
        assert "was not given their CDI devices" in copier.stderr, copier.stderr
        assert card_roster.read_roster(str(card)).shares() == shares
    finally:
        holder.kill()
        holder.wait()


def test_a_new_instance_of_a_container_gets_its_whole_share_while_a_lost_one_holds_the_old(
        interposer_world: RuncWorld) -> None:
    """containerd restarted while it started a container: the kubelet saw the start fail and
    created the container again, and the first instance's process lived on, holding 3000 MiB
    of the 4096 MiB share in the container's accounting region. The new instance (same pod,
    same container name: the same region folder) sees its whole share and allocates 3000 MiB.
    The bug this catches: the new instance found its share full (cuCtxCreate
    OUT_OF_MEMORY on a 1000 MiB share in the containerd-restart burst), a replica Running
    without its share."""
    world = interposer_world
    ann = pod(world, "aaaaaaaa-0000-0000-0000-0000000000d1")
    lost = world.start(["/probe", "3000", "hold"], SHARE_ENV, ann)
    try:
        assert lost.proc.stdout is not None
        line = lost.proc.stdout.readline()
        assert "alloc=0" in line, (line, lost.proc.stderr.read() if lost.proc.poll() is not None
                                   else "")
        again, _ = world.run(["/probe", "3000"], SHARE_ENV, ann)
        assert again.returncode == 0, again.stderr
        assert (again.values["total_mib"], again.values["alloc"]) == (SHARE_MIB, CUDA_SUCCESS), (
            again.stdout, again.stderr)
        region = world.runtime_dir / "containers" / f"{ann['io.kubernetes.cri.sandbox-uid']}_main"
        kept = (region / "region").stat().st_ino
    finally:
        lost.kill()
        lost.wait()
    # with nothing holding it, the next instance keeps the region (the exporter's peak and
    # refusal counts of the container go on)
    done, _ = world.run(["/probe", "0"], SHARE_ENV, ann)
    assert done.returncode == 0, done.stderr
    assert (region / "region").stat().st_ino == kept
