"""Run egpu end to end on this machine: a local cluster with simulated GPU nodes, the webhook,
egpu-kube-scheduler, one node agent per node on the fake GPU, every workload of the demo's
inputs, a placement table, and one real runc container with a share.

  egpu demo             # (re)start the demo; it stays up
  egpu demo --dra       # the same demo with shares as ResourceClaims (docs/dra.md)
  egpu demo --down      # stop it

`make demo` builds what is missing first (the Kubernetes binaries, the interposer);
`make demo DEMO_ARGS=--dra` runs it in DRA mode.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli import NOT_IN_THE_WHEEL

COMMAND = "demo"
HELP = "run egpu end to end on a local cluster with simulated GPU nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --down, --dra, --inputs, --state-dir, --wait, --no-container,
    --no-real-node."""
    parser.add_argument("--down", action="store_true", help="stop the demo")
    parser.add_argument("--dra", action="store_true",
                        help="DRA mode: allocationMode: dra, the DeviceClasses of "
                             "manifests/dra, node agents with --dra --no-device-plugin; the "
                             "webhook turns shares into ResourceClaims that the default "
                             "kube-scheduler allocates (docs/dra.md)")
    parser.add_argument("--inputs", type=Path, default=None,
                        help="folder with cluster.yaml and pods/ (default: the embedded copy "
                             "of ../shared/inputs)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="default: $EGPU_DEMO_DIR, else $EGPU_STATE_DIR/demo, else "
                             "~/.cache/egpu/demo")
    parser.add_argument("--wait", type=float, default=90.0, help="seconds to wait for pods")
    parser.add_argument("--no-real-node", action="store_true",
                        help="no real node (kubelet + containerd) beside the simulated fleet")
    parser.add_argument("--no-container", action="store_true",
                        help="skip the runc container at the end")
    parser.add_argument("--no-prometheus", action="store_true",
                        help="no Prometheus, so no right-sizing step")
    parser.add_argument("--history", type=float, default=75.0, metavar="SECONDS",
                        help="history the right-sizing step waits for (0: skip the step)")


def run(args: argparse.Namespace) -> int:
    """Start (or stop) the demo; 1 when a step fails, with the reason."""
    try:
        from demo import run as demo
        from devcluster.cluster import DevClusterError
    except ImportError:
        print(NOT_IN_THE_WHEEL.format(command="egpu demo"), file=sys.stderr)
        return 1

    state_dir = args.state_dir or demo.default_state_dir()
    try:
        if args.down:
            demo.down(state_dir)
            return 0
        options = demo.Options(state_dir=state_dir, wait_s=args.wait,
                               container=not args.no_container,
                               real_node=not args.no_real_node, dra=args.dra,
                               prometheus=not args.no_prometheus, history_s=args.history)
        if args.inputs:
            options.inputs = args.inputs
        return demo.up(options)
    except (demo.DemoError, DevClusterError) as exc:
        print(f"egpu demo: {exc}", file=sys.stderr)
        return 1
