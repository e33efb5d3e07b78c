"""Run one benchmark and keep its whole output as evidence under bench/results/.

    .venv/bin/python bench/record.py NAME [ARGS...]     # runs bench/NAME.py ARGS

The output (stdout and stderr, interleaved as printed) goes to the terminal and to
``bench/results/<UTC time>_<NAME>.txt``, after a header that says when, on which commit
(``+dirty`` when the tree had changes), on what machine, and the command; a footer gives the
exit status and the wall time. docs/benchmarks.md's summary table is made from the newest
result of each benchmark (``bench/summary.py``). Exit status: the benchmark's.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"


def _git(*args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
    return proc.stdout.strip()


def machine() -> str:
    """CPUs, their model, memory, kernel: one line."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text()
                       .splitlines() if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        mem_kib = 0
    return (f"{os.cpu_count()} CPUs ({model or platform.processor() or 'unknown'}), "
            f"{mem_kib / 1024 / 1024:.1f} GiB, Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def header(name: str, argv: list[str], when: datetime) -> str:
    commit = _git("rev-parse", "--short=12", "HEAD") or "unknown"
    dirty = "+dirty" if _git("status", "--porcelain", "--untracked-files=no") else ""
    return (f"# benchmark: {name}\n# date: {when.strftime('%Y-%m-%dT%H:%M:%SZ')}\n"
            f"# commit: {commit}{dirty}\n# machine: {machine()}\n"
            f"# load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n"
            f"# command: {' '.join(argv)}\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or not (REPO / "bench" / f"{args[0]}.py").is_file():
        names = sorted(p.stem for p in (REPO / "bench").glob("*.py")
                       if p.stem not in ("record", "summary", "targets"))
        print(f"usage: bench/record.py NAME [ARGS...]; NAME: one of {', '.join(names)}",
              file=sys.stderr)
        return 2
    name, rest = args[0], args[1:]
    command = [sys.executable, str(REPO / "bench" / f"{name}.py"), *rest]
    shown = ["bench/" + f"{name}.py", *rest]
    when = datetime.now(UTC)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{when.strftime('%Y%m%dT%H%M%SZ')}_{name}.txt"
    start = time.monotonic()
    with open(path, "w", encoding="utf-8") as out:
        out.write(header(name, ["python", *shown], when))
        out.flush()
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
        status = proc.wait()
        out.write(f"# exit status: {status}\n# wall: {time.monotonic() - start:.1f} s\n")
    print(f"kept in {path.relative_to(REPO)}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
