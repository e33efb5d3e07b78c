/* egpu_hooks.h: THE list of interposed entry points (one X-macro; see STYLE.md "C side").
 *
 * X(name, base, version, perThread, params):
 *   name      the exported symbol we define (and the real driver's symbol we forward to)
 *   base      the name a caller passes to cuGetProcAddress
 *   version   the lowest cudaVersion at which cuGetProcAddress(base) means `name`
 *   perThread 1 for the _ptsz/_ptds variant chosen by CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * From this list hook_table.c generates the typed real-function struct, the name table and
 * the lookups; the Makefile generates the linker version script (only these are exported). */
#ifndef EGPU_HOOKS_H
#define EGPU_HOOKS_H
#include "egpu_cuda.h"

#define EGPU_CU_HOOKS(X) \
    X(cuInit, cuInit, 2000, 0, (unsigned int flags)) \
    X(cuGetProcAddress, cuGetProcAddress, 11030, 0, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)) \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)) \
    X(cuMemAlloc, cuMemAlloc, 2000, 0, (CUdeviceptr_v1 *dptr, unsigned int bytesize)) \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0, (CUdeviceptr *dptr, size_t bytesize)) \
    X(cuMemFree, cuMemFree, 2000, 0, (CUdeviceptr_v1 dptr)) \
    X(cuMemFree_v2, cuMemFree, 3020, 0, (CUdeviceptr dptr)) \
    X(cuMemAllocPitch, cuMemAllocPitch, 2000, 0, (CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, unsigned int ElementSizeBytes)) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes)) \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags)) \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)) \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0, (CUdeviceptr dptr, CUstream hStream)) \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1, (CUdeviceptr dptr, CUstream hStream)) \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0, (CUmemoryPool *pool, const CUmemPoolProps *poolProps)) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0, (CUmemoryPool pool)) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, 0, (CUmemoryPool pool, size_t minBytesToKeep)) \
    X(cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, 0, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    X(cuMemCreate, cuMemCreate, 10020, 0, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)) \
    X(cuMemRelease, cuMemRelease, 10020, 0, (CUmemGenericAllocationHandle handle)) \
    X(cuMemMap, cuMemMap, 10020, 0, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)) \
    X(cuMemUnmap, cuMemUnmap, 10020, 0, (CUdeviceptr ptr, size_t size)) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0, (CUmemGenericAllocationHandle *handle, void *addr)) \
    X(cuMemImportFromShareableHandle, cuMemImportFromShareableHandle, 10020, 0, (CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType)) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 0, (void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags)) \
    X(cuMulticastCreate, cuMulticastCreate, 12010, 0, (CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)) \
    X(cuMulticastBindMem, cuMulticastBindMem, 12010, 0, (CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUmemGenericAllocationHandle memHandle, size_t memOffset, size_t size, unsigned long long flags)) \
    X(cuMulticastBindAddr, cuMulticastBindAddr, 12010, 0, (CUmemGenericAllocationHandle mcHandle, size_t mcOffset, CUdeviceptr memptr, size_t size, unsigned long long flags)) \
    X(cuMulticastUnbind, cuMulticastUnbind, 12010, 0, (CUmemGenericAllocationHandle mcHandle, CUdevice dev, size_t mcOffset, size_t size)) \
    X(cuArrayCreate, cuArrayCreate, 2000, 0, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)) \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, 0, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)) \
    X(cuArray3DCreate, cuArray3DCreate, 2000, 0, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)) \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)) \
    X(cuArrayDestroy, cuArrayDestroy, 2000, 0, (CUarray hArray)) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0, (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels)) \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0, (CUmipmappedArray hMipmappedArray)) \
    X(cuCtxCreate, cuCtxCreate, 2000, 0, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v2, cuCtxCreate, 3020, 0, (CUcontext *pctx, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v3, cuCtxCreate, 11040, 0, (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev)) \
    X(cuCtxCreate_v4, cuCtxCreate, 12050, 0, (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)) \
    X(cuCtxDestroy, cuCtxDestroy, 2000, 0, (CUcontext ctx)) \
    X(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0, (CUcontext ctx)) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0, (CUcontext *pctx, CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, 0, (CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0, (CUdevice dev)) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, 0, (CUdevice dev)) \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0, (CUdevice dev)) \
    X(cuCtxSetLimit, cuCtxSetLimit, 3010, 0, (CUlimit limit, size_t value)) \
    X(cuMemGetInfo, cuMemGetInfo, 2000, 0, (unsigned int *free, unsigned int *total)) \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0, (size_t *free, size_t *total)) \
    X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, 0, (unsigned int *bytes, CUdevice dev)) \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0, (size_t *bytes, CUdevice dev)) \
    /* compute gate (issue 8, src/hooks_compute.c) */ \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)) \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)) \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1, (CUgraphExec hGraphExec, CUstream hStream)) \
    /* graph memory nodes (issue 25, src/hooks_graph.c) */ \
    X(cuGraphInstantiate, cuGraphInstantiate, 10000, 0, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)) \
    X(cuGraphInstantiate_v2, cuGraphInstantiate, 11000, 0, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, 10000, 0, (CUgraphExec hGraphExec)) \
    X(cuGraphUpload, cuGraphUpload, 11010, 0, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuGraphUpload_ptsz, cuGraphUpload, 11010, 1, (CUgraphExec hGraphExec, CUstream hStream)) \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, 0, (CUdevice device))

/* Names whose cuGetProcAddress meaning moved, at a version, to a hooked function of another
 * name (cuda.h's versioned #defines; an X entry's name is its own function, so these cannot
 * be X entries). A(base, version, perThread, name): from `version`, cuGetProcAddress(base)
 * means `name`. From CUDA 12.0, cuda.h #defines cuGraphInstantiate to
 * cuGraphInstantiateWithFlags (3 arguments), not the 5-argument cuGraphInstantiate_v2. */
#define EGPU_CU_PROC_ALIASES(A) \
    A(cuGraphInstantiate, 12000, 0, cuGraphInstantiateWithFlags)

#define EGPU_NVML_HOOKS(X) \
    X(nvmlDeviceGetMemoryInfo, nvmlDeviceGetMemoryInfo, 0, 0, (nvmlDevice_t device, nvmlMemory_t *memory)) \
    X(nvmlDeviceGetMemoryInfo_v2, nvmlDeviceGetMemoryInfo_v2, 0, 0, (nvmlDevice_t device, nvmlMemory_v2_t *memory)) \
    /* process lists, filtered to the share's processes (hooks_view.c) */ \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlDeviceGetComputeRunningProcesses, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)) \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlDeviceGetComputeRunningProcesses_v2, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlDeviceGetComputeRunningProcesses_v3, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlDeviceGetGraphicsRunningProcesses, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlDeviceGetGraphicsRunningProcesses_v2, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlDeviceGetGraphicsRunningProcesses_v3, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses, nvmlDeviceGetMPSComputeRunningProcesses, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlDeviceGetMPSComputeRunningProcesses_v2, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos)) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlDeviceGetMPSComputeRunningProcesses_v3, 0, 0, (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))

/* Driver functions egpu calls but does not interpose. R: required, O: optional. */
#define EGPU_CU_CALLS(X) \
    X(cuDeviceGetCount, R, (int *count)) \
    X(cuDeviceGet, R, (CUdevice *device, int ordinal)) \
    X(cuDeviceGetUuid, R, (CUuuid *uuid, CUdevice dev)) \
    X(cuCtxGetDevice, R, (CUdevice *device)) \
    /* cuCtxSetLimit's charge: the limit before, the device's resident threads (hooks_ctx.c) */ \
    X(cuCtxGetLimit, O, (size_t *pvalue, CUlimit limit)) \
    X(cuDeviceGetAttribute, O, (int *pi, CUdevice_attribute attrib, CUdevice dev)) \
    X(cuDeviceGetMemPool, O, (CUmemoryPool *pool, CUdevice dev)) \
    X(cuDeviceGetDefaultMemPool, O, (CUmemoryPool *pool, CUdevice dev)) \
    X(cuMemPoolGetAttribute, O, (CUmemoryPool pool, CUmemPool_attribute attr, void *value)) \
    /* FC-15: a stream-ordered free of a managed fallback waits for its stream (hooks_pool.c) */ \
    X(cuStreamSynchronize, O, (CUstream hStream)) \
    /* compute gate (issue 8): measuring launches with events */ \
    X(cuCtxGetCurrent, O, (CUcontext *pctx)) \
    X(cuCtxSetCurrent, O, (CUcontext ctx)) \
    X(cuEventCreate, O, (CUevent *phEvent, unsigned int Flags)) \
    X(cuEventDestroy_v2, O, (CUevent hEvent)) \
    X(cuEventRecord, O, (CUevent hEvent, CUstream hStream)) \
    X(cuEventQuery, O, (CUevent hEvent)) \
    X(cuEventSynchronize, O, (CUevent hEvent)) \
    X(cuEventElapsedTime, O, (float *pMilliseconds, CUevent hStart, CUevent hEnd)) \
    X(cuStreamCreate, O, (CUstream *phStream, unsigned int Flags)) \
    X(cuStreamIsCapturing, O, (CUstream hStream, CUstreamCaptureStatus *captureStatus)) \
    /* cuMemAllocAsync takes the pool of the stream's device (hooks_pool.c, stream_dev) */ \
    X(cuStreamGetDevice, O, (CUstream hStream, CUdevice *device)) \
    X(cuStreamGetCtx, O, (CUstream hStream, CUcontext *pctx)) \
    X(cuCtxPushCurrent_v2, O, (CUcontext ctx)) \
    X(cuCtxPopCurrent_v2, O, (CUcontext *pctx)) \
    X(cuThreadExchangeStreamCaptureMode, O, (CUstreamCaptureMode *mode)) \
    X(cuMemGetAllocationPropertiesFromHandle, O, (CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)) \
    /* an import's size, found by trial mappings (hooks_vmm.c, import_size_locked) */ \
    X(cuMemAddressReserve, O, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) \
    X(cuMemAddressFree, O, (CUdeviceptr ptr, size_t size)) \
    X(cuGraphGetNodes, O, (CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)) \
    X(cuGraphNodeGetType, O, (CUgraphNode hNode, CUgraphNodeType *type)) \
    X(cuGraphMemAllocNodeGetParams, O, (CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)) \
    X(cuGraphChildGraphNodeGetGraph, O, (CUgraphNode hNode, CUgraph *phGraph)) \
    /* the graph memory pool's reserve and use, followed by the share (hooks_graph.c) */ \
    X(cuDeviceGetGraphMemAttribute, O, (CUdevice device, CUgraphMem_attribute attr, void *value)) \
    X(cuMemGetAllocationGranularity, O, (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option))

#define EGPU_NVML_CALLS(X) \
    X(nvmlDeviceGetUUID, R, (nvmlDevice_t device, char *uuid, unsigned int length))

#define EGPU_EXPORT __attribute__((visibility("default")))
/* The dlsym path can run before a sanitizer runtime has initialised (ASan looks up its own
 * interceptors through dlsym, which is ours): keep that path uninstrumented. */
#define EGPU_NO_SANITIZE __attribute__((no_sanitize_address, no_sanitize("undefined")))
#define EGPU_DECLARE_CU(name, base, ver, pt, params) EGPU_EXPORT CUresult name params;
#define EGPU_DECLARE_NVML(name, base, ver, pt, params) EGPU_EXPORT nvmlReturn_t name params;
EGPU_CU_HOOKS(EGPU_DECLARE_CU)
EGPU_NVML_HOOKS(EGPU_DECLARE_NVML)
EGPU_EXPORT void *dlsym(void *handle, const char *symbol);

/* The real driver's functions, one typed pointer each (never called unprototyped). */
typedef struct {
#define EGPU_FIELD_CU(name, base, ver, pt, params) CUresult (*name) params;
#define EGPU_FIELD_NVML(name, base, ver, pt, params) nvmlReturn_t (*name) params;
#define EGPU_FIELD_CU_CALL(name, req, params) CUresult (*name) params;
#define EGPU_FIELD_NVML_CALL(name, req, params) nvmlReturn_t (*name) params;
    EGPU_CU_HOOKS(EGPU_FIELD_CU)
    EGPU_CU_CALLS(EGPU_FIELD_CU_CALL)
    EGPU_NVML_HOOKS(EGPU_FIELD_NVML)
    EGPU_NVML_CALLS(EGPU_FIELD_NVML_CALL)
} egpu_real_fns;

typedef struct {
    const char *name;
    const char *base;
    int version;
    int per_thread;
    void *hook; /* our exported function */
    size_t real_off; /* offset of the real pointer in egpu_real_fns */
} egpu_hook_ent;

extern const egpu_hook_ent egpu_hook_table[];
extern const int egpu_hook_count;

/* Our hook for an exported name, or NULL when we do not interpose it. */
const egpu_hook_ent *egpu_hook_by_name(const char *name);
/* Our hook for what cuGetProcAddress(base, version, flags) names (EGPU_CU_HOOKS and
 * EGPU_CU_PROC_ALIASES), or NULL when that is a function we do not interpose. */
const egpu_hook_ent *egpu_hook_by_proc(const char *base, int version, cuuint64_t flags);
/* Our hook whose real counterpart is at `real`, or NULL. */
const egpu_hook_ent *egpu_hook_by_real(const void *real);
#endif
