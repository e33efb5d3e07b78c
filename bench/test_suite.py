"""The wall time of `make test` (the README's test command), warm: the build cache in
~/.cache/egpu and the venv exist, so it is lint + the two pytest runs (the real-time suites,
then the lanes on parallel workers; Makefile, tests/lanes.py). Issue 23's target: <= 9 min on
the 2-core machines.

    .venv/bin/python bench/record.py test_suite [--dir CLONE] [--workers N]

``--dir``: the clone to run it in (default: this one). The whole output of make is kept.
Last line: ``make_test_s=N lint_s=N realtime_s=N lanes_s=N passed=N failed=N errors=N``
(realtime_s, lanes_s: pytest's own "in N s" of each run; lint_s: the time before the first
pytest run started, which is lint and the up-to-date checks of the build steps).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=+ (.*) in ([0-9.]+)s")
COUNT = re.compile(r"([0-9]+) (passed|failed|errors?)")
PYTEST_START = "test session starts"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=REPO, help="the clone (default: %(default)s)")
    p.add_argument("--workers", type=int, default=0,
                   help="TEST_WORKERS for make (default: the Makefile's)")
    args = p.parse_args(argv)
    command = ["make", "test"] + ([f"TEST_WORKERS={args.workers}"] if args.workers else [])
    start = time.monotonic()
    first_pytest = 0.0
    runs: list[float] = []
    counts = {"passed": 0, "failed": 0, "errors": 0}
    proc = subprocess.Popen(command, cwd=args.dir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if PYTEST_START in line and not first_pytest:
            first_pytest = time.monotonic() - start
        found = SUMMARY.match(line.strip())
        if found:
            runs.append(float(found.group(2)))
            for number, kind in COUNT.findall(found.group(1)):
                counts["errors" if kind.startswith("error") else kind] += int(number)
    status = proc.wait()
    wall = time.monotonic() - start
    realtime_s, lanes_s = (runs + [float("nan")] * 2)[:2]
    print(f"make exit status {status}")
    print(f"make_test_s={wall:.0f} lint_s={first_pytest:.0f} realtime_s={realtime_s:.0f} "
          f"lanes_s={lanes_s:.0f} passed={counts['passed']} failed={counts['failed']} "
          f"errors={counts['errors']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
