"""The dev cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok as
local processes on 127.0.0.1, with simulated (kwok-managed) nodes.

Public API (the CLI's ``egpu dev-cluster up|down|status`` calls these):

    up(config: Config | None = None) -> ClusterInfo     raises DevClusterError
    down(state_dir: Path | str | None = None) -> list[str]      names of processes stopped
    status(state_dir: Path | str | None = None) -> ClusterStatus
    set_egpu_profile(info, egpu_profile) -> ClusterInfo
        restart only kube-scheduler with (or without) its egpu-scheduler profile
    without_egpu_profile(info)                                 context manager: kube-scheduler
        without its egpu-scheduler profile for the block, then as it was
    ClusterInfo.load(state_dir) -> ClusterInfo                 raises DevClusterError

State folder (default ``${EGPU_STATE_DIR:-~/.cache/egpu/dev-cluster}``):
    cluster.json        ClusterInfo: ports, pids, command lines, paths
    kubeconfig          admin kubeconfig (O=system:masters client cert)
    pki/                certs and keys (kept between runs)
    etcd/               etcd data (wiped at each ``up``: every cluster starts empty)
    logs/<name>.log     each process' stdout+stderr
    scheduler-config.yaml, kwok.yaml
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster import build as buildmod
from devcluster import supervisor
from devcluster.errors import DevClusterError as DevClusterError
from devcluster.kwok import KWOK_NODE_ANNOTATION as KWOK_NODE_ANNOTATION
from devcluster.kwok import KWOK_NODE_ANNOTATION_VALUE as KWOK_NODE_ANNOTATION_VALUE
from devcluster.kwok import POD_CIDR as POD_CIDR
from devcluster.kwok import config_text as kwok_config_text
from devcluster.kwok import kwok_argv
from devcluster.net import HOST as HOST
from devcluster.net import free_port as free_port
from devcluster.net import http_get, insecure_context, ssl_context
from devcluster.nodes import create_nodes
from devcluster.pki import ensure_pki
from devcluster.supervisor import ProcessInfo as ProcessInfo
from devcluster.waiting import wait_until as wait_until

# Addresses come from 198.18.0.0/15 (RFC 2544, reserved for benchmark networks), never from
# the private ranges: services 198.19.0.0/16, simulated pods 198.18.128.0/17 (devcluster.kwok);
# real nodes and their pods take 198.18.0.0/24 and 198.18.16.0/20 (devcluster.realnode).
SERVICE_CIDR = "198.19.0.0/16"
EGPU_SCHEDULER = "egpu-scheduler"  # mirrors egpu.contract.DEFAULT_SCHEDULER_NAME

# Start order; teardown is the reverse.
PROCESSES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

ADMISSION_PLUGINS = (
    "NamespaceLifecycle",
    "LimitRanger",
    "ServiceAccount",
    "DefaultTolerationSeconds",
    "Priority",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ResourceQuota",
)

SCHEDULER_CLIENT_QPS = 200  # requests/s the kube-scheduler may send the API server
CONTROLLER_MANAGER_QPS = 100  # requests/s of kube-controller-manager (claims from templates)
# kube-scheduler's --feature-gates; $EGPU_SCHEDULER_FEATURE_GATES sets them for one cluster
# (bench/scheduling.py's comparisons). NominatedNodeNameForExpectation (KEP-5278, beta and on
# since 1.35) writes the pod's status.nominatedNodeName before PreBind whenever a PreBind plugin
# has work, i.e. for every DRA pod (its claim's allocation): one more pod write, on the binding
# cycle, and its watch events a DRA pod; off, bench/scheduling.py's dra_ratio went from 0.49 to
# 0.72 (docs/dra.md, "Scheduling throughput"). It tells cluster autoscalers where a pod in a
# long PreBind is going; a DRA claim's PreBind is one status write.
SCHEDULER_FEATURE_GATES = "NominatedNodeNameForExpectation=false"
# Nodes each pod's filters run on before the scheduler stops looking, % of the cluster (never
# fewer than kube-scheduler's 100): its adaptive default looks at 42% of 1000 nodes, and the DRA
# plugin's Filter converts and searches a node's ResourceSlices on every one of them (docs/dra.md,
# "Scheduling throughput")
SCHEDULER_PERCENTAGE_OF_NODES_TO_SCORE = 10


# kube-scheduler's GOGC: Go's garbage collector runs when the heap has grown this % past what
# the last collection left (Go's default 100). A DRA pod's allocation attempts on 100 nodes
# make short-lived garbage, and at 100 the collector took 23% of the scheduler's CPU on DRA
# pods; 400 collects a quarter as often for a larger heap (docs/dra.md, "Scheduling
# throughput"). $EGPU_SCHEDULER_GOGC sets it for one cluster; "" keeps Go's default.
SCHEDULER_GOGC = "400"


def scheduler_env() -> dict[str, str] | None:
    """kube-scheduler's environment: this process' with GOGC when one is set, else None (the
    same, inherited)."""
    gogc = os.environ.get("EGPU_SCHEDULER_GOGC", SCHEDULER_GOGC)
    return {**os.environ, "GOGC": gogc} if gogc else None


def scheduler_feature_gates() -> list[str]:
    """kube-scheduler's ``--feature-gates`` argument, if any gate is set."""
    gates = os.environ.get("EGPU_SCHEDULER_FEATURE_GATES", SCHEDULER_FEATURE_GATES)
    return [f"--feature-gates={gates}"] if gates else []


class AlreadyRunning(DevClusterError):
    """``up`` found a dev cluster already running in the state folder."""


def default_state_dir() -> Path:
    env = os.environ.get("EGPU_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return buildmod.cache_root() / "dev-cluster"


@dataclass
class Config:
    """What ``up`` starts. Every field has a usable default."""

    state_dir: Path = field(default_factory=default_state_dir)
    k8s_version: str = buildmod.K8S_VERSION
    bin_dir: Path | None = None  # default: the build cache's bin folder
    build_missing: bool = True  # build missing binaries first (slow when cold)
    # The local kube-scheduler also serves the egpu-scheduler profile. Off where egpu is
    # installed in the cluster (its own egpu-scheduler Deployment then serves that name).
    egpu_profile: bool = True
    nodes_file: Path | None = None  # cluster description (inputs/cluster.yaml) to create nodes
    shares_per_card: int = 4
    # the nodes offer egpu.io/gpu (their agents serve the device plugin); off: DRA-only nodes
    device_plugin: bool = True
    timeout_s: float = 90.0  # per process readiness
    verbosity: int = 1


@dataclass
class ClusterInfo:
    """A running dev cluster, as recorded in ``<state_dir>/cluster.json``."""

    state_dir: str
    kubeconfig: str
    server: str  # https://127.0.0.1:<port>
    ca_file: str
    client_cert: str
    client_key: str
    bin_dir: str
    k8s_version: str
    etcd_url: str
    ports: dict[str, int]
    processes: dict[str, ProcessInfo]
    started_at: float = 0.0
    startup_s: float = 0.0
    prometheus_url: str | None = None  # devcluster.prometheus.attach (issue 26)
    egpu_profile: bool = True  # kube-scheduler serves egpu-scheduler too (Config.egpu_profile)

    @property
    def kubectl(self) -> str:
        return str(Path(self.bin_dir) / "kubectl")

    def kubectl_argv(self, *args: str) -> list[str]:
        return [self.kubectl, f"--kubeconfig={self.kubeconfig}", *args]

    def api_client(self) -> Any:
        """A fresh ``kubernetes.client.ApiClient`` for this cluster (admin credentials)."""
        # imported here: the kubernetes client is slow to import and only some callers need it
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        return k8s_config.new_client_from_config(
            config_file=self.kubeconfig, client_configuration=k8s_client.Configuration()
        )

    def save(self) -> None:
        path = Path(self.state_dir) / "cluster.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, state_dir: Path | str | None = None) -> ClusterInfo:
        path = Path(state_dir or default_state_dir()) / "cluster.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DevClusterError(f"no dev cluster recorded in {path.parent}") from None
        data["processes"] = {k: ProcessInfo(**v) for k, v in data["processes"].items()}
        for retired in ("extender_url", "extender_ca_file"):  # written before the extender left
            data.pop(retired, None)
        return cls(**data)


@dataclass
class ClusterStatus:
    state_dir: str
    recorded: bool  # cluster.json exists
    processes: dict[str, bool]  # name -> alive (and still our binary)
    ready: bool  # apiserver /readyz answered ok
    server: str | None = None
    kubeconfig: str | None = None

    @property
    def running(self) -> bool:
        """Any recorded process still alive."""
        return any(self.processes.values())

    @property
    def up(self) -> bool:
        """Every process alive and the apiserver ready."""
        return self.recorded and all(self.processes.values()) and self.ready

    def describe(self) -> str:
        if not self.recorded:
            return f"dev cluster: down (nothing recorded in {self.state_dir})"
        head = "up" if self.up else ("degraded" if self.running else "down")
        lines = [f"dev cluster: {head}  ({self.state_dir})"]
        if self.server:
            lines.append(f"  apiserver:  {self.server}  ready={self.ready}")
            lines.append(f"  kubeconfig: {self.kubeconfig}")
        for name, alive in self.processes.items():
            lines.append(f"  {name:<24} {'running' if alive else 'stopped'}")
        return "\n".join(lines)


# --- configuration files ------------------------------------------------------------------


def kubeconfig_text(server: str, ca: Path, crt: Path, key: Path,
                    user: str = "egpu-dev-admin") -> str:
    """A kubeconfig for ``server`` (CA file) as ``user`` (client cert and key files)."""
    return (
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: egpu-dev\n  cluster:\n    server: {server}\n"
        f"    certificate-authority: {ca}\n"
        f"users:\n- name: {user}\n  user:\n    client-certificate: {crt}\n"
        f"    client-key: {key}\n"
        f"contexts:\n- name: egpu-dev\n  context:\n    cluster: egpu-dev\n    user: {user}\n"
        "current-context: egpu-dev\n"
    )


def scheduler_config(kubeconfig: str | Path, *, egpu_profile: bool = True) -> str:
    """KubeSchedulerConfiguration (YAML): profiles ``default-scheduler`` and (``egpu_profile``)
    ``egpu-scheduler`` (kube-scheduler's default plugins only: it places pods that need a
    scheduler of that name, not shares on cards; egpu-kube-scheduler does that), leader
    election off."""
    lines = [
        "apiVersion: kubescheduler.config.k8s.io/v1",
        "kind: KubeSchedulerConfiguration",
        "clientConnection:",
        f"  kubeconfig: {kubeconfig}",
        # above the defaults (50/100): a DRA pod costs the scheduler two writes (the claim's
        # allocation, the binding), a device-plugin pod one; the throughput benchmark
        # (bench/scheduling.py) measures placement, not this client limit
        f"  qps: {SCHEDULER_CLIENT_QPS}",
        f"  burst: {2 * SCHEDULER_CLIENT_QPS}",
        "leaderElection:",
        "  leaderElect: false",
        f"percentageOfNodesToScore: {SCHEDULER_PERCENTAGE_OF_NODES_TO_SCORE}",
        "profiles:",
        "- schedulerName: default-scheduler",
    ]
    if egpu_profile:
        lines.append(f"- schedulerName: {EGPU_SCHEDULER}")
    return "\n".join(lines) + "\n"


PLUGIN_NAME = "EgpuShares"  # kube-scheduler/plugin's Name


# The profile egpu installs (the KubeSchedulerConfiguration in this ConfigMap), which the dev
# cluster's and the benchmarks' egpu-kube-scheduler run too.
PLUGIN_PROFILE_MANIFEST = Path(__file__).resolve().parent.parent / "manifests" / "scheduler" / \
    "kube-scheduler-config.yaml"


def plugin_profile(scheduler_name: str, egpu_config: str | Path | None = None
                   ) -> dict[str, Any]:
    """The KubeSchedulerConfiguration profile manifests/scheduler installs (egpu-kube-scheduler's
    plugin, EgpuShares, at every extension point it implements, DefaultBinder after it, and
    NodeResourcesFit told to ignore the shares' own resources), named ``scheduler_name``.
    ``egpu_config``: egpu's config file, the one the webhook and the node agents read (the
    plugin's arg configFile; None: egpu's defaults); no last good copy is kept (the installed
    one keeps it in its pod's folder)."""
    manifest = yaml.safe_load(PLUGIN_PROFILE_MANIFEST.read_text())
    (profile,) = yaml.safe_load(manifest["data"]["config.yaml"])["profiles"]
    profile["schedulerName"] = scheduler_name
    (plugin,) = [c for c in profile["pluginConfig"] if c["name"] == PLUGIN_NAME]
    plugin["args"] = {"configFile": str(egpu_config)} if egpu_config is not None else {}
    return dict(profile)


def plugin_scheduler_config(kubeconfig: str | Path, scheduler_name: str,
                            egpu_config: str | Path | None = None) -> str:
    """KubeSchedulerConfiguration (as JSON, which is YAML) for a second scheduler beside the
    dev cluster's: one profile, ``plugin_profile(scheduler_name, egpu_config)``, leader
    election off, the dev cluster's client limits."""
    return json.dumps({
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": SCHEDULER_CLIENT_QPS,
                             "burst": 2 * SCHEDULER_CLIENT_QPS},
        "leaderElection": {"leaderElect": False},
        "percentageOfNodesToScore": SCHEDULER_PERCENTAGE_OF_NODES_TO_SCORE,
        "profiles": [plugin_profile(scheduler_name, egpu_config)],
    }, indent=1) + "\n"


# --- up / down / status -------------------------------------------------------------------


class _Starter:
    """Starts the processes one by one (devcluster.supervisor); when one exits or is not
    ready in time, stops every one it started and raises DevClusterError naming that process
    and quoting its log."""

    def __init__(self, state_dir: Path, timeout_s: float) -> None:
        self.state_dir = state_dir
        self.logs = state_dir / "logs"
        self.timeout_s = timeout_s
        self.started: dict[str, ProcessInfo] = {}

    def start(self, name: str, argv: list[str],
              env: dict[str, str] | None = None) -> ProcessInfo:
        # its own session: it outlives the CLI / pytest process that started it
        info = supervisor.start(name, argv, self.logs / f"{name}.log", cwd=self.state_dir,
                                env=env)
        self.started[name] = info
        return info

    def wait(self, info: ProcessInfo, probe: Callable[[], Any], what: str) -> None:
        """Poll ``probe()`` (True when ready) until the timeout; fail clearly."""
        try:
            supervisor.wait_ready(info, probe, what, self.timeout_s)
        except supervisor.ProcessFailed as exc:
            self.stop_all()
            raise DevClusterError(f"{exc}\n(logs of the other processes: {self.logs})"
                                  ) from None

    def stop_all(self) -> None:
        for name in reversed(list(self.started)):
            _stop(self.started[name])


def _answers_200(url: str, context: ssl.SSLContext | None = None) -> Callable[[], bool]:
    """A readiness probe: GET ``url`` answers 200 (raises OSError while nothing listens)."""
    return lambda: http_get(url, context)[0] == 200


def _stop(info: ProcessInfo, grace_s: float = supervisor.STOP_GRACE_S) -> bool:
    """Stop one recorded process if it is still ours (pid alive and same binary)."""
    return supervisor.stop(info.pid, grace_s, program=supervisor.program_of(info.argv))


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AlreadyRunning(
                f"another `dev-cluster up/down` holds {state_dir / 'lock'}"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _binaries(config: Config) -> Path:
    bins = Path(config.bin_dir) if config.bin_dir else buildmod.bin_dir(config.k8s_version)
    if config.bin_dir is None:
        missing = buildmod.missing(config.k8s_version)
    else:
        missing = [b for b in buildmod.BINARIES if not (bins / b).exists()]
    if missing and config.bin_dir is None and config.build_missing:
        print(
            f"dev-cluster: building missing binaries ({', '.join(missing)}); "
            "a cold build takes a long while",
            flush=True,
        )
        buildmod.build(config.k8s_version)
        missing = [b for b in buildmod.BINARIES if not (bins / b).exists()]
    if missing:
        raise DevClusterError(
            f"missing binaries in {bins}: {', '.join(missing)} (run `python -m devcluster.build`)"
        )
    return bins


def up(config: Config | None = None) -> ClusterInfo:
    """Start the dev cluster and return its ClusterInfo once every part is ready.

    Raises AlreadyRunning when one is running in ``config.state_dir`` and DevClusterError
    (naming the process and quoting its last log lines) when a part fails to start."""
    config = config or Config()
    state_dir = Path(config.state_dir).expanduser().resolve()
    t0 = time.monotonic()
    with _locked(state_dir):
        st = status(state_dir)
        if st.running:
            raise AlreadyRunning(
                f"a dev cluster is already running in {state_dir} "
                f"(apiserver {st.server}); run `egpu dev-cluster down` first"
            )
        bins = _binaries(config)
        pki = ensure_pki(state_dir / "pki")
        logs = state_dir / "logs"
        logs.mkdir(exist_ok=True)
        for old in logs.glob("*.log"):
            old.unlink()
        etcd_dir = state_dir / "etcd"
        shutil.rmtree(etcd_dir, ignore_errors=True)
        (state_dir / "cluster.json").unlink(missing_ok=True)

        ports = {
            "etcd-client": free_port(),
            "etcd-peer": free_port(),
            "kube-apiserver": free_port(),
            "kube-controller-manager": free_port(),
            "kube-scheduler": free_port(),
            "kwok": free_port(),
        }
        server = f"https://{HOST}:{ports['kube-apiserver']}"
        etcd_url = f"http://{HOST}:{ports['etcd-client']}"
        kubeconfig = state_dir / "kubeconfig"
        kubeconfig.write_text(kubeconfig_text(server, pki / 'ca.crt', pki / 'admin.crt',
                                                pki / 'admin.key'))
        kubeconfig.chmod(0o600)
        sched_cfg = state_dir / "scheduler-config.yaml"
        sched_cfg.write_text(
            scheduler_config(kubeconfig, egpu_profile=config.egpu_profile)
        )
        kwok_cfg = state_dir / "kwok.yaml"
        kwok_cfg.write_text(kwok_config_text())
        v = f"--v={config.verbosity}"
        starter = _Starter(state_dir, config.timeout_s)
        admin_ctx = ssl_context(pki / "ca.crt", pki / "admin.crt", pki / "admin.key")

        # etcd
        peer = f"http://{HOST}:{ports['etcd-peer']}"
        etcd = starter.start(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=egpu-dev",
                f"--data-dir={etcd_dir}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=egpu-dev={peer}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync=true",  # a throwaway dev store: speed over durability
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        starter.wait(
            etcd,
            lambda: '"health":"true"' in http_get(f"{etcd_url}/health")[1],
            f"GET {etcd_url}/health",
        )

        # kube-apiserver
        apiserver = starter.start(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={HOST}",
                f"--advertise-address={HOST}",
                f"--secure-port={ports['kube-apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--enable-admission-plugins={','.join(ADMISSION_PLUGINS)}",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # Webhooks and aggregated APIs are dialled at their endpoints' pod IPs: the
                # host has routes to real nodes' pod networks but runs no kube-proxy.
                "--enable-aggregator-routing=true",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
                # 127.0.0.1 may not be published as the kubernetes service's endpoint
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                v,
            ],
        )
        readyz = f"{server}/readyz"
        starter.wait(apiserver, _answers_200(readyz, admin_ctx), f"GET {readyz}")

        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={HOST}",
            "--profiling=false",
            v,
        ]
        # kube-controller-manager: creates pods for Deployments/Jobs, service accounts...
        kcm = starter.start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                *common,
                f"--secure-port={ports['kube-controller-manager']}",
                "--leader-elect=false",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials=false",
                # default 20/30: the resourceclaim controller creates a claim per pod of a
                # ResourceClaimTemplate through this client
                f"--kube-api-qps={CONTROLLER_MANAGER_QPS}",
                f"--kube-api-burst={2 * CONTROLLER_MANAGER_QPS}",
                # a quota's first count can miss a pod its informer has not seen yet; the
                # default 5 min recount left a test waiting past its 60 s
                "--resource-quota-sync-period=15s",
            ],
        )
        # kube-scheduler
        sched = starter.start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--config={sched_cfg}",
                *common[1:],  # --kubeconfig is in the config file
                f"--secure-port={ports['kube-scheduler']}",
                *scheduler_feature_gates(),
            ],
            env=scheduler_env(),
        )
        # kwok: fakes the kubelet of nodes annotated kwok.x-k8s.io/node=fake
        kwok = starter.start("kwok", kwok_argv(bins / "kwok", kubeconfig, kwok_cfg, HOST,
                                               ports["kwok"]))
        insecure = insecure_context()
        for proc, port in (
            (kcm, ports["kube-controller-manager"]),
            (sched, ports["kube-scheduler"]),
        ):
            url = f"https://{HOST}:{port}/healthz"
            starter.wait(proc, _answers_200(url, insecure), f"GET {url}")
        kwok_url = f"http://{HOST}:{ports['kwok']}/healthz"
        starter.wait(kwok, _answers_200(kwok_url), f"GET {kwok_url}")
        # The controller manager is useful once it made the default service account.
        sa_url = f"{server}/api/v1/namespaces/default/serviceaccounts/default"
        starter.wait(kcm, _answers_200(sa_url, admin_ctx), "the default service account to appear")

        info = ClusterInfo(
            state_dir=str(state_dir),
            kubeconfig=str(kubeconfig),
            server=server,
            ca_file=str(pki / "ca.crt"),
            client_cert=str(pki / "admin.crt"),
            client_key=str(pki / "admin.key"),
            bin_dir=str(bins),
            k8s_version=config.k8s_version,
            etcd_url=etcd_url,
            ports=ports,
            processes=dict(starter.started),
            started_at=time.time(),
            egpu_profile=config.egpu_profile,
        )
        info.startup_s = round(time.monotonic() - t0, 1)
        info.save()

    if config.nodes_file:
        try:
            create_nodes(
                info.api_client(), config.nodes_file, shares_per_card=config.shares_per_card,
                device_plugin=config.device_plugin,
            )
        except Exception as exc:
            raise DevClusterError(f"cluster is up but creating nodes failed: {exc}") from exc
    return info


def set_egpu_profile(info: ClusterInfo, egpu_profile: bool, timeout_s: float = 90.0
                     ) -> ClusterInfo:
    """Serve the ``egpu-scheduler`` profile from the dev cluster's kube-scheduler, or
    (``egpu_profile=False``) drop that profile, so that another scheduler (egpu-kube-scheduler,
    ``devcluster.plugin_scheduler``) serves the name alone.

    Rewrites ``<state>/scheduler-config.yaml`` (``scheduler_config``), restarts only the
    kube-scheduler process (same command line, port and log; the old one is stopped first,
    so two schedulers never run at once), waits until its ``/healthz`` answers 200, and saves
    the ClusterInfo (new pid, ``egpu_profile``). Updates ``info`` in
    place and returns it. The other processes, the nodes and the pods are left alone.

    Raises DevClusterError when no kube-scheduler is recorded, when another ``up``/``down``
    holds the state folder (AlreadyRunning), or when the new kube-scheduler exits or is not
    healthy within ``timeout_s`` (quoting its log).
    """
    state_dir = Path(info.state_dir)
    old = info.processes.get("kube-scheduler")
    if old is None:
        raise DevClusterError(f"no kube-scheduler recorded in {state_dir / 'cluster.json'}")
    config_arg = next((a for a in old.argv if a.startswith("--config=")), None)
    sched_cfg = Path(config_arg.split("=", 1)[1]) if config_arg else (
        state_dir / "scheduler-config.yaml")
    argv = list(old.argv) if config_arg else [*old.argv, f"--config={sched_cfg}"]
    port = info.ports["kube-scheduler"]
    with _locked(state_dir):
        sched_cfg.write_text(scheduler_config(info.kubeconfig, egpu_profile=egpu_profile))
        _stop(old)
        starter = _Starter(state_dir, timeout_s)
        new = starter.start("kube-scheduler", argv, env=scheduler_env())
        url = f"https://{HOST}:{port}/healthz"
        insecure = insecure_context()
        starter.wait(new, _answers_200(url, insecure), f"GET {url}")
        info.processes["kube-scheduler"] = new
        info.egpu_profile = egpu_profile
        info.save()
    return info


@contextlib.contextmanager
def without_egpu_profile(info: ClusterInfo) -> Iterator[ClusterInfo]:
    """The dev cluster's kube-scheduler without its ``egpu-scheduler`` profile for the block,
    so that another scheduler (egpu-kube-scheduler, ``devcluster.plugin_scheduler``) serves
    that name alone; then as it was (a cluster started ``--no-egpu-profile``, where egpu is
    installed, stays without it). Restarts kube-scheduler on each side
    (``set_egpu_profile``)."""
    profile = info.egpu_profile
    set_egpu_profile(info, False)
    try:
        yield info
    finally:
        set_egpu_profile(info, profile)


def status(state_dir: Path | str | None = None) -> ClusterStatus:
    """What is recorded in the state folder and whether it is alive and ready."""
    state_dir = Path(state_dir or default_state_dir()).expanduser().resolve()
    try:
        info = ClusterInfo.load(state_dir)
    except (DevClusterError, ValueError, TypeError, KeyError):
        return ClusterStatus(str(state_dir), recorded=False, processes={}, ready=False)
    procs = {n: supervisor.alive(p.pid, supervisor.program_of(p.argv))
             for n, p in info.processes.items()}
    ready = False
    if procs.get("kube-apiserver"):
        try:
            ctx = ssl_context(info.ca_file, info.client_cert, info.client_key)
            ready = http_get(f"{info.server}/readyz", ctx)[0] == 200
        except (OSError, ssl.SSLError):
            ready = False
    return ClusterStatus(str(state_dir), True, procs, ready, info.server, info.kubeconfig)


def down(state_dir: Path | str | None = None) -> list[str]:
    """Stop the processes recorded in the state folder (only those still running our
    binaries, checked by pid and command line). Returns the names stopped. Keeps pki/ and
    logs/; the next ``up`` starts from an empty etcd."""
    state_dir = Path(state_dir or default_state_dir()).expanduser().resolve()
    try:
        info = ClusterInfo.load(state_dir)
    except DevClusterError:
        return []
    stopped = []
    with _locked(state_dir):
        # processes added after up (devcluster.prometheus.attach) first, then the cluster's
        extra = [name for name in info.processes if name not in PROCESSES]
        for name in [*extra, *reversed(PROCESSES)]:
            proc = info.processes.get(name)
            if proc and _stop(proc):
                stopped.append(name)
        (state_dir / "cluster.json").unlink(missing_ok=True)
    return stopped
