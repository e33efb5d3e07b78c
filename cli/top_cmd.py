"""Show, per node and card, the booked and used memory and cores and the shares on it.

Works against any cluster through the kubeconfig (as `kubectl egpu`, too). BOOKED is what the
scheduler extender placed (MiB, % cores); USED and COMPUTE come from the node agents'
egpu.io/usage annotation, "-" where no agent has published it yet.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from egpu.cluster_view import NodeView, cluster_view

COMMAND = "top"
HELP = "show per node and card the booked and used memory and cores, and the shares"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --kubeconfig, --context, --node, --output."""
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: as kubectl)")
    parser.add_argument("--context", default=None)
    parser.add_argument("--node", default=None, help="only this node")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")


def fetch(kubeconfig: str | None, context: str | None) -> tuple[list[Any], list[Any]]:
    """Nodes and pods (all namespaces) as JSON-like dicts, through the API."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    core = client.CoreV1Api(api_client)
    nodes = api_client.sanitize_for_serialization(core.list_node().items)
    pods = api_client.sanitize_for_serialization(core.list_pod_for_all_namespaces().items)
    return nodes, pods


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value}"


def format_views(views: list[NodeView]) -> str:
    """The text table: one line per card, then one indented line per share."""
    lines = [f"{'NODE':<14} {'GPU':>3} {'MODEL':<24} {'MEM MiB':>8} {'BOOKED':>8} {'USED':>8} "
             f"{'CORES':>6} {'COMPUTE':>8} SHARES"]
    for node in views:
        for problem in node.problems:
            lines.append(f"{node.name:<14} problem: {problem}")
        for card in node.cards:
            used = card.compute_used_percent
            compute = "-" if used is None else f"{used:.0f}%"
            # Booked past the card: only shares that opted into memory oversubscription.
            over = " (memory oversubscribed)" if card.booked_mib > card.card.memory_mib else ""
            health = "" if card.card.healthy else " UNHEALTHY"
            lines.append(
                f"{node.name:<14} {card.card.index:>3} {card.card.model[:24]:<24} "
                f"{card.card.memory_mib:>8} {card.booked_mib:>8} {_mib(card.used_mib):>8} "
                f"{card.booked_cores:>5}% {compute:>8} {len(card.shares)}{over}{health}")
            for share in card.shares:
                kind = " (init)" if share.init else ""
                lines.append(f"{'':<14} {'':>3}   {share.namespace}/{share.pod}/{share.container}"
                             f"{kind}: {share.memory_mib} MiB, {share.cores}% cores, "
                             f"priority {share.priority}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON); 2 when the cluster cannot be reached."""
    try:
        nodes, pods = fetch(args.kubeconfig, args.context)
    except Exception as exc:  # the client raises many kinds; all mean "cannot reach"
        print(f"egpu top: cannot read the cluster: {exc}", file=sys.stderr)
        return 2
    views = [v for v in cluster_view(nodes, pods) if args.node in (None, v.name)]
    if args.output == "json":
        print(json.dumps([asdict(v) for v in views], indent=1))
    else:
        print(format_views(views))
    return 0
