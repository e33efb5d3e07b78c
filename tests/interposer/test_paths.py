"""Each charged allocation path: charged while live, given back when freed, refused over the cap."""

from __future__ import annotations

import json

import pytest

from .conftest import MIB, one

CTX = 256 * MIB

# (steps that allocate, bytes the interposer charges, steps that free, steps asking too much)
PATHS = {
    "cuMemAlloc_v2": (["alloc", 100], 100 * MIB, ["free"], ["alloc", 5000]),
    "cuMemAlloc_v1": (["alloc_v1", 100], 100 * MIB, ["free"], ["alloc_v1", 4000]),
    "cuMemAllocManaged": (["managed", 100], 100 * MIB, ["free"], ["managed", 5000]),
    "cuMemAllocPitch_v2": (["pitch", 1000, 1000], 1024 * 1000, ["free"], ["pitch", 100000, 100000]),
    "cuMemAllocAsync": (["async", 100], 100 * MIB, ["freeasync", "sync"], ["async", 5000]),
    "cuMemAllocFromPoolAsync": (
        ["pool_create", "pool_alloc", 100],
        100 * MIB,
        ["freeasync", "sync"],
        ["pool_create", "pool_alloc", 5000],
    ),
    "cuMemCreate_device": (
        ["vmm", 100, "dev", 0],
        100 * MIB,
        ["vmm_release"],
        ["vmm", 5000, "dev", 0],
    ),
    "cuArrayCreate_v2": (
        ["array", 1024, 1024],
        1024 * 16 * 1024,
        ["array_destroy"],
        ["array", 1 << 20, 1 << 20],
    ),
    "cuArray3DCreate_v2": (
        ["array3d", 256, 256, 256],
        1024 * 256 * 256,
        ["array_destroy"],
        ["array3d", 4096, 4096, 4096],
    ),
    "cuMipmappedArrayCreate": (
        ["mipmap", 1024, 1024, 2],
        1024 * 16 * 1024 + 512 * 16 * 512,
        ["array_destroy"],
        ["mipmap", 65536, 65536, 1],
    ),
    "cuCtxCreate_v2": (
        ["ctx"],
        CTX,
        [],
        [
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
            "ctx",
        ],
    ),
    "cuMemHostAlloc_not_charged": (["hostalloc", 100], 0, ["hostfree"], None),
}


@pytest.mark.parametrize("path", PATHS)
def test_path_charged_and_given_back(rig, path):
    alloc, charged, free, _ = PATHS[path]
    rows = rig.probe(
        "init",
        "primary",
        "meminfo",
        *alloc,
        "meminfo",
        *free,
        "meminfo",
        EGPU_MEMORY_LIMIT_MIB=4096,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    before, during, after = (one(rows, "meminfo", i)["used"] for i in range(3))
    assert before == CTX
    assert during - before == charged
    if path != "cuCtxCreate_v2":
        assert after == before


@pytest.mark.parametrize("path", [p for p in PATHS if PATHS[p][3]])
def test_path_refused_over_cap(rig, path):
    rows = rig.probe("init", "primary", *PATHS[path][3], "meminfo", EGPU_MEMORY_LIMIT_MIB=4096)
    assert rows[-2]["rc"] == 2, rows
    assert one(rows, "meminfo")["used"] <= 4096 * MIB


def test_primary_context_charged_once_and_released(rig):
    rows = rig.probe("init", "primary", "primary", "meminfo", EGPU_MEMORY_LIMIT_MIB=4096)
    assert one(rows, "meminfo")["used"] == CTX


def test_context_overhead_is_tunable(rig):
    rows = rig.probe(
        "init", "primary", "meminfo", EGPU_MEMORY_LIMIT_MIB=4096, EGPU_CONTEXT_OVERHEAD_MIB=0
    )
    assert one(rows, "meminfo")["used"] == 0


def test_a_primary_context_reset_frees_its_allocations_but_keeps_the_retains(rig):
    """CUDA driver API: cuDevicePrimaryCtxReset destroys the primary context's allocations and
    "does not release it". Bug caught: the interposer counted a reset as the last release, so
    retain, reset, retain, allocate 1700 MiB, release dropped the 1700 MiB charge while the
    driver kept the context (one retain left) and its memory, and a second 1700 MiB on a
    2048 MiB share was let through."""
    rows = rig.probe("init", "primary", "alloc", 500, "nvml", "primary_reset", "nvml",
                     "primary", "alloc", 1700, "primary_release", "alloc", 1700, "meminfo",
                     EGPU_MEMORY_LIMIT_MIB=2048, EGPU_CONTEXT_OVERHEAD_MIB=0)
    assert one(rows, "primary_reset")["rc"] == 0 and one(rows, "primary_release")["rc"] == 0
    assert one(rows, "nvml", 0)["rc"] == 0 and one(rows, "nvml", 0)["used"] == 500 * MIB
    assert one(rows, "nvml", 1)["rc"] == 0 and one(rows, "nvml", 1)["used"] == 0, rows
    assert one(rows, "alloc", 1)["rc"] == 0
    assert one(rows, "alloc", 2)["rc"] == 2, rows  # CUDA_ERROR_OUT_OF_MEMORY: 1700 still live
    assert one(rows, "meminfo")["rc"] == 0 and one(rows, "meminfo")["used"] == 1700 * MIB


def test_a_pool_of_another_device_is_charged_to_that_device(rig):
    """cuMemAllocFromPoolAsync may take a pool of another device than the current one
    (CUDA driver API), and the memory is that pool's device's. Bug caught: a device's
    default pool, got with cuDeviceGetDefaultMemPool(1) while device 0 was current, was
    recorded as device 0's, so a two-card share could put up to card 0's cap on card 1
    beyond card 1's own cap (co-tenants of card 1 then ran out of memory)."""
    a, b = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"
    rig.fake_config([(a, 24576), (b, 24576)])
    rig.egpu_config([(a, 2048), (b, 2048)])
    rows = rig.probe("init", "primary", 0, "pool_default", 1, "pool_alloc", 1700, "sync",
                     "nvml", 0, "nvml", 1, "primary", 1, "alloc", 1700, "meminfo")
    assert one(rows, "pool_default")["rc"] == 0 and one(rows, "pool_alloc")["rc"] == 0, rows
    # card 0 holds the primary context alone (256 MiB), card 1 the pool's 1700 MiB and its
    # own context's once device 1's primary context is retained
    assert one(rows, "nvml", 0)["used"] == CTX, rows
    assert one(rows, "nvml", 1)["used"] == 1700 * MIB, rows
    assert one(rows, "alloc")["rc"] == 2, rows  # card 1's 2048 MiB already hold 1956
    assert one(rows, "meminfo")["used"] == 1700 * MIB + CTX


def test_a_pool_allocation_is_charged_to_the_pools_device_without_asking_the_stream(rig, tmp_path):
    """cuMemAllocFromPoolAsync's pool names its device (egpu's record of a created pool, or
    the device whose default pool it is): the allocation is charged there, on card 1 here,
    though device 0's context is current and the stream is device 0's, and the stream's
    device is never asked (the fake driver's call counts: cuStreamGetDevice and
    cuStreamGetCtx). The hook asked it on every allocation: up to 4 driver calls each
    before CUDA 12.8."""
    a, b = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"
    rig.fake_config([(a, 24576), (b, 24576)])
    rig.egpu_config([(a, 2048), (b, 2048)])
    counts = tmp_path / "calls.jsonl"
    rows = rig.probe("init", "primary", 0, "stream", "pool_create", 1,
                     "pool_alloc", 100, "pool_alloc", 100, "pool_alloc", 100, "sync",
                     "pool_default", 1, "pool_alloc", 100, "sync",
                     "nvml", 0, "nvml", 1, FAKEGPU_CALL_COUNTS=counts)
    [calls] = [json.loads(line) for line in counts.read_text().splitlines()]
    assert [r["rc"] for r in rows if r["step"] == "pool_alloc"] == [0] * 4, rows
    assert one(rows, "nvml", 0)["used"] == CTX, rows
    assert one(rows, "nvml", 1)["used"] == 400 * MIB, rows
    assert calls["stream_device"] == 0, calls
