"""The claim sweeper: deletes the claims the webhook made that no pod can use any more.

In DRA mode the webhook creates each GPU pod's own ResourceClaim before it answers the
admission review (``webhook.server``); the pod has no UID yet (nor a name, for a replica), so
the claim cannot be owned by it, and nothing in Kubernetes deletes it with the pod. Three
ways leave such a claim behind: the pod is deleted (or ends), the webhook dies after the POST
and before its answer, or an admission step after the webhook refuses the pod. One rule covers
all three (``orphans``, pure): a claim labelled ``app.kubernetes.io/managed-by: egpu-webhook``
is an orphan when

- it is older than ``grace_s`` (a pod is created within the API server's request timeout,
  60 s, of its admission: a younger claim may still get its pod),
- no pod reserves it (``status.reservedFor`` empty: the resourceclaim controller of
  kube-controller-manager drops a deleted or finished pod from there), and
- no pod of its namespace that can still run names it (``spec.resourceClaims[].
  resourceClaimName``; a pod in phase Succeeded or Failed, or deleted before it was
  scheduled, will not run: the resourceclaim controller's own rule).

``ClaimSweeper.sweep_once`` lists the labelled claims, lists the pods only of the namespaces
that have candidates, and deletes each orphan with preconditions on its uid and
resourceVersion, so a claim reserved since it was read is kept. The claim's finalizer
(``resource.kubernetes.io/delete-protection``) is then removed by the resourceclaim controller,
which also clears a leftover allocation. Several webhook replicas may sweep at once: a claim
already gone is not an error.

``run_sweeper`` repeats it every ``interval_s`` (an asyncio task of the webhook; the API calls
run in a thread). It starts when the config makes DRA pods or the webhook creates a claim, so
a webhook that never meets DRA never connects.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from egpu.kube import KubeObject, KubePod, parse_time

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 120.0  # twice the API server's request timeout (60 s)
DEFAULT_INTERVAL_S = 30.0  # between two sweeps


@dataclass(frozen=True)
class Orphan:
    """A claim to delete, with what its deletion's preconditions check."""

    namespace: str
    name: str
    uid: str
    resource_version: str


class SweepStore(Protocol):
    """The API calls of a sweep (``webhook.claimstore.ApiClaimStore``)."""

    def webhook_claims(self) -> list[dict[str, Any]]: ...

    def pods_in(self, namespace: str) -> list[dict[str, Any]]: ...

    def delete_claim(self, namespace: str, name: str, uid: str,
                     resource_version: str) -> bool: ...


def _reserved(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("reservedFor"))


def candidates(claims: Iterable[Mapping[str, Any]], now: datetime,
               grace_s: float) -> list[Mapping[str, Any]]:
    """The claims older than ``grace_s`` seconds at ``now`` that no pod reserves and that are
    not being deleted already (a claim without a readable creationTimestamp is kept)."""
    out = []
    for claim in claims:
        obj = KubeObject(claim)
        created = parse_time(obj.metadata.get("creationTimestamp"))
        if created is None or obj.deleting or _reserved(claim):
            continue
        if (now - created).total_seconds() > grace_s:
            out.append(claim)
    return out


def _can_run(pod: KubePod) -> bool:
    """Not finished and not deleted before it was scheduled (it will never run then)."""
    return not pod.finished and not (pod.deleting and not pod.node_name)


def named_claims(pods: Iterable[Mapping[str, Any]]) -> set[str]:
    """The claims (by name) that the pods that can still run use: named in
    spec.resourceClaims, or made for them from a template (status.resourceClaimStatuses:
    the claims of pods created before egpu wrote each pod's claim itself)."""
    names: set[str] = set()
    for body in pods:
        pod = KubePod(body)
        if not _can_run(pod):
            continue
        entries = [*pod.resource_claims, *pod.resource_claim_statuses]
        for entry in entries:
            name = entry.get("resourceClaimName")
            if isinstance(name, str) and name:
                names.add(name)
    return names



def orphans(claims: Sequence[Mapping[str, Any]], pods_by_namespace: Mapping[str, Sequence[
        Mapping[str, Any]]], now: datetime, grace_s: float) -> list[Orphan]:
    """The ``candidates`` that no pod of ``pods_by_namespace[namespace]`` (that can still run)
    names; a namespace missing there names none."""
    return _unnamed(candidates(claims, now, grace_s), pods_by_namespace)


def _unnamed(candidates_: Iterable[Mapping[str, Any]], pods_by_namespace: Mapping[str, Sequence[
        Mapping[str, Any]]]) -> list[Orphan]:
    """The candidates no pod that can still run names (``orphans`` without the age test)."""
    used = {ns: named_claims(pods) for ns, pods in pods_by_namespace.items()}
    out = []
    for claim in candidates_:
        obj = KubeObject(claim)
        if obj.name in used.get(obj.namespace, set()):
            continue
        out.append(Orphan(obj.namespace, obj.name, obj.uid, obj.resource_version))
    return out


class ClaimSweeper:
    """One sweep at a time over a ``SweepStore``; ``deleted`` counts the claims it removed."""

    def __init__(self, store: SweepStore, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.store = store
        self.grace_s = grace_s
        self.deleted = 0

    def sweep_once(self, now: datetime | None = None) -> list[Orphan]:
        """Delete the orphans now; the ones deleted. Raises ClaimStoreError (a listing or a
        deletion the API server refused)."""
        moment = now or datetime.now(UTC)
        found = candidates(self.store.webhook_claims(), moment, self.grace_s)
        namespaces = sorted({KubeObject(c).namespace for c in found})
        pods = {ns: self.store.pods_in(ns) for ns in namespaces}
        done = [o for o in _unnamed(found, pods)
                if self.store.delete_claim(o.namespace, o.name, o.uid, o.resource_version)]
        for orphan in done:
            log.info("deleted ResourceClaim %s/%s: no pod can use it", orphan.namespace,
                     orphan.name)
        self.deleted += len(done)
        return done


async def run_sweeper(sweeper: ClaimSweeper, interval_s: float = DEFAULT_INTERVAL_S,
                      on_deleted: Callable[[int], None] = lambda n: None) -> None:
    """Sweep every ``interval_s`` seconds until cancelled, telling ``on_deleted`` how many
    claims each sweep removed; a failed sweep is logged (a failure like the last one only at
    debug level: an install without DRA's RBAC fails every sweep the same way) and the next
    one runs as planned."""
    loop = asyncio.get_running_loop()
    last_failure = ""
    while True:
        try:
            done = await loop.run_in_executor(None, sweeper.sweep_once)
            if done:
                on_deleted(len(done))
            last_failure = ""
        except Exception as exc:  # the API unreachable, RBAC missing: say so, keep going
            text = str(exc)
            log.log(logging.DEBUG if text == last_failure else logging.WARNING,
                    "claim sweep failed: %s", text)
            last_failure = text
        await asyncio.sleep(interval_s)
