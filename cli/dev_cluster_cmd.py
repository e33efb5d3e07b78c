"""A local Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager, kwok) with simulated GPU nodes, built from source and cached.

  egpu dev-cluster up [--nodes ../shared/inputs/cluster.yaml] [--real-nodes N]
  egpu dev-cluster status
  egpu dev-cluster down
  egpu dev-cluster build

Run `egpu dev-cluster -- --help` for every option (docs/devcluster.md).
"""

from __future__ import annotations

import argparse
import sys

from cli import NOT_IN_THE_WHEEL

COMMAND = "dev-cluster"
HELP = "start, inspect or stop a local control plane with simulated GPU nodes"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Everything after ``dev-cluster`` goes to devcluster's own parser."""
    parser.add_argument("arguments", nargs=argparse.REMAINDER, metavar="up|down|status|build ...")


def run(args: argparse.Namespace) -> int:
    """Delegate to ``devcluster.main``."""
    try:
        from devcluster import main
    except ImportError:
        print(NOT_IN_THE_WHEEL.format(command="egpu dev-cluster"), file=sys.stderr)
        return 1

    arguments = [a for a in args.arguments if a != "--"] if args.arguments[:1] == ["--"] \
        else args.arguments
    return main(arguments or ["status"])
