"""The machine's CPU time each test phase took (``EGPU_CPU_REPORT=<file>``; off by default).

Issue 23's budget is CPU: warm ``make test`` in 9 min on 2 cores is at most 1080 CPU-s for
the whole suite. This plugin reads the machine's busy time (``/proc/stat``: every state but
idle and iowait, all CPUs) around each test's setup, call and teardown, and at the session's
end writes one line per test, most CPU first, then one line per file. A phase's figure counts
everything the machine did meanwhile (the control planes and real nodes the test started,
and anything else running), so it is read from a serial run on a machine nothing else loads.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path

import pytest

REPORT_ENV = "EGPU_CPU_REPORT"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
IDLE_FIELDS = (3, 4)  # /proc/stat's cpu line: idle, iowait (after the "cpu" label)


def busy_s() -> float:
    """Seconds of CPU the whole machine spent busy since boot (all CPUs together)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = sum(int(v) for i, v in enumerate(fields[:8]) if i not in IDLE_FIELDS)
    return ticks / TICKS_PER_S


class CpuReport:
    def __init__(self, path: Path) -> None:
        self.path = path
        # nodeid -> phase -> (wall s, cpu s)
        self.phases: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)

    def _measure(self, item: pytest.Item, phase: str) -> Generator[None]:
        wall, cpu = time.monotonic(), busy_s()
        yield
        self.phases[item.nodeid][phase] = (time.monotonic() - wall, busy_s() - cpu)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None]:
        yield from self._measure(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None]:
        yield from self._measure(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None]:
        yield from self._measure(item, "teardown")

    def pytest_sessionfinish(self) -> None:
        rows = []
        files: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
        for nodeid, phases in self.phases.items():
            wall = sum(w for w, _ in phases.values())
            cpu = sum(c for _, c in phases.values())
            detail = " ".join(f"{p}={c:.1f}/{w:.1f}" for p, (w, c) in phases.items())
            rows.append((cpu, wall, nodeid, detail))
            total = files[nodeid.split("::", 1)[0]]
            total[0] += cpu
            total[1] += wall
            total[2] += 1
        rows.sort(reverse=True)
        lines = ["# per test: cpu_s wall_s nodeid phase=cpu_s/wall_s ..."]
        lines += [f"{cpu:8.1f} {wall:8.1f} {nodeid} {detail}" for cpu, wall, nodeid, detail in rows]
        lines.append("# per file: cpu_s wall_s tests file")
        lines += [f"{c:8.1f} {w:8.1f} {int(n):5d} {f}"
                  for f, (c, w, n) in sorted(files.items(), key=lambda kv: -kv[1][0])]
        cpu_total = sum(r[0] for r in rows)
        wall_total = sum(r[1] for r in rows)
        lines.append(f"tests={len(rows)} cpu_s={cpu_total:.0f} wall_s={wall_total:.0f}")
        self.path.write_text("\n".join(lines) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    target = os.environ.get(REPORT_ENV)
    if target and not hasattr(config, "workerinput"):  # the serial run's process only
        config.pluginmanager.register(CpuReport(Path(target)), "egpu-cpu-report")
