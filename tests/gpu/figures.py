"""Pure computations for the real-GPU checks (tested on the CPU by tests/compute)."""

from __future__ import annotations

import itertools


def percentiles(values: list[float], prefix: str) -> dict:
    if not values:
        return {f"{prefix}_p50": None, f"{prefix}_p99": None, f"{prefix}_max": None}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))], 1)

    return {f"{prefix}_p50": at(0.50), f"{prefix}_p99": at(0.99), f"{prefix}_max": round(v[-1], 1)}


def loop_summary(
    stamps: list[float], t0: float, t1: float, kernel_us: float, window_s: float = 1.0
) -> dict:
    """GPU use of a loop of fixed-work kernels: launches x solo duration / wall, overall and
    per window (by launch time), plus the longest pause between launches."""
    wall = max(t1 - t0, 1e-9)
    wins: list[float] = []
    i = 0
    w0 = t0
    while w0 + window_s <= t1 + 1e-9:
        c = 0
        while i < len(stamps) and stamps[i] < w0 + window_s:
            if stamps[i] >= w0:
                c += 1
            i += 1
        wins.append(round(100.0 * c * kernel_us / 1e6 / window_s, 3))
        w0 += window_s
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "launches": len(stamps),
        "wall_s": round(wall, 4),
        "use_pct": round(100.0 * len(stamps) * kernel_us / 1e6 / wall, 3),
        "win_use_pct": wins,
        "max_gap_ms": round(1000 * max(gaps), 3) if gaps else None,
        "kernel_us": kernel_us,
    }


def steady(r: dict) -> float:
    """Mean use over the windows after the first (start-up excluded)."""
    w = r.get("win_use_pct") or []
    w = w[1:] if len(w) > 1 else w
    return sum(w) / len(w) if w else r.get("use_pct", 0.0)


def cap_errors(caps: dict) -> dict:
    """caps: {"short": {"10": result, ...}, "long": {...}} -> per-run error and the worst."""
    errs = {}
    for size, runs in caps.items():
        for cap, r in runs.items():
            if r is None or "error" in r:
                continue
            errs[f"{size}@{cap}"] = round(abs(steady(r) - float(cap)), 2)
    return {"per_run": errs, "worst": max(errs.values()) if errs else None}


def split(a: dict | None, b: dict | None) -> tuple[int, int] | None:
    if not a or not b or "error" in a or "error" in b:
        return None
    ua, ub = steady(a), steady(b)
    if ua + ub <= 0:
        return None
    pa = round(100 * ua / (ua + ub))
    return pa, 100 - pa


def ratio(x: float | None, y: float | None) -> float | None:
    if x is None or y is None or y <= 0:
        return None
    return round(x / y, 2)


def overhead_pct(plain: float | None, ours: float | None) -> float | None:
    """How much slower launches are with the interposer (uncapped share), in %."""
    if not plain or ours is None:
        return None
    return round(100.0 * (plain - ours) / plain, 2)


def final_line(fig: dict) -> str:
    def f(v: object) -> str:
        return "NA" if v is None else str(v)

    sp = fig.get("split_30_70")
    return (
        f"cap_error_pts={f(fig.get('cap_error_pts'))} "
        f"split_30_70={f(sp[0]) + ':' + f(sp[1]) if sp else 'NA:NA'} "
        f"hiprio_p99_ratio={f(fig.get('hiprio_p99_ratio'))} "
        f"uncapped_overhead_pct={f(fig.get('uncapped_overhead_pct'))}"
    )


def table(rows: list[tuple[str, object, str]]) -> str:
    w = max((len(r[0]) for r in rows), default=10)
    out = [f"{'check'.ljust(w)}  {'value':>14}  note", "-" * (w + 30)]
    for name, val, note in rows:
        out.append(f"{name.ljust(w)}  {('NA' if val is None else str(val)):>14}  {note}")
    return "\n".join(out)
