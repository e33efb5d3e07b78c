"""Benchmark of the node side: runtime-hook run time and exporter scrape time.

- hook: ``egpu-hook`` as installed on a node (the one-file build of runtime_hook.bundle, run
  with ``python3 -IS``) run as runc runs it (a new process, state JSON on stdin) on a prepared
  bundle whose container has a share. The container's process is a shell in a private mount
  namespace (``unshare -m``, root), which prints the state with its own pid and pipes it to the
  hook: the bind mounts are made in that namespace, as in a container's. N runs.
- hook, no share: the same on a container without a share (named by the CRI annotations, no
  allocation file for its pod, no EGPU_* env: most containers of a node), and on a sandbox
  (pause) container. No mount namespace needed. N runs each.
- scrape: the Prometheus collector over 100 containers' accounting regions (synthetic, region
  layout v1), rendered to the text format, N runs.

The last line printed is ``hook_p50_ms=N hook_p99_ms=N scrape_ms=N`` (the share path;
scrape_ms = median); the line before it gives the no-share figures.
Targets: hook p50 <= 50 ms, scrape <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from egpu.records import Allocation, Card, CardShare, ContainerAllocation, PodShares  # noqa: E402
from node_agent.metrics.collector import EgpuCollector, Sources, regions_under  # noqa: E402
from runtime_hook import bundle  # noqa: E402
from testbed.regions import write_regions  # noqa: E402
from testbed.stats import percentile  # noqa: E402

UUID = "GPU-00000000-0000-0000-0000-000000000000"


def _time_runs(argv: list[str], state: bytes, runs: int) -> tuple[list[float], float]:
    """Wall times (ms) of ``runs`` processes and their mean CPU time (ms)."""
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


def _bundle(work: Path, name: str, env: list[str], annotations: dict[str, str]) -> Path:
    bundle_dir = work / name
    (bundle_dir / "rootfs" / "etc").mkdir(parents=True)
    (bundle_dir / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["/probe"], "env": ["PATH=/usr/bin:/bin", *env]},
        "annotations": annotations}))
    return bundle_dir


def _state(bundle_dir: Path, annotations: dict[str, str] | None = None) -> bytes:
    """The OCI state of a container without a share (the hook never enters it: pid 0)."""
    return json.dumps({"ociVersion": "1.0.2", "id": bundle_dir.name, "status": "creating",
                       "pid": 0, "bundle": str(bundle_dir),
                       **({"annotations": annotations} if annotations else {})}).encode()


def _in_container(bundle_dir: Path, argv: list[str]) -> list[str]:
    """A command that runs hook ``argv`` as runc does for a container with a share: a shell in
    a new private mount namespace (the container's process) prints the OCI state with its own
    pid and pipes it to the hook, which mounts into that namespace."""
    body = json.dumps({"ociVersion": "1.0.2", "id": bundle_dir.name, "status": "creating",
                       "bundle": str(bundle_dir)})
    head = shlex.quote(body[:-1] + ', "pid": ')
    state = "printf '%s%s}' " + head + ' "$$"'
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f"{state} | {shlex.join(argv)}"]


def bench_hook(runs: int, work: Path) -> dict[str, tuple[list[float], float]]:
    """Wall times (ms) of ``egpu-hook`` processes as installed on a node (the one-file build,
    ``python3 -IS``) and their mean CPU time (ms): ``share`` (a container with a share: files
    and bind mounts), ``plain`` (a pod's container without a share) and ``sandbox``."""
    hook = bundle.build(str(work / "egpu-hook"), f"{sys.executable} -IS")
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
    share = _bundle(work, "share", [f"NVIDIA_VISIBLE_DEVICES={UUID}", "EGPU_DEVICES=x::0"],
                    {"io.kubernetes.cri.sandbox-uid": uid,
                     "io.kubernetes.cri.container-name": "main"})
    plain_ann = {"io.kubernetes.cri.sandbox-uid": "other-0000",
                 "io.kubernetes.cri.container-name": "web",
                 "io.kubernetes.cri.container-type": "container"}
    plain = _bundle(work, "plain", ["HOME=/root"], plain_ann)
    sandbox_ann = {**plain_ann, "io.kubernetes.cri.container-type": "sandbox"}
    sandbox = _bundle(work, "sandbox", [], sandbox_ann)
    argv = [str(hook), "createRuntime", "--runtime-dir", str(runtime), "--private-dir",
            str(private), "--interposer", str(interposer)]
    if os.geteuid() != 0 or not shutil.which("unshare"):
        raise SystemExit("bench/node.py: the share case needs root and unshare(1) (a container's "
                         "mount namespace)")
    return {
        "share": _time_runs(_in_container(share, argv), b"", runs),
        "plain": _time_runs(argv, _state(plain, plain_ann), runs),
        "sandbox": _time_runs(argv, _state(sandbox, sandbox_ann), runs),
    }


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
        hooks = bench_hook(args.runs, work)
        scrape = bench_scrape(args.runs, work)
    print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name, (times, cpu) in hooks.items():
        print(f"hook {name}: runs={len(times)} p50={percentile(times, 0.5):.1f} "
              f"min={min(times):.1f} max={max(times):.1f} ms, CPU {cpu:.1f} ms per run")
    print(f"scrape (100 containers): min={min(scrape):.2f} max={max(scrape):.2f} ms")
    plain, sandbox = hooks["plain"][0], hooks["sandbox"][0]
    print(f"hook_noshare_p50_ms={percentile(plain, 0.5):.1f} "
          f"hook_noshare_p99_ms={percentile(plain, 0.99):.1f} "
          f"hook_sandbox_p50_ms={percentile(sandbox, 0.5):.1f}")
    hook = hooks["share"][0]
    print(f"hook_p50_ms={percentile(hook, 0.5):.1f} hook_p99_ms={percentile(hook, 0.99):.1f} "
          f"scrape_ms={statistics.median(scrape):.1f}")


if __name__ == "__main__":
    main()
