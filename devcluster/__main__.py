"""``python -m devcluster up|down|status|build`` (the same as ``egpu dev-cluster ...``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devcluster import build as buildmod
from devcluster import prometheus, realnode
from devcluster.cluster import Config, DevClusterError, default_state_dir, down, status, up


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="egpu dev-cluster",
        description="A local Kubernetes control plane with simulated (kwok) GPU nodes.",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="default: ${EGPU_STATE_DIR:-~/.cache/egpu/dev-cluster}",
    )
    sub = p.add_subparsers(dest="command", required=True)
    pu = sub.add_parser("up", help="start the control plane (build binaries if missing)")
    pu.add_argument(
        "--nodes",
        type=Path,
        default=None,
        help="cluster description (e.g. inputs/cluster.yaml) to create nodes from",
    )
    pu.add_argument("--shares-per-card", type=int, default=4,
                    help="shares a card of the nodes offer (egpu.io/gpu and their ResourceSlices)")
    pu.add_argument("--no-device-plugin", action="store_true",
                    help="the nodes offer no egpu.io/gpu: DRA-only nodes, as the node agent "
                         "with --dra --no-device-plugin")
    pu.add_argument("--real-nodes", type=int, default=0, metavar="N",
                    help="also start N real nodes (kubelet + containerd, root; see "
                         "docs/devcluster.md), named egpu-real-0..N-1")
    pu.add_argument("--prometheus", action="store_true",
                    help="also start a Prometheus that scrapes the node agents as the chart's "
                         "PodMonitors do and loads its alert rules (docs/devcluster.md)")
    pu.add_argument("--no-egpu-profile", action="store_true",
                    help="no egpu-scheduler profile in the local kube-scheduler (egpu "
                         "installed in the cluster brings its own)")
    pu.add_argument("--timeout", type=float, default=90.0, help="seconds per process")
    pu.add_argument("--no-build", action="store_true", help="fail instead of building binaries")
    sub.add_parser("down", help="stop the processes this state folder recorded")
    sub.add_parser("status", help="say whether it runs (exit 0 up, 1 otherwise)")
    sub.add_parser("build", help="build the binaries only (python -m devcluster.build)")
    args = p.parse_args(argv)
    if args.command == "up" and args.shares_per_card < 1:
        p.error(f"--shares-per-card {args.shares_per_card}: a whole number >= 1 (DRA-only "
                "nodes: --no-device-plugin)")
    state_dir = args.state_dir or default_state_dir()

    try:
        if args.command == "up":
            info = up(
                Config(
                    state_dir=state_dir,
                    nodes_file=args.nodes,
                    shares_per_card=args.shares_per_card,
                    device_plugin=not args.no_device_plugin,
                    timeout_s=args.timeout,
                    build_missing=not args.no_build,
                    egpu_profile=not args.no_egpu_profile,
                )
            )
            if args.real_nodes < 0:
                raise DevClusterError(f"--real-nodes: {args.real_nodes} is not allowed "
                                      "(0 or more)")
            for index in range(args.real_nodes):
                node = realnode.add(info, name=f"egpu-real-{index}")
                print(f"real node {node.name} Ready in {node.startup_s}s ({node.ip}, pods "
                      f"{node.pod_cidr}); logs: {node.node_dir}/logs")
            if args.prometheus:
                print(f"prometheus: {prometheus.attach(info)} (targets: "
                      f"{prometheus.home(info.state_dir) / 'targets'})")
            print(f"dev cluster up in {info.startup_s}s: {info.server}")
            print(f"  export KUBECONFIG={info.kubeconfig}")
            print(f"  kubectl: {info.kubectl}")
            print(f"  logs:    {Path(info.state_dir) / 'logs'}")
            return 0
        if args.command == "down":
            real = realnode.remove_all(state_dir)
            stopped = real + down(state_dir)
            print(
                f"dev cluster down: stopped {', '.join(stopped)}"
                if stopped
                else f"dev cluster: nothing running in {state_dir}"
            )
            return 0
        if args.command == "status":
            st = status(state_dir)
            print(st.describe())
            return 0 if st.up else 1
        if args.command == "build":
            buildmod.build()
            return 0
    except DevClusterError as exc:
        print(f"egpu dev-cluster {args.command}: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
