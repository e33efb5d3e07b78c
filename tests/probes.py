"""The fake-GPU probes as the tests run them in the background (tests/interposer,
tests/compute, tests/runtime_hook): libinterpose/tests/cuprobe.c prints one line a step,
``<step> rc=<code> ...``, and at its ``hold`` step keeps what it took until it is killed."""

from __future__ import annotations

import subprocess


def wait_for_hold(p: subprocess.Popen[str], *, every_ok: bool = False) -> list[str]:
    """Read ``p``'s output up to its ``hold`` line: from then on it holds what its steps
    took. Returns the lines read, ``hold`` last. Fails, with those lines and ``p``'s stderr
    (``p`` is killed first when it still runs, so that reading it cannot block), when the
    output ends before ``hold`` (the probe died) or, ``every_ok``, at the first line without
    `` rc=0`` (a step failed)."""
    assert p.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith("hold"):
        line = p.stdout.readline()
        lines.append(line)
        if not line or (every_ok and " rc=0" not in line):
            if p.poll() is None:
                p.kill()
                p.wait()
            stderr = p.stderr.read() if p.stderr is not None else ""
            raise AssertionError(f"no hold from {p.args}: {''.join(lines)!r}\n{stderr}")
    return lines
