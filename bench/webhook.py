"""Benchmark the admission webhook (issue 4).

1. AdmissionReviews per second and latency (p50, p99, milliseconds) over TLS on loopback:
   the webhook runs as its own process (``python -m webhook.main``), 64 concurrent aiohttp
   clients (keep-alive connections) POST the review of a 1-container and of a 10-container
   GPU pod for ``--duration`` seconds each, after a warm-up: back to back (the throughput
   at saturation), then paced at offered rates (the latency at a load).
2. Pod creation latency through the real API server (the dev cluster) with the webhook
   registered (by URL, the manifest's matchConditions) divided by the latency without it:
   the median of ``--pods`` sequential creations each way, interleaved, in one run. Two more
   series, in the same rotation: the floor webhook (bench/webhook_floor.py: an aiohttp
   server that answers with a one-operation patch and does nothing else, registered the same
   way), what any aiohttp webhook costs here; and the pod egpu's webhook made (the first
   mutated pod the API server stored) created without a webhook, what the larger pod costs
   apart from the call.

Targets (issue 4): >= 1500 reviews/s with p99 <= 10 ms on 2 cores, read as the throughput at
saturation and the median p99 of ``TARGET_WINDOWS`` windows with 1500 reviews/s offered
(``TARGET_RATE_PER_S``, counted from when each request was due; at saturation the
latency is queueing: 64 clients always waiting give 64 / throughput on average); creation
latency ratio <= 1.2. The last line is exactly ``reviews_per_s=N p50_ms_at_1500_per_s=N
p99_ms_at_1500_per_s=N create_latency_ratio=N floor_create_latency_ratio=N`` (the 1-container
pod); the ratios nan when the dev cluster is not available, and the latencies nan when
the clients could not offer the rate, with the reason printed above it.

Usage: ``.venv/bin/python bench/webhook.py [--duration 5] [--concurrency 64] [--pods 100]
[--no-cluster]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import math
import multiprocessing
import os
import ssl
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parent.parent
# This file is named like the package it measures: keep bench/ off the import path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO / "bench"]
sys.path.insert(0, str(REPO))

from certs.issue import create_ca, create_serving, write_bundle  # noqa: E402
from devcluster.errors import DevClusterError  # noqa: E402
from devcluster.net import HOST, free_port, http_ok, ssl_context  # noqa: E402
from devcluster.supervisor import Child  # noqa: E402
from devcluster.webhook_process import WebhookProcess  # noqa: E402
from testbed.stats import cpu_seconds, percentile  # noqa: E402
from webhook.registration import configuration_for_url  # noqa: E402

FLOOR_LABEL = "egpu-bench/floor"  # the label bench/webhook_floor.py's patch adds
TARGET_RATE_PER_S = 1500.0  # reviews/s at which the p99 target holds (issue 4)
# a paced case counts only when the clients sent this much of the offered rate
OFFERED_RATE_MET = 0.95
TARGET_WINDOWS = 3  # windows at the target's rate: the median p99 of them is judged


def gpu_pod(containers: int, name: str = "bench") -> dict[str, Any]:
    """A pod whose ``containers`` containers each ask for 1 card x 3000 MiB x 10% cores,
    shaped as the API server sends it (defaulted fields included)."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench",
                     "labels": {"app": "bench"}, "annotations": {"egpu.io/priority": "high"}},
        "spec": {
            "schedulerName": "default-scheduler", "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "containers": [{
                "name": f"c{i}", "image": "registry.example.internal/serve:1.0",
                "imagePullPolicy": "IfNotPresent",
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "env": [{"name": "MODEL", "value": "/models/m"}],
                "resources": {
                    "limits": {"cpu": "1", "memory": "2Gi", "egpu.io/gpu": "1",
                               "egpu.io/gpu-memory": "3000", "egpu.io/gpu-cores": "10"},
                    "requests": {"cpu": "1", "memory": "2Gi", "egpu.io/gpu": "1",
                                 "egpu.io/gpu-memory": "3000", "egpu.io/gpu-cores": "10"}},
            } for i in range(containers)],
        },
    }


def admission_review(pod: dict[str, Any], uid: str = "bench") -> dict[str, Any]:
    """The AdmissionReview (admission.k8s.io/v1) for creating ``pod``."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "bench", "operation": "CREATE", "object": pod,
        "userInfo": {"username": "bench"}, "dryRun": False}}


def start_webhook(certs: Path) -> WebhookProcess:
    """Run the webhook as its own process (log ``certs/webhook.log``); wait until /healthz
    answers."""
    webhook = WebhookProcess(certs)
    try:
        webhook.start()
    except DevClusterError as exc:
        raise SystemExit(f"bench: the webhook did not start: {exc}") from None
    return webhook


async def load(url: str, body: bytes, cafile: str, concurrency: int, duration_s: float,
               interval_s: float = 0.0, offsets: tuple[float, ...] = (),
               warmup_s: float = 1.0) -> list[float]:
    """Latencies (seconds) of ``concurrency`` keep-alive clients posting ``body`` for
    ``duration_s`` seconds, after ``warmup_s`` seconds that are not counted. Each client
    sends back to back (``interval_s`` 0: closed loop, the server's saturation) or one
    request every ``interval_s`` seconds from its offset in ``offsets`` (paced: latency at a
    given offered load, counted from when the request was due, so that a client running late
    counts its lateness)."""
    context = ssl.create_default_context(cafile=cafile)
    connector = aiohttp.TCPConnector(ssl=context, limit=concurrency)
    latencies: list[float] = []
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        measure_from = start + warmup_s
        stop = measure_from + duration_s

        async def worker(offset: float) -> None:
            due = start + offset
            while True:
                if interval_s:
                    due += interval_s
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                t0 = due if interval_s else time.perf_counter()
                if t0 >= stop:
                    return
                async with session.post(url, data=body, headers=headers) as resp:
                    payload = await resp.read()
                    if resp.status != 200:
                        raise SystemExit(f"bench: HTTP {resp.status}: {payload[:200]!r}")
                t1 = time.perf_counter()
                if t0 >= measure_from:
                    latencies.append(t1 - t0)

        await asyncio.gather(*(worker(offsets[i] if offsets else 0.0)
                               for i in range(concurrency)))
    return latencies


def _load_process(job: tuple[str, bytes, str, int, float, float, tuple[float, ...]]
                  ) -> list[float]:
    return asyncio.run(load(*job))


def measure(url: str, body: bytes, cafile: str, concurrency: int, duration_s: float,
            processes: int, offered_per_s: float = 0.0) -> tuple[float, float, float]:
    """Reviews/s, p50 ms, p99 ms for ``concurrency`` clients spread over ``processes``
    client processes (one Python process cannot keep a fast server busy on its own);
    closed loop, or paced at ``offered_per_s`` reviews/s in all."""
    shares = [concurrency // processes + (i < concurrency % processes)
              for i in range(processes)]
    interval = concurrency / offered_per_s if offered_per_s else 0.0
    # every client its own phase of the interval, across the processes
    offsets = [interval * i / concurrency for i in range(concurrency)]
    jobs = [(url, body, cafile, share, duration_s, interval,
             tuple(offsets[sum(shares[:p]):sum(shares[:p + 1])]))
            for p, share in enumerate(shares) if share]
    with multiprocessing.get_context("spawn").Pool(len(jobs)) as pool:
        latencies = sorted(x for part in pool.map(_load_process, jobs) for x in part)
    return (len(latencies) / duration_s, percentile(latencies, 0.5) * 1000,
            percentile(latencies, 0.99) * 1000)


def create_latency_ratio(url: str, ca_pem: bytes, certs: Path, pods: int
                         ) -> tuple[float, float, str]:
    """Median pod-creation latency with egpu's webhook / without, and with the floor webhook
    (bench/webhook_floor.py) / without, through the dev cluster's API server. Returns
    (nan, nan, reason) when the dev cluster is unavailable."""
    try:
        from devcluster import build as devbuild
        from devcluster import cluster as devcluster
    except ImportError as exc:
        return math.nan, math.nan, f"devcluster not importable ({exc})"
    state_dir = devcluster.default_state_dir()
    started = False
    if not devcluster.status(state_dir).up:  # start a private one, stopped afterwards
        if devbuild.missing():
            return math.nan, math.nan, ("dev cluster binaries not built yet: "
                                        f"{', '.join(devbuild.missing())} "
                                        "(python -m devcluster.build)")
        state_dir = Path(tempfile.mkdtemp(prefix="egpu-bench-cluster-"))
        try:
            devcluster.up(devcluster.Config(state_dir=state_dir, build_missing=False))
            started = True
        except Exception as exc:
            return math.nan, math.nan, f"dev cluster did not start: {exc}"
    floor = None
    try:
        floor, floor_url = start_floor(certs)
        ratio, floor_ratio = _measure(devcluster.ClusterInfo.load(state_dir), url,
                                      floor_url, ca_pem, pods)
        return ratio, floor_ratio, ""
    finally:
        if floor is not None:
            floor.stop()
        if started:
            devcluster.down(state_dir)


def start_floor(certs: Path) -> tuple[Child, str]:
    """bench/webhook_floor.py as its own process on a free port, serving, and its URL."""
    port = free_port()
    floor = Child("webhook-floor", [
        sys.executable, str(REPO / "bench" / "webhook_floor.py"), str(certs / "tls.crt"),
        str(certs / "tls.key"), str(port), FLOOR_LABEL], certs / "webhook-floor.log", cwd=REPO)
    health = f"https://{HOST}:{port}/healthz"
    context = ssl_context(certs / "ca.crt")
    try:
        floor.start(lambda: http_ok(health, context, timeout=1.0), f"GET {health}", 30.0)
    except DevClusterError as exc:
        raise SystemExit(f"bench: the floor webhook did not start: {exc}") from None
    return floor, f"https://{HOST}:{port}/mutate"


def _measure(info: Any, url: str, floor_url: str, ca_pem: bytes, pods: int
             ) -> tuple[float, float]:
    """Pods created in turn in a namespace egpu's webhook is registered for, in one the
    floor webhook is registered for (the same registration: its matchConditions, another
    URL) and in one neither is (the registrations' namespaceSelector), so that machine noise
    hits every series alike; and the pod egpu's webhook made, created without it. Returns
    the median latency with egpu's webhook / without, and with the floor's / without."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    api = info.api_client()
    core = client.CoreV1Api(api)
    admission = client.AdmissionregistrationV1Api(api)
    hooked_ns, floor_ns, plain_ns = "egpu-bench-webhook", "egpu-bench-floor", "egpu-bench-plain"
    for namespace in (hooked_ns, floor_ns, plain_ns):
        with _suppress(ApiException):
            core.create_namespace({"metadata": {"name": namespace}})
        deadline = time.monotonic() + 30
        while True:
            try:
                core.read_namespaced_service_account("default", namespace)
                break
            except ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    configs = []
    for name, hook_url, namespace in (("egpu-bench-webhook", url, hooked_ns),
                                      ("egpu-bench-floor", floor_url, floor_ns)):
        config = configuration_for_url(hook_url, ca_pem, name=name)
        for hook in config["webhooks"]:  # only the bench's namespace (the cluster may be shared)
            hook["namespaceSelector"] = {"matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In", "values": [namespace]}]}
        configs.append(config)

    def create(namespace: str, name: str, pod: dict[str, Any] | None = None
               ) -> tuple[float, Any]:
        pod = copy.deepcopy(pod) if pod else gpu_pod(1, name)
        pod["metadata"].update(name=name, namespace=namespace)
        t0 = time.perf_counter()
        created = core.create_namespaced_pod(namespace, pod)
        return time.perf_counter() - t0, created

    def first_mutated(namespace: str, label: str) -> Any:
        """The first pod the API server stored with ``label`` (the webhook was called)."""
        deadline = time.monotonic() + 30
        for i in itertools.count():
            _, created = create(namespace, f"probe-{i}")
            if (created.metadata.labels or {}).get(label):
                return api.sanitize_for_serialization(created)
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: the webhook of {namespace} was never called")
            time.sleep(0.2)

    without: list[float] = []
    with_webhook: list[float] = []
    made_without: list[float] = []  # the pod egpu's webhook made, created without it
    with_floor: list[float] = []
    try:
        for config in configs:
            admission.create_mutating_webhook_configuration(config)
        made = first_mutated(hooked_ns, "egpu.io/priority")
        first_mutated(floor_ns, FLOOR_LABEL)
        made = {"apiVersion": "v1", "kind": "Pod", "spec": made["spec"], "metadata": {
            k: made["metadata"][k] for k in ("labels", "annotations") if k in made["metadata"]}}
        made["spec"].pop("nodeName", None)
        series = ((plain_ns, None, without), (hooked_ns, None, with_webhook),
                  (plain_ns, made, made_without), (floor_ns, None, with_floor))
        for i in range(pods):  # warm every path, then rotate which goes first
            for k, (namespace, template, _) in enumerate(series):
                create(namespace, f"warm-{i}-{k}", template)
        for i in range(pods):
            turn = i % len(series)
            for k, (namespace, template, times) in enumerate(series[turn:] + series[:turn]):
                times.append(create(namespace, f"pod-{i}-{k}", template)[0])
    finally:
        for config in configs:
            with _suppress(ApiException):
                admission.delete_mutating_webhook_configuration(config["metadata"]["name"])
        for namespace in (hooked_ns, floor_ns, plain_ns):
            with _suppress(ApiException):
                core.delete_namespace(namespace)
        api.close()
    ms = {name: statistics.median(times) * 1000 for name, times in (
        ("without", without), ("with", with_webhook), ("made", made_without),
        ("floor", with_floor))}
    print(f"pod create median ({pods} pods each, interleaved): without a webhook "
          f"{ms['without']:.2f} ms, with egpu's {ms['with']:.2f} ms, with the floor webhook "
          f"{ms['floor']:.2f} ms, the pod egpu's webhook made without a webhook "
          f"{ms['made']:.2f} ms; egpu's webhook adds {ms['with'] - ms['without']:.2f} ms, "
          f"{ms['with'] - ms['floor']:.2f} ms of it above the floor")
    return ms["with"] / ms["without"], ms["floor"] / ms["without"]


class _suppress:
    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return value is not None and isinstance(value, self.kinds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per case")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--client-processes", type=int, default=2,
                        help="processes the concurrent clients are spread over")
    parser.add_argument("--paced", type=float, nargs="*", default=[200.0, 500.0],
                        help="also measure latency at these offered rates (reviews/s; "
                             f"{TARGET_RATE_PER_S:g}/s, the target's, always)")
    parser.add_argument("--pods", type=int, default=100, help="pods created each way")
    parser.add_argument("--no-cluster", action="store_true", help="skip the API server part")
    args = parser.parse_args(argv)
    print(f"cpus: {os.cpu_count()}, {args.concurrency} clients in {args.client_processes} "
          f"processes, {args.duration:g}s per case, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="egpu-bench-") as tmp:
        certs = Path(tmp)
        ca = create_ca()
        write_bundle(certs, ca, create_serving(ca, ["127.0.0.1", "localhost"]))
        proc = start_webhook(certs)
        url = f"{proc.url}/mutate"
        results = {}
        try:
            for containers in (10, 1):
                body = json.dumps(admission_review(gpu_pod(containers))).encode()
                cpu_before, wall_before = cpu_seconds(proc.pid), time.perf_counter()
                rate, p50, p99 = measure(url, body, str(certs / "ca.crt"), args.concurrency,
                                         args.duration, args.client_processes)
                cpu = cpu_seconds(proc.pid) - cpu_before
                wall = time.perf_counter() - wall_before
                results[containers] = (rate, p50, p99)
                # warm-up and measured requests both count: the rate covers the measured part
                served = rate * args.duration * (1 + 1 / args.duration)
                print(f"{containers}-container pod ({len(body)} bytes): reviews_per_s={rate:.0f} "
                      f"p50_ms={p50:.2f} p99_ms={p99:.2f}; webhook process CPU "
                      f"{cpu / wall * 100:.0f}% of one core, ~{cpu / served * 1e6:.0f} us CPU "
                      f"per review (~{served / cpu:.0f} reviews/s per fully used core)")
            body = json.dumps(admission_review(gpu_pod(1))).encode()
            windows: list[tuple[float, float, float]] = []  # at the target's rate
            for offered in sorted({*args.paced, TARGET_RATE_PER_S}):
                for _ in range(TARGET_WINDOWS if offered == TARGET_RATE_PER_S else 1):
                    rate, p50, p99 = measure(url, body, str(certs / "ca.crt"),
                                             args.concurrency, args.duration,
                                             args.client_processes, offered)
                    print(f"1-container pod, paced at {offered:g}/s offered by "
                          f"{args.concurrency} clients: reviews_per_s={rate:.0f} "
                          f"p50_ms={p50:.2f} p99_ms={p99:.2f}")
                    if offered == TARGET_RATE_PER_S:
                        windows.append((rate, p50, p99))
            at_target = (statistics.median(p50 for _, p50, _ in windows),
                         statistics.median(p99 for *_, p99 in windows))
            slow = [rate for rate, *_ in windows if rate < OFFERED_RATE_MET * TARGET_RATE_PER_S]
            if slow:
                at_target = (math.nan, math.nan)
                print(f"no latency at the target's rate: the clients sent only {slow} "
                      f"reviews a second of {TARGET_RATE_PER_S:g} in some windows")
            if args.no_cluster:
                ratio, floor_ratio, why = math.nan, math.nan, "--no-cluster given"
            else:
                ratio, floor_ratio, why = create_latency_ratio(url, ca.cert_pem, certs,
                                                               args.pods)
            if why:
                print(f"no creation latency ratio: {why}")
        finally:
            proc.stop()
    rate = results[1][0]
    p50, p99 = at_target
    target = f"{TARGET_RATE_PER_S:.0f}_per_s"
    print(f"reviews_per_s={rate:.0f} p50_ms_at_{target}={p50:.2f} p99_ms_at_{target}={p99:.2f} "
          f"create_latency_ratio={ratio:.3f} floor_create_latency_ratio={floor_ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
