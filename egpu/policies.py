"""The policies a pod or the config chooses among, as ``StrEnum``s for the core's typed code.

Each member *is* its contract string (``Priority.HIGH == "high"``, ``str(Priority.HIGH) ==
"high"``, equal hashes, ``json.dumps`` writes ``"high"``), so the wire formats (annotations,
labels, the config YAML, the JSON records) keep their strings and code that compares with
the strings keeps working. The contract's tuples (``egpu.contract.PRIORITIES``, ...) stay
the names of the wire; ``tests/unit/test_policies.py`` holds the two in step.

Not imported by the runtime hook, nor by ``egpu.records`` (its one decoder, run for every
container a node creates): the records carry the plain strings, which these enums equal.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class Choice(StrEnum):
    """A policy enum: its members are the allowed strings."""

    @classmethod
    def of(cls, text: object) -> Self | None:
        """The member whose string is ``text``; None for anything else (absent, misspelled,
        not a string)."""
        return cls(text) if isinstance(text, str) and text in cls.__members__.values() else None


class Priority(Choice):
    """``egpu.io/priority``, ``defaults.priority``, ``priorityClasses``: high work keeps its
    latency, low work takes what is idle (``egpu.contract.PRIORITIES``)."""

    HIGH = "high"
    LOW = "low"


class ComputePolicy(Choice):
    """``egpu.io/compute-policy``, ``defaults.computePolicy``: strict holds a share to its
    cores, elastic lets it use idle compute beyond them (``egpu.contract.COMPUTE_POLICIES``)."""

    STRICT = "strict"
    ELASTIC = "elastic"


class PlacementPolicy(Choice):
    """``egpu.io/gpu-policy`` (card on the chosen node), ``egpu.io/node-policy`` (which node),
    ``defaults.gpuPolicy`` / ``defaults.nodePolicy``: binpack fills the fullest that fits,
    spread the emptiest (``egpu.contract.PLACEMENT_POLICIES``, ``scheduler.strategies``)."""

    BINPACK = "binpack"
    SPREAD = "spread"


class AllocationMode(Choice):
    """``egpu.io/allocation-mode``, ``allocationMode``, ``namespaceAllocationModes``: what the
    webhook makes of a share (``egpu.contract.ALLOCATION_MODES``): the scheduler and device
    plugin path, or ResourceClaims (DRA, docs/dra.md)."""

    EXTENDER = "extender"
    DRA = "dra"
