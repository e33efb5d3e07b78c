"""Show, per node and card, the booked and used memory and cores and the shares on it.

Works against any cluster through the kubeconfig (as `kubectl egpu`, too). BOOKED (MiB) and
CORES (%) count both allocation paths: what the egpu scheduler placed (the pods'
egpu.io/allocation) and what the kube-scheduler allocated to ResourceClaims of the DRA driver
gpu.egpu.io (their consumed capacity; SHARES says the DRA part). Each share line names the
pod and container, MiB, cores, priority and compute policy, and for a DRA share its claim.
USED and COMPUTE come from the node agents' egpu.io/usage annotation, "-" where no agent has
published it yet. Under each node, the config its agent runs (annotation egpu.io/config:
generation and source), and whether it is the ConfigMap's (egpu-system/egpu-config, read
when allowed): "not applied yet" while a roll is under way, "last-good" when the ConfigMap is
bad and the agent kept its last good config (docs/operating.md, "Changing the config").

API reads, one LIST each per call: nodes, pods (all namespaces) and resourceclaims
(resource.k8s.io/v1, all namespaces). Without the right to list resourceclaims, or on a
cluster without resource.k8s.io/v1, it says so on stderr and shows the scheduler's shares.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

from egpu.cluster_view import PATH_DRA, NodeView, ShareView, cluster_view
from egpu.config import config_generation
from egpu.contract import CONFIG_MAP_NAME, NAMESPACE

COMMAND = "top"
HELP = "show per node and card the booked and used memory and cores, and the shares"
CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")  # group, version, plural
TIMEOUT_S = 30.0  # per request


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register --kubeconfig, --context, --node, --output."""
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: as kubectl)")
    parser.add_argument("--context", default=None)
    parser.add_argument("--node", default=None, help="only this node")
    parser.add_argument("--egpu-namespace", default=NAMESPACE, metavar="NAMESPACE",
                        help=f"where egpu is installed: its ConfigMap egpu-config (default "
                        f"{NAMESPACE}, the chart's namespace.name)")
    parser.add_argument("--output", "-o", choices=("text", "json"), default="text")


def _items(answer: Any) -> list[Any]:
    """The ``items`` of a raw LIST answer (``_preload_content=False``: plain JSON, so that no
    field newer than the client is dropped, e.g. a claim's ``consumedCapacity``)."""
    return list(json.loads(answer.data).get("items") or [])


def fetch_claims(api_client: Any) -> tuple[list[Any], str | None]:
    """Every ResourceClaim (one LIST, all namespaces) as JSON dicts, and None; or no claims
    and why (403: not allowed to list them; 404: the cluster serves no resource.k8s.io/v1).
    Raises the client's other errors."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        answer = client.CustomObjectsApi(api_client).list_cluster_custom_object(
            *CLAIMS, _preload_content=False, _request_timeout=TIMEOUT_S)
    except ApiException as exc:
        if exc.status in (403, 404):
            why = "not allowed" if exc.status == 403 else "not served by this cluster"
            return [], (f"cannot list resourceclaims ({'/'.join(CLAIMS[:2])}): {why} "
                        f"({exc.status}); DRA shares and their bookings are not shown")
        raise
    return _items(answer), None


def fetch_config_generation(core: Any, egpu_namespace: str = NAMESPACE) -> str | None:
    """The generation of the ConfigMap egpu-system/egpu-config's config.yaml (one GET), or
    None when it cannot be read (absent, not allowed, another install namespace)."""
    from kubernetes.client.exceptions import ApiException

    try:
        cm = core.read_namespaced_config_map(CONFIG_MAP_NAME, egpu_namespace,
                                             _request_timeout=TIMEOUT_S)
    except ApiException:
        return None
    text = (cm.data or {}).get("config.yaml")
    return None if text is None else config_generation(text)


def fetch(kubeconfig: str | None, context: str | None, egpu_namespace: str = NAMESPACE
          ) -> tuple[list[Any], list[Any], list[Any], str | None, str | None]:
    """Nodes, pods (all namespaces) and ResourceClaims (``fetch_claims``) as JSON dicts, why
    the claims are missing (None when they are not), and the ConfigMap's config generation
    (``fetch_config_generation``), through the API: one LIST or GET each. Raises the client's
    errors (cannot reach, not allowed to list nodes or pods)."""
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    core = client.CoreV1Api(api_client)
    nodes = _items(core.list_node(_preload_content=False, _request_timeout=TIMEOUT_S))
    pods = _items(core.list_pod_for_all_namespaces(_preload_content=False,
                                                   _request_timeout=TIMEOUT_S))
    claims, note = fetch_claims(api_client)
    return nodes, pods, claims, note, fetch_config_generation(core, egpu_namespace)


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value}"


def format_share(share: ShareView) -> str:
    """One share's line (without its indent): ``ns/pod/container (init): MiB, % cores,
    priority P, policy``, and for a DRA share its claim (``ns/claim C (no pod)`` for a claim
    that no active pod uses)."""
    if share.path == PATH_DRA and not share.pod:
        who = f"{share.namespace}/claim {share.claim} (no pod)"
    else:
        kind = " (init)" if share.init else ""
        who = f"{share.namespace}/{share.pod}/{share.container}{kind}"
    policy = f", {share.compute_policy}" if share.compute_policy else ""
    line = (f"{who}: {share.memory_mib} MiB, {share.cores}% cores, "
            f"priority {share.priority}{policy}")
    if share.path == PATH_DRA and share.pod:
        line += f", DRA claim {share.claim}"
    return line


def format_config(config: str, wanted: str | None) -> str:
    """A node's config line (without the node's name): ``config <generation> (<source>)``,
    and against the ConfigMap's generation ``wanted`` (None: unknown) whether it is applied."""
    generation, _, source = config.partition(" ")
    line = f"config {generation} ({source or 'file'})"
    if wanted is not None and generation != wanted:
        line += (f", ConfigMap {wanted}: the ConfigMap is bad, last good kept" if source ==
                 "last-good" else f", ConfigMap {wanted}: not applied yet")
    return line


def format_views(views: list[NodeView], config_generation: str | None = None) -> str:
    """The text table: one line per card, then one indented line per share, then the node's
    config line (``format_config``) where its agent said which config it runs."""
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
            wall = " (driver memory limit)" if card.card.driver_memory_limit else ""
            dra = (f" (DRA {card.dra_booked_mib} MiB, {card.dra_booked_cores}%)"
                   if any(s.path == PATH_DRA for s in card.shares) else "")
            lines.append(
                f"{node.name:<14} {card.card.index:>3} {card.card.model[:24]:<24} "
                f"{card.card.memory_mib:>8} {card.booked_mib:>8} {_mib(card.used_mib):>8} "
                f"{card.booked_cores:>5}% {compute:>8} {len(card.shares)}{dra}{over}{wall}{health}")
            for share in card.shares:
                lines.append(f"{'':<14} {'':>3}   {format_share(share)}")
        if node.config:
            lines.append(f"{node.name:<14} {format_config(node.config, config_generation)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the table (or JSON); 2 when the cluster cannot be reached."""
    try:
        nodes, pods, claims, note, generation = fetch(args.kubeconfig, args.context,
                                                      args.egpu_namespace)
    except Exception as exc:  # the client raises many kinds; all mean "cannot reach"
        print(f"egpu top: cannot read the cluster: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"egpu top: {note}", file=sys.stderr)
    views = [v for v in cluster_view(nodes, pods, claims=claims)
             if args.node in (None, v.name)]
    if args.output == "json":
        print(json.dumps([asdict(v) for v in views], indent=1))
    else:
        print(format_views(views, generation))
    return 0
