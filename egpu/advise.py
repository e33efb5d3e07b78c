"""Right-sizing: what a container's share used over a window, and the share it should ask for.

Pure functions over recorded series (no I/O): ``summarize`` reduces one container's samples
(all pods of its workload pooled, every card of its share pooled) to a ``Usage``; ``advise``
turns a ``Usage`` and what the container books into an ``Advice``. ``kubectl egpu advise``
(cli/advise_cmd.py) reads the series from Prometheus and the bookings from the cluster.

The rule (docs/operating.md, "Right-sizing"):

- too little history (fewer than ``Policy.min_samples`` samples, or spanning less than
  ``Policy.min_history_s``): no advice, and why;
- allocations refused at the memory cap in the window (the interposer counts them): the peak
  is the cap and the need is unknown: raise memory by ``Policy.raise_factor``, never lower;
- a strict share at its compute cap (within ``Policy.cap_tolerance_points``) in more than
  ``Policy.cap_bound_fraction`` of the samples: raise cores by ``Policy.raise_factor``;
- otherwise memory = the peak (the region's high-water mark, so a peak between two scrapes
  counts) plus ``Policy.memory_margin``, rounded up to ``Policy.memory_step_mib``; cores =
  the p95 of the compute used, or the p99 for a strict high-priority (online) share whose
  latency a cap that bites would hurt, rounded up to ``Policy.cores_step``; neither above
  what is booked (advice lowers or keeps; raising needs evidence: refusals or a bound cap).

Units: MiB, % of one card's compute, seconds.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from egpu.stats import percentile

VERDICT_LOWER = "lower"
VERDICT_KEEP = "keep"
VERDICT_RAISE = "raise"
VERDICT_NONE = "no advice"


@dataclass(frozen=True)
class Policy:
    """The recommender's knobs (``kubectl egpu advise`` flags)."""

    memory_margin: float = 0.15  # above the peak
    memory_step_mib: int = 256
    cores_step: int = 5  # % of a card
    min_history_s: float = 24 * 3600.0
    min_samples: int = 20
    cap_tolerance_points: float = 2.0  # as the EgpuShareAtComputeCap alert
    cap_bound_fraction: float = 0.05  # of the compute samples
    raise_factor: float = 1.5


@dataclass(frozen=True)
class Usage:
    """One container's use over the window. ``samples``: memory samples; ``span_s``: from the
    first to the last; memory in MiB (``peak_mib``: the highest of the samples and the
    region's high-water marks); compute in % of a card (None: no compute samples);
    ``refused``: allocations refused at the memory cap in the window; ``at_cap_fraction``:
    the share of compute samples within the tolerance of the cap (0 without a cap)."""

    samples: int
    span_s: float
    peak_mib: float
    p95_mib: float
    p99_mib: float
    compute_p95: float | None
    compute_p99: float | None
    refused: int
    at_cap_fraction: float


@dataclass(frozen=True)
class Booked:
    """What the container books per card: MiB, cores (%; 0 = none), how its pod runs, and
    the memory of the smallest card it runs on (MiB; None: unknown)."""

    memory_mib: int
    cores: int
    priority: str = "high"
    compute_policy: str = "strict"
    card_mib: int | None = None  # the smallest card it runs on: no advice goes past it


@dataclass(frozen=True)
class Advice:
    """The recommendation: ``memory_mib`` / ``cores`` per card (None: no advice), the verdict
    (lower, keep, raise, no advice) and why, in words."""

    memory_mib: int | None
    cores: int | None
    verdict: str
    why: str


def counter_increase(values: Sequence[float]) -> float:
    """How much a counter grew over ``values`` (in time order), a reset (a new container: the
    counter starts again from 0) counting what it reached after it, as Prometheus'
    increase() does without extrapolation."""
    total = 0.0
    for before, after in itertools.pairwise(values):
        total += after - before if after >= before else after
    return total


def summarize(memory: Sequence[tuple[float, float]], peaks_mib: Iterable[float] = (),
              compute: Sequence[tuple[float, float]] = (), cores: int = 0,
              refused: Sequence[Sequence[float]] = (), policy: Policy = Policy(),
              caps: Mapping[float, float] | None = None) -> Usage:
    """A ``Usage`` from samples: ``memory`` (unix s, MiB) of every pod and card pooled,
    ``peaks_mib`` the region's high-water marks seen, ``compute`` (unix s, % of the card),
    ``cores`` the cap now (% ; 0: none), ``caps`` the cap a compute sample ran under, by its
    time (an older pod of the workload may have run under another cap; ``cores`` where it is
    not known), ``refused`` one counter series per pod and card (in time order)."""
    values = [v for _, v in memory]
    times = [t for t, _ in memory]
    used = [v for _, v in compute]
    caps = caps or {}
    capped = [(v, caps.get(t, cores)) for t, v in compute]
    at_cap = (sum(1 for v, cap in capped if cap > 0 and v >= cap - policy.cap_tolerance_points)
              / len(capped) if capped else 0.0)
    return Usage(
        samples=len(values),
        span_s=(max(times) - min(times)) if times else 0.0,
        peak_mib=max([*values, *peaks_mib], default=0.0),
        p95_mib=percentile(values, 0.95) if values else 0.0,
        p99_mib=percentile(values, 0.99) if values else 0.0,
        compute_p95=percentile(used, 0.95) if used else None,
        compute_p99=percentile(used, 0.99) if used else None,
        refused=round(sum(counter_increase(series) for series in refused)),
        at_cap_fraction=at_cap,
    )


def round_up(value: float, step: int) -> int:
    """``value`` rounded up to a multiple of ``step`` (at least one step)."""
    return max(step, math.ceil(value / step) * step)


def _duration(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 60:.0f}m"


def _allocations(count: int) -> str:
    """``1 allocation``, ``3 allocations``: the reason's count of refused allocations."""
    return f"{count} allocation{'' if count == 1 else 's'}"


def _raised(value: int, ceiling: int | None, step: int, policy: Policy) -> int | None:
    """``value`` x ``policy.raise_factor`` rounded up to ``step``, at most ``ceiling`` (the
    card); None when that is no raise (``value`` is the ceiling already)."""
    up = round_up(value * policy.raise_factor, step)
    if ceiling is not None:
        up = min(up, ceiling)
    return up if up > value else None


def advise(usage: Usage, booked: Booked, policy: Policy = Policy()) -> Advice:
    """The advice of the module docstring's rule for one container."""
    if usage.samples < policy.min_samples or usage.span_s < policy.min_history_s:
        return Advice(None, None, VERDICT_NONE,
                      f"too little history: {usage.samples} samples over "
                      f"{_duration(usage.span_s)} (needs {policy.min_samples} over "
                      f"{_duration(policy.min_history_s)})")
    reasons = []
    memory = booked.memory_mib
    cores = booked.cores
    raised = False
    if usage.refused > 0:
        up = _raised(booked.memory_mib, booked.card_mib, policy.memory_step_mib, policy)
        if up is not None:
            memory, raised = up, True
            reasons.append(f"{_allocations(usage.refused)} refused at its {booked.memory_mib} "
                           f"MiB cap: raise memory (its need is above the cap)")
        else:
            reasons.append(f"{_allocations(usage.refused)} refused with the whole card's "
                           f"{booked.memory_mib} MiB: it needs a larger card")
    strict = booked.compute_policy == "strict"
    if booked.cores > 0 and strict and usage.at_cap_fraction > policy.cap_bound_fraction:
        up = _raised(booked.cores, 100, policy.cores_step, policy)
        if up is not None:
            cores, raised = up, True
            reasons.append(f"at its {booked.cores}% compute cap in "
                           f"{usage.at_cap_fraction:.0%} of the samples: raise cores")
        else:
            reasons.append(f"at the whole card's compute in {usage.at_cap_fraction:.0%} of "
                           "the samples")
    if raised:
        return Advice(memory, cores, VERDICT_RAISE, "; ".join(reasons))
    if reasons:  # bound by the card itself: nothing to lower, nothing a share can raise
        return Advice(booked.memory_mib, booked.cores, VERDICT_KEEP, "; ".join(reasons))

    memory = min(booked.memory_mib,
                 round_up(usage.peak_mib * (1 + policy.memory_margin), policy.memory_step_mib))
    why = [f"peak {usage.peak_mib:.0f} MiB + {policy.memory_margin:.0%}"]
    if booked.cores > 0 and usage.compute_p95 is not None and usage.compute_p99 is not None:
        online = strict and booked.priority == "high"
        basis, name = (usage.compute_p99, "p99") if online else (usage.compute_p95, "p95")
        cores = min(booked.cores, round_up(basis, policy.cores_step))
        why.append(f"compute {name} {basis:.0f}%" + (" (strict online share)" if online else ""))
    verdict = VERDICT_LOWER if (memory, cores) != (booked.memory_mib, booked.cores) \
        else VERDICT_KEEP
    return Advice(memory, cores, verdict, ", ".join(why))


# --- workloads ---------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Workload:
    """What owns a pod: ``kind`` Deployment, StatefulSet, DaemonSet, Job, ReplicaSet (one no
    Deployment owns) or Pod (a bare pod), in ``namespace``."""

    namespace: str
    kind: str
    name: str

    @property
    def label(self) -> str:
        """``namespace/Kind/name``."""
        return f"{self.namespace}/{self.kind}/{self.name}"


def owner_of(pod: Mapping[str, Any]) -> Workload:
    """The workload of a pod (a Kubernetes JSON dict), from its controller ownerReference: a
    ReplicaSet named ``<deployment>-<pod-template-hash>`` is that Deployment's."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
    if not owners:
        return Workload(namespace, "Pod", str(meta.get("name", "")))
    kind, name = str(owners[0].get("kind", "")), str(owners[0].get("name", ""))
    template_hash = str((meta.get("labels") or {}).get("pod-template-hash", ""))
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return Workload(namespace, "Deployment", name[: -len(template_hash) - 1])
    return Workload(namespace, kind, name)


# Names a controller gives its pods (Kubernetes' generators): a generateName base cut to 58
# characters, then 5 characters of its safe alphabet (no vowels, no 0 1 3: rand.String); a
# Deployment's ReplicaSet is <deployment>-<pod-template-hash> (the same alphabet, up to 10);
# a StatefulSet's pods <statefulset>-<ordinal>; an indexed Job's <job>-<index>-<5>. History
# outlives a roll: a deleted pod of an older ReplicaSet still names its Deployment this way.
# Only deleted pods are matched by name: a live pod's own owner reference decides.
SAFE = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX = f"[{SAFE}]{{5}}"
GENERATED_BASE_MAX = 58  # k8s.io/apiserver's names.SimpleNameGenerator: 63 - 5
_STEMS = {
    "Deployment": f"-[{SAFE}]{{1,10}}-",
    "ReplicaSet": "-",
    "Job": r"-(?:[0-9]+-)?",
    "DaemonSet": "-",
}


def workload_of_pod_name(namespace: str, pod: str, workloads: Iterable[Workload]
                         ) -> Workload | None:
    """The workload among ``workloads`` (those of the pods running now) whose controller
    would have named a pod ``pod`` in ``namespace``, the longest name first (``web`` and
    ``web-api`` both prefix ``web-api-...``); a bare pod matches its own name only."""
    for workload in sorted(workloads, key=lambda w: -len(w.name)):
        if workload.namespace != namespace:
            continue
        if workload.kind == "Pod":
            if pod == workload.name:
                return workload
        elif workload.kind == "StatefulSet":
            if re.fullmatch(re.escape(workload.name) + r"-[0-9]+", pod):
                return workload
        elif workload.kind in _STEMS and re.fullmatch(f".+{_SUFFIX}", pod):
            base = pod[:-5]
            if re.fullmatch(re.escape(workload.name) + _STEMS[workload.kind], base):
                return workload
            # a base cut to 58 characters: whatever the cut kept must be the workload's
            if len(base) == GENERATED_BASE_MAX and f"{workload.name}-".startswith(base):
                return workload
            if (len(base) == GENERATED_BASE_MAX and base.startswith(f"{workload.name}-")
                    and workload.kind == "Deployment"):
                return workload
    return None
