"""Scheduling throughput: pods bound per second for DRA shares, shares through egpu's
scheduler, and whole cards.

    python bench/scheduling.py [--nodes 1000] [--pods 1000] [--cards 8] [--rounds 6]

On the dev cluster (reused when ``egpu dev-cluster`` reports one up, else started and stopped
here): adds N kwok nodes of C H100-sized cards each with both ``nvidia.com/gpu: C`` and
``egpu.io/gpu: C x sharesPerCard``, the node agent's inventory annotations and its
ResourceSlices of driver gpu.egpu.io (``devcluster.dra.publish_node_slices``, as the agent with
``--dra`` publishes them), and waits until they are Ready and untainted; applies the
DeviceClasses of manifests/dra and a ResourceClaimTemplate of one share; and starts
egpu-kube-scheduler, the scheduler egpu installs, beside the dev cluster's scheduler (as a
cluster runs it beside its default one), with the installed profile (manifests/scheduler) under
the name ``egpu-plugin-bench`` and an egpu config file (``devcluster.plugin_scheduler``). Then, in
each of R rounds (``--rounds``, at least 3: each kind once in each place of the rotation), P
pods of each kind are created with a scheduling gate, the gates are lifted from 16 threads (one
pooled connection each), and the rate is P / (last bind - first ungate); pods (and claims) are
deleted between the kinds. The kinds are interleaved: each round runs all three, in an order
rotated from the round before, so that a slow stretch of the machine hits every kind alike;
each ratio is taken within its round and the median of the rounds is reported:

- ``default``: a whole card, ``nvidia.com/gpu: 1``, default-scheduler (device-plugin counting);
- ``plugin``: a share (20000 MiB, 25%) through egpu-kube-scheduler's plugin, EgpuShares (the
  placement that replaced the extender: docs/scheduler.md "The placement inside
  kube-scheduler");
- ``dra``: the same share as a ResourceClaim of class share.gpu.egpu.io (consumable capacity),
  one per pod, created with the pods (before the gates are lifted), default-scheduler's own
  DRA allocator.

Everything (etcd, API server, both schedulers, kwok, this client) shares the machine's cores;
the ungating rate is printed so that a client-bound run can be told apart, and each round's CPU
seconds per process (its pods' creation, scheduling, binding and deletion), so that where a
kind's time goes can be read.

Last line: ``nodes=N rounds=R dra_pods_per_s=N plugin_pods_per_s=N default_pods_per_s=N
dra_ratio=N plugin_ratio=N`` (medians of the rounds; each ratio is that kind's pods / plain
pods within one round; issue 24's targets: dra_ratio >= 0.5, and >= 0.8 for the shares of
egpu's scheduler, which the issue named extender_ratio while the extender placed them).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml

from devcluster import cluster as devcluster
from devcluster import dra as devdra
from devcluster import nodes as devnodes
from devcluster.cluster import wait_until
from devcluster.plugin_scheduler import PluginSchedulerProcess
from egpu.contract import DEVICE_CLASS_SHARE, DRA_CLAIM_FINALIZER
from scheduler.kube import ApiStatusError, RawApi, load_client
from testbed.stats import cpu_seconds, percentile

REPO = Path(__file__).resolve().parents[1]
GATE = "egpu.io/bench"
NS = "egpu-bench"
SHARES = devnodes.DEFAULT_SHARES_PER_CARD
CLIENT_THREADS = 16  # the threads that create the pods and lift their gates




def node_spec(name: str, cards: int) -> dict[str, Any]:
    """A bench node of the cluster-file format (devcluster.nodes): C H100-sized cards."""
    return {"name": name, "labels": {"egpu-bench": "true"},
            "cards": {"count": cards, "model": "NVIDIA H100", "memoryMiB": 81559}}


def install_device_classes(api: RawApi) -> None:
    """The DeviceClasses of manifests/dra (present ones are kept)."""
    for doc in yaml.safe_load_all((REPO / "manifests" / "dra" / "deviceclasses.yaml").read_text()):
        if doc and doc.get("kind") == "DeviceClass":
            with contextlib.suppress(ApiStatusError):
                api.json("POST", "/apis/resource.k8s.io/v1/deviceclasses", body=doc)


def add_nodes(api: RawApi, n: int, cards: int) -> list[str]:
    """N kwok nodes ``bench-NNNN`` with C H100-sized cards and both GPU resources."""
    def one(i: int) -> str:
        name = f"bench-{i:04d}"
        body = devnodes.node_manifest(node_spec(name, cards), SHARES)
        for key in ("capacity", "allocatable"):
            body["status"][key]["nvidia.com/gpu"] = str(cards)
        with contextlib.suppress(ApiStatusError):
            api.json("POST", "/api/v1/nodes", body=body)
        status = {"status": {k: body["status"][k] for k in ("capacity", "allocatable")}}
        api.json("PATCH", f"/api/v1/nodes/{name}/status", body=status,
                 content_type="application/merge-patch+json")
        return name

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        names = list(pool.map(one, range(n)))
    # a new Node carries the not-ready taint until kwok reports it Ready
    devnodes.wait_nodes_ready(api.client, names, timeout_s=300, interval_s=1.0)
    return names


def delete_nodes(api: RawApi, n: int) -> None:
    """Remove the bench nodes (missing ones are fine)."""
    def one(i: int) -> None:
        with contextlib.suppress(ApiStatusError):
            api.json("DELETE", f"/api/v1/nodes/bench-{i:04d}")

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(one, range(n)))


def heartbeat(api: RawApi, names: list[str]) -> None:
    stamp = devnodes.now_rfc3339()
    body = {"metadata": {"annotations": {"egpu.io/inventory-heartbeat": stamp}}}
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(lambda n: api.json("PATCH", f"/api/v1/nodes/{n}", body=body,
                                         content_type="application/merge-patch+json"), names))


# The three kinds of pod measured: a whole card through the default scheduler's device-plugin
# counting; a share through egpu's scheduler; a share as a DRA claim (consumable capacity)
# through the default scheduler's own allocator.
WHOLE, PLUGIN_SHARE, DRA_SHARE = "default", "plugin", "dra"
KINDS = (WHOLE, PLUGIN_SHARE, DRA_SHARE)
MIN_ROUNDS = len(KINDS)  # each kind once in each place of the rotation
DEFAULT_ROUNDS = 2 * MIN_ROUNDS
PLUGIN_SCHEDULER = "egpu-plugin-bench"  # egpu-kube-scheduler's profile
SHARE_MIB = 20000  # four shares fit an H100's 81559 MiB
SHARE_CORES = 25
TEMPLATE = "bench-share"


def share_template() -> dict[str, Any]:
    """The ResourceClaimTemplate of a DRA share (class share.gpu.egpu.io)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE, "namespace": NS},
            "spec": {"spec": {"devices": {"requests": [{"name": "share", "exactly": {
                "deviceClassName": DEVICE_CLASS_SHARE,
                "capacity": {"requests": {"memory": f"{SHARE_MIB}Mi",
                                          "cores": str(SHARE_CORES)}}}}]}}}}


def share_claim(name: str) -> dict[str, Any]:
    """The ResourceClaim of DRA pod ``name``, as the webhook writes it (created before the
    gates are lifted, as the webhook creates it with its pod; with the allocation finalizer
    already there, so the kube-scheduler skips that write)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS, "finalizers": [DRA_CLAIM_FINALIZER]},
            "spec": share_template()["spec"]["spec"]}


def pod(name: str, kind: str) -> dict[str, Any]:
    limits: dict[str, str] = {"nvidia.com/gpu": "1"} if kind == WHOLE else {}
    if kind == PLUGIN_SHARE:
        limits = {"egpu.io/gpu": "1", "egpu.io/gpu-memory": str(SHARE_MIB),
                  "egpu.io/gpu-cores": str(SHARE_CORES)}
    container: dict[str, Any] = {"name": "c", "image": "busybox",
                                 "resources": {"limits": limits}}
    schedulers = {PLUGIN_SHARE: PLUGIN_SCHEDULER}
    spec: dict[str, Any] = {
        "schedulerName": schedulers.get(kind, "default-scheduler"),
        "terminationGracePeriodSeconds": 0, "schedulingGates": [{"name": GATE}],
        "nodeSelector": {"egpu-bench": "true"}, "containers": [container]}
    if kind == DRA_SHARE:  # its own claim, created with it (see share_claim)
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


BIND_TIMEOUT_S = 900.0  # a round's pods all bound within this, or the bench fails
CHILD_START_S = 60.0  # the bind watcher's process imports and connects within this


def _watch_binds(kubeconfig: str, count: int, version: str, out: Connection) -> None:
    """In a process of its own: send "ready", then the time.monotonic() at which the
    ``count``-th pod of the bench namespace was seen with a node (or an error text)."""
    try:
        api = RawApi(load_client(kubeconfig, pool_size=1))
        out.send("ready")
        bound: set[str] = set()
        while True:
            for event in api.watch(f"/api/v1/namespaces/{NS}/pods", version):
                body = event.get("object") or {}
                version = (body.get("metadata") or {}).get("resourceVersion", version)
                if event.get("type") in ("ADDED", "MODIFIED") and \
                        (body.get("spec") or {}).get("nodeName"):
                    bound.add(body["metadata"]["name"])
                    if len(bound) >= count:
                        out.send(time.monotonic())
                        return
    except Exception as exc:  # the parent reports it
        out.send(f"watch failed: {exc!r}")


class BindWatch:
    """Counts the bench namespace's pods that have a node, from a watch in a child process:
    in this one, decoding the events would take the GIL from the threads that lift the gates
    (and a list of 1000 pods every 0.2 s, as before, cost the API server more CPU than the
    schedulers it shares the machine with). CLOCK_MONOTONIC is one clock for both processes.
    """

    def __init__(self, api: RawApi, kubeconfig: str, count: int) -> None:
        self.count = count
        _, version = api.list_all(f"/api/v1/namespaces/{NS}/pods")
        context = multiprocessing.get_context("spawn")
        self._answers, child_end = context.Pipe(duplex=False)
        self._child = context.Process(target=_watch_binds, daemon=True,
                                      args=(kubeconfig, count, version, child_end))
        self._child.start()
        ready = self._receive(CHILD_START_S)
        if ready != "ready":
            raise RuntimeError(f"the bind watcher did not start: {ready!r}")

    def _receive(self, timeout_s: float) -> object:
        if not self._answers.poll(timeout_s):
            self._child.kill()
            raise RuntimeError(f"the bind watcher said nothing within {timeout_s:.0f} s")
        return self._answers.recv()

    def wait(self, timeout_s: float) -> float:
        """The time (time.monotonic) the last pod was seen bound; RuntimeError on a timeout
        or a failed watch."""
        answer = self._receive(timeout_s)
        self._child.join(5)
        if not isinstance(answer, float):
            raise RuntimeError(f"not all {self.count} pods seen bound: {answer!r}")
        return answer


def run(api: RawApi, kubeconfig: str, kind: str, count: int) -> tuple[float, float]:
    """Pods/s bound, and gates lifted per second."""
    names = [f"{kind[:4]}-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        if kind == DRA_SHARE:
            list(pool.map(lambda n: api.json(
                "POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims",
                body=share_claim(n)), names))
        list(pool.map(lambda n: api.json("POST", f"/api/v1/namespaces/{NS}/pods",
                                         body=pod(n, kind)), names))
    ungate = [{"op": "remove", "path": "/spec/schedulingGates"}]
    bound = BindWatch(api, kubeconfig, count)
    t0 = time.monotonic()
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(lambda n: api.json("PATCH", f"/api/v1/namespaces/{NS}/pods/{n}",
                                         body=ungate, content_type="application/json-patch+json"),
                      names))
    ungated = time.monotonic() - t0
    elapsed = bound.wait(BIND_TIMEOUT_S) - t0
    api.json("DELETE", f"/api/v1/namespaces/{NS}/pods", query={"gracePeriodSeconds": 0})
    wait_until("pods deleted",
               lambda: not api.json("GET", f"/api/v1/namespaces/{NS}/pods")["items"], timeout=300)
    if kind == DRA_SHARE:
        api.json("DELETE", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")
        wait_until("claims deleted", lambda: not api.json(
            "GET", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims")["items"],
            timeout=300)
    return count / elapsed, count / ungated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help=f"rounds of the three kinds, interleaved (at least {MIN_ROUNDS})")
    args = parser.parse_args(argv)
    if args.rounds < MIN_ROUNDS:
        parser.error(f"--rounds {args.rounds}: at least {MIN_ROUNDS} (a median of rounds)")

    state_dir = devcluster.default_state_dir()
    started = False
    if devcluster.status(state_dir).up:
        info = devcluster.ClusterInfo.load(state_dir)
    else:
        info = devcluster.up(devcluster.Config(state_dir=state_dir))
        started = True
    work = Path(tempfile.mkdtemp(prefix="egpu-bench-"))
    # one pooled connection per client thread: the kubernetes client's default pool (5 x the
    # CPUs, 10 here) is smaller than the 16 threads, and each thread past it would pay a TLS
    # handshake per request, bounding the plain pods' rate by the client
    api = RawApi(load_client(info.kubeconfig, pool_size=CLIENT_THREADS))
    plugin = None
    rounds: dict[int, dict[str, float]] = {}
    try:
        with contextlib.suppress(ApiStatusError):
            api.json("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        t = time.monotonic()
        names = add_nodes(api, args.nodes, args.cards)
        print(f"{len(names)} nodes ready in {time.monotonic() - t:.0f}s", flush=True)
        config = work / "egpu-config.yaml"
        config.write_text(yaml.safe_dump({"sharesPerCard": SHARES,
                                          "heartbeatTimeoutSeconds": 3600}))
        heartbeat(api, names)
        t = time.monotonic()
        # as the node agent with --dra publishes them, on the config egpu's scheduler gets
        with ThreadPoolExecutor(CLIENT_THREADS) as pool:
            list(pool.map(lambda n: devdra.publish_node_slices(
                info.api_client(), n, devnodes.inventory(node_spec(n, args.cards)).cards,
                shares_per_card=SHARES), names))
        install_device_classes(api)
        with contextlib.suppress(ApiStatusError):
            api.json("POST", f"/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaimtemplates",
                     body=share_template())
        print(f"ResourceSlices published in {time.monotonic() - t:.0f}s", flush=True)
        plugin = PluginSchedulerProcess(info.kubeconfig, work, PLUGIN_SCHEDULER, config)
        plugin.start()
        pids = {name: info.processes[name].pid for name in CPU_SHOWN if name in info.processes}
        pids |= {"egpu-kube-scheduler": plugin.process.pid}
        for r in range(args.rounds):
            for kind in round_order(r):
                holds = {PLUGIN_SHARE: plugin.gate_holds}.get(kind, lambda: None)
                held = holds()
                cpu = processes_cpu(pids)
                rate, ungate = run(api, info.kubeconfig, kind, args.pods)
                cpu = {n: s - cpu[n] for n, s in processes_cpu(pids).items() if n in cpu}
                rounds.setdefault(r, {})[kind] = rate
                held_text = ""
                if held is not None:
                    held_text = f"; the bind gate held {(holds() or 0) - held}"
                cpu_text = ", ".join(f"{n} {s:.1f}" for n, s in cpu.items())
                print(f"round {r + 1} {kind}: {rate:.1f} pods/s (gates lifted at {ungate:.0f}/s"
                      f"{held_text}; CPU s: {cpu_text})", flush=True)
        print(schedulers_memory(pids), flush=True)
    finally:
        if plugin is not None:
            plugin.stop()
        delete_nodes(api, args.nodes)
        if started:
            devcluster.down(state_dir)
    print(summary_line(args.nodes, list(rounds.values())))
    return 0


# the dev cluster's processes whose CPU each round prints (beside the egpu schedulers)
CPU_SHOWN = ("kube-apiserver", "etcd", "kube-scheduler", "kwok")


def processes_cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process still running (a round's figure is the
    difference over it: its pods' creation, scheduling, binding and deletion)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        with contextlib.suppress(OSError):
            out[name] = cpu_seconds(pid)
    return out


def schedulers_memory(pids: dict[str, int]) -> str:
    """Each scheduler's peak resident memory so far (VmHWM) and the GOGC it runs with."""
    parts = []
    for name in ("kube-scheduler", "egpu-kube-scheduler"):
        try:
            status = Path(f"/proc/{pids[name]}/status").read_text()
            environ = Path(f"/proc/{pids[name]}/environ").read_bytes().split(b"\0")
        except (KeyError, OSError) as exc:
            parts.append(f"{name} unknown ({exc!r})")
            continue
        hwm_kib = next((int(line.split()[1]) for line in status.splitlines()
                        if line.startswith("VmHWM:")), 0)
        gogc = next((v[5:].decode() for v in environ if v.startswith(b"GOGC=")),
                    "100, Go default")
        parts.append(f"{name} {hwm_kib // 1024} MiB (GOGC={gogc})")
    return "peak RSS: " + ", ".join(parts)


def round_order(r: int) -> tuple[str, ...]:
    """The kinds in round ``r``: each round the order before it, rotated by one."""
    shift = r % len(KINDS)
    return KINDS[shift:] + KINDS[:shift]


def summary_line(nodes: int, rounds: list[dict[str, float]]) -> str:
    """The last line: the medians of the rounds' rates and of their ratios (each ratio taken
    within its round: the interleaving's point)."""
    def med(values: list[float]) -> float:
        return percentile(values, 0.5)

    def rate(kind: str) -> float:
        return med([r[kind] for r in rounds])

    def ratio(kind: str) -> float:
        return med([r[kind] / r[WHOLE] for r in rounds])

    return (f"nodes={nodes} rounds={len(rounds)} dra_pods_per_s={rate(DRA_SHARE):.1f} "
            f"plugin_pods_per_s={rate(PLUGIN_SHARE):.1f} "
            f"default_pods_per_s={rate(WHOLE):.1f} dra_ratio={ratio(DRA_SHARE):.2f} "
            f"plugin_ratio={ratio(PLUGIN_SHARE):.2f}")


if __name__ == "__main__":
    sys.exit(main())
