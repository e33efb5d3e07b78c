"""Accounting at its edges: which config file wins, VMM handles released, retained and
imported, concurrent pool allocations, array size overflow, context destruction, processes
in nested pid namespaces, region files that are not what they should be, and a lock held
forever. (First found by an adversarial review, findings F3..F9.)"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from egpu.contract import container_region_path
from tests.probes import wait_for_hold

from .conftest import LIB, MIB, one, parse

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"

def needs_root(test):
    """Tests that run cuprobe in a private mount namespace: `make test` runs as root with
    util-linux's unshare(1); without them the test fails saying so (never skips)."""

    def run(*args, **kwargs):
        assert os.geteuid() == 0 and shutil.which("unshare"), (
            "needs root and unshare(1): run `make test` as root, as the README says")
        return test(*args, **kwargs)

    return functools.wraps(test)(run)


def _in_mount_ns_with_config(rig, doc: dict | None, steps, **extra) -> list[dict]:
    """Run cuprobe in a private mount namespace whose /run/egpu/config.json is `doc` (as the
    runtime hook binds it), or where /run/egpu does not exist (doc None)."""
    setup = "mount -t tmpfs none /run"
    if doc is not None:
        setup += (" && mkdir -p /run/egpu && cat > /run/egpu/config.json"
                  " && chmod 444 /run/egpu/config.json")
    script = f'{setup} && exec "$@"'
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(LIB / "cuprobe"), *map(str, steps)],
        input=json.dumps(doc) if doc is not None else "",
        env=rig.base_env(True, **extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return parse(p.stdout)


def _doc(rig, mib: int) -> dict:
    return {
        "version": 1,
        "namespace": "ns",
        "pod": "p",
        "pod_uid": "uid",
        "container": "c",
        "container_region": container_region_path("uid_c", str(rig.tmp / "egpu")),
        "cards": [{"uuid": UUID0, "memory_mib": mib, "cores": 0}],
    }


# ---- F3: EGPU_CONFIG_PATH cannot override the node's config file -------------------------
@needs_root
def test_config_path_env_ignored_when_node_config_exists(rig):
    own = rig.tmp / "mine.json"
    own.write_text(json.dumps(_doc(rig, 20000)))
    steps = ["init", "primary", "totalmem", "alloc", 5000]
    for env_path in (str(rig.tmp / "missing.json"), str(own)):
        rows = _in_mount_ns_with_config(
            rig, _doc(rig, 4096), steps, EGPU_CONFIG_PATH=env_path, EGPU_MEMORY_LIMIT_MIB=20000
        )
        assert one(rows, "init")["rc"] == 0, rows
        assert one(rows, "totalmem")["total"] == 4096 * MIB, (env_path, rows)
        assert one(rows, "alloc")["rc"] == 2, (env_path, rows)  # over the node's 4096 MiB cap


@needs_root
def test_config_path_env_honoured_without_node_config(rig):
    own = rig.tmp / "mine.json"
    own.write_text(json.dumps(_doc(rig, 6000)))
    rows = _in_mount_ns_with_config(
        rig, None, ["init", "primary", "totalmem"], EGPU_CONFIG_PATH=str(own)
    )
    assert one(rows, "totalmem")["total"] == 6000 * MIB, rows
    rows = _in_mount_ns_with_config(
        rig,
        None,
        ["init", "primary", "totalmem"],
        EGPU_CONFIG_PATH=str(rig.tmp / "missing.json"),
        EGPU_MEMORY_LIMIT_MIB=3000,
    )
    assert one(rows, "totalmem")["total"] == 3000 * MIB, rows


# ---- F4: VMM memory is freed when released AND unmapped ----------------------------------
def test_vmm_release_while_mapped_stays_charged(rig):
    steps = ["init", "ctx"]
    for _ in range(6):
        steps += ["vmm", 1024, "dev", 0, "vmm_map", "vmm_release"]
    steps += ["meminfo"]
    rows = rig.probe(*steps, EGPU_MEMORY_LIMIT_MIB=4096, EGPU_CONTEXT_OVERHEAD_MIB=0)
    creates = [r["rc"] for r in rows if r["step"] == "vmm"]
    assert creates == [0, 0, 0, 0, 2, 2], rows  # mapped memory still counts after release
    assert one(rows, "meminfo")["used"] == 4096 * MIB


def test_vmm_release_then_unmap_gives_back(rig):
    rows = rig.probe(
        "init",
        "ctx",
        "vmm",
        1024,
        "dev",
        0,
        "vmm_map",
        "vmm_release",
        "meminfo",
        "nvml",
        "vmm_unmap",
        "meminfo",
        "nvml",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo", 0)["used"] == 1024 * MIB
    assert one(rows, "nvml", 0)["used"] == 1024 * MIB
    assert one(rows, "meminfo", 1)["used"] == 0  # released and unmapped: freed
    assert one(rows, "nvml", 1)["used"] == 0


def test_vmm_release_while_mapped_fake_driver_keeps_memory(rig):
    # the fake driver itself (no interposer) is faithful: card usage stays until the unmap
    rows = rig.probe(
        "init",
        "ctx",
        "vmm",
        1024,
        "dev",
        0,
        "vmm_map",
        "vmm_release",
        "meminfo",
        "vmm_unmap",
        "meminfo",
        preload=False,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo", 0)["used"] == 1024 * MIB
    assert one(rows, "meminfo", 1)["used"] == 0


def test_vmm_retain_allocation_handle_no_double_charge(rig):
    rows = rig.probe(
        "init",
        "ctx",
        "vmm",
        1024,
        "dev",
        0,
        "vmm_map",
        "vmm_retain",
        "meminfo",
        "vmm_release",
        "meminfo",  # the retained handle
        "vmm_release",
        "meminfo",  # the original: still mapped
        "vmm_unmap",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert [r["used"] for r in rows if r["step"] == "meminfo"] == [1024 * MIB] * 3 + [0]


def test_vmm_import_charged_to_importer(rig):
    # an import of another container's export (another open file: no shared slot matches) is
    # charged the allocation's whole size: the imported handle alone keeps all of it alive
    rows = rig.probe(
        "init",
        "ctx",
        "vmm",
        512,
        "dev",
        0,
        "vmm_share_foreign",
        "meminfo",
        "vmm_map_part",
        256,
        "meminfo",
        "vmm_unmap",
        "vmm_release",
        "meminfo",
        "vmm_release",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    used = [r["used"] for r in rows if r["step"] == "meminfo"]
    assert used == [(512 + 512) * MIB, (512 + 512) * MIB, 512 * MIB, 0], used


def test_vmm_import_mapping_over_cap_refused(rig):
    rows = rig.probe(
        "init",
        "ctx",
        "vmm",
        3000,
        "dev",
        0,
        "vmm_share_foreign",
        "vmm_map",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert one(rows, "vmm_share_foreign")["rc"] == 2, rows  # 3000 + 3000 MiB > 4096 MiB
    assert one(rows, "meminfo")["used"] == 3000 * MIB


def test_vmm_import_of_the_containers_own_export_is_charged_once(rig):
    """The same open file as an export of this container (NCCL's fd passed to a peer, here
    this process): the import holds the export's shared charge. Bug caught: 3000 MiB
    charged twice, the import's mapping refused on a 4096 MiB share; or the charge given
    back while the import still holds the memory."""
    rows = rig.probe(
        "init", "ctx", "vmm", 3000, "dev", 0, "vmm_share", "vmm_map", "meminfo",
        "vmm_unmap", "vmm_release", "meminfo",  # the import lets go: the creator still holds it
        "vmm_release", "meminfo",  # the creator lets go: given back
        EGPU_MEMORY_LIMIT_MIB=4096, EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert [r["used"] for r in rows if r["step"] == "meminfo"] == [3000 * MIB, 3000 * MIB, 0]


# ---- F7: concurrent pool allocations cannot pass the cap together ------------------------
def test_pool_race_concurrent_alloc_from_pool_within_cap(rig):
    # the fake driver sleeps 200 us in each pool allocation: both threads are inside it together
    p = rig.run(
        "pool_race", 200, EGPU_MEMORY_LIMIT_MIB=1536, FAKEGPU_POOL_ALLOC_DELAY_US=200, timeout=120
    )
    row = one(parse(p.stdout), "pool_race")
    assert row["rc"] == 0 and row["rounds"] == 200, p.stdout
    assert row["both"] == 0, p.stdout
    assert row["one"] == 200, p.stdout  # and one of the two always succeeds (cache reuse)


# ---- F9: array size overflow; context destroy gives back its allocations ----------------
def test_arr_bytes_overflow_refused(rig):
    big = 1 << 20
    rows = rig.probe(
        "init",
        "primary",
        "array3d",
        big,
        big,
        big,
        4,
        "meminfo",
        "array3d",
        64,
        64,
        64,
        4,
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert one(rows, "array3d", 0)["rc"] == 1, rows  # CUDA_ERROR_INVALID_VALUE, never charged 0
    assert one(rows, "meminfo", 0)["used"] == 0
    assert one(rows, "array3d", 1)["rc"] == 0
    assert one(rows, "meminfo", 1)["used"] == 64 * 64 * 64 * 16


def test_ctx_destroy_gives_back_its_allocations(rig):
    rows = rig.probe(
        "init",
        "primary",
        "ctx",
        "alloc",
        1024,
        "pitch",
        1000,
        1000,
        "array",
        256,
        256,
        "meminfo",
        "ctx_destroy",
        "meminfo",
        "nvml",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo", 0)["used"] > 1024 * MIB
    assert one(rows, "meminfo", 1)["used"] == 0, rows  # the driver freed them with the context
    assert one(rows, "nvml")["used"] == 0


def test_ctx_destroy_keeps_other_contexts_allocations(rig):
    rows = rig.probe(
        "init",
        "ctx",
        "alloc",
        512,
        "ctx",
        "alloc",
        256,
        "ctx_destroy",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
        EGPU_CONTEXT_OVERHEAD_MIB=0,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo")["used"] == 512 * MIB


# ---- F6: a process in another pid namespace is not reaped while alive --------------------
@needs_root
def test_nested_pid_namespace_usage_not_reaped_while_alive(rig):
    env = rig.base_env(True, EGPU_MEMORY_LIMIT_MIB=4096)
    holder = subprocess.Popen(
        [
            "unshare",
            "-pf",
            "--mount-proc",
            "--kill-child",
            str(LIB / "cuprobe"),
            "init",
            "ctx",
            "alloc",
            "3000",
            "meminfo",
            "hold",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = wait_for_hold(holder)
        rows = parse("".join(lines))
        assert one(rows, "alloc")["rc"] == 0, (lines, holder.stderr)
        # the holder is pid 1 (or so) in its namespace: here that pid is dead or someone else
        time.sleep(0.1)  # past the 50 ms reap interval of capacity queries
        rows = rig.probe(
            "init", "ctx", "meminfo", "alloc", 3000, "meminfo", EGPU_MEMORY_LIMIT_MIB=4096
        )
        assert one(rows, "meminfo")["used"] >= 3000 * MIB + 2 * 256 * MIB, rows
        assert one(rows, "alloc")["rc"] == 2, rows  # the holder's 3000 MiB still count
    finally:
        holder.kill()
        holder.wait(timeout=10)
    time.sleep(0.2)
    # once it is gone, its slot is reclaimed (the kernel dropped its lock)
    rows = rig.probe("init", "ctx", "alloc", 3000, "meminfo", EGPU_MEMORY_LIMIT_MIB=4096)
    assert one(rows, "alloc")["rc"] == 0, rows
    assert one(rows, "meminfo")["used"] == 3000 * MIB + 256 * MIB


# ---- F5: region files that are not what they should be are refused, never hang or crash --
def _bad_files(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "target").write_bytes(b"")
    os.mkfifo(d / "fifo")
    (d / "link").symlink_to(d / "target")
    (d / "short").write_bytes(b"\0" * 100)
    (d / "foreign").write_bytes(b"\x01" * 20480)  # the right size, not ours
    return {k: d / k for k in ("fifo", "link", "short", "foreign")}


def test_region_files_fifo_symlink_short_refused(rig):
    bad = _bad_files(rig.tmp / "bad")
    for kind, path in bad.items():
        for what in ("card", "acct"):
            if what == "acct" and kind == "foreign":
                continue
            p = rig.run("region_check", what, path, preload=False, timeout=20)
            assert one(parse(p.stdout), what)["rc"] == 1, (what, kind, p.stdout, p.stderr)
            assert (
                "refused" in p.stderr
                or "not a regular file" in p.stderr
                or "symbolic link" in p.stderr
                or "size" in p.stderr
                or "magic" in p.stderr
            ), (what, kind, p.stderr)
    assert (rig.tmp / "bad" / "short").stat().st_size == 100  # never grown or rewritten
    assert (rig.tmp / "bad" / "target").stat().st_size == 0  # the link was not followed


def test_card_folder_made_on_a_raw_node_holds_roster_and_share_file(rig):
    """Without the hook (egpu run), the interposer makes the card folder and registers its
    share itself; a second process of the same share joins the same slot."""
    from egpu.card_roster import ROSTER_SIZE, read_roster, share_file_name

    card = rig.tmp / "cards" / "GPU-x"
    p = rig.run("region_check", "card", card, "card", card, "lock-same", card, preload=False,
                timeout=20)
    rows = parse(p.stdout)
    assert [r["rc"] for r in rows] == [0, 0, 0], p.stdout
    roster = read_roster(str(card))
    owners = [e.owner for e in roster.shares().values()]
    assert len(owners) == 1
    assert (card / "roster").stat().st_size == ROSTER_SIZE
    assert (card / share_file_name(owners[0])).stat().st_size == 4096


def test_co_tenant_cannot_hold_a_shares_lock(rig):
    """Each share has its own lock, in its own file: a co-tenant that holds its lock forever
    costs the other shares nothing; a process of the SAME share that does is bounded."""
    card = rig.tmp / "card"
    holder = subprocess.Popen(
        [str(LIB / "region_check"), "hold", str(card)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().startswith("hold rc=0")
        p = rig.run("region_check", "lock", card, "lock-same", card, preload=False, timeout=20)
        other, same = parse(p.stdout)
        assert other["rc"] == 0 and other["ms"] < 100, p.stdout  # another share: not held
        assert same["rc"] == 110 and same["ms"] < 2000, p.stdout  # ETIMEDOUT, bounded
        assert "not coordinated" in p.stderr
    finally:
        holder.kill()
        holder.wait()


def test_region_files_bad_container_region_refuses_cuda(rig):
    bad = _bad_files(rig.tmp / "bad")
    for kind in ("fifo", "link", "short"):
        rows = rig.probe("init", EGPU_MEMORY_LIMIT_MIB=4096, EGPU_CONTAINER_REGION=bad[kind])
        assert one(rows, "init")["rc"] == 3, (kind, rows)  # CUDA refused, no hang, no crash


def test_region_files_bad_card_region_compute_not_shared(rig):
    bad = _bad_files(rig.tmp / "bad")
    for kind in ("fifo", "link", "short"):
        path = rig.egpu_config([(UUID0, 4096)])
        doc = json.loads(path.read_text())
        doc["cards"][0]["cores"] = 50
        doc["cards"][0]["card_region"] = str(bad[kind])
        path.write_text(json.dumps(doc))
        p = rig.run("cuprobe", "init", "primary", "launch", 3, "alloc", 64, timeout=30)
        rows = parse(p.stdout)
        assert all(r["rc"] == 0 for r in rows), (kind, rows, p.stderr)
        assert "compute on that card is not shared" in p.stderr, (kind, p.stderr)


@needs_root
def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def test_nested_pid_namespace_card_slot_not_reaped_while_alive(rig):
    """The same kind on a raw node's card folder (processes in other pid namespaces): a
    share's roster entry is not freed by a peer while its process lives."""
    card = rig.tmp / "card"
    pid = next(p for p in range(77777, 99999) if not _pid_exists(p))  # one free here
    holder = subprocess.Popen(
        [
            "unshare",
            "-pf",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$0" claim "$1"; true',
            str(LIB / "region_check"),
            str(card),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        row = one(parse(holder.stdout.readline()), "claim")
        assert row["rc"] == 0 and row["pid"] == pid, row
        p = rig.run("region_check", "peer", card, preload=False, timeout=20)
        assert one(parse(p.stdout), "peer")["owners"] == 2, p.stdout  # A is alive: kept
    finally:
        holder.kill()
        holder.wait(timeout=10)
    time.sleep(0.2)
    p = rig.run("region_check", "peer", card, preload=False, timeout=20)
    assert one(parse(p.stdout), "peer")["owners"] == 1, p.stdout  # A is gone: freed


# ---- F3 (retest): no EGPU_* tunable of the pod changes a share set by the node's file ----
@needs_root
def test_pod_env_cannot_zero_context_overhead_under_node_config(rig):
    """With /run/egpu/config.json present, EGPU_CONTEXT_OVERHEAD_MIB=0 from the pod's env is
    ignored: contexts stay charged (else 40 contexts hold memory past the cap uncharged)."""
    steps = ["init", "primary", "meminfo"]
    rows = _in_mount_ns_with_config(rig, _doc(rig, 4096), steps, EGPU_CONTEXT_OVERHEAD_MIB=0)
    assert one(rows, "meminfo")["used"] == 256 * MIB, rows
    rows = _in_mount_ns_with_config(rig, None, steps, EGPU_CONTEXT_OVERHEAD_MIB=0,
                                    EGPU_MEMORY_LIMIT_MIB=4096)
    assert one(rows, "meminfo")["used"] == 0, rows  # raw node / tests: the knob still works


# ---- issue 26: what right-sizing reads from the region ---------------------------------


def test_region_keeps_the_peak_and_counts_refused_allocations(rig):
    """The interposer keeps each card's highest use and counts the allocations it refused
    because the share was full; the node agent's reader (node_agent.metrics.region, the code
    the exporter ships) reads both. Bugs caught: a peak that follows the current use down
    (right-sizing would see only what a 15 s scrape happened to catch), a refusal not
    counted (an OOM-bound share advised to shrink), a retry inside the interposer counted
    twice (charge() tries again after settling its pools), peak and refusals read from the
    wrong offsets."""
    from node_agent.metrics.region import read_region

    rows = rig.probe("init", "ctx", "alloc", 700, "alloc", 200, "free", "free",
                     "alloc", 300, "alloc", 900, "alloc", 2000, "meminfo",
                     EGPU_MEMORY_LIMIT_MIB=1024, EGPU_CONTEXT_OVERHEAD_MIB=0)
    allocs = [r["rc"] for r in rows if r["step"] == "alloc"]
    assert allocs == [0, 0, 0, 2, 2], rows  # 700+200 fit; after the frees 300 fits, 900 not
    # without a config file the container region is the local one (EGPU_MEMORY_LIMIT_MIB)
    folder = rig.tmp / "egpu" / "containers"
    (region,) = folder.glob("*/region")
    usage = read_region(str(region)).cards
    # the probe has exited (its use given back); the peak and the refusals outlive it
    assert [(c.used_bytes, c.peak_bytes, c.refused) for c in usage] == \
        [(0, 900 * MIB, 2)], usage
