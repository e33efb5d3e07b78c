"""The device plugin's gRPC edge (kubelet device plugin API v1beta1).

``EgpuDevicePlugin`` serves DevicePlugin on ``<plugin_dir>/egpu-<token>.sock``: ListAndWatch
streams the slots (``slots``) and sends a new list whenever a card's health changes;
GetPreferredAllocation and Allocate delegate to ``matching``. When the kubelet asks before the
agent's pod watch has delivered the pod (no pending container uses the cards), they call
``catch_up`` (re-list the node's pods, wait for the watch) and match again, for at most
``ALLOCATE_POD_WAIT_S`` per call (less when a LIST shows that the API server has no such pod
either), before answering without it (Allocate then fails: the kubelet fails the pod's
admission, and its controller replaces it). Allocate names the container's cards as CDI devices
(``cdi_devices``: ``egpu.io/gpu=<uuid>``, and ``nvidia.com/gpu=...`` where that spec exists)
when the agent has written its CDI spec. ``PluginServer`` starts the server, registers with the
kubelet (Registration.Register on ``<plugin_dir>/kubelet.sock``) and serves again and
re-registers when the kubelet restarts (it removes every socket of the folder when it starts: a
missing socket of ours, or a new kubelet.sock inode, is the signal).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from egpu.contract import RES_GPU
from egpu.records import Card
from node_agent.deviceplugin import api_pb2, api_pb2_grpc, matching
from node_agent.deviceplugin.matching import Ambiguous, Match, Matched, Pending, Unmatched
from node_agent.deviceplugin.slots import HEALTHY, UNHEALTHY, slots

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
PLUGIN_SOCKET_PREFIX = "egpu-"  # + a token of the serving process + ".sock"
DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
ALLOCATE_POD_WAIT_S = 5.0  # the longest an RPC waits for a pod the agent has not seen yet (s);
#                            the kubelet gives Allocate far longer
_T = TypeVar("_T")


class CatchUp(Protocol):
    """Bring the pending containers up to date for a kubelet call that found no pending
    container (node_agent.pods.PodCatchUp): re-list this node's pods and/or wait for the pod
    watch, at most ``timeout_s`` seconds. The caller matches again after each call; the call
    returns False when waiting longer cannot help (a LIST just showed every pod the API
    server has bound here), True when it may (call again while time is left); never raises."""

    def __call__(self, timeout_s: float) -> bool: ...


CdiNames = Callable[[Sequence[str], Sequence[Card]], list[str]]
"""The CDI device names for a container's cards (uuids in allocation order, the node's cards);
empty when the agent's CDI spec is not in place (node_agent.cdi.CdiPublisher.names)."""


class AgentSide(Protocol):
    """What the device plugin needs from the node agent: the one boundary between them
    (node_agent.main passes an ``AgentFunctions`` of its card state, pod registry, catch-up
    and CDI publisher; tests pass their own)."""

    def cards(self) -> tuple[Card, ...]:
        """The node's cards, with their current health (node_agent.main.CardState.get)."""
        ...

    def pending(self) -> list[Pending]:
        """The containers with a share whose devices the kubelet has not allocated yet
        (node_agent.pods.PodRegistry.pending)."""
        ...

    def consume(self, pod_uid: str, container: str) -> None:
        """A unique match handed out that container's share (PodRegistry.consume)."""
        ...

    @property
    def catch_up(self) -> CatchUp | None:
        """Called while no pending container fits a kubelet request (None: no waiting, the
        agent has no API server)."""
        ...

    @property
    def cdi_names(self) -> CdiNames | None:
        """The CDI device names of a container's cards (None: the agent writes no CDI
        spec)."""
        ...


@dataclass(frozen=True)
class AgentFunctions:
    """An ``AgentSide`` made of functions: ``cards``, ``pending``, ``consume``, and the
    optional ``catch_up`` and ``cdi_names`` (see ``AgentSide``)."""

    cards: Callable[[], tuple[Card, ...]]
    pending: Callable[[], list[Pending]]
    consume: Callable[[str, str], None]
    catch_up: CatchUp | None = None
    cdi_names: CdiNames | None = None


class EgpuDevicePlugin(api_pb2_grpc.DevicePluginServicer):
    """The DevicePlugin service over ``agent`` (``AgentSide``: the cards, the pending
    containers, ``consume`` after a unique match, the catch-up, called while no pending
    container fits a request for at most ``pod_wait_s`` seconds per RPC, and the CDI names);
    ``node``: this node's name (messages)."""

    def __init__(self, agent: AgentSide, shares_per_card: int, node: str = "", *,
                 pod_wait_s: float = ALLOCATE_POD_WAIT_S) -> None:
        self._agent = agent
        self._cards = agent.cards
        self._shares_per_card = shares_per_card
        self._pending = agent.pending
        self._consume = agent.consume
        self._node = node
        self._catch_up = agent.catch_up
        self._pod_wait_s = pod_wait_s
        self._cdi = agent.cdi_names
        self._changed = threading.Condition()
        self._generation = 0
        self._stopped = False
        self.lists_sent = 0  # device lists sent to the kubelet (ListAndWatch), readiness

    @classmethod
    def from_functions(cls, cards: Callable[[], tuple[Card, ...]], shares_per_card: int,
                       pending: Callable[[], list[Pending]], consume: Callable[[str, str], None],
                       node: str = "", *, catch_up: CatchUp | None = None,
                       pod_wait_s: float = ALLOCATE_POD_WAIT_S,
                       cdi: CdiNames | None = None) -> EgpuDevicePlugin:
        """The plugin over an ``AgentFunctions`` of these functions."""
        return cls(AgentFunctions(cards, pending, consume, catch_up, cdi), shares_per_card,
                   node, pod_wait_s=pod_wait_s)

    def notify(self) -> None:
        """Card health changed: every ListAndWatch stream sends a new list."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def stop(self) -> None:
        """End every ListAndWatch stream."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def device_list(self) -> api_pb2.ListAndWatchResponse:
        """The current slots as a ListAndWatchResponse, without NUMA topology: with the
        kubelet's Topology Manager on, a slot's NUMA node makes the kubelet offer only the
        slots of the NUMA node it picked (the lowest of equal ones), which need not hold the
        card the scheduler booked, and the pod's Allocate is then refused. Which card a share
        gets is the scheduler's decision, made before the kubelet's."""
        devices = [api_pb2.Device(ID=slot.id, health=HEALTHY if slot.healthy else UNHEALTHY)
                   for slot in slots(self._cards(), self._shares_per_card)]
        return api_pb2.ListAndWatchResponse(devices=devices)

    # --- DevicePlugin RPCs (names as the v1beta1 service defines them) ---------------------
    def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(pre_start_required=False,
                                           get_preferred_allocation_available=True)

    def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.ServicerContext
    ) -> Iterator[api_pb2.ListAndWatchResponse]:
        generation = -1
        while context.is_active():
            with self._changed:
                if self._stopped:
                    return
                if generation == self._generation:
                    self._changed.wait(timeout=1.0)
                    continue
                generation = self._generation
            yield self.device_list()
            self.lists_sent += 1

    def _settle(self, attempt: Callable[[], _T], waits: Callable[[_T], bool], deadline: float,
                what: str) -> _T:
        """``attempt()`` again after each catch-up step while ``waits(result)``, the
        monotonic ``deadline`` (s) is ahead and the catch-up says more may come; the last
        result."""
        result = attempt()
        if self._catch_up is None or not waits(result):
            return result
        start = time.monotonic()
        while waits(result) and (left := deadline - time.monotonic()) > 0:
            more = self._catch_up(left)
            result = attempt()
            if not more:
                break
        log.info("%s: waited %.2f s for the pod (%s)", what, time.monotonic() - start,
                 "found" if not waits(result) else "not found")
        return result

    def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        deadline = time.monotonic() + self._pod_wait_s
        responses = []
        for r in request.container_requests:
            available, must = list(r.available_deviceIDs), list(r.must_include_deviceIDs)
            self._settle(
                functools.partial(self._candidate, available, must, r.allocation_size),
                lambda candidate: candidate is None, deadline,
                f"GetPreferredAllocation of {r.allocation_size} slot(s)")
            responses.append(api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=matching.preferred(available, must, r.allocation_size,
                                             self._pending())))
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    def _candidate(self, available: list[str], must: list[str], size: int) -> Pending | None:
        return matching.candidate_for(available, must, size, self._pending())

    def _match(self, ids: list[str]) -> Match:
        return matching.match(ids, self._pending(), self._node)

    def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.ServicerContext
    ) -> api_pb2.AllocateResponse:
        deadline = time.monotonic() + self._pod_wait_s
        responses = []
        for container_request in request.container_requests:
            ids = list(container_request.devices_ids)
            result: Match = self._settle(
                functools.partial(self._match, ids),
                lambda r: isinstance(r, Unmatched) and r.no_pod, deadline, f"Allocate {ids}")
            if isinstance(result, Unmatched):
                # Fail the kubelet's admission of the pod (UnexpectedAdmissionError, phase
                # Failed): its controller replaces it. A container created anyway would be
                # refused by the hook at every restart: a crash loop that never heals.
                log.warning("Allocate %s refused: %s", ids, result.message)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"egpu: {result.message}")
            # Ambiguous: containers on these very cards are interchangeable here (the hook
            # picks each one's share by its pod and name); the first in the kubelet's order
            # is counted as handed out, so that the next request is steered past it.
            first = result.pending if isinstance(result, Matched) else result.candidates[0]
            self._consume(first.pod_uid, first.container)
            log.info("Allocate %s -> pod %s/%s container %s%s", ids, first.namespace, first.pod,
                     first.container, "" if isinstance(result, Matched)
                     else f" (or one of {len(result.candidates)} on the same cards)")
            responses.append(api_pb2.ContainerAllocateResponse(
                envs=matching.allocate_envs(result, ids),
                cdi_devices=[api_pb2.CDIDevice(name=n) for n in self._cdi_names(result)]))
        return api_pb2.AllocateResponse(container_responses=responses)

    def _cdi_names(self, result: Match) -> list[str]:
        """CDI devices of an Allocate answer: the container's cards, also when ambiguous (the
        cards are right whichever container it is; the hook that the CDI spec runs picks the
        share or refuses); when unmatched, egpu's ``unallocated`` device (no card): the hook
        it runs refuses the container at creation with the message."""
        if self._cdi is None:
            return []
        if isinstance(result, Unmatched):
            return self._cdi((), self._cards())
        uuids = result.uuids if isinstance(result, Ambiguous) else result.pending.share.uuids
        return self._cdi(uuids, self._cards())

    def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()


def register(plugin_dir: str, endpoint: str, resource: str = RES_GPU,
             timeout: float = 5.0) -> None:
    """Registration.Register with the kubelet at ``<plugin_dir>/kubelet.sock``, naming our
    socket ``endpoint`` (a file name in ``plugin_dir``). Raises grpc.RpcError when the kubelet
    refuses or cannot be reached."""
    target = f"unix://{os.path.join(plugin_dir, KUBELET_SOCKET)}"
    with grpc.insecure_channel(target) as channel:
        api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version=API_VERSION, endpoint=endpoint, resource_name=resource,
                options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)),
            timeout=timeout)


class PluginServer:
    """Serves ``plugin`` on ``<plugin_dir>/egpu-<token>.sock`` and keeps it registered.

    The token is this server's own (random), so that during a node agent roll the new agent
    serves and registers beside the old one, which keeps serving until it stops: the kubelet
    moves the resource to the newest registration, and the old agent's socket, when it goes,
    is no longer the resource's (kubelet v1.37 ignores a replaced endpoint's end). The node's
    slots stay offered throughout (docs/node.md, "Node agent rolls")."""

    def __init__(self, plugin: EgpuDevicePlugin, plugin_dir: str = DEFAULT_PLUGIN_DIR,
                 resource: str = RES_GPU) -> None:
        self.plugin = plugin
        self.plugin_dir = plugin_dir
        self.resource = resource
        self.endpoint = f"{PLUGIN_SOCKET_PREFIX}{secrets.token_hex(4)}.sock"
        self.socket = os.path.join(plugin_dir, self.endpoint)
        self._server: grpc.Server | None = None
        self._kubelet_inode: int | None = None
        self.registrations = 0

    def start(self) -> None:
        """Serve on a fresh socket (an old one is removed first)."""
        if os.path.exists(self.socket):
            os.unlink(self.socket)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        api_pb2_grpc.add_DevicePluginServicer_to_server(self.plugin, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """Stop serving (ListAndWatch streams end) and remove our socket (only ours)."""
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)

    @property
    def serving(self) -> bool:
        """Registered with the kubelet, whose ListAndWatch has our slots (readiness)."""
        return self._server is not None and self.registrations > 0 \
            and self.plugin.lists_sent > 0

    def _kubelet_socket_inode(self) -> int | None:
        try:
            return os.stat(os.path.join(self.plugin_dir, KUBELET_SOCKET)).st_ino
        except FileNotFoundError:
            return None

    def ensure(self) -> bool:
        """One step of the keep-alive loop: (re)start and (re)register when the kubelet is
        there and either our socket vanished or kubelet.sock is new. Returns True when it
        registered now."""
        inode = self._kubelet_socket_inode()
        if inode is None:
            return False
        if self._server is not None and os.path.exists(self.socket) \
                and inode == self._kubelet_inode:
            return False
        self.stop()
        self.start()
        try:
            register(self.plugin_dir, self.endpoint, self.resource)
        except grpc.RpcError as exc:
            log.warning("registration with the kubelet failed: %s", exc)
            self.stop()
            return False
        self._kubelet_inode = inode
        self.registrations += 1
        log.info("registered %s with the kubelet (%s)", self.resource, self.plugin_dir)
        return True

    def run(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Keep serving and registered until ``stop`` is set (watches the kubelet socket)."""
        while not stop.is_set():
            self.ensure()
            stop.wait(interval)
        self.plugin.stop()
        self.stop()
