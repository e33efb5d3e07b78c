"""The pods bound to this node: their shares, the pending ones, and their allocation files.

- ``pod_shares(pod, config)`` (pure): the ``PodShares`` record of a pod (Kubernetes JSON
  object) from its ``egpu.io/allocation`` annotation, or None. The record carries the pod's
  policies as the scheduler resolved them at placement; only a record of an older scheduler
  (without them) makes the agent read the pod spec for them (``egpu.requests.read_pod``).
- ``PodRegistry``: the node's pods as the agent's watch reports them (thread-safe). It writes
  each pod's allocation file ``<NODE_PRIVATE_DIR>/allocations/<pod-uid>.json`` (read by the
  runtime hook) when it first sees the allocation, and never rewrites it: a later different
  ``egpu.io/allocation`` (an edit after binding; for a record of an older scheduler, also an
  edited ``egpu.io/priority`` label, which the agent reads then) is ignored with a warning
  naming the pod, and the first shares are kept (in memory too). It removes the
  files and folders of deleted pods and their shares from the cards' rosters, and answers
  which containers are still *pending* (for the device plugin, FC-12). Each new or changed
  pod wakes the threads waiting in ``wait_for_change`` (the device plugin waiting for a pod
  the watch has not delivered yet).
- ``watch_pods``: the Kubernetes watch (fieldSelector spec.nodeName) that feeds the registry.
- ``list_node_pods`` / ``PodCatchUp``: what the device plugin calls when the kubelet asks for
  a pod's devices before the watch delivered that pod: one LIST of the node's pods (the pods
  the registry does not know yet are added) and a wait on the registry (``RELIST_INTERVAL_S``).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from egpu import card_roster
from egpu.config import Config
from egpu.contract import (
    ALLOCATIONS_SUBDIR,
    ANN_ALLOCATION,
    CARDS_SUBDIR,
    CONTAINERS_SUBDIR,
    HOOK_SUBDIR,
    LABEL_PRIORITY,
    allocation_file_name,
    container_dir_name,
)
from egpu.kube import KubePod
from egpu.policies import ComputePolicy, Priority
from egpu.records import KIND_INIT, KIND_SIDECAR, Allocation, PodShares, RecordError
from egpu.requests import read_pod
from node_agent.deviceplugin.matching import Pending

log = logging.getLogger(__name__)

DELETED_UIDS_KEPT = 4096  # uids of deleted pods remembered so that a stale LIST never revives one
RELIST_INTERVAL_S = 1.0  # PodCatchUp: at most one LIST of the node's pods per this many seconds

ListPods = Callable[[float], list[Mapping[str, Any]]]
"""One LIST of this node's pods from the API server (Kubernetes JSON objects), within the
given timeout in seconds; raises on failure."""


def pod_shares(pod: Mapping[str, Any], config: Config) -> PodShares | None:
    """The pod's PodShares, or None when it has no (valid) ``egpu.io/allocation``. The
    policies are the record's; a record without them (an older scheduler's) falls back on the
    pod spec, read as before the record carried them (``legacy_policies``)."""
    view = KubePod(pod)
    text = view.annotation(ANN_ALLOCATION)
    if not text:
        return None
    try:
        allocation = Allocation.decode(text)
    except RecordError as exc:
        log.warning("pod %s: %s", view.key, exc)
        return None
    priority, compute_policy, oversubscription = (
        allocation.policies or legacy_policies(pod, config))
    return PodShares(
        namespace=view.namespace,
        pod=view.name,
        pod_uid=view.uid,
        priority=priority,
        compute_policy=compute_policy,
        memory_oversubscription=oversubscription,
        allocation=allocation,
        low_priority_floor=config.low_priority_floor_percent,
    )


def legacy_policies(pod: Mapping[str, Any],
                    config: Config) -> tuple[Priority, ComputePolicy, bool]:
    """(priority, compute policy, memory oversubscription) of a pod whose allocation record
    does not carry them (written by a scheduler older than the record's policies): read from
    the pod, the label ``egpu.io/priority`` first, as the agent did before."""
    request = read_pod(pod, config).request
    priority = Priority.of(KubePod(pod).label(LABEL_PRIORITY)) or (
        request.priority if request else config.defaults.priority)
    return (priority,
            request.compute_policy if request else config.defaults.compute_policy,
            request.memory_oversubscription if request else False)


def started_containers(pod: Mapping[str, Any]) -> set[str]:
    """Containers (init and app) whose status shows they were created (running, terminated,
    or restarted): the kubelet has allocated their devices."""
    names: set[str] = set()
    for entry in KubePod(pod).container_statuses:
        state = entry.get("state") or {}
        if "running" in state or "terminated" in state or entry.get("restartCount", 0) > 0:
            names.add(str(entry.get("name")))
    return names


def plain_init_containers(allocation: Allocation, pod: Mapping[str, Any]) -> set[str]:
    """Names of the pod's plain init containers with a share: kind ``KIND_INIT`` in its
    allocation record, as the scheduler decided at placement (not sidecars: those run on
    beside the app containers). A record of an older scheduler carries no kinds: its init
    containers are told from sidecars (``restartPolicy: Always``) by the pod spec, as the
    agent did before."""
    kinds = {c.name: c.kind for c in allocation.containers if c.init}
    if None in kinds.values():
        spec = pod.get("spec") or {}
        sidecars = {c.get("name") for c in spec.get("initContainers") or ()
                    if isinstance(c, dict) and c.get("restartPolicy") == "Always"}
        kinds = {name: kind or (KIND_SIDECAR if name in sidecars else KIND_INIT)
                 for name, kind in kinds.items()}
    return {name for name, kind in kinds.items() if kind == KIND_INIT}


def succeeded_init_containers(pod: Mapping[str, Any]) -> dict[str, str]:
    """name -> containerID of the pod's init containers whose status says they succeeded
    (exit code 0), sidecars included (their status alone does not tell them apart)."""
    out = {}
    for entry in (pod.get("status") or {}).get("initContainerStatuses") or ():
        if not isinstance(entry, dict):
            continue
        terminated = (entry.get("state") or {}).get("terminated") or {}
        cid = terminated.get("containerID") or entry.get("containerID")
        if terminated.get("exitCode") == 0 and isinstance(cid, str) and cid:
            out[str(entry.get("name"))] = cid
    return out


def completed_init_containers(pod: Mapping[str, Any],
                              allocation: Allocation) -> list[tuple[str, str]]:
    """``(name, containerID)`` of the pod's plain init containers with a share
    (``plain_init_containers``) whose status says they succeeded (exit code 0)."""
    plain = plain_init_containers(allocation, pod)
    return [(name, cid) for name, cid in succeeded_init_containers(pod).items()
            if name in plain]


def _pod_changed(kept: PodShares, seen: PodShares) -> bool:
    """Whether what the pod says (allocation, priority, policies) differs from the file. The
    floor is the node's config, not the pod's: a new lowPriorityFloorPercent reaches new pods
    only, and is no change of the pod's. Nor are the facts an older agent's file lacks (its
    allocation has no kinds and no policies: the file's top-level policies stand for them)."""
    allocation = seen.allocation
    if not kept.allocation.complete:
        allocation = Allocation(tuple(c.replace(kind=None) for c in allocation.containers),
                                allocation.node)
    return kept != seen.replace(low_priority_floor=kept.low_priority_floor,
                                allocation=allocation)


def remove_pod_files(private_dir: str, runtime_dir: str, uid: str) -> None:
    """Remove a pod's allocation file, hook folders and accounting region folders, and its
    shares from every card's roster with their share files (absent ones are fine; errors
    inside the folders are ignored, a card whose roster cannot be changed is logged)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(private_dir, ALLOCATIONS_SUBDIR, allocation_file_name(uid)))
    release_pod_shares(private_dir, runtime_dir, uid)


def release_pod_shares(private_dir: str, runtime_dir: str, uid: str) -> None:
    """Free what a pod's containers hold on the node: their roster entries (a card's roster
    has NSLOTS of them), share files, hook folders and accounting region folders. Its
    allocation file stays (the pod may still exist: a finished one)."""
    paths = [path for folder in (os.path.join(private_dir, HOOK_SUBDIR),
                                 os.path.join(runtime_dir, CONTAINERS_SUBDIR))
             for path in glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(uid)}_*"))]
    unregister_pod_shares(runtime_dir, uid, {os.path.basename(p) for p in paths})
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


_CARD_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def unregister_pod_shares(runtime_dir: str, uid: str, dir_names: set[str]) -> int:
    """Free pod ``uid``'s shares in every card roster under ``<runtime_dir>/cards`` and remove
    their share files: the entries named ``<uid>_...`` (a name is cut to 31 bytes: egpu
    .card_roster.name_matches_prefix) and those of the folders ``dir_names`` (``<uid>_<c>``,
    by owner), never an entry the interposer registered itself (FLAG_RAW). Returns how many
    entries were freed. Never follows a link; a card it cannot change is logged."""
    return _unregister_on_cards(runtime_dir, uid, dir_names, f"{uid}_")


def unregister_owners(runtime_dir: str, uid: str, dir_names: set[str]) -> int:
    """Free only the shares of pod ``uid``'s folders ``dir_names`` (``<uid>_<c>``, by owner)
    in every card roster under ``<runtime_dir>/cards`` and remove their share files: the
    pod's other containers keep theirs (its succeeded init containers, while its app
    containers run). Returns how many entries were freed; as ``unregister_pod_shares``."""
    return _unregister_on_cards(runtime_dir, uid, dir_names, None)


def _unregister_on_cards(runtime_dir: str, uid: str, dir_names: set[str],
                         name_prefix: str | None) -> int:
    """Free, on every card, the owners of ``dir_names`` and (``name_prefix`` not None) the
    entries whose name starts with it, never a FLAG_RAW one (``unregister_pod_shares``)."""
    folder = os.path.join(runtime_dir, CARDS_SUBDIR)
    known = {card_roster.share_owner(name) for name in dir_names}
    freed = 0
    try:
        cards_fd = os.open(folder, _CARD_DIR_FLAGS)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        log.warning("pod %s: card rosters under %s left as they are: %s", uid, folder, exc)
        return 0
    try:
        for name in os.listdir(cards_fd):
            path = os.path.join(folder, name)
            try:
                card_fd = os.open(name, _CARD_DIR_FLAGS, dir_fd=cards_fd)
            except OSError:
                continue  # not a card folder (an old region file, a link): nothing of ours
            try:
                roster = card_roster.read_roster(card_fd, where=path)
                owners = {e.owner for e in roster.shares().values()
                          if not e.flags & card_roster.FLAG_RAW
                          and (e.owner in known or (name_prefix is not None and card_roster
                                                    .name_matches_prefix(e.name, name_prefix)))}
                if owners or known:
                    freed += len(card_roster.unregister(card_fd, owners | known, where=path))
            except FileNotFoundError:
                continue  # no roster
            except OSError as exc:
                log.warning("pod %s: its shares on card folder %s are left in the roster: %s",
                            uid, path, exc)
            finally:
                os.close(card_fd)
    finally:
        os.close(cards_fd)
    return freed


InitClaimFolders = Callable[[str], Mapping[str, frozenset[str]]]
"""For a pod uid: the accounting folders of its prepared ResourceClaims that only its plain
init containers draw on -> the names of those containers (the DRA kubelet plugin's
``DraDriver.init_only_folders``)."""


class PodRegistry:
    """This node's egpu pods (module docstring). ``private_dir``: NODE_PRIVATE_DIR;
    ``runtime_dir``: RUNTIME_DIR (both host paths); ``owned_elsewhere(uid)``: whether another
    writer (the DRA kubelet plugin) owns that pod's allocation file, which ``resync`` then
    leaves in place (default: none). ``init_claim_folders``: the claim folders of a DRA pod
    that only its plain init containers draw on (``InitClaimFolders``); the registry frees
    their roster entries once those containers succeeded (default: none)."""

    def __init__(self, node: str, config: Config, private_dir: str, runtime_dir: str,
                 owned_elsewhere: Callable[[str], bool] | None = None,
                 init_claim_folders: InitClaimFolders | None = None) -> None:
        self.owned_elsewhere = owned_elsewhere
        self.init_claim_folders = init_claim_folders
        self.node = node
        self.config = config
        self.private_dir = private_dir
        self.runtime_dir = runtime_dir
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._generation = 0  # +1 for every pod recorded (added or modified)
        self._pods: dict[str, tuple[Mapping[str, Any], PodShares]] = {}
        self._seen: dict[str, int] = {}
        self._consumed: set[tuple[str, str]] = set()
        self._counter = 0
        self._warned: dict[str, str] = {}  # uid -> the ignored shares last logged
        self._deleted: dict[str, None] = {}  # uids of deleted pods, oldest first (bounded)
        self._released: set[str] = set()  # finished pods whose shares were freed
        # pod uid -> container ids of its succeeded init containers whose roster entries
        # were freed (a new sandbox runs its init containers again, each a new id)
        self._released_inits: dict[str, set[str]] = {}
        # DRA pod uid -> claim folder -> the container ids of its init containers when its
        # roster entry was last freed: freed again only once every one of them ran again
        self._released_folders: dict[str, dict[str, frozenset[str]]] = {}

    # --- feeding ------------------------------------------------------------------------
    def update(self, pod: Mapping[str, Any], *, only_new: bool = False) -> PodShares | None:
        """Record an added/modified pod; writes its allocation file when it changed.
        Returns its PodShares (None: not an egpu pod of this node). ``only_new``: record the
        pod only when the registry does not know it and it was not deleted (a LIST may be
        older than what the watch delivered); returns None otherwise."""
        view = KubePod(pod)
        uid = view.uid
        if view.node_name != self.node or not uid:
            return None
        shares = pod_shares(pod, self.config)
        if shares is None:
            self._release_claim_inits(pod, uid, view.finished)
            return None
        with self._lock:
            if only_new and (uid in self._pods or uid in self._deleted):
                return None
            if uid not in self._seen:
                self._counter += 1
                self._seen[uid] = self._counter
            known = self._pods.get(uid)
            if known is None:
                shares = self._write_once(uid, shares, view)
            elif _pod_changed(known[1], shares):
                self._ignored(uid, view, shares, known[1])
                shares = known[1]
            if known is not None and view.admitted and not KubePod(known[0]).admitted:
                self._admitted(uid, shares)
            self._pods[uid] = (pod, shares)
            self._generation += 1
            self._changed.notify_all()
            release = view.finished and uid not in self._released
            if release:
                self._released.add(uid)
            freed = self._released_inits.setdefault(uid, set())
            done_inits = [] if release else [
                (name, cid) for name, cid in completed_init_containers(pod, shares.allocation)
                if cid not in freed]
            freed.update(cid for _, cid in done_inits)
        if release:
            # Succeeded or Failed is final: no container of it runs again. A Job's finished
            # pods stay until they are deleted, and their roster entries with them would
            # fill the card's roster (CardFullError for every new container on it).
            release_pod_shares(self.private_dir, self.runtime_dir, uid)
        if done_inits:
            # An init container that succeeded never runs again in this sandbox; its entry
            # held a roster entry beside the app containers for the pod's life, though the
            # pod books its slot once (egpu.booking): at 32 shares a card, the 17th pod
            # with an init container found the roster full.
            unregister_owners(self.runtime_dir, uid, {
                container_dir_name(uid, name) for name, _ in done_inits})
        return shares

    def _release_claim_inits(self, pod: Mapping[str, Any], uid: str, finished: bool) -> None:
        """A DRA pod (no ``egpu.io/allocation``): free the roster entries of the claim folders
        that only its plain init containers draw on (``init_claim_folders``) once all of
        those containers succeeded. The webhook's plan gives an init container its own
        request set (its app container's request and a headroom request), so its folder
        held a roster entry beside the app container's for the pod's life. A folder any
        other container draws on (of this pod or another) keeps its entry; the claim's
        folders go at NodeUnprepareResources as before, and a finished pod's with them."""
        if self.init_claim_folders is None or finished:
            return
        done = succeeded_init_containers(pod)
        with self._lock:
            if uid in self._deleted:
                return
            seen = set(self._released_inits.get(uid, ()))
        if all(cid in seen for cid in done.values()):
            return  # nothing new succeeded: the plugin's state is not read
        try:
            folders = self.init_claim_folders(uid)  # {} at once for a pod of no prepared claim
        except OSError as exc:  # the plugin's state unreadable: the next change tries again
            log.warning("pod %s: its claims' state unreadable, its succeeded init containers "
                        "keep their roster entries for now: %s", KubePod(pod).key, exc)
            return
        with self._lock:
            if uid in self._deleted:
                return
            # each succeeded container is looked at once (a new sandbox runs it again under
            # a new container id: its folder is freed again when it succeeds), also when the
            # pod has no init-only folder (an init container without a share): its claims
            # were prepared before its containers started, so the answer stays empty
            self._released_inits.setdefault(uid, set()).update(done.values())
            if not folders:
                return
            freed = self._released_folders.setdefault(uid, {})
            # A folder is freed again only once EVERY init container drawing on it succeeded
            # under an id other than those of the last release: after a sandbox is
            # recreated, the pod's status may show one init container's new success beside
            # another's old terminated(0) while that one's new run (its hook registered the
            # folder again) is being created; freeing then pulls the entry from under it.
            release = {folder for folder, names in folders.items()
                       if names and all(n in done for n in names)
                       and not any(done[n] in freed.get(folder, ()) for n in names)}
            for folder in release:
                freed[folder] = frozenset(done[n] for n in folders[folder])
        if release:
            # a succeeded init container never runs again in this sandbox
            unregister_owners(self.runtime_dir, uid, release)

    def add_listed(self, pods: list[Mapping[str, Any]]) -> int:
        """Add the pods of a LIST that the registry does not know yet (never changes a known
        pod, never revives a deleted one: the watch stays the authority). Returns how many
        were added."""
        return sum(self.update(pod, only_new=True) is not None for pod in pods)

    def generation(self) -> int:
        """A number that grows whenever a pod is recorded (added or modified)."""
        with self._lock:
            return self._generation

    def wait_for_change(self, generation: int, timeout_s: float) -> bool:
        """Wait until a pod is recorded after ``generation`` was read, at most ``timeout_s``
        seconds. Returns whether one was."""
        with self._changed:
            return self._changed.wait_for(lambda: self._generation != generation,
                                          max(timeout_s, 0.0))

    def _ignored(self, uid: str, pod: KubePod, seen: PodShares, kept: PodShares) -> None:
        """Log (once per pod and value) that a changed allocation or priority was ignored."""
        text = seen.encode()
        if self._warned.get(uid) == text:
            return
        self._warned[uid] = text
        log.warning("pod %s (uid %s): its %s annotation or %s label changed after its "
                    "allocation file was written; ignored, the file keeps the first one "
                    "(allocation %s, priority %s)", pod.key, uid, ANN_ALLOCATION,
                    LABEL_PRIORITY, kept.allocation.encode(), kept.priority)

    def _write_once(self, uid: str, shares: PodShares, pod: KubePod) -> PodShares:
        """Write the pod's allocation file unless one exists (an agent restart): the file is
        written once and never replaced. Returns the shares the file holds."""
        text = shares.encode()
        try:
            self._write(uid, text)
        except FileExistsError:
            try:
                with open(self._path(uid), encoding="utf-8") as handle:
                    on_disk = PodShares.decode(handle.read())
            except (OSError, RecordError) as exc:
                log.warning("pod %s (uid %s): allocation file %s unreadable (%s); left as "
                            "it is", pod.key, uid, self._path(uid), exc)
                return shares
            if _pod_changed(on_disk, shares):
                self._ignored(uid, pod, shares, on_disk)
            return on_disk
        return shares

    def delete(self, uid: str) -> None:
        """Forget a deleted pod; remove its allocation file, hook files and region folders."""
        with self._lock:
            self._pods.pop(uid, None)
            self._seen.pop(uid, None)
            self._warned.pop(uid, None)
            self._released.discard(uid)
            self._released_inits.pop(uid, None)
            self._released_folders.pop(uid, None)
            self._deleted[uid] = None
            while len(self._deleted) > DELETED_UIDS_KEPT:
                del self._deleted[next(iter(self._deleted))]
            self._consumed = {c for c in self._consumed if c[0] != uid}
        remove_pod_files(self.private_dir, self.runtime_dir, uid)

    def mark(self) -> int:
        """A point in the registry's history, taken before a LIST is asked for: ``resync``
        then leaves alone the pods first seen after it (the LIST may be older than they)."""
        with self._lock:
            return self._counter

    def resync(self, pods: list[Mapping[str, Any]], listed_at: int | None = None) -> None:
        """Replace the registry's content by a full list of the node's pods (at start and
        after a watch restart). Pods gone meanwhile lose their files, also those deleted
        while the agent was down (found by their allocation files). ``listed_at``: the
        ``mark()`` taken before the LIST was asked for; a pod first seen after it (a catch-up
        LIST or the old watch delivered it meanwhile) is newer than the list, not gone."""
        uids = set()
        for pod in pods:
            if self.update(pod) is not None:
                uids.add(KubePod(pod).uid)
        listed = {KubePod(pod).uid for pod in pods}
        with self._lock:
            newer = {u for u, seen in self._seen.items()
                     if listed_at is not None and seen > listed_at}
            gone = {u for u in self._pods if u not in uids and u not in newer}
            for kept in (self._released_inits, self._released_folders):
                for uid in [u for u in kept if u not in listed and u not in self._pods]:
                    del kept[uid]  # a DRA pod deleted while the watch was away
        gone.update(u for u in self._files_on_disk() if u not in uids and u not in newer
                    and not (self.owned_elsewhere is not None and self.owned_elsewhere(u)))
        for uid in sorted(gone):
            self.delete(uid)

    def _files_on_disk(self) -> list[str]:
        """The pod uids that have an allocation file."""
        folder = os.path.join(self.private_dir, ALLOCATIONS_SUBDIR)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return []
        return [n.removesuffix(".json") for n in names if n.endswith(".json")]

    # --- queries ------------------------------------------------------------------------
    def pending(self) -> list[Pending]:
        """Containers with a share whose devices the kubelet has not yet allocated, in the
        order it allocates them: pods as the agent first saw them, each pod's containers as
        its record lists them (init containers, then app containers, each in spec order).
        A pod the kubelet has admitted (``KubePod.admitted``) has none left. A deleting pod
        keeps its place until it is gone or admitted: a kubelet that saw it before its
        deletion still admits it, and its Allocate must not take another pod's share."""
        out: list[Pending] = []
        with self._lock:
            for uid, (pod, shares) in sorted(self._pods.items(), key=lambda i: self._seen[i[0]]):
                view = KubePod(pod)
                if view.finished or view.admitted:
                    continue
                started = started_containers(pod)
                for entry in shares.allocation.containers:
                    if entry.name in started or (uid, entry.name) in self._consumed:
                        continue
                    out.append(Pending(uid, shares.namespace, shares.pod, entry, self._seen[uid]))
        return out

    def consume(self, uid: str, container: str) -> None:
        """Mark a container's share as handed out by Allocate (for an ambiguous Allocate: the
        first container on those cards in the kubelet's order, standing for whichever one
        the kubelet was admitting; ``_admitted`` settles which it was)."""
        with self._lock:
            self._consumed.add((uid, container))

    def _admitted(self, uid: str, shares: PodShares) -> None:
        """The kubelet admitted pod ``uid`` (lock held): each of its containers that no
        Allocate was counted for was handed out as an ambiguous Allocate counted for another
        waiting container on the same cards, which waits again: without this the count stays
        on the wrong pod, and when the right one leaves the pending list too, the next pod on
        those cards finds none pending (GetPreferredAllocation steers it elsewhere)."""
        for entry in shares.allocation.containers:
            if (uid, entry.name) in self._consumed:
                self._consumed.discard((uid, entry.name))
                continue
            cards = frozenset(entry.uuids)
            stand_ins = sorted((self._seen.get(u, 0), u, name) for u, name in self._consumed
                               if u != uid and self._waiting_on(u, name, cards))
            if stand_ins:
                _, other, name = stand_ins[0]
                self._consumed.discard((other, name))

    def _waiting_on(self, uid: str, container: str, cards: frozenset[str]) -> bool:
        """Whether pod ``uid`` awaits admission and its ``container`` uses exactly ``cards``
        (lock held)."""
        known = self._pods.get(uid)
        if known is None or KubePod(known[0]).admitted:
            return False
        return any(c.name == container and frozenset(c.uuids) == cards
                   for c in known[1].allocation.containers)

    def shares(self) -> dict[str, PodShares]:
        """pod uid -> PodShares of every known pod that has not finished (metrics)."""
        with self._lock:
            return {uid: s for uid, (pod, s) in self._pods.items()
                    if not KubePod(pod).finished}

    # --- files --------------------------------------------------------------------------
    def _path(self, uid: str) -> str:
        return os.path.join(self.private_dir, ALLOCATIONS_SUBDIR, allocation_file_name(uid))

    def _write(self, uid: str, text: str) -> None:
        """Create the allocation file atomically (a complete file or none); raises
        FileExistsError when it exists: it is never replaced."""
        folder = os.path.join(self.private_dir, ALLOCATIONS_SUBDIR)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        path = self._path(uid)
        tmp = f"{path}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            os.link(tmp, path)  # fails with FileExistsError where the file exists
        finally:
            os.unlink(tmp)


def watch_pods(core_v1: Any, registry: PodRegistry, stop: threading.Event) -> None:
    """Feed ``registry`` from a watch of this node's pods until ``stop`` is set; lists and
    resyncs at each (re)start. Runs in its own thread; errors are logged and retried."""
    from kubernetes import watch  # the I/O edge: imported here only

    selector = f"spec.nodeName={registry.node}"
    serialize = core_v1.api_client.sanitize_for_serialization
    while not stop.is_set():
        try:
            listed_at = registry.mark()
            listing = core_v1.list_pod_for_all_namespaces(field_selector=selector)
            registry.resync([serialize(p) for p in listing.items], listed_at)
            stream = watch.Watch().stream(
                core_v1.list_pod_for_all_namespaces, field_selector=selector,
                resource_version=listing.metadata.resource_version, timeout_seconds=60)
            for event in stream:
                if stop.is_set():
                    break
                pod = serialize(event["object"])
                if event["type"] == "DELETED":
                    if uid := KubePod(pod).uid:
                        registry.delete(uid)
                elif event["type"] in ("ADDED", "MODIFIED"):
                    registry.update(pod)
        except Exception as exc:  # the watch restarts; never dies
            log.warning("pod watch: %s; retrying", exc)
            stop.wait(2)


def list_node_pods(core_v1: Any, node: str) -> ListPods:
    """A ``ListPods`` for ``node``: one LIST of all namespaces' pods with fieldSelector
    ``spec.nodeName=<node>`` (``core_v1``: kubernetes.client.CoreV1Api)."""
    serialize = core_v1.api_client.sanitize_for_serialization

    def list_pods(timeout_s: float) -> list[Mapping[str, Any]]:
        listing = core_v1.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _request_timeout=max(timeout_s, 0.1))
        return [serialize(p) for p in listing.items]

    return list_pods


class PodCatchUp:
    """What the device plugin calls when the kubelet asks for devices that no pending
    container uses (the pod may not have reached the watch yet): ``catch_up(timeout_s)``.

    Each call LISTs the node's pods (``list_pods``; at most once per ``relist_interval_s``,
    None: no API server) and adds those the registry does not know. A LIST without
    resourceVersion is a consistent read and the kubelet only asks for pods the API server
    has bound here, so after a successful LIST the registry knows the pod if it exists: the
    call returns False (match once more; waiting longer cannot help). Otherwise (no LIST due,
    or it failed: logged) it waits for the watch to record a pod, at most ``timeout_s`` and
    ``relist_interval_s`` seconds, and returns True (match again; call again while the
    caller's deadline allows)."""

    def __init__(self, registry: PodRegistry, list_pods: ListPods | None = None,
                 relist_interval_s: float = RELIST_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.list_pods = list_pods
        self.relist_interval_s = relist_interval_s
        self.clock = clock
        self.lists = 0  # LISTs made (tests, logs)
        self._last_list: float | None = None
        self._lock = threading.Lock()

    def __call__(self, timeout_s: float) -> bool:
        """One catch-up step of at most ``timeout_s`` seconds (class docstring)."""
        start = self.clock()
        generation = self.registry.generation()
        listed = False
        if self.list_pods is not None and self._list_due(start):
            try:
                added = self.registry.add_listed(self.list_pods(timeout_s))
                listed = True
                if added:
                    log.info("a LIST of node %s's pods found %d pod(s) the watch had not "
                             "delivered yet", self.registry.node, added)
            except Exception as exc:  # the API server may be away: wait for the watch
                log.warning("LIST of node %s's pods: %s", self.registry.node, exc)
        if listed:
            return False
        if self.registry.generation() != generation:
            return True
        self.registry.wait_for_change(
            generation, min(timeout_s - (self.clock() - start), self.relist_interval_s))
        return True

    def _list_due(self, now: float) -> bool:
        with self._lock:
            if self._last_list is not None and now - self._last_list < self.relist_interval_s:
                return False
            self._last_list = now
            self.lists += 1
            return True
