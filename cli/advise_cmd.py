"""Recommend share sizes from each workload's usage history, and the cards they would free.

  kubectl egpu advise [-n NAMESPACE] [--since 7d] [--prometheus URL] [-o table|json|yaml|patch]

Per workload (Deployment, StatefulSet, DaemonSet, Job, or bare pod: pods grouped by their
owner, the history of pods an earlier roll deleted included) and container: the booked memory
and cores beside the observed peak and p95/p99 over the window, and the recommended request
(egpu.advise, docs/operating.md "Right-sizing"), or why there is none. Then the cards the
shares take when placed again by egpu's placement code (scheduler/placement, the rules the
scheduler's plugin is held to) over the current nodes,
as booked and as recommended: the cards the advice would free.

Reads the cluster (nodes and pods, one LIST each, through the kubeconfig) and the history
from Prometheus' HTTP API (``--prometheus``: the URL of a Prometheus that scrapes the node
agents, as the chart's PodMonitors set up; else the chart's ``monitoring.prometheusURL``, read
from the ConfigMap egpu-system/egpu-monitoring); without either, from each node agent's
own recent window (its last hour, node_agent/metrics/window.py), read through the API
server's pod proxy (needs ``get`` on ``pods/proxy`` in the agents' namespace).
``-o patch`` prints one `kubectl patch` line per workload whose advice changes its request
(a bare pod's or a Job's resources cannot be changed in place: a comment says so).
Exit status: 0, 1 bad arguments, 2 the cluster or Prometheus cannot be read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import yaml

from egpu.advise import (
    VERDICT_NONE,
    Advice,
    Booked,
    Policy,
    Usage,
    Workload,
    advise,
    owner_of,
    summarize,
    workload_of_pod_name,
)
from egpu.cluster_view import PATH_EXTENDER, cluster_view
from egpu.config import Config
from egpu.contract import NAMESPACE
from egpu.usage_history import (
    AGENT_WINDOW_S,
    ContainerHistory,
    HistoryError,
    add_agent_window,
    fetch,
    http_getter,
)

COMMAND = "advise"
MIN_HISTORY = "1d"
MIN_HISTORY_AGENTS = "30m"  # the agents keep an hour (node_agent/metrics/window.py)
PATCHABLE = ("Deployment", "StatefulSet", "DaemonSet")  # a pod template that may change
AGENT_SELECTOR = "app.kubernetes.io/name in (egpu-node-agent,egpu-node-agent-dra)"
AGENT_PORT = 9400  # the agents' metrics port when their pod names none
TIMEOUT_S = 30.0
HELP = "recommend share sizes from usage history, and the cards they would free"
DURATION = re.compile(r"^([0-9]+)([smhdw])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


MAX_DURATION_S = 3650 * 86400  # ten years: longer asks no Prometheus anything sensible


def duration_s(text: str, flag: str) -> float:
    """``7d``, ``12h``, ``30m`` -> seconds. Raises ValueError naming the flag and what is
    allowed."""
    found = DURATION.match(text)
    seconds = int(found.group(1)) * SECONDS[found.group(2)] if found else 0
    if not 0 < seconds <= MAX_DURATION_S:
        raise ValueError(f"{flag}: {text[:40]!r} is not a duration; allowed: a positive number "
                         "and one of s, m, h, d, w (e.g. 7d, 12h, 30m), at most 3650d")
    return seconds


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the flags of the module docstring."""
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: as kubectl)")
    parser.add_argument("--context", default=None)
    parser.add_argument("-n", "--namespace", default=None, help="only this namespace")
    parser.add_argument("--egpu-namespace", default=NAMESPACE, metavar="NAMESPACE",
                        help=f"where egpu is installed: its ConfigMaps (default {NAMESPACE}, "
                        "the chart's namespace.name)")
    parser.add_argument("--since", default="7d", help="history window (default 7d)")
    parser.add_argument("--prometheus", default=None, metavar="URL",
                        help="Prometheus that scrapes the node agents (http://host:9090)")
    parser.add_argument("--min-history", default=None,
                        help="least history to advise on (default 1d with --prometheus, 30m "
                             "from the node agents' last hour)")
    parser.add_argument("--min-samples", type=int, default=Policy.min_samples,
                        help=f"least samples to advise on (default {Policy.min_samples})")
    parser.add_argument("--memory-margin", type=float, default=Policy.memory_margin,
                        help="above the peak, as a fraction (default 0.15)")
    parser.add_argument("--with-history", action="store_true",
                        help="only the workloads that have history")
    parser.add_argument("-o", "--output", choices=("table", "json", "yaml", "patch"),
                        default="table")


@dataclass
class Row:
    """One workload's container: what it books, what it used, the advice."""

    workload: Workload
    container: str
    pods: int
    booked: Booked
    usage: Usage | None
    advice: Advice
    gpus: int = 1
    init: bool = False  # declared among the init containers (sidecars too)


@dataclass
class Report:
    """The rows, and the cards the shares take placed again: as booked, as advised."""

    rows: list[Row]
    cards_now: int
    cards_advised: int
    unplaced_now: int
    unplaced_advised: int
    nodes: int
    window_s: float

    @property
    def cards_freed(self) -> int:
        """Cards the advice frees (negative: it needs more)."""
        return self.cards_now - self.cards_advised


@dataclass
class _Held:
    """What one container of a pod holds now (extender path): MiB and cores per card, its
    pod's priority and compute policy, how many cards, the smallest card's MiB, and whether
    it is declared among the init containers (sidecars too)."""

    memory_mib: int
    cores: int
    priority: str
    compute_policy: str
    init: bool
    card_mib: int
    cards: int = 0


def _share_pods(nodes: list[Any], pods: list[Any], config: Config
                ) -> dict[tuple[str, str], dict[str, _Held]]:
    """(namespace, pod) -> container -> what it holds, for every pod with an extender-path
    share now (cluster_view: the allocation records)."""
    out: dict[tuple[str, str], dict[str, _Held]] = {}
    for view in cluster_view(nodes, pods, config):
        for card in view.cards:
            for share in card.shares:
                if share.path != PATH_EXTENDER or not share.pod:
                    continue
                held = out.setdefault((share.namespace, share.pod), {}).setdefault(
                    share.container, _Held(share.memory_mib, share.cores, str(share.priority),
                                           str(share.compute_policy or "strict"), share.init,
                                           card.card.memory_mib))
                held.cards += 1
                held.card_mib = min(held.card_mib, card.card.memory_mib)
    return out


def _pod_key(pod: Any) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")  # as cluster_view


def build_report(nodes: list[Any], pods: list[Any], history: dict[Any, ContainerHistory],
                 policy: Policy, namespace: str | None, window_s: float,
                 config: Config | None = None, now: float | None = None) -> Report:
    """The report of the module docstring from API objects and the history (pure). A live
    pod's history joins its owner (its controller reference); a pod no longer running joins
    the live workload whose controller would have named it so (egpu.advise)."""
    from scheduler.placement import Limits
    from scheduler.placement.repack import repack
    from scheduler.state import ClusterState

    config = config or Config()
    now = time.time() if now is None else now
    shares = _share_pods(nodes, pods, config)
    by_name = {_pod_key(p): p for p in pods}
    owners = {key: owner_of(pod) for key, pod in by_name.items()}
    workloads: dict[tuple[Workload, str], list[_Held]] = {}
    for key, containers in shares.items():
        for container, held in containers.items():
            workloads.setdefault((owners[key], container), []).append(held)
    live = {w for w, _ in workloads}
    pooled: dict[tuple[Workload, str], list[ContainerHistory]] = {}
    for (ns, pod, container), series in history.items():
        matched = owners.get((ns, pod)) or workload_of_pod_name(ns, pod, live)
        if matched is not None:
            pooled.setdefault((matched, container), []).append(series)

    rows = []
    for (owner, container), members in sorted(workloads.items()):
        if namespace and owner.namespace != namespace:
            continue
        largest = max(members, key=lambda h: (h.memory_mib, h.cores))
        cores = largest.cores
        booked = Booked(largest.memory_mib, cores, largest.priority, largest.compute_policy,
                        min(h.card_mib for h in members))
        found = pooled.get((owner, container), [])
        caps = {t: v for h in found for samples in h.cores.values() for t, v in samples}
        usage = summarize(
            [s for h in found for samples in h.memory.values() for s in samples],
            peaks_mib=[v for h in found for samples in h.peak.values() for _, v in samples],
            compute=[s for h in found for samples in h.compute.values() for s in samples],
            cores=cores,
            refused=[[v for _, v in samples] for h in found for samples in h.refused.values()],
            policy=policy, caps=caps) if found else None
        advice = (advise(usage, booked, policy) if usage is not None else
                  Advice(None, None, VERDICT_NONE, "no history"))
        rows.append(Row(owner, container, len(members), booked, usage, advice, largest.cards,
                        largest.init))

    # the cards, placed again: every share pod as booked, then with the advice taken
    state = ClusterState(config)
    state.replace_nodes(nodes)
    node_states = [s for s in (state.node(n) for n in state.node_names) if s is not None]
    advised = {(r.workload, r.container): r.advice for r in rows
               if r.advice.memory_mib is not None}
    demands_now, demands_advised = [], []
    for key in shares:
        demand = _demand(by_name[key], config)
        if demand is None:
            continue
        owner = owners[key]
        demands_now.append(demand)
        demands_advised.append(_resized(demand, {
            c: a for (w, c), a in advised.items() if w == owner}))
    limits = Limits.from_config(config)
    before = repack(node_states, demands_now, limits, now)
    after = repack(node_states, demands_advised, limits, now)
    return Report(rows, before.cards, after.cards, before.unplaced, after.unplaced,
                  len(node_states), window_s)


def _demand(pod: Any, config: Config) -> Any:
    """The pod's PodDemand as the scheduler reads it (its kinds, filters, policies and
    oversubscription), or None for a pod it cannot read."""
    from egpu.requests import read_pod
    from scheduler.placement import PodDemand

    request = read_pod(pod, config).request
    return None if request is None else PodDemand.from_request(request)


def _resized(demand: Any, advice: dict[str, Advice]) -> Any:
    """``demand`` with each container's share resized by ``advice`` (container -> Advice)."""
    containers = []
    for c in demand.containers:
        found = advice.get(c.name)
        if found is not None and found.memory_mib is not None:
            cores = found.cores if found.cores is not None else c.share.cores
            c = replace(c, share=replace(c.share, memory_mib=found.memory_mib,
                                         memory_percentage=None, cores=cores))
        containers.append(c)
    return replace(demand, containers=tuple(containers))


# --- output ------------------------------------------------------------------------------


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.0f}{unit}"


def format_table(report: Report) -> str:
    """The text table and the cards line."""
    header = ("WORKLOAD", "CONTAINER", "PODS", "MEM MiB", "PEAK", "P95", "P99", "ADVISED",
              "CORES", "USE P95", "ADVISED", "VERDICT", "WHY")
    rows = [header]
    for r in report.rows:
        u = r.usage
        rows.append((r.workload.label, r.container, str(r.pods), str(r.booked.memory_mib),
                     _num(u.peak_mib if u else None), _num(u.p95_mib if u else None),
                     _num(u.p99_mib if u else None), _num(r.advice.memory_mib),
                     f"{r.booked.cores}%", _num(u.compute_p95 if u else None, "%"),
                     _num(r.advice.cores, "%"), r.advice.verdict, r.advice.why))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)),
                        row[-1]]).rstrip() for row in rows]
    freed = report.cards_freed
    verb = f"frees {freed}" if freed >= 0 else f"needs {-freed} more"
    lines.append("")
    lines.append(f"Cards the shares take, placed again by egpu's placement on the "
                 f"{report.nodes} current nodes: {report.cards_now} as booked, "
                 f"{report.cards_advised} as advised: the advice {verb} "
                 f"card{'s' if abs(freed) != 1 else ''}.")
    if report.unplaced_advised > report.unplaced_now:
        lines.append(f"Careful: as advised, {report.unplaced_advised - report.unplaced_now} "
                     "more pods fit no card (a raise past what the nodes hold).")
    if report.unplaced_now or report.unplaced_advised:
        lines.append(f"(pods that fit nowhere when placed again: {report.unplaced_now} as "
                     f"booked, {report.unplaced_advised} as advised)")
    return "\n".join(lines)


def as_data(report: Report) -> dict[str, Any]:
    """The report as plain data (-o json|yaml)."""
    return {
        "windowSeconds": report.window_s,
        "cards": {"asBooked": report.cards_now, "asAdvised": report.cards_advised,
                  "freed": report.cards_freed, "nodes": report.nodes,
                  "unplacedAsBooked": report.unplaced_now,
                  "unplacedAsAdvised": report.unplaced_advised},
        "workloads": [{
            "namespace": r.workload.namespace, "kind": r.workload.kind,
            "name": r.workload.name, "container": r.container, "pods": r.pods,
            "booked": {"memoryMiB": r.booked.memory_mib, "cores": r.booked.cores,
                       "priority": r.booked.priority,
                       "computePolicy": r.booked.compute_policy},
            "usage": asdict(r.usage) if r.usage else None,
            "advice": {"memoryMiB": r.advice.memory_mib, "cores": r.advice.cores,
                       "verdict": r.advice.verdict, "why": r.advice.why},
        } for r in report.rows],
    }


def patch_lines(report: Report, aliases: Iterable[str]) -> list[str]:
    """One `kubectl patch` per workload whose advice changes a request: a strategic merge
    patch of the pod template's containers by name, setting egpu.io/gpu-memory and
    egpu.io/gpu-cores in limits (and requests, which must equal them) and removing the
    names that would clash (gpu-memory-percentage, the configured aliases)."""
    clash = sorted({"egpu.io/gpu-memory-percentage", *aliases})
    changes: dict[Workload, list[Row]] = {}
    for r in report.rows:
        a = r.advice
        if a.memory_mib is None or (a.memory_mib, a.cores) == (r.booked.memory_mib,
                                                             r.booked.cores):
            continue
        changes.setdefault(r.workload, []).append(r)
    lines = []
    for workload, rows in sorted(changes.items()):
        if workload.kind not in PATCHABLE:
            lines.append(f"# {workload.label}: no pod template kubectl patch can change; "
                         f"set these in its manifest: " + ", ".join(
                             f"{r.container}: {r.advice.memory_mib} MiB, {r.advice.cores}%"
                             for r in rows))
            continue
        by_key: dict[str, list[dict[str, Any]]] = {"containers": [], "initContainers": []}
        for r in rows:
            values: dict[str, Any] = {name: None for name in clash}
            values["egpu.io/gpu"] = str(r.gpus)
            values["egpu.io/gpu-memory"] = str(r.advice.memory_mib)
            if r.advice.cores:
                values["egpu.io/gpu-cores"] = str(r.advice.cores)
            by_key["initContainers" if r.init else "containers"].append(
                {"name": r.container, "resources": {"limits": values, "requests": values}})
        spec = {k: v for k, v in by_key.items() if v}
        body = json.dumps({"spec": {"template": {"spec": spec}}}, separators=(",", ":"))
        lines.append(f"kubectl -n {workload.namespace} patch {workload.kind.lower()}/"
                     f"{workload.name} --type=strategic -p '{body}'")
    return lines


def configured_prometheus(kubeconfig: str | None, context: str | None,
                          egpu_namespace: str = NAMESPACE) -> str | None:
    """The chart's monitoring.prometheusURL (ConfigMap egpu-system/egpu-monitoring), said on
    stderr, or None when there is none or it cannot be read."""
    from kubernetes import client, config

    from egpu.contract import MONITORING_CONFIG_MAP, MONITORING_PROMETHEUS_URL_KEY

    try:
        core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig,
                                                              context=context))
        found = core.read_namespaced_config_map(MONITORING_CONFIG_MAP, egpu_namespace,
                                                _request_timeout=TIMEOUT_S)
    except Exception:  # absent (the value unset), not allowed: the agents' windows then
        return None
    url = str((found.data or {}).get(MONITORING_PROMETHEUS_URL_KEY) or "")
    if url:
        print(f"egpu advise: Prometheus {url} (from {egpu_namespace}/{MONITORING_CONFIG_MAP}, the "
              "chart's monitoring.prometheusURL)", file=sys.stderr)
    return url or None


def cluster_config(kubeconfig: str | None, context: str | None,
                   egpu_namespace: str = NAMESPACE) -> Config:
    """The cluster's egpu config (ConfigMap egpu-system/egpu-config's config.yaml: slots per
    card, ratios, aliases for the repack and the patches), or the defaults, said on stderr,
    when it cannot be read or is invalid."""
    from kubernetes import client, config

    from egpu.config import load_config
    from egpu.contract import CONFIG_MAP_NAME

    try:
        core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig,
                                                              context=context))
        found = core.read_namespaced_config_map(CONFIG_MAP_NAME, egpu_namespace,
                                                _request_timeout=TIMEOUT_S)
        return load_config((found.data or {}).get("config.yaml"))
    except Exception as exc:  # absent, not allowed, another namespace, bad (ConfigError)
        print(f"egpu advise: the config defaults are used (cannot read {egpu_namespace}/"
              f"{CONFIG_MAP_NAME}: {str(exc).splitlines()[0]})", file=sys.stderr)
        return Config()


def fetch_agent_windows(kubeconfig: str | None, context: str | None,
                        namespace: str | None) -> dict[Any, ContainerHistory]:
    """Every running node agent's /usage-history through the API server's pod proxy (one LIST
    of the agents, one GET each). An agent that cannot be read is named on stderr and left
    out. Raises HistoryError when no agent could be read."""
    from kubernetes import client, config

    print("egpu advise: no --prometheus: reading the node agents' own window (their last "
          "hour; advice from 30 minutes of it); pass a Prometheus for more", file=sys.stderr)
    api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    core = client.CoreV1Api(api_client)
    try:
        listing: Any = core.list_pod_for_all_namespaces(  # raw: _preload_content=False
            label_selector=AGENT_SELECTOR, _preload_content=False, _request_timeout=TIMEOUT_S)
        agents = json.loads(listing.data).get("items") or []
    except Exception as exc:  # the client raises many kinds
        raise HistoryError(f"cannot list the node agents ({AGENT_SELECTOR}): {exc}") from None
    out: dict[Any, ContainerHistory] = {}
    read = 0
    for pod in agents:
        meta = pod["metadata"]
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        port = next((p["containerPort"] for c in pod["spec"]["containers"]
                     for p in c.get("ports") or [] if p.get("name") == "metrics"), AGENT_PORT)
        try:
            answer: Any = core.connect_get_namespaced_pod_proxy_with_path(
                f"{meta['name']}:{port}", meta["namespace"], "usage-history",
                _preload_content=False, _request_timeout=TIMEOUT_S)
            add_agent_window(out, json.loads(answer.data), namespace)
            read += 1
        except Exception as exc:  # the client's errors, a bad answer (HistoryError)
            print(f"egpu advise: cannot read {meta['namespace']}/{meta['name']}'s window: "
                  f"{str(exc).splitlines()[0]}", file=sys.stderr)
    if not read:
        raise HistoryError(f"no node agent's window could be read ({len(agents)} agents "
                           "found): pass --prometheus URL")
    return out


def run(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    """Print the report (module docstring) through ``say``; errors and notes go to stderr."""
    try:
        window_s = duration_s(args.since, "--since")
        min_history = args.min_history or MIN_HISTORY
        policy = Policy(min_history_s=duration_s(min_history, "--min-history"),
                        memory_margin=args.memory_margin, min_samples=args.min_samples)
        if args.min_samples < 1:
            raise ValueError(f"--min-samples: {args.min_samples} is not allowed; allowed: 1 "
                             "or more")
        if not 0 <= args.memory_margin <= 10:
            raise ValueError(f"--memory-margin: {args.memory_margin} is not allowed; "
                             "allowed: 0..10 (a fraction of the peak)")
    except ValueError as exc:
        print(f"egpu advise: {exc}", file=sys.stderr)
        return 1
    from cli.top_cmd import fetch as fetch_cluster

    try:
        nodes, pods, _claims, _note, _generation = fetch_cluster(args.kubeconfig, args.context,
                                                                 args.egpu_namespace)
    except Exception as exc:  # the client raises many kinds; all mean "cannot reach"
        print(f"egpu advise: cannot read the cluster: {exc}", file=sys.stderr)
        return 2
    end = time.time()
    prometheus = args.prometheus or configured_prometheus(args.kubeconfig, args.context,
                                                          args.egpu_namespace)
    try:
        if prometheus:
            history = fetch(http_getter(prometheus), end - window_s, end, args.namespace)
        else:
            history = fetch_agent_windows(args.kubeconfig, args.context, args.namespace)
            window_s = min(window_s, AGENT_WINDOW_S)
            if args.min_history is None:
                policy = replace(policy, min_history_s=duration_s(MIN_HISTORY_AGENTS, ""))
    except HistoryError as exc:
        print(f"egpu advise: {exc}", file=sys.stderr)
        return 2
    config = cluster_config(args.kubeconfig, args.context, args.egpu_namespace)
    report = build_report(nodes, pods, history, policy, args.namespace, window_s, config, end)
    if args.with_history:
        report.rows = [r for r in report.rows if r.usage is not None]
    if args.output == "json":
        say(json.dumps(as_data(report), indent=1))
    elif args.output == "yaml":
        say(yaml.safe_dump(as_data(report), sort_keys=False).rstrip("\n"))
    elif args.output == "patch":
        say("\n".join(patch_lines(report, config.resource_aliases)))
    else:
        say(format_table(report))
    return 0
