"""Smoke test of the admission fuzz benchmark: a few hundred random, mutated and malformed
reviews against the real webhook process (HTTPS on 127.0.0.1) get no 5xx, no internal error,
no crash, no hang and no denial without a field."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAST_LINE = re.compile(r"^reviews=(\d+) http_5xx=(\d+) internal_errors=(\d+) crashes=(\d+) "
                       r"hangs=(\d+) unnamed_denials=(\d+) reviews_per_s=(\d+)$")


def test_a_few_hundred_fuzzed_reviews_get_only_answers_and_named_denials() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "admission_fuzz.py"), "--reviews", "400",
         "--concurrency", "8", "--max-seconds", "120", "--seed", "7"],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    lines = result.stdout.strip().splitlines()
    match = LAST_LINE.match(lines[-1]) if lines else None
    assert match, result.stdout + result.stderr
    assert int(match[1]) == 400
    assert [int(n) for n in match.groups()[1:6]] == [0, 0, 0, 0, 0], result.stdout
    assert result.returncode == 0, result.stdout
