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
