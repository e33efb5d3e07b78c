"""The claim sweeper's rule (``webhook.claimsweep``): which of the webhook's claims go.

Each case names the bug it catches. The API side runs on the dev cluster in
tests/e2e/test_dra_claims_e2e.py (a deleted pod, a pod refused after the webhook, a webhook
restart).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from egpu.dra.claims import claim_name
from webhook.claimsweep import ClaimSweeper, orphans

NOW = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
GRACE_S = 120.0


def _claim(name: str, age_s: float, *, namespace: str = "team", reserved: bool = False,
           deleting: bool = False) -> dict[str, Any]:
    stamp = (NOW - timedelta(seconds=age_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                                "resourceVersion": "7", "creationTimestamp": stamp}
    if deleting:
        metadata["deletionTimestamp"] = stamp
    status = {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]} if reserved else {}
    return {"metadata": metadata, "status": status}


def _pod(claim: str, *, phase: str = "Pending", node: str = "",
         deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": f"pod-of-{claim}", "namespace": "team"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-05T11:59:00Z"
    return {"metadata": metadata,
            "spec": {"nodeName": node,
                     "resourceClaims": [{"name": "egpu", "resourceClaimName": claim}]},
            "status": {"phase": phase}}


def _names(claims: list[dict[str, Any]], pods: list[dict[str, Any]]) -> set[str]:
    return {o.name for o in orphans(claims, {"team": pods}, NOW, GRACE_S)}


def test_a_claim_no_pod_names_goes_once_older_than_the_grace() -> None:
    # bug: a pod deleted, or refused after the webhook, leaves its claim forever
    assert _names([_claim("old", GRACE_S + 1)], []) == {"old"}
    # bug: a claim made a moment ago, whose pod the API server is still admitting, is deleted
    assert _names([_claim("young", GRACE_S - 1)], []) == set()


def test_a_claim_a_pod_reserves_or_names_stays() -> None:
    # bug: a running pod's claim is deleted under it (its share freed while in use)
    assert _names([_claim("reserved", 3600, reserved=True)], []) == set()
    # bug: a pending pod's claim (not yet reserved) is deleted before it is scheduled
    assert _names([_claim("pending", 3600)], [_pod("pending")]) == set()
    # bug: a pod terminating on its node loses its claim before its containers stop
    assert _names([_claim("stopping", 3600)],
                  [_pod("stopping", phase="Running", node="n1", deleting=True)]) == set()


def test_a_claim_made_for_a_pending_pod_from_a_template_stays() -> None:
    """Bug caught: only spec.resourceClaims[].resourceClaimName counted, so a claim the
    resourceclaim controller made from an (older egpu's) template for a pod still Pending,
    named only in the pod's status.resourceClaimStatuses, was deleted after the grace, and
    the pod waited forever for it."""
    pod = _pod("unused")
    pod["spec"]["resourceClaims"] = [{"name": "egpu", "resourceClaimTemplateName": "egpu-1a"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "egpu",
                                               "resourceClaimName": "pod-egpu-x7k2"}]
    assert _names([_claim("pod-egpu-x7k2", 600)], [pod]) == set()
    pod["status"]["phase"] = "Succeeded"  # once its pod can never run again it goes
    assert _names([_claim("pod-egpu-x7k2", 600)], [pod]) == {"pod-egpu-x7k2"}


def test_a_claim_whose_pod_can_never_run_goes() -> None:
    # bug: a finished Job's claim is kept as long as its pod object lingers
    done = [_pod("done", phase="Succeeded", node="n1"), _pod("failed", phase="Failed")]
    assert _names([_claim("done", 3600), _claim("failed", 3600)], done) == {"done", "failed"}
    # a pod deleted before it was scheduled never runs (the resourceclaim controller's rule)
    assert _names([_claim("never", 3600)], [_pod("never", deleting=True)]) == {"never"}


def test_claims_being_deleted_and_claims_of_other_namespaces_are_judged_apart() -> None:
    # bug: a claim already deleting is deleted again each sweep (a write per sweep for nothing)
    assert _names([_claim("going", 3600, deleting=True)], []) == set()
    # bug: a pod of another namespace that names the same claim name keeps it
    other = _claim("same", 3600, namespace="other")
    assert {o.namespace for o in orphans([other], {"team": [_pod("same")]}, NOW,
                                         GRACE_S)} == {"other"}


class FakeApi:
    """A SweepStore in memory: delete fails (False) for the names in ``changed``."""

    def __init__(self, claims: list[dict[str, Any]], pods: list[dict[str, Any]],
                 changed: frozenset[str] = frozenset()) -> None:
        self.claims, self.pods, self.changed = claims, pods, changed
        self.listed: list[str] = []
        self.deleted: list[tuple[str, str, str, str]] = []

    def webhook_claims(self) -> list[dict[str, Any]]:
        return self.claims

    def pods_in(self, namespace: str) -> list[dict[str, Any]]:
        self.listed.append(namespace)
        return [p for p in self.pods if p["metadata"]["namespace"] == namespace]

    def delete_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> bool:
        self.deleted.append((namespace, name, uid, resource_version))
        return name not in self.changed


def test_a_sweep_deletes_with_preconditions_and_lists_only_namespaces_with_candidates() -> None:
    api = FakeApi([_claim("gone", 3600), _claim("raced", 3600),
                   _claim("busy", 3600, namespace="quiet", reserved=True)], [],
                  changed=frozenset({"raced"}))
    sweeper = ClaimSweeper(api, GRACE_S)
    done = sweeper.sweep_once(NOW)
    # bug: a claim reserved between the listing and the delete is deleted anyway (the
    # preconditions carry the uid and resourceVersion that were read)
    assert ("team", "gone", "uid-gone", "7") in api.deleted
    assert [o.name for o in done] == ["gone"] and sweeper.deleted == 1
    # bug: every namespace's pods are listed each sweep (a cluster-wide list every 30 s)
    assert api.listed == ["team"]


def test_claim_names_are_dns_names_unique_per_admission_request() -> None:
    # bug: two replicas (one generateName) get one claim, and so one share between them
    first = claim_name("", "web-7d9f8-", "req-1")
    assert first != claim_name("", "web-7d9f8-", "req-2")
    assert first.startswith("web-7d9f8-egpu-")
    # a retried review of one request names the same claim (its create then finds it)
    assert first == claim_name("", "web-7d9f8-", "req-1")
    # bug: a name the API server refuses (upper case, a dot run, too long) fails the pod
    odd = claim_name("Web..X" + "a" * 300, "", "r")
    assert len(odd) <= 253 and odd == odd.lower() and ".." not in odd
    assert claim_name("", "", "r").startswith("pod-egpu-")


async def test_the_sweeper_runs_from_the_start_whatever_the_config_says() -> None:
    """Bug caught: the sweeper started only when the config made DRA pods or once this
    process made a claim, so after a restart of a webhook whose default is the extender
    (pods that chose DRA by their annotation, or a cluster moved back to extender mode) the
    claims of ended pods stayed forever, their cards' capacity booked."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from webhook.claimsweep import ClaimSweeper
    from webhook.server import Settings, create_app

    api = FakeApi([_claim("left", 3600)], [])
    settings = Settings(sweeper=ClaimSweeper(api), sweep_interval_s=0.05)  # type: ignore[arg-type]
    assert not settings.config.config.makes_dra_pods
    async with TestClient(TestServer(create_app(settings))):
        for _ in range(100):
            if api.deleted:
                break
            await asyncio.sleep(0.02)
    assert [d[1] for d in api.deleted] == ["left"]


async def test_a_sweep_failing_the_same_way_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    """An install without DRA's RBAC fails every sweep alike: one warning, not one per 30 s."""
    import asyncio
    import contextlib
    import logging

    from webhook.claimsweep import ClaimSweeper, run_sweeper

    class Refused(FakeApi):
        def webhook_claims(self) -> list[dict[str, Any]]:
            raise RuntimeError("listing the webhook's ResourceClaims failed: 403 Forbidden")

    caplog.set_level(logging.WARNING, logger="webhook.claimsweep")
    task = asyncio.create_task(run_sweeper(ClaimSweeper(Refused([], [])), 0.01))  # type: ignore[arg-type]
    await asyncio.sleep(0.2)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    warnings = [r for r in caplog.records if "claim sweep failed" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
