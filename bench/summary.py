"""docs/benchmarks.md's summary table, made from the newest result of each benchmark in
bench/results/ (bench/record.py writes them), each figure beside its target and a plain
met / not met.

    .venv/bin/python bench/summary.py          # rewrite the table in docs/benchmarks.md
    .venv/bin/python bench/summary.py --check  # exit 1 when the table differs (make lint)

The table sits between the lines ``<!-- summary:begin -->`` and ``<!-- summary:end -->``.
A benchmark's figures are the ``name=value`` pairs of its output's last line; its targets are
TARGETS below (a figure missing from the line is "not met": the target is not measured).
"""

from __future__ import annotations

import argparse
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- summary:begin -->", "<!-- summary:end -->"
FIGURE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(-?[0-9.]+|nan)")
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, "==": operator.eq}

# benchmark -> its targets: (figure, operator, bound); the issue or case that set each
TARGETS: dict[str, tuple[tuple[str, str, float], ...]] = {
    "interposer": (("launch_added_ns", "<=", 20), ("alloc_free_added_ns", "<=", 1000)),
    # the p99 with the target's 1500/s offered (bench/webhook.py: at saturation it is queueing)
    "webhook": (("reviews_per_s", ">=", 1500), ("p99_ms_at_1500_per_s", "<=", 10),
                ("create_latency_ratio", "<=", 1.2)),
    "admission_fuzz": (("http_5xx", "==", 0), ("internal_errors", "==", 0),
                       ("crashes", "==", 0), ("hangs", "==", 0), ("unnamed_denials", "==", 0)),
    # issue 24; plugin_ratio: the shares of egpu's scheduler, the extender_ratio while
    # the extender placed them
    "scheduling": (("dra_ratio", ">=", 0.5), ("plugin_ratio", ">=", 0.8)),
    "node": (("hook_p50_ms", "<=", 50), ("scrape_ms", "<=", 50)),
    "compute": (("capped_added_ns", "<=", 60), ("events_per_1000_launches", "<=", 50),
                ("binding_use_pct", "<=", 53), ("idle_share_cpu_us_per_s", "<=", 500)),
    "compute_caps": (("cap_err_max_pts_10us", "<=", 3), ("cap_err_max_pts_50us", "<=", 3),
                     ("cap_err_max_pts_20ms", "<=", 3), ("over_cap_max_pts", "<=", 3)),
    "compute_priority": (("hi_p50_added_us", "<=", 2500), ("hi_p99_added_us", "<=", 2500),
                         ("lo_max_pause_ms", "<=", 20), ("lo_use_pct_uncapped", ">=", 80),
                         ("lo_use_pct_capped50", ">=", 47)),
    "accounting_storm": (("leaked_mib", "==", 0), ("failed_steps", "==", 0),
                         ("bad_exits", "==", 0)),
    "placement_chaos": (("overbooked", "==", 0), ("lost", "==", 0), ("unplaced", "==", 0),
                        ("mid_burst_pct", ">=", 50)),
    "cert_rotation": (("failures", "==", 0),),
    "node_restarts": (("wrong_share", "==", 0), ("missing_share", "==", 0),
                      ("not_started", "==", 0), ("overbooked", "==", 0),
                      ("leaked_files", "==", 0)),
    "pod_start": (("start_ratio", ">=", 0.8),),
    "real_node": (("start_s_max", "<", 30),),
    "test_suite": (("make_test_s", "<=", 540), ("failed", "==", 0), ("errors", "==", 0)),
}


@dataclass(frozen=True)
class Result:
    """One kept run: its file, header fields and last line."""

    path: Path
    date: str
    commit: str
    last_line: str
    status: str

    @property
    def figures(self) -> dict[str, float]:
        return {k: float(v) for k, v in FIGURE.findall(self.last_line)}


def read_result(path: Path) -> Result:
    """A bench/results file (bench/record.py's format). Raises ValueError when it is not."""
    head: dict[str, str] = {}
    body: list[str] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            head[key.strip()] = value.strip()
        elif line.strip():
            body.append(line)
    last = next((line for line in reversed(body) if FIGURE.search(line)), "")
    if "date" not in head or "commit" not in head:
        raise ValueError(f"{path}: no header of bench/record.py")
    return Result(path, head["date"], head["commit"], last.strip(),
                  head.get("exit status", "unfinished"))


def newest() -> dict[str, Result]:
    """Benchmark name -> its newest result (file names start with the UTC time)."""
    found: dict[str, Result] = {}
    for path in sorted(RESULTS.glob("*_*.txt")):
        name = path.stem.split("_", 1)[1]
        found[name] = read_result(path)
    return found


def judge(name: str, result: Result | None) -> tuple[str, str]:
    """(targets as text, met / not met with the misses)."""
    targets = TARGETS.get(name, ())
    text = ", ".join(f"{f} {op} {bound:g}" for f, op, bound in targets) or "none set"
    if result is None:
        return text, "not measured"
    figures = result.figures
    misses = [f"{f}={figures[f]:g}" if f in figures else f"{f} missing"
              for f, op, bound in targets
              if f not in figures or not OPS[op](figures[f], bound)]
    if result.status != "0":
        misses.append(f"exit status {result.status}")
    return text, "met" if not misses else "not met: " + ", ".join(misses)


def table() -> str:
    rows = ["| benchmark | run (UTC, commit) | last line | target | met? |",
            "| --- | --- | --- | --- | --- |"]
    results = newest()
    for name in sorted(set(TARGETS) | set(results)):
        result = results.get(name)
        target, met = judge(name, result)
        if result is None:
            rows.append(f"| `bench/{name}.py` | no result kept | | {target} | {met} |")
            continue
        where = f"[{result.date}, {result.commit}](../bench/results/{result.path.name})"
        rows.append(f"| `bench/{name}.py` | {where} | `{result.last_line}` | {target} | "
                    f"{met} |")
    return "\n".join(rows) + "\n"


def render(doc: str) -> str:
    """``doc`` with the text between the markers replaced by the table."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"{DOC}: the markers {BEGIN} and {END} are missing")
    before, rest = doc.split(BEGIN, 1)
    _, after = rest.split(END, 1)
    return f"{before}{BEGIN}\n{table()}{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when docs/benchmarks.md's table is not the results'")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    wanted = render(doc)
    if args.check:
        if wanted != doc:
            print("docs/benchmarks.md's summary table differs from bench/results: run "
                  "`.venv/bin/python bench/summary.py`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
