"""egpu-kube-scheduler end to end: its plugin, EgpuShares, places Deployments' replicas on a dev
cluster (issue 24, docs/scheduler.md "The placement inside kube-scheduler").

The module fixture runs egpu-kube-scheduler, built from this checkout, as a second scheduler
beside the dev cluster's, with one profile, ``egpu-plugin-e2e``
(``devcluster.plugin_scheduler.PluginSchedulerProcess``), on 127.0.0.1. The tests' pods name that
scheduler and select this module's kwok nodes by label; kwok plays their kubelets (admission,
Running). Pods are created WITHOUT the webhook, so they carry ``egpu.io/gpu: 1`` themselves.
The plugin reads egpu's config file, written by the fixture as the extender's would be; its
default compute policy (elastic, not egpu's strict) shows in every record the plugin writes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster.plugin_scheduler import PluginSchedulerProcess
from egpu.booking import CardBooking, record_bookings
from egpu.contract import ANN_ALLOCATION, ANN_INVENTORY
from egpu.records import Allocation, Inventory
from scheduler.kube import ApiStatusError, RawApi
from tests.e2e.kwok_nodes import replace_node

pytestmark = pytest.mark.e2e

SCHEDULER = "egpu-plugin-e2e"
LABEL = {"egpu-e2e": "plugin"}
SHARES_PER_CARD = devnodes.DEFAULT_SHARES_PER_CARD
CONFIG_COMPUTE_POLICY = "elastic"  # egpu's default is strict: the records show which was read
CARD_MIB = 24000
NS = "egpu-plugin-e2e"
_wait = devcluster.wait_until


class Env:
    def __init__(self, cluster: Any, scheduler: PluginSchedulerProcess) -> None:
        self.cluster = cluster
        self.api = RawApi(cluster.api_client())
        self.scheduler = scheduler
        self.nodes: list[str] = []

    def add_node(self, name: str, cards: int) -> None:
        body = devnodes.node_manifest({"name": name, "labels": LABEL, "cards": {
            "count": cards, "model": "NVIDIA A10", "memoryMiB": CARD_MIB}}, SHARES_PER_CARD)
        replace_node(self.api, self.cluster.api_client(), body)
        self.nodes.append(name)

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.api.json(
            "GET", f"/api/v1/namespaces/{NS}/pods")["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def deployment(self, name: str, replicas: int, containers: list[dict[str, Any]],
                   init_containers: list[dict[str, Any]] | None = None) -> None:
        template: dict[str, Any] = {
            "metadata": {"labels": {"app": name}},
            "spec": {"schedulerName": SCHEDULER, "nodeSelector": LABEL,
                     "terminationGracePeriodSeconds": 0, "containers": containers,
                     **({"initContainers": init_containers} if init_containers else {})}}
        self.api.json("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", body={
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": template}})

    def scale(self, name: str, replicas: int) -> None:
        self.api.json("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/{name}/scale",
                      body={"spec": {"replicas": replicas}},
                      content_type="application/merge-patch+json")

    def cleanup(self) -> None:
        """The namespace, then the nodes once no pod of the namespace is left (the next
        module of the kwok lane reads every pod's record and the node it names)."""
        with contextlib.suppress(ApiStatusError):
            self.api.json("DELETE", f"/api/v1/namespaces/{NS}")
        _wait(f"the pods of {NS} gone", lambda: not self.api.json(
            "GET", f"/api/v1/namespaces/{NS}/pods")["items"], timeout=120)
        for name in self.nodes:
            with contextlib.suppress(ApiStatusError):
                self.api.json("DELETE", f"/api/v1/nodes/{name}")


@pytest.fixture(scope="module")
def env(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    work = tmp_path_factory.mktemp("egpu-plugin-e2e")
    egpu_config = work / "egpu-config.yaml"
    egpu_config.write_text(yaml.safe_dump({
        "sharesPerCard": SHARES_PER_CARD, "heartbeatTimeoutSeconds": 3600,
        "defaults": {"computePolicy": CONFIG_COMPUTE_POLICY}}))
    scheduler = PluginSchedulerProcess(str(cluster.kubeconfig), work, SCHEDULER, egpu_config)
    handle = Env(cluster, scheduler)
    cluster.ensure_namespace(NS)
    try:
        scheduler.start()
        yield handle
    finally:
        handle.cleanup()
        scheduler.stop()
        print(f"egpu-kube-scheduler log: {scheduler.log}")


def share(name: str, memory_mib: int, cores: int = 0, gpus: int = 1) -> dict[str, Any]:
    limits = {"egpu.io/gpu": str(gpus), "egpu.io/gpu-memory": str(memory_mib)}
    if cores:
        limits["egpu.io/gpu-cores"] = str(cores)
    return {"name": name, "image": "busybox", "resources": {"limits": limits}}


def record(pod: dict[str, Any]) -> Allocation | None:
    text = (pod["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
    return Allocation.decode(text) if text else None


def assert_no_card_overbooked(env: Env, pods: list[dict[str, Any]]) -> None:
    """Every live pod's record, summed per card: within the card's MiB, 100% of its cores
    and its share slots; each record names the node the pod is bound to and the config file's
    default compute policy, and no share pod is bound without one."""
    totals: dict[tuple[str, str], CardBooking] = {}
    for p in pods:
        a = record(p)
        if a is None:
            asks = any(name.startswith("egpu.io/") for c in p["spec"]["containers"]
                       for name in c.get("resources", {}).get("limits", {}))
            assert not (asks and p["spec"].get("nodeName")), \
                f"{p['metadata']['name']} bound without a record"
            continue
        assert a.node == p["spec"]["nodeName"], (p["metadata"]["name"], a.node)
        # the config file's default, not egpu's (strict): the plugin read the file
        assert a.compute_policy == CONFIG_COMPUTE_POLICY, (p["metadata"]["name"], a)
        for uuid, b in record_bookings(a).items():
            totals[(a.node, uuid)] = totals.get((a.node, uuid), CardBooking()) + b
    cards = {(n, c.uuid): c for n in env.nodes for c in Inventory.decode(
        env.api.json("GET", f"/api/v1/nodes/{n}")["metadata"]["annotations"][ANN_INVENTORY]
    ).cards}
    for key, used in totals.items():
        assert used.memory_mib <= cards[key].memory_mib, f"{key} booked {used}"
        assert used.cores <= 100 and used.slots <= SHARES_PER_CARD, f"{key} booked {used}"


def running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p.get("status", {}).get("phase") == "Running"]


def unschedulable_messages(pods: list[dict[str, Any]]) -> list[str]:
    return [c.get("message", "") for p in pods for c in p.get("status", {}).get("conditions", [])
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"]


def test_replicas_up_to_capacity_start_with_their_own_shares_through_a_scheduler_restart(
        env: Env) -> None:
    """A Deployment of 7000 MiB and 20% cores on 3 nodes x 4 cards of 24000 MiB (three fit a
    card: 36 in all). 18 replicas start; the scheduler is killed; the Deployment scales to
    40 while it is down; it starts again and must read what is booked from the records: 36
    run, 4 stay Pending with the plugin's reason (written by the restarted scheduler: those
    pods were created after the kill). Then the Deployment scales to 0 and back to 36: the
    shares freed are booked again.

    Bugs caught: a card overbooked (a fit kept past a change of the node, a reservation not
    held, records not read after a restart); a replica left Pending although its card has
    room (the bind gate never letting a pod through, a share never freed)."""
    for i in range(3):
        env.add_node(f"egpu-plugin-e2e-{i}", 4)
    env.deployment("shares", 18, [share("main", 7000, cores=20)])
    _wait("18 replicas running", lambda: len(running(env.pods())) == 18, timeout=120)
    env.scheduler.kill()
    env.scale("shares", 40)
    _wait("40 replicas created", lambda: len(env.pods()) == 40, timeout=60)
    assert len([p for p in env.pods() if p["spec"].get("nodeName")]) == 18
    env.scheduler.start()
    _wait("36 replicas running", lambda: len(running(env.pods())) == 36, timeout=120)
    _wait("4 replicas refused", lambda: len(unschedulable_messages(env.pods())) == 4,
          timeout=60)
    pods = env.pods()
    assert len(pods) == 40 and len(running(pods)) == 36
    assert_no_card_overbooked(env, pods)
    messages = unschedulable_messages(pods)
    assert all("24000 MiB" in m for m in messages), messages

    env.scale("shares", 0)
    _wait("every replica gone", lambda: not env.pods(), timeout=60)
    env.scale("shares", 36)
    _wait("36 replicas running again", lambda: len(running(env.pods())) == 36, timeout=120)
    assert_no_card_overbooked(env, env.pods())


def test_mixed_shapes_get_the_cards_their_containers_ask_for(env: Env) -> None:
    """Replicas with a sidecar, an init container and a two-card app share, beside one-card
    replicas and a replica without a share: each record gives every container with a share its
    kind and as many cards as it asks for, no card is overbooked, and the pod without a share
    runs too (bug caught: the plugin's Bind skipping it with no binder after it)."""
    with contextlib.suppress(ApiStatusError):  # the test before's
        env.api.json("DELETE", f"/apis/apps/v1/namespaces/{NS}/deployments/shares")
    _wait("the last test's replicas gone", lambda: not env.pods(), timeout=60)
    env.add_node("egpu-plugin-e2e-mixed", 4)
    always = {"restartPolicy": "Always"}
    env.deployment("mixed", 3, [share("app", 4000, gpus=2)],
                   init_containers=[share("setup", 2000), {**share("proxy", 1000), **always}])
    env.deployment("single", 8, [share("main", 5000)])
    env.deployment("plain", 1, [{"name": "main", "image": "busybox"}])  # no share
    _wait("12 replicas running", lambda: len(running(env.pods())) == 12, timeout=120)
    pods = env.pods()
    assert len(pods) == 12
    assert_no_card_overbooked(env, pods)
    for p in pods:
        if not p["metadata"]["name"].startswith("mixed-"):
            continue
        a = record(p)
        assert a is not None
        got = {c.name: (c.kind, len(c.cards)) for c in a.containers}
        assert got == {"setup": ("init", 1), "proxy": ("sidecar", 1), "app": ("container", 2)}, got
