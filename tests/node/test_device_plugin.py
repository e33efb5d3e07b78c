"""The device plugin over gRPC (v1beta1), driven by a test client that makes the kubelet's calls
in chosen orders (tests/node/kubelet_client.py), pods given as JSON (FC-12).

On the real kubelet (kubelet v1.37.2 + containerd): a burst of share pods all start with their
own shares (tests/e2e/test_real_node.py::test_a_burst_of_share_pods_all_start_on_the_real_kubelet),
an unmatched Allocate is refused with an event (tests/e2e/test_real_node_drills.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubelet_client import KubeletStub
from node_fixtures import CARD_UUIDS, pod_manifest

from egpu.config import Config
from egpu.records import Card, PodShares
from node_agent.cdi import CdiPublisher
from node_agent.deviceplugin import api_pb2
from node_agent.deviceplugin.service import AgentSide, EgpuDevicePlugin, PluginServer
from node_agent.deviceplugin.slots import card_of, slot_id
from node_agent.pods import PodCatchUp, PodRegistry

NODE = "node-dp"
SHARES = 4


@dataclass
class Rig:
    kubelet: KubeletStub
    server: PluginServer
    registry: PodRegistry
    cards: list[Card]
    folder: str


@contextlib.contextmanager
def make_rig(**options: Any) -> Iterator[Rig]:
    """A plugin served to a stub kubelet; ``options(registry, folder)`` -> the plugin's
    keyword options (catch_up, pod_wait_s, cdi)."""
    folder = tempfile.mkdtemp(prefix="egpu-dp-", dir="/tmp")  # unix socket paths are short
    cards = [Card(u, i, "NVIDIA A10", 24576, numa_node=i // 4) for i, u in enumerate(CARD_UUIDS)]
    registry = PodRegistry(NODE, Config(shares_per_card=SHARES), f"{folder}/private",
                           f"{folder}/runtime")
    build = options.pop("options", None)
    plugin = EgpuDevicePlugin.from_functions(
        lambda: tuple(cards), SHARES, registry.pending, registry.consume, NODE,
        **(build(registry, folder) if build else {}))
    kubelet = KubeletStub(f"{folder}/plugins")
    kubelet.start()
    server = PluginServer(plugin, f"{folder}/plugins")
    assert server.ensure()
    kubelet.wait_for_list(1)
    try:
        yield Rig(kubelet, server, registry, cards, folder)
    finally:
        plugin.stop()
        server.stop()
        kubelet.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def rig() -> Iterator[Rig]:
    with make_rig() as made:
        yield made


def test_registration_and_slots(rig: Rig) -> None:
    request = rig.kubelet.requests[0]
    assert (request.version, request.endpoint, request.resource_name) == \
        ("v1beta1", rig.server.endpoint, "egpu.io/gpu")
    assert request.options.get_preferred_allocation_available
    devices = rig.kubelet.devices
    assert len(devices) == 8 * SHARES and all(d.health == "Healthy" for d in devices)
    first_id = devices[0].ID
    assert first_id == slot_id(CARD_UUIDS[0], 0)
    # no NUMA topology although the cards have one (4 and 4): with the Topology Manager on,
    # the kubelet offered only the lowest NUMA node's slots, and a share the extender booked
    # on a card of NUMA node 1 was refused at Allocate
    assert {c.numa_node for c in rig.cards} == {0, 1}
    assert not any(d.HasField("topology") for d in devices)


def test_allocation_file_is_written_for_the_hook(rig: Rig) -> None:
    rig.registry.update(pod_manifest("p", NODE, {"main": [(2, 1000, 10)]}, uid="uid-f"))
    path = os.path.join(rig.folder, "private", "allocations", "uid-f.json")
    with open(path, encoding="utf-8") as handle:
        record = PodShares.decode(handle.read())
    assert record.allocation.containers[0].uuids == (CARD_UUIDS[2],)
    assert record.priority == "high" and record.compute_policy == "strict"


def test_fc12_opposite_order_each_gets_its_own(rig: Rig) -> None:
    rig.registry.update(pod_manifest("first", NODE, {"main": [(0, 4096, 30)]}, uid="uid-1"))
    rig.registry.update(pod_manifest("second", NODE, {"main": [(1, 4096, 30)]}, uid="uid-2"))
    envs_second = rig.kubelet.allocate([slot_id(CARD_UUIDS[1], 2)])
    envs_first = rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 0)])
    assert (envs_second["EGPU_POD_UID"], envs_second["NVIDIA_VISIBLE_DEVICES"]) == \
        ("uid-2", CARD_UUIDS[1])
    assert (envs_first["EGPU_POD_UID"], envs_first["NVIDIA_VISIBLE_DEVICES"]) == \
        ("uid-1", CARD_UUIDS[0])
    assert envs_first["EGPU_MEMORY_LIMIT_MIB"] == "4096" and "EGPU_ALLOCATION_ERROR" not in \
        envs_first


def test_fc12_eight_card_pod_gets_eight_distinct_cards(rig: Rig) -> None:
    order = [5, 2, 7, 0, 1, 6, 3, 4]
    rig.registry.update(pod_manifest("big", NODE, {"main": [(i, 24576, 100) for i in order]},
                                     uid="uid-8"))
    available = [d.ID for d in rig.kubelet.devices]
    chosen = rig.kubelet.preferred(available, 8)
    assert len({card_of(c) for c in chosen}) == 8
    envs = rig.kubelet.allocate(chosen)
    visible = envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert visible == [CARD_UUIDS[i] for i in order] and len(set(visible)) == 8
    assert envs["EGPU_POD_UID"] == "uid-8"


def test_fc12_unmatchable_devices_fail_clearly(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(0, 4096, 30)]}, uid="uid-a"))
    refusal = rig.kubelet.allocate_refusal([slot_id(CARD_UUIDS[3], 0)])
    assert "no pod bound on node node-dp waits for a share" in refusal
    assert "fails admission and its controller replaces it" in refusal
    # nothing was handed out: the pending container still gets its own card
    assert rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 0)])["EGPU_POD_UID"] == "uid-a"


def test_fc12_same_cards_ambiguous_defers_to_the_hook(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(0, 1000, 10)]}, uid="uid-a"))
    rig.registry.update(pod_manifest("b", NODE, {"main": [(0, 8000, 50)]}, uid="uid-b"))
    envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[0], 1)])
    assert envs["NVIDIA_VISIBLE_DEVICES"] == CARD_UUIDS[0]
    assert "EGPU_POD_UID" not in envs and "EGPU_MEMORY_LIMIT_MIB" not in envs


@pytest.mark.parametrize("order", ["a-then-b", "b-then-a"])
def test_a_replica_deleted_before_its_admission_takes_no_other_replicas_share(
        rig: Rig, order: str) -> None:
    """A ReplicaSet scaled down deletes its not-yet-admitted pods first, and a kubelet that
    saw such a pod before its deletion still admits it (its Allocate comes). Bug caught: the
    agent dropped a deleting pod from the pending list at once, so its Allocate took the
    share of the replica beside it (same card, same shape) and that replica's own Allocate
    was refused (FAILED_PRECONDITION): a Deployment's surviving replica never started."""
    first = pod_manifest("web-a", NODE, {"app": [(0, 4096, 20)]}, uid="uid-a")
    rig.registry.update(first)
    rig.registry.update(pod_manifest("web-b", NODE, {"app": [(0, 4096, 20)]}, uid="uid-b"))
    first["metadata"]["deletionTimestamp"] = "2026-12-05T20:00:00Z"
    rig.registry.update(first)
    slots = [slot_id(CARD_UUIDS[0], 0), slot_id(CARD_UUIDS[0], 1)]
    for device in (slots if order == "a-then-b" else slots[::-1]):
        envs = rig.kubelet.allocate([device])  # refused: raises
        assert envs["NVIDIA_VISIBLE_DEVICES"] == CARD_UUIDS[0]
    assert rig.registry.pending() == []


def test_preferred_allocation_follows_the_first_seen_pod(rig: Rig) -> None:
    rig.registry.update(pod_manifest("a", NODE, {"main": [(6, 1000, 10)]}, uid="uid-a"))
    rig.registry.update(pod_manifest("b", NODE, {"main": [(3, 1000, 10)]}, uid="uid-b"))
    chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 1)
    assert card_of(chosen[0]) == CARD_UUIDS[6]
    rig.kubelet.allocate(chosen)
    chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 1)
    assert card_of(chosen[0]) == CARD_UUIDS[3]


def test_unhealthy_card_is_streamed(rig: Rig) -> None:
    before = rig.kubelet.lists
    rig.cards[3] = Card(CARD_UUIDS[3], 3, "NVIDIA A10", 24576, healthy=False)
    rig.server.plugin.notify()
    devices = rig.kubelet.wait_for_list(before + 1)
    bad = {d.ID for d in devices if d.health == "Unhealthy"}
    assert bad == {slot_id(CARD_UUIDS[3], k) for k in range(SHARES)}


def test_registers_again_after_a_kubelet_restart(rig: Rig) -> None:
    rig.kubelet.restart()
    assert rig.server.ensure()
    assert len(rig.kubelet.requests) == 2
    rig.kubelet.wait_for_list(2)
    assert not rig.server.ensure()  # nothing changed: no third registration


# --- the kubelet asks before the agent's pod watch delivered the pod -------------------------
LATE_S = 0.3  # the watch delivers the pod this long after the kubelet's call starts
WAIT_S = 1.0  # the plugin's bound on waiting for a pod in these tests (s)
SLACK_S = 1.5  # scheduling slack of a loaded test machine (s)


def waiting(list_pods: Any = None, wait_s: float = WAIT_S) -> Any:
    """Plugin options: catch up with a PodCatchUp over the rig's registry."""
    def options(registry: PodRegistry, _folder: str) -> dict[str, Any]:
        return {"catch_up": PodCatchUp(registry, list_pods), "pod_wait_s": wait_s}
    return options


def deliver_later(registry: PodRegistry, pod: dict, delay_s: float = LATE_S) -> threading.Thread:
    """As the pod watch would: record ``pod`` in ``delay_s`` seconds."""
    def deliver() -> None:
        time.sleep(delay_s)
        registry.update(pod)
    thread = threading.Thread(target=deliver, daemon=True)
    thread.start()
    return thread


def test_allocate_waits_for_a_pod_the_watch_delivers_after_the_call_started() -> None:
    with make_rig(options=waiting(wait_s=5.0)) as rig:
        # timed from before the delivery starts: the pod cannot be there sooner than LATE_S
        # after it (timed after, a loaded machine let the delivery's sleep start first)
        start = time.monotonic()
        late = deliver_later(rig.registry, pod_manifest(
            "late", NODE, {"main": [(2, 4096, 30)]}, uid="uid-late"))
        envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[2], 0)])
        took = time.monotonic() - start
        late.join()
    assert "EGPU_ALLOCATION_ERROR" not in envs, envs
    assert (envs["EGPU_POD_UID"], envs["NVIDIA_VISIBLE_DEVICES"]) == ("uid-late", CARD_UUIDS[2])
    assert LATE_S <= took < LATE_S + SLACK_S


def test_allocate_refuses_after_a_bounded_wait_when_the_pod_never_arrives() -> None:
    with make_rig(options=waiting()) as rig:
        start = time.monotonic()
        refusal = rig.kubelet.allocate_refusal([slot_id(CARD_UUIDS[4], 0)])
        took = time.monotonic() - start
    assert "no pod bound on node node-dp waits for a share" in refusal
    assert WAIT_S <= took < WAIT_S + SLACK_S


def test_allocate_finds_a_pod_the_watch_missed_by_listing_the_nodes_pods() -> None:
    pod = pod_manifest("missed", NODE, {"main": [(5, 4096, 30)]}, uid="uid-missed")
    asked: list[float] = []

    def list_pods(timeout_s: float) -> list[dict]:
        asked.append(timeout_s)
        return [pod]

    with make_rig(options=waiting(list_pods, wait_s=5.0)) as rig:
        start = time.monotonic()
        envs = rig.kubelet.allocate([slot_id(CARD_UUIDS[5], 1)])
        took = time.monotonic() - start
    assert envs["EGPU_POD_UID"] == "uid-missed" and "EGPU_ALLOCATION_ERROR" not in envs
    assert len(asked) == 1 and 0 < asked[0] <= 5.0
    assert took < SLACK_S  # one LIST, no waiting for the watch


def test_allocate_refuses_right_after_a_list_without_the_pod() -> None:
    """A LIST is a consistent read: when the API server has no pod for these cards either,
    waiting longer cannot help (and would hold up the kubelet's admissions)."""
    asked: list[float] = []

    def list_pods(timeout_s: float) -> list[dict]:
        asked.append(timeout_s)
        return [pod_manifest("other", NODE, {"main": [(0, 4096, 30)]}, uid="uid-other")]

    with make_rig(options=waiting(list_pods, wait_s=5.0)) as rig:
        start = time.monotonic()
        refusal = rig.kubelet.allocate_refusal([slot_id(CARD_UUIDS[3], 0)])
        took = time.monotonic() - start
    assert "no pod bound on node node-dp waits for a share" in refusal
    assert len(asked) == 1 and took < SLACK_S


def test_a_request_that_can_never_match_is_refused_without_waiting() -> None:
    with make_rig(options=waiting(wait_s=5.0)) as rig:
        start = time.monotonic()
        refusal = rig.kubelet.allocate_refusal([slot_id(CARD_UUIDS[1], 0),
                                                 slot_id(CARD_UUIDS[1], 1)])
        took = time.monotonic() - start
    assert "a share needs distinct cards" in refusal
    assert took < SLACK_S


def test_preferred_allocation_waits_for_a_late_pod_and_steers_to_its_card() -> None:
    with make_rig(options=waiting(wait_s=5.0)) as rig:
        late = deliver_later(rig.registry, pod_manifest(
            "late", NODE, {"main": [(6, 1000, 10)]}, uid="uid-late"))
        chosen = rig.kubelet.preferred([d.ID for d in rig.kubelet.devices], 1)
        late.join()
        envs = rig.kubelet.allocate(chosen)
    assert card_of(chosen[0]) == CARD_UUIDS[6]  # without waiting: the emptiest card, 0
    assert envs["EGPU_POD_UID"] == "uid-late"


# --- CDI devices in Allocate ------------------------------------------------------------------
NVIDIA_SPEC_BY_UUID = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + "".join(
    f"  - name: '{i}'\n    containerEdits: {{deviceNodes: [{{path: /dev/nvidia{i}}}]}}\n"
    f"  - name: {u}\n    containerEdits: {{deviceNodes: [{{path: /dev/nvidia{i}}}]}}\n"
    for i, u in enumerate(CARD_UUIDS))
NVIDIA_SPEC_BY_INDEX = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n" + "".join(
    f"  - name: '{i}'\n    containerEdits: {{deviceNodes: [{{path: /dev/nvidia{i}}}]}}\n"
    for i in range(len(CARD_UUIDS)))


def with_cdi(nvidia_spec: str | None = None, writable: bool = True) -> Any:
    """Plugin options: a CdiPublisher writing to <rig>/cdi-run (a file in its way when not
    ``writable``), an nvidia.com/gpu spec in <rig>/cdi-etc when given; no device nodes."""
    def options(_registry: PodRegistry, folder: str) -> dict[str, Any]:
        os.makedirs(f"{folder}/cdi-etc")
        if nvidia_spec is not None:
            with open(f"{folder}/cdi-etc/nvidia.yaml", "w", encoding="utf-8") as handle:
                handle.write(nvidia_spec)
        if not writable:
            with open(f"{folder}/cdi-run", "w", encoding="utf-8") as handle:
                handle.write("")
        publisher = CdiPublisher(f"{folder}/cdi-run", [f"{folder}/cdi-etc", f"{folder}/cdi-run"],
                                 "/usr/local/egpu/bin/egpu-hook", present=lambda _path: False)
        cards = [Card(u, i, "NVIDIA A10", 24576) for i, u in enumerate(CARD_UUIDS)]
        assert publisher.publish(cards) is writable
        return {"cdi": publisher.names}
    return options


def two_card_pod(rig: Rig) -> list[str]:
    rig.registry.update(pod_manifest("p", NODE, {"main": [(5, 4096, 30), (2, 4096, 30)]},
                                     uid="uid-2c"))
    return [slot_id(CARD_UUIDS[2], 0), slot_id(CARD_UUIDS[5], 0)]


def cdi_names(rig: Rig, ids: list[str]) -> list[str]:
    return [d.name for d in rig.kubelet.allocate_response(ids).cdi_devices]


def test_allocate_names_the_containers_cards_as_egpu_cdi_devices() -> None:
    with make_rig(options=with_cdi()) as rig:
        names = cdi_names(rig, two_card_pod(rig))
        assert os.path.isfile(f"{rig.folder}/cdi-run/egpu.json")
    assert names == [f"egpu.io/gpu={CARD_UUIDS[5]}", f"egpu.io/gpu={CARD_UUIDS[2]}"]


@pytest.mark.parametrize(("spec", "vendor_names"), [
    (NVIDIA_SPEC_BY_UUID, [CARD_UUIDS[5], CARD_UUIDS[2]]),
    (NVIDIA_SPEC_BY_INDEX, ["5", "2"]),
])
def test_allocate_adds_the_nvidia_cdi_devices_when_their_spec_exists(
        spec: str, vendor_names: list[str]) -> None:
    with make_rig(options=with_cdi(spec)) as rig:
        names = cdi_names(rig, two_card_pod(rig))
    assert names == [f"egpu.io/gpu={CARD_UUIDS[5]}", f"egpu.io/gpu={CARD_UUIDS[2]}",
                     *(f"nvidia.com/gpu={n}" for n in vendor_names)]


def test_ambiguous_allocate_still_names_the_cards_so_that_the_hook_runs() -> None:
    with make_rig(options=with_cdi()) as rig:
        rig.registry.update(pod_manifest("a", NODE, {"main": [(0, 1000, 10)]}, uid="uid-a"))
        rig.registry.update(pod_manifest("b", NODE, {"main": [(0, 8000, 50)]}, uid="uid-b"))
        names = cdi_names(rig, [slot_id(CARD_UUIDS[0], 1)])
    assert names == [f"egpu.io/gpu={CARD_UUIDS[0]}"]


@pytest.mark.parametrize("options", [None, with_cdi(writable=False)],
                         ids=["cdi-disabled", "spec-not-written"])
def test_without_an_egpu_cdi_spec_allocate_names_no_cdi_device(options: Any) -> None:
    with make_rig(options=options) as rig:
        names = cdi_names(rig, two_card_pod(rig))
    assert names == []


class _Agent:
    """An ``AgentSide`` of its own (methods, not ``AgentFunctions``): the plugin's one
    boundary with the node agent."""

    catch_up = None
    cdi_names = None

    def __init__(self, registry: PodRegistry, cards: list[Card]) -> None:
        self.registry, self._cards = registry, tuple(cards)
        self.consumed: list[tuple[str, str]] = []

    def cards(self) -> tuple[Card, ...]:
        return self._cards

    def pending(self) -> list[Any]:
        return self.registry.pending()

    def consume(self, pod_uid: str, container: str) -> None:
        self.consumed.append((pod_uid, container))
        self.registry.consume(pod_uid, container)


def test_the_plugin_takes_what_it_needs_through_one_agent_side(tmp_path: Any) -> None:
    registry = PodRegistry(NODE, Config(shares_per_card=SHARES), str(tmp_path / "private"),
                           str(tmp_path / "runtime"))
    agent = _Agent(registry, [Card(u, i, "NVIDIA A10", 24576) for i, u in enumerate(CARD_UUIDS)])
    side: AgentSide = agent
    plugin = EgpuDevicePlugin(side, SHARES, NODE)
    assert len(plugin.device_list().devices) == len(CARD_UUIDS) * SHARES
    registry.update(pod_manifest("p", NODE, {"main": [(1, 4096, 30)]}, uid="uid-p"))
    ask = api_pb2.ContainerAllocateRequest(devices_ids=[slot_id(CARD_UUIDS[1], 0)])
    answer = plugin.Allocate(api_pb2.AllocateRequest(container_requests=[ask]), None)  # type: ignore[arg-type]
    envs = dict(answer.container_responses[0].envs)
    assert (envs["EGPU_POD_UID"], envs["NVIDIA_VISIBLE_DEVICES"]) == ("uid-p", CARD_UUIDS[1])
    assert agent.consumed == [("uid-p", "main")] and registry.pending() == []


# --- node agent rolls: the new agent serves beside the old one -----------------------------------
def test_a_new_agent_takes_over_while_the_old_one_still_serves_and_the_old_ones_end_leaves_it(
        rig: Rig) -> None:
    """A DaemonSet roll with surge: the new agent registers its own socket beside the old
    one; the kubelet moves to it; the old agent stopping removes only its own socket. Bug
    caught: both on egpu.sock, the new agent's start unlinked the old one's socket and the
    old one's end removed the new one's: the node offered 0 slots in between (pods created
    during a roll failed with UnexpectedAdmissionError)."""
    old = rig.server
    new_plugin = EgpuDevicePlugin.from_functions(lambda: tuple(rig.cards), SHARES,
                                                 rig.registry.pending, rig.registry.consume,
                                                 NODE)
    new = PluginServer(new_plugin, f"{rig.folder}/plugins")
    try:
        lists = rig.kubelet.lists
        assert new.ensure() and new.endpoint != old.endpoint
        rig.kubelet.wait_for_list(lists + 1)
        assert rig.kubelet.requests[-1].endpoint == new.endpoint
        assert os.path.exists(old.socket) and os.path.exists(new.socket)
        old.stop()
        assert not os.path.exists(old.socket) and os.path.exists(new.socket)
        assert new.serving and not new.ensure()  # nothing to do: still registered
        rig.registry.update(pod_manifest("p", NODE, {"main": [(1, 1000, 10)]}, uid="uid-h"))
        assert rig.kubelet.allocate([slot_id(CARD_UUIDS[1], 0)])["EGPU_POD_UID"] == "uid-h"
    finally:
        new_plugin.stop()
        new.stop()


def test_the_agent_is_ready_only_once_the_kubelet_has_its_slots(tmp_path: Any) -> None:
    """/healthz (the DaemonSet's readiness probe): 503 until registered and listed, then 200;
    a roll's old agent is stopped only then."""
    import socket
    import urllib.error
    import urllib.request

    from node_agent.metrics import http

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = {"now": False}
    http.serve(port, lambda: ready["now"], host="127.0.0.1")

    def status() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert status() == 503
    ready["now"] = True
    assert status() == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert b"# HELP" in r.read()
