"""The compute gate and FC-15 under stream capture (issue 8).

- several captures at once (GLOBAL, THREAD_LOCAL, RELAXED, cuStreamBeginCapture v1) on
  threads of a gated share while another thread launches (stream or per-thread default
  stream) and waits on the cap: every capture stays valid and each thread's capture mode is
  what it set;
- FC-15 stream-ordered fallbacks: cuMemFree, cuMemFreeAsync and context destruction give
  back exactly what was charged; fallbacks and their frees on one thread beside another
  thread's capture leave that capture valid and the thread's mode as it was;
- the fake GPU: a stream-ordered free of host-resident managed memory leaves the card's
  usage alone; destroying a context ends its streams' captures.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from .conftest import CARD_MIB, CTX_MIB, HELD_MIB, Node

GLOBAL, THREAD_LOCAL, RELAXED, V1 = 0, 1, 2, -1
MIB = 1 << 20

# What both probes start with: the driver, the spec, a fatal check, the capture-mode swap.
PROBE_HEAD = r"""
import ctypes as C, json, sys, threading, time

spec = json.loads(sys.argv[1])
cu = C.CDLL("libcuda.so.1")
def ok(r, w):
    if r:
        print(json.dumps({"fatal": w, "rc": r}))
        sys.exit(1)


def xmode(m):
    v = C.c_int(m)
    ok(cu.cuThreadExchangeStreamCaptureMode(C.byref(v)), "exchange")
    return v.value
"""

GATE_PROBE = PROBE_HEAD + r"""


def mode_now():
    m = xmode(0)
    xmode(m)
    return m


ok(cu.cuInit(0), "cuInit")
dev, ctx = C.c_int(), C.c_void_p()
ok(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ok(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
ok(cu.cuCtxSetCurrent(ctx), "set")
F = C.c_void_p(0x1000)


def stream():
    s = C.c_void_p()
    ok(cu.cuStreamCreate(C.byref(s), 0), "cuStreamCreate")
    return s


def launch(s, ptsz=False):
    fn = cu.cuLaunchKernel_ptsz if ptsz else cu.cuLaunchKernel
    return fn(F, 1, 1, 1, 32, 1, 1, 0, s, None, None)


warm = stream()
for _ in range(8):  # measurements pending when the captures begin
    ok(launch(warm), "warm")
out = {}
bar = threading.Barrier(len(spec["caps"]) + 1)


def capturer(i, mode, thread_mode):
    ok(cu.cuCtxSetCurrent(ctx), "set")
    if thread_mode is not None:
        xmode(thread_mode)
    s, other = stream(), stream()
    bar.wait()
    if mode < 0:
        ok(cu.cuStreamBeginCapture(s), "cuStreamBeginCapture")
    else:
        ok(cu.cuStreamBeginCapture_v2(s, mode), "cuStreamBeginCapture_v2")
    n, t_end = 0, time.monotonic() + spec["hold"]
    while time.monotonic() < t_end:
        ok(launch(s), "captured launch")
        ok(launch(other), "gated launch beside the capture")
        n += 1
    g = C.c_void_p()
    out[f"cap{i}"] = {"rc": cu.cuStreamEndCapture(s, C.byref(g)), "n": n, "mode": mode_now()}


def worker():
    ok(cu.cuCtxSetCurrent(ctx), "set")
    s = None if spec["ptsz"] else stream()
    bar.wait()
    t0, n, errs = time.monotonic(), 0, []
    while time.monotonic() - t0 < spec["hold"]:
        r = launch(s, spec["ptsz"])
        if r:
            errs.append(r)
        n += 1
    out["worker"] = {"n": n, "errs": errs[:5], "mode": mode_now()}


ts = [threading.Thread(target=capturer, args=(i, m, tm)) for i, (m, tm) in enumerate(spec["caps"])]
ts.append(threading.Thread(target=worker))
for t in ts:
    t.start()
for t in ts:
    t.join()
print(json.dumps(out))
"""

MEM_PROBE = PROBE_HEAD + r"""
nvml = C.CDLL("libnvidia-ml.so.1")
u64, sz = C.c_uint64, C.c_size_t
MIB = 1 << 20



ok(cu.cuInit(0), "cuInit")
ok(nvml.nvmlInit_v2(), "nvmlInit_v2")
card0 = C.c_void_p()
ok(nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(card0)), "nvml handle")


def used():  # the share's usage of card 0 (the interposer's view), MiB
    m = (u64 * 3)()
    ok(nvml.nvmlDeviceGetMemoryInfo(card0, m), "nvmlDeviceGetMemoryInfo")
    return m[2] // MIB


ctx = C.c_void_p()
ok(cu.cuCtxCreate_v2(C.byref(ctx), 0, 0), "cuCtxCreate_v2")
st = C.c_void_p()
ok(cu.cuStreamCreate(C.byref(st), 0), "cuStreamCreate")


def aalloc(s):
    p = u64()
    r = cu.cuMemAllocAsync(C.byref(p), sz(256 * MIB), s)
    return r, p.value


out = {"u0": used()}
ptrs = [aalloc(st)[1] for _ in range(spec["n"])]
out["u1"] = used()
if spec["scen"] == "frees":
    out["free_sync"] = cu.cuMemFree_v2(u64(ptrs[-2]))
    out["u2"] = used()
    out["free_async"] = cu.cuMemFreeAsync(u64(ptrs[-1]), st)
    out["u3"] = used()
    out["more"] = [aalloc(st)[0] for _ in range(2)]
    out["u4"] = used()
    out["destroy"] = cu.cuCtxDestroy_v2(ctx)
    out["u5"] = used()
else:  # thread A captures; thread B falls back and frees beside it
    go, done = threading.Event(), threading.Event()
    cs = C.c_void_p()
    ok(cu.cuStreamCreate(C.byref(cs), 0), "cuStreamCreate")

    def a():
        ok(cu.cuCtxSetCurrent(ctx), "set")
        ok(cu.cuStreamBeginCapture_v2(cs, spec["cap_mode"]), "begin")
        go.set()
        done.wait()
        g = C.c_void_p()
        out["end"] = cu.cuStreamEndCapture(cs, C.byref(g))

    def b():
        ok(cu.cuCtxSetCurrent(ctx), "set")
        xmode(spec["b_mode"])
        s2 = C.c_void_p()
        ok(cu.cuStreamCreate(C.byref(s2), 0), "cuStreamCreate")
        go.wait()
        rcs = []
        r, p = aalloc(s2)
        rcs += [r, cu.cuMemFreeAsync(u64(p), s2)]
        r, p = aalloc(s2)
        rcs += [r, cu.cuMemFree_v2(u64(p))]
        out["rcs"] = rcs
        out["b_mode"] = xmode(0)
        done.set()

    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out["u2"] = used()
print(json.dumps(out))
"""

# the fake alone (no interposer): its card accounting and capture bookkeeping
FAKE_PROBE = r"""
import ctypes as C, json, sys

cu = C.CDLL("libcuda.so.1")
nvml = C.CDLL("libnvidia-ml.so.1")
u64, sz = C.c_uint64, C.c_size_t
MIB = 1 << 20
assert cu.cuInit(0) == 0 and nvml.nvmlInit_v2() == 0
h = C.c_void_p()
assert nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h)) == 0


def card_used():
    m = (u64 * 3)()
    assert nvml.nvmlDeviceGetMemoryInfo(h, m) == 0
    return m[2] // MIB


dev, pctx = C.c_int(), C.c_void_p()
assert cu.cuDeviceGet(C.byref(dev), 0) == 0
assert cu.cuDevicePrimaryCtxRetain(C.byref(pctx), dev) == 0
ctx = C.c_void_p()
assert cu.cuCtxCreate_v2(C.byref(ctx), 0, 0) == 0
st = C.c_void_p()
assert cu.cuStreamCreate(C.byref(st), 0) == 0
out = {}
if sys.argv[1] == "managed_free_async":
    d, m = u64(), u64()
    assert cu.cuMemAlloc_v2(C.byref(d), sz(512 * MIB)) == 0
    out["u0"] = card_used()
    assert cu.cuMemAllocManaged(C.byref(m), sz(256 * MIB), 1) == 0  # host-resident
    out["u1"] = card_used()
    out["free"] = cu.cuMemFreeAsync(m, st)
    out["u2"] = card_used()
else:  # a capture left running in a context that is then destroyed
    assert cu.cuStreamBeginCapture_v2(st, 0) == 0
    out["destroy"] = cu.cuCtxDestroy_v2(ctx)
    assert cu.cuCtxSetCurrent(pctx) == 0
    p = u64()
    out["alloc"] = cu.cuMemAlloc_v2(C.byref(p), sz(MIB))
print(json.dumps(out))
"""


def run(script: str, env: dict, *args: str) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", script, *args], env=env, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.splitlines()[-1])


# ---- the gate ------------------------------------------------------------------------


@pytest.mark.parametrize("share", [{"cores": 30}, {"priority": "low"}], ids=["capped-30", "low"])
@pytest.mark.parametrize("ptsz", [False, True], ids=["stream", "ptsz-null"])
def test_concurrent_captures_in_every_mode_beside_gated_launches(
    node: Node, share: dict, ptsz: bool
) -> None:
    caps = [(GLOBAL, None), (THREAD_LOCAL, THREAD_LOCAL), (RELAXED, RELAXED), (V1, THREAD_LOCAL)]
    env = node.env("g", [0], kernel_us=500, **share)
    spec = {"caps": caps, "hold": 0.3, "ptsz": ptsz}
    r = run(GATE_PROBE, env, json.dumps(spec))
    for i, (_, thread_mode) in enumerate(caps):
        c = r[f"cap{i}"]
        assert c["rc"] == 0 and c["n"] > 0, (i, r)
        assert c["mode"] == (GLOBAL if thread_mode is None else thread_mode), (i, r)
    w = r["worker"]
    assert w["errs"] == [] and w["n"] > 0 and w["mode"] == GLOBAL, r


# ---- FC-15 stream-ordered fallbacks ----------------------------------------------------

ON_CARD = (CARD_MIB - HELD_MIB) // 256  # 256 MiB chunks the card holds: 6


def oversubscribed(node: Node, name: str) -> dict:
    return node.env(name, [0], memory_mib=4096, oversubscription=True, FAKEGPU_MANAGED_HOST=1)


def test_every_free_of_a_stream_ordered_fallback_gives_back_its_charge(card: Node) -> None:
    r = run(MEM_PROBE, oversubscribed(card, "a"), json.dumps({"scen": "frees", "n": ON_CARD + 2}))
    assert r["u0"] == CTX_MIB and r["u1"] == CTX_MIB + (ON_CARD + 2) * 256, r
    assert r["free_sync"] == 0 and r["u2"] == r["u1"] - 256, r  # cuMemFree_v2
    assert r["free_async"] == 0 and r["u3"] == r["u2"] - 256, r  # cuMemFreeAsync
    assert r["more"] == [0, 0] and r["u4"] == r["u1"], r
    # context destroyed: its overhead and the fallbacks go; the pool's chunks (a device's
    # pool, not the context's) stay
    assert r["destroy"] == 0 and r["u5"] == ON_CARD * 256, r


@pytest.mark.parametrize(
    ("cap_mode", "b_mode"),
    [
        (GLOBAL, THREAD_LOCAL),
        (GLOBAL, RELAXED),
        (THREAD_LOCAL, GLOBAL),
        (THREAD_LOCAL, THREAD_LOCAL),
    ],
)
def test_fallbacks_on_another_thread_leave_a_capture_valid(
    card: Node, cap_mode: int, b_mode: int
) -> None:
    spec = {"scen": "threads", "n": ON_CARD, "cap_mode": cap_mode, "b_mode": b_mode}
    r = run(MEM_PROBE, oversubscribed(card, "a"), json.dumps(spec))
    assert r["rcs"] == [0, 0, 0, 0], r  # fallback, cuMemFreeAsync, fallback, cuMemFree_v2
    assert r["end"] == 0 and r["b_mode"] == b_mode, r
    assert r["u2"] == r["u1"], r  # both fallbacks given back


# ---- the fake GPU ----------------------------------------------------------------------


def test_fake_stream_ordered_free_of_host_managed_memory_keeps_card_usage(node: Node) -> None:
    env = node.env("raw", [0], preload=False, FAKEGPU_MANAGED_HOST=1)
    r = run(FAKE_PROBE, env, "managed_free_async")
    assert r["free"] == 0 and r["u1"] == r["u0"], r
    assert r["u2"] == r["u0"], r


def test_fake_context_destroy_ends_its_captures(node: Node) -> None:
    r = run(FAKE_PROBE, node.env("raw", [0], preload=False), "ctx_destroy")
    assert r["destroy"] == 0 and r["alloc"] == 0, r
