"""Each charged allocation path: charged while live, given back when freed, refused over the cap."""

from __future__ import annotations

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
