"""Accounting storm: processes of one container allocate and free while some are SIGKILLed.

Issue 15's reliability figure. ``--rounds`` rounds; in each, ``--procs`` processes of one
container (one interposer config, one container region, a ``--limit-mib`` memory cap) start
together on the fake GPU and each runs ``--iters`` iterations of ``alloc 64 MiB, alloc 32 MiB,
cuMemGetInfo, free, free`` (libinterpose/build/cuprobe ``loop``); ``--victims`` of them, picked
at random, are SIGKILLed at a random instant in the first ``--kill-window-ms``, wherever they
are (inside an allocation, holding the container region's lock, between the driver call and
the accounting). A killed process's charges must be taken back by the survivors (its pid is
gone), and no survivor may wait on a lock a dead process held for longer than a blip.

Counted at the end:
- ``leaked_mib``: MiB still charged to the container after all rounds, as a fresh process sees
  it through the interposer (cuMemGetInfo and NVML), plus MiB the fake driver itself still
  holds on the card (must be 0);
- ``failed_steps``: allocation or free calls of survivors that did not return CUDA_SUCCESS
  (must be 0: 8 x 96 MiB fits the cap, so any refusal is a leak or a lost update);
- ``bad_exits``: processes that ended other than by exiting 0 or by our SIGKILL (must be 0);
- ``max_wait_ms``: the longest iteration of any survivor (an iteration is five calls; a wait
  on a robust lock whose owner died shows here);
- ``p99_iter_ms``: the 99th percentile of the survivors' longest iterations.

The last line is exactly ``rounds=N procs=N killed=N leaked_mib=N failed_steps=N bad_exits=N
max_wait_ms=N p99_iter_ms=N``. Exit status 0 when leaked_mib, failed_steps and bad_exits are 0.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "fakegpu" / "build"
CUPROBE = ROOT / "libinterpose" / "build" / "cuprobe"
INTERPOSER = ROOT / "libinterpose" / "build" / "libegpu_interpose.so"
ROUND_TIMEOUT_S = 30.0  # a round that takes longer is a hang: the run fails
POLL_S = 0.001  # how often the driver loop looks at its processes


def environment(tmp: Path, limit_mib: int, preload: bool = True) -> dict[str, str]:
    """The env of one process of the container (the fake GPU's state and the egpu runtime dir
    under ``tmp``; no node config file: the cap comes from EGPU_MEMORY_LIMIT_MIB)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(FAKE),
        "FAKEGPU_STATE_DIR": str(tmp / "fakegpu"),
        "EGPU_RUNTIME_DIR": str(tmp / "egpu"),
        "EGPU_CONFIG_PATH": str(tmp / "no-config.json"),
        "EGPU_MEMORY_LIMIT_MIB": str(limit_mib),
        "EGPU_CONTEXT_OVERHEAD_MIB": "0",
    }
    if preload:
        env["LD_PRELOAD"] = str(INTERPOSER)
    return env


def probe(env: dict[str, str], *steps: str) -> dict[str, dict[str, str]]:
    """Runs cuprobe ``steps``; its output rows by step name (``used=`` etc. as text)."""
    out = subprocess.run([str(CUPROBE), *steps], env=env, capture_output=True, text=True,
                         timeout=ROUND_TIMEOUT_S, check=True).stdout
    rows: dict[str, dict[str, str]] = {}
    for line in out.splitlines():
        name, *fields = line.split()
        rows[name] = dict(f.partition("=")[::2] for f in fields)
    return rows


def where(pid: int) -> str:
    """What a hung process is doing: its threads' stacks (gdb, when installed)."""
    try:
        return subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt",
                               "-ex", "thread 1", "-ex", "frame 1",
                               "-ex", "p *mutex"],
                              capture_output=True, text=True, timeout=60).stdout[-6000:]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(no stack: {exc})"


def storm_round(env: dict[str, str], procs: int, victims: int, iters: int, kill_window_s: float,
                rng: random.Random) -> tuple[int, int, int, list[int]]:
    """One round. Returns (killed, failed_steps, bad_exits, the survivors' longest iterations
    in us). Raises TimeoutError past ROUND_TIMEOUT_S."""
    steps = ["init", "primary", "loop", str(iters), "alloc", "64", "alloc", "32", "meminfo",
             "free", "free", ";"]
    running = [subprocess.Popen([str(CUPROBE), *steps], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(procs)]
    start = time.monotonic()
    doomed = {i: start + rng.uniform(0, kill_window_s) for i in rng.sample(range(procs), victims)}
    killed = failed = bad = 0
    longest: list[int] = []
    while doomed:
        now = time.monotonic()
        for i, when in list(doomed.items()):
            if now >= when:
                if running[i].poll() is None:
                    running[i].send_signal(signal.SIGKILL)
                    killed += 1
                del doomed[i]
        time.sleep(POLL_S)
    for p in running:
        try:
            out, _ = p.communicate(timeout=max(0.1, ROUND_TIMEOUT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            stuck = where(p.pid)
            for q in running:
                q.kill()
            raise TimeoutError(f"process {p.pid} of the round hung:\n{stuck}") from None
        if p.returncode == -signal.SIGKILL:
            continue
        if p.returncode != 0:
            bad += 1
            continue
        for line in out.splitlines():
            if " rc=" in line and " rc=0" not in line:
                failed += 1
            if line.startswith("loop "):
                fields = dict(f.partition("=")[::2] for f in line.split()[1:])
                longest.append(int(fields["max_iter_us"]))
    return killed, failed, bad, longest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--procs", type=int, default=8, help="processes a round (default 8)")
    ap.add_argument("--victims", type=int, default=3, help="of them SIGKILLed (default 3)")
    ap.add_argument("--iters", type=int, default=2000,
                    help="iterations a process (default 2000: ~5 ms alone, past the kill window)")
    ap.add_argument("--kill-window-ms", type=float, default=15.0)
    ap.add_argument("--limit-mib", type=int, default=2048, help="the container's cap (MiB)")
    ap.add_argument("--seed", type=int, default=15)
    args = ap.parse_args(argv)
    if not 0 <= args.victims <= args.procs:
        ap.error(f"--victims: {args.victims}; allowed: 0..--procs ({args.procs})")
    rng = random.Random(args.seed)
    killed = failed = bad = 0
    longest: list[int] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="egpu-storm-") as d:
        tmp = Path(d)
        env = environment(tmp, args.limit_mib)
        for r in range(args.rounds):
            k, f, b, lg = storm_round(env, args.procs, args.victims, args.iters,
                                      args.kill_window_ms / 1000, rng)
            killed, failed, bad = killed + k, failed + f, bad + b
            longest += lg
            if (r + 1) % 100 == 0:
                print(f"round {r + 1}: killed {killed}, failed steps {failed}, bad exits {bad}",
                      file=sys.stderr)
        seen = probe(env, "init", "primary", "meminfo", "nvml")
        card = probe(environment(tmp, args.limit_mib, preload=False), "nvml")
        leaked = (int(seen["meminfo"]["used"]) + int(seen["nvml"]["used"])
                  + int(card["nvml"]["used"])) // (1 << 20)
    longest.sort()
    p99 = longest[min(len(longest) - 1, int(0.99 * len(longest)))] if longest else 0
    print(f"wall {time.monotonic() - t0:.1f} s, {len(longest)} survivors", file=sys.stderr)
    print(f"rounds={args.rounds} procs={args.procs} killed={killed} leaked_mib={leaked} "
          f"failed_steps={failed} bad_exits={bad} max_wait_ms={max(longest, default=0) / 1000:.1f} "
          f"p99_iter_ms={p99 / 1000:.1f}")
    return 0 if leaked == failed == bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
