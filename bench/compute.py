"""What the compute gate costs per launch, against the fake GPU.

    python bench/compute.py [--seconds 1] [--repeat 3] [--old PATH/libegpu_interpose.so]

ns per launch of a tight launch loop (libinterpose/build/compute_load -b: one thread, one
stream, kernels of no device time, never synchronised, timed in chunks of 20 000 launches;
the fastest chunk of the best run) for each kind of share:

- no interposer;
- uncapped (the fast path: a load and a branch);
- capped strict 50%, capped elastic 50% (the gated path);
- low priority beside an idle high-priority share (the priority gate's checks);

each with the fake driver's CPU cost per call off (its own tens of ns) and on
(FAKEGPU_CALL_COSTS=realistic: a real driver's microseconds per cuLaunchKernel,
cuEventRecord and cuEventQuery; fakegpu/src/fake_cuda.c gives the figures and their
sources). Best of --repeat runs. Then the events the gate records per 1000 launches
(counted by the fake driver: FAKEGPU_CALL_COUNTS) for 10 us kernels launched back to back by
a share capped at 50%. Then what an idle share costs the node: IDLE_SHARES processes holding
a context under a 50% cap and launching nothing, their threads' CPU time (schedstat, ns) over
IDLE_S once quiet, per share and second, beside as many processes without the interposer.
--old runs the same loops with another build of the interposer (e.g. the previous commit's)
side by side.

The zero-length kernels never reach a cap: they time the gate's bookkeeping only. The cap
binds in the events run (10 us kernels back to back, 50% cap): its measured use is reported
beside the cap (``binding_use_pct``; compute_load's own windows over the whole run).

Last line (realistic costs on; capped: the worse of strict and elastic):
    uncapped_added_ns=N capped_added_ns=N events_per_1000_launches=N binding_cap_pct=50
    binding_use_pct=N idle_share_cpu_us_per_s=N
Targets (issue 17): capped_added_ns <= 60, events_per_1000_launches <= 50; FC-13: the binding
use within the cap + 3 points; issue 23: an idle share at most 500 us of CPU a second (256 idle
shares on a node: an eighth of a core).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "libinterpose" / "build"
FAKE = ROOT / "fakegpu" / "build"
UUID = "GPU-b0b0b0b0-0000-4000-8000-000000000001"
CHUNK = 20000  # launches timed together: many lease refills and events fall in each
BINDING_CAP_PCT = 50  # the events run's cap, which its 10 us kernels reach
IDLE_SHARES = 20  # idle processes measured together
IDLE_QUIET_S = 2.0  # after their hold line: the poller naps once quiet for 1 s
IDLE_S = 5.0  # the measured quiet

# name: (priority, policy, cores); None: no interposer
SHARES = {
    "no interposer": None,
    "uncapped": ("high", "strict", 0),
    "capped strict 50%": ("high", "strict", 50),
    "capped elastic 50%": ("high", "elastic", 50),
    "low beside idle high": ("low", "strict", 0),
}


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        (tmp / "fake.ini").write_text(f"[card]\nuuid = {UUID}\nmemory_mib = 24576\n")
        self.n = 0

    def config(self, share: str, priority: str, policy: str, cores: int) -> Path:
        """A fresh share (its own container region) on the one fake card."""
        self.n += 1
        cfg = {
            "version": 1,
            "namespace": "b",
            "pod": share,
            "pod_uid": f"b{self.n}",
            "container": "c",
            "priority": priority,
            "compute_policy": policy,
            "memory_oversubscription": False,
            "container_region": str(self.tmp / "rt" / "containers" / f"b{self.n}" / "region"),
            "cards": [
                {
                    "uuid": UUID,
                    "memory_mib": 4096,
                    "cores": cores,
                    "card_region": str(self.tmp / "rt" / "cards" / UUID),
                }
            ],
        }
        path = self.tmp / f"cfg{self.n}.json"
        path.write_text(json.dumps(cfg))
        return path

    def env(self, cfg: Path | None, lib: Path | None, realistic: bool, kernel_us: int) -> dict:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LD_LIBRARY_PATH": str(FAKE),
            "FAKEGPU_CONFIG": str(self.tmp / "fake.ini"),
            "FAKEGPU_STATE_DIR": str(self.tmp / "fake"),
            "FAKEGPU_KERNEL_US": str(kernel_us),
            "EGPU_RUNTIME_DIR": str(self.tmp / "rt"),
        }
        if realistic:
            env["FAKEGPU_CALL_COSTS"] = "realistic"
        if cfg:
            env["EGPU_CONFIG_PATH"] = str(cfg)
        if lib:
            env["LD_PRELOAD"] = str(lib)
        return env

    def holder(self, cfg: Path | None, lib: Path | None) -> subprocess.Popen:
        """A process that holds a context (share cfg under lib; none: no interposer) and
        launches nothing, once it has said so."""
        p = subprocess.Popen(
            [str(LIB / "cuprobe"), "init", "ctx", "hold"],
            env=self.env(cfg, lib, False, 0),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        while p.stdout and "hold" not in (p.stdout.readline() or "hold"):
            pass
        return p

    def idle_high(self, lib: Path) -> subprocess.Popen:
        """A high-priority share that holds its slot on the card and launches nothing."""
        p = self.holder(self.config("idle", "high", "strict", 0), lib)
        time.sleep(0.05)  # the low share's poller sees it at its first pass anyway
        return p

    def loop(self, name: str, lib: Path | None, realistic: bool, seconds: float) -> float:
        """ns per launch of a launch loop of the share `name` (its fastest chunk: a shared
        machine's preemptions land in some chunks, not in all)."""
        spec = SHARES[name]
        cfg = self.config(name, *spec) if spec else None
        idle = self.idle_high(lib) if name == "low beside idle high" and lib else None
        try:
            out = subprocess.run(
                [str(LIB / "compute_load"), "-t", str(seconds), "-b", str(CHUNK)],
                env=self.env(cfg, lib if spec else None, realistic, 0),
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        finally:
            if idle:
                idle.send_signal(signal.SIGKILL)
                idle.wait()
        return float(json.loads(out.splitlines()[0])["best_ns"])

    def events(self, lib: Path, seconds: float) -> tuple[float, dict]:
        """Events per 1000 launches: 10 us kernels back to back under a 50% cap."""
        counts = self.tmp / f"counts{self.n}.jsonl"
        env = self.env(self.config("ev", "high", "strict", BINDING_CAP_PCT), lib, True, 10)
        env["FAKEGPU_CALL_COUNTS"] = str(counts)
        out = subprocess.run(
            [str(LIB / "compute_load"), "-t", str(seconds), "-s", "1024"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        load = json.loads(out.splitlines()[0])
        c = json.loads(counts.read_text().splitlines()[-1])
        return 1000.0 * c["event_record"] / max(1, c["launch"]), {"use_pct": load["use_pct"], **c}


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of process pid so far (ns, /proc/<pid>/task/*/schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def idle_cost(b: Bench, lib: Path | None) -> float:
    """CPU us a second of one idle share: IDLE_SHARES probes holding a context (50% cap; no
    interposer when lib is None) and launching nothing, over IDLE_S once quiet."""
    procs = []
    try:
        for _ in range(IDLE_SHARES):
            cfg = b.config("idle", "high", "strict", BINDING_CAP_PCT) if lib else None
            procs.append(b.holder(cfg, lib))
        time.sleep(IDLE_QUIET_S)
        before = sum(cpu_ns(p.pid) for p in procs)
        time.sleep(IDLE_S)
        used = sum(cpu_ns(p.pid) for p in procs) - before
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return used / 1000 / IDLE_SHARES / IDLE_S


def measure(b: Bench, lib: Path, seconds: float, repeat: int) -> dict:
    best: dict = {}
    for _ in range(repeat):
        for realistic in (False, True):
            for name in SHARES:
                ns = b.loop(name, lib, realistic, seconds)
                key = (name, realistic)
                best[key] = min(best.get(key, ns), ns)
    return best


def report(title: str, best: dict) -> None:
    print(f"{title}:")
    print(f"  {'share':24s} {'fake driver':>22s} {'realistic call costs':>28s}")
    for name in SHARES:
        cells = []
        for realistic in (False, True):
            ns, base = best[(name, realistic)], best[("no interposer", realistic)]
            cells.append(f"{ns:9.1f} ns (+{ns - base:6.1f})")
        print(f"  {name:24s} {cells[0]:>22s} {cells[1]:>28s}")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old", type=Path, help="another libegpu_interpose.so, measured side by side")
    a = ap.parse_args()
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)
    lib = LIB / "libegpu_interpose.so"
    with tempfile.TemporaryDirectory() as t:
        b = Bench(Path(t))
        libs = [("this build", lib)] + ([("--old", a.old.resolve())] if a.old else [])
        results = {label: measure(b, path, a.seconds, a.repeat) for label, path in libs}
        events = {label: b.events(path, max(a.seconds, 2.0)) for label, path in libs}
        idle = {"no interposer": idle_cost(b, None)}
        idle.update({label: idle_cost(b, path) for label, path in libs})
    for label, best in results.items():
        report(f"ns per launch, {label}", best)
        ev, detail = events[label]
        print(f"  events per 1000 launches (10 us kernels, cap 50%, realistic): {ev:.1f} {detail}")
    print(f"CPU of an idle share ({IDLE_SHARES} processes holding a context, {IDLE_S:.0f} s "
          "once quiet), us a second: " + ", ".join(f"{k} {v:.1f}" for k, v in idle.items()))
    best = results["this build"]
    base = best[("no interposer", True)]
    unc = best[("uncapped", True)] - base
    cap = max(best[("capped strict 50%", True)], best[("capped elastic 50%", True)]) - base
    print(
        f"uncapped_added_ns={unc:.0f} capped_added_ns={cap:.0f} "
        f"events_per_1000_launches={events['this build'][0]:.1f} "
        f"binding_cap_pct={BINDING_CAP_PCT} "
        f"binding_use_pct={events['this build'][1]['use_pct']:.1f} "
        f"idle_share_cpu_us_per_s={idle['this build']:.1f}"
    )


if __name__ == "__main__":
    main()
