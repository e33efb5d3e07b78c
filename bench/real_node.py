"""Start-up of a real node (kubelet + containerd + kube-proxy, devcluster.realnode), warm.

Starts a private control plane, then adds and removes one real node ``--rounds`` times
(binaries and images cached), timing ``add`` (namespaces, containerd, image import, kubelet,
Node Ready, kube-proxy's rules) and ``remove``. Needs root. Target: start-up under 30 s.

    .venv/bin/python bench/real_node.py [--rounds 3]

Last line: ``rounds=N start_s_min=N start_s_median=N start_s_max=N remove_s_median=N``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devcluster import cluster as devcluster
from devcluster import images, realnode

NODE = "egpu-real-bench"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    archives = images.ensure_images()  # built before the clock starts: this is the warm case
    starts, removes = [], []
    with tempfile.TemporaryDirectory(prefix="egpu-bench-node-") as tmp:
        state = Path(tmp)
        info = devcluster.up(devcluster.Config(state_dir=state, egpu_profile=False))
        try:
            for _ in range(args.rounds):
                t0 = time.monotonic()
                node = realnode.add(info, name=NODE,
                                    images={k: Path(v) for k, v in archives.items()})
                starts.append(time.monotonic() - t0)
                print(f"  steps (s): {node.steps_s}", flush=True)
                t0 = time.monotonic()
                realnode.remove(state, NODE)
                removes.append(time.monotonic() - t0)
                print(f"round {len(starts)}: start {starts[-1]:.1f} s, remove "
                      f"{removes[-1]:.1f} s", flush=True)
        finally:
            realnode.remove_all(state)
            devcluster.down(state)
    print(f"rounds={len(starts)} start_s_min={min(starts):.1f} "
          f"start_s_median={statistics.median(starts):.1f} start_s_max={max(starts):.1f} "
          f"remove_s_median={statistics.median(removes):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
