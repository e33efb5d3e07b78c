"""What NVIDIA's cuda.core (the high-level API on cuda-bindings) sees and gets, run by a client
environment's Python (tests/clients/test_cuda_bindings.py). Prints one JSON object.

Device 0 made current, a stream, the device's memory resource (a stream-ordered pool): 1 GiB
buffers allocated until one fails, all dropped (freed by garbage collection, as a user's
buffers are), the stream synchronised, and as many allocated again (the pool's memory reused,
none leaked).
"""

from __future__ import annotations

import gc
import json

from cuda.bindings import driver as d
from cuda.core import Device

GIB = 1 << 30
MIB = 1 << 20
LIMIT = 64  # buffers: far beyond any card here


def main() -> None:
    out: dict[str, object] = {}
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()
    mr = dev.memory_resource
    out["resource"] = type(mr).__name__
    err, free, total = d.cuMemGetInfo()
    out["meminfo"] = int(err)
    out["total_mib"], out["free_mib"] = total // MIB, free // MIB

    def fill() -> int:
        held = []
        for _ in range(LIMIT):
            try:
                held.append(mr.allocate(GIB, stream=stream))
            except Exception as exc:  # cuda.core's CUDAError names the driver's error
                out["refusal"] = str(exc)[:200]
                break
        n = len(held)
        del held
        gc.collect()
        stream.sync()
        return n

    out["buffers"] = fill()
    out["buffers_again"] = fill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
