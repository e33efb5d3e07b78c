"""Graph launches from several threads reach the driver side by side (inference servers launch
CUDA graphs from many threads and streams), while the share's graph memory check stays whole.

The fake driver's FAKEGPU_GRAPH_LAUNCH_MEET=2 makes each cuGraphLaunch wait in the driver until
a second launch is in it too (at most FAKEGPU_GRAPH_LAUNCH_MEET_MS); a launch still alone then
answers CUDA_ERROR_TIMEOUT (909) and runs nothing. So two launches that both answer 0 were in
the driver at once, whatever the host's load: a lock held across the driver call keeps the
second one out, and the first times out. fakegpu_graph_launches_waiting() says when a launch
is inside, so each step waits for the one before it rather than for a time."""

from __future__ import annotations

import pytest

from .conftest import GRAPH_ALLOC_PRELUDE
from .test_fakegpu import _py

OUT_OF_MEMORY = 2
SHARE_MIB, MAPPED_MIB, LEFT_LIVE_MIB = 1024, 256, 512

LAUNCHES = GRAPH_ALLOC_PRELUDE + """
    import threading, time
    SCENARIO, MAPPED_MIB, LEFT_LIVE_MIB = "%s", %d, %d
    out = {"init": cuda.cuInit(0)}
    ctx = C.c_void_p()
    cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), 0)
    cuda.cuCtxSetCurrent(ctx)
    def stream():
        s = C.c_void_p()
        assert cuda.cuStreamCreate(C.byref(s), 0) == 0
        return s
    def instantiate(mib, free=True):
        # a graph with one allocation node (mib 0: none), freed in the graph unless not free
        g, n, f, e = C.c_void_p(), C.c_void_p(), C.c_void_p(), C.c_void_p()
        assert cuda.cuGraphCreate(C.byref(g), 0) == 0
        if mib:
            p = params(mib * MIB)
            assert cuda.cuGraphAddMemAllocNode(C.byref(n), g, None, 0, C.byref(p)) == 0
            if free:
                assert cuda.cuGraphAddMemFreeNode(C.byref(f), g, None, 0, C.c_uint64(p.dptr)) == 0
        assert cuda.cuGraphInstantiateWithFlags(C.byref(e), g, C.c_ulonglong(0)) == 0
        return e
    def in_thread(key, fn, *args):
        def body():
            cuda.cuCtxSetCurrent(ctx)
            out[key] = fn(*args)
        t = threading.Thread(target=body)
        t.start()
        return t
    def inside(n):
        # until n launches wait in the fake driver for their partner (at most 30 s)
        end = time.monotonic() + 30
        while cuda.fakegpu_graph_launches_waiting() < n and time.monotonic() < end:
            time.sleep(0.001)
    s1, s2 = stream(), stream()
    plain = instantiate(0)
    mapped = instantiate(MAPPED_MIB)
    assert cuda.cuGraphUpload(mapped, s1) == 0  # its memory mapped now (no launch: no wait)
    cuda.cuStreamSynchronize(s1)
    if SCENARIO == "same_mapped":
        threads = [in_thread("first", cuda.cuGraphLaunch, mapped, s1),
                   in_thread("second", cuda.cuGraphLaunch, mapped, s2)]
    elif SCENARIO in ("mapped_beside_first", "plain_beside_first"):
        # a first launch of a graph with allocation nodes may map memory: it is checked, and
        # holds the graph memory lock across the driver call; the other launch needs neither
        first = instantiate(MAPPED_MIB)
        threads = [in_thread("first", cuda.cuGraphLaunch, first, s1)]
        inside(1)
        other = mapped if SCENARIO == "mapped_beside_first" else plain
        threads.append(in_thread("second", cuda.cuGraphLaunch, other, s2))
    elif SCENARIO == "trim_beside_mapped":
        # the pool also holds an allocation a destroyed graph left live (booked by no graph),
        # launched beside a plain graph (the fake makes every launch wait for a partner)
        left = instantiate(LEFT_LIVE_MIB, free=False)
        pair = [in_thread("left_live", cuda.cuGraphLaunch, left, s1)]
        inside(1)
        pair.append(in_thread("left_live_partner", cuda.cuGraphLaunch, plain, s2))
        for t in pair:
            t.join()
        cuda.cuCtxSynchronize()
        assert cuda.cuGraphExecDestroy(left) == 0
        free_before = free_mib()
        # the mapped graph's launch waits in the driver; a trim meanwhile must wait for it:
        # one that unmapped the graph under it would let the share's charge drop while the
        # launch maps the memory again
        threads = [in_thread("first", cuda.cuGraphLaunch, mapped, s1)]
        inside(1)
        threads.append(in_thread("trim", cuda.cuDeviceGraphMemTrim, 0))
        threads[-1].join(0.5)
        out["trim_waited"] = threads[-1].is_alive()
        # more than the share has free while the graph is mapped
        p = C.c_uint64()
        out["alloc"] = cuda.cuMemAlloc_v2(C.byref(p), C.c_size_t((free_before + 128) * MIB))
        threads.append(in_thread("second", cuda.cuGraphLaunch, plain, s2))
    for t in threads:
        t.join()
    cuda.cuCtxSynchronize()
    f, t = C.c_size_t(), C.c_size_t()
    cuda.cuMemGetInfo_v2(C.byref(f), C.byref(t))
    out["total_mib"], out["used_mib"] = t.value // MIB, (t.value - f.value) // MIB
    print(json.dumps(out))
"""


def _run(rig, scenario):
    return _py(rig, LAUNCHES % (scenario, MAPPED_MIB, LEFT_LIVE_MIB), preload=True,
               EGPU_MEMORY_LIMIT_MIB=SHARE_MIB, EGPU_CONTEXT_OVERHEAD_MIB=0,
               FAKEGPU_GRAPH_LAUNCH_MEET=2, FAKEGPU_GRAPH_LAUNCH_MEET_MS=10000)


@pytest.mark.parametrize("scenario", ["same_mapped", "mapped_beside_first", "plain_beside_first"])
def test_graph_launches_reach_the_driver_together(rig, scenario):
    """same_mapped: one executable graph whose memory is mapped, launched from two threads;
    mapped_beside_first / plain_beside_first: a mapped graph, or one with no allocation
    nodes, launched while another thread's first launch of a graph with allocation nodes is
    in the driver. The bug: every graph launch, once any graph with allocation nodes was
    instantiated, held the process's graph memory lock across the driver call, so the
    launches of an inference server's threads ran one at a time (here the first launch
    waited alone in the fake and answered 909)."""
    r = _run(rig, scenario)
    assert r["first"] == 0 and r["second"] == 0, r
    assert r["used_mib"] <= r["total_mib"], r


def test_a_trim_waits_for_a_launch_that_counts_on_its_mapping(rig):
    """A launch of a mapped graph is charged nothing first (it maps no memory), so a trim
    must not unmap the graph between that check and the driver call: the trim waits for the
    launch to leave the driver, and while the graph is mapped the share's charge keeps its
    memory, so an allocation of more than the share has free is refused. Without that wait
    the trim dropped the graph's memory from the charge, the allocation passed, and the
    launch mapped the memory again past the cap (forced: used > total). On the old code the
    launch held the graph memory lock, so the plain graph's launch could not join it (909)."""
    r = _run(rig, "trim_beside_mapped")
    assert r["left_live"] == 0 and r["left_live_partner"] == 0, r
    assert r["first"] == 0 and r["second"] == 0 and r["trim"] == 0, r
    assert r["trim_waited"], r
    assert r["alloc"] == OUT_OF_MEMORY, r
    assert r["used_mib"] <= r["total_mib"], r
