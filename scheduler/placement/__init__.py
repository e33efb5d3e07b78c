"""The placement core: fit a pod's shares onto one node, card by card (pure; no I/O).

Plain data in, a decision out. ``fit(node, demand, limits, now)`` returns a ``Placement`` (which
container gets which cards, with the ``egpu.io/allocation`` record and what the pod books per
card) or an ``Unfit`` with a reason a user can act on; ``check``/``checker``/
``utilization_checker`` give the same answer faster, without the record (filter and
prioritize); ``score(placement)`` ranks a node 0..10.

One responsibility per module, each importing only those above it:

- ``model``: the data (``CardState``, ``NodeState``, ``Limits``, ``PodDemand``, ``Placement``,
  ``Fits``, ``Unfit``);
- ``rule``: the fit rule: which cards a pod may use, whether a card takes a share
  (``refused``) and the one wording of a refusal (``reason``, ``short_of_cards``);
- ``search``: ``fit``, the depth-first search of all of a pod's shares over a node's cards
  under the card strategy (binpack/spread);
- ``fast``: ``check``, ``checker``, ``utilization_checker`` (one-share pods in one pass) and
  ``score``.
"""

from scheduler.placement.fast import check, checker, score, utilization_checker
from scheduler.placement.kubelet import reuse_conflict
from scheduler.placement.model import (
    CardState,
    ContainerDemand,
    Fits,
    Limits,
    NodeState,
    Placement,
    PodDemand,
    Unfit,
)
from scheduler.placement.rule import card_allowed, stale_reason
from scheduler.placement.search import INIT_REUSE_BUDGET, SEARCH_BUDGET, fit

__all__ = [
    "INIT_REUSE_BUDGET",
    "SEARCH_BUDGET",
    "CardState",
    "ContainerDemand",
    "Fits",
    "Limits",
    "NodeState",
    "Placement",
    "PodDemand",
    "Unfit",
    "card_allowed",
    "check",
    "checker",
    "fit",
    "reuse_conflict",
    "score",
    "stale_reason",
    "utilization_checker",
]
