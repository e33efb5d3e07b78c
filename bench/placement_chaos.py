"""Placement chaos: bursts of share pods while egpu's scheduler is SIGKILLed.

Issue 15's reliability figure. On the dev cluster (reused when ``egpu dev-cluster`` reports one
up, else started and stopped here), with the scheduler egpu installs, egpu-kube-scheduler
(kube-scheduler with egpu's plugin and the profile of manifests/scheduler), as its own process
serving ``egpu-scheduler`` (the dev cluster's kube-scheduler lets go of that profile for the
run): ``--nodes`` kwok nodes of 4 NVIDIA L4 cards (24576 MiB, ``sharesPerCard`` 4 slots each).
Each of ``--rounds`` rounds creates ``--pods`` pods of one share of 7000 MiB and 30% cores at
once (from 16 threads): a card takes 3 of them by memory and by cores before its 4 slots run
out, so memory and cores are the limits an overbooking would break; more pods than the nodes
hold, so the scheduler refuses some), SIGKILLs egpu-kube-scheduler once a random number of the
round's pods (0 to one less than the slots) are bound, starts it again ``--down`` seconds
later, waits until every slot is taken (at most 120 s; pods the plugin refused wait in the
scheduler's backoff), checks, and deletes the pods.

Counted over all rounds:
- ``overbooked``: cards whose bookings, summed as ``kubectl egpu`` sums them
  (``egpu.cluster_view``), exceed their memory, 100 cores or their slots (must be 0);
- ``lost``: pods missing after the round, and bound pods without an ``egpu.io/allocation``
  (they would start with no share) or bound to another node than their allocation (must be 0);
- ``unplaced``: rounds in which fewer pods were bound than there are slots 120 s after the
  restart while pods still waited (capacity left idle; must be 0);
- ``settle_s_max``: the longest a round took, from the restart, to fill every slot;
- ``mid_burst``: rounds whose kill came while slots were still free and pods waited (the pods
  bound once the scheduler had been down ``--down`` seconds, counted from the API, fewer than
  the slots); ``mid_burst_pct`` the same as a % of the rounds. A kill after
  every slot is taken tests nothing (a kill at a random instant of a fixed window did that in
  most rounds: egpu-kube-scheduler binds such a burst within about a second), so the kill
  follows the binds, and ``mid_burst_pct`` must be at least MID_BURST_MIN_PCT.

The last line is exactly ``rounds=N pods=N kills=N mid_burst=N mid_burst_pct=N overbooked=N
lost=N unplaced=N bound_per_round=N settle_s_max=N``. Exit status 0 when overbooked, lost and
unplaced are 0 and mid_burst_pct is at least MID_BURST_MIN_PCT.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devcluster import cluster as devcluster  # noqa: E402
from devcluster import nodes as devnodes  # noqa: E402
from devcluster.plugin_scheduler import PluginSchedulerProcess  # noqa: E402
from egpu.cluster_view import cluster_view  # noqa: E402
from egpu.config import Config  # noqa: E402
from egpu.contract import ANN_ALLOCATION, RES_CORES, RES_GPU, RES_MEMORY  # noqa: E402
from egpu.records import Allocation  # noqa: E402
from scheduler.kube import ApiStatusError, RawApi  # noqa: E402

NS = "egpu-chaos"
SHARES = devnodes.DEFAULT_SHARES_PER_CARD
CARDS = 4
CARD_MIB = 24576
SHARE_MIB = 7000  # 3 fit a card's 24576 MiB, 4 do not
SHARE_CORES = 30  # 3 fit a card's 100 %, 4 do not
KILL_POLL_S = 0.02  # how often the round looks for the binds it waits for before the SIGKILL
MID_BURST_MIN_PCT = 50  # % of rounds whose kill must come while slots were free
KILL_WAIT_S = 30.0  # a scheduler that binds nothing is still killed (and the round counted)
PER_CARD = min(SHARES, CARD_MIB // SHARE_MIB, 100 // SHARE_CORES)  # 3: before the 4 slots
SETTLE_TIMEOUT_S = 120.0  # the cards not full by then: capacity left idle (unplaced)


def add_nodes(api: RawApi, n: int) -> list[str]:
    """N kwok nodes ``chaos-N`` of CARDS L4 cards each, Ready and untainted."""
    names = []
    for i in range(n):
        name = f"chaos-{i}"
        body = devnodes.node_manifest({"name": name, "labels": {"egpu-chaos": "true"},
                                       "cards": {"count": CARDS, "model": "NVIDIA L4",
                                                 "memoryMiB": CARD_MIB}}, SHARES)
        with contextlib.suppress(ApiStatusError):
            api.json("POST", "/api/v1/nodes", body=body)
        status = {"status": {k: body["status"][k] for k in ("capacity", "allocatable")}}
        api.json("PATCH", f"/api/v1/nodes/{name}/status", body=status,
                 content_type="application/merge-patch+json")
        names.append(name)
    devnodes.wait_nodes_ready(api.client, names, timeout_s=120)
    return names


def share_pod(name: str, nodes: list[str]) -> dict[str, Any]:
    """A pod of one share (SHARE_MIB, SHARE_CORES) for egpu-scheduler, kept to the chaos
    nodes."""
    only = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    required = {"nodeSelectorTerms": [{"matchExpressions": [only]}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": devcluster.EGPU_SCHEDULER,
                     "terminationGracePeriodSeconds": 0,
                     "affinity": {"nodeAffinity": {
                         "requiredDuringSchedulingIgnoredDuringExecution": required}},
                     "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {
                         RES_GPU: "1", RES_MEMORY: str(SHARE_MIB),
                         RES_CORES: str(SHARE_CORES)}}}]}}


def pods(api: RawApi) -> list[dict[str, Any]]:
    return list(api.json("GET", f"/api/v1/namespaces/{NS}/pods")["items"])


def count_bound(api: RawApi) -> int:
    """Pods of the namespace bound to a node now."""
    return sum(1 for p in api.json("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
               if p["spec"].get("nodeName"))


def wait_bound(api: RawApi, want: int) -> None:
    """Until ``want`` pods are bound, polling every KILL_POLL_S (at most KILL_WAIT_S)."""
    deadline = time.monotonic() + KILL_WAIT_S
    while count_bound(api) < want and time.monotonic() < deadline:
        time.sleep(KILL_POLL_S)


def settle(api: RawApi, want: int) -> tuple[list[dict[str, Any]], float]:
    """The pods once ``want`` of them are bound (every slot: the round holds more pods), and
    the seconds that took; the pods as they are after SETTLE_TIMEOUT_S otherwise."""
    start = time.monotonic()
    while time.monotonic() - start < SETTLE_TIMEOUT_S:
        now_pods = pods(api)
        if sum(1 for p in now_pods if p["spec"].get("nodeName")) >= want:
            return now_pods, time.monotonic() - start
        time.sleep(0.3)
    return pods(api), time.monotonic() - start


def check(api: RawApi, names: list[str], created: list[str], config: Config
          ) -> tuple[int, int]:
    """(overbooked cards, lost pods) of the round's pods (``created``: their names)."""
    now_pods = pods(api)
    lost = len(set(created) - {p["metadata"]["name"] for p in now_pods})
    for p in now_pods:
        node = p["spec"].get("nodeName")
        text = (p["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
        if node and (not text or Allocation.decode(text).node != node):
            lost += 1
    nodes = [api.json("GET", f"/api/v1/nodes/{n}") for n in names]
    overbooked = 0
    for view in cluster_view(nodes, now_pods, config):
        for card in view.cards:
            if (card.booked_mib > card.card.memory_mib or card.booked_cores > 100
                    or len(card.shares) > SHARES):
                overbooked += 1
                print(f"overbooked: {view.name} {card.card.uuid} {card.booked_mib} MiB "
                      f"{card.booked_cores}% {len(card.shares)} shares", flush=True)
    return overbooked, lost


def delete_pods(api: RawApi) -> None:
    api.json("DELETE", f"/api/v1/namespaces/{NS}/pods", query={"gracePeriodSeconds": 0})
    devcluster.wait_until("chaos pods gone", lambda: not pods(api), timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--pods", type=int, default=36,
                    help="pods a round (the nodes hold nodes x 12)")
    ap.add_argument("--down", type=float, default=1.0, help="seconds the scheduler stays dead")
    ap.add_argument("--seed", type=int, default=15)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    state_dir = devcluster.default_state_dir()
    started = not devcluster.status(state_dir).up
    info = (devcluster.up(devcluster.Config(state_dir=state_dir)) if started
            else devcluster.ClusterInfo.load(state_dir))
    api = RawApi(info.api_client())
    work = Path(tempfile.mkdtemp(prefix="egpu-chaos-"))
    config_path = work / "egpu-config.yaml"
    config_path.write_text(yaml.safe_dump({"sharesPerCard": SHARES,
                                           "heartbeatTimeoutSeconds": 3600}))
    config = Config(shares_per_card=SHARES)
    slots = args.nodes * CARDS * PER_CARD  # what the cards hold: memory and cores bind
    kills = mid_burst = overbooked = lost = unplaced = bound_total = 0
    settle_max = 0.0
    names: list[str] = []
    scheduler: PluginSchedulerProcess | None = None
    try:
        with contextlib.suppress(ApiStatusError):
            api.json("POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        names = add_nodes(api, args.nodes)
        delete_pods(api)  # what an interrupted run left would take the first round's slots
        devnodes.refresh_heartbeats(api.client, names)
        scheduler = PluginSchedulerProcess(info.kubeconfig, work, devcluster.EGPU_SCHEDULER,
                                           config_path)  # built (if need be) first
        # the dev cluster's kube-scheduler lets go of egpu-scheduler: one scheduler a name
        with devcluster.without_egpu_profile(info):
            scheduler.start()
            try:
                for r in range(args.rounds):
                    batch = [share_pod(f"r{r:02d}-p{i:03d}", names) for i in range(args.pods)]
                    kill_after = rng.randrange(min(slots, args.pods))  # binds before the kill
                    with ThreadPoolExecutor(16) as pool:
                        creating = [pool.submit(api.json, "POST",
                                                f"/api/v1/namespaces/{NS}/pods", body=p)
                                    for p in batch]
                        wait_bound(api, kill_after)
                        scheduler.kill()
                        kills += 1
                        for f in creating:
                            f.result()
                    time.sleep(args.down)
                    at_kill = count_bound(api)  # Bindings sent before the kill have landed
                    mid_burst += at_kill < min(slots, args.pods)
                    scheduler.start()
                    final, took = settle(api, min(slots, args.pods))
                    settle_max = max(settle_max, took)
                    bound = sum(1 for p in final if p["spec"].get("nodeName"))
                    bound_total += bound
                    o, lo = check(api, names, [p["metadata"]["name"] for p in batch], config)
                    overbooked, lost = overbooked + o, lost + lo
                    unplaced += bound < min(slots, args.pods)
                    print(f"round {r + 1}: {at_kill} bound while it was down, then "
                          f"{bound}/{args.pods} (slots {slots}) in {took:.1f} s after the "
                          f"restart, overbooked {o}, lost {lo}", flush=True)
                    delete_pods(api)
            finally:
                scheduler.stop()
    finally:
        for name in names:
            with contextlib.suppress(ApiStatusError):
                api.json("DELETE", f"/api/v1/nodes/{name}")
        if started:
            devcluster.down(state_dir)
    if scheduler is not None:
        print(f"egpu-kube-scheduler log: {scheduler.log}")
    mid_burst_pct = 100 * mid_burst // max(1, args.rounds)
    print(f"rounds={args.rounds} pods={args.pods} kills={kills} mid_burst={mid_burst} "
          f"mid_burst_pct={mid_burst_pct} overbooked={overbooked} lost={lost} "
          f"unplaced={unplaced} bound_per_round={bound_total / args.rounds:.1f} "
          f"settle_s_max={settle_max:.1f}")
    tested = mid_burst_pct >= MID_BURST_MIN_PCT
    return 0 if overbooked == lost == unplaced == 0 and tested else 1


if __name__ == "__main__":
    sys.exit(main())
