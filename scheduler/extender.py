"""The extender's verbs as functions of the cluster view: filter, prioritize, bind.

No HTTP here (``scheduler.app`` is the edge) and no Kubernetes client (bind talks to the API
through the small ``BindApi`` protocol, ``scheduler.kube`` implements it).

- filter: for each candidate node, ``placement.utilization_checker`` (the answer of
  ``placement.fit``, fast path for one-share pods) on the node's cards with every booking
  (reservations of binds in flight included, the pod's own earlier booking excluded). Pods
  without egpu resources pass everywhere; pods with invalid requests fail everywhere, as
  unresolvable, with the request errors as the reason.
- prioritize: ``placement.score`` (0..10) of each node under the pod's node policy, reusing
  what filter computed when the node has not changed since (answers are memoized per pod
  demand and node view, so replicas of one template reuse them too).
- bind: serialized per node: fit again (cards chosen by the pod's card policy); the bind
  gate (``placement.admission_conflict``): while a pod that awaits admission by the node's
  kubelet holds shares of the same size on other cards, the kubelet could hand one pod's
  slots to the other (the device plugin API names no pod), so the bind waits, at most
  ``BIND_GATE_WAIT_S``, for the kubelet to admit it, deciding again after each change it
  sees on that node (a pod's change wakes only its node's binds); then reserve the booking,
  then POST ONE Binding that carries the
  ``egpu.io/allocation`` annotation (the ``placed_record``: the cards, each container's kind
  and the pod's resolved policies, so that no later reader reads the pod spec again for
  them): the API server copies a Binding's annotations onto the pod in the same write that sets
  ``spec.nodeName`` (pods/binding, ``BindingREST.setPodNodeAndMetadata``), so the pod is never
  annotated without being bound or bound without its annotation. A Binding the API refused
  drops the reservation (nothing was written); one whose outcome is unclear (a timeout, a
  5xx) is settled by reading the pod back. A bind of a pod whose earlier bind is still in
  flight is refused, and the whole bind (gate and POST) ends within ``BIND_BUDGET_S``, below
  kube-scheduler's extender timeout, so kube-scheduler never gives up on a bind that then
  lands beside its retry's. The per-node lock covers the decision and the
  reservation, which take no await: the network call runs outside it, and a concurrent bind
  on that node already sees the reservation, so no card is booked past its bound whatever
  the interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from egpu.config import Config
from egpu.contract import ANN_ALLOCATION, LABEL_PRIORITY
from egpu.kube import KubeNode, KubePod
from egpu.policies import Priority
from egpu.records import Allocation
from egpu.requests import PodReading, PodRequest, read_pod
from scheduler import strategies
from scheduler.placement import (
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
    admission_conflict,
    fit,
    utilization_checker,
)
from scheduler.state import Booking, ClusterState, pod_key
from scheduler.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriorityList,
)

log = logging.getLogger("egpu.scheduler")

UNKNOWN_NODE = "no egpu inventory for this node (not a GPU node, or its node agent never reported)"
CACHE_DEMANDS = 64  # distinct pod demands memoized
CACHE_TTL_S = 5.0  # how long a memoized answer may be reused
# The longest a bind waits at the gate (s), after which the pod goes back to the scheduling
# queue.
BIND_GATE_WAIT_S = 8.0
# The longest a whole bind takes (s: gate, decision, POST and the client's slack on it),
# below kube-scheduler's extender httpTimeout (10 s in every config egpu ships): a bind
# kube-scheduler gave up on could land after its retry was decided.
BIND_BUDGET_S = 8.5
BIND_POST_MIN_S = 1.0  # the least time a Binding POST is given: the gate's wait ends before
BIND_POST_MAX_S = 4.0  # the most a Binding POST (server side) or a pod GET of a bind takes
BIND_CLIENT_SLACK_S = 0.5  # the client waits this much longer than the server's timeout


@dataclass(frozen=True)
class _Held:
    """The bind gate holds the pod: binding it now could mix up its slots (why)."""

    reason: str


class _Pulse:
    """Wakes every waiter at each ``fire`` (a pod on the waiters' node changed)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Until the next ``fire``, or ``timeout_s`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout_s)


class BindError(Exception):
    """An API call of the bind failed; the message says which and why. ``status``: the API's
    HTTP status when it answered, None when no answer came (timeout, connection lost)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def unclear(self) -> bool:
        """The write may have happened: no answer, or a server error (a 504 after the
        API server's own timeout; a 500). A 4xx answer means nothing was written."""
        return self.status is None or self.status >= 500


class BindApi(Protocol):
    """What bind needs from the Kubernetes API (``scheduler.kube.KubeApi``; fakes in tests)."""

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod object, or None when it does not exist, within BIND_POST_MAX_S seconds.
        Raises BindError."""
        ...

    async def bind(self, namespace: str, name: str, uid: str, node: str,
                   annotations: Mapping[str, str] | None = None,
                   timeout_s: float = BIND_POST_MAX_S) -> None:
        """POST the pod's Binding to ``node`` (pod UID as precondition) within ``timeout_s``
        seconds; ``annotations`` are set on the pod in the same write. Raises BindError."""
        ...


def _node(item: Any) -> KubeNode:
    """A node of the arguments' ``Nodes.items``; TypeError (a malformed request: 400) for an
    item, or its metadata, that is not an object."""
    if not isinstance(item, Mapping) or not isinstance(item.get("metadata", {}), Mapping):
        raise TypeError(f"Nodes.items: a {type(item).__name__} is not a Node object (an "
                        "object with an object metadata)")
    return KubeNode(item)


def _evaluation_failed(node: str, exc: Exception) -> Unfit:
    """The answer for a node whose evaluation raised: that node fails unresolvably
    (FailedAndUnresolvableNodes: no preemption can make egpu place the pod there, so
    kube-scheduler's DefaultPreemption must not evict pods of it for this one; the next
    scheduling try evaluates the node again), with the error as the reason, and the
    traceback is logged; the other nodes of the request are answered as usual."""
    log.error("node %s: evaluating it for a pod failed; reported as not fitting (unresolvable)",
              node, exc_info=exc)
    return Unfit(node, f"internal error of the egpu extender evaluating this node "
                       f"({type(exc).__name__}: {str(exc)[:200]}); see the extender's log",
                 unresolvable=True)


def _errors_text(reading: PodReading) -> str:
    return "invalid egpu request: " + "; ".join(e.message for e in reading.errors)


def placed_record(allocation: Allocation, request: PodRequest,
                  pod: Mapping[str, Any]) -> Allocation:
    """The ``egpu.io/allocation`` record the Binding writes: the placement's cards with every
    fact decided about the pod, resolved once for all its readers (node agent, runtime hook,
    exporter, ``kubectl egpu``): each container's kind (``request``'s), and the pod's
    priority (the webhook's label ``egpu.io/priority`` where valid, else the request's: what
    the node agent resolved before the record carried it), compute policy and memory
    oversubscription."""
    label = KubePod(pod).label(LABEL_PRIORITY)
    kinds = {c.name: c.kind.value for c in request.containers}
    return allocation.replace(
        containers=tuple(c.replace(kind=kinds.get(c.name)) for c in allocation.containers),
        priority=Priority.of(label) or request.priority,
        compute_policy=request.compute_policy,
        memory_oversubscription=request.memory_oversubscription,
    )


class Extender:
    """The three verbs over a ``ClusterState``; ``clock`` gives unix seconds (heartbeats)."""

    def __init__(self, state: ClusterState, config: Config, api: BindApi | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.config = config
        self.limits = Limits.from_config(config)
        self.api = api
        self.clock = clock
        self._locks: dict[str, asyncio.Lock] = {}
        # node -> the pulse its held binds wait on (one per node that ever held a bind)
        self._pulses: dict[str, _Pulse] = {}
        state.listeners.append(self._node_changed)
        self.gate_waits = 0  # binds the gate held at least once (metric)
        self._cache: OrderedDict[
            tuple[PodDemand, str],
            tuple[float, dict[str, NodeState], dict[str, float | Unfit]],
        ] = OrderedDict()

    # --- filter and prioritize -------------------------------------------------------------
    def _fit_all(self, pod: Mapping[str, Any], demand: PodDemand,
                 names: list[str]) -> list[float | Unfit]:
        """For each node of ``names``: the utilization with the pod placed (a float) when the
        pod fits, else the ``Unfit``; memoized per (demand, node view) for ``CACHE_TTL_S``.

        Replicas of one template have equal demands, and a node's view object is replaced
        whenever its cards or bookings change, so a hit is exact; the time bound keeps
        heartbeat staleness (which depends on the clock, not on the view) current. The memo
        holds two flat dicts per demand (view and answer by node name, answers as plain
        floats when the pod fits): few objects for the garbage collector to walk.
        """
        uid = KubePod(pod).uid
        now = self.clock()
        excluding = uid if uid and self.state.booking(uid) is not None else None
        key = (demand, excluding or "")
        entry = self._cache.get(key)
        if entry is None or now - entry[0] > CACHE_TTL_S:
            entry = self._cache[key] = (now, {}, {})
            while len(self._cache) > CACHE_DEMANDS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        _, seen, answers = entry
        run = utilization_checker(demand, self.limits, now)
        out: list[float | Unfit] = []
        append = out.append
        for name, view in zip(names, self.state.node_views(names, excluding), strict=True):
            if view is None:
                append(Unfit(name, UNKNOWN_NODE, unresolvable=True))
            elif seen.get(name) is view:
                append(answers[name])
            else:
                try:
                    result = run(view)
                except Exception as exc:  # a bug or absurd data: this node fails, not the call
                    result = _evaluation_failed(name, exc)
                answers[name] = result
                seen[name] = view
                append(result)
        return out

    @staticmethod
    def _candidates(args: ExtenderArgs) -> list[str]:
        names = args.get("NodeNames")
        if names is not None:
            return list(names)
        nodes = args.get("Nodes") or {}
        return [_node(n).name for n in nodes.get("items") or []]

    @staticmethod
    def _result(args: ExtenderArgs, passed: list[str], failed: dict[str, str],
                unresolvable: dict[str, str]) -> ExtenderFilterResult:
        result: ExtenderFilterResult = {"FailedNodes": _event_safe(failed),
                                        "FailedAndUnresolvableNodes": _event_safe(unresolvable),
                                        "Error": ""}
        if args.get("NodeNames") is not None:
            result["NodeNames"] = passed
        else:
            keep = set(passed)
            items = (args.get("Nodes") or {}).get("items") or []
            result["Nodes"] = {"items": [n for n in items if KubeNode(n).name in keep]}
        return result

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """Which candidate nodes can take the pod, and why each other one cannot."""
        pod = args["Pod"]
        names = self._candidates(args)
        reading = read_pod(pod, self.config)
        if not reading.is_egpu_pod:
            return self._result(args, names, {}, {})
        if reading.request is None:
            reason = _errors_text(reading)
            return self._result(args, [], {}, dict.fromkeys(names, reason))
        demand = PodDemand.from_request(reading.request)
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for name, result in zip(names, self._fit_all(pod, demand, names), strict=True):
            if result.__class__ is float:
                passed.append(name)
            elif isinstance(result, Unfit):
                if result.unresolvable:
                    unresolvable[name] = result.reason
                else:
                    failed[name] = result.reason
        return self._result(args, passed, failed, unresolvable)

    def prioritize(self, args: ExtenderArgs) -> HostPriorityList:
        """Score 0..10 per candidate node under the pod's node policy: 0 where it does not
        fit, and 0 where the bind gate would hold it now (``_gate_would_hold``), so that a
        pod goes to a node where it binds at once rather than wait there for the kubelet."""
        pod = args["Pod"]
        names = self._candidates(args)
        reading = read_pod(pod, self.config)
        if reading.request is None:
            return [{"Host": name, "Score": 0} for name in names]
        demand = PodDemand.from_request(reading.request)
        node_score = strategies.get(demand.node_policy).node_score
        uid = KubePod(pod).uid
        out: HostPriorityList = []
        for name, r in zip(names, self._fit_all(pod, demand, names), strict=True):
            score = 0 if isinstance(r, Unfit) else node_score(r)
            if score and self._gate_would_hold(demand, uid, name):
                score = 0
            out.append({"Host": name, "Score": score})
        return out

    def _gate_would_hold(self, demand: PodDemand, uid: str, node: str) -> bool:
        """Whether a bind of the pod to ``node`` now would wait at the gate: a pod there that
        its kubelet has not admitted holds same-sized shares on other cards than the ones
        ``fit`` picks (``_decide``'s question, asked without reserving). Cheap on the nodes
        where no pod awaits admission (``ClusterState.awaiting_admission``)."""
        waiting = self.state.awaiting_admission(node, uid)
        if not waiting:
            return False
        view = self.state.node(node, excluding=uid)
        if view is None:
            return False
        try:
            result = fit(view, demand, self.limits, self.clock())
        except Exception:  # the bind's own fit words the failure; scoring goes on
            return False
        return not isinstance(result, Unfit) and admission_conflict(
            result.allocation, (b.allocation for b in waiting)) is not None

    # --- bind ------------------------------------------------------------------------------
    def _node_changed(self, node: str) -> None:
        pulse = self._pulses.get(node)
        if pulse is not None:
            pulse.fire()

    def _lock(self, node: str) -> asyncio.Lock:
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        return lock

    def _decide(self, pod: Mapping[str, Any], reading: PodReading, uid: str,
                node: str) -> Placement | str | _Held:
        """Fit the pod on ``node`` now and reserve; the chosen placement, an error text, or
        the gate's hold (nothing reserved)."""
        if reading.request is None:
            return _errors_text(reading)
        view = self.state.node(node, excluding=uid)
        if view is None:
            return f"node {node}: {UNKNOWN_NODE}"
        try:
            result = fit(view, PodDemand.from_request(reading.request), self.limits,
                         self.clock())
        except Exception as exc:  # a bug or absurd data: this bind fails, not the request
            return f"node {node}: {_evaluation_failed(node, exc).reason}"
        if isinstance(result, Unfit):
            return f"node {node} no longer fits the pod: {result.reason}"
        # The reservation holds the very record the Binding writes: the watch confirms it.
        allocation = placed_record(result.allocation, reading.request, pod)
        held = admission_conflict(allocation, (b.allocation for b in
                                               self.state.awaiting_admission(node, uid)))
        if held is not None:
            return _Held(held)
        self.state.reserve(Booking(uid, pod_key(pod), node, allocation, result.bookings))
        return replace(result, allocation=allocation)

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """Choose the cards and bind the pod with its allocation; ``Error`` says what failed."""
        namespace, name = args["PodNamespace"], args["PodName"]
        uid, node = str(args["PodUID"]), args["Node"]
        if self.api is None:
            return {"Error": "this extender has no API access (bind disabled)"}
        start = time.monotonic()
        budget_end = start + BIND_BUDGET_S
        pod = self.state.pods.get(uid)
        try:
            earlier = await self._earlier_bind(namespace, name, uid)
            if earlier:
                return {"Error": earlier}
            if pod is None:
                pod = await self.api.get_pod(namespace, name)
            if pod is None or KubePod(pod).uid != uid:
                return {"Error": f"pod {namespace}/{name} (uid {uid}) not found"}
            if KubePod(pod).node_name:
                return {"Error": f"pod {namespace}/{name} is already bound to node "
                                 f"{KubePod(pod).node_name}"}
            reading = read_pod(pod, self.config)
            if not reading.is_egpu_pod:
                await self.api.bind(namespace, name, uid, node,
                                    timeout_s=_post_timeout(budget_end))
                return {"Error": ""}
        except BindError as exc:
            return {"Error": str(exc)}
        deadline = min(start + BIND_GATE_WAIT_S,
                       budget_end - BIND_POST_MIN_S - BIND_CLIENT_SLACK_S)
        held_once = False
        while True:
            async with self._lock(node):
                decision = self._decide(pod, reading, uid, node)
            if not isinstance(decision, _Held):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                waited = time.monotonic() - start
                log.info("bind %s/%s -> %s held for %.0f s: %s", namespace, name, node,
                         waited, decision.reason)
                return {"Error": f"node {node}: {decision.reason}; waited "
                                 f"{waited:.0f} s for its kubelet to admit it"}
            if not held_once:
                held_once = True
                self.gate_waits += 1
            pulse = self._pulses.get(node)
            if pulse is None:
                pulse = self._pulses[node] = _Pulse()
            await pulse.wait(left)
        if isinstance(decision, str):
            log.info("bind %s/%s -> %s refused: %s", namespace, name, node, decision)
            return {"Error": decision}
        text = decision.allocation.encode()
        try:
            await self.api.bind(namespace, name, uid, node, {ANN_ALLOCATION: text},
                                timeout_s=_post_timeout(budget_end))
        except BindError as exc:
            if not exc.unclear:
                self.state.unreserve(uid)
                return {"Error": f"binding failed: {exc}"}
            return {"Error": await self._settle_unclear_bind(namespace, name, uid, node, exc)}
        self.state.bind_done(uid)
        log.info("bound %s/%s -> %s %s", namespace, name, node, text)
        return {"Error": ""}

    async def _earlier_bind(self, namespace: str, name: str, uid: str) -> str:
        """Why this bind must not go on because of an earlier bind of the same pod ("": it
        may). kube-scheduler binds a pod again after it gave up waiting for a bind: a retry
        that reserved anew would replace the booking of a Binding that may still land."""
        assert self.api is not None
        reserved = self.state.reserved(uid)
        if reserved is None:
            return ""
        booking, in_flight = reserved
        if in_flight:
            return (f"an earlier bind of pod {namespace}/{name} to node {booking.node} is "
                    "still in progress")
        # That bind finished, or ended unclear: the pod itself says whether it was bound.
        pod = await self.api.get_pod(namespace, name)
        bound = KubePod(pod).node_name if pod is not None and KubePod(pod).uid == uid else ""
        if bound:
            return f"pod {namespace}/{name} is already bound to node {bound}"
        self.state.unreserve(uid)  # it was not: its reservation books nothing
        return ""

    async def _settle_unclear_bind(self, namespace: str, name: str, uid: str, node: str,
                                   exc: BindError) -> str:
        """After a Binding whose outcome is unclear, read the pod back: bound there, the bind
        succeeded ("" and the reservation stands until the watch confirms it); not bound,
        it failed (its reservation is dropped); unreadable, the reservation is kept, finished,
        so that no other pod takes its cards, until the watch or this pod's next bind
        settles it. Returns the bind's error text ("" for success)."""
        assert self.api is not None
        try:
            pod = await self.api.get_pod(namespace, name)
        except BindError as read_exc:
            self.state.bind_done(uid)
            return (f"binding failed: {exc}; whether it was written is unknown ({read_exc}): "
                    "its cards stay booked until the pod's next event")
        view = KubePod(pod) if pod is not None else None
        if view is not None and view.uid == uid and view.node_name == node:
            self.state.bind_done(uid)
            log.info("bound %s/%s -> %s (the Binding's answer was lost: %s)", namespace, name,
                     node, exc)
            return ""
        self.state.unreserve(uid)
        return f"binding failed: {exc}"


def _post_timeout(budget_end: float) -> float:
    """The seconds a Binding POST may take: what the bind's budget leaves, within
    [BIND_POST_MIN_S, BIND_POST_MAX_S]."""
    left = budget_end - time.monotonic() - BIND_CLIENT_SLACK_S
    return min(BIND_POST_MAX_S, max(BIND_POST_MIN_S, left))


def _event_safe(reasons: dict[str, str]) -> dict[str, str]:
    """The reasons with "%" spelled out: kube-scheduler (v1.37) passes its FailedScheduling
    message to the event recorder as a format string, so "50% cores" would read
    "50%!c(MISSING)ores" in `kubectl describe pod`."""
    return {node: r.replace("%", " percent") if "%" in r else r for node, r in reasons.items()}
