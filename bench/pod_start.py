"""Pod start throughput on a real node: N share pods against the same N pods without egpu
resources, side by side in one run (issue 21).

On a real node (kubelet v1.37.2 + containerd 2.x + runc, four fake 81559 MiB cards;
devcluster.realnode) with egpu installed by ``kubectl apply -k`` (bench/node_restarts.py's
``start_cluster``), each round creates ``--pods`` pods at once (one thread each), notes when
each is first seen Running (a LIST every ``POLL_S``), deletes them and waits until they are
gone. Rounds alternate: plain, share, plain, share, ... (``--rounds`` of each), so that a
slower machine moment hits both kinds alike. Share pods ask for one card and ``SHARE_MIB``
(40 of them fill the 4 cards' 40 slots: every card change meets the bind gate); plain pods
are the same pods without egpu resources; both run the egpu image, sleeping.

    .venv/bin/python bench/pod_start.py [--pods 40] [--rounds 2] [--state-dir DIR]

Last line: ``pods=N share_p50_s=.. share_p99_s=.. plain_p50_s=.. plain_p99_s=..
start_ratio=..`` (seconds from a pod's create call to Running, over every round of a kind;
``start_ratio``: share pods per second over plain pods per second, each the median round's
N / (time from the round's first create to its last pod Running)). Target: start_ratio >= 0.8
at N = 40. Exit status 1 when a pod did not start within ``START_TIMEOUT_S``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import node_restarts as nr  # noqa: E402
from devcluster import cluster as devcluster  # noqa: E402
from devcluster import images as devimages  # noqa: E402
from devcluster import realnode  # noqa: E402
from egpu.contract import RES_GPU, RES_MEMORY  # noqa: E402
from scheduler.kube import ApiStatusError, RawApi  # noqa: E402
from testbed import realnode_install as inst  # noqa: E402
from testbed.stats import percentile  # noqa: E402

NODE = "egpu-real-start"
NS = nr.NS
LABEL = "egpu-bench=pod-start"
CARDS = tuple((f"GPU-5a5a0000-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3", 81559, 0)
              for i in range(4))
SHARE_MIB = 1000
POLL_S = 0.25
START_TIMEOUT_S = 600.0


def pod(name: str, share: bool) -> dict[str, Any]:
    """A share pod (one card, SHARE_MIB) or the same pod without egpu resources; both sleep
    (what is measured is the start: webhook, placement, device plugin, hook; the e2e density
    tests check what the shares see)."""
    key, _, value = LABEL.partition("=")
    limits: dict[str, str] = {"cpu": inst.PROBE_CPU, "memory": inst.PROBE_MEMORY}
    command = ["python3", "-c", "import time; time.sleep(3600)"]
    if share:
        limits |= {RES_GPU: "1", RES_MEMORY: str(SHARE_MIB)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {key: value}},
        "spec": {"nodeSelector": {inst.REAL_LABEL: "true"},
                 "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "c", "image": devimages.IMAGE_EGPU,
                                 "command": command, "resources": {"limits": limits}}]},
    }


def run_round(api: RawApi, count: int, share: bool, tag: str) -> tuple[list[float], float]:
    """Create ``count`` pods at once; (each pod's create-to-Running seconds, the round's
    first create to last Running)."""
    names = [f"{tag}-{i}" for i in range(count)]
    created: dict[str, float] = {}

    def create(name: str) -> None:
        created[name] = time.monotonic()
        api.json("POST", f"/api/v1/namespaces/{NS}/pods", body=pod(name, share))

    threads = [threading.Thread(target=create, args=(n,)) for n in names]
    first = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    running: dict[str, float] = {}
    deadline = first + START_TIMEOUT_S
    while len(running) < count and time.monotonic() < deadline:
        now = time.monotonic()
        items = api.json("GET", f"/api/v1/namespaces/{NS}/pods",
                         query={"labelSelector": LABEL})["items"]
        for item in items:
            name = item["metadata"]["name"]
            if name in created and name not in running \
                    and item.get("status", {}).get("phase") == "Running":
                running[name] = now
            if item.get("status", {}).get("phase") == "Failed":
                print(f"  {name} Failed: {item['status'].get('message')}", flush=True)
        time.sleep(POLL_S)
    missing = sorted(set(names) - set(running))
    if missing:
        raise SystemExit(f"pods not Running after {START_TIMEOUT_S:.0f} s: {missing}")
    api.json("DELETE", f"/api/v1/namespaces/{NS}/pods",
             query={"labelSelector": LABEL, "gracePeriodSeconds": "1"})
    gone_by = time.monotonic() + 300
    while time.monotonic() < gone_by and api.json(
            "GET", f"/api/v1/namespaces/{NS}/pods", query={"labelSelector": LABEL})["items"]:
        time.sleep(1.0)
    return [running[n] - created[n] for n in names], max(running.values()) - first


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each kind")
    parser.add_argument("--state-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="egpu-pod-start-"))
    realnode.remove_all(state_dir)
    devcluster.down(state_dir)
    info = devcluster.up(devcluster.Config(state_dir=state_dir, egpu_profile=False))
    try:
        cluster = nr.Cluster(info, realnode.add(info, name=NODE, cards=CARDS))
        work = state_dir / "pod-start"
        ca = inst.create_webhook_tls(cluster, work)
        cluster.kubectl("apply", "-k", str(inst.kustomization(work / "kustomize")), timeout=120)
        inst.inject_ca(cluster, ca)
        inst.wait_installed(cluster)
        api = RawApi(info.api_client())
        nr.ensure_namespace(cluster, api)
        times: dict[bool, list[float]] = {False: [], True: []}
        rates: dict[bool, list[float]] = {False: [], True: []}
        for r in range(args.rounds):
            for share in (False, True):
                kind = "share" if share else "plain"
                starts, span = run_round(api, args.pods, share, f"{kind}{r}")
                times[share] += starts
                rates[share].append(args.pods / span)
                print(f"round {r} {kind}: {args.pods} pods Running in {span:.1f} s "
                      f"(p50 {percentile(starts, 0.5):.1f} s, max {max(starts):.1f} s)",
                      flush=True)
    except ApiStatusError as exc:
        print(f"API error: {exc}", file=sys.stderr)
        return 1
    finally:
        realnode.remove_all(state_dir)
        devcluster.down(state_dir)
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    print(f"pods={args.pods} share_p50_s={percentile(times[True], 0.5):.2f} "
          f"share_p99_s={percentile(times[True], 0.99):.2f} "
          f"plain_p50_s={percentile(times[False], 0.5):.2f} "
          f"plain_p99_s={percentile(times[False], 0.99):.2f} start_ratio={ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
