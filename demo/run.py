"""``egpu demo``: every part of egpu on a local cluster, in one command.

``up(options)`` builds nothing itself (``make demo`` builds first) and then:

1. starts the local control plane (devcluster) with the nodes of ``inputs/cluster.yaml``;
2. starts egpu-kube-scheduler (the scheduler egpu installs: kube-scheduler with egpu's plugin,
   serving the egpu-scheduler profile of manifests/scheduler), the webhook (TLS, registered
   with the API server by URL and caBundle) and one node agent per simulated node on the fake
   GPU (each with its node's cards, so the inventory the plugin places on is what NVML
   reports);
3. applies every workload of ``inputs/pods``, waits until each pod is placed or clearly not,
   and prints the placement table and the denials with their messages;
4. runs one real runc container with a 4096 MiB share under the fake driver and prints what
   the container sees;
5. (as root) adds a real node, a real kubelet + containerd (demo/real_node.py), beside the
   simulated fleet, and runs one workload of the inputs there as a real container; the
   placement table says which rows are real.

With ``Options.dra`` (``egpu demo --dra``) the same inputs go the DRA way (docs/dra.md): the
config says ``allocationMode: dra``, the DeviceClasses of ``manifests/dra`` are applied, the
simulated nodes offer no ``egpu.io/gpu`` and their agents run ``--dra --no-device-plugin`` (the
fleet's ResourceSlices: ``devcluster.dra``, published when the nodes are created, and kept by
the agents with the same ``egpu.dra.slices.sync``), the webhook (``--kubeconfig``) turns each
input's ``egpu.io/*`` requests into a ResourceClaim, and the default kube-scheduler
allocates the claims (no egpu-kube-scheduler: every node serves DRA only, so its plugin would
refuse every share). The real node's agent serves the DRA kubelet plugin
instead of the device plugin; the placement table reads each pod's cards and shares from its
ResourceClaim's allocation (``egpu.cluster_view`` with the claims: the decoder of
``kubectl egpu`` and of the kubelet plugin, ``egpu/dra/allocation.py``).

The processes keep running after ``up`` returns; ``down(state_dir)`` stops them. State,
logs and the kubeconfig live in ``~/.cache/egpu/demo`` (``$EGPU_DEMO_DIR``, else
``$EGPU_STATE_DIR/demo``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster import cluster as devcluster
from devcluster import nodes as devnodes
from devcluster import prometheus, supervisor
from devcluster.errors import DevClusterError
from devcluster.fake_toolkit import make_device_nodes
from devcluster.net import free_port, http_ok, ssl_context
from devcluster.supervisor import STOP_GRACE_S, ProcessInfo
from devcluster.waiting import wait_until
from egpu.cluster_view import cluster_view
from egpu.config import Config, load_config_file

REPO = Path(__file__).resolve().parent.parent
INPUTS = Path(__file__).resolve().parent / "inputs"
FAKEGPU = REPO / "fakegpu" / "build"
BIN = Path(sys.executable).parent
ALLOCATION_POLICY = REPO / "manifests" / "webhook" / "allocation-policy.yaml"
DEVICE_CLASSES = REPO / "manifests" / "dra" / "deviceclasses.yaml"
DEMO_CONFIG = """\
# egpu's configuration for the demo (docs/design.md, Configuration).
schedulerName: egpu-scheduler
sharesPerCard: 10
memoryOversubscriptionRatio: 1.5
heartbeatTimeoutSeconds: 120
"""
# `egpu demo --dra`: the webhook turns shares into ResourceClaims (docs/dra.md).
DRA_CONFIG = DEMO_CONFIG + "allocationMode: dra\n"
AGENT_MONITOR = "egpu-node-agent"  # the PodMonitor of the node agents (manifests/monitoring)
PLACEMENT_TITLE = "Placement (egpu shares, card by card):"
DRA_PLACEMENT_TITLE = ("Placement (egpu shares, card by card, read from each pod's "
                       "ResourceClaim allocation):")


def default_state_dir() -> Path:
    """``$EGPU_DEMO_DIR``, else ``$EGPU_STATE_DIR/demo`` (the dev cluster's private state
    folder), else ``~/.cache/egpu/demo``."""
    env = os.environ.get("EGPU_DEMO_DIR")
    if env:
        return Path(env).expanduser()
    shared = os.environ.get("EGPU_STATE_DIR")
    return (Path(shared).expanduser() / "demo" if shared
            else Path.home() / ".cache" / "egpu" / "demo")


@dataclass
class Options:
    """What ``up`` runs: the inputs folder (cluster.yaml, pods/), where state goes, how
    long to wait for pods (s), and ``dra``: shares as ResourceClaims (module docstring)."""

    inputs: Path = INPUTS
    state_dir: Path = field(default_factory=default_state_dir)
    wait_s: float = 90.0
    container: bool = True
    real_node: bool = True
    dra: bool = False
    prometheus: bool = True
    # right-sizing (issue 26): how long the real node's workloads run before the advice
    history_s: float = 75.0
    say: Callable[[str], None] = print


class DemoError(RuntimeError):
    """A step of the demo failed; the message names the step and where its log is."""


# --- processes ---------------------------------------------------------------------------


def _start(state_dir: Path, name: str, argv: list[str], env: dict[str, str] | None = None
           ) -> ProcessInfo:
    """Start a detached process (devcluster.supervisor: its own session, so it outlives
    ``egpu demo``; its log in ``logs/<name>.log``) and record it in processes.json."""
    proc = supervisor.start(name, argv, state_dir / "logs" / f"{name}.log", cwd=REPO,
                            env={**os.environ, **(env or {})})
    # Recorded at once, so that `down` stops it even when a later step fails.
    recorded = state_dir / "processes.json"
    known = json.loads(recorded.read_text()) if recorded.exists() else []
    recorded.write_text(json.dumps([*known, asdict(proc)], indent=1))
    return proc


def _wait(what: str, probe: Callable[[], bool], timeout_s: float, proc: ProcessInfo | None
          ) -> None:
    """Until ``probe()``; DemoError after ``timeout_s``, or (``proc``) naming the process and
    quoting its log when it exits first."""
    try:
        if proc is None:
            wait_until(what, probe, timeout_s, interval=0.3)
        else:
            supervisor.wait_ready(proc, probe, what, timeout_s, interval_s=0.3, lines=15)
    except DevClusterError as exc:
        raise DemoError(str(exc)) from None


def _start_egpu_scheduler(state: Path, info: devcluster.ClusterInfo, config: Config,
                          config_file: Path, say: Callable[[str], None]) -> None:
    """egpu-kube-scheduler (kube-scheduler with egpu's plugin, the scheduler egpu installs:
    manifests/scheduler) serving ``config.scheduler_name`` with the installed profile, reading
    the demo's ``config_file`` (``config`` as read), beside the dev cluster's kube-scheduler."""
    from devcluster import build
    from devcluster.plugin_scheduler import healthy, healthz_url, plugin_scheduler_command

    binary = build.plugin_scheduler()  # `make demo` built it (`make k8s`); this finds it
    port = free_port()
    scheduler_config = state / "egpu-kube-scheduler-config.json"
    scheduler_config.write_text(devcluster.plugin_scheduler_config(
        info.kubeconfig, config.scheduler_name, config_file))
    say(f"==> starting egpu-kube-scheduler (profile {config.scheduler_name}, "
        f"https://127.0.0.1:{port})")
    proc = _start(state, "egpu-kube-scheduler",
                  plugin_scheduler_command(binary, scheduler_config, info.kubeconfig, port),
                  env=devcluster.scheduler_env())
    _wait(f"GET {healthz_url(port)}", lambda: healthy(port), 60, proc)


def _stop_command(state: Path) -> str:
    """The command that stops this demo (naming its state folder unless it is the default)."""
    default = Path.home() / ".cache" / "egpu" / "demo"
    if state.resolve() == default.resolve():
        return f"{BIN}/egpu demo --down"
    return f"EGPU_DEMO_DIR={state} {BIN}/egpu demo --down"


def down(state_dir: Path | None = None, say: Callable[[str], None] = print) -> None:
    """Stop the demo's processes and its control plane (only what this state folder recorded)."""
    state_dir = state_dir or default_state_dir()
    recorded = state_dir / "processes.json"
    recorded_any = recorded.exists()
    if recorded_any:
        for proc in (ProcessInfo(**entry) for entry in json.loads(recorded.read_text())):
            # only while the pid still runs the recorded program; its session with it
            if supervisor.stop(proc.pid, STOP_GRACE_S, supervisor.program_of(proc.argv),
                               group=True):
                say(f"stopped {proc.name} (pid {proc.pid})")
        recorded.unlink()
    from devcluster import realnode

    stopped = realnode.remove_all(state_dir / "cluster") + devcluster.down(state_dir / "cluster")
    if stopped:
        say(f"stopped the control plane: {', '.join(stopped)}")
    elif not recorded_any:
        say(f"no demo is running from {state_dir}")


# --- the steps ---------------------------------------------------------------------------


KUBECTL_TIMEOUT_S = 60.0  # a kubectl call's own --timeout, when it has one, must be shorter


def _kubectl(info: devcluster.ClusterInfo, *args: str, stdin: str | None = None,
             timeout_s: float = KUBECTL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(info.kubectl_argv(*args), input=stdin, capture_output=True, text=True,
                          timeout=timeout_s)


def _fake_gpu_config(path: Path, spec: dict[str, Any]) -> None:
    """The fake NVML/CUDA ini file with the node's cards (the same UUIDs as its inventory)."""
    sections = []
    for card in devnodes.inventory(spec).cards:
        sections.append(f"[card]\nuuid = {card.uuid}\nname = {card.model}\n"
                        f"memory_mib = {card.memory_mib}\nnuma_node = {card.numa_node}\n")
    path.write_text("\n".join(sections))


def _start_node_agents(options: Options, info: devcluster.ClusterInfo, config_file: Path,
                       specs: list[dict[str, Any]]) -> list[ProcessInfo]:
    started = []
    for spec in specs:
        name = spec["name"]
        home = options.state_dir / "nodes" / name
        for sub in ("device-plugins", "run", "private", "fakegpu"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        _fake_gpu_config(home / "fakegpu.ini", spec)
        make_device_nodes(home / "dev", len(devnodes.inventory(spec).cards))
        metrics_port = free_port()
        argv = [str(BIN / "egpu-node-agent"), "--node-name", name, "--kubeconfig", info.kubeconfig,
                "--dev-root", str(home / "dev"),
                "--config", str(config_file), "--nvml-library", str(FAKEGPU / "libnvidia-ml.so.1"),
                "--plugin-dir", str(home / "device-plugins"), "--runtime-dir", str(home / "run"),
                "--private-dir", str(home / "private"),
                "--metrics-port", str(metrics_port), "--heartbeat-seconds", "10",
                "--cdi-spec-dir", ""]  # kwok nodes run no containers: no spec in the host's CDI
        if options.dra:
            # DRA only (manifests/dra): the ResourceSlices, no device plugin, the node says
            # egpu.io/allocation-mode: dra. No CDI: no kubelet plugin (no kubelet on kwok).
            argv += ["--dra", "--no-device-plugin"]
        env = {"FAKEGPU_CONFIG": str(home / "fakegpu.ini"),
               "FAKEGPU_STATE_DIR": str(home / "fakegpu")}
        started.append(_start(options.state_dir, f"node-agent-{name}", argv, env))
        # what the DaemonSet's pod on that node would be, for the PodMonitor's job
        prometheus.add_target(info.state_dir, AGENT_MONITOR, f"egpu-node-agent-{name}",
                              f"127.0.0.1:{metrics_port}", "agent")
    return started


def _start_webhook(options: Options, info: devcluster.ClusterInfo, config_file: Path
                   ) -> ProcessInfo:
    from certs import issue
    from webhook.registration import configuration_for_url

    ca = issue.create_ca()
    paths = issue.write_bundle(options.state_dir / "certs", ca,
                               issue.create_serving(ca, ["127.0.0.1", "localhost"]))
    port = free_port()
    # DRA mode: the webhook creates each GPU pod's ResourceClaim, sweeps the ones no pod can
    # use, and reads the fleet's card sizes (ResourceSlices) through the API
    api = ["--kubeconfig", info.kubeconfig] if options.dra else []
    proc = _start(options.state_dir, "webhook", [
        str(BIN / "egpu-webhook"), "--cert", str(paths[issue.CERT_FILE]),
        "--key", str(paths[issue.KEY_FILE]), "--host", "127.0.0.1", "--port", str(port),
        "--config", str(config_file), *api])
    base = f"https://127.0.0.1:{port}"
    context = ssl_context(paths[issue.CA_FILE])
    _wait(f"GET {base}/healthz", lambda: http_ok(f"{base}/healthz", context), 30, proc)
    registration = configuration_for_url(f"{base}/mutate", ca.cert_pem, name="egpu-webhook")
    result = _kubectl(info, "apply", "-f", "-", stdin=json.dumps(registration))
    if result.returncode != 0:
        raise DemoError(f"registering the webhook: {result.stderr.strip()}")
    # as the install does: egpu.io/allocation and the priority label are written once
    result = _kubectl(info, "apply", "-f", str(ALLOCATION_POLICY))
    if result.returncode != 0:
        raise DemoError(f"installing {ALLOCATION_POLICY.name}: {result.stderr.strip()}")
    return proc


def _apply_workloads(options: Options, info: devcluster.ClusterInfo) -> list[tuple[str, str]]:
    """kubectl apply every file of inputs/pods; returns (file, denial message) pairs."""
    files = sorted((options.inputs / "pods").glob("*.yaml"))
    namespaces = sorted({str((d.get("metadata") or {}).get("namespace", "default"))
                         for f in files for d in yaml.safe_load_all(f.read_text()) if d})
    for namespace in namespaces:
        _kubectl(info, "create", "namespace", namespace)
    _wait("default service accounts", lambda: all(
        _kubectl(info, "get", "serviceaccount", "default", "-n", ns).returncode == 0
        for ns in namespaces), 60, None)
    denials = []
    for path in files:
        for document in yaml.safe_load_all(path.read_text()):
            if not document:
                continue
            result = _kubectl(info, "apply", "-f", "-", stdin=json.dumps(document))
            name = f"{document.get('kind')} {document['metadata'].get('name')}"
            if result.returncode != 0:
                # kubectl wraps the API server's answer; keep the webhook's own message.
                message = result.stderr.strip().split("denied the request: ", 1)[-1]
                denials.append((f"{path.name}: {name}", message))
            else:
                options.say(f"  applied {path.name}: {name}")
    return denials


def _pods(info: devcluster.ClusterInfo, namespaces: set[str]) -> list[dict[str, Any]]:
    result = _kubectl(info, "get", "pods", "-A", "-o", "json")
    items = json.loads(result.stdout)["items"] if result.returncode == 0 else []
    return [p for p in items if p["metadata"]["namespace"] in namespaces]


def _claims(info: devcluster.ClusterInfo) -> list[dict[str, Any]]:
    """Every ResourceClaim as JSON (kubectl keeps every field, consumedCapacity included)."""
    result = _kubectl(info, "get", "resourceclaims", "-A", "-o", "json")
    if result.returncode != 0:
        raise DemoError(f"listing the ResourceClaims: {result.stderr.strip()}")
    return list(json.loads(result.stdout)["items"])


def _settled(pod: dict[str, Any]) -> bool:
    """Placed and running, or Pending with the scheduler's reason recorded."""
    if pod["spec"].get("nodeName"):
        return pod.get("status", {}).get("phase") in ("Running", "Succeeded", "Failed")
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)


REAL_NODE_LABEL = "egpu.io/real-node"  # set by devcluster.realnode on kubelet-run nodes


PLACEMENT_HEADER = ("POD", "CONTAINER", "NODE", "CARD", "MODEL", "MiB", "CORES", "PRIORITY",
                    "REAL")


def placement_rows(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], config: Config,
                   claims: list[dict[str, Any]] | None = None) -> list[tuple[str, ...]]:
    """(pod, container, node, card, model, MiB, cores, priority, real) per container and card;
    real: "yes" on a node run by a real kubelet (a real container), "-" on a simulated one.

    With ``claims`` (DRA mode) the shares are read from the ResourceClaims' allocations
    (``cluster_view``, as ``kubectl egpu`` shows them) and each row ends with the claim's name
    ("-" for a share of the device-plugin path); a claim no pod uses shows with pod ``ns/-``."""
    real = {n["metadata"]["name"] for n in nodes
            if (n["metadata"].get("labels") or {}).get(REAL_NODE_LABEL) == "true"}
    rows = []
    for view in cluster_view(nodes, pods, config, claims or ()):
        for card in view.cards:
            for share in card.shares:
                kind = " (init)" if share.init else ""
                row = (f"{share.namespace}/{share.pod or '-'}",
                       f"{share.container or '-'}{kind}", view.name, str(card.card.index),
                       card.card.model, str(share.memory_mib), f"{share.cores}%",
                       share.priority, "yes" if view.name in real else "-")
                rows.append((*row, share.claim or "-") if claims is not None else row)
    return sorted(rows)


def format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """Left-aligned columns, one space apart."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in [header, *rows])


def _report(options: Options, info: devcluster.ClusterInfo, config: Config,
            denials: list[tuple[str, str]], namespaces: set[str]) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = []
    deadline = time.monotonic() + options.wait_s
    while time.monotonic() < deadline:
        pods = _pods(info, namespaces)
        if pods and all(_settled(p) for p in pods):
            break
        time.sleep(1)
    nodes = json.loads(_kubectl(info, "get", "nodes", "-o", "json").stdout)["items"]
    if options.dra:
        rows = placement_rows(nodes, pods, config, _claims(info))
        options.say(f"\n{DRA_PLACEMENT_TITLE}")
        options.say(format_table((*PLACEMENT_HEADER, "CLAIM"), rows))
    else:
        rows = placement_rows(nodes, pods, config)
        options.say(f"\n{PLACEMENT_TITLE}")
        options.say(format_table(PLACEMENT_HEADER, rows))
    # no egpu.io/allocation (the device-plugin path) and no share read from a claim (DRA)
    placed = {row[0] for row in rows}
    others = [p for p in pods if not p["metadata"].get("annotations", {}).get("egpu.io/allocation")
              and f"{p['metadata']['namespace']}/{p['metadata']['name']}" not in placed]
    if others:
        options.say("\nOther pods (no egpu share):")
        other_rows: list[tuple[str, ...]] = []
        for pod in sorted(others, key=lambda p: p["metadata"]["name"]):
            reason = next((c.get("message", "") for c in pod["status"].get("conditions") or []
                           if c.get("type") == "PodScheduled" and c.get("status") == "False"), "")
            other_rows.append((f"{pod['metadata']['namespace']}/{pod['metadata']['name']}",
                               str(pod["spec"].get("schedulerName", "")),
                               str(pod["spec"].get("nodeName") or "-"),
                               str(pod["status"].get("phase", "")),
                               reason.split(" preemption:")[0]))
        options.say(format_table(("POD", "SCHEDULER", "NODE", "PHASE", "WHY"), other_rows))
    options.say("\nDenied at admission:")
    for what, message in denials:
        options.say(f"  {what}\n    {message}")
    return pods


def _container_demo(options: Options) -> None:
    """One runc container with a 4096 MiB share on the fake 24576 MiB card."""
    from demo.sandbox import FAKE_DEFAULT_UUID, INTERPOSER, RuncWorld, missing_prerequisite
    from egpu.records import Allocation, CardShare, ContainerAllocation, PodShares

    reason = missing_prerequisite()
    if reason:
        options.say(f"\n(runc container skipped: {reason})")
        return
    base = options.state_dir / "runc"
    subprocess.run(["rm", "-rf", str(base)], check=False)
    base.mkdir(parents=True)
    world = RuncWorld(base, INTERPOSER)
    uid = "demo0000-0000-0000-0000-000000000001"
    entry = ContainerAllocation("main", False, (CardShare(FAKE_DEFAULT_UUID, 0, 4096, 30),))
    record = PodShares("demo", "runc-demo", uid, "high", "strict", False,
                       Allocation(containers=(entry,), node="this-machine"))
    (world.private_dir / "allocations").mkdir(parents=True, exist_ok=True)
    (world.private_dir / "allocations" / f"{uid}.json").write_text(record.encode())
    annotations = {"io.kubernetes.cri.sandbox-uid": uid, "io.kubernetes.cri.container-name":
                   "main", "io.kubernetes.cri.sandbox-name": "runc-demo",
                   "io.kubernetes.cri.sandbox-namespace": "demo"}
    env = {"NVIDIA_VISIBLE_DEVICES": FAKE_DEFAULT_UUID}
    result, _ = world.run(["/probe", "8192"], env, annotations)
    values = result.values
    options.say("\nA real runc container with a 4096 MiB share of a 24576 MiB card (fake driver):")
    if result.returncode != 0 or not values:
        options.say(f"  failed: {result.stderr.strip() or result.stdout.strip()}")
        return
    options.say(f"  cuMemGetInfo in the container: total {values.get('total_mib')} MiB, "
                f"free {values.get('free_mib')} MiB")
    verdict = "CUDA_ERROR_OUT_OF_MEMORY" if values.get("alloc") == 2 else values.get("alloc")
    options.say(f"  cuMemAlloc(8192 MiB) in the container: {verdict}")
    writable = "no" if values.get("config_write_errno") else "yes"
    options.say(f"  /run/egpu/config.json writable from inside: {writable}")


def _start_real_node(options: Options, info: devcluster.ClusterInfo, config_file: Path
                     ) -> bool:
    """Add the real node and its node agent (demo/real_node.py); False when skipped."""
    if not options.real_node:
        return False
    from demo import real_node

    reason = real_node.prerequisite_missing()
    if reason:
        options.say(f"==> real node skipped: {reason}")
        return False
    options.say("==> adding a real node (kubelet + containerd + runc, the fake GPU's cards)")
    node = real_node.start(options.state_dir, info, config_file,
                           lambda name, argv, env: _start(options.state_dir, name, argv, env),
                           dra=options.dra)
    prometheus.add_target(info.state_dir, AGENT_MONITOR, f"egpu-node-agent-{node.name}",
                          f"{node.ip}:{real_node.AGENT_METRICS_PORT}", "agent")
    what = ("published its ResourceSlices and the kubelet registered its DRA plugin"
            if options.dra else "registered the device plugin with the kubelet")
    options.say(f"  {node.name} Ready in {node.startup_s}s at {node.ip}; its node agent {what}")
    return True


def _real_node_report(options: Options, info: devcluster.ClusterInfo) -> None:
    from demo import real_node

    values = real_node.probe(info)
    through = ", through its ResourceClaim" if options.dra else ""
    options.say(f"\nA real container on the real node {real_node.NAME} "
                f"({real_node.NAMESPACE}/{real_node.POD}: 25% of an H100, 10% compute{through}):")
    if "error" in values:
        options.say(f"  no answer from the container; its log ends with:\n    {values['error']}"
                    f"\n  (kubectl -n {real_node.NAMESPACE} logs --previous {real_node.POD})")
        return
    verdict = ("CUDA_ERROR_OUT_OF_MEMORY" if values.get("alloc_one_more_mib") == 2
               else values.get("alloc_one_more_mib"))
    options.say(f"  cuMemGetInfo in the container: total {values.get('total_mib')} MiB")
    options.say(f"  cuMemAlloc of all of it: {values.get('alloc_free')} (0: success); "
                f"1 MiB more: {verdict}")


def _start_rightsizing(options: Options, info: devcluster.ClusterInfo) -> float:
    """Apply the right-sizing Deployment on the real node (demo/real_node.py) and wait until
    its replicas run; returns when (time.monotonic()) they did."""
    from demo import real_node

    _kubectl(info, "create", "namespace", real_node.RIGHTSIZING_NAMESPACE)
    workload = real_node.rightsizing_workload(options.inputs)
    result = _kubectl(info, "apply", "-f", "-", stdin=json.dumps(workload))
    if result.returncode != 0:
        raise DemoError(f"the right-sizing workload: {result.stderr.strip()}")
    name = workload["metadata"]["name"]
    # kubectl's own limit, inside the call's (which cut it at 60 s on a loaded host: a
    # TimeoutExpired instead of the demo's message)
    ready = _kubectl(info, "-n", real_node.RIGHTSIZING_NAMESPACE, "rollout", "status",
                     f"deployment/{name}", "--timeout=90s", timeout_s=100)
    if ready.returncode != 0:
        raise DemoError(f"the right-sizing workload did not start: {ready.stdout.strip()} "
                        f"{ready.stderr.strip()}")
    options.say(f"  {real_node.RIGHTSIZING_SOURCE} runs as {real_node.RIGHTSIZING_NAMESPACE}/"
                f"{name} on the real node ({workload['spec']['replicas']} replicas holding "
                f"{real_node.PATTERN['BASE_MIB']} MiB, +{real_node.PATTERN['SPIKE_MIB']} MiB "
                f"for {real_node.PATTERN['SPIKE_S']} s every {real_node.PATTERN['PERIOD_S']} s)")
    return time.monotonic()


def _rightsizing_report(options: Options, info: devcluster.ClusterInfo, url: str,
                        since: float) -> None:
    """After ``options.history_s`` of history, `kubectl egpu advise` (the command itself) for
    the workloads that have some (the simulated nodes run no containers: no history)."""
    import argparse

    from cli import advise_cmd

    wait = options.history_s - (time.monotonic() - since)
    if wait > 0:
        options.say(f"==> letting Prometheus record {options.history_s:.0f}s of history "
                    f"({wait:.0f}s more)")
        time.sleep(wait)
    argv = ["--prometheus", url, "--since", f"{math.ceil(options.history_s + 60)}s",
            "--min-history", f"{math.ceil(options.history_s / 2)}s", "--min-samples", "4",
            "--with-history"]
    options.say(f"\nRight-sizing from Prometheus: kubectl egpu advise {' '.join(argv)}")
    parser = argparse.ArgumentParser()
    advise_cmd.add_arguments(parser)
    args = parser.parse_args([*argv, "--kubeconfig", info.kubeconfig])
    if advise_cmd.run(args, say=options.say) != 0:
        raise DemoError("kubectl egpu advise failed (its message is above)")


def up(options: Options | None = None) -> int:
    """Run the demo (module docstring); returns 0, or raises DemoError naming the failed step."""
    options = options or Options()
    say = options.say
    state = options.state_dir
    if (state / "processes.json").exists() or (state / "cluster" / "cluster.json").exists():
        say("==> stopping the previous demo")
        down(state, say)
    state.mkdir(parents=True, exist_ok=True)
    config_file = state / "config.yaml"
    config_file.write_text(DRA_CONFIG if options.dra else DEMO_CONFIG)
    config = load_config_file(str(config_file))
    cluster_file = options.inputs / "cluster.yaml"
    specs = devnodes.load_cluster(cluster_file)

    say("==> starting the control plane (etcd, kube-apiserver, kube-controller-manager, "
        "kube-scheduler, kwok)")
    # The dev cluster's kube-scheduler serves default-scheduler only: egpu-scheduler is
    # egpu-kube-scheduler's (below). DRA mode: the nodes offer no egpu.io/gpu (no device
    # plugin; their ResourceSlices are published with them, devcluster.dra).
    info = devcluster.up(devcluster.Config(
        state_dir=state / "cluster", nodes_file=cluster_file,
        shares_per_card=config.shares_per_card, device_plugin=not options.dra,
        egpu_profile=False))
    try:
        prometheus_url = None
        if options.prometheus:
            say("==> starting Prometheus (scrape jobs and alert rules of "
                "manifests/monitoring/prometheus-operator)")
            prometheus_url = prometheus.attach(info)
        if options.dra:
            say("==> applying the DeviceClasses of manifests/dra (the kube-scheduler "
                "allocates the claims)")
            result = _kubectl(info, "apply", "-f", str(DEVICE_CLASSES))
            if result.returncode != 0:
                raise DemoError(f"applying {DEVICE_CLASSES.name}: {result.stderr.strip()}")
        else:
            _start_egpu_scheduler(state, info, config, config_file, say)
        say("==> starting the admission webhook (TLS) and registering it")
        _start_webhook(options, info, config_file)
        mode = " (--dra --no-device-plugin)" if options.dra else ""
        say(f"==> starting {len(specs)} node agents on the fake GPU{mode}")
        _start_node_agents(options, info, config_file, specs)
        real = _start_real_node(options, info, config_file)
        say("==> applying the workloads of inputs/pods")
        denials = _apply_workloads(options, info)
        if real:
            from demo import real_node

            result = _kubectl(info, "apply", "-f", "-",
                              stdin=json.dumps(real_node.workload(options.inputs)))
            if result.returncode != 0:
                raise DemoError(f"the real node's workload: {result.stderr.strip()}")
            say(f"  applied {real_node.SOURCE} as {real_node.NAMESPACE}/{real_node.POD} on the "
                "real node")
        rightsizing = (real and prometheus_url is not None and not options.dra
                       and options.history_s > 0)
        history_since = _start_rightsizing(options, info) if rightsizing else 0.0
        namespaces = {str((d.get("metadata") or {}).get("namespace", "default"))
                      for f in (options.inputs / "pods").glob("*.yaml")
                      for d in yaml.safe_load_all(f.read_text()) if d}
        say(f"==> waiting up to {options.wait_s:.0f}s for the pods to be placed")
        _report(options, info, config, denials, namespaces)
        if real:
            _real_node_report(options, info)
        if rightsizing and prometheus_url is not None:
            _rightsizing_report(options, info, prometheus_url, history_since)
    except BaseException:
        down(state, say)
        raise
    if options.container:
        _container_demo(options)
    claims = (f"\n  {info.kubectl} get resourceclaims -A"
              if options.dra else "")
    path = f"{BIN}:{Path(info.kubectl).parent}:$PATH"
    monitoring = (f"\n  Prometheus: {prometheus_url}\n  PATH={path} kubectl egpu advise "
                  f"--prometheus {prometheus_url} --since 1h --min-history 1m"
                  if prometheus_url else "")
    say(f"""
The cluster is still up. To look around:{monitoring}
  export KUBECONFIG={info.kubeconfig}
  {info.kubectl} get pods -A -o wide
  PATH={path} kubectl egpu   # or: {BIN}/egpu top{claims}
Logs: {state / 'logs'} and {state / 'cluster' / 'logs'}
To stop it:  {_stop_command(state)}""")
    return 0
