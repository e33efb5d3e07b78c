"""Field cases FC-01..FC-06 and FC-16 (shared/cases/field-cases.md) against the fake GPU."""

from __future__ import annotations

import shutil
import signal

from tests.probes import wait_for_hold

from .conftest import INTERPOSER, MIB, one

UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
CTX = 256 * MIB  # EGPU_CONTEXT_OVERHEAD_MIB default


def test_fc01_vmm_host_location_not_charged(rig):
    rows = rig.probe(
        "init",
        "primary",
        "meminfo",
        "vmm",
        2,
        "host",
        0,
        "vmm_map",
        "meminfo",
        "nvml",
        "vmm_unmap",
        "vmm_release",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    before, mapped, after = (one(rows, "meminfo", i) for i in range(3))
    assert before["used"] == mapped["used"] == after["used"] == CTX
    assert one(rows, "nvml")["used"] == CTX


def test_fc01_vmm_device_from_properties_without_context(rig):
    rig.fake_config(
        [
            ("GPU-aaaaaaaa-0000-0000-0000-000000000000", 24576),
            ("GPU-bbbbbbbb-0000-0000-0000-000000000000", 24576),
        ]
    )
    # a new thread that never made a context current; the memory is located on device 1
    rows = rig.probe(
        "init",
        "thread_vmm",
        64,
        1,
        "primary",
        0,
        "meminfo",
        "primary",
        1,
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo", 0)["used"] == CTX  # device 0: only its context
    assert one(rows, "meminfo", 1)["used"] == CTX + 64 * MIB  # device 1: the VMM memory


def test_fc01_vmm_over_cap_without_context(rig):
    rows = rig.probe("init", "thread_vmm", 4096, 0, "thread_vmm", 64, 0, EGPU_MEMORY_LIMIT_MIB=4096)
    assert [r["rc"] for r in rows] == [0, 0, 2]


def test_fc02_expandable_segments(rig):
    steps = ["init", "primary"]
    for _ in range(12):
        steps += ["vmm", 512, "dev", 0, "vmm_map"]
    steps += ["meminfo", "nvml", "nvml2", "totalmem"]
    rows = rig.probe(*steps, EGPU_MEMORY_LIMIT_MIB=4096)
    creates = [r["rc"] for r in rows if r["step"] == "vmm"]
    assert creates[:7] == [0] * 7
    assert creates[7] == 2  # the 8th step fails with out-of-memory
    mapped = 7 * 512 * MIB
    for q in ("meminfo", "nvml", "nvml2"):
        assert one(rows, q)["used"] == CTX + mapped, q
        assert one(rows, q)["total"] == 4096 * MIB
    assert one(rows, "totalmem")["total"] == 4096 * MIB


def test_fc03_stream_ordered_allocation_and_pools(rig):
    """FC-03: 1000 rounds of 256 MiB async alloc/free never OOM; pool 1 GiB ok, 3 GiB refused."""
    rows = rig.probe(
        "init",
        "primary",
        "meminfo",
        "loop",
        1000,
        "async",
        256,
        "freeasync",
        "sync",
        ";",
        "meminfo",
        "pool_create",
        "pool_alloc",
        1024,
        "freeasync",
        "pool_alloc",
        3072,
        "sync",
        "meminfo",
        "pool_destroy",
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=2048,
    )
    failures = [r for r in rows if r["rc"] != 0]
    assert [r["step"] for r in failures] == ["pool_alloc"] and failures[0]["rc"] == 2, rows
    assert [r["rc"] for r in rows if r["step"] == "pool_alloc"] == [0, 2]
    start = one(rows, "meminfo", 0)["used"]
    assert one(rows, "meminfo", 1)["used"] == start
    assert one(rows, "meminfo", 2)["used"] == start
    assert one(rows, "meminfo", 3)["used"] == start


def test_fc03_pool_cache_counts_until_released(rig):
    """FC-03: memory a pool keeps cached stays charged until the pool releases it."""
    rows = rig.probe(
        "init",
        "primary",
        "pool_create",
        "pool_threshold",
        4096,
        "pool_alloc",
        512,
        "freeasync",
        "sync",
        "meminfo",
        "pool_trim",
        0,
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=2048,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert one(rows, "meminfo", 0)["used"] == CTX + 512 * MIB  # cached above the threshold: counts
    assert one(rows, "meminfo", 1)["used"] == CTX  # trimmed: given back


def _fc04_second(rig):
    rows = rig.probe(
        "init",
        "primary",
        "meminfo",
        "alloc",
        1024,
        "meminfo",
        "alloc",
        8192,
        EGPU_MEMORY_LIMIT_MIB=8192,
    )
    before, after = one(rows, "meminfo", 0), one(rows, "meminfo", 1)
    assert before["free"] - after["free"] == 1024 * MIB
    assert before["used"] == CTX  # nothing left behind by process 1
    assert one(rows, "alloc", 1)["rc"] == 2


def test_fc04_processes_one_after_another(rig):
    """FC-04: a later process sees exactly its own 1 GiB drop; 8 GiB more is refused."""
    rig.probe("init", "primary", "alloc", 1024, EGPU_MEMORY_LIMIT_MIB=8192)
    _fc04_second(rig)


def test_fc04_first_process_sigkilled(rig):
    """FC-04: a SIGKILLed process leaks nothing and deadlocks no one."""
    p = rig.spawn("init", "primary", "alloc", 1024, "hold", EGPU_MEMORY_LIMIT_MIB=8192)
    assert wait_for_hold(p)[0].startswith("init")
    p.send_signal(signal.SIGKILL)
    p.wait()
    _fc04_second(rig)


def test_fc04_processes_at_once_share_one_cap(rig):
    """FC-04: processes running at once share one cap."""
    p = rig.spawn("init", "primary", "alloc", 4096, "hold", EGPU_MEMORY_LIMIT_MIB=8192)
    wait_for_hold(p)
    try:
        rows = rig.probe(
            "init", "primary", "meminfo", "alloc", 4096, "alloc", 3000, EGPU_MEMORY_LIMIT_MIB=8192
        )
        assert one(rows, "meminfo")["used"] == 2 * CTX + 4096 * MIB
        assert one(rows, "alloc", 0)["rc"] == 2
        assert one(rows, "alloc", 1)["rc"] == 0
    finally:
        p.kill()
        p.wait()


def test_fc05_empty_environment_refuses_cuda(rig):
    p = rig.run(
        "cuprobe", "init", "primary", "alloc", 8192, check_rc=False, EGPU_RUNTIME_DIR="__unset__"
    )
    rows = [line.split() for line in p.stdout.splitlines()]
    assert [r[1] for r in rows] == ["rc=3", "rc=3", "rc=3"]
    assert "never runs a process unlimited" in p.stderr and "EGPU_MEMORY_LIMIT_MIB" in p.stderr


def test_fc05_config_file_holds_without_environment(rig):
    rig.egpu_config([(UUID0, 4096)])
    # the environment claims more, and is ignored: the file is authoritative
    rows = rig.probe(
        "init", "primary", "alloc", 8192, "alloc", 1024, "meminfo", EGPU_MEMORY_LIMIT_MIB=20000
    )
    assert [r["rc"] for r in rows if r["step"] == "alloc"] == [2, 0]
    assert one(rows, "meminfo")["total"] == 4096 * MIB


def test_fc05_malformed_config_refuses(rig):
    path = rig.egpu_config([(UUID0, 4096)])
    path.write_text(path.read_text()[:-3])
    p = rig.run("cuprobe", "init", check_rc=False, EGPU_MEMORY_LIMIT_MIB=4096)
    assert "rc=3" in p.stdout and "malformed" in p.stderr


def test_fc05_card_not_in_config_gets_nothing(rig):
    rig.fake_config(
        [
            ("GPU-aaaaaaaa-0000-0000-0000-000000000000", 24576),
            ("GPU-bbbbbbbb-0000-0000-0000-000000000000", 24576),
        ]
    )
    rig.egpu_config([("GPU-bbbbbbbb-0000-0000-0000-000000000000", 1024)])
    # CUDA_VISIBLE_DEVICES reorders: ordinal 0 is card b (ours), ordinal 1 is card a (not ours)
    rows = rig.probe(
        "init",
        "primary",
        0,
        "alloc",
        512,
        "meminfo",
        "primary",
        1,
        "alloc",
        1,
        CUDA_VISIBLE_DEVICES="1,0",
    )
    assert one(rows, "alloc", 0)["rc"] == 0
    assert one(rows, "meminfo")["total"] == 1024 * MIB
    assert one(rows, "primary", 1)["rc"] == 2  # no memory at all on a card outside the share


def test_fc06_every_way_of_finding_a_driver_function(rig, tmp_path):
    odd = tmp_path / "odd.folder-@" / "..lib,dir"  # LD_PRELOAD splits on spaces and colons
    odd.mkdir(parents=True)
    shutil.copy(INTERPOSER, odd / "libegpu_interpose.so")
    p = rig.run(
        "fc06_paths", EGPU_MEMORY_LIMIT_MIB=1024, LD_PRELOAD=str(odd / "libegpu_interpose.so")
    )
    assert "ALL-OK" in p.stdout, p.stdout
    assert p.stdout.count("ours=1") == 15 and "ours=0" not in p.stdout


def test_fc16_every_capacity_query_agrees(rig):
    rows = rig.probe(
        "init",
        "primary",
        "alloc",
        3000,
        "meminfo",
        "totalmem",
        "nvml",
        "nvml2",
        EGPU_MEMORY_LIMIT_MIB=12288,
    )
    m, t, n1, n2 = (
        one(rows, "meminfo"),
        one(rows, "totalmem"),
        one(rows, "nvml"),
        one(rows, "nvml2"),
    )
    assert m["total"] == t["total"] == n1["total"] == n2["total"] == 12288 * MIB
    assert m["used"] == n1["used"] == n2["used"] == CTX + 3000 * MIB
    assert m["free"] == n1["free"] == n2["free"] == 12288 * MIB - CTX - 3000 * MIB


def test_fc16_framework_sizing_from_total_stays_inside(rig):
    rows = rig.probe("init", "primary", "meminfo", EGPU_MEMORY_LIMIT_MIB=12288)
    total = one(rows, "meminfo")["total"]
    ninety = int(0.9 * total) // MIB
    rows = rig.probe(
        "init",
        "primary",
        "alloc",
        ninety,
        "meminfo",
        "alloc",
        int(0.2 * total) // MIB,
        EGPU_MEMORY_LIMIT_MIB=12288,
    )
    assert one(rows, "alloc", 0)["rc"] == 0
    assert one(rows, "meminfo")["used"] <= total
    assert one(rows, "alloc", 1)["rc"] == 2


def test_fc16_null_out_pointers_get_the_driver_error(rig):
    alone = rig.probe("init", "primary", "meminfo_null", "nvml_null", preload=False)
    ours = rig.probe("init", "primary", "meminfo_null", "nvml_null", EGPU_MEMORY_LIMIT_MIB=1024)
    assert [r["rc"] for r in alone] == [r["rc"] for r in ours] == [0, 0, 1, 2]


def test_percentage_share(rig):
    rows = rig.probe("init", "primary", "meminfo", EGPU_MEMORY_PERCENTAGE=25)
    assert one(rows, "meminfo")["total"] == 24576 * MIB // 4

