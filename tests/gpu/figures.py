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


# ---- driver_paths: the interposer's assumptions about the real driver -----------------
# Each judge takes the workload's raw results (MiB figures, CUresults) and answers
# {"status": "pass" | "fail" | "skip", "why": ...}: every broken expectation is named.
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
TOL_MIB = 1.0


def _near(a: object, b: object, tol: float = TOL_MIB) -> bool:
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(a - b) <= tol


def _diff(a: object, b: object) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return round(a - b, 2)
    return None


def _verdict(checks: list[tuple[bool, str]], ok: str) -> dict:
    bad = [why for good, why in checks if not good]
    return {"status": "fail", "why": "; ".join(bad)} if bad else {"status": "pass", "why": ok}


def _broken(r: dict | None, what: str) -> dict | None:
    """A run that crashed or timed out fails; one that found the driver unable skips."""
    if not isinstance(r, dict) or "error" in r:
        err = r.get("error") if isinstance(r, dict) else r
        tail = (r.get("stderr") or "").strip().splitlines()[-1:] if isinstance(r, dict) else []
        return {"status": "fail", "why": f"{what}: {err} {' '.join(tail)}".strip()}
    if "skip" in r:
        return {"status": "skip", "why": f"{what}: {r['skip']}"}
    return None


def judge_vmm_import(plain: dict, shared: dict) -> dict:
    """The driver (no interposer): an import of its own export in the same process works, a
    trial mapping of part or all of the imported allocation succeeds and one past its end
    fails. The share: the import of a second export is charged the whole size, and all of it
    goes back at release."""
    b = _broken(plain, "without the interposer")
    if b:
        return b
    if plain.get("import_rc") != 0:
        return {
            "status": "skip",
            "why": "the driver does not import its own POSIX fd export in the exporting process"
            f" (CUresult {plain.get('import_rc')})",
        }
    b = _broken(shared, "under the share")
    if b:
        return {"status": "fail", "why": b["why"]}  # the bare driver could: the share must
    size = shared.get("size_mib")
    created = _diff(shared.get("free_start"), shared.get("free_created"))
    moved = _diff(shared.get("free_created"), shared.get("free_exported"))
    imported = _diff(shared.get("free_exported"), shared.get("free_imported"))
    back = _diff(shared.get("free_end"), shared.get("free_start"))
    held = _diff(shared.get("held_end"), shared.get("held_start"))  # the driver's side (NVML)
    return _verdict(
        [
            (
                plain.get("reserve_rc") == 0,
                f"cuMemAddressReserve: CUresult {plain.get('reserve_rc')}",
            ),
            (
                plain.get("map_part_rc") == 0,
                f"the driver refused a mapping of part of an imported allocation (CUresult"
                f" {plain.get('map_part_rc')}): trial mappings cannot size imports",
            ),
            (
                plain.get("map_whole_rc") == 0,
                f"the driver refused a mapping of a whole imported allocation (CUresult"
                f" {plain.get('map_whole_rc')})",
            ),
            (
                plain.get("map_over_rc") not in (0, None),
                "the driver mapped past the end of an imported allocation: trial mappings"
                " overestimate imports",
            ),
            (_near(created, size), f"cuMemCreate of {size} MiB charged {created} MiB"),
            (_near(moved, 0), f"the first export changed free memory by {moved} MiB"),
            (
                shared.get("import_rc") == 0,
                f"the interposer refused the import of a second export (CUresult"
                f" {shared.get('import_rc')})",
            ),
            (
                shared.get("import_rc") != 0 or _near(imported, size),
                f"the import of a second export was charged {imported} MiB, not the whole"
                f" {size} MiB",
            ),
            (
                shared.get("release_rc") == 0 and shared.get("release_import_rc") in (0, None),
                f"cuMemRelease: CUresult {shared.get('release_rc')} /"
                f" {shared.get('release_import_rc')}",
            ),
            (_near(back, 0), f"after the releases free memory is {back} MiB off where it started"),
            (
                held is None or held <= TOL_MIB,
                f"the driver still holds {held} MiB for the process (NVML) after every handle"
                " and fd was released: the charge went back while the memory is held",
            ),
        ],
        f"import of a second export charged {imported} of {size} MiB (same handle as the"
        f" creator's: {shared.get('same_handle')}); the driver maps part and all of an import"
        f" and refuses past its end (CUresult {plain.get('map_over_rc')}); free back to start"
        f" (the driver's figure for the process: {held if held is not None else 'none'} MiB"
        " off)",
    )


def judge_pool_cap(r: dict, share_mib: int, step_mib: int) -> dict:
    """cuMemAllocAsync with the release threshold at its maximum, never freed: refused with
    OUT_OF_MEMORY before the share's room is exceeded, and the driver (NVML) holds no more
    for the process than that room (plus a step: the pool's own rounding)."""
    b = _broken(r, "pool")
    if b:
        return b
    room = r.get("free_start")
    allocated = r.get("allocated_mib")
    grown = _diff(r.get("held_full"), r.get("held_start"))
    checks = [
        (r.get("threshold_rc") == 0, f"release threshold: CUresult {r.get('threshold_rc')}"),
        (
            r.get("refused_rc") == OOM,
            f"refused with CUresult {r.get('refused_rc')}, not OUT_OF_MEMORY"
            if r.get("refused_rc") is not None
            else f"never refused ({allocated} MiB on a {share_mib} MiB share)",
        ),
        (
            isinstance(room, (int, float))
            and isinstance(allocated, (int, float))
            and allocated <= room + 0.001,
            f"{allocated} MiB allocated past the share's room of {room} MiB",
        ),
    ]
    if grown is None:
        nvml = "NVML gives no figure for this process (not checked)"
    else:
        checks.append(
            (
                grown <= (room or 0) + step_mib,
                f"the driver holds {grown} MiB more for the process (NVML), past the share's"
                f" room of {room} MiB",
            )
        )
        nvml = (
            f"NVML: the process holds {r.get('held_full')} MiB, {grown} more than with its"
            f" context alone (share {share_mib} MiB)"
        )
    return _verdict(
        checks,
        f"{allocated} MiB in {step_mib} MiB steps, then OUT_OF_MEMORY (room {room} MiB);"
        f" {nvml}; pool reserve {r.get('pool_reserved_mib')} MiB; free after trim"
        f" {r.get('free_end')} MiB",
    )


def judge_pool_destroy(r: dict, mib: int) -> dict:
    """A pool destroyed with a live allocation keeps its charge (the driver keeps the memory)
    until the allocation is freed (the driver releases it)."""
    b = _broken(r, "pool")
    if b:
        return b
    charged = _diff(r.get("free_start"), r.get("free_alloc"))
    kept = _diff(r.get("free_destroyed"), r.get("free_alloc"))  # what the destroy gave back
    back = _diff(r.get("free_end"), r.get("free_start"))
    checks = [
        (
            r.get("alloc_rc") == 0 and r.get("destroy_rc") == 0 and r.get("free_rc") == 0,
            f"alloc/destroy/free: CUresult {r.get('alloc_rc')}/{r.get('destroy_rc')}"
            f"/{r.get('free_rc')}",
        ),
        (charged is not None and charged >= mib - TOL_MIB, f"{mib} MiB charged {charged} MiB"),
        (_near(kept, 0), f"cuMemPoolDestroy gave back {kept} MiB with an allocation live"),
        (_near(back, 0), f"after the last free, free memory is {back} MiB off where it started"),
    ]
    held_d = _diff(r.get("held_destroyed"), r.get("held_start"))
    held_e = _diff(r.get("held_end"), r.get("held_start"))
    if held_d is not None and held_e is not None:
        checks += [
            (
                held_d >= mib - TOL_MIB,
                f"the driver released the destroyed pool's memory with an allocation live"
                f" (holds {held_d} MiB more)",
            ),
            (
                held_e <= TOL_MIB,
                f"the driver still holds {held_e} MiB after the last allocation was freed:"
                " the charge went back too early",
            ),
        ]
        driver = f"the driver held {held_d} MiB after the destroy, {held_e} after the free"
    else:
        driver = "NVML gives no figure for this process (the driver's side not checked)"
    return _verdict(
        checks, f"charged {charged} MiB, kept through cuMemPoolDestroy, back at the free; {driver}"
    )


def judge_heap_limit(r: dict, grow_mib: int) -> dict:
    """cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE): growth charged, past the share refused with
    OUT_OF_MEMORY and the limit unchanged, lowering gives it back."""
    b = _broken(r, "heap")
    if b:
        return b
    grown = _diff(r.get("limit_grown_mib"), r.get("base_mib"))
    charged = _diff(r.get("free_start"), r.get("free_grown"))
    took = _diff(r.get("held_grown"), r.get("held_start"))
    return _verdict(
        [
            (r.get("grow_rc") == 0, f"a heap {grow_mib} MiB larger: CUresult {r.get('grow_rc')}"),
            (_near(grown, grow_mib), f"the limit grew by {grown} MiB, not {grow_mib}"),
            (_near(charged, grown), f"a heap {grown} MiB larger was charged {charged} MiB"),
            (r.get("past_rc") == OOM, f"a heap past the share: CUresult {r.get('past_rc')}"),
            (
                r.get("limit_after_past_mib") == r.get("limit_grown_mib"),
                f"the refused limit changed it: {r.get('limit_grown_mib')} ->"
                f" {r.get('limit_after_past_mib')} MiB",
            ),
            (
                _near(r.get("free_after_past"), r.get("free_grown")),
                "the refused limit changed free memory",
            ),
            (r.get("back_rc") == 0, f"lowering the heap: CUresult {r.get('back_rc')}"),
            (
                _near(r.get("free_end"), r.get("free_start")),
                f"lowered back, free memory is {_diff(r.get('free_end'), r.get('free_start'))}"
                " MiB off where it started",
            ),
        ],
        f"heap {r.get('base_mib')} -> {r.get('limit_grown_mib')} MiB charged {charged} MiB"
        f" (the driver took {took} MiB at once by NVML); past the share: OUT_OF_MEMORY, limit"
        " kept; lowered: given back",
    )


def judge_nvml_procs(lister: dict, plain: dict, peer: int, other: int) -> dict:
    """Inside a share NVML's compute list (v3) shows the process itself and its share's other
    process, never a process outside the share that the driver itself lists."""
    for r, what in ((plain, "without the interposer"), (lister, "under the share")):
        b = _broken(r, what)
        if b:
            return b
    raw = set(plain.get("pids") or [])
    if plain.get("list_rc") != 0:
        return {"status": "skip", "why": f"NVML's list answered {plain.get('list_rc')}"}
    if plain.get("self") not in raw:
        return {"status": "skip", "why": "NVML lists no pid of this PID namespace (a container?)"}
    if other not in raw:
        return {"status": "skip", "why": "the driver does not list the process outside the share"}
    seen = set(lister.get("pids") or [])
    me = lister.get("self")
    extra = sorted(seen - {me, peer})
    return _verdict(
        [
            (lister.get("list_rc") == 0, f"NVML's list under the share: {lister.get('list_rc')}"),
            (me in seen, "the process itself is not listed"),
            (peer in seen, "the share's other process is not listed"),
            (other not in seen, "the process outside the share is listed"),
            (not extra, f"pids outside the share listed: {extra}"),
        ],
        f"the share sees {sorted(seen)} (itself and its peer); the driver lists {sorted(raw)}",
    )
