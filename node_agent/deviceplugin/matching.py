"""Which pod's share a kubelet Allocate call is for (FC-12), as a pure function.

The v1beta1 API gives Allocate and GetPreferredAllocation only device ids, never the pod. The
egpu scheduler has already chosen each container's cards (``egpu.io/allocation``), so:

- ``match(device_ids, pending)``: the card set of the requested slots is compared with the card
  sets of the *pending* containers on this node (bound here, share not yet handed out).
  Exactly one pending container with that card set -> ``Matched`` with its identity and share.
  Several, all with that card set -> ``Ambiguous``: the cards are right whichever it is, so the
  container may get the cards; the share itself is decided by the runtime hook, which knows
  the container from the runtime's annotations (and refuses when it cannot). No pending
  container with that card set, or a card named twice -> ``Unmatched`` with a message: the
  container must fail to start. Never a guess that could hand out another pod's share.
- ``preferred(...)``: what GetPreferredAllocation answers: slots on the cards of the pending
  container of that size that the node agent saw first (the kubelet admits pods in about the
  order it sees them; ``candidate_for`` finds it), else distinct cards with the most free
  slots.

Waiting for a pod that the agent has not seen yet is the gRPC edge's business
(``service.py``): ``Unmatched.no_pod`` and a None ``candidate_for`` tell it that a pod may
still arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from egpu.contract import (
    ENV_ALLOCATION_ERROR,
    ENV_CONTAINER,
    ENV_CORES,
    ENV_DEVICES,
    ENV_MEMORY_LIMIT_MIB,
    ENV_POD_UID,
    NVIDIA_VISIBLE_DEVICES,
)
from egpu.records import ContainerAllocation
from node_agent.deviceplugin.slots import card_of


@dataclass(frozen=True)
class Pending:
    """A container bound to this node whose share the kubelet has not yet allocated.
    seen: order in which the node agent first saw the pod (smaller = earlier)."""

    pod_uid: str
    namespace: str
    pod: str
    share: ContainerAllocation
    seen: int = 0

    @property
    def container(self) -> str:
        return self.share.name

    @property
    def cards(self) -> frozenset[str]:
        return frozenset(self.share.uuids)


@dataclass(frozen=True)
class Matched:
    """One pending container uses exactly these cards."""

    pending: Pending


@dataclass(frozen=True)
class Ambiguous:
    """Several pending containers use exactly these cards; uuids: in card-index order."""

    uuids: tuple[str, ...]
    candidates: tuple[Pending, ...]


@dataclass(frozen=True)
class Unmatched:
    """No pending container fits; message: why (shown to the user). no_pod: True when no
    pending container uses these cards at all (the pod may not have reached the agent yet:
    worth waiting for), False when the request itself is wrong (never fits)."""

    message: str
    no_pod: bool = False


Match = Matched | Ambiguous | Unmatched


def match(device_ids: Sequence[str], pending: Iterable[Pending], node: str = "") -> Match:
    """Match one container request's slot ids against the pending containers (module doc)."""
    cards = [card_of(d) for d in device_ids]
    if not cards:
        return Unmatched("the kubelet asked for no devices")
    if len(set(cards)) != len(cards):
        return Unmatched(
            f"the kubelet chose {len(cards)} slots on {len(set(cards))} cards "
            f"({', '.join(sorted(device_ids))}); a share needs distinct cards"
        )
    wanted = frozenset(cards)
    candidates = tuple(p for p in pending if p.cards == wanted)
    if len(candidates) == 1:
        return Matched(candidates[0])
    if not candidates:
        where = f" on node {node}" if node else ""
        return Unmatched(
            f"no pod bound{where} waits for a share on cards {', '.join(sorted(wanted))}: the "
            "kubelet's device choice does not match the scheduler's allocation "
            "(egpu.io/allocation); the pod fails admission and its controller replaces it",
            no_pod=True,
        )
    order = {u: i for p in candidates for i, u in enumerate(p.share.uuids)}
    first = candidates[0].share
    index = {c.uuid: c.index for c in first.cards}
    uuids = tuple(sorted(wanted, key=lambda u: (index.get(u, 0), order[u])))
    return Ambiguous(uuids, candidates)


def allocate_envs(result: Match, device_ids: Sequence[str]) -> dict[str, str]:
    """The container's environment for one Allocate answer.

    Matched: NVIDIA_VISIBLE_DEVICES (allocation order), EGPU_POD_UID, EGPU_CONTAINER,
    EGPU_MEMORY_LIMIT_MIB / EGPU_CORES (when equal on every card). Ambiguous: only the cards.
    Unmatched: EGPU_ALLOCATION_ERROR and NVIDIA_VISIBLE_DEVICES=void (no card). Always
    EGPU_DEVICES (the slot ids), which tells the runtime hook the container has an egpu share.
    """
    envs = {ENV_DEVICES: ",".join(device_ids)}
    if isinstance(result, Unmatched):
        envs[ENV_ALLOCATION_ERROR] = result.message
        envs[NVIDIA_VISIBLE_DEVICES] = "void"
        return envs
    if isinstance(result, Ambiguous):
        envs[NVIDIA_VISIBLE_DEVICES] = ",".join(result.uuids)
        return envs
    share = result.pending.share
    envs[NVIDIA_VISIBLE_DEVICES] = ",".join(share.uuids)
    envs[ENV_POD_UID] = result.pending.pod_uid
    envs[ENV_CONTAINER] = share.name
    if len({c.memory_mib for c in share.cards}) == 1:
        envs[ENV_MEMORY_LIMIT_MIB] = str(share.cards[0].memory_mib)
    if len({c.cores for c in share.cards}) == 1 and share.cards[0].cores:
        envs[ENV_CORES] = str(share.cards[0].cores)
    return envs


def _free_slots(available: Sequence[str]) -> dict[str, list[str]]:
    """card uuid -> its available slot ids, lowest first."""
    free: dict[str, list[str]] = {}
    for device in sorted(available):
        free.setdefault(card_of(device), []).append(device)
    return free


def candidate_for(
    available: Sequence[str], must_include: Sequence[str], size: int, pending: Iterable[Pending]
) -> Pending | None:
    """The pending container GetPreferredAllocation steers the kubelet to: the first seen
    one with ``size`` cards, including those of ``must_include``, each with an available
    slot; None when no pending container fits (the fallback of ``preferred``)."""
    free = _free_slots(available)
    must_cards = {card_of(d) for d in must_include}
    for candidate in sorted(pending, key=lambda p: p.seen):
        if len(candidate.cards) != size or not must_cards <= candidate.cards:
            continue
        if all(free.get(u) for u in candidate.cards):
            return candidate
    return None


def preferred(
    available: Sequence[str], must_include: Sequence[str], size: int, pending: Iterable[Pending]
) -> list[str]:
    """GetPreferredAllocation's answer for one container: ``size`` slot ids from
    ``available`` that include ``must_include`` (module doc). Slots are taken lowest id first
    on each card so that answers are stable."""
    free = _free_slots(available)
    candidate = candidate_for(available, must_include, size, pending)
    if candidate is not None:
        return [next((d for d in must_include if card_of(d) == u), free[u][0])
                for u in candidate.share.uuids]
    chosen = list(must_include)
    used = {card_of(d) for d in chosen}
    for uuid in sorted(free, key=lambda u: (-len(free[u]), u)):
        if len(chosen) >= size:
            break
        if uuid not in used:
            chosen.append(free[uuid][0])
            used.add(uuid)
    for device in sorted(available):  # fewer cards than slots asked: fill up (Allocate refuses)
        if len(chosen) >= size:
            break
        if device not in chosen:
            chosen.append(device)
    return chosen[:size]
