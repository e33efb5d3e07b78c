"""One share's workload for the real-GPU checks (run by suite.py, one process per share).

    python workload.py calibrate        -> {"uuid", "short": {...}, "long": {...}, ...}
    python workload.py loop SECONDS ITERS KERNEL_US SYNC_EVERY
    python workload.py periodic SECONDS ITERS KERNEL_US PERIOD_MS
    python workload.py launchrate SECONDS ITERS
    python workload.py graph SECONDS ITERS KERNEL_US KERNELS  (capture, then replay a graph)
    python workload.py idle SECONDS                    (a share that holds its slot, idle)
    python workload.py fc15 LIMIT_MIB                  (allocate 1 GiB steps up to the limit)
    python workload.py fc16 ALLOC_MIB

Prints one JSON object on stdout. Figures are computed by the pure functions in figures.py.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import figures
from cudrv import CUDA_ERROR_OUT_OF_MEMORY, Driver

MIB = 1 << 20


def wait_start() -> None:
    """Shares that must overlap start together: EGPU_TEST_START_AT (epoch seconds), after
    their (variable) initialisation."""
    at = float(os.environ.get("EGPU_TEST_START_AT", "0") or 0)
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)


def calibrate() -> dict:
    d = Driver()
    out: dict = {"uuid": d.uuid(), "fake": d.fake}
    _free, total = d.meminfo()
    out["total_mib"] = total // MIB
    for name, us in (("tiny", 5), ("short", 50), ("small", 200), ("mid", 2000), ("long", 20000)):
        measured = d.calibrate(us)
        out[name] = {"iters": d.iters, "us": round(measured, 2)}
    return out


def warmed(iters: int) -> Driver:
    """A driver whose kernel does ``iters`` iterations, launched once (module loaded, first
    launch paid) before the measured part."""
    d = Driver()
    d.iters = iters
    d.launch()
    d.sync()
    return d


def loop(seconds: float, iters: int, kernel_us: float, sync_every: int) -> dict:
    d = warmed(iters)
    wait_start()
    stamps: list[float] = []
    t0 = time.monotonic()
    end = t0 + seconds
    n = 0
    while time.monotonic() < end:
        d.launch()
        n += 1
        stamps.append(time.monotonic())
        if n % sync_every == 0:
            d.sync()
    d.sync()
    t1 = time.monotonic()
    return figures.loop_summary(stamps, t0, t1, kernel_us)


def periodic(seconds: float, iters: int, kernel_us: float, period_ms: float) -> dict:
    d = warmed(iters)
    wait_start()
    lat: list[float] = []
    t0 = time.monotonic()
    nxt = t0
    while time.monotonic() < t0 + seconds:
        now = time.monotonic()
        if now < nxt:
            time.sleep(nxt - now)
        nxt += period_ms / 1000
        a = time.perf_counter()
        d.launch()
        d.sync()
        lat.append((time.perf_counter() - a) * 1e6)
    return {"lat_n": len(lat), **figures.percentiles(lat, "lat_us"), "kernel_us": kernel_us}


def graph(seconds: float, iters: int, kernel_us: float, kernels: int) -> dict:
    """Captures a graph of `kernels` launches (GLOBAL mode, with measurements pending) and
    replays it for `seconds`, synchronising after each replay."""
    d = warmed(iters)
    rc, ex = d.capture_graph(kernels)
    out: dict = {"capture_rc": rc, "graph_kernels": kernels}
    if rc != 0:
        return out
    wait_start()
    stamps: list[float] = []
    t0 = time.monotonic()
    while time.monotonic() < t0 + seconds:
        d.graph_launch(ex)
        d.sync()
        stamps.append(time.monotonic())
    t1 = time.monotonic()
    return {**out, **figures.loop_summary(stamps, t0, t1, kernel_us * kernels)}


def launchrate(seconds: float, iters: int) -> dict:
    d = warmed(iters)
    wait_start()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(256):
            d.launch()
        d.sync()
        n += 256
    wall = time.perf_counter() - t0
    return {"launches": n, "wall_s": wall, "launches_per_s": n / wall}


def fc15(limit_mib: int) -> dict:
    d = Driver()
    _free, total = d.meminfo()
    ok, steps, first_fail, ptrs = 0, 0, None, []
    t0 = time.monotonic()
    while True:
        f, _ = d.meminfo()
        step = min(1024, f // MIB)
        if step <= 0:
            break
        rc, p = d.alloc(step * MIB)
        steps += 1
        if rc != 0:
            first_fail = {"step": steps, "mib": step, "rc": rc}
            break
        ok += step
        ptrs.append(p)
    rc_past, p = d.alloc(MIB)
    if rc_past == 0:
        ptrs.append(p)
    for p in ptrs:
        d.free(p)
    return {
        "limit_mib": limit_mib,
        "reported_total_mib": total // MIB,
        "allocated_mib": ok,
        "first_failure": first_fail,
        "one_more_mib_rc": rc_past,
        "one_more_is_oom": rc_past == CUDA_ERROR_OUT_OF_MEMORY,
        "seconds": round(time.monotonic() - t0, 2),
    }


def fc16(alloc_mib: int) -> dict:
    d = Driver()
    rc, _ = d.alloc(alloc_mib * MIB)
    f, t = d.meminfo()
    out = {"alloc_rc": rc, "cu_total_mib": t / MIB, "cu_used_mib": (t - f) / MIB}
    try:
        import ctypes as C

        nv = C.CDLL("libnvidia-ml.so.1")
        nv.nvmlInit_v2()
        h = C.c_void_p()
        nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h))

        class Mem(C.Structure):
            _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]

        m = Mem()
        if nv.nvmlDeviceGetMemoryInfo(h, C.byref(m)) == 0:
            out["nvml_total_mib"] = m.total / MIB
            out["nvml_used_mib"] = m.used / MIB
    except OSError as e:
        out["nvml_error"] = str(e)
    return out


def idle(seconds: float) -> dict:
    """A share that holds its slot on the card (cuInit claims it) and does nothing."""
    Driver()
    time.sleep(seconds)
    return {"idle_s": seconds}


COMMANDS = {  # name -> (function, argument types)
    "calibrate": (calibrate, ()),
    "loop": (loop, (float, int, float, int)),
    "periodic": (periodic, (float, int, float, float)),
    "graph": (graph, (float, int, float, int)),
    "idle": (idle, (float,)),
    "launchrate": (launchrate, (float, int)),
    "fc15": (fc15, (int,)),
    "fc16": (fc16, (int,)),
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(__doc__, file=sys.stderr)
        return 2
    fn, types = COMMANDS[argv[0]]
    print(json.dumps(fn(*(t(a) for t, a in zip(types, argv[1:], strict=True)))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
