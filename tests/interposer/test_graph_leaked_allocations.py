"""Graph allocations a graph leaves live (an allocation node with no free node) outlive
cuGraphExecDestroy on the driver until they are freed; the share follows the graph memory
pool's reserve, so the loop instantiate -> launch -> destroy cannot hold more than the share."""

from __future__ import annotations

from .conftest import GRAPH_ALLOC_PRELUDE
from .test_fakegpu import _py

OUT_OF_MEMORY = 2
SHARE_MIB, LEAK_MIB, ROUNDS = 1024, 128, 12

LEAK_LOOP = GRAPH_ALLOC_PRELUDE + """
    LEAK_MIB, ROUNDS = %d, %d
    def pool(attr):  # cuDeviceGetGraphMemAttribute: 0 USED_MEM_CURRENT, 2 RESERVED_MEM_CURRENT
        v = C.c_uint64()
        cuda.cuDeviceGetGraphMemAttribute(0, attr, C.byref(v))
        return v.value // MIB
    def round_(s):
        # a new graph each round (as a capture per step makes): one allocation node, never
        # freed in the graph; instantiated, launched, its executable graph destroyed
        g, n, e = C.c_void_p(), C.c_void_p(), C.c_void_p()
        cuda.cuGraphCreate(C.byref(g), 0)
        p = params(LEAK_MIB * MIB)
        assert cuda.cuGraphAddMemAllocNode(C.byref(n), g, None, 0, C.byref(p)) == 0
        rc = cuda.cuGraphInstantiateWithFlags(C.byref(e), g, C.c_ulonglong(0))
        step = "instantiate"
        if rc == 0:
            rc, step = cuda.cuGraphLaunch(e, s), "launch"
            cuda.cuStreamSynchronize(s)
            assert cuda.cuGraphExecDestroy(e) == 0
        cuda.cuGraphDestroy(g)
        return (None if rc == 0 else step), rc, p.dptr
    out = {"init": cuda.cuInit(0)}
    ctx, s = C.c_void_p(), C.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    cuda.cuStreamCreate(C.byref(s), 0)
    out["free_start_mib"] = free_mib()
    leaked, out["rounds"] = [], []
    for _ in range(ROUNDS):
        step, rc, ptr = round_(s)
        out["rounds"].append([step, rc])
        if rc == 0:
            leaked.append(ptr)
    out["free_leaked_mib"] = free_mib()
    out["pool_leaked_mib"] = [pool(2), pool(0)]
    # freed: the memory goes back to the graph memory pool, unused (still on the card)
    for i, ptr in enumerate(leaked):
        rc = (cuda.cuMemFreeAsync(C.c_uint64(ptr), s) if i %% 2
              else cuda.cuMemFree_v2(C.c_uint64(ptr)))
        assert rc == 0, rc
    cuda.cuStreamSynchronize(s)
    out["free_freed_mib"] = free_mib()
    out["pool_freed_mib"] = [pool(2), pool(0)]
    # the pool's unused memory serves the next rounds
    again = [round_(s) for _ in range(2)]
    out["rounds_again"] = [[st, rc] for st, rc, _ in again]
    out["free_again_mib"] = free_mib()
    for _, rc, ptr in again:
        if rc == 0:
            cuda.cuMemFree_v2(C.c_uint64(ptr))
    out["trim"] = cuda.cuDeviceGraphMemTrim(0)
    out["free_trimmed_mib"] = free_mib()
    out["pool_trimmed_mib"] = [pool(2), pool(0)]
    print(json.dumps(out))
"""


def _loop(rig, preload=True, **extra):
    return _py(rig, LEAK_LOOP % (LEAK_MIB, ROUNDS), preload=preload,
               EGPU_MEMORY_LIMIT_MIB=SHARE_MIB, **extra)


def test_graph_allocations_leaked_past_exec_destroy_stay_within_the_share(rig):
    """The bug: the booking of a graph's allocation nodes was given back at
    cuGraphExecDestroy while the driver keeps an allocation the graph does not free until it
    is freed, so instantiate -> launch -> destroy in a loop held unbounded card memory on any
    share. Now the share follows the graph memory pool's reserve: rounds succeed while the
    leaked allocations fit, then the launch is refused with OUT_OF_MEMORY (after a trim that
    cannot help: the leaked allocations are in use), and the share shows them as used."""
    r = _loop(rig)
    start = r["free_start_mib"]
    fit = start // LEAK_MIB
    assert 0 < fit < ROUNDS, r
    assert r["rounds"][:fit] == [[None, 0]] * fit, r
    assert r["rounds"][fit:] == [["launch", OUT_OF_MEMORY]] * (ROUNDS - fit), r
    assert r["free_leaked_mib"] == start - fit * LEAK_MIB, r
    assert r["pool_leaked_mib"] == [fit * LEAK_MIB, fit * LEAK_MIB], r


def test_freeing_leaked_graph_allocations_then_a_trim_gives_the_share_back(rig):
    """Freed (cuMemFree, cuMemFreeAsync), the leaked allocations' memory stays in the graph
    memory pool (reserved, unused), so it stays charged; it serves the next rounds without
    growing the pool (they succeed again); cuDeviceGraphMemTrim gives it back to the card,
    and the share gets it back."""
    r = _loop(rig)
    start = r["free_start_mib"]
    fit = start // LEAK_MIB
    assert r["pool_freed_mib"] == [fit * LEAK_MIB, 0], r
    assert r["free_freed_mib"] == start - fit * LEAK_MIB, r
    assert r["rounds_again"] == [[None, 0]] * 2, r
    assert r["free_again_mib"] == start - fit * LEAK_MIB, r
    assert r["trim"] == 0 and r["pool_trimmed_mib"] == [0, 0], r
    assert r["free_trimmed_mib"] == start, r


def test_fake_driver_keeps_leaked_graph_allocations_past_exec_destroy(rig):
    """The fake driver alone, as the driver: every round's allocation outlives its executable
    graph (the card has room for all of them), is reserved and used in the graph memory pool
    until freed, then reserved and unused until trimmed."""
    r = _loop(rig, preload=False)
    assert r["rounds"] == [[None, 0]] * ROUNDS, r
    assert r["pool_leaked_mib"] == [ROUNDS * LEAK_MIB] * 2, r
    assert r["free_leaked_mib"] == r["free_start_mib"] - ROUNDS * LEAK_MIB, r
    assert r["pool_freed_mib"] == [ROUNDS * LEAK_MIB, 0], r
    assert r["free_freed_mib"] == r["free_leaked_mib"], r
    assert r["rounds_again"] == [[None, 0]] * 2, r
    assert r["trim"] == 0 and r["pool_trimmed_mib"] == [0, 0], r
    assert r["free_trimmed_mib"] == r["free_start_mib"], r
