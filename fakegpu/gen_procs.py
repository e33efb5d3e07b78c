#!/usr/bin/env python3
"""Regenerate fakegpu/procs.def: the fake driver's cuGetProcAddress table.

Each line P(base, minVersion, symbol, perThreadSymbol) says: asked for `base` with a
cudaVersion >= minVersion (and below the next line's), the driver hands back `symbol`, or
`perThreadSymbol` when flags ask for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.
The version breakpoints follow the public cuda.h / cudaTypedefs.h (PFN_<name>_v<version>).
Names come from the recorded runtime traces in shared/data plus what the fake models.
Run: python3 fakegpu/gen_procs.py /work/shared/data > fakegpu/procs.def
"""

import glob
import os
import sys

V2_3020 = [
    "cuDeviceTotalMem",
    "cuCtxCreate",
    "cuModuleGetGlobal",
    "cuMemGetInfo",
    "cuMemAlloc",
    "cuMemAllocPitch",
    "cuMemFree",
    "cuMemGetAddressRange",
    "cuMemAllocHost",
    "cuMemHostGetDevicePointer",
    "cuMemcpyHtoD",
    "cuMemcpyDtoH",
    "cuMemcpyDtoD",
    "cuMemcpyDtoA",
    "cuMemcpyAtoD",
    "cuMemcpyHtoA",
    "cuMemcpyAtoH",
    "cuMemcpyAtoA",
    "cuMemcpyHtoAAsync",
    "cuMemcpyAtoHAsync",
    "cuMemcpy2D",
    "cuMemcpy2DUnaligned",
    "cuMemcpy3D",
    "cuMemcpyHtoDAsync",
    "cuMemcpyDtoHAsync",
    "cuMemcpyDtoDAsync",
    "cuMemcpy2DAsync",
    "cuMemcpy3DAsync",
    "cuMemsetD8",
    "cuMemsetD16",
    "cuMemsetD32",
    "cuMemsetD2D8",
    "cuMemsetD2D16",
    "cuMemsetD2D32",
    "cuArrayCreate",
    "cuArrayGetDescriptor",
    "cuArray3DCreate",
    "cuArray3DGetDescriptor",
    "cuTexRefSetAddress",
    "cuTexRefGetAddress",
    "cuGraphicsResourceGetMappedPointer",
    "cuGLCtxCreate",
    "cuGLMapBufferObject",
    "cuGLMapBufferObjectAsync",
]
V2_4000 = [
    "cuCtxDestroy",
    "cuCtxPopCurrent",
    "cuCtxPushCurrent",
    "cuStreamDestroy",
    "cuEventDestroy",
]
V2_6050 = [
    "cuLinkCreate",
    "cuLinkAddData",
    "cuLinkAddFile",
    "cuMemHostRegister",
    "cuGraphicsResourceSetMapFlags",
    "cuGLGetDevices",
]
V2_11000 = [
    "cuDevicePrimaryCtxRelease",
    "cuDevicePrimaryCtxReset",
    "cuDevicePrimaryCtxSetFlags",
    "cuIpcOpenMemHandle",
]
V2_12000 = [
    "cuGraphExecUpdate",
    "cuGraphKernelNodeGetParams",
    "cuGraphKernelNodeSetParams",
    "cuGraphAddKernelNode",
    "cuGraphExecKernelNodeSetParams",
]
V2_12030 = [
    "cuGraphGetEdges",
    "cuGraphNodeGetDependencies",
    "cuGraphNodeGetDependentNodes",
    "cuGraphAddDependencies",
    "cuGraphRemoveDependencies",
    "cuGraphAddNode",
    "cuStreamUpdateCaptureDependencies",
]
V2_11070 = [
    "cuStreamWaitValue32",
    "cuStreamWaitValue64",
    "cuStreamWriteValue32",
    "cuStreamWriteValue64",
    "cuStreamBatchMemOp",
]

# base -> list of (minVersion, suffix); the first entry is the base version.
RULES = {}
for n in V2_3020:
    RULES[n] = [(2000, ""), (3020, "_v2")]
for n in V2_4000:
    RULES[n] = [(2000, ""), (4000, "_v2")]
for n in V2_6050:
    RULES[n] = [(2000, ""), (6050, "_v2")]
for n in V2_11000:
    RULES[n] = [(2000, ""), (11000, "_v2")]
for n in V2_12000:
    RULES[n] = [(10000, ""), (12000, "_v2")]
for n in V2_12030:
    RULES[n] = [(10000, ""), (12030, "_v2")]
for n in V2_11070:
    RULES[n] = [(8000, ""), (11070, "_v2")]
RULES.update(
    {
        "cuCtxCreate": [(2000, ""), (3020, "_v2"), (11040, "_v3"), (12050, "_v4")],
        "cuTexRefSetAddress2D": [(2000, ""), (3020, "_v2"), (4010, "_v3")],
        "cuGraphInstantiate": [(10000, ""), (11000, "_v2"), (12000, "WithFlags")],
        "cuStreamBeginCapture": [(10000, ""), (10010, "_v2")],
        "cuStreamGetCaptureInfo": [(10010, ""), (11030, "_v2"), (12030, "_v3")],
        "cuStreamUpdateCaptureDependencies": [(11030, ""), (12030, "_v2")],
        "cuGraphAddNode": [(12020, ""), (12030, "_v2")],
        "cuMemAdvise": [(8000, ""), (12020, "_v2")],
        "cuMemPrefetchAsync": [(8000, ""), (12020, "_v2")],
        "cuEventElapsedTime": [(2000, ""), (12080, "_v2")],
        "cuCtxGetDevice": [(2000, ""), (12090, "_v2")],
        "cuCtxSynchronize": [(2000, ""), (12090, "_v2")],
        "cuMemcpyBatchAsync": [(12080, ""), (13000, "_v2")],
        "cuMemcpy3DBatchAsync": [(12080, ""), (13000, "_v2")],
        "cuDeviceGetUuid": [(9020, ""), (11040, "_v2")],
        "cuGetProcAddress": [(11030, ""), (12000, "_v2")],
        "cuStreamGetCtx": [(9020, ""), (12050, "_v2")],
        "cuGraphExecKernelNodeSetParams": [(10010, ""), (12000, "_v2")],
        "cuIpcOpenMemHandle": [(4010, ""), (11000, "_v2")],
        "cuMemHostRegister": [(4000, ""), (6050, "_v2")],
        "cuDevicePrimaryCtxRelease": [(7000, ""), (11000, "_v2")],
        "cuDevicePrimaryCtxReset": [(7000, ""), (11000, "_v2")],
        "cuDevicePrimaryCtxSetFlags": [(7000, ""), (11000, "_v2")],
        "cuLaunchKernel": [(4000, "")],
    }
)

# What the fake models beyond the traces (name -> first version).
EXTRA = {
    "cuMemCreate": 10020,
    "cuMemRelease": 10020,
    "cuMemAddressReserve": 10020,
    "cuMemAddressFree": 10020,
    "cuMemMap": 10020,
    "cuMemUnmap": 10020,
    "cuMemSetAccess": 10020,
    "cuMemGetAllocationGranularity": 10020,
    "cuMemGetAllocationPropertiesFromHandle": 10020,
    "cuMemRetainAllocationHandle": 11000,
    "cuMemExportToShareableHandle": 10020,
    "cuMemImportFromShareableHandle": 10020,
    "cuMemAllocHost": 2000,
    "cuMemHostAlloc": 2020,
    "cuMemFreeHost": 2000,
    "cuDevicePrimaryCtxRetain": 7000,
    "cuCtxDestroy": 2000,  # no runtime trace destroys a context; NVIDIA's bindings do
    "cuCtxGetCurrent": 4000,
    "cuCtxSetCurrent": 4000,
    "cuStreamCreate": 2000,
    "cuStreamSynchronize": 2000,
    "cuCtxSynchronize": 2000,
    "cuLaunchKernel": 4000,
    "cuDeviceGetPCIBusId": 4010,
    "cuMipmappedArrayCreate": 5000,
    "cuMipmappedArrayDestroy": 5000,
    "cuArrayDestroy": 2000,
    "cuDriverGetVersion": 2020,
    "cuMemAllocManaged": 6000,
    "cuDeviceGetDefaultMemPool": 11020,
    "cuDeviceGetMemPool": 11020,
    "cuDeviceSetMemPool": 11020,
    "cuModuleLoadDataEx": 2010,  # numba-cuda's JIT options path (issue 25)
    # multicast (NVLS; NCCL asks for it): stubs answering NOT_SUPPORTED, as a driver does on
    # a card without NVSwitch (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is 0 on the fake)
    "cuMulticastCreate": 12010,
    "cuMulticastAddDevice": 12010,
    "cuMulticastBindMem": 12010,
    "cuMulticastBindAddr": 12010,
    "cuMulticastUnbind": 12010,
    "cuMulticastGetGranularity": 12010,
}


# Per-thread default stream variants: synchronous copies/sets are _ptds, the rest _ptsz.
def per_thread(base, sym):
    if base.startswith(("cuMemcpy", "cuMemset", "cuGLMapBufferObject")) and not base.endswith(
        "Async"
    ):
        return sym + "_ptds"
    return sym + "_ptsz"


def main():
    data = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/data"
    first = {}
    pt = set()
    for path in sorted(glob.glob(os.path.join(data, "cudart-*-getprocaddress.tsv"))):
        with open(path) as fh:
            for line in fh:
                name, ver, flags = line.rstrip("\n").split("\t")
                if not name:
                    continue
                first[name] = min(first.get(name, 10**9), int(ver))
                if int(flags) & 2:
                    pt.add(name)
    for name, ver in EXTRA.items():
        first[name] = min(first.get(name, 10**9), ver)
    print("/* Generated by fakegpu/gen_procs.py: P(base, minVersion, symbol, perThreadSymbol). */")
    for base in sorted(first):
        rules = RULES.get(base, [(first[base], "")])
        lo = min(first[base], rules[0][0])
        rules = [(lo, rules[0][1]), *rules[1:]]
        for ver, suffix in rules:
            sym = base + suffix if suffix != "WithFlags" else base + "WithFlags"
            pts = per_thread(base, sym) if base in pt else sym
            print(f"P({base}, {ver}, {sym}, {pts})")


if __name__ == "__main__":
    main()
