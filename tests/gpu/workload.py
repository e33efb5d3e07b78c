"""One share's workload for the real-GPU checks (run by suite.py, one process per share).

    python workload.py calibrate        -> {"uuid", "short": {...}, "long": {...}, ...}
    python workload.py loop SECONDS ITERS KERNEL_US SYNC_EVERY
    python workload.py periodic SECONDS ITERS KERNEL_US PERIOD_MS
    python workload.py launchrate SECONDS ITERS
    python workload.py graph SECONDS ITERS KERNEL_US KERNELS  (capture, then replay a graph)
    python workload.py idle SECONDS                    (a share that holds its slot, idle)
    python workload.py fc15 LIMIT_MIB                  (allocate 1 GiB steps up to the limit)
    python workload.py fc16 ALLOC_MIB
    python workload.py vmm_trial MIB                   (no interposer: the driver's trial maps)
    python workload.py vmm_import MIB                  (create, export twice, import the 2nd)
    python workload.py pool_cap STEP_MIB SHARE_MIB     (cuMemAllocAsync until refused)
    python workload.py pool_destroy MIB                (a pool destroyed with a live allocation)
    python workload.py heap_limit GROW_MIB PAST_MIB    (cuCtxSetLimit of the malloc heap)
    python workload.py hold MIB SECONDS                (prints "holding", holds MIB, sleeps)
    python workload.py procs                           (NVML's compute process list)

Prints one JSON object on stdout. Figures are computed by the pure functions in figures.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cudrv
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


# ---- the interposer's driver assumptions (suite.py's driver_paths) ---------------------
# Each returns the driver's CUresults and the free memory cuMemGetInfo reports (under the
# interposer: the share's view) at each stage, in MiB, and what NVML says the process holds
# (the driver's own figure; None where NVML does not list this process). suite.py judges.


def _mib(b: int | None) -> float | None:
    return None if b is None else round(b / MIB, 3)


def _nvml() -> cudrv.Nvml | None:
    try:
        return cudrv.Nvml()
    except (OSError, RuntimeError):
        return None


def _held(nv: cudrv.Nvml | None, settle_s: float = 0.0, below: int | None = None) -> float | None:
    """NVML's figure for this process; with `below`, polled up to settle_s until it is at
    most `below` bytes (the driver may release memory a moment after the call)."""
    if nv is None:
        return None
    end = time.monotonic() + settle_s
    while True:
        h = nv.held()
        if h is None or below is None or h <= below or time.monotonic() >= end:
            return _mib(h)
        time.sleep(0.05)


def _vmm_setup(mib: int) -> tuple[Driver, cudrv.Vmm, int, dict]:
    d = Driver()
    v = cudrv.Vmm(d)
    out: dict = {
        "vmm_attr": v.attr(cudrv.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
        "posix_fd_attr": v.attr(
            cudrv.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
        ),
    }
    rc, g = v.granularity()
    out["granularity_rc"], out["granularity_mib"] = rc, _mib(g)
    g = g if rc == 0 and g > 0 else 2 * MIB
    size = -(-mib * MIB // g) * g
    out["size_mib"] = _mib(size)
    out["g"] = g
    return d, v, size, out


def _vmm_cannot(out: dict, what: str, rc: int) -> dict:
    out["skip"] = (
        f"{what} answered CUresult {rc} (VMM attribute {out['vmm_attr']}, POSIX fd handles"
        f" attribute {out['posix_fd_attr']})"
    )
    return out


def vmm_trial(mib: int) -> dict:
    """Without the interposer: an allocation exported as a POSIX fd and imported again in the
    same process, and the trial mappings the interposer sizes an import with (cuMemMap of
    [0, n granules) of the imported handle in a larger reserved range: it succeeds iff n
    granules fit in the allocation)."""
    _d, v, size, out = _vmm_setup(mib)
    g = out.pop("g")
    if out["vmm_attr"] == 0:
        out["skip"] = (
            "the card has no VMM (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0)"
        )
        return out
    rc, h = v.create(size)
    out["create_rc"] = rc
    if rc != 0:
        return _vmm_cannot(out, "cuMemCreate with POSIX fd handles", rc)
    rc, fd = v.export_fd(h)
    out["export_rc"] = rc
    if rc != 0:
        v.release(h)
        return _vmm_cannot(out, "cuMemExportToShareableHandle (POSIX fd)", rc)
    rc, h2 = v.import_fd(fd)
    out["import_rc"], out["same_handle"] = rc, rc == 0 and h2 == h
    if rc == 0:
        span = 2 * size
        rc, va = v.reserve(span)
        out["reserve_rc"] = rc
        if rc == 0:
            for name, n in (
                ("part", max(g, size // 2 // g * g)),
                ("whole", size),
                ("over", size + g),
            ):
                r = v.map(va, n, h2)
                out[f"map_{name}_rc"] = r
                if r == 0:
                    out[f"unmap_{name}_rc"] = v.unmap(va, n)
            out["address_free_rc"] = v.address_free(va, span)
        out["release_import_rc"] = v.release(h2)
    os.close(fd)
    out["release_rc"] = v.release(h)
    return out


def vmm_import(mib: int) -> dict:
    """Under a share: cuMemCreate (charged), a first POSIX fd export (its charge moves to the
    container's shared slot: free unchanged), a second export imported in the same process
    (matches no export's open file: charged the allocation's whole size, sized by trial
    mappings), then everything released (free back where it started)."""
    d, v, size, out = _vmm_setup(mib)
    out.pop("g")
    nv = _nvml()
    if out["vmm_attr"] == 0:
        out["skip"] = (
            "the card has no VMM (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0)"
        )
        return out
    free = lambda: _mib(d.meminfo()[0])  # noqa: E731
    out["free_start"], out["held_start"] = free(), _held(nv)
    rc, h = v.create(size)
    out["create_rc"], out["free_created"] = rc, free()
    if rc != 0:
        return _vmm_cannot(out, "cuMemCreate with POSIX fd handles", rc)
    fds: list[int] = []
    rc, fd1 = v.export_fd(h)
    out["export1_rc"], out["free_exported"] = rc, free()
    if rc == 0:
        fds.append(fd1)
        rc, fd2 = v.export_fd(h)
        out["export2_rc"] = rc
        if rc == 0:
            fds.append(fd2)
            rc, h2 = v.import_fd(fd2)
            out["import_rc"], out["same_handle"] = rc, rc == 0 and h2 == h
            out["free_imported"], out["held_imported"] = free(), _held(nv)
            if rc == 0:
                out["release_import_rc"] = v.release(h2)
    for fd in fds:
        os.close(fd)
    out["release_rc"] = v.release(h)
    out["free_end"] = free()
    start = out["held_start"]
    out["held_end"] = _held(nv, 1.0, None if start is None else int((start + 1) * MIB))
    return out


def _pool(d: Driver, create: bool) -> tuple[cudrv.Pools, ctypes.c_void_p | None, dict]:
    """The memory pool a pool workload runs on: a created one (create) or the device's
    current one. The dict starts the workload's result: the card's memory-pool attribute and
    the pool call's CUresult, with a skip where the card has no pools or the call failed."""
    pl = cudrv.Pools(d)
    out: dict = {"pools_attr": cudrv.Vmm(d).attr(cudrv.CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)}
    if out["pools_attr"] == 0:
        out["skip"] = "the card has no memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 0)"
        return pl, None, out
    rc, pool = pl.create() if create else pl.current()
    out["create_rc" if create else "get_pool_rc"] = rc
    if rc != 0:
        call = "cuMemPoolCreate" if create else "cuDeviceGetMemPool"
        out["skip"] = f"{call} answered CUresult {rc}"
    return pl, pool, out


def pool_cap(step_mib: int, share_mib: int) -> dict:
    """Under a share of share_mib: the current pool's release threshold at its maximum (the
    cache never shrinks), cuMemAllocAsync of step_mib until refused (never freed)."""
    d = Driver()
    nv = _nvml()
    pl, pool, out = _pool(d, create=False)
    if "skip" in out:
        return out
    out["threshold_rc"] = pl.set_threshold(pool, (1 << 64) - 1)
    out["free_start"], out["held_start"] = _mib(d.meminfo()[0]), _held(nv)
    ptrs: list[int] = []
    out["refused_rc"] = None
    for _ in range(share_mib // step_mib + 4):
        rc, p = pl.alloc(step_mib * MIB)
        if rc != 0:
            out["refused_rc"] = rc
            break
        ptrs.append(p)
    out["sync_rc"] = d.lib.cuStreamSynchronize(d.stream)
    out["allocated_mib"] = len(ptrs) * step_mib
    out["free_full"], out["held_full"] = _mib(d.meminfo()[0]), _held(nv)
    out["pool_reserved_mib"] = _mib(pl.reserved(pool))
    for p in ptrs:
        pl.free(p)
    d.sync()
    out["trim_rc"] = pl.trim(pool, 0)
    d.sync()
    out["free_end"] = _mib(d.meminfo()[0])
    return out


def pool_destroy(mib: int) -> dict:
    """Under a share: a created pool, one allocation of it, the pool destroyed with that
    allocation live (the driver keeps the memory: the charge stays), then the allocation
    freed (the driver releases it: the charge goes)."""
    d = Driver()
    nv = _nvml()
    pl, pool, out = _pool(d, create=True)
    if "skip" in out:
        return out
    free = lambda: _mib(d.meminfo()[0])  # noqa: E731
    out["free_start"], out["held_start"] = free(), _held(nv)
    rc, p = pl.alloc(mib * MIB, pool)
    out["alloc_rc"] = rc
    d.sync()
    out["free_alloc"], out["held_alloc"] = free(), _held(nv)
    out["destroy_rc"] = pl.destroy(pool)
    d.sync()
    out["free_destroyed"], out["held_destroyed"] = free(), _held(nv)
    if rc == 0:
        out["free_rc"] = pl.free(p)
        d.sync()
    out["free_end"] = free()
    start = out["held_start"]
    out["held_end"] = _held(nv, 1.0, None if start is None else int((start + 1) * MIB))
    return out


def heap_limit(grow_mib: int, past_mib: int) -> dict:
    """Under a share: the malloc heap grown by grow_mib (charged: free drops by it), set to
    past_mib (past the share: OUT_OF_MEMORY, the limit kept), then set back (given back)."""
    d = Driver()
    nv = _nvml()
    heap = cudrv.CU_LIMIT_MALLOC_HEAP_SIZE
    free = lambda: _mib(d.meminfo()[0])  # noqa: E731
    rc, base = cudrv.ctx_limit(d, heap)
    out: dict = {"get_rc": rc, "base_mib": _mib(base)}
    if rc != 0:
        out["skip"] = f"cuCtxGetLimit(CU_LIMIT_MALLOC_HEAP_SIZE) answered CUresult {rc}"
        return out
    out["free_start"], out["held_start"] = free(), _held(nv)
    out["grow_rc"] = cudrv.set_ctx_limit(d, heap, base + grow_mib * MIB)
    out["limit_grown_mib"] = _mib(cudrv.ctx_limit(d, heap)[1])
    out["free_grown"], out["held_grown"] = free(), _held(nv)
    out["past_rc"] = cudrv.set_ctx_limit(d, heap, past_mib * MIB)
    out["limit_after_past_mib"] = _mib(cudrv.ctx_limit(d, heap)[1])
    out["free_after_past"] = free()
    out["back_rc"] = cudrv.set_ctx_limit(d, heap, base)
    out["limit_back_mib"] = _mib(cudrv.ctx_limit(d, heap)[1])
    out["free_end"], out["held_end"] = free(), _held(nv)
    return out


def hold(mib: int, seconds: float) -> dict:
    """A process that holds mib on the card: prints "holding" once it does."""
    d = Driver()
    rc, p = d.alloc(mib * MIB)
    print("holding" if rc == 0 else f"failed {rc}", flush=True)
    time.sleep(seconds)
    if rc == 0:
        d.free(p)
    return {"alloc_rc": rc}


def procs() -> dict:
    """NVML's compute process list (v3) as this process sees it, holding 16 MiB itself."""
    d = Driver()
    rc, _ = d.alloc(16 * MIB)
    nv = cudrv.Nvml()
    lrc, ps = nv.procs()
    return {
        "alloc_rc": rc,
        "self": os.getpid(),
        "list_rc": lrc,
        "pids": sorted(ps),
        "used_mib": {str(k): _mib(b) for k, b in ps.items()},
    }


COMMANDS = {  # name -> (function, argument types)
    "calibrate": (calibrate, ()),
    "loop": (loop, (float, int, float, int)),
    "periodic": (periodic, (float, int, float, float)),
    "graph": (graph, (float, int, float, int)),
    "idle": (idle, (float,)),
    "launchrate": (launchrate, (float, int)),
    "fc15": (fc15, (int,)),
    "fc16": (fc16, (int,)),
    "vmm_trial": (vmm_trial, (int,)),
    "vmm_import": (vmm_import, (int,)),
    "pool_cap": (pool_cap, (int, int)),
    "pool_destroy": (pool_destroy, (int,)),
    "heap_limit": (heap_limit, (int, int)),
    "hold": (hold, (int, float)),
    "procs": (procs, ()),
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
