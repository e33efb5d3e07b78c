"""What the compute gate costs per launch, against the fake GPU (no kernel time).

    python bench/compute.py [--seconds 1] [--repeat 3]

Runs libinterpose/build/compute_load with FAKEGPU_KERNEL_US=0 (a launch is just the fake
driver's bookkeeping) without the interposer, with it on an uncapped share (the fast path:
a load and a branch), and with it on a capped share (the gated path: the card-region lock,
an event record, the poller). Prints ns per launch for each and the difference. The figure
on a real driver comes from tests/gpu/run.sh (uncapped_overhead_pct).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "libinterpose" / "build"
FAKE = ROOT / "fakegpu" / "build"
UUID = "GPU-b0b0b0b0-0000-4000-8000-000000000001"


def run(tmp: Path, seconds: float, preload: bool, cores: int) -> float:
    cfg = {
        "version": 1,
        "namespace": "b",
        "pod": "b",
        "pod_uid": "b",
        "container": "c",
        "priority": "high",
        "compute_policy": "strict",
        "memory_oversubscription": False,
        "container_region": str(tmp / "rt" / "containers" / f"b{cores}" / "region"),
        "cards": [
            {
                "uuid": UUID,
                "memory_mib": 4096,
                "cores": cores,
                "card_region": str(tmp / "rt" / "cards" / UUID),
            }
        ],
    }
    (tmp / "cfg.json").write_text(json.dumps(cfg))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LD_LIBRARY_PATH": str(FAKE),
        "FAKEGPU_CONFIG": str(tmp / "fake.ini"),
        "FAKEGPU_STATE_DIR": str(tmp / "fake"),
        "FAKEGPU_KERNEL_US": "0",
        "EGPU_CONFIG_PATH": str(tmp / "cfg.json"),
        "EGPU_RUNTIME_DIR": str(tmp / "rt"),
    }
    if preload:
        env["LD_PRELOAD"] = str(LIB / "libegpu_interpose.so")
    out = subprocess.run(
        [str(LIB / "compute_load"), "-t", str(seconds), "-s", "100000000"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    r = json.loads(out.splitlines()[0])
    return 1e9 * r["wall_s"] / max(1, r["launches"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    for d in ("fakegpu", "libinterpose"):
        subprocess.run(["make", "-s", "-C", str(ROOT / d)], check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "fake.ini").write_text(f"[card]\nuuid = {UUID}\nmemory_mib = 24576\n")
        best = {}
        for _ in range(a.repeat):
            for name, pre, cores in (
                ("no interposer", False, 0),
                ("uncapped", True, 0),
                ("capped 100% bucket", True, 99),
            ):
                ns = run(tmp, a.seconds, pre, cores)
                best[name] = min(best.get(name, ns), ns)
    base = best["no interposer"]
    for name, ns in best.items():
        print(f"{name:22s} {ns:8.1f} ns/launch  (+{ns - base:.1f} ns)")


if __name__ == "__main__":
    main()
