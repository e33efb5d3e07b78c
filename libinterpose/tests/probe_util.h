/* probe_util.h: test programs reach the driver the way applications do: dlopen + dlsym. */
#ifndef PROBE_UTIL_H
#define PROBE_UTIL_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "egpu_cuda.h"

#define CU_FNS(X) \
    X(cuInit, (unsigned)) X(cuDeviceGet, (CUdevice *, int)) X(cuDeviceGetCount, (int *)) \
    X(cuCtxCreate_v2, (CUcontext *, unsigned, CUdevice)) X(cuCtxDestroy_v2, (CUcontext)) \
    X(cuCtxSetCurrent, (CUcontext)) X(cuCtxGetDevice, (CUdevice *)) \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice)) X(cuDevicePrimaryCtxRelease_v2, (CUdevice)) \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice)) \
    X(cuCtxSetLimit, (CUlimit, size_t)) X(cuCtxGetLimit, (size_t *, CUlimit)) \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *, CUdevice)) \
    X(cuMemAlloc_v2, (CUdeviceptr *, size_t)) X(cuMemFree_v2, (CUdeviceptr)) \
    X(cuMemAlloc, (CUdeviceptr_v1 *, unsigned)) X(cuMemFree, (CUdeviceptr_v1)) \
    X(cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned)) \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned)) \
    X(cuMemGetInfo_v2, (size_t *, size_t *)) X(cuMemGetInfo, (unsigned *, unsigned *)) \
    X(cuDeviceTotalMem_v2, (size_t *, CUdevice)) X(cuDeviceTotalMem, (unsigned *, CUdevice)) \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream)) X(cuMemFreeAsync, (CUdeviceptr, CUstream)) \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, CUmemoryPool, CUstream)) \
    X(cuMemPoolCreate, (CUmemoryPool *, const CUmemPoolProps *)) X(cuMemPoolDestroy, (CUmemoryPool)) \
    X(cuMemPoolTrimTo, (CUmemoryPool, size_t)) X(cuMemPoolSetAttribute, (CUmemoryPool, CUmemPool_attribute, void *)) \
    X(cuMemPoolGetAttribute, (CUmemoryPool, CUmemPool_attribute, void *)) \
    X(cuMemPoolSetAccess, (CUmemoryPool, const CUmemAccessDesc *, size_t)) \
    X(cuStreamCreate, (CUstream *, unsigned)) X(cuStreamSynchronize, (CUstream)) X(cuCtxSynchronize, (void)) \
    X(cuMemCreate, (CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long)) \
    X(cuMemRelease, (CUmemGenericAllocationHandle)) \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(cuMemAddressFree, (CUdeviceptr, size_t)) \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)) \
    X(cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *, void *)) \
    X(cuMemExportToShareableHandle, (void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long)) \
    X(cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType)) \
    X(cuMemUnmap, (CUdeviceptr, size_t)) X(cuMemSetAccess, (CUdeviceptr, size_t, const CUmemAccessDesc *, size_t)) \
    X(cuArrayCreate_v2, (CUarray *, const CUDA_ARRAY_DESCRIPTOR *)) X(cuArrayDestroy, (CUarray)) \
    X(cuArray3DCreate_v2, (CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)) \
    X(cuMipmappedArrayCreate, (CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)) \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray)) \
    X(cuMemHostAlloc, (void **, size_t, unsigned)) X(cuMemFreeHost, (void *)) \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **)) \
    X(cuGraphCreate, (CUgraph *, unsigned)) \
    X(cuGraphAddMemAllocNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUDA_MEM_ALLOC_NODE_PARAMS *)) \
    X(cuGraphAddMemFreeNode, (CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr)) \
    X(cuGraphInstantiateWithFlags, (CUgraphExec *, CUgraph, unsigned long long)) \
    X(cuGraphUpload, (CUgraphExec, CUstream)) X(cuGraphLaunch, (CUgraphExec, CUstream)) \
    X(cuGetProcAddress, (const char *, void **, int, cuuint64_t)) \
    X(cuGetProcAddress_v2, (const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))

#define NVML_FNS(X) \
    X(nvmlInit_v2, (void)) X(nvmlDeviceGetHandleByIndex_v2, (unsigned, nvmlDevice_t *)) \
    X(nvmlDeviceGetHandleByUUID, (const char *, nvmlDevice_t *)) \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t, nvmlMemory_t *)) \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, nvmlMemory_v2_t *)) \
    X(nvmlDeviceGetCount_v2, (unsigned *))

#define DECL_CU(n, p) static CUresult (*p_##n) p;
#define DECL_NV(n, p) static nvmlReturn_t (*p_##n) p;
CU_FNS(DECL_CU)
NVML_FNS(DECL_NV)

static void *g_cuda, *g_nvml;

__attribute__((unused)) static void load_cuda(void)
{
    g_cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!g_cuda) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); exit(90); }
#define LOAD_CU(n, p) *(void **)&p_##n = dlsym(g_cuda, #n); if (!p_##n) { fprintf(stderr, "no %s\n", #n); exit(91); }
    CU_FNS(LOAD_CU)
}

__attribute__((unused)) static void load_nvml(void)
{
    g_nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!g_nvml) { fprintf(stderr, "dlopen libnvidia-ml.so.1: %s\n", dlerror()); exit(92); }
#define LOAD_NV(n, p) *(void **)&p_##n = dlsym(g_nvml, #n); if (!p_##n) { fprintf(stderr, "no %s\n", #n); exit(93); }
    NVML_FNS(LOAD_NV)
}
#endif
