"""What NVIDIA's own driver bindings (cuda-bindings, ``cuda.bindings.driver`` / ``.nvml``) see
and get, run by a client environment's Python (tests/clients/test_cuda_bindings.py).

Every driver function is the bindings' own: they open libcuda.so.1 and resolve each symbol
through cuGetProcAddress with their CUDA version (what the interposer must answer with its
hooks). Prints one JSON object: each call's CUresult (an int) and the figures (MiB).

    python driver_probe.py SHARE_MIB        (0: no share expected, the whole card)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cuda.bindings import driver as d

MIB = 1 << 20
out: dict[str, Any] = {}


def call(name: str, result: Any) -> Any:
    """Record call ``name``'s CUresult; return its values (one value bare, none as None)."""
    if not isinstance(result, tuple):
        result = (result,)
    out[name] = int(result[0])
    values = result[1:]
    return values[0] if len(values) == 1 else (values or None)


def main() -> None:
    share_mib = int(sys.argv[1])
    call("init", d.cuInit(0))
    dev = call("device", d.cuDeviceGet(0))
    out["device_total_mib"] = call("device_total", d.cuDeviceTotalMem(dev)) // MIB
    ctx = call("primary_ctx", d.cuDevicePrimaryCtxRetain(dev))
    call("set_current", d.cuCtxSetCurrent(ctx))
    free, total = call("meminfo", d.cuMemGetInfo())
    out["total_mib"], out["free_mib"] = total // MIB, free // MIB

    # cuMemAlloc up to the free figure, then one MiB more
    big = call("alloc_free", d.cuMemAlloc(free))
    call("alloc_one_more_mib", d.cuMemAlloc(MIB))
    call("free_big", d.cuMemFree(big))
    free_after, _ = call("meminfo_after_free", d.cuMemGetInfo())
    out["free_after_free_mib"] = free_after // MIB

    # stream-ordered allocation: the default pool and a custom pool
    stream = call("stream", d.cuStreamCreate(0))
    half = (free // 2) // MIB * MIB
    a = call("async_default_pool", d.cuMemAllocAsync(half, stream))
    call("async_default_pool_over", d.cuMemAllocAsync(half + 64 * MIB, stream))
    call("async_free", d.cuMemFreeAsync(a, stream))
    call("sync", d.cuStreamSynchronize(stream))
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    pool = call("pool_create", d.cuMemPoolCreate(props))
    p = call("async_custom_pool", d.cuMemAllocFromPoolAsync(half, pool, stream))
    call("async_custom_pool_over", d.cuMemAllocFromPoolAsync(half + 64 * MIB, pool, stream))
    call("async_custom_free", d.cuMemFreeAsync(p, stream))
    call("sync_custom", d.cuStreamSynchronize(stream))
    call("pool_destroy", d.cuMemPoolDestroy(pool))

    # virtual memory management: create, reserve, map, set access, unmap, release
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    gran = call("vmm_granularity", d.cuMemGetAllocationGranularity(
        prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM))
    size = max(gran, (free // 2) // gran * gran)
    handle = call("vmm_create", d.cuMemCreate(size, prop, 0))
    call("vmm_create_over", d.cuMemCreate(size + max(gran, 64 * MIB), prop, 0))
    va = call("vmm_reserve", d.cuMemAddressReserve(size, 0, 0, 0))
    call("vmm_map", d.cuMemMap(va, size, 0, handle, 0))
    access = d.CUmemAccessDesc()
    access.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = 0
    access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    call("vmm_set_access", d.cuMemSetAccess(va, size, [access], 1))
    vfree, _ = call("vmm_meminfo", d.cuMemGetInfo())
    out["vmm_charged_mib"] = (free - vfree) // MIB
    out["vmm_size_mib"] = size // MIB
    call("vmm_unmap", d.cuMemUnmap(va, size))
    call("vmm_release", d.cuMemRelease(handle))
    call("vmm_free_va", d.cuMemAddressFree(va, size))
    back, _ = call("meminfo_end", d.cuMemGetInfo())
    out["free_end_mib"] = back // MIB

    # a context of its own beside the primary one (cuCtxCreate's signature changed in 13.0)
    try:
        own = call("ctx_create", d.cuCtxCreate(None, 0, dev))
    except TypeError:
        own = call("ctx_create", d.cuCtxCreate(0, dev))
    _, own_total = call("ctx_meminfo", d.cuMemGetInfo())
    out["ctx_total_mib"] = own_total // MIB
    call("ctx_destroy", d.cuCtxDestroy(own))

    # NVML: the bindings' own module (cuda.bindings.nvml, 12.9 and 13.x), else the library
    # beside the driver through ctypes (older bindings have no NVML module)
    try:
        from cuda.bindings import nvml
    except ImportError:
        import ctypes

        lib = ctypes.CDLL("libnvidia-ml.so.1")

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                        ("used", ctypes.c_ulonglong)]

        handle, mem = ctypes.c_void_p(), Memory()
        out["nvml_init"] = lib.nvmlInit_v2()
        out["nvml_handle"] = lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle))
        out["nvml_meminfo"] = lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(mem))
        out["nvml_total_mib"] = mem.total // MIB
        out["nvml_module"] = 0
    else:
        nvml.init_v2()
        info = nvml.device_get_memory_info_v2(nvml.device_get_handle_by_index_v2(0))
        out["nvml_total_mib"] = int(info.total) // MIB
        out["nvml_module"] = 1
        nvml.shutdown()
    out["share_mib"] = share_mib
    print(json.dumps(out))


if __name__ == "__main__":
    main()
