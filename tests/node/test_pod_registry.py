"""F2: the node agent writes a pod's allocation file once and never rewrites it (an edited
``egpu.io/allocation`` or ``egpu.io/priority`` label after binding must not lift a share)."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from egpu import card_roster
from egpu.card_roster import FLAG_RAW, RosterEntry
from egpu.config import Config
from egpu.records import (
    KIND_APP,
    KIND_INIT,
    KIND_SIDECAR,
    Allocation,
    CardShare,
    ContainerAllocation,
    PodShares,
)
from node_agent.pods import PodCatchUp, PodRegistry, list_node_pods, plain_init_containers

CFG = Config()


def _pod(memory: int = 4096, cores: int = 30, priority: str = "low") -> dict[str, Any]:
    allocation = Allocation(containers=(ContainerAllocation("c0", False, (
        CardShare("GPU-0", 0, memory, cores),)),), node="n1")
    return {"metadata": {"name": "a", "namespace": "team", "uid": "uid-A",
                         "labels": {"egpu.io/priority": priority},
                         "annotations": {"egpu.io/allocation": allocation.encode()}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c0", "resources": {
                "limits": {"egpu.io/gpu": "1", "egpu.io/gpu-memory": str(memory),
                           "egpu.io/gpu-cores": str(cores)}}}]},
            "status": {"phase": "Pending"}}  # not admitted yet: its share is pending


def _file(tmp_path: Path) -> PodShares:
    return PodShares.decode((tmp_path / "private" / "allocations" / "uid-A.json").read_text())


@pytest.mark.parametrize("restart", [False, True])
def test_an_edited_allocation_or_priority_never_rewrites_the_file(
        tmp_path: Path, restart: bool, caplog: pytest.LogCaptureFixture) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    first = registry.update(_pod())
    assert first is not None and _file(tmp_path) == first
    if restart:  # a restarted agent finds the file on disk
        registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    lifted = _pod(memory=24576, cores=100, priority="high")
    with caplog.at_level(logging.WARNING, logger="node_agent.pods"):
        kept = registry.update(lifted)
        registry.update(lifted)  # logged once
    assert kept == first and _file(tmp_path) == first
    assert registry.shares()["uid-A"] == first
    assert [p.share.cards[0].memory_mib for p in registry.pending()] == [4096]
    warnings = [r.getMessage() for r in caplog.records if "uid-A" in r.getMessage()]
    assert len(warnings) == 1 and "team/a" in warnings[0] and "ignored" in warnings[0]
    assert json.loads((tmp_path / "private" / "allocations" / "uid-A.json").read_text())[
        "priority"] == "low"


def test_a_deleted_pod_file_is_removed_and_a_new_uid_gets_its_own(tmp_path: Path) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    registry.update(_pod())
    registry.delete("uid-A")
    assert not (tmp_path / "private" / "allocations" / "uid-A.json").exists()
    assert registry.update(_pod(memory=8000)) == _file(tmp_path)
    assert _file(tmp_path).allocation.containers[0].cards[0].memory_mib == 8000


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_gives_its_roster_entries_back_before_it_is_deleted(
        tmp_path: Path, phase: str) -> None:
    """Bug caught: roster entries were freed only when a pod was deleted. A Job's finished
    pods stay until deleted, so 32 of them filled the card's roster (it holds 32 entries)
    and every new container on the card failed to start with CardFullError."""
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    card = tmp_path / "run" / "cards" / "GPU-0"
    card.mkdir(parents=True)
    for i in range(card_roster.NSLOTS + 4):  # more Job pods than the roster has entries
        pod = _pod()
        pod["metadata"].update(name=f"job-{i}", uid=f"uid-{i}")
        registry.update(pod)
        card_roster.register(str(card), "GPU-0", RosterEntry(
            card_roster.share_owner(f"uid-{i}_c0"), name=f"uid-{i}_c0"))  # the hook's
        pod["status"] = {"phase": phase, "startTime": "2026-01-01T00:00:00Z"}
        registry.update(pod)
        assert card_roster.read_roster(str(card)).shares() == {}
    # the finished pods' allocation files stay until the pods are deleted
    assert (tmp_path / "private" / "allocations" / "uid-0.json").exists()
    registry.delete("uid-0")
    assert not (tmp_path / "private" / "allocations" / "uid-0.json").exists()


def test_a_running_pod_keeps_its_roster_entry(tmp_path: Path) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    card = tmp_path / "run" / "cards" / "GPU-0"
    card.mkdir(parents=True)
    pod = _pod()
    registry.update(pod)
    entry = RosterEntry(card_roster.share_owner("uid-A_c0"), name="uid-A_c0")
    card_roster.register(str(card), "GPU-0", entry)
    for phase in ("Pending", "Running"):
        pod["status"] = {"phase": phase, "startTime": "2026-01-01T00:00:00Z"}
        registry.update(pod)
    assert [e.name for e in card_roster.read_roster(str(card)).shares().values()] == ["uid-A_c0"]


def test_the_floor_of_the_node_config_reaches_the_allocation_file(tmp_path: Path) -> None:
    """lowPriorityFloorPercent travels to the hook in the pod's allocation file (a pod has no
    say in it)."""
    registry = PodRegistry("n1", Config(low_priority_floor_percent=12),
                           str(tmp_path / "private"), str(tmp_path / "run"))
    assert registry.update(_pod()) is not None
    assert _file(tmp_path).low_priority_floor == 12


def test_files_of_pods_deleted_while_the_agent_was_down_are_removed(tmp_path: Path) -> None:
    """A restarted agent's first full list removes the files of pods that are gone."""
    dirs = (str(tmp_path / "private"), str(tmp_path / "run"))
    assert PodRegistry("n1", CFG, *dirs).update(_pod()) is not None
    hook = tmp_path / "private" / "hook" / "uid-A_c0"
    hook.mkdir(parents=True)
    restarted = PodRegistry("n1", CFG, *dirs)
    restarted.resync([])
    assert not (tmp_path / "private" / "allocations" / "uid-A.json").exists()
    assert not hook.exists()
    # a pod still listed keeps its file
    assert restarted.update(_pod()) is not None
    PodRegistry("n1", CFG, *dirs).resync([_pod()])
    assert (tmp_path / "private" / "allocations" / "uid-A.json").exists()


def test_a_deleted_pod_leaves_every_cards_roster_with_its_share_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The hook registered the pod's containers on their cards; the pod's deletion frees
    their entries and share files (by name, cut to 31 bytes in the roster, and by the owners
    of its folders), and nothing of another pod's or of a raw share, even on a card whose
    roster is broken."""
    uid = "aaaaaaaa-1111-2222-3333-444444444444"  # a real pod uid: its names are cut
    cards = tmp_path / "run" / "cards"
    mine = [RosterEntry(card_roster.share_owner(f"{uid}_{c}"), name=f"{uid}_{c}")
            for c in ("c0", "sidecar")]
    theirs = RosterEntry(card_roster.share_owner("uid-B_c0"), name="uid-B_c0")
    raw = RosterEntry(card_roster.owner_id("/raw/region"), name=f"{uid}_x", flags=FLAG_RAW)
    layout = {"GPU-0": [mine[0], theirs], "GPU-1": [mine[1], raw], "GPU-2": [theirs]}
    for uuid, entries in layout.items():
        (cards / uuid).mkdir(parents=True)
        for entry in entries:
            card_roster.register(str(cards / uuid), uuid, entry)
    (cards / "GPU-old").write_bytes(b"x")  # the previous version's file: not a folder
    (cards / "GPU-broken").mkdir()
    (cards / "GPU-broken" / "roster").write_bytes(b"junk")
    (tmp_path / "run" / "containers" / f"{uid}_c0").mkdir(parents=True)
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="node_agent.pods"):
        registry.delete(uid)
    left = {uuid: card_roster.read_roster(str(cards / uuid)).shares()
            for uuid in layout}
    assert left == {"GPU-0": {1: theirs}, "GPU-1": {1: raw}, "GPU-2": {0: theirs}}
    files = {p.name for p in cards.glob("GPU-[012]/share-*")}
    assert files == {card_roster.share_file_name(e.owner) for e in (theirs, raw)}
    assert not (tmp_path / "run" / "containers" / f"{uid}_c0").exists()
    assert [r for r in caplog.records if "GPU-broken" in r.getMessage()]


# --- catching up with pods the watch has not delivered yet (device plugin, Allocate) ----------
def test_a_listed_pod_never_overrides_the_watch_nor_revives_a_deleted_pod(
        tmp_path: Path) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    started = _pod()
    started["status"]["containerStatuses"] = [{"name": "c0", "state": {"running": {}}}]
    registry.update(started)  # the watch: the container runs
    assert registry.add_listed([_pod()]) == 0  # an older LIST: still pending there
    assert registry.pending() == []
    registry.delete("uid-A")
    assert registry.add_listed([_pod()]) == 0
    assert not (tmp_path / "private" / "allocations" / "uid-A.json").exists()
    other = _pod()
    other["metadata"]["uid"] = "uid-B"
    assert registry.add_listed([other]) == 1
    assert [p.pod_uid for p in registry.pending()] == ["uid-B"]


def test_a_recorded_pod_wakes_the_waiters(tmp_path: Path) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    generation = registry.generation()
    assert not registry.wait_for_change(generation, 0.05)
    threading.Timer(0.1, registry.update, args=(_pod(),)).start()
    assert registry.wait_for_change(generation, 5.0)
    assert registry.generation() != generation


def test_catch_up_lists_the_node_at_most_once_per_interval_and_survives_a_failed_list(
        tmp_path: Path) -> None:
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    now = [100.0]
    answers: list[Any] = [RuntimeError("apiserver away"), []]

    def list_pods(_timeout_s: float) -> list[dict[str, Any]]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    catch_up = PodCatchUp(registry, list_pods, relist_interval_s=1.0, clock=lambda: now[0])
    assert catch_up(0.01)  # LIST failed: waited for the watch instead; more may come
    assert catch_up(0.01)  # within the interval: no second LIST, waited again
    assert catch_up.lists == 1
    now[0] += 1.0
    answers.append([_pod()])
    assert not catch_up(0.01) and catch_up.lists == 2  # the API server has nothing new: final
    now[0] += 1.0
    assert not catch_up(0.01) and catch_up.lists == 3  # the pod was there: match, final
    assert [p.pod_uid for p in registry.pending()] == ["uid-A"]


def test_list_node_pods_lists_this_nodes_pods_only() -> None:
    calls: list[dict[str, Any]] = []

    class Core:
        api_client = SimpleNamespace(sanitize_for_serialization=lambda pod: {"pod": pod})

        def list_pod_for_all_namespaces(self, **kwargs: Any) -> SimpleNamespace:
            calls.append(kwargs)
            return SimpleNamespace(items=["p1", "p2"])

    assert list_node_pods(Core(), "n1")(2.5) == [{"pod": "p1"}, {"pod": "p2"}]
    assert calls == [{"field_selector": "spec.nodeName=n1", "_request_timeout": 2.5}]


# --- the allocation record carries the policies (issue 16) ------------------------------------
def _placed(priority: str = "high", policy: str = "elastic",
            oversubscription: bool = True) -> Allocation:
    """The record a current extender writes: kinds and resolved policies included."""
    return Allocation(containers=(ContainerAllocation("c0", False, (
        CardShare("GPU-0", 0, 4096, 30),), "container"),), node="n1", priority=priority,
        compute_policy=policy, memory_oversubscription=oversubscription)


def _no_spec_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    def read_pod(*_: object) -> None:
        raise AssertionError("the agent read the pod spec for what the record says")

    monkeypatch.setattr("node_agent.pods.read_pod", read_pod)


def test_the_policies_come_from_the_record_never_from_the_pod_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_spec_reading(monkeypatch)
    pod = _pod(priority="low")  # a label that disagrees with the record: the record wins
    pod["metadata"]["annotations"]["egpu.io/allocation"] = _placed().encode()
    pod["spec"]["containers"] = []  # nothing to read there either
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    shares = registry.update(pod)
    assert shares is not None and _file(tmp_path) == shares
    assert (shares.priority, shares.compute_policy, shares.memory_oversubscription) == (
        "high", "elastic", True)
    assert shares.allocation == _placed()


def test_a_record_of_an_older_extender_is_completed_from_the_pod_as_before(
        tmp_path: Path) -> None:
    """No policies in the record (written before it carried them): the label, then the
    pod's annotations, as the agent read them before."""
    pod = _pod(priority="high")
    pod["metadata"]["annotations"].update({"egpu.io/compute-policy": "elastic",
                                           "egpu.io/memory-oversubscription": "true"})
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    shares = registry.update(pod)
    assert shares is not None and not shares.allocation.complete
    assert (shares.priority, shares.compute_policy, shares.memory_oversubscription) == (
        "high", "elastic", True)
    del pod["metadata"]["labels"]["egpu.io/priority"]
    pod["metadata"]["uid"] = "uid-B"
    unlabelled = registry.update(pod)
    assert unlabelled is not None and unlabelled.priority == CFG.defaults.priority


def test_an_agent_upgraded_under_a_running_pod_keeps_its_file_without_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The extender was upgraded first (the pod's record has kinds and policies); the file
    was written by the older agent (its allocation has neither): no change, no warning."""
    placed = _placed(priority="low", policy="strict", oversubscription=False)
    old_allocation = Allocation(tuple(c.replace(kind=None) for c in placed.containers), "n1")
    old_file = PodShares("team", "a", "uid-A", "low", "strict", False, old_allocation)
    folder = tmp_path / "private" / "allocations"
    folder.mkdir(parents=True)
    (folder / "uid-A.json").write_text(old_file.encode())
    pod = _pod(priority="low")
    pod["metadata"]["annotations"]["egpu.io/allocation"] = placed.encode()
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    with caplog.at_level(logging.WARNING, logger="node_agent.pods"):
        assert registry.update(pod) == old_file
    assert not caplog.records, caplog.text
    edited = _placed(priority="high", policy="strict", oversubscription=False)
    pod["metadata"]["annotations"]["egpu.io/allocation"] = edited.encode()
    with caplog.at_level(logging.WARNING, logger="node_agent.pods"):
        assert registry.update(pod) == old_file  # an edit is still an edit
    assert len(caplog.records) == 1 and "ignored" in caplog.records[0].getMessage()


def test_a_resync_from_an_older_list_keeps_a_pod_a_catch_up_list_added_meanwhile(
        tmp_path: Path) -> None:
    """The watch's re-LIST is asked for; before its answer is read, a catch-up LIST (an
    Allocate for a pod the watch has not delivered) adds pod X and the kubelet's Allocate
    takes X's share. Bug caught: the older list, without X, then made resync delete X: its
    allocation file went, its hand-out mark was lost, and X was marked deleted, so no later
    catch-up brought it back; the hook refused X's containers."""
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    first = _pod()
    registry.update(first)
    late = _pod()
    late["metadata"].update(name="x", uid="uid-X")
    listed_at = registry.mark()  # the re-LIST is asked for: X is bound right after
    assert registry.add_listed([first, late]) == 1
    registry.consume("uid-X", "c0")
    registry.resync([first], listed_at)  # the older list reaches resync
    files = sorted(p.name for p in (tmp_path / "private" / "allocations").iterdir())
    assert files == ["uid-A.json", "uid-X.json"]
    assert set(registry.shares()) == {"uid-A", "uid-X"}
    assert [p.pod for p in registry.pending()] == ["a"]  # X's share stays handed out
    registry.resync([first], registry.mark())  # a list taken after X: X is gone now
    assert set(registry.shares()) == {"uid-A"}


@pytest.mark.parametrize("record_kinds", [True, False], ids=["record", "older-record"])
def test_a_succeeded_init_container_gives_its_roster_entry_back_and_the_app_keeps_its(
        tmp_path: Path, record_kinds: bool) -> None:
    """A pod with a share in an init container and in its app container books one slot on
    the card (they never run together: egpu.booking), but the hook gave each its roster
    entry. Bug caught: the init container's entry stayed for the pod's life, so at 32 shares
    a card (the roster holds 32) the 17th such pod failed to start with CardFullError. A
    sidecar (restartPolicy Always) keeps its entry; a failed init container (it runs again)
    too. Which is which the allocation record says (its containers' kinds); a record of an
    older extender, without kinds, leaves it to the pod spec."""
    registry = PodRegistry("n1", CFG, str(tmp_path / "private"), str(tmp_path / "run"))
    card = tmp_path / "run" / "cards" / "GPU-0"
    card.mkdir(parents=True)
    # one pod's sidecar takes an entry: 31 pods with init + app shares fill the roster, twice
    # over without the release
    for i in range(card_roster.NSLOTS - 1):
        pod = _pod()
        uid = f"uid-{i}"
        pod["metadata"].update(name=f"p-{i}", uid=uid)
        card_share = (CardShare("GPU-0", 0, 4096, 30),)
        pod["metadata"]["annotations"]["egpu.io/allocation"] = Allocation(containers=(
            ContainerAllocation("warmup", True, card_share, KIND_INIT if record_kinds else None),
            ContainerAllocation("proxy", True, card_share,
                                KIND_SIDECAR if record_kinds else None),
            ContainerAllocation("c0", False, card_share, KIND_APP if record_kinds else None)),
            node="n1").encode()
        pod["spec"]["initContainers"] = [
            {"name": "warmup", "resources": pod["spec"]["containers"][0]["resources"]},
            {"name": "proxy", "restartPolicy": "Always"}]
        assert registry.update(pod) is not None

        def started(name: str, uid: str = uid) -> None:  # the hook, as a container starts
            card_roster.register(str(card), "GPU-0", RosterEntry(
                card_roster.share_owner(f"{uid}_{name}"), name=f"{uid}_{name}"))

        started("warmup")
        if i == 0:
            started("proxy")
        pod["status"] = {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                         "initContainerStatuses": [
                             {"name": "warmup", "containerID": f"containerd://w{i}",
                              "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                                       "containerID": f"containerd://w{i}"}}},
                             {"name": "proxy", "containerID": f"containerd://p{i}",
                              "state": {"terminated": {"exitCode": 0,
                                                       "containerID": f"containerd://p{i}"}}}]}
        registry.update(pod)
        started("c0")  # the app container, once the init container is done
    names = sorted(e.name for e in card_roster.read_roster(str(card)).shares().values())
    # the sidecar's entry stays (it runs on), though its status reads terminated with 0
    assert names == sorted([*(f"uid-{i}_c0" for i in range(card_roster.NSLOTS - 1)),
                            "uid-0_proxy"]), names
    failed = _pod()
    failed["metadata"].update(name="f", uid="uid-f")
    failed["metadata"]["annotations"]["egpu.io/allocation"] = pod["metadata"]["annotations"][
        "egpu.io/allocation"]
    failed["spec"]["initContainers"] = pod["spec"]["initContainers"][:1]
    assert registry.update(failed) is not None
    registry.delete("uid-0")  # room for it
    card_roster.register(str(card), "GPU-0", RosterEntry(
        card_roster.share_owner("uid-f_warmup"), name="uid-f_warmup"))
    failed["status"] = {"phase": "Pending", "initContainerStatuses": [{
        "name": "warmup", "state": {"terminated": {"exitCode": 1,
                                                   "containerID": "containerd://x"}}}]}
    registry.update(failed)
    assert "uid-f_warmup" in {e.name for e in card_roster.read_roster(str(card)).shares().values()}


def test_the_allocation_records_kinds_say_which_init_containers_are_plain() -> None:
    """The kinds the extender wrote decide (the spec is not read again: here it lists no init
    container at all); a container without a share (not in the record) is none; a record of
    an older extender (no kinds) is told from the spec, sidecars by restartPolicy Always."""
    card = (CardShare("GPU-0", 0, 4096, 30),)
    pod = _pod()
    record = Allocation(containers=(
        ContainerAllocation("warmup", True, card, KIND_INIT),
        ContainerAllocation("proxy", True, card, KIND_SIDECAR),
        ContainerAllocation("c0", False, card, KIND_APP)), node="n1")
    assert plain_init_containers(record, pod) == {"warmup"}
    older = Allocation(tuple(c.replace(kind=None) for c in record.containers), node="n1")
    pod["spec"]["initContainers"] = [{"name": "warmup"}, {"name": "proxy",
                                                          "restartPolicy": "Always"},
                                     {"name": "setup"}]  # setup: no share
    assert plain_init_containers(older, pod) == {"warmup"}
    pod["spec"]["initContainers"][1].pop("restartPolicy")
    assert plain_init_containers(older, pod) == {"warmup", "proxy"}
    assert plain_init_containers(record, pod) == {"warmup"}  # the record's kinds stand
