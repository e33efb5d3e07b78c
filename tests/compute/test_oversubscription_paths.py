"""FC-15 (issue 8) on every allocation path that can fall back to managed memory: pitched
(cuMemAllocPitch_v2, cuMemAllocPitch) and stream-ordered (cuMemAllocAsync,
cuMemAllocFromPoolAsync and their _ptsz variants).

The node: 2 GiB fake cards; share B holds 512 MiB of card 0, so 1536 MiB of it are free.
Share A books 4096 MiB of that card with memory_oversubscription (the fake keeps managed
memory in host memory: FAKEGPU_MANAGED_HOST=1). A allocates 256 MiB at a time up to its cap,
far beyond the card, then exactly what its capacity view calls free: nothing fails; one more
allocation is out-of-memory; the share's used memory is exact all along (cuMemGetInfo's
total - free, and NVML's used, which is the share's usage even where the card's free memory
bounds free) and back to the context's charge once everything is freed. The same share
without oversubscription stops where the card is full.

The share's process is a small ctypes script (PROBE) under the interposer against the fake
driver; it prints one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import CARD_MIB, CTX_MIB, HELD_MIB, Node

MIB = 1 << 20
CAP_MIB = 4096  # share A's booking, twice the card
CHUNK_MIB = 256
ON_CARD = (CARD_MIB - HELD_MIB) // CHUNK_MIB  # chunks the card itself can hold: 6
UP_TO_CAP = (CAP_MIB - CTX_MIB) // CHUNK_MIB  # chunks up to the cap: 15
PITCH_W = 1000  # bytes per row; the driver's pitch: rounded up to 512 bytes
PITCH = 1024

PROBE = r"""
import ctypes as C, json, sys, time

spec = json.loads(sys.argv[1])
cu = C.CDLL("libcuda.so.1")
u64, sz = C.c_uint64, C.c_size_t
path = spec["path"]
pt = path.endswith("_ptsz")
PITCH_W, PITCH = spec["pitch_w"], spec["pitch"]


def ok(r, what):
    if r:
        print(json.dumps({"fatal": what, "rc": r}))
        sys.exit(1)


ok(cu.cuInit(0), "cuInit")
ctx = C.c_void_p()
ok(cu.cuCtxCreate_v2(C.byref(ctx), 0, 0), "cuCtxCreate_v2")
st = C.c_void_p()
if not spec.get("null_stream"):
    ok(cu.cuStreamCreate(C.byref(st), 0), "cuStreamCreate")
pool = C.c_void_p()
ok(cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0), "cuDeviceGetDefaultMemPool")
ptrs = []


nvml = C.CDLL("libnvidia-ml.so.1")
ok(nvml.nvmlInit_v2(), "nvmlInit_v2")
card0 = C.c_void_p()
ok(nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(card0)), "nvmlDeviceGetHandleByIndex_v2")


def meminfo():
    # cuMemGetInfo's free and total; used: the share's usage on the card, as NVML's view
    # reports it (total - free is less exact where the card's free memory bounds free)
    f, t = sz(), sz()
    ok(cu.cuMemGetInfo_v2(C.byref(f), C.byref(t)), "cuMemGetInfo_v2")
    m = (u64 * 3)()  # nvmlMemory_t: total, free, used
    ok(nvml.nvmlDeviceGetMemoryInfo(card0, m), "nvmlDeviceGetMemoryInfo")
    return {"free": f.value, "total": t.value, "used": m[2]}


def alloc(nbytes):
    # one allocation of nbytes on the path under test; (rc, pitch or 0)
    if path in ("pitch", "pitch_v1"):
        rows = nbytes // PITCH
        if path == "pitch":
            p, pitch = u64(), sz()
            r = cu.cuMemAllocPitch_v2(C.byref(p), C.byref(pitch), sz(PITCH_W), sz(rows), 4)
        else:
            p, pitch = C.c_uint32(), C.c_uint32()
            r = cu.cuMemAllocPitch(C.byref(p), C.byref(pitch), PITCH_W, rows, 4)
    else:
        p, pitch = u64(), sz(0)
        fn = {"async": "cuMemAllocAsync", "pool": "cuMemAllocFromPoolAsync"}[path.split("_")[0]]
        fn = getattr(cu, fn + ("_ptsz" if pt else ""))
        if fn.__name__.startswith("cuMemAllocFromPoolAsync"):
            r = fn(C.byref(p), sz(nbytes), pool, st)
        else:
            r = fn(C.byref(p), sz(nbytes), st)
    if r == 0:
        ptrs.append(p.value)
    return r, pitch.value


def free(p):
    t0 = time.monotonic()
    if path == "pitch":
        r = cu.cuMemFree_v2(u64(p))
    elif path == "pitch_v1":
        r = cu.cuMemFree(C.c_uint32(p))
    else:
        r = getattr(cu, "cuMemFreeAsync" + ("_ptsz" if pt else ""))(u64(p), st)
    return r, time.monotonic() - t0


out = {"m0": meminfo()}
if spec.get("capture"):
    # fill the card outside any capture, then ask beyond it while a stream captures (GLOBAL
    # mode): the allocation's own stream ("same"), or another stream of this thread ("other")
    for _ in range(spec["n"]):
        alloc(spec["chunk"])
    cap = st
    if spec["capture"] == "other":
        cap = C.c_void_p()
        ok(cu.cuStreamCreate(C.byref(cap), 0), "cuStreamCreate")
    r = cu.cuStreamBeginCapture_v2(cap, 0)
    out["begin_capture"] = r
    if r == 0:
        n = len(ptrs)
        out["captured"] = alloc(spec["chunk"])[0]
        out["free_during"] = free(ptrs.pop())[0] if len(ptrs) > n else None
        graph = C.c_void_p()
        out["end_capture"] = cu.cuStreamEndCapture(cap, C.byref(graph))
        out["after"] = alloc(spec["chunk"])[0]
        out["free_after"] = free(ptrs.pop())[0]
    print(json.dumps(out))
    sys.exit(0)
out["chunks"] = [alloc(spec["chunk"]) for _ in range(spec["n"])]
out["m1"] = meminfo()
rest = out["m1"]["free"]
out["rest"] = alloc(rest) if rest else None
out["m2"] = meminfo()
out["over"] = alloc(PITCH if path.startswith("pitch") else 1 << 20)
out["m3"] = meminfo()
if spec.get("kernel"):  # work on the stream that the frees must not overtake
    launch = cu.cuLaunchKernel_ptsz if pt else cu.cuLaunchKernel
    ok(launch(C.c_void_p(0x1000), 1, 1, 1, 32, 1, 1, 0, st, None, None), "cuLaunchKernel")
out["frees"] = [free(p) for p in ptrs]
out["m4"] = meminfo()
ok(cu.cuStreamSynchronize(st), "cuStreamSynchronize")
out["m5"] = meminfo()
print(json.dumps(out))
"""

PATHS = ["pitch", "pitch_v1", "async", "async_ptsz", "pool", "pool_ptsz"]


def probe(env: dict, **spec: object) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps({"pitch_w": PITCH_W, "pitch": PITCH, **spec})],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def share(node: Node, name: str, oversubscription: bool, **extra: object) -> dict:
    return node.env(
        name,
        [0],
        memory_mib=CAP_MIB,
        oversubscription=oversubscription,
        FAKEGPU_MANAGED_HOST=1,
        **extra,
    )


def used_mib(m: dict) -> float:
    return m["used"] / MIB


@pytest.mark.parametrize("path", PATHS)
def test_oversubscribed_share_allocates_up_to_its_cap(card: Node, path: str) -> None:
    r = probe(share(card, "a", True), path=path, chunk=CHUNK_MIB * MIB, n=UP_TO_CAP - 1)
    assert r["m0"]["total"] == CAP_MIB * MIB and used_mib(r["m0"]) == CTX_MIB, r["m0"]
    rcs = [rc for rc, _ in r["chunks"]]
    if path == "pitch_v1":
        # the 32-bit legacy entry: managed memory's 64-bit address cannot be returned, so
        # beyond the card the driver's out-of-memory stands, and nothing stays charged
        assert rcs == [0] * ON_CARD + [2] * (UP_TO_CAP - 1 - ON_CARD), r
        assert used_mib(r["m1"]) == CTX_MIB + ON_CARD * CHUNK_MIB, r["m1"]
        assert r["rest"][0] == 2 and r["m2"] == r["m1"], r
    else:
        # the first ON_CARD chunks come from the card, the rest from managed memory
        assert rcs == [0] * (UP_TO_CAP - 1), r
        assert used_mib(r["m1"]) == CTX_MIB + (UP_TO_CAP - 1) * CHUNK_MIB, r["m1"]
        # exactly what the view calls free still succeeds; then the share is at its cap
        assert r["m1"]["free"] == CHUNK_MIB * MIB, r["m1"]
        assert r["rest"][0] == 0, r
        assert r["m2"]["used"] == CAP_MIB * MIB and r["m2"]["free"] == 0, r["m2"]
    if path.startswith("pitch"):
        # the pitch the driver would use, for device and managed memory alike
        assert {pitch for rc, pitch in r["chunks"] if rc == 0} == {PITCH}, r
        if r["rest"][0] == 0:
            assert r["rest"][1] == PITCH, r
    # one more (smallest) allocation is out-of-memory and changes nothing
    assert r["over"][0] == 2, r
    assert r["m3"] == r["m2"], r
    # every free succeeds and gives back exactly what was charged
    assert all(rc == 0 for rc, _ in r["frees"]), r
    # (stream-ordered: the pool chunks, freed first, stay cached in the pool; the first
    # managed chunk's free synchronises the stream, which releases the pool's cache)
    assert used_mib(r["m4"]) == CTX_MIB, r["m4"]
    assert used_mib(r["m5"]) == CTX_MIB, r["m5"]
    # oversubscribed, free is not bounded by the card: cuMemGetInfo says the same all along
    for k in ("m0", "m1", "m2", "m3", "m4", "m5"):
        assert r[k]["total"] - r[k]["free"] == r[k]["used"], (k, r[k])


@pytest.mark.parametrize("path", PATHS)
def test_share_without_oversubscription_stops_where_the_card_is_full(card: Node, path: str) -> None:
    r = probe(share(card, "c", False), path=path, chunk=CHUNK_MIB * MIB, n=ON_CARD + 2)
    # the cap is the card (2 GiB); the card is full before the share reaches it
    assert r["m0"]["total"] == CARD_MIB * MIB, r["m0"]
    assert [rc for rc, _ in r["chunks"]] == [0] * ON_CARD + [2, 2], r
    assert used_mib(r["m1"]) == CTX_MIB + ON_CARD * CHUNK_MIB < CARD_MIB, r["m1"]
    assert r["m1"]["free"] == 0 and r["rest"] is None, r  # the view says the card is full
    assert r["over"][0] == 2 and r["m3"] == r["m1"], r
    assert all(rc == 0 for rc, _ in r["frees"]), r
    assert used_mib(r["m5"]) == CTX_MIB, r["m5"]


@pytest.mark.parametrize(
    ("path", "null_stream"), [("async", False), ("pool_ptsz", True)], ids=["stream", "ptsz-null"]
)
def test_stream_ordered_free_of_a_managed_fallback_waits_for_the_stream(
    card: Node, path: str, null_stream: bool
) -> None:
    """A 300 ms kernel is queued on the stream before the frees: freeing pool memory stays
    stream-ordered (returns at once), freeing a managed fallback first waits for the
    stream's work (it is a synchronous free)."""
    env = share(card, "a", True, kernel_us=300000)
    r = probe(
        env, path=path, chunk=CHUNK_MIB * MIB, n=ON_CARD + 2, kernel=1, null_stream=null_stream
    )
    assert [rc for rc, _ in r["chunks"]] == [0] * (ON_CARD + 2), r
    frees = r["frees"]
    assert all(rc == 0 for rc, _ in frees), r
    assert frees[0][1] < 0.15, frees  # a pool chunk: no wait
    assert frees[ON_CARD][1] >= 0.2, frees  # the first managed chunk: waited for the kernel
    assert used_mib(r["m5"]) == CTX_MIB, r["m5"]


@pytest.mark.parametrize("path", ["async", "pool_ptsz"])
def test_no_fallback_while_the_stream_captures(card: Node, path: str) -> None:
    """While the allocation's stream captures a graph, an allocation beyond what the card
    holds is an allocation node of the graph (the driver takes no memory for it before the
    graph runs): no managed fallback is made for it, which its free in the same capture
    shows (a free node must name an allocation node of the graph: a fallback's free would be
    refused with CUDA_ERROR_INVALID_VALUE), and asking whether the stream captures does not
    disturb the capture; once it has ended the fallback applies again."""
    r = probe(share(card, "a", True), path=path, chunk=CHUNK_MIB * MIB, n=ON_CARD, capture="same")
    assert r["begin_capture"] == 0, f"the fake driver must capture streams: {r}"
    assert r["captured"] == 0 and r["free_during"] == 0, r
    assert r["end_capture"] == 0 and r["after"] == 0 and r["free_after"] == 0, r


@pytest.mark.parametrize("path", ["async", "pool_ptsz"])
def test_fallback_beside_a_capture_leaves_it_valid(card: Node, path: str) -> None:
    """Another stream of the thread captures in GLOBAL mode: the fallback on a stream that
    does not capture still applies, and its synchronous calls (the managed allocation; the
    stream synchronisation and cuMemFree of its stream-ordered free) are made in RELAXED
    mode, so they neither fail nor invalidate that capture."""
    r = probe(share(card, "a", True), path=path, chunk=CHUNK_MIB * MIB, n=ON_CARD, capture="other")
    assert r["begin_capture"] == 0, f"the fake driver must capture streams: {r}"
    assert r["captured"] == 0 and r["free_during"] == 0, r
    assert r["end_capture"] == 0 and r["after"] == 0 and r["free_after"] == 0, r
