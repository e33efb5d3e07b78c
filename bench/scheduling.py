"""Scheduling throughput: pods bound per second, egpu-scheduler vs default-scheduler.

    python bench/scheduling.py [--nodes 1000] [--pods 1000] [--cards 8]

On the dev cluster (reused when ``egpu dev-cluster`` reports one up, else started and stopped
here): adds N kwok nodes of C cards each with both ``nvidia.com/gpu: C`` and ``egpu.io/gpu:
C x sharesPerCard`` and the node agent's inventory annotations, and waits until they are
Ready and untainted (``devcluster.nodes.wait_nodes_ready``); starts the extender (``python -m
scheduler.main``) and points the dev cluster's kube-scheduler at it
(``devcluster.set_extender``, restored at the end). Then, in
one run, for each scheduler: P whole-card pods (``nvidia.com/gpu: 1`` for default-scheduler,
``egpu.io/gpu: 1`` = a whole card's memory for egpu-scheduler) are created with a scheduling
gate, the gates are lifted from 16 threads, and the rate is P / (last bind - first ungate).
Pods are deleted between the two runs.

Everything (etcd, API server, schedulers, kwok, extender, this client) shares the machine's
cores; the ungating rate is printed so that a client-bound run can be told apart.

Last line: ``nodes=N egpu_pods_per_s=N default_pods_per_s=N ratio=N`` (ratio = egpu/default).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster.cluster import wait_until
from devcluster.extender import ExtenderProcess
from scheduler.kube import ApiStatusError, RawApi

REPO = Path(__file__).resolve().parents[1]
GATE = "egpu.io/bench"
NS = "egpu-bench"
SHARES = devnodes.DEFAULT_SHARES_PER_CARD




def add_nodes(api: RawApi, n: int, cards: int) -> list[str]:
    """N kwok nodes ``bench-NNNN`` with C H100-sized cards and both GPU resources."""
    def one(i: int) -> str:
        name = f"bench-{i:04d}"
        body = devnodes.node_manifest({"name": name, "labels": {"egpu-bench": "true"},
                                       "cards": {"count": cards, "model": "NVIDIA H100",
                                                 "memoryMiB": 81559}}, SHARES)
        for key in ("capacity", "allocatable"):
            body["status"][key]["nvidia.com/gpu"] = str(cards)
        with contextlib.suppress(ApiStatusError):
            api.json("POST", "/api/v1/nodes", body=body)
        status = {"status": {k: body["status"][k] for k in ("capacity", "allocatable")}}
        api.json("PATCH", f"/api/v1/nodes/{name}/status", body=status,
                 content_type="application/merge-patch+json")
        return name

    with ThreadPoolExecutor(16) as pool:
        names = list(pool.map(one, range(n)))
    # a new Node carries the not-ready taint until kwok reports it Ready
    devnodes.wait_nodes_ready(api.client, names, timeout_s=300, interval_s=1.0)
    return names


def delete_nodes(api: RawApi, n: int) -> None:
    """Remove the bench nodes (missing ones are fine)."""
    def one(i: int) -> None:
        with contextlib.suppress(ApiStatusError):
            api.open("DELETE", f"/api/v1/nodes/bench-{i:04d}")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(n)))


def heartbeat(api: RawApi, names: list[str]) -> None:
    stamp = devnodes.now_rfc3339()
    body = {"metadata": {"annotations": {"egpu.io/inventory-heartbeat": stamp}}}
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: api.json("PATCH", f"/api/v1/nodes/{n}", body=body,
                                         content_type="application/merge-patch+json"), names))


def pod(name: str, scheduler: str) -> dict[str, Any]:
    resource = "nvidia.com/gpu" if scheduler == "default-scheduler" else "egpu.io/gpu"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "schedulingGates": [{"name": GATE}],
                     "nodeSelector": {"egpu-bench": "true"},
                     "containers": [{"name": "c", "image": "busybox",
                                     "resources": {"limits": {resource: "1"}}}]}}


def run(api: RawApi, scheduler: str, count: int) -> tuple[float, float]:
    """Pods/s bound, and gates lifted per second."""
    names = [f"{scheduler[:4]}-{i:05d}" for i in range(count)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: api.json("POST", f"/api/v1/namespaces/{NS}/pods",
                                         body=pod(n, scheduler)), names))
    ungate = [{"op": "remove", "path": "/spec/schedulingGates"}]
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: api.open("PATCH", f"/api/v1/namespaces/{NS}/pods/{n}",
                                         body=ungate, content_type="application/json-patch+json"),
                      names))
    ungated = time.monotonic() - t0

    def all_bound() -> bool:
        items = api.json("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
        return sum(1 for p in items if p["spec"].get("nodeName")) >= count

    wait_until(f"{count} pods bound by {scheduler}", all_bound, timeout=900, interval=0.2)
    elapsed = time.monotonic() - t0
    api.json("DELETE", f"/api/v1/namespaces/{NS}/pods", query={"gracePeriodSeconds": 0})
    wait_until("pods deleted",
               lambda: not api.json("GET", f"/api/v1/namespaces/{NS}/pods")["items"], timeout=300)
    return count / elapsed, count / ungated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--cards", type=int, default=8)
    args = parser.parse_args(argv)

    state_dir = devcluster.default_state_dir()
    started = False
    if devcluster.status(state_dir).up:
        info = devcluster.ClusterInfo.load(state_dir)
    else:
        info = devcluster.up(devcluster.Config(state_dir=state_dir))
        started = True
    work = Path(tempfile.mkdtemp(prefix="egpu-bench-"))
    api = RawApi(info.api_client())
    extender = None
    previous = (info.extender_url, info.extender_ca_file)
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
        extender = ExtenderProcess(info.kubeconfig, config, work / "extender.log")
        extender.start()
        devcluster.set_extender(info, extender.url)
        default_rate, default_ungate = run(api, "default-scheduler", args.pods)
        print(f"default-scheduler: {default_rate:.1f} pods/s "
              f"(gates lifted at {default_ungate:.0f}/s)", flush=True)
        egpu_rate, egpu_ungate = run(api, devcluster.EGPU_SCHEDULER, args.pods)
        print(f"egpu-scheduler: {egpu_rate:.1f} pods/s "
              f"(gates lifted at {egpu_ungate:.0f}/s; extender log {extender.log})",
              flush=True)
    finally:
        if extender is not None:
            extender.stop()
            devcluster.set_extender(info, *previous)
        delete_nodes(api, args.nodes)
        if started:
            devcluster.down(state_dir)
    print(f"nodes={args.nodes} egpu_pods_per_s={egpu_rate:.1f} "
          f"default_pods_per_s={default_rate:.1f} ratio={egpu_rate / default_rate:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
