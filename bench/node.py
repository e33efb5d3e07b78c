"""Benchmark of the node side: runtime-hook run time and exporter scrape time.

- hook: ``egpu-hook`` as installed on a node (the zipapp of runtime_hook.zipapp, run with
  ``python3 -IS``) run as runc runs it (a new process, state JSON on stdin) on a prepared
  bundle whose container has a share. pid 0 in the state: there is no container to enter, so
  the bind mounts are made in a private mount namespace (``unshare -m``, when root). N runs.
- scrape: the Prometheus collector over 100 containers' accounting regions (synthetic, region
  layout v1), rendered to the text format, N runs.

The last line printed is ``hook_p50_ms=N hook_p99_ms=N scrape_ms=N`` (scrape_ms = median).
Targets: hook p50 <= 50 ms, scrape <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "node"))

from node_fixtures import write_regions  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from egpu.records import Allocation, Card, CardShare, ContainerAllocation, PodShares  # noqa: E402
from node_agent.metrics.collector import EgpuCollector, Sources, regions_under  # noqa: E402
from runtime_hook import zipapp  # noqa: E402

UUID = "GPU-00000000-0000-0000-0000-000000000000"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_hook(runs: int, work: Path) -> tuple[list[float], float]:
    """Wall time (ms) of ``egpu-hook`` processes on a bundle with a share, as installed on a
    node (the zipapp, ``python3 -IS``), and their mean CPU time (ms)."""
    hook = zipapp.build(str(work / "egpu-hook.pyz"), f"{sys.executable} -IS")
    interposer = REPO / "libinterpose" / "build" / "libegpu_interpose.so"
    if not interposer.exists():
        interposer = work / "stand-in.so"
        interposer.write_bytes(b"")
    uid = "bench-0000"
    private, runtime = work / "private", work / "runtime"
    (private / "allocations").mkdir(parents=True)
    entry = ContainerAllocation("main", False, (CardShare(UUID, 0, 4096, 30),))
    (private / "allocations" / f"{uid}.json").write_text(PodShares(
        "ns", "p", uid, "high", "strict", False, Allocation(containers=(entry,))).encode())
    bundle = work / "bundle"
    (bundle / "rootfs" / "etc").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["/probe"], "env": [f"NVIDIA_VISIBLE_DEVICES={UUID}"]},
        "annotations": {"io.kubernetes.cri.sandbox-uid": uid,
                        "io.kubernetes.cri.container-name": "main"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "bench", "status": "creating", "pid": 0,
                        "bundle": str(bundle)}).encode()
    argv = [str(hook), "createRuntime", "--runtime-dir", str(runtime), "--private-dir",
            str(private), "--interposer", str(interposer)]
    if os.geteuid() == 0 and shutil.which("unshare"):
        argv = ["unshare", "-m", "--propagation", "private", *argv]
    times = []
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(runs):
        started = time.perf_counter()
        proc = subprocess.run(argv, input=state, capture_output=True)
        times.append((time.perf_counter() - started) * 1000)
        if proc.returncode != 0:
            raise SystemExit(f"egpu-hook failed: {proc.stderr.decode()}")
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime
           - cpu_before.ru_stime) * 1000 / runs
    return times, cpu


def bench_scrape(runs: int, work: Path, containers: int = 100) -> list[float]:
    """Wall time (ms) of one collection + text rendering over ``containers`` regions."""
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]
    shares = write_regions(str(work / "regions"), containers, uuids)
    cards = tuple(Card(u, i, "NVIDIA A10", 24576) for i, u in enumerate(uuids))
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources("bench", lambda: cards, lambda: shares,
                                            regions_under(str(work / "regions")),
                                            lambda u: 0, lambda u: 0)))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        generate_latest(registry)
        times.append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        work = Path(tmp)
        hook, cpu = bench_hook(args.runs, work)
        scrape = bench_scrape(args.runs, work)
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"hook: runs={len(hook)} min={min(hook):.1f} max={max(hook):.1f} ms, "
          f"CPU {cpu:.1f} ms per run")
    print(f"scrape (100 containers): min={min(scrape):.2f} max={max(scrape):.2f} ms")
    print(f"hook_p50_ms={percentile(hook, 0.5):.1f} hook_p99_ms={percentile(hook, 0.99):.1f} "
          f"scrape_ms={statistics.median(scrape):.1f}")


if __name__ == "__main__":
    main()
