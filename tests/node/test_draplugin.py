"""The DRA kubelet plugin (node_agent/draplugin): the claim's CDI environment, the driver on
disk, the metrics of its shares, and the gRPC edge over unix sockets as the kubelet v1.37 calls
it (GetInfo, NotifyRegistrationStatus, NodePrepareResources / NodeUnprepareResources in v1 and
v1beta1). The decoding of a claim (the shared core egpu.dra.allocation) is tested in
tests/unit/test_dra_allocation.py."""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from egpu import card_roster
from egpu.config import Config
from egpu.dra import allocation
from egpu.dra.allocation import ClaimError
from egpu.dra.shareconfig import ShareConfigError
from egpu.records import PodShares
from node_agent.cdi import CdiPublisher
from node_agent.draplugin.cdienv import request_envs
from node_agent.draplugin.driver import DraDriver, init_only_folders
from node_agent.draplugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    registration_v1_pb2,
    registration_v1_pb2_grpc,
)
from node_agent.draplugin.service import KubeletPlugin
from node_agent.draplugin.state import ClaimStore
from node_agent.pods import PodRegistry
from tests.dra_objects import CARDS, CLAIM_UID, NODE, POD_UID, share_claim, share_pod


# --- the node's side of a prepared claim (the decoding: tests/unit/test_dra_allocation.py) ---
def test_each_request_of_a_prepared_claim_gets_its_cdi_environment() -> None:
    prepared = allocation.prepare(share_claim(), [share_pod()], NODE, CARDS)
    assert request_envs(prepared) == {"gpu": {
        "EGPU_DEVICES": f"claim-{CLAIM_UID}-gpu", "NVIDIA_VISIBLE_DEVICES": "GPU-AAAA-0001",
        f"EGPU_CLAIM_SHARE_{CLAIM_UID}_gpu": f"{CLAIM_UID}/gpu"}}


# --- the driver on disk -----------------------------------------------------------------------
class FakeReader:
    def __init__(self, claim: dict[str, Any], pod: dict[str, Any]) -> None:
        self.claim_obj, self.pod_obj = claim, pod
        self.reads = 0

    def claim(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        if self.claim_obj is None:
            raise ClaimError(f"ResourceClaim {namespace}/{name} not found")
        return copy.deepcopy(self.claim_obj)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.pod_obj)


@pytest.fixture
def node_dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {k: tmp_path / k for k in ("private", "runtime", "cdi")}
    for d in dirs.values():
        d.mkdir()
    return dirs


def make_driver(dirs: dict[str, Path], reader: FakeReader) -> DraDriver:
    cdi = CdiPublisher(str(dirs["cdi"]), [str(dirs["cdi"])], "/usr/local/egpu/bin/egpu-hook",
                       present=lambda _p: False)
    cdi.publish(CARDS)
    return DraDriver(NODE, lambda: CARDS, reader, ClaimStore(str(dirs["private"])), cdi,
                     str(dirs["runtime"]), low_priority_floor=0)


def test_prepare_writes_the_pod_file_and_the_claim_cdi_spec_idempotently(
        node_dirs: dict[str, Path]) -> None:
    reader = FakeReader(share_claim(), share_pod())
    driver = make_driver(node_dirs, reader)
    (device,) = driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert device.cdi_device_ids == ("egpu.io/gpu=GPU-AAAA-0001",
                                     f"egpu.io/gpu=claim-{CLAIM_UID}-gpu")
    assert (device.pool, device.device, device.request) == (NODE, "gpu-aaaa-0001", "gpu")
    pod_file = node_dirs["private"] / "allocations" / f"{POD_UID}.json"
    shares = PodShares.decode(pod_file.read_text())
    assert shares.allocation.containers[0].cards[0].memory_mib == 4096
    assert oct(pod_file.stat().st_mode & 0o777) == "0o600"
    spec = json.loads((node_dirs["cdi"] / f"egpu-claim-{CLAIM_UID}.json").read_text())
    assert spec["kind"] == "egpu.io/gpu"
    assert spec["devices"][0]["containerEdits"]["env"] == [
        f"EGPU_DEVICES=claim-{CLAIM_UID}-gpu", "NVIDIA_VISIBLE_DEVICES=GPU-AAAA-0001",
        f"EGPU_CLAIM_SHARE_{CLAIM_UID}_gpu={CLAIM_UID}/gpu"]
    # the runtime hook's proof that the kubelet gave a container the claim (a pod can copy
    # the variables above, not a device node)
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": f"/dev/egpu-claim-{CLAIM_UID}-gpu", "hostPath": "/dev/null",
         "permissions": "r"}]
    claim_file = node_dirs["private"] / "claim-shares" / f"{CLAIM_UID}.json"
    joinable = PodShares.decode(claim_file.read_text())
    assert [(c.name, c.share) for c in joinable.allocation.containers] == [
        ("gpu", f"claim-{CLAIM_UID}_gpu")]
    assert oct(claim_file.stat().st_mode & 0o777) == "0o600"
    assert driver.owns_pod(POD_UID)
    # again (the kubelet retries), and after a restart: same answer from the state, no read
    pod_file.unlink()
    again = make_driver(node_dirs, reader)
    assert again.prepare("ml", CLAIM_UID, "share-pod-gpu-x") == [device]
    assert reader.reads == 1
    assert pod_file.exists()  # rewritten
    assert again.owns_pod(POD_UID)
    assert again.shares()[POD_UID] == shares


def test_unprepare_removes_the_claims_files_and_unknown_claims_are_fine(
        node_dirs: dict[str, Path]) -> None:
    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    # what the hook made: the pod's hook folder, the claim's accounting folder (shared by its
    # containers) and the share's roster entry and file on its card
    hook = node_dirs["private"] / "hook" / f"{POD_UID}_main"
    hook.mkdir(parents=True)
    folder = f"claim-{CLAIM_UID}_gpu"
    region = node_dirs["runtime"] / "containers" / folder
    region.mkdir(parents=True)
    card = node_dirs["runtime"] / "cards" / "GPU-AAAA-0001"
    card.mkdir(parents=True)
    owner = card_roster.share_owner(folder)
    card_roster.register(str(card), "GPU-AAAA-0001", card_roster.RosterEntry(
        owner, cores=30, name=folder))
    restarted = make_driver(node_dirs, FakeReader(None, None))  # the claim is gone meanwhile
    restarted.unprepare(CLAIM_UID)
    leftovers = [p for p in node_dirs["private"].rglob("*") if p.is_file()]
    leftovers += [p for p in node_dirs["cdi"].iterdir() if p.name != "egpu.json"]
    assert leftovers == []
    assert not region.exists() and not hook.exists()
    assert card_roster.read_roster(str(card)).slot_of(owner) is None
    assert not (card / card_roster.share_file_name(owner)).exists()
    assert not restarted.owns_pod(POD_UID)
    restarted.unprepare("never-prepared")


def test_a_bad_claim_writes_nothing(node_dirs: dict[str, Path]) -> None:
    bad = share_claim(config={"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig",
                              "priority": "urgent"})
    driver = make_driver(node_dirs, FakeReader(bad, share_pod()))
    with pytest.raises(ShareConfigError):
        driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert [p for p in node_dirs["private"].rglob("*") if p.is_file()] == []
    assert sorted(p.name for p in node_dirs["cdi"].iterdir()) == ["egpu.json"]


def test_a_claim_of_another_uid_is_refused(node_dirs: dict[str, Path]) -> None:
    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    with pytest.raises(ClaimError, match="deleted and created again"):
        driver.prepare("ml", "another-uid", "share-pod-gpu-x")


def test_the_pod_registry_leaves_the_plugins_pod_files_alone(
        node_dirs: dict[str, Path]) -> None:
    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = PodRegistry(NODE, Config(), str(node_dirs["private"]), str(node_dirs["runtime"]),
                           owned_elsewhere=driver.owns_pod)
    registry.resync([share_pod()])  # a DRA pod: no egpu.io/allocation
    assert (node_dirs["private"] / "allocations" / f"{POD_UID}.json").exists()


def test_the_exporter_labels_a_prepared_claims_share_with_its_pod_and_container(
        node_dirs: dict[str, Path]) -> None:
    """A DRA share in the metrics, as the node agent wires them (registry + driver shares):
    the container's metrics carry the claim's pod (namespace, pod) and the container, its
    cores the claim's consumed cores, and the card books the claim's MiB and cores."""
    from node_fixtures import MIB, region_bytes
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from egpu.contract import (
        METRIC_CARD_CORES_BOOKED,
        METRIC_CARD_MEMORY_BOOKED,
        METRIC_CONTAINER_CORES_LIMIT,
        METRIC_CONTAINER_MEMORY_LIMIT,
        METRIC_CONTAINER_MEMORY_USED,
    )
    from node_agent.metrics.collector import EgpuCollector, Sources, regions_under

    driver = make_driver(node_dirs, FakeReader(share_claim(), share_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    folder = node_dirs["runtime"] / "containers" / f"{POD_UID}_main"  # as the hook makes it
    folder.mkdir(parents=True)
    (folder / "region").write_bytes(region_bytes([(CARDS[0].uuid, 4096 * MIB, 100 * MIB)]))
    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources(
        NODE, lambda: CARDS, lambda: {**PodRegistry(NODE, Config(), str(node_dirs["private"]),
                                                    str(node_dirs["runtime"])).shares(),
                                     **driver.shares()},
        regions_under(str(node_dirs["runtime"])), lambda u: None, lambda u: None)))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    want = {"gpu": "0", "UUID": CARDS[0].uuid, "modelName": CARDS[0].model, "Hostname": NODE,
            "namespace": "ml", "pod": "share-pod", "container": "main"}
    for name, value in ((METRIC_CONTAINER_MEMORY_LIMIT, 4096 * MIB),
                        (METRIC_CONTAINER_MEMORY_USED, 100 * MIB),
                        (METRIC_CONTAINER_CORES_LIMIT, 30)):
        assert [(s.labels, s.value) for s in families[name].samples] == [(want, value)], name
    booked = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_MEMORY_BOOKED].samples}
    cores = {s.labels["UUID"]: s.value for s in families[METRIC_CARD_CORES_BOOKED].samples}
    assert (booked, cores) == ({CARDS[0].uuid: 4096 * MIB, CARDS[1].uuid: 0},
                               {CARDS[0].uuid: 30, CARDS[1].uuid: 0})


# --- succeeded init containers give their own claim folder's roster entry back ---------------
CARD_DIR = "GPU-AAAA-0001"


def _paired_claim(uid: str = CLAIM_UID, pods: tuple[str, ...] = ("share-pod",),
                  requests: tuple[tuple[str, str, str], ...] = (
                      ("ocr", "8000Mi", "20"), ("compile", "4000Mi", "80"))
                  ) -> dict[str, Any]:
    """The webhook's claim of a pod whose init container is paired with its app container
    (egpu.dra.claims, FC-07): both requests allocated on card 0, as the scheduler books them
    (one share each)."""
    claim = share_claim()
    claim["metadata"]["uid"] = uid
    claim["status"]["allocation"]["devices"]["results"] = [
        {"request": name, "driver": "gpu.egpu.io", "pool": NODE, "device": "gpu-aaaa-0001",
         "consumedCapacity": {"memory": memory, "cores": cores, "shares": "1"}}
        for name, memory, cores in requests]
    claim["status"]["reservedFor"] = [
        {"resource": "pods", "name": name, "uid": f"{POD_UID[:-1]}{i + 1}"}
        for i, name in enumerate(pods)]
    return claim


def _paired_pod(name: str = "share-pod", index: int = 0,
                init: tuple[tuple[str, tuple[str, ...]], ...] = (("compile", ("ocr", "compile")),),
                app: tuple[str, ...] = ("ocr",)) -> dict[str, Any]:
    def claims(requests: tuple[str, ...]) -> dict[str, Any]:
        return {"claims": [{"name": "gpu", "request": r} for r in requests]}

    pod = share_pod(containers=[{"name": "ocr", "resources": claims(app)}])
    pod["metadata"].update(name=name, uid=f"{POD_UID[:-1]}{index + 1}")
    pod["spec"]["initContainers"] = [{"name": n, "resources": claims(r)} for n, r in init]
    pod["status"]["phase"] = "Pending"
    return pod


class PodsReader(FakeReader):
    """FakeReader with several pods, by name."""

    def __init__(self, claim: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        super().__init__(claim, pods[0])
        self.pods = {p["metadata"]["name"]: p for p in pods}

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.pods.get(name))


def _started(node_dirs: dict[str, Path], folder: str) -> None:
    """What the runtime hook does as a container of the claim starts: the folder's entry."""
    card = node_dirs["runtime"] / "cards" / CARD_DIR
    card.mkdir(parents=True, exist_ok=True)
    card_roster.register(str(card), CARD_DIR, card_roster.RosterEntry(
        card_roster.share_owner(folder), name=folder))


def _entries(node_dirs: dict[str, Path]) -> set[str]:
    """The folders of card 0's roster entries (by owner: a name is cut to 31 bytes)."""
    roster = card_roster.read_roster(str(node_dirs["runtime"] / "cards" / CARD_DIR))
    owners = {e.owner for e in roster.shares().values()}
    known = {card_roster.share_owner(_folder(r)): _folder(r) for r in (
        "ocr", "compile.ocr", "warm", "pair", "side")}
    return {known.get(o, str(o)) for o in owners}


def _folder(requests: str, uid: str = CLAIM_UID) -> str:
    return f"claim-{uid}_{requests}"


def _init_done(pod: dict[str, Any], *statuses: tuple[str, int, str]) -> dict[str, Any]:
    """The pod with its init containers terminated: (name, exit code, container id)."""
    done = copy.deepcopy(pod)
    done["status"].update(phase="Running" if all(c == 0 for _, c, _ in statuses) else "Pending",
                          startTime="2026-01-01T00:00:00Z", initContainerStatuses=[
        {"name": name, "containerID": f"containerd://{cid}",
         "state": {"terminated": {"exitCode": code, "containerID": f"containerd://{cid}"}}}
        for name, code, cid in statuses])
    return done


def _registry(node_dirs: dict[str, Path], driver: DraDriver) -> PodRegistry:
    """The pod registry as the node agent wires it to the plugin (node_agent/main.py)."""
    return PodRegistry(NODE, Config(), str(node_dirs["private"]), str(node_dirs["runtime"]),
                       owned_elsewhere=driver.owns_pod,
                       init_claim_folders=driver.init_only_folders)


def test_a_succeeded_init_containers_own_claim_folder_gives_its_roster_entry_back(
        node_dirs: dict[str, Path]) -> None:
    """The webhook's plan gives an init container its own request set (its app container's
    request and a headroom request), so its own claim folder and roster entry. Bug caught:
    only pods with an egpu.io/allocation had a succeeded init container's entry freed, so a
    DRA pod held two roster entries for its life (16 such pods filled a card's 32). The app
    container's entry stays; so does the claim's state, freed at NodeUnprepareResources."""
    pod = _paired_pod()
    driver = make_driver(node_dirs, FakeReader(_paired_claim(), pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = _registry(node_dirs, driver)
    assert registry.update(pod) is None  # a DRA pod: not the registry's to write
    _started(node_dirs, _folder("compile.ocr"))
    registry.update(_init_done(pod, ("compile", 0, "i1")))
    _started(node_dirs, _folder("ocr"))  # the app container, once the init container is done
    assert _entries(node_dirs) == {_folder("ocr")}
    # a new sandbox runs the init container again, under a new id: freed again
    _started(node_dirs, _folder("compile.ocr"))
    registry.update(_init_done(pod, ("compile", 0, "i1")))  # the same id: already done
    assert _entries(node_dirs) == {_folder("ocr"), _folder("compile.ocr")}
    registry.update(_init_done(pod, ("compile", 0, "i2")))
    assert _entries(node_dirs) == {_folder("ocr")}
    driver.unprepare(CLAIM_UID)
    assert _entries(node_dirs) == set()


def test_init_claim_folders_the_node_never_frees_early(node_dirs: dict[str, Path]) -> None:
    """A failed init container (it runs again), one whose folder the app container draws on
    too (it names the same requests), a sidecar (it runs on) and a plain init container whose
    folder another init container of the pod still needs keep their entries."""
    pod = _paired_pod(init=(("fails", ("warm",)), ("same", ("ocr",)),
                            ("first", ("pair",)), ("second", ("pair",)),
                            ("proxy", ("side",))),
                      app=("ocr",))
    pod["spec"]["initContainers"][4]["restartPolicy"] = "Always"
    claim = _paired_claim(requests=(("ocr", "1Gi", "10"), ("warm", "1Gi", "10"),
                                    ("pair", "1Gi", "10"), ("side", "1Gi", "10")))
    driver = make_driver(node_dirs, FakeReader(claim, pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = _registry(node_dirs, driver)
    for requests in ("warm", "ocr", "pair", "side"):
        _started(node_dirs, _folder(requests))
    everything = {_folder(r) for r in ("warm", "ocr", "pair", "side")}
    registry.update(_init_done(pod, ("fails", 1, "f1"), ("same", 0, "s1"), ("first", 0, "a1"),
                               ("proxy", 0, "p1")))
    assert _entries(node_dirs) == everything
    # both init containers of the "pair" folder done: it goes, the others stay
    registry.update(_init_done(pod, ("fails", 1, "f1"), ("same", 0, "s1"), ("first", 0, "a1"),
                               ("second", 0, "b1"), ("proxy", 0, "p1")))
    assert _entries(node_dirs) == everything - {_folder("pair")}


def test_a_recreated_sandbox_frees_a_shared_init_folder_only_once_every_init_container_ran_again(
        node_dirs: dict[str, Path]) -> None:
    """Two init containers draw on one folder. After the sandbox is recreated, the pod's
    status can show the first one's new success beside the second one's OLD terminated(0)
    while the kubelet already creates the second one again (its hook registered the folder
    again). Bug caught: the folder was freed once any of its init containers had a new id,
    pulling the roster entry from under the running second init container."""
    pod = _paired_pod(init=(("first", ("pair",)), ("second", ("pair",))))
    claim = _paired_claim(requests=(("ocr", "1Gi", "10"), ("pair", "1Gi", "10")))
    driver = make_driver(node_dirs, FakeReader(claim, pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = _registry(node_dirs, driver)
    _started(node_dirs, _folder("pair"))
    registry.update(_init_done(pod, ("first", 0, "a1"), ("second", 0, "b1")))
    assert _entries(node_dirs) == set()
    # sandbox 2: the first init container ran again; the second one's status is still old
    _started(node_dirs, _folder("pair"))
    registry.update(_init_done(pod, ("first", 0, "a2"), ("second", 0, "b1")))
    assert _entries(node_dirs) == {_folder("pair")}
    # the second one succeeded again too: now the folder goes
    registry.update(_init_done(pod, ("first", 0, "a2"), ("second", 0, "b2")))
    assert _entries(node_dirs) == set()


def test_an_init_claim_folder_another_pod_draws_on_keeps_its_entry(
        node_dirs: dict[str, Path]) -> None:
    """A claim shared by two pods whose init containers name the same requests: one pod's
    init container succeeding leaves the folder to the other's."""
    pods = [_paired_pod("a", 0), _paired_pod("b", 1)]
    claim = _paired_claim(pods=("a", "b"))
    driver = make_driver(node_dirs, PodsReader(claim, pods))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = _registry(node_dirs, driver)
    _started(node_dirs, _folder("compile.ocr"))
    registry.update(_init_done(pods[0], ("compile", 0, "a1")))
    assert _entries(node_dirs) == {_folder("compile.ocr")}
    assert init_only_folders(driver.store.all(), pods[0]["metadata"]["uid"]) == {}


def test_a_dra_pod_deleted_while_the_watch_was_away_is_forgotten_at_the_resync(
        node_dirs: dict[str, Path]) -> None:
    pod = _paired_pod()
    driver = make_driver(node_dirs, FakeReader(_paired_claim(), pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    registry = _registry(node_dirs, driver)
    uid = pod["metadata"]["uid"]
    registry.update(_init_done(pod, ("compile", 0, "i1")))
    assert uid in registry._released_inits  # the container ids it looked at
    assert uid in registry._released_folders  # and those of each folder's last release
    registry.resync([_paired_pod("other", 5)])
    assert uid not in registry._released_inits
    assert uid not in registry._released_folders


def test_only_the_plugins_pods_are_looked_at(node_dirs: dict[str, Path]) -> None:
    """A pod of no prepared claim (any pod of the node with an init container) costs no read
    of the plugin's state."""
    driver = make_driver(node_dirs, FakeReader(_paired_claim(), _paired_pod()))
    other = _init_done(_paired_pod("other", 5), ("compile", 0, "o1"))
    assert driver.init_only_folders(other["metadata"]["uid"]) == {}
    assert _registry(node_dirs, driver).update(other) is None


def test_a_succeeded_init_container_without_an_own_folder_reads_the_plugins_state_once(
        node_dirs: dict[str, Path]) -> None:
    """An init container that shares its folder with the app container (nothing to free):
    the plugin's state (every claim file, under the driver's lock) is read once for it, not
    at every later status event of the pod. Bug caught: the ids were recorded only when a
    folder was freed, so each event of such a pod read every claim file again."""
    pod = _paired_pod(init=(("same", ("ocr",)),), app=("ocr",))
    driver = make_driver(node_dirs, FakeReader(_paired_claim(requests=(("ocr", "1Gi", "10"),)),
                                               pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    reads = 0
    read_all = driver.store.all

    def counted() -> Any:
        nonlocal reads
        reads += 1
        return read_all()

    driver.store.all = counted  # type: ignore[method-assign]
    registry = _registry(node_dirs, driver)
    for _ in range(3):
        registry.update(_init_done(pod, ("same", 0, "s1")))
    assert reads == 1


# --- the card's booked figures of a DRA pod with an init container ----------------------------
def _card_booked(driver: DraDriver) -> tuple[int, int]:
    """Card 0's booked MiB and cores, as the node agent's exporter reports them (registry +
    driver shares, as node_agent/main.py wires them)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from egpu.contract import METRIC_CARD_CORES_BOOKED, METRIC_CARD_MEMORY_BOOKED
    from node_agent.metrics.collector import EgpuCollector, Sources

    registry = CollectorRegistry()
    registry.register(EgpuCollector(Sources(NODE, lambda: CARDS, driver.shares, lambda: {},
                                            lambda u: None, lambda u: None)))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}

    def card0(metric: str) -> float:
        return next(s.value for s in families[metric].samples
                    if s.labels["UUID"] == CARDS[0].uuid)

    return int(card0(METRIC_CARD_MEMORY_BOOKED)) >> 20, int(card0(METRIC_CARD_CORES_BOOKED))


def test_a_dra_pods_init_share_paired_with_its_main_share_is_booked_once(
        node_dirs: dict[str, Path]) -> None:
    """The webhook pairs an init container of 12000 MiB / 100% with its app container of
    8000 MiB / 20% (egpu.dra.claims, FC-07): the claim asks the app's request and a headroom
    of 4000 MiB / 80% on the same card, so the card holds 12000 MiB / 100%, max(init, app).
    Bug caught (found by review): the exporter counted each claim folder once, and the init
    container's folder (app request + headroom) holds the app's request again: 20000 MiB /
    120% booked where the card holds 12000 MiB / 100%."""
    driver = make_driver(node_dirs, FakeReader(_paired_claim(), _paired_pod()))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert _card_booked(driver) == (12000, 100)
    # a second app container with a request of its own: its booking adds up beside the pair
    pod = _paired_pod()
    pod["spec"]["containers"].append(
        {"name": "log", "resources": {"claims": [{"name": "gpu", "request": "log"}]}})
    claim = _paired_claim(requests=(("ocr", "8000Mi", "20"), ("compile", "4000Mi", "80"),
                                    ("log", "2000Mi", "5")))
    claim["metadata"]["uid"] = other = CLAIM_UID[:-1] + "2"
    driver.unprepare(CLAIM_UID)
    driver = make_driver(node_dirs, FakeReader(claim, pod))
    driver.prepare("ml", other, "share-pod-gpu-x")
    assert _card_booked(driver) == (14000, 105)


def test_a_dra_pods_init_container_with_a_request_of_its_own_stays_booked_beside_its_app(
        node_dirs: dict[str, Path]) -> None:
    """An init container the webhook does not pair (several cards, a percentage, no app
    partner) names a request of its own: DRA allocates it beside the app containers' for the
    pod's life, so the card holds both (the claim's consumed capacity, as `egpu top` counts
    it), not the extender's max(init, app): 8000 + 12000 MiB, 30 + 50%."""
    pod = _paired_pod(init=(("warm", ("warm",)),), app=("ocr",))
    claim = _paired_claim(requests=(("ocr", "12000Mi", "50"), ("warm", "8000Mi", "30")))
    driver = make_driver(node_dirs, FakeReader(claim, pod))
    driver.prepare("ml", CLAIM_UID, "share-pod-gpu-x")
    assert _card_booked(driver) == (20000, 80)


# --- the gRPC edge, as the kubelet calls it ---------------------------------------------------
@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path: a unix socket path has at most 107 characters."""
    path = Path(tempfile.mkdtemp(prefix="egpu-dra-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def plugin(node_dirs: dict[str, Path], short_dir: Path):
    kubelet = short_dir / "kubelet"
    (kubelet / "plugins_registry").mkdir(parents=True)
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(share_claim(), share_pod())),
                           str(kubelet))
    stop = threading.Event()
    thread = threading.Thread(target=served.run, args=(stop, 0.05), daemon=True)
    thread.start()
    deadline = 200
    while served.starts == 0 and deadline:
        stop.wait(0.02)
        deadline -= 1
    yield served
    stop.set()
    thread.join(5)


def test_registration_answers_what_the_kubelet_expects(plugin: KubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix://{plugin.registration_socket}") as channel:
        stub = registration_v1_pb2_grpc.RegistrationStub(channel)
        info = stub.GetInfo(registration_v1_pb2.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(
            registration_v1_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
    assert (info.type, info.name, list(info.supported_versions)) == (
        "DRAPlugin", "gpu.egpu.io", ["v1.DRAPlugin", "v1beta1.DRAPlugin"])
    assert info.endpoint == plugin.dra_socket
    assert plugin.registry_dir.endswith("plugins_registry")
    assert plugin.dra_socket.endswith("plugins/gpu.egpu.io/dra.sock")
    assert plugin.registration.registered == 1


@pytest.mark.parametrize(("pb", "grpc_mod"), [(dra_v1_pb2, dra_v1_pb2_grpc),
                                              (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)])
def test_prepare_and_unprepare_over_grpc(plugin: KubeletPlugin, pb: Any, grpc_mod: Any) -> None:
    claim = pb.Claim(namespace="ml", uid=CLAIM_UID, name="share-pod-gpu-x")
    with grpc.insecure_channel(f"unix://{plugin.dra_socket}") as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        answer = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]),
                                           timeout=5)
        result = answer.claims[CLAIM_UID]
        assert result.error == ""
        (device,) = result.devices
        assert list(device.cdi_device_ids) == ["egpu.io/gpu=GPU-AAAA-0001",
                                               f"egpu.io/gpu=claim-{CLAIM_UID}-gpu"]
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"], NODE, "gpu-aaaa-0001")
        if pb is dra_v1_pb2:
            assert device.share_id == "5a5a5a5a-0000-4000-8000-1"
        gone = stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(
            claims=[claim, pb.Claim(namespace="ml", uid="unknown", name="x")]), timeout=5)
        assert {k: v.error for k, v in gone.claims.items()} == {CLAIM_UID: "", "unknown": ""}


def test_a_subrequest_result_is_answered_under_its_request_name() -> None:
    """A memory percentage is a firstAvailable request: its result names the subrequest
    (``jupyter/mib-81559``). The kubelet gives a container that names request ``jupyter`` only
    the devices whose request_names hold ``jupyter``, so the answer strips the subrequest (as
    the Go helper does); unstripped, the container ran without its CDI devices (seen with
    ``egpu demo --dra`` on the real node: no driver in the container)."""
    from node_agent.draplugin.driver import PreparedDevice
    from node_agent.draplugin.service import DraService

    prepared = PreparedDevice("jupyter/mib-81559", NODE, "gpu-aaaa-0001", None,
                              ("egpu.io/gpu=GPU-AAAA-0001",))
    for pb in (dra_v1_pb2, dra_v1beta1_pb2):
        device = DraService(object(), pb)._device(prepared)  # the driver is not called
        assert list(device.request_names) == ["jupyter"]
        assert list(device.cdi_device_ids) == ["egpu.io/gpu=GPU-AAAA-0001"]


def test_a_bad_claim_answers_its_error_over_grpc(node_dirs: dict[str, Path],
                                                 short_dir: Path) -> None:
    kubelet = short_dir / "k"
    (kubelet / "plugins_registry").mkdir(parents=True)
    bad = share_claim(config={"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig",
                              "priority": "urgent"})
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(bad, share_pod())), str(kubelet))
    assert served.ensure()
    try:
        with grpc.insecure_channel(f"unix://{served.dra_socket}") as channel:
            answer = dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
                    namespace="ml", uid=CLAIM_UID, name="share-pod-gpu-x")]), timeout=5)
        error = answer.claims[CLAIM_UID].error
        assert "ShareConfig.priority: 'urgent'" in error, error
        assert not answer.claims[CLAIM_UID].devices
    finally:
        served.stop()


def test_the_plugin_serves_again_when_its_socket_vanishes_and_waits_for_the_kubelet(
        short_dir: Path, node_dirs: dict[str, Path]) -> None:
    served = KubeletPlugin(make_driver(node_dirs, FakeReader(share_claim(), share_pod())),
                           str(short_dir / "no-kubelet"))
    assert not served.ensure()  # no plugins_registry: no kubelet, nothing created
    assert not (short_dir / "no-kubelet").exists()
    os.makedirs(served.registry_dir)
    try:
        assert served.ensure() and not served.ensure()
        os.unlink(served.registration_socket)
        assert served.ensure() and served.starts == 2
        assert os.path.exists(served.registration_socket)
    finally:
        served.stop()
