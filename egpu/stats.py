"""The one percentile egpu reports, in benchmarks and in `kubectl egpu advise` (nearest rank,
as most load tools' summaries do): no interpolation, so a figure is always one that was
measured."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of ``values`` by nearest rank: the smallest value with
    at least ``q`` of the values at or below it. Raises ValueError for no values or a ``q``
    outside (0, 1]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 < q <= 1:
        raise ValueError(f"q={q}: allowed 0 < q <= 1")
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
