"""Stream-ordered allocation and pools: growth is charged against the share's cap, never
forced past it; cuMemAllocAsync takes the pool of the stream's device; a destroyed pool keeps
its charge until its last allocation is freed (libinterpose/src/hooks_pool.c).

`held` steps read what the fake driver itself says the process holds on a card (NVML's
process list: egpu filters it to the share's processes but keeps each row's figure, the
driver's), so they see memory egpu did not charge."""

from __future__ import annotations

from .conftest import MIB, one, parse

SHARE_MIB = 1024
NO_CTX = {"EGPU_MEMORY_LIMIT_MIB": SHARE_MIB, "EGPU_CONTEXT_OVERHEAD_MIB": 0}
CARD_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
CARD_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def test_alloc_async_during_capture_toggling_never_exceeds_the_share(rig):
    """One thread allocates 900 MiB with cuMemAllocAsync over and over (never freeing) while
    another begins and ends captures on the same stream. Bug caught: the capture state was
    read before the driver call and believed (no charge: "a graph node"), and the pool's
    growth was then settled with force(), past the cap: 1800 to 4500 MiB held on a 1024 MiB
    share. Now the growth is charged after the call or the allocation undone."""
    p = rig.run("pool_capture_race", 2, 900, timeout=60, **NO_CTX)
    row = one(parse(p.stdout), "pool_capture_race")
    assert row["rc"] == 0, p.stdout
    assert row["captures"] > 0 and row["ok"] > 1, p.stdout  # both kinds of allocation happened
    # the driver's own figure was read at every try, and saw the real allocations
    assert row["nvml_fail"] == 0 and row["max_held_mib"] >= 900, p.stdout
    assert row["max_held_mib"] <= SHARE_MIB, p.stdout
    assert row["used_mib"] <= row["total_mib"] == SHARE_MIB, p.stdout


def test_growth_the_pool_cache_cannot_serve_is_refused_past_the_share(rig):
    """900 MiB freed on stream 1 stay in the pool's cache, but with the pool's reuse
    policies off another stream may not reuse them until the free is observed (CUDA driver
    API, CUmemPool_attribute REUSE_*): stream 2's 900 MiB grow the pool. Bug caught: egpu took
    the cache as covering the request (cached = reserved - used), charged nothing and forced
    the growth: 1800 MiB held on a 1024 MiB share. Now it is out of memory and the pool is
    trimmed back; once stream 1 is synchronised, the cache serves stream 2."""
    rows = rig.probe(
        "init", "primary", "pool_create", "pool_threshold", 4096, "pool_reuse", 0,
        "stream", "stream", "on", 1, "pool_alloc", 900, "freeasync",
        "on", 2, "pool_alloc", 900, "meminfo", "held",
        "on", 1, "sync", "on", 2, "pool_alloc", 900, "meminfo", "held",
        **NO_CTX,
    )
    assert [r["rc"] for r in rows if r["step"] == "pool_alloc"] == [0, 2, 0], rows
    assert one(rows, "held", 0)["used"] == 900 * MIB, rows  # trimmed back to the cache
    assert one(rows, "meminfo", 0)["used"] == 900 * MIB, rows
    assert one(rows, "held", 1)["used"] == 900 * MIB, rows  # served from the cache
    assert one(rows, "meminfo", 1)["used"] == 900 * MIB, rows


def test_alloc_async_takes_the_pool_of_the_streams_device(rig):
    """cuMemAllocAsync allocates from the current pool of the stream's device (CUDA driver
    API), whatever context is current. Bug caught: egpu took the current context's device:
    with card 0's context current and a stream of card 1, card 0 was charged (and given back
    when card 0's pool did not grow) while card 1 got 5400 MiB on a 1024 MiB share."""
    rig.fake_config([(CARD_A, 24576), (CARD_B, 24576)])
    rows = rig.probe(
        "init", "ctx", 0, "ctx", 1, "stream", "setctx", 0,
        "async", 900, "async", 900, "meminfo", "held", 0, "held", 1,
        "setctx", 1, "meminfo",
        **NO_CTX,
    )
    assert [r["rc"] for r in rows if r["step"] == "async"] == [0, 2], rows
    assert one(rows, "meminfo", 0)["used"] == 0, rows  # card 0: nothing
    assert one(rows, "held", 0)["used"] == 0, rows
    assert one(rows, "held", 1)["used"] == 900 * MIB, rows
    assert one(rows, "meminfo", 1)["used"] == 900 * MIB, rows  # card 1: charged


def test_a_destroyed_pool_keeps_its_charge_until_its_last_allocation_is_freed(rig):
    """Destroying a pool with allocations outstanding returns at once; its memory is
    released once none is left (CUDA driver API, cuMemPoolDestroy). Bug caught: egpu gave
    the pool's whole charge back at cuMemPoolDestroy, so create, allocate 900 MiB, destroy,
    repeat put 900 MiB more on the card each round with the share's 1024 MiB free. Both
    frees (cuMemFreeAsync, cuMemFree) let the destroyed pool go."""
    rows = rig.probe(
        "init", "primary",
        "pool_create", "pool_alloc", 900, "pool_destroy", "meminfo",
        "pool_create", "pool_alloc", 900, "held",  # refused: the first 900 MiB are still held
        "freeasync", "meminfo", "held",  # the destroyed pool's last allocation goes, and it
        "pool_alloc", 900, "pool_destroy", "meminfo",
        "free_aptr", "meminfo", "held",
        **NO_CTX,
    )
    assert all(r["rc"] == 0 for r in rows if r["step"] in ("pool_create", "pool_destroy")), rows
    assert [r["rc"] for r in rows if r["step"] == "pool_alloc"] == [0, 2, 0], rows
    assert [r["used"] for r in rows if r["step"] == "meminfo"] == [900 * MIB, 0, 900 * MIB, 0]
    assert [r["used"] for r in rows if r["step"] == "held"] == [900 * MIB, 0, 0], rows


def test_fake_pools_defer_a_destroyed_pools_release_and_honour_reuse_policies(rig):
    """The fake driver alone (no interposer), as the driver documents: a destroyed pool's
    memory stays until its last allocation is freed; with the reuse policies off another
    stream's unobserved free is not reused (the pool grows), and is once synchronised."""
    rows = rig.probe(
        "init", "primary", "pool_create", "pool_alloc", 500, "pool_destroy", "held",
        "freeasync", "held",
        "pool_create", "pool_threshold", 4096, "pool_reuse", 0, "stream", "stream",
        "on", 1, "pool_alloc", 100, "freeasync", "on", 2, "pool_alloc", 100, "held",
        "on", 1, "sync", "on", 0, "pool_alloc", 100, "held",
        preload=False,
    )
    assert all(r["rc"] == 0 for r in rows), rows
    assert [r["used"] for r in rows if r["step"] == "held"] == [
        500 * MIB, 0, 200 * MIB, 200 * MIB,
    ], rows
