"""bench/interposer.py runs and ends with the agreed line (a smoke test, not a measurement)."""

from __future__ import annotations

import re
import subprocess
import sys

from .conftest import INTERPOSER, ROOT


def test_bench_last_line_format():
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "interposer.py"),
            "-n",
            "20000",
            "--reps",
            "1",
            "--no-build",
            "--compare",
            str(INTERPOSER),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    last = p.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"launch_added_ns=-?\d+ alloc_free_added_ns=-?\d+ meminfo_added_ns=-?\d+ "
        r"graph_launch_added_ns=-?\d+ "
        r"noise_launch_ns=\d+ noise_alloc_free_ns=\d+ noise_meminfo_ns=\d+ "
        r"noise_graph_launch_ns=\d+ "
        r"compare_launch_added_ns=-?\d+ compare_alloc_free_added_ns=-?\d+ "
        r"compare_meminfo_added_ns=-?\d+ compare_graph_launch_added_ns=-?\d+",
        last,
    ), last
