"""Smoke test of the certificate rotation benchmark: while the serving pair is replaced every
half second (two CAs in turn, ECDSA and RSA keys, Secret-volume link swaps), reviews on
keep-alive and on fresh connections all get answers, and every new pair is served."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAST_LINE = re.compile(r"^seconds=\d+ rotations=(\d+) served=(\d+) reloads_ok=(\d+) "
                       r"reloads_error=(\d+) reviews=(\d+) failures=(\d+) reviews_per_s=\d+$")


def test_reviews_never_fail_while_the_certificate_rotates() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "bench" / "cert_rotation.py"), "--seconds", "4",
         "--concurrency", "8"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = result.stdout.strip().splitlines()
    match = LAST_LINE.match(lines[-1]) if lines else None
    assert match, result.stdout + result.stderr
    rotations, served, reloads_ok, reloads_error, reviews, failures = map(int, match.groups())
    assert rotations >= 3 and served == rotations and reloads_ok >= rotations, result.stdout
    assert reloads_error == 0 and failures == 0 and reviews > 0, result.stdout
    assert result.returncode == 0, result.stdout
