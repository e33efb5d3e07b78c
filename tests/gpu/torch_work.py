"""PyTorch workloads for the real-GPU checks (only when torch imports; run by suite.py).

python torch_work.py matmul SECONDS          4096x4096 fp32 products back to back
python torch_work.py hiloop SECONDS PERIOD_MS a small kernel every PERIOD_MS, latency
python torch_work.py fc02 STEPS STEP_MIB      expandable segments: grow in steps
python torch_work.py fc16 ALLOC_MIB           mem_get_info after an allocation
python torch_work.py graph SECONDS            capture a step with torch.cuda.graph, replay it
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import figures
import torch
from workload import wait_start

MIB = 1 << 20


def matmul(seconds: float) -> dict:
    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    c = a @ b
    torch.cuda.synchronize()
    wait_start()
    stamps = []
    t0 = time.monotonic()
    n = 0
    while time.monotonic() < t0 + seconds:
        c = a @ b
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
            stamps.append(time.monotonic())
    torch.cuda.synchronize()
    t1 = time.monotonic()
    del c
    wall = t1 - t0
    # windows of matmul counts (4 per stamp)
    s = figures.loop_summary(stamps, t0, t1, kernel_us=1e6 / 100)  # "use" = 4-matmul groups/100
    return {
        "matmuls": n,
        "wall_s": round(wall, 3),
        "per_s": round(n / wall, 2),
        "win_groups": s["win_use_pct"],
        "max_gap_ms": s["max_gap_ms"],
    }


def hiloop(seconds: float, period_ms: float) -> dict:
    x = torch.ones(1 << 20, device="cuda")
    torch.cuda.synchronize()
    wait_start()
    lat = []
    t0 = time.monotonic()
    nxt = t0
    while time.monotonic() < t0 + seconds:
        now = time.monotonic()
        if now < nxt:
            time.sleep(nxt - now)
        nxt += period_ms / 1000
        a = time.perf_counter()
        x.mul_(1.0001)
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - a) * 1e6)
    return {"lat_n": len(lat), **figures.percentiles(lat, "lat_us")}


def fc02(steps: int, step_mib: int) -> dict:
    held, fail_at = [], None
    for i in range(1, steps + 1):
        try:
            held.append(torch.empty(step_mib * MIB, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:
            fail_at = i
            break
    free, total = torch.cuda.mem_get_info()
    return {
        "fail_at_step": fail_at,
        "held_mib": len(held) * step_mib,
        "total_mib": total / MIB,
        "used_mib": (total - free) / MIB,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
    }


def fc16(alloc_mib: int) -> dict:
    x = torch.empty(alloc_mib * MIB, dtype=torch.uint8, device="cuda")
    free, total = torch.cuda.mem_get_info()
    budget = int(0.9 * total)  # a framework sizing itself at 0.9 x total
    try:
        y = torch.empty(
            max(0, budget - alloc_mib * MIB - 512 * MIB), dtype=torch.uint8, device="cuda"
        )
        fits = True
        del y
    except torch.cuda.OutOfMemoryError:
        fits = False
    del x
    return {"total_mib": total / MIB, "used_mib": (total - free) / MIB, "sized_at_0_9_fits": fits}


def graph(seconds: float) -> dict:
    """torch.cuda.graph capture of a small MLP step (what vLLM / reduce-overhead do), then
    replays: the capture must succeed under the interposer's gate."""
    x = torch.randn(256, 1024, device="cuda")
    w1 = torch.randn(1024, 4096, device="cuda")
    w2 = torch.randn(4096, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as PyTorch asks
        for _ in range(3):
            y = torch.relu(x @ w1) @ w2
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            y = torch.relu(x @ w1) @ w2
    except RuntimeError as e:
        return {"capture_ok": False, "error": str(e)[:500]}
    wait_start()
    n, t0 = 0, time.monotonic()
    while time.monotonic() < t0 + seconds:
        g.replay()
        n += 1
        if n % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = time.monotonic() - t0
    del y
    return {"capture_ok": True, "replays": n, "per_s": round(n / wall, 2)}


COMMANDS = {  # name -> (function, argument types)
    "matmul": (matmul, (float,)),
    "hiloop": (hiloop, (float, float)),
    "fc02": (fc02, (int, int)),
    "fc16": (fc16, (int,)),
    "graph": (graph, (float,)),
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
