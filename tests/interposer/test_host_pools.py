"""Memory pools at a host location (CUDA 12.2+: cuMemPoolCreate with CU_MEM_LOCATION_TYPE_HOST
or HOST_NUMA) keep host memory, so their allocations take none of the container's device-memory
share, as host-located cuMemCreate memory takes none (libinterpose/src/hooks_pool.c,
docs/interposer.md "What is charged").

`held` reads what the fake driver itself says the process holds on the card (NVML's process
list), `pool_attr` the pool's RESERVED/USED_MEM_CURRENT as the driver answers them."""

from __future__ import annotations

import pytest

from .conftest import MIB, one

SHARE_MIB = 1024
NO_CTX = {"EGPU_MEMORY_LIMIT_MIB": SHARE_MIB, "EGPU_CONTEXT_OVERHEAD_MIB": 0}


@pytest.mark.parametrize("where", ["host", "numa"])
def test_an_allocation_from_a_host_located_pool_takes_none_of_the_share(rig, where):
    """A host pool (HOST, or HOST_NUMA node 0: a NUMA id, not device 0) made accessible to
    device 0 serves 3 x 600 MiB, past the 1024 MiB share: each succeeds, cuMemGetInfo still
    shows the whole share free and the card holds nothing for the process; destroying the pool
    with allocations outstanding and freeing them changes nothing either. A device pool on the
    same share is still refused past the cap. Bug caught: cuMemAllocFromPoolAsync took a pool
    egpu had not recorded for one of the stream's device and charged it there: the second
    600 MiB was refused with out of memory although the pool takes no device memory."""
    rows = rig.probe(
        "init", "primary", "stream",
        "pool_host", where, 0, "pool_access", 0,
        "pool_alloc", 600, "pool_alloc", 600, "pool_alloc", 600,
        "meminfo", "held", "pool_attr",
        "freeasync", "sync", "pool_destroy", "freeasync", "freeasync", "sync", "meminfo",
        "pool_create", "pool_alloc", 600, "pool_alloc", 600, "meminfo", "held",
        **NO_CTX,
    )
    assert [r["rc"] for r in rows if r["step"] == "pool_alloc"] == [0, 0, 0, 0, 2], rows
    assert all(r["rc"] == 0 for r in rows if r["step"] in (
        "pool_host", "pool_access", "pool_attr", "freeasync", "sync", "pool_destroy", "pool_create",
    )), rows
    attr = one(rows, "pool_attr")
    assert attr["used"] == 1800 * MIB and attr["reserved"] >= 1800 * MIB, rows  # the driver's pool
    info = one(rows, "meminfo", 0)
    assert info["total"] == SHARE_MIB * MIB and info["free"] == SHARE_MIB * MIB, rows
    assert one(rows, "held", 0)["used"] == 0, rows
    assert one(rows, "meminfo", 1)["free"] == SHARE_MIB * MIB, rows
    # the device pool: its first 600 MiB charged, the second refused
    assert one(rows, "meminfo", 2)["used"] == 600 * MIB, rows
    assert one(rows, "held", 1)["used"] == 600 * MIB, rows


def test_fake_host_pools_take_no_card_memory(rig):
    """The fake driver alone (no interposer), as the driver documents cuMemPoolCreate: a HOST
    or HOST_NUMA pool serves allocations from host memory (its reserve and use show in
    cuMemPoolGetAttribute, the card's free memory does not move); HOST_NUMA_CURRENT is not a
    pool location (CUDA_ERROR_INVALID_VALUE)."""
    rows = rig.probe(
        "init", "primary", "meminfo",
        "pool_host", "numa_current", 0,
        "pool_host", "numa", 1, "pool_alloc", 3000, "pool_attr", "meminfo", "held",
        "pool_host", "host", "pool_access", 0, "pool_alloc", 3000, "pool_attr", "meminfo", "held",
        "sync", "pool_destroy",
        preload=False,
    )
    assert [r["rc"] for r in rows if r["step"] == "pool_host"] == [1, 0, 0], rows
    assert all(r["rc"] == 0 for r in rows if r["step"] != "pool_host"), rows
    before = one(rows, "meminfo", 0)["free"]
    for n in (0, 1):
        assert one(rows, "pool_attr", n)["used"] == 3000 * MIB, rows
        assert one(rows, "pool_attr", n)["reserved"] >= 3000 * MIB, rows
        assert one(rows, "meminfo", n + 1)["free"] == before, rows
        assert one(rows, "held", n)["used"] == 0, rows
