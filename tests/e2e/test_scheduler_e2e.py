"""The scheduler egpu installs end to end: egpu-kube-scheduler (kube-scheduler with egpu's
plugin, EgpuShares, and the profile of manifests/scheduler) serves ``egpu-scheduler`` on a dev
cluster.

The module fixture runs egpu-kube-scheduler, built from this checkout
(``devcluster.plugin_scheduler.PluginSchedulerProcess``), on 127.0.0.1:<free port>, and
restarts the dev cluster's own kube-scheduler without its ``egpu-scheduler`` profile
(``devcluster.without_egpu_profile``), so that the plugin alone places the shares; the previous
setting comes back at the end. Pods are created WITHOUT the webhook:
the tests set ``schedulerName`` and rewrite Volcano names themselves. Each test works in its
own namespaces and, where it needs exact capacities, on its own kwok nodes
(``devcluster.nodes.node_manifest``, waited for until Ready and untainted).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.utils import parse_quantity

from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster.plugin_scheduler import PluginSchedulerProcess
from egpu.booking import CardBooking, allocation_bookings
from egpu.contract import ANN_ALLOCATION, DEFAULT_SCHEDULER_NAME, VOLCANO_ALIASES
from egpu.records import Allocation, Inventory
from egpu.requests import read_pod
from scheduler.kube import ApiStatusError, RawApi
from tests.e2e.kwok_nodes import missing, replace_node

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SHARES_PER_CARD = devnodes.DEFAULT_SHARES_PER_CARD


# --- processes -----------------------------------------------------------------------------

_wait = devcluster.wait_until


class Env:
    """What the tests use: the API (plain JSON), egpu-kube-scheduler, and helpers."""

    def __init__(self, cluster: Any, scheduler: PluginSchedulerProcess) -> None:
        self.cluster = cluster
        self.client = cluster.api_client()
        self.api = RawApi(self.client)
        self.scheduler = scheduler
        self.namespaces: list[str] = []
        self.nodes: list[str] = []

    # objects
    def namespace(self, name: str) -> str:
        self.cluster.ensure_namespace(name)
        self.namespaces.append(name)
        return name

    def add_node(self, name: str, count: int, model: str, memory: int) -> dict[str, Any]:
        """A kwok node of ``count`` cards; returns its Node object."""
        body = devnodes.node_manifest({"name": name, "labels": {"egpu-e2e": "scheduler"},
                                       "cards": {"count": count, "model": model,
                                                 "memoryMiB": memory}}, SHARES_PER_CARD)
        replace_node(self.api, self.client, body)
        self.nodes.append(name)
        return body

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind, ns = obj["kind"], obj["metadata"].get("namespace", "default")
        path = {"Pod": f"/api/v1/namespaces/{ns}/pods",
                "Deployment": f"/apis/apps/v1/namespaces/{ns}/deployments",
                "Job": f"/apis/batch/v1/namespaces/{ns}/jobs",
                "ResourceQuota": f"/api/v1/namespaces/{ns}/resourcequotas"}[kind]
        return self.api.json("POST", path, body=obj)

    def pods(self, ns: str) -> list[dict[str, Any]]:
        return self.api.json("GET", f"/api/v1/namespaces/{ns}/pods")["items"]

    def all_pods(self) -> list[dict[str, Any]]:
        return self.api.json("GET", "/api/v1/pods")["items"]

    def node(self, name: str) -> dict[str, Any]:
        return self.api.json("GET", f"/api/v1/nodes/{name}")

    def delete_pods(self, ns: str) -> None:
        self.api.json("DELETE", f"/api/v1/namespaces/{ns}/pods", query={"gracePeriodSeconds": 0})
        _wait(f"pods of {ns} gone", lambda: not self.pods(ns), timeout=60)

    def cleanup(self) -> None:
        for ns in self.namespaces:
            with contextlib.suppress(ApiStatusError):
                self.api.json("DELETE", f"/api/v1/namespaces/{ns}/pods",
                              query={"gracePeriodSeconds": 0})
                self.api.json("DELETE", f"/api/v1/namespaces/{ns}")
        for name in self.nodes:
            with contextlib.suppress(ApiStatusError):
                self.api.json("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def env(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("egpu-scheduler-e2e")
    config = workdir / "egpu-config.yaml"
    config.write_text(yaml.safe_dump({"sharesPerCard": SHARES_PER_CARD,
                                      "heartbeatTimeoutSeconds": 3600}))
    scheduler = PluginSchedulerProcess(cluster.kubeconfig, workdir, DEFAULT_SCHEDULER_NAME,
                                       config)  # built (if need be) before anything changes
    # the dev cluster's kube-scheduler lets go of egpu-scheduler: one scheduler a name
    with devcluster.without_egpu_profile(cluster.info):
        try:
            scheduler.start()
            handle = Env(cluster, scheduler)
            with cluster.heartbeats():
                yield handle
                handle.cleanup()
        finally:
            scheduler.stop()
            print(f"egpu-kube-scheduler log: {scheduler.log}")


# --- checks ----------------------------------------------------------------------------------

def allocation(pod: dict[str, Any]) -> Allocation | None:
    text = (pod["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
    return Allocation.decode(text) if text else None


def inventory_of(env: Env, node_name: str) -> dict[str, Any]:
    """Card UUID -> Card of a node."""
    text = env.node(node_name)["metadata"]["annotations"]["egpu.io/inventory"]
    return {c.uuid: c for c in Inventory.decode(text).cards}


def assert_never_overbooked(env: Env, pods: list[dict[str, Any]] | None = None) -> None:
    """Sum every live pod's allocation per card: within capacity, cores and slots."""
    totals: dict[tuple[str, str], CardBooking] = {}
    oversub: set[tuple[str, str]] = set()
    for p in pods if pods is not None else env.all_pods():
        alloc = allocation(p)
        if alloc is None or p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        request = read_pod(p).request
        for uuid, b in allocation_bookings(alloc, request).items():
            key = (alloc.node, uuid)
            totals[key] = totals.get(key, CardBooking()) + b
            if request is not None and request.memory_oversubscription:
                oversub.add(key)
    inventories: dict[str, dict[str, Any]] = {}
    for (node_name, uuid), used in totals.items():
        if node_name not in inventories:
            inventories[node_name] = inventory_of(env, node_name)
        card = inventories[node_name][uuid]
        bound = card.memory_mib * (1.5 if (node_name, uuid) in oversub else 1)
        assert used.memory_mib <= bound, f"{node_name}/{uuid} booked {used} of {card}"
        assert used.cores <= 100 and used.slots <= SHARES_PER_CARD, (node_name, uuid, used)


def bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def egpu_pod(name: str, ns: str, memory: int, *, node: str = "", containers: int = 1,
             annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": DEFAULT_SCHEDULER_NAME,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": f"c{i}", "image": "busybox",
                        "resources": {"limits": {"egpu.io/gpu": "1",
                                                 "egpu.io/gpu-memory": str(memory)}}}
                       for i in range(containers)],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}},
            "spec": spec}


def create_at_once(env: Env, pods: list[dict[str, Any]]) -> None:
    """Create all pods from parallel threads (a burst)."""
    errors: list[BaseException] = []

    def one(p: dict[str, Any]) -> None:
        try:
            env.create(p)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# --- the shared inputs ----------------------------------------------------------------------

def _translate(pod_spec: dict[str, Any]) -> None:
    """What the webhook does that matters here: scheduler name and Volcano names."""
    pod_spec["schedulerName"] = DEFAULT_SCHEDULER_NAME
    pod_spec["terminationGracePeriodSeconds"] = 0
    for c in [*pod_spec.get("containers", []), *pod_spec.get("initContainers", [])]:
        limits = c.get("resources", {}).get("limits", {})
        for alias, name in VOLCANO_ALIASES.items():
            if alias in limits:
                limits[name] = limits.pop(alias)


def _is_egpu(obj: dict[str, Any]) -> bool:
    template = obj if obj["kind"] == "Pod" else obj["spec"]["template"]
    return read_pod(template).is_egpu_pod


def test_every_input_pod_lands_where_its_comment_says(env: Env) -> None:
    inputs: Path = env.cluster.inputs / "pods"
    created: dict[str, list[str]] = {}
    for path in sorted(inputs.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            obj = copy.deepcopy(doc)
            ns = f"e2e-{obj['metadata'].get('namespace', 'default')}"
            obj["metadata"]["namespace"] = env.namespace(ns) if ns not in env.namespaces else ns
            if _is_egpu(obj):
                _translate(obj if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"])
                if obj["kind"] == "Pod":
                    _translate(obj["spec"])
            env.create(obj)
            created.setdefault(path.name, []).append(f"{ns}/{obj['metadata']['name']}")

    def pods_of(ns: str, prefix: str) -> list[dict[str, Any]]:
        return [p for p in env.pods(f"e2e-{ns}") if p["metadata"]["name"].startswith(prefix)]

    def wait_bound(ns: str, prefix: str, n: int) -> list[dict[str, Any]]:
        try:
            return _wait(f"{n} pod(s) {prefix}* bound",
                         lambda: len(bound(pods_of(ns, prefix))) >= n and bound(
                             pods_of(ns, prefix)), timeout=90)
        except AssertionError as exc:
            why = [f"{p['metadata']['name']}: {c.get('message', '')}" for p in pods_of(ns, prefix)
                   for c in p.get("status", {}).get("conditions") or []
                   if c["type"] == "PodScheduled"]
            raise AssertionError(f"{exc}; PodScheduled: {why}") from None

    def cards_of(p: dict[str, Any]) -> list[tuple[Any, Any]]:
        alloc = allocation(p)
        assert alloc is not None and alloc.node == p["spec"]["nodeName"], p["metadata"]["name"]
        inv = inventory_of(env, alloc.node)
        return [(share, inv[share.uuid]) for c in alloc.containers for share in c.cards]

    # 01: one H100 or A100 card, 24000 MiB and 50% booked
    for p in wait_bound("ml-serving", "chat-serving", 2):
        [(share, card)] = cards_of(p)
        assert ("H100" in card.model or "A100" in card.model), card
        assert (share.memory_mib, share.cores) == (24000, 50)
    # 02: two distinct cards of one node, 30000 MiB and 30% each, never the A10 node
    [job] = wait_bound("ml-training", "lora-finetune", 1)
    shares = cards_of(job)
    assert len({s.uuid for s, _ in shares}) == 2 and job["spec"]["nodeName"] != "gpu-a10-a"
    assert all((s.memory_mib, s.cores) == (30000, 30) for s, _ in shares)
    # 03: 25% of the chosen card's memory, 10% cores
    [(share, card)] = cards_of(wait_bound("research", "notebook-ana", 1)[0])
    assert share.memory_mib == card.memory_mib * 25 // 100 and share.cores == 10
    # 04: both shares, on one card (binpack, it fits), 4000 + 6000 MiB
    retrieval = wait_bound("ml-serving", "retrieval", 1)[0]
    shares = cards_of(retrieval)
    assert sorted(s.memory_mib for s, _ in shares) == [4000, 6000]
    assert len({s.uuid for s, _ in shares}) == 1
    # 05: 32000 MiB with oversubscription allowed
    [(share, _card)] = cards_of(wait_bound("ml-serving", "tts-day", 1)[0])
    assert (share.memory_mib, share.cores) == (32000, 20)
    # 06 (FC-07): init 12000 and app 8000: the card books 12000
    ocr = wait_bound("ml-serving", "ocr-with-warmup", 1)[0]
    alloc = allocation(ocr)
    assert alloc is not None
    assert {c.name: c.init for c in alloc.containers} == {"compile-engine": True, "ocr": False}
    booked = allocation_bookings(alloc, read_pod(ocr).request)
    assert [b.memory_mib for b in booked.values()] == [12000]
    # 07: Volcano names = egpu.io/gpu 1, 3000 MiB, 30%
    [(share, _card)] = cards_of(wait_bound("ml-serving", "translate-small", 1)[0])
    assert (share.memory_mib, share.cores) == (3000, 30)
    # 08: no GPU: default scheduler, no allocation
    gateway = wait_bound("web", "api-gateway", 1)[0]
    assert gateway["spec"]["schedulerName"] == "default-scheduler" and allocation(gateway) is None
    # 09: nvidia.com/gpu is not ours: never an egpu allocation (no node has nvidia.com/gpu)
    [whole] = pods_of("research", "benchmark-whole-card")
    assert whole["spec"]["schedulerName"] == "default-scheduler" and allocation(whole) is None
    # 10: invalid requests (no webhook here): the plugin keeps them Pending, saying why
    for name, needle in (("bad-cores", "gpu-cores"), ("bad-both-memory", "gpu-memory"),
                         ("bad-zero-percentage", "gpu-memory-percentage"),
                         ("bad-priority", "egpu.io/priority")):
        def unschedulable(n: str = name) -> str:
            [p] = pods_of("research", n)
            conds = p.get("status", {}).get("conditions") or []
            return next((c.get("message", "") for c in conds if c["type"] == "PodScheduled"
                         and c["status"] == "False"), "")
        message = _wait(f"{name} unschedulable", unschedulable)
        assert needle in message, message
        [p] = pods_of("research", name)
        assert not p["spec"].get("nodeName") and allocation(p) is None
    assert_never_overbooked(env)


# --- FC-10 -----------------------------------------------------------------------------------

def _settled(env: Env, ns: str, expect_bound: int, total: int, quiet_s: float = 3.0) -> None:
    """Wait until ``expect_bound`` of ``total`` pods are bound, then check nothing else binds."""
    _wait(f"{expect_bound} bound in {ns}",
          lambda: len(bound(env.pods(ns))) >= expect_bound, timeout=90)
    time.sleep(quiet_s)
    pods = env.pods(ns)
    assert len(pods) == total
    assert len(bound(pods)) == expect_bound, [p["metadata"]["name"] for p in bound(pods)]


def test_fc10_three_pods_for_one_free_24576_card_exactly_two_bind(env: Env) -> None:
    node = "e2e-fc10-l40"
    env.add_node(node, 1, "NVIDIA L40", 24576)
    ns = env.namespace("e2e-fc10")
    rounds = int(os.environ.get("EGPU_E2E_FC10_ROUNDS", "5"))
    for r in range(rounds):
        create_at_once(env, [egpu_pod(f"r{r}-p{i}", ns, 12288, node=node) for i in range(3)])
        _settled(env, ns, 2, 3)
        pods = env.pods(ns)
        [uuid] = {s.uuid for p in bound(pods) for c in allocation(p).containers for s in c.cards}
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        assert len(pending) == 1 and allocation(pending[0]) is None
        assert_never_overbooked(env, pods)
        env.delete_pods(ns)
    assert uuid


def test_fc10_sixteen_pods_of_40000_on_eight_h100(env: Env) -> None:
    node = "e2e-fc10-h100"
    env.add_node(node, 8, "NVIDIA H100 80GB HBM3", 81559)
    ns = env.namespace("e2e-fc10-h100")
    create_at_once(env, [egpu_pod(f"p{i}", ns, 40000, node=node) for i in range(17)])
    _settled(env, ns, 16, 17)
    per_card: dict[str, int] = {}
    for p in bound(env.pods(ns)):
        for c in allocation(p).containers:
            for s in c.cards:
                per_card[s.uuid] = per_card.get(s.uuid, 0) + 1
    assert sorted(per_card.values()) == [2] * 8
    assert_never_overbooked(env)
    env.delete_pods(ns)


# --- FC-11 -----------------------------------------------------------------------------------

def test_fc11_several_containers_in_one_pod(env: Env) -> None:
    node = "e2e-fc11"
    env.add_node(node, 1, "NVIDIA A16", 16384)
    ns = env.namespace("e2e-fc11")
    env.create(egpu_pod("p", ns, 4000, node=node, containers=2))
    _wait("P bound", lambda: bound(env.pods(ns)))
    env.create(egpu_pod("q", ns, 1000, node=node))
    _wait("Q bound", lambda: len(bound(env.pods(ns))) == 2)
    [p] = [x for x in env.pods(ns) if x["metadata"]["name"] == "p"]
    alloc = allocation(p)
    assert alloc is not None
    booked = allocation_bookings(alloc, read_pod(p).request)
    assert list(booked.values()) == [CardBooking(8000, 0, 2)]  # 2 of the 4 slots, 8000 MiB
    # two containers of 10000 MiB never share the one 16384 MiB card
    env.delete_pods(ns)
    env.create(egpu_pod("big", ns, 10000, node=node, containers=2))
    time.sleep(5)
    [big] = env.pods(ns)
    assert not big["spec"].get("nodeName") and allocation(big) is None
    conds = big.get("status", {}).get("conditions") or []
    assert any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conds)
    env.delete_pods(ns)


# --- the scheduler killed in a burst ---------------------------------------------------------

def test_egpu_kube_scheduler_killed_in_a_burst_of_100_loses_nothing(env: Env) -> None:
    """4 nodes x 4 cards x 4 slots = 64 shares of 4000 MiB for 100 pods; kill -9 mid-burst.
    Bugs caught: a restarted scheduler that forgets the cards its bound pods' records book
    (a card booked twice), or a pod bound with no record (or one naming another node)."""
    nodes = [f"e2e-burst-{i}" for i in range(4)]
    for name in nodes:
        env.add_node(name, 4, "NVIDIA L4", 24576)
    ns = env.namespace("e2e-burst")
    stop = threading.Event()
    violations: list[str] = []

    def sample() -> None:
        while not stop.is_set():
            try:
                assert_never_overbooked(env, env.pods(ns))
            except AssertionError as exc:
                violations.append(str(exc))
            except ApiStatusError:
                pass
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    pods = [egpu_pod(f"b{i:03d}", ns, 4000, annotations={"egpu.io/node-policy": "binpack"})
            for i in range(100)]
    only_these = {"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}
    for p in pods:
        p["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [only_these]}]}}}
    try:
        create_at_once(env, pods[:50])
        _wait("some pods bound", lambda: len(bound(env.pods(ns))) >= 10, timeout=60)
        env.scheduler.kill()
        create_at_once(env, pods[50:])
        time.sleep(2)
        env.scheduler.start()
        _settled(env, ns, 64, 100, quiet_s=5)
    finally:
        stop.set()
        sampler.join(5)
    assert not violations, violations[:3]
    final = env.pods(ns)
    assert len(final) == 100  # no pod lost
    for p in final:
        alloc = allocation(p)
        if p["spec"].get("nodeName"):
            assert alloc is not None and alloc.node == p["spec"]["nodeName"]
    assert_never_overbooked(env, final)
    env.delete_pods(ns)


# --- tenant quotas ---------------------------------------------------------------------------

def _wait_quota_admission_refuses(env: Env, pod: dict[str, Any]) -> None:
    """Wait until the quota admission plugin refuses a dry-run create of ``pod`` with
    "exceeded quota": it reads its own informer of quotas, which can lag the quota
    controller's count (until then it answers "status unknown for quota", or admits from a
    stale copy)."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods"

    def refused() -> bool:
        try:
            env.api.json("POST", path, body=pod, query={"dryRun": "All"})
        except ApiStatusError as answer:
            if "exceeded quota" in str(answer):
                return True
            if "status unknown for quota" in str(answer):
                return False
            raise
        return False

    _wait("quota admission to refuse the pod", refused, timeout=30)


def test_resource_quota_on_egpu_resources(env: Env) -> None:
    """Quotas name extended resources with the requests. prefix (limits default requests).

    Pod a exists before the quota, so the quota controller's first count includes it: a pod
    created after it could be undercounted for a while (the controller recounts from its own
    informer of pods, which can lag the admission plugin's increments, and its write then
    lowers the usage: upstream behaviour, not egpu's)."""
    ns = env.namespace("e2e-quota")
    env.create(egpu_pod("a", ns, 40000))
    env.create({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu", "namespace": ns},
                "spec": {"hard": {"requests.egpu.io/gpu": "4",
                                  "requests.egpu.io/gpu-memory": "50000"}}})
    _wait("the quota controller to count pod a", lambda: parse_quantity(env.api.json(
        "GET", f"/api/v1/namespaces/{ns}/resourcequotas/gpu").get("status", {}).get(
            "used", {}).get("requests.egpu.io/gpu-memory", "0")) == 40000)  # shown as "40k"
    _wait_quota_admission_refuses(env, egpu_pod("b", ns, 20000))
    with pytest.raises(ApiStatusError) as denied:
        env.create(egpu_pod("b", ns, 20000))
    assert denied.value.status == 403 and "exceeded quota" in str(denied.value)
    env.create(egpu_pod("c", ns, 10000))
    _wait("a and c bound", lambda: len(bound(env.pods(ns))) == 2)
    # without the requests. prefix the API accepts the quota but never enforces it
    loose = env.namespace("e2e-quota-unprefixed")
    env.create({"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "ignored", "namespace": loose},
                "spec": {"hard": {"egpu.io/gpu-memory": "1",
                                  "limits.egpu.io/gpu-memory": "1"}}})
    time.sleep(2)
    env.create(egpu_pod("d", loose, 40000))
    used = env.api.json("GET", f"/api/v1/namespaces/{loose}/resourcequotas/ignored").get(
        "status", {}).get("used", {})
    assert "egpu.io/gpu-memory" not in used or used["egpu.io/gpu-memory"] == "0"
    env.delete_pods(loose)
    env.delete_pods(ns)


# --- F2: egpu.io/allocation and the egpu.io/priority label are written once -----------------

POLICY = REPO / "manifests" / "webhook" / "allocation-policy.yaml"


def _kubectl(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kubectl", "--kubeconfig", env.cluster.kubeconfig, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_allocation_and_priority_cannot_be_edited_and_binds_still_work(env: Env) -> None:
    """The ValidatingAdmissionPolicy denies pod CREATEs carrying egpu.io/allocation and pod
    UPDATEs changing it or the egpu.io/priority label; the plugin's Binding (the pods/binding
    subresource, not a pod UPDATE) still sets the annotation."""
    applied = _kubectl(env, "apply", "-f", str(POLICY))
    assert applied.returncode == 0, applied.stderr
    try:
        node = "e2e-vap-l40"
        env.add_node(node, 1, "NVIDIA L40", 24576)
        ns = env.namespace("e2e-vap")
        # the policy takes effect within seconds (the API server's policy informer)
        hand = egpu_pod("hand", ns, 1000, annotations={ANN_ALLOCATION: "{}"})

        def denied_at_create() -> str:
            try:
                env.create(copy.deepcopy(hand))
            except ApiStatusError as exc:
                return str(exc)
            env.api.json("DELETE", f"/api/v1/namespaces/{ns}/pods/hand",
                         query={"gracePeriodSeconds": 0})
            _wait("hand gone", lambda: missing(env.api, f"/api/v1/namespaces/{ns}/pods/hand"))
            return ""

        message = _wait("the policy denies a CREATE with the annotation", denied_at_create,
                        timeout=60, interval=1.0)
        assert "egpu.io/allocation is not allowed at creation" in message, message
        pod = egpu_pod("a", ns, 12288, node=node)
        pod["metadata"].setdefault("labels", {})["egpu.io/priority"] = "low"
        env.create(pod)
        _wait("a bound", lambda: bound(env.pods(ns)), timeout=90)
        [a] = env.pods(ns)
        text = a["metadata"]["annotations"][ANN_ALLOCATION]
        assert allocation(a) is not None and allocation(a).node == node  # type: ignore[union-attr]
        lowered = text.replace('"memory_mib":12288', '"memory_mib":1')
        for args, words in (
                (["annotate", "--overwrite", "pod/a", f"{ANN_ALLOCATION}={lowered}"],
                 "egpu.io/allocation cannot be changed or removed"),
                (["annotate", "pod/a", f"{ANN_ALLOCATION}-"],
                 "egpu.io/allocation cannot be changed or removed"),
                (["label", "--overwrite", "pod/a", "egpu.io/priority=high"],
                 "egpu.io/priority cannot be changed or removed"),
                (["label", "pod/a", "egpu.io/priority-"],
                 "egpu.io/priority cannot be changed or removed"),
                # the status subresource carries metadata too
                (["patch", "pod/a", "--subresource=status", "--type=merge", "-p",
                  json.dumps({"metadata": {"annotations": {ANN_ALLOCATION: lowered}}})],
                 "egpu.io/allocation cannot be changed or removed"),
                (["patch", "pod/a", "--subresource=status", "--type=merge", "-p",
                  '{"metadata":{"labels":{"egpu.io/priority":"high"}}}'],
                 "egpu.io/priority cannot be changed or removed")):
            result = _kubectl(env, "-n", ns, *args)
            assert result.returncode != 0, (args, result.stdout)
            assert words in result.stderr and "ValidatingAdmissionPolicy" in result.stderr, (
                args, result.stderr)
        # an ephemeral container (kubectl debug) comes through its own subresource, which the
        # webhook does not see: privileged or with SYS_ADMIN it would see every card
        for context in ({"privileged": True}, {"capabilities": {"add": ["cap_sys_admin"]}}):
            debug = {"spec": {"ephemeralContainers": [{
                "name": "debug", "image": "busybox", "securityContext": context}]}}
            result = _kubectl(env, "-n", ns, "patch", "pod/a",
                              "--subresource=ephemeralcontainers", "--type=merge",
                              "-p", json.dumps(debug))
            assert result.returncode != 0, (context, result.stdout)
            assert "ephemeral container of a pod with an egpu share cannot be privileged" in (
                result.stderr), result.stderr
        # other edits of the pod still pass, an ordinary ephemeral container included
        debug = {"spec": {"ephemeralContainers": [{"name": "debug", "image": "busybox"}]}}
        added = _kubectl(env, "-n", ns, "patch", "pod/a", "--subresource=ephemeralcontainers",
                         "--type=merge", "-p", json.dumps(debug))
        assert added.returncode == 0, added.stderr
        assert _kubectl(env, "-n", ns, "annotate", "pod/a", "team=x").returncode == 0
        [after] = env.pods(ns)
        assert after["metadata"]["annotations"][ANN_ALLOCATION] == text
        assert after["metadata"]["labels"]["egpu.io/priority"] == "low"
        env.delete_pods(ns)
    finally:
        _kubectl(env, "delete", "--ignore-not-found", "-f", str(POLICY))


# --- both modes in one cluster (a migration to DRA) -------------------------------------------

def test_egpu_kube_scheduler_leaves_a_node_of_the_dra_pool_alone(env: Env) -> None:
    """A node whose agent serves DRA only says egpu.io/allocation-mode: dra (what
    node_agent.inventory writes for --no-device-plugin): a share pinned to it stays Pending
    with the plugin's reason, and binds once the node says extender again (its agent serves
    the device plugin: the node moved back to the device-plugin pool; "extender" is the
    contract's name for that mode)."""
    node = "e2e-dra-pool"
    env.add_node(node, 1, "NVIDIA L4", 24576)

    def say(mode: str) -> None:
        env.api.json("PATCH", f"/api/v1/nodes/{node}",
                     body={"metadata": {"annotations": {"egpu.io/allocation-mode": mode}}},
                     content_type="application/merge-patch+json")

    say("dra")
    ns = env.namespace("e2e-dra-pool")
    env.create(egpu_pod("share", ns, 4000, node=node))

    def refused() -> str:
        [p] = env.pods(ns)
        conds = p.get("status", {}).get("conditions") or []
        return next((c.get("message", "") for c in conds if c["type"] == "PodScheduled"
                     and c["status"] == "False"), "")

    message = _wait("the share refused on the DRA pool's node", refused, timeout=60)
    assert "egpu.io/allocation-mode: dra" in message, message
    assert not bound(env.pods(ns))
    say("extender")
    _wait("the share bound once the node is back in the device-plugin pool",
          lambda: bound(env.pods(ns)), timeout=90)
    env.delete_pods(ns)


def test_device_plugin_shares_still_schedule_beside_the_dra_device_classes(env: Env) -> None:
    """manifests/dra's DeviceClasses installed: a share pod of the device-plugin path
    (egpu.io/gpu + egpu.io/gpu-memory) still binds. A DeviceClass that maps egpu.io/gpu (the opt-in
    component manifests/dra/extended-resource) would make the kube-scheduler refuse it:
    egpu.io/gpu-memory is in no node's allocatable and backed by no DeviceClass."""
    classes = REPO / "manifests" / "dra" / "deviceclasses.yaml"
    env.cluster.kubectl("apply", "-f", str(classes))
    try:
        node = "e2e-migration"
        env.add_node(node, 1, "NVIDIA L4", 24576)
        ns = env.namespace("e2e-migration")
        env.create(egpu_pod("share", ns, 4000, node=node))
        _wait("the device-plugin share bound beside the DRA classes",
              lambda: bound(env.pods(ns)), timeout=60)
        env.delete_pods(ns)
    finally:
        env.cluster.kubectl("delete", "-f", str(classes), "--ignore-not-found", check=False)
