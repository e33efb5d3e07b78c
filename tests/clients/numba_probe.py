"""What numba-cuda (a kernel compiled to PTX on the host, linked with nvJitLink and loaded
through cuda.core's cuLibraryLoadData) sees and gets, run by the numba-cuda client
environment's Python (tests/clients/test_numba_cuda.py). Prints one JSON object.

A kernel is compiled and launched on two device arrays copied in (cuMemcpyHtoD), the context
synchronised and one array copied back (cuMemcpyDtoH); then numba's memory-info API is read
and 256 MiB device arrays are allocated until one fails.
"""

from __future__ import annotations

import json

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import CudaAPIError

MIB = 1 << 20
CHUNK_MIB = 256
LIMIT = 1024  # arrays: far beyond any card here


@cuda.jit
def add(a, b):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < a.size:
        a[i] += b[i]


def main() -> None:
    out: dict[str, object] = {"available": cuda.is_available()}
    a = cuda.to_device(np.ones(1024, dtype=np.float32))
    b = cuda.to_device(np.ones(1024, dtype=np.float32))
    add[4, 256](a, b)
    cuda.synchronize()
    out["launched"] = True
    out["copied_back"] = a.copy_to_host().shape[0]
    free, total = cuda.current_context().get_memory_info()
    out["free_mib"], out["total_mib"] = free // MIB, total // MIB
    arrays = []
    out["refusal"] = None
    try:
        for _ in range(LIMIT):
            arrays.append(cuda.device_array(CHUNK_MIB * MIB, dtype=np.uint8))
    except CudaAPIError as exc:
        out["refusal"] = int(exc.code)
    out["arrays"] = len(arrays)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
