"""A thin ctypes layer over the CUDA driver API, for the real-GPU checks without PyTorch.

Loads libcuda.so.1 with dlopen like any application (so an LD_PRELOADed interposer sees the
calls), JIT-compiles a tiny PTX kernel (the driver carries the PTX compiler: no toolkit
needed), and launches it. The kernel does a fixed amount of work (a dependent FMA chain per
thread, on enough blocks to fill every SM), so a share's GPU use is launches x the kernel's
solo duration / wall time even when the card time-slices between shares.

Against the fake GPU (tests on a CPU machine) cuModuleLoadData is not supported: then the
function handle is a dummy and each launch takes FAKEGPU_KERNEL_US of simulated time.
"""

from __future__ import annotations

import ctypes as C
import os
import time

PTX = r"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry egpu_work(.param .u64 out, .param .u32 iters)
{
    .reg .pred %p<3>;
    .reg .b32 %r<5>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iters];
    mov.u32 %r2, %tid.x;
    cvt.rn.f32.u32 %f1, %r2;
    mov.f32 %f2, 0f3F7FFFFE;
    mov.u32 %r3, 0;
LOOP:
    fma.rn.f32 %f1, %f1, %f2, 0f3F000000;
    add.u32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r1;
    @%p1 bra LOOP;
    setp.eq.f32 %p2, %f1, 0f00000000;
    @!%p2 bra DONE;
    st.global.f32 [%rd1], %f1;
DONE:
    ret;
}
"""

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16


class CudaError(RuntimeError):
    def __init__(self, what: str, rc: int) -> None:
        super().__init__(f"{what} failed: CUresult {rc}")
        self.rc = rc


class Driver:
    def __init__(self, device: int = 0) -> None:
        self.lib = C.CDLL("libcuda.so.1", mode=os.RTLD_NOW)
        self._ck("cuInit", 0)
        dev = C.c_int()
        self._ck("cuDeviceGet", C.byref(dev), device)
        self.dev = dev.value
        ctx = C.c_void_p()
        self._ck("cuDevicePrimaryCtxRetain", C.byref(ctx), self.dev)
        self._ck("cuCtxSetCurrent", ctx)
        self.ctx = ctx
        s = C.c_void_p()
        self._ck("cuStreamCreate", C.byref(s), 0)
        self.stream = s
        self.fake = False
        self.func = C.c_void_p()
        mod = C.c_void_p()
        rc = self.lib.cuModuleLoadData(C.byref(mod), C.c_char_p(PTX.encode()))
        if rc == CUDA_SUCCESS:
            self._ck("cuModuleGetFunction", C.byref(self.func), mod, b"egpu_work")
        elif os.environ.get("FAKEGPU_KERNEL_US") is not None or rc == 801:
            self.fake = True  # the fake GPU: any handle, FAKEGPU_KERNEL_US per launch
            self.func = C.c_void_p(0x1000)
        else:
            raise CudaError("cuModuleLoadData", rc)
        sms = C.c_int(1)
        self.lib.cuDeviceGetAttribute(
            C.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self.dev
        )
        self.blocks = max(1, sms.value) * 8
        self.out = C.c_uint64(0)
        if not self.fake:
            self._ck("cuMemAlloc_v2", C.byref(self.out), 4096)
        self.iters = 1000

    def _ck(self, name: str, *args: object) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != CUDA_SUCCESS:
            raise CudaError(name, rc)

    def launch(self, iters: int | None = None) -> None:
        it = C.c_uint32(self.iters if iters is None else iters)
        params = (C.c_void_p * 2)(
            C.cast(C.byref(self.out), C.c_void_p), C.cast(C.byref(it), C.c_void_p)
        )
        rc = self.lib.cuLaunchKernel(
            self.func, self.blocks, 1, 1, 256, 1, 1, 0, self.stream, params, None
        )
        if rc != CUDA_SUCCESS:
            raise CudaError("cuLaunchKernel", rc)

    def sync(self) -> None:
        self._ck("cuStreamSynchronize", self.stream)

    def launch_on(self, stream: C.c_void_p) -> int:
        it = C.c_uint32(self.iters)
        params = (C.c_void_p * 2)(
            C.cast(C.byref(self.out), C.c_void_p), C.cast(C.byref(it), C.c_void_p)
        )
        return self.lib.cuLaunchKernel(
            self.func, self.blocks, 1, 1, 256, 1, 1, 0, stream, params, None
        )

    def capture_graph(self, kernels: int, hold_s: float = 0.05) -> tuple[int, C.c_void_p]:
        """Captures `kernels` launches into a graph on a second stream in GLOBAL mode (the
        default of cudaStreamBeginCapture), staying in capture for hold_s while earlier
        launches are still pending (what an interposer's event poller would see). Returns
        (cuStreamEndCapture's CUresult, the instantiated graph or None)."""
        cs = C.c_void_p()
        self._ck("cuStreamCreate", C.byref(cs), 0)
        for _ in range(8):
            self.launch()
        self._ck("cuStreamBeginCapture_v2", cs, 0)
        for _ in range(kernels):
            rc = self.launch_on(cs)
            if rc != CUDA_SUCCESS:
                break
        time.sleep(hold_s)
        g = C.c_void_p()
        rc = self.lib.cuStreamEndCapture(cs, C.byref(g))
        self.sync()
        if rc != CUDA_SUCCESS:
            return rc, C.c_void_p()
        ex = C.c_void_p()
        self._ck("cuGraphInstantiateWithFlags", C.byref(ex), g, C.c_ulonglong(0))
        return rc, ex

    def graph_launch(self, ex: C.c_void_p) -> None:
        self._ck("cuGraphLaunch", ex, self.stream)

    def calibrate(self, target_us: float) -> float:
        """Sets iters so that one launch takes about target_us alone; returns the measured us."""
        if self.fake:
            return float(os.environ.get("FAKEGPU_KERNEL_US", "0") or 0)
        self.launch(1000)
        self.sync()
        it = 20000
        for _ in range(6):
            t0 = time.perf_counter()
            for _ in range(5):
                self.launch(it)
            self.sync()
            per = (time.perf_counter() - t0) / 5 * 1e6
            if per > 2000 or it >= 1 << 30:
                break
            it *= 4
        per_iter = per / it
        self.iters = max(1, int(target_us / per_iter))
        n = max(3, min(50, int(200000 / max(target_us, 1))))
        t0 = time.perf_counter()
        for _ in range(n):
            self.launch()
        self.sync()
        return (time.perf_counter() - t0) / n * 1e6

    # ---- memory ------------------------------------------------------------------
    def alloc(self, nbytes: int) -> tuple[int, int]:
        p = C.c_uint64()
        rc = self.lib.cuMemAlloc_v2(C.byref(p), C.c_size_t(nbytes))
        return rc, p.value

    def free(self, p: int) -> int:
        return self.lib.cuMemFree_v2(C.c_uint64(p))

    def meminfo(self) -> tuple[int, int]:
        f, t = C.c_size_t(), C.c_size_t()
        self._ck("cuMemGetInfo_v2", C.byref(f), C.byref(t))
        return f.value, t.value

    def uuid(self) -> str:
        u = (C.c_ubyte * 16)()
        self._ck("cuDeviceGetUuid", u, self.dev)
        b = bytes(u)
        h = b.hex()
        return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# ---- the interposer's driver assumptions (suite.py's driver_paths checks) -------------
# Layouts as cuda.h and nvml.h give them (libinterpose/include/egpu_cuda.h, the same).
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_SUPPORTED = 801
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103
CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115
CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5
CU_LIMIT_MALLOC_HEAP_SIZE = 2


class MemLocation(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class AllocFlags(C.Structure):
    _fields_ = [
        ("compressionType", C.c_ubyte),
        ("gpuDirectRDMACapable", C.c_ubyte),
        ("usage", C.c_ushort),
        ("reserved", C.c_ubyte * 4),
    ]


class MemAllocationProp(C.Structure):
    _fields_ = [
        ("type", C.c_int),
        ("requestedHandleTypes", C.c_int),
        ("location", MemLocation),
        ("win32HandleMetaData", C.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class MemPoolProps(C.Structure):
    _fields_ = [
        ("allocType", C.c_int),
        ("handleTypes", C.c_int),
        ("location", MemLocation),
        ("win32SecurityAttributes", C.c_void_p),
        ("maxSize", C.c_size_t),
        ("usage", C.c_ushort),
        ("reserved", C.c_ubyte * 54),
    ]


class ProcessInfo(C.Structure):  # nvmlProcessInfo_t, the _v2/_v3 lists' element
    _fields_ = [
        ("pid", C.c_uint),
        ("usedGpuMemory", C.c_ulonglong),
        ("gpuInstanceId", C.c_uint),
        ("computeInstanceId", C.c_uint),
    ]


NVML_VALUE_NOT_AVAILABLE = (1 << 64) - 1


class Vmm:
    """cuMemCreate / export / import / trial mappings on one device, every call's CUresult
    returned (not raised): the checks report what the driver answered."""

    def __init__(self, d: Driver) -> None:
        self.d, self.lib = d, d.lib
        self.prop = MemAllocationProp()
        self.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        self.prop.location = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, d.dev)

    def attr(self, a: int) -> int | None:
        v = C.c_int()
        return v.value if self.lib.cuDeviceGetAttribute(C.byref(v), a, self.d.dev) == 0 else None

    def granularity(self) -> tuple[int, int]:
        g = C.c_size_t()
        rc = self.lib.cuMemGetAllocationGranularity(C.byref(g), C.byref(self.prop), 0)
        return rc, g.value

    def create(self, nbytes: int) -> tuple[int, int]:
        h = C.c_ulonglong()
        rc = self.lib.cuMemCreate(
            C.byref(h), C.c_size_t(nbytes), C.byref(self.prop), C.c_ulonglong(0)
        )
        return rc, h.value

    def export_fd(self, h: int) -> tuple[int, int]:
        fd = C.c_int(-1)
        rc = self.lib.cuMemExportToShareableHandle(
            C.byref(fd),
            C.c_ulonglong(h),
            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            C.c_ulonglong(0),
        )
        return rc, fd.value

    def import_fd(self, fd: int) -> tuple[int, int]:
        h = C.c_ulonglong()
        rc = self.lib.cuMemImportFromShareableHandle(
            C.byref(h), C.c_void_p(fd), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        )
        return rc, h.value

    def release(self, h: int) -> int:
        return self.lib.cuMemRelease(C.c_ulonglong(h))

    def reserve(self, nbytes: int) -> tuple[int, int]:
        va = C.c_uint64()
        rc = self.lib.cuMemAddressReserve(
            C.byref(va), C.c_size_t(nbytes), C.c_size_t(0), C.c_uint64(0), C.c_ulonglong(0)
        )
        return rc, va.value

    def address_free(self, va: int, nbytes: int) -> int:
        return self.lib.cuMemAddressFree(C.c_uint64(va), C.c_size_t(nbytes))

    def map(self, va: int, nbytes: int, h: int) -> int:
        return self.lib.cuMemMap(
            C.c_uint64(va), C.c_size_t(nbytes), C.c_size_t(0), C.c_ulonglong(h), C.c_ulonglong(0)
        )

    def unmap(self, va: int, nbytes: int) -> int:
        return self.lib.cuMemUnmap(C.c_uint64(va), C.c_size_t(nbytes))


class Pools:
    """Stream-ordered allocation on the driver's stream, CUresults returned."""

    def __init__(self, d: Driver) -> None:
        self.d, self.lib = d, d.lib

    def current(self) -> tuple[int, C.c_void_p]:
        p = C.c_void_p()
        return self.lib.cuDeviceGetMemPool(C.byref(p), self.d.dev), p

    def create(self) -> tuple[int, C.c_void_p]:
        props = MemPoolProps()
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED
        props.location = MemLocation(CU_MEM_LOCATION_TYPE_DEVICE, self.d.dev)
        p = C.c_void_p()
        return self.lib.cuMemPoolCreate(C.byref(p), C.byref(props)), p

    def set_threshold(self, pool: C.c_void_p, nbytes: int) -> int:
        v = C.c_uint64(nbytes)
        return self.lib.cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, C.byref(v))

    def reserved(self, pool: C.c_void_p) -> int | None:
        v = C.c_uint64()
        rc = self.lib.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, C.byref(v))
        return v.value if rc == 0 else None

    def alloc(self, nbytes: int, pool: C.c_void_p | None = None) -> tuple[int, int]:
        p = C.c_uint64()
        if pool is None:
            rc = self.lib.cuMemAllocAsync(C.byref(p), C.c_size_t(nbytes), self.d.stream)
        else:
            rc = self.lib.cuMemAllocFromPoolAsync(
                C.byref(p), C.c_size_t(nbytes), pool, self.d.stream
            )
        return rc, p.value

    def free(self, p: int) -> int:
        return self.lib.cuMemFreeAsync(C.c_uint64(p), self.d.stream)

    def trim(self, pool: C.c_void_p, keep: int = 0) -> int:
        return self.lib.cuMemPoolTrimTo(pool, C.c_size_t(keep))

    def destroy(self, pool: C.c_void_p) -> int:
        return self.lib.cuMemPoolDestroy(pool)


def ctx_limit(d: Driver, limit: int) -> tuple[int, int]:
    v = C.c_size_t()
    rc = d.lib.cuCtxGetLimit(C.byref(v), limit)
    return rc, v.value


def set_ctx_limit(d: Driver, limit: int, value: int) -> int:
    return d.lib.cuCtxSetLimit(limit, C.c_size_t(value))


class Nvml:
    """NVML's compute process list of card 0 (what nvidia-smi shows; under the interposer,
    the share's view)."""

    def __init__(self, index: int = 0) -> None:
        self.lib = C.CDLL("libnvidia-ml.so.1")
        rc = self.lib.nvmlInit_v2()
        if rc != 0:
            raise RuntimeError(f"nvmlInit_v2: {rc}")
        self.h = C.c_void_p()
        rc = self.lib.nvmlDeviceGetHandleByIndex_v2(index, C.byref(self.h))
        if rc != 0:
            raise RuntimeError(f"nvmlDeviceGetHandleByIndex_v2: {rc}")

    def procs(self) -> tuple[int, dict[int, int | None]]:
        """(nvmlReturn_t, {pid: used bytes or None where NVML has no figure})."""
        room = 256
        buf = (ProcessInfo * room)()
        n = C.c_uint(room)
        rc = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(self.h, C.byref(n), buf)
        out: dict[int, int | None] = {}
        for k in range(min(n.value, room) if rc == 0 else 0):
            used = buf[k].usedGpuMemory
            out[buf[k].pid] = None if used == NVML_VALUE_NOT_AVAILABLE else used
        return rc, out

    def held(self) -> int | None:
        """What the driver says this process holds on the card; None when NVML does not list
        it (another PID namespace) or gives no figure."""
        rc, ps = self.procs()
        return ps.get(os.getpid()) if rc == 0 else None
