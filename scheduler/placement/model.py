"""The placement's data: a node's cards as seen for one pod, the pod's demand, the answers.

Plain frozen values, no behaviour beyond derived numbers; units: MiB, % of one card's compute,
share slots. ``CardState``/``NodeState`` are built by ``scheduler.state`` from the cluster
view; ``PodDemand`` from a ``PodRequest``; ``Placement``, ``Fits`` and ``Unfit`` are what
``fit``/``check`` answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from egpu.booking import CardBooking
from egpu.config import Config
from egpu.policies import PlacementPolicy
from egpu.records import Allocation
from egpu.requests import ContainerKind, PodRequest, Share


@dataclass(frozen=True, slots=True)
class CardState:
    """One card as the placement sees it: identity, capacity (MiB), and others' bookings."""

    uuid: str
    index: int
    model: str
    capacity_mib: int
    healthy: bool = True
    booked_mib: int = 0
    booked_cores: int = 0  # % of the card's compute
    used_slots: int = 0

    @property
    def fullness(self) -> float:
        """Booked MiB / capacity MiB (may exceed 1 under memory oversubscription)."""
        return self.booked_mib / self.capacity_mib

    def label(self) -> str:
        """``card 3 (NVIDIA A10, 23028 MiB)``."""
        return f"card {self.index} ({self.model}, {self.capacity_mib} MiB)"

    def emptied(self) -> CardState:
        """This card without the other pods' bookings (would preempting them help?)."""
        return replace(self, booked_mib=0, booked_cores=0, used_slots=0)


@dataclass(frozen=True, slots=True)
class NodeState:
    """One node: its cards, its heartbeat (unix seconds; None: never) and any inventory problem.

    ``problem`` is "" when the inventory annotation was read, else why the node takes no shares.
    ``capacity_mib`` and ``booked_mib``: totals over the healthy cards (derived, not passed).
    """

    name: str
    cards: tuple[CardState, ...] = ()
    heartbeat: float | None = None
    problem: str = ""
    capacity_mib: int = field(default=0, init=False)
    booked_mib: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        healthy = [c for c in self.cards if c.healthy]
        object.__setattr__(self, "capacity_mib", sum(c.capacity_mib for c in healthy))
        object.__setattr__(self, "booked_mib", sum(c.booked_mib for c in healthy))

    @property
    def utilization(self) -> float:
        """Booked / capacity MiB over the healthy cards (1.0 when there are none)."""
        return self.booked_mib / self.capacity_mib if self.capacity_mib else 1.0


@dataclass(frozen=True, slots=True)
class Limits:
    """Cluster-wide bounds from the config (see ``egpu.config`` for the keys)."""

    shares_per_card: int = 10
    memory_ratio: float = 1.5
    cores_ratio: float = 1.0
    heartbeat_timeout_s: float = 120.0

    @classmethod
    def from_config(cls, config: Config) -> Limits:
        """Limits of ``config`` (sharesPerCard, the two ratios, heartbeatTimeoutSeconds)."""
        return cls(config.shares_per_card, config.memory_oversubscription_ratio,
                   config.cores_oversubscription_ratio, float(config.heartbeat_timeout_seconds))


@dataclass(frozen=True, slots=True)
class ContainerDemand:
    """One container with a share; ``order`` is its position in the pod spec (inits first)."""

    name: str
    kind: ContainerKind
    share: Share
    order: int


@dataclass(frozen=True)
class PodDemand:
    """What placement needs of a pod: its shares (in placement order), filters and policies."""

    containers: tuple[ContainerDemand, ...]
    oversubscribe: bool = False
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: frozenset[str] = frozenset()
    nouse_uuids: frozenset[str] = frozenset()
    gpu_policy: PlacementPolicy = PlacementPolicy.BINPACK
    node_policy: PlacementPolicy = PlacementPolicy.BINPACK

    @classmethod
    def from_request(cls, request: PodRequest) -> PodDemand:
        """Normalize a ``PodRequest``: app and sidecar containers (most cards first), then inits."""
        rows = [ContainerDemand(c.name, c.kind, c.share, i)
                for i, c in enumerate(request.containers)]
        steady = sorted((r for r in rows if r.kind is not ContainerKind.INIT),
                        key=lambda r: (-r.share.gpus, r.order))
        inits = [r for r in rows if r.kind is ContainerKind.INIT]
        return cls(
            containers=(*steady, *inits),
            oversubscribe=request.memory_oversubscription,
            use_types=request.use_gpu_types,
            nouse_types=request.nouse_gpu_types,
            use_uuids=frozenset(request.use_gpu_uuids),
            nouse_uuids=frozenset(request.nouse_gpu_uuids),
            gpu_policy=request.gpu_policy,
            node_policy=request.node_policy,
        )


@dataclass(frozen=True)
class Placement:
    """A pod fitted on a node.

    allocation: the ``egpu.io/allocation`` record (node set, containers in spec order).
    bookings: card UUID -> what the pod books there (effective-request rule).
    utilization: the node's booked/capacity MiB over its healthy cards with the pod placed.
    """

    node: str
    allocation: Allocation
    bookings: dict[str, CardBooking] = field(default_factory=dict)
    utilization: float = 0.0


@dataclass(frozen=True, slots=True)
class Fits:
    """The pod fits the node (``check``); utilization as in ``Placement``, for scoring."""

    node: str
    utilization: float


@dataclass(frozen=True)
class Unfit:
    """Why a pod does not fit a node; ``unresolvable``: not even on the emptied node."""

    node: str
    reason: str
    unresolvable: bool = False
