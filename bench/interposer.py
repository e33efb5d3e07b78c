"""Added time per call of the interposer over the fake driver alone.

Runs libinterpose/build/bench_harness (a C timing loop) without any preload, then with the
interposer (and, with --compare PATH, with another preload library), and prints the
difference per call. The last line is exactly:

    launch_added_ns=N alloc_free_added_ns=N meminfo_added_ns=N graph_launch_added_ns=N
    noise_launch_ns=N noise_alloc_free_ns=N noise_meminfo_ns=N noise_graph_launch_ns=N
    [compare_launch_added_ns=N ...]

Each figure is signed (a negative one says the preload measured faster than the driver
alone: noise, which ``noise_*_ns`` sizes: the spread of the driver-alone rounds' best runs).

cuLaunchKernel runs with FAKEGPU_KERNEL_US=0 and no cap; the alloc+free pair is 1 MiB;
cuMemGetInfo needs a context, which the harness creates. cuGraphLaunch replays one executable
graph with a 2 MiB allocation node (freed in the graph) whose memory is mapped (uploaded
first), as an inference server replays its decode step; it is timed after the other loops.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "fakegpu" / "build"
HARNESS = ROOT / "libinterpose" / "build" / "bench_harness"
INTERPOSER = ROOT / "libinterpose" / "build" / "libegpu_interpose.so"
KEYS = ("launch_ns", "alloc_free_ns", "meminfo_ns", "graph_launch_ns")
ROUNDS = 3  # interleaved rounds of each configuration


def measure(preload: str | None, n: int, reps: int, tmp: str) -> dict[str, float]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(FAKE),
        "FAKEGPU_STATE_DIR": f"{tmp}/fakegpu",
        "FAKEGPU_KERNEL_US": "0",
        "EGPU_RUNTIME_DIR": f"{tmp}/egpu",
        "EGPU_CONFIG_PATH": f"{tmp}/no-config.json",
        "EGPU_MEMORY_LIMIT_MIB": "1048576",  # effectively no cap: the card's memory
    }
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run(
        [str(HARNESS), str(n), str(reps)], env=env, capture_output=True, text=True, check=True
    )
    line = out.stdout.strip().splitlines()[-1]
    return {k: float(v) for k, v in (kv.split("=") for kv in line.split())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--compare", metavar="PATH", help="another preload library to measure the same way"
    )
    ap.add_argument("-n", type=int, default=400000, help="launches per run (alloc/meminfo: n/4)")
    ap.add_argument("--reps", type=int, default=7, help="runs per configuration; the best is kept")
    ap.add_argument("--no-build", action="store_true")
    args = ap.parse_args(argv)
    if not args.no_build:
        for d in ("fakegpu", "libinterpose"):
            subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True)
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        # interleave base and preload runs so that machine noise hits both alike
        base, ours, other = {}, {}, {}
        base_rounds: list[dict[str, float]] = []
        for _ in range(ROUNDS):
            for store, pre in ((base, None), (ours, str(INTERPOSER)), (other, args.compare)):
                if store is other and not args.compare:
                    continue
                got = measure(pre, args.n, args.reps, tmp)
                if store is base:
                    base_rounds.append(got)
                for k in KEYS:
                    store[k] = min(store.get(k, float("inf")), got[k])
    print(f"fake driver alone: {base}", file=sys.stderr)
    print(f"with interposer:   {ours}", file=sys.stderr)
    parts = [f"{k.replace('_ns', '_added_ns')}={round(ours[k] - base[k])}" for k in KEYS]
    parts += [f"noise_{k}={round(max(r[k] for r in base_rounds) - min(r[k] for r in base_rounds))}"
              for k in KEYS]
    if args.compare:
        print(f"with {args.compare}: {other}", file=sys.stderr)
        parts += [
            f"compare_{k.replace('_ns', '_added_ns')}={round(other[k] - base[k])}"
            for k in KEYS
        ]
    print(" ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
