"""Benchmark evidence (issue 23): bench/record.py keeps a run whole, bench/summary.py judges
the newest run of each benchmark against its targets and keeps docs/benchmarks.md's table
equal to the results (`make lint`).

Bugs caught: a summary that says "met" for a figure that misses its target or is missing
from the line, or for a run that failed; a table edited by hand away from the results; one
percentile per benchmark, each rounding its own way.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench import summary
from testbed.stats import percentile

REPO = Path(__file__).resolve().parents[2]


def kept(tmp_path: Path, name: str, last: str, status: str = "0") -> summary.Result:
    path = tmp_path / f"20261203T000000Z_{name}.txt"
    path.write_text(f"# benchmark: {name}\n# date: 2026-12-03T00:00:00Z\n# commit: abc\n"
                    f"some output\n{last}\n# exit status: {status}\n# wall: 1.0 s\n")
    return summary.read_result(path)


def test_a_figure_that_misses_its_target_or_is_missing_is_not_met(tmp_path: Path) -> None:
    ok = kept(tmp_path, "pod_start", "pods=40 start_ratio=0.86")
    assert summary.judge("pod_start", ok)[1] == "met"
    low = kept(tmp_path, "pod_start", "pods=40 start_ratio=0.78")
    assert summary.judge("pod_start", low)[1] == "not met: start_ratio=0.78"
    missing = kept(tmp_path, "scheduling", "nodes=1000 dra_ratio=0.6")
    assert "plugin_ratio missing" in summary.judge("scheduling", missing)[1]
    failed = kept(tmp_path, "pod_start", "pods=40 start_ratio=0.9", status="1")
    assert summary.judge("pod_start", failed)[1] == "not met: exit status 1"
    assert summary.judge("pod_start", None)[1] == "not measured"


def test_the_table_in_the_docs_is_the_results_table() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "summary.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    assert summary.render(doc) == doc
    edited = doc.replace("| benchmark | run", "| bench | run", 1)
    assert summary.render(edited) != edited


@pytest.mark.parametrize(("values", "q", "want"), [
    ([5.0], 0.99, 5.0), ([1, 2, 3, 4], 0.5, 2), ([1, 2, 3, 4], 0.51, 3),
    (list(range(1, 101)), 0.99, 99), (list(range(1, 101)), 1.0, 100), ([3, 1, 2], 0.5, 2),
])
def test_the_one_percentile_is_nearest_rank(values: list[float], q: float,
                                            want: float) -> None:
    assert percentile(values, q) == want


def test_every_benchmark_reports_through_the_one_percentile() -> None:
    for path in (REPO / "bench").glob("*.py"):
        text = path.read_text()
        assert "def percentile" not in text and "def pct" not in text, path.name
