"""Real nodes for the dev cluster: a real kubelet and containerd (with runc, CNI and
kube-proxy) beside the kwok fleet, whose GPUs are the fake GPU's cards.

A real node is a network namespace and a mount namespace on this machine, as a node is a
machine of its own: its address lives in the network namespace (a veth pair to the host
bridge ``egpu-br0``), and in its mount namespace a private ``/run`` and its own
``/var/lib/kubelet``, ``/var/lib/containerd``, ``/var/log``, ``/var/lib/cni``, ``/etc/cdi`` and
``/usr/local/egpu`` (bind mounts of folders under ``<state>/real-nodes/<name>/``) are what the
host has at those paths. Its processes (containerd and the runc shims, the kubelet,
kube-proxy, the containers) live in the cgroup ``/egpu-node-<index>-<name>`` of every
hierarchy (``cgroup_name``), so
that ``remove`` finds each of them.

    add(info, name="egpu-real-0", index=0, cards=DEFAULT_CARDS) -> RealNode
    remove(state_dir, name) -> None
    remove_all(state_dir) -> list[str]
    restart_part(state_dir, name, part) -> RealNode          part: kubelet | containerd
    RealNode.load(state_dir, name) / .nsenter_argv(...) / .run(...) / .crictl(...)

Addresses (198.18.0.0/15, reserved for benchmark networks; never the private ranges):
    host bridge 198.18.0.1/24, node i 198.18.0.(10+i), its pods 198.18.(16+i).0/24.
The apiserver stays on 127.0.0.1; a relay (``devcluster.relay``) forwards the host bridge's
address at the apiserver's port to it, and the ``kubernetes`` Service's EndpointSlice names
that address, so pods reach the apiserver through kube-proxy as on any cluster.

The addresses and the configuration files' text are pure functions of devcluster.realnode_config
(importable from here too); every process is started, waited for and stopped through
devcluster.supervisor, each recorded with its start time (pid reuse safe).

Needs root (namespaces, cgroups, mounts), runc, iptables/nft and the CNI plugins (Debian
packages; ``make system-deps``), and the binaries of ``devcluster.build``. Settings that only
this machine needs (cgroup v1, no swap check, no registry...) are listed in docs/devcluster.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from devcluster import images as imagesmod
from devcluster import pki as pkimod
from devcluster import supervisor
from devcluster.cluster import ClusterInfo, kubeconfig_text
from devcluster.errors import DevClusterError
from devcluster.fake_toolkit import device_node_commands
from devcluster.kubeapi import ApiError, api_request
from devcluster.nodes import wait_nodes_ready
from devcluster.realnode_config import CLUSTER_POD_CIDR as CLUSTER_POD_CIDR
from devcluster.realnode_config import CNI_BIN_DIR as CNI_BIN_DIR
from devcluster.realnode_config import CONTAINERD_SOCKET as CONTAINERD_SOCKET
from devcluster.realnode_config import DEFAULT_CARDS as DEFAULT_CARDS
from devcluster.realnode_config import cards_ini as cards_ini
from devcluster.realnode_config import cgroup_name as cgroup_name
from devcluster.realnode_config import cni_conflist as cni_conflist
from devcluster.realnode_config import containerd_config as containerd_config
from devcluster.realnode_config import dev_commands as dev_commands
from devcluster.realnode_config import guard_ruleset as guard_ruleset
from devcluster.realnode_config import hook_base_spec as hook_base_spec
from devcluster.realnode_config import kube_proxy_config as kube_proxy_config
from devcluster.realnode_config import kubelet_config as kubelet_config
from devcluster.realnode_config import node_ip as node_ip
from devcluster.realnode_config import pod_cidr as pod_cidr
from devcluster.realnode_config import toolkit_wrapper as toolkit_wrapper
from devcluster.supervisor import ProcessInfo

REPO = Path(__file__).resolve().parents[1]
HOST_BRIDGE = "egpu-br0"
HOST_LINK_IP = pkimod.HOST_LINK_IP  # 198.18.0.1: the host's address on the node link
LINK_PREFIX_LEN = 24
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet sets these machine-wide (they are not per namespace): kept and put back.
KUBELET_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory",
                   "vm/panic_on_oom", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Raised (never lowered) while real nodes run: every kubelet, containerd and shim of every
# node takes inotify instances from root's one budget (128 by default: the fourth node's
# kubelet failed "inotify_init: too many open files"); kind asks the same of its users.
INOTIFY_MINIMUMS = {"fs/inotify/max_user_instances": 8192,
                    "fs/inotify/max_user_watches": 524288}
# Their values (and INOTIFY_MINIMUMS') before the first real node of any cluster on this
# machine started (host /run: gone at reboot, as the changes are).
SYSCTLS_BEFORE = Path("/run/egpu-devcluster/sysctls-before.json")
# Held while a node takes an index (its link), the bridge comes or goes, or the sysctls are
# saved: real nodes of several clusters start and stop at once (parallel test lanes).
HOST_LOCK = Path("/run/egpu-devcluster/host.lock")
# Host folders that each node replaces with its own (bind mounts in its mount namespace).
NODE_FOLDERS = {
    "var-lib-kubelet": "/var/lib/kubelet",
    "var-lib-containerd": "/var/lib/containerd",
    "var-log": "/var/log",
    "var-lib-cni": "/var/lib/cni",  # the CNI plugins' cache (results, host-local leases)
    "etc-cdi": "/etc/cdi",
    "usr-local-egpu": "/usr/local/egpu",
}
MAX_NODES = 16  # node IPs 198.18.0.10..25, pod ranges 198.18.16..31.0/24 (CLUSTER_POD_CIDR)
NODE_READY_S = 90.0
SOCKET_WAIT_S = 30.0
STOP_GRACE_S = 10.0
CRICTL_DEFAULT_RPC_S = 2  # crictl's own limit of a CRI call (its --timeout), s
CRICTL_MARGIN_S = 5.0  # of a crictl run's time, left for crictl itself, s


# --- the record -----------------------------------------------------------------------------


@dataclass
class RealNode:
    """A running real node, as recorded in ``<state>/real-nodes/<name>/node.json``."""

    name: str
    index: int
    node_dir: str
    ip: str
    pod_cidr: str
    holder_pid: int
    bin_dir: str
    processes: dict[str, ProcessInfo] = field(default_factory=dict)
    startup_s: float = 0.0
    steps_s: dict[str, float] = field(default_factory=dict)  # how long each step of add took
    # Each recorded pid's start time (clock ticks since boot, /proc/PID/stat field 22): a pid
    # of a process that has gone, reused by another one, is never signalled.
    start_ticks: dict[str, int] = field(default_factory=dict)

    @property
    def cgroup(self) -> str:
        return cgroup_name(self.index, self.name)

    def ours(self, pid: int) -> bool:
        """Whether ``pid`` is still the process this node started (alive, same start)."""
        ticks = self.start_ticks.get(str(pid))
        return ticks is not None and supervisor.alive(pid, ticks=ticks)

    def record(self, proc: ProcessInfo) -> None:
        self.processes[proc.name] = proc
        self.start_ticks[str(proc.pid)] = supervisor.start_ticks(proc.pid) or -1

    def stop(self, part: str, grace_s: float = STOP_GRACE_S) -> bool:
        """Stop the recorded process ``part`` if it is still the one this node started."""
        proc = self.processes.get(part)
        if proc is None or not self.ours(proc.pid):
            return False
        return supervisor.stop(proc.pid, grace_s, ticks=self.start_ticks[str(proc.pid)])

    def save(self) -> None:
        path = Path(self.node_dir) / "node.json"
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, state_dir: Path | str, name: str) -> RealNode:
        path = nodes_dir(state_dir) / name / "node.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DevClusterError(f"no real node {name} recorded in {path.parent}") from None
        data["processes"] = {k: ProcessInfo(**v) for k, v in data["processes"].items()}
        return cls(**data)

    def nsenter_argv(self, *argv: str, net: bool = True) -> list[str]:
        """A command line that runs ``argv`` on the node (its mount and network namespaces)."""
        ns = ["-m", "-n"] if net else ["-m"]
        return ["nsenter", "-t", str(self.holder_pid), *ns, "--", *argv]

    def crictl(self, *args: str, timeout: float = 60) -> str:
        """Run crictl against the node's containerd; returns its stdout. Each CRI call may
        take up to ``timeout`` less CRICTL_MARGIN_S seconds: crictl's own default, 2 s, cut a
        StopContainer on a loaded machine (DeadlineExceeded) while containerd carried it out."""
        rpc_s = max(CRICTL_DEFAULT_RPC_S, int(timeout - CRICTL_MARGIN_S))
        return self.run(str(Path(self.bin_dir) / "crictl"),
                        f"--runtime-endpoint=unix://{CONTAINERD_SOCKET}", f"--timeout={rpc_s}s",
                        *args, timeout=timeout)

    def run(self, *argv: str, timeout: float = 60, check: bool = True) -> str:
        proc = subprocess.run(self.nsenter_argv(*argv), capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise DevClusterError(f"on {self.name}: {' '.join(argv)} failed "
                                  f"({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def host_path(self, path: str) -> Path:
        """A path as the node sees it, reached from the host (through the holder's root).
        /var/run is an absolute symlink to /run, which would leave the node's root: it is
        resolved here."""
        if path == "/var/run" or path.startswith("/var/run/"):
            path = "/run" + path[len("/var/run"):]
        return Path(f"/proc/{self.holder_pid}/root") / path.lstrip("/")


def nodes_dir(state_dir: Path | str) -> Path:
    return Path(state_dir) / "real-nodes"


# --- host plumbing (I/O) --------------------------------------------------------------------


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} failed ({proc.returncode}): "
                              f"{proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Exclusive use of what every real node on this machine shares (``HOST_LOCK``)."""
    HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(HOST_LOCK, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file closes
        yield


def _ensure_bridge() -> None:
    if _sh("ip", "link", "show", HOST_BRIDGE, check=False).returncode != 0:
        _sh("ip", "link", "add", HOST_BRIDGE, "type", "bridge")
    _sh("ip", "addr", "replace", f"{HOST_LINK_IP}/{LINK_PREFIX_LEN}", "dev", HOST_BRIDGE)
    _sh("ip", "link", "set", HOST_BRIDGE, "up")


def _hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies mounted under /sys/fs/cgroup (cpu, memory, pids...)."""
    return sorted(p for p in CGROUP_ROOT.iterdir()
                  if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists())


def _make_cgroups(group: str) -> None:
    for h in _hierarchies():
        for sub in ("", "system", "pods"):
            d = h / group / sub if sub else h / group
            d.mkdir(exist_ok=True)
            if h.name == "cpuset":  # a cpuset child is empty until it copies its parent's
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / knob).read_text().strip():
                        (d / knob).write_text((d.parent / knob).read_text())


def _join_cgroup(group: str, pid: int, sub: str = "system") -> None:
    for h in _hierarchies():
        with contextlib.suppress(OSError):
            (h / group / sub / "cgroup.procs").write_text(str(pid))


def _cgroup_pids(group: str) -> set[int]:
    pids: set[int] = set()
    top = CGROUP_ROOT / "pids" / group
    if not top.exists():
        top = CGROUP_ROOT / "memory" / group
    for procs in top.rglob("cgroup.procs") if top.exists() else ():
        with contextlib.suppress(OSError):
            pids |= {int(p) for p in procs.read_text().split()}
    return pids


def _remove_cgroups(group: str) -> None:
    for h in _hierarchies():
        top = h / group
        if not top.exists():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


def _read_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text().strip()
            for k in (*KUBELET_SYSCTLS, *INOTIFY_MINIMUMS)}


def _raise_inotify_limits() -> None:
    current = _read_sysctls()
    _write_sysctls({k: str(v) for k, v in INOTIFY_MINIMUMS.items() if int(current[k]) < v})


def _write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(value)


def _start(node: RealNode, name: str, argv: list[str], env: dict[str, str] | None = None
           ) -> ProcessInfo:
    """Start one of the node's processes (log ``logs/<name>.log``) in its cgroups; recorded."""
    node_dir = Path(node.node_dir)
    proc = supervisor.start(name, argv, node_dir / "logs" / f"{name}.log", cwd=node_dir,
                            env=env)
    _join_cgroup(node.cgroup, proc.pid)
    node.record(proc)
    return proc


# --- the relay and the kubernetes Service's endpoint ------------------------------------------


def _ensure_relay(info: ClusterInfo) -> ProcessInfo:
    """The relay from HOST_LINK_IP:<apiserver port> to the apiserver (one per cluster)."""
    path = nodes_dir(info.state_dir) / "relay.json"
    with contextlib.suppress(FileNotFoundError, ValueError, TypeError, KeyError):
        running = _load_relay(path)
        if running is not None:
            return running[0]
    port = info.ports["kube-apiserver"]
    argv = [sys.executable, "-m", "devcluster.relay", f"{HOST_LINK_IP}:{port}",
            f"127.0.0.1:{port}"]
    relay = supervisor.start("apiserver-relay", argv, nodes_dir(info.state_dir) / "relay.log",
                             cwd=REPO)
    ticks = supervisor.start_ticks(relay.pid)
    path.write_text(json.dumps({**asdict(relay), "start_ticks": ticks}))
    return relay


def _load_relay(path: Path) -> tuple[ProcessInfo, int] | None:
    """The recorded relay and its start ticks while it still runs (same pid and start
    time), else None."""
    data = json.loads(path.read_text())
    ticks = data.pop("start_ticks", None)
    relay = ProcessInfo(**data)
    alive = ticks is not None and supervisor.alive(relay.pid, ticks=ticks)
    return (relay, ticks) if alive else None


def _apiserver_endpoint(info: ClusterInfo) -> None:
    """Point the ``kubernetes`` Service at the relay (the apiserver runs with
    ``--endpoint-reconciler-type=none``: 127.0.0.1 may not be published)."""
    port = info.ports["kube-apiserver"]
    body = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes",
                                "endpointslice.kubernetes.io/managed-by": "egpu-devcluster"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [HOST_LINK_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    client = info.api_client()
    try:
        path = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        try:
            api_request(client, "POST", path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            api_request(client, "PUT", f"{path}/kubernetes", body)
    finally:
        client.close()


# --- add / remove -----------------------------------------------------------------------------


def free_index() -> int:
    """The lowest node index no real node on this machine (of any cluster) uses: its link
    ``egpu-v<index>`` does not exist."""
    index = 0
    while Path(f"/sys/class/net/egpu-v{index}").exists():
        index += 1
    if index >= MAX_NODES:
        raise DevClusterError(f"{MAX_NODES} real nodes run on this machine already")
    return index


def add(info: ClusterInfo, name: str = "egpu-real-0", index: int | None = None,
        cards: tuple[tuple[str, str, int, int], ...] = DEFAULT_CARDS,
        images: dict[str, Path] | None = None, labels: dict[str, str] | None = None,
        taints: tuple[str, ...] = (), ready_timeout_s: float = NODE_READY_S) -> RealNode:
    """Start a real node and wait until its Node is Ready. ``index`` picks its addresses and
    its cgroup (one index per real node on this machine, whatever its cluster; default: the
    lowest free one, ``free_index``); ``images``: reference -> OCI
    archive to import (default: devcluster.images.ensure_images()); ``taints``: registered
    with the node (``key=value:Effect``). Raises DevClusterError naming the part that failed,
    with its log's last lines; what was started is removed."""
    if os.geteuid() != 0:
        raise DevClusterError("a real node needs root (namespaces, cgroups, mounts)")
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        raise DevClusterError("real nodes need cgroup v1 hierarchies under /sys/fs/cgroup (this "
                              "machine has the unified cgroup v2 tree; not supported yet)")
    t0 = time.monotonic()
    state_dir = Path(info.state_dir)
    node_dir = nodes_dir(state_dir) / name
    with contextlib.suppress(DevClusterError):
        remove(state_dir, name)  # a node of an earlier run under this name
    shutil.rmtree(node_dir, ignore_errors=True)
    for sub in ("logs", "config", "cni", "pki", "driver/lib", "driver/state", *NODE_FOLDERS):
        (node_dir / sub).mkdir(parents=True, exist_ok=True)
    if images is None:
        images = {ref: Path(p) for ref, p in imagesmod.ensure_images().items()}
    bins = Path(info.bin_dir)
    host_lock = contextlib.ExitStack()  # held until this node's link exists (or add fails)
    host_lock.enter_context(_host_lock())
    try:
        index = free_index() if index is None else index
        if not SYSCTLS_BEFORE.exists() and not _nodes_on_bridge():
            SYSCTLS_BEFORE.parent.mkdir(parents=True, exist_ok=True)
            SYSCTLS_BEFORE.write_text(json.dumps(_read_sysctls()))
        _raise_inotify_limits()
    except BaseException:
        host_lock.close()
        raise

    node = RealNode(name=name, index=index, node_dir=str(node_dir), ip=node_ip(index),
                    pod_cidr=pod_cidr(index), holder_pid=0, bin_dir=str(bins))
    step_t0 = time.monotonic()

    def step(name: str) -> None:
        nonlocal step_t0
        now = time.monotonic()
        node.steps_s[name] = round(now - step_t0, 2)
        step_t0 = now

    try:
        _ensure_bridge()
        node.processes["apiserver-relay"] = _ensure_relay(info)
        _apiserver_endpoint(info)
        _make_cgroups(node.cgroup)
        _write_files(info, node, cards)
        _start_namespaces(node, len(cards))
        host_lock.close()
        _route_to_peers(state_dir, node)
        node.save()
        step("host, files and namespaces")
        _start_containerd(node)
        step("containerd")
        _import_images(node, images)
        step("image import")
        _start_kubelet(node, labels or {}, taints)
        node.save()
        _wait_ready(info, node, ready_timeout_s)
        step("kubelet to Node Ready")
        _start_kube_proxy(node)
        step("kube-proxy's rules")
        node.startup_s = round(time.monotonic() - t0, 1)
        node.save()
    except BaseException:
        host_lock.close()  # a no-op once released
        with contextlib.suppress(Exception):
            node.save()
            remove(state_dir, name, delete_node_object=False)
        raise
    return node


def _write_files(info: ClusterInfo, node: RealNode, cards: tuple[tuple[str, str, int, int], ...]
                 ) -> None:
    node_dir = Path(node.node_dir)
    pki = Path(info.state_dir) / "pki"
    ca = pki / "ca.crt"
    server = f"https://{HOST_LINK_IP}:{info.ports['kube-apiserver']}"
    crt, key = pkimod.client_cert(pki, f"kubelet-{node.name}", f"system:node:{node.name}",
                                  org="system:nodes")
    (node_dir / "config" / "kubelet.kubeconfig").write_text(
        kubeconfig_text(server, ca, crt, key, f"system:node:{node.name}"))
    crt, key = pkimod.client_cert(pki, "kube-proxy", "system:kube-proxy")
    proxy_kubeconfig = node_dir / "config" / "kube-proxy.kubeconfig"
    proxy_kubeconfig.write_text(kubeconfig_text(server, ca, crt, key, "system:kube-proxy"))
    (node_dir / "config" / "kubelet.yaml").write_text(kubelet_config(node.name, node.index, ca))
    (node_dir / "config" / "kube-proxy.yaml").write_text(
        kube_proxy_config(node.name, proxy_kubeconfig))
    (node_dir / "config" / "containerd.toml").write_text(
        containerd_config(node_dir, imagesmod.IMAGE_PAUSE))
    (node_dir / "config" / "egpu-base-spec.json").write_text(_base_spec(node))
    (node_dir / "cni" / "10-egpu-pods.conflist").write_text(cni_conflist(node.index))
    (node_dir / "config" / "guard.nft").write_text(guard_ruleset())
    driver = node_dir / "driver"
    for lib in ("libcuda.so.1", "libnvidia-ml.so.1"):
        src = REPO / "fakegpu" / "build" / lib
        if not src.exists():
            raise DevClusterError(f"{src} is missing: run `make native` first")
        shutil.copy2(src, driver / "lib" / lib)
    (driver / "cards.ini").write_text(cards_ini(cards))
    (driver / "state").chmod(0o777)
    wrapper = driver / "nvidia-container-runtime"
    wrapper.write_text(toolkit_wrapper(node_dir))
    wrapper.chmod(0o755)


def _base_spec(node: RealNode) -> str:
    """containerd's default spec (``ctr oci spec``) with the egpu hook added."""
    proc = _sh(str(Path(node.bin_dir) / "ctr"), "oci", "spec")
    spec = json.loads(proc.stdout)
    spec.setdefault("hooks", {}).update(hook_base_spec()["hooks"])
    return json.dumps(spec, indent=1)


def _start_namespaces(node: RealNode, ncards: int) -> None:
    node_dir = Path(node.node_dir)
    holder = _start(node, "holder", ["unshare", "--net", "--mount", "--propagation",
                                     "private", "--", "sleep", "infinity"])
    node.holder_pid = holder.pid
    node.save()  # recorded at once: an interrupted add leaves nothing unknown behind
    own_net = os.readlink("/proc/self/ns/net")
    supervisor.wait_ready(holder, lambda: os.readlink(f"/proc/{holder.pid}/ns/net") != own_net,
                          f"the namespaces of {node.name}", 10, interval_s=0.05)
    veth = f"egpu-v{node.index}"
    _sh("ip", "link", "del", veth, check=False)
    _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns",
        str(holder.pid))
    _sh("ip", "link", "set", veth, "master", HOST_BRIDGE, "up")
    _sh("ip", "route", "replace", node.pod_cidr, "via", node.ip)
    mounts = ["mount -t tmpfs -o mode=755 tmpfs /run"]
    for sub, target in NODE_FOLDERS.items():
        Path(target).mkdir(parents=True, exist_ok=True)  # the mount point (empty on the host)
        mounts.append(f"mount --bind {shlex.quote(str(node_dir / sub))} {target}")
    script = "; ".join([
        "set -e", "ip link set lo up",
        f"ip addr add {node.ip}/{LINK_PREFIX_LEN} dev eth0", "ip link set eth0 up",
        f"ip route add default via {HOST_LINK_IP}", "sysctl -qw net.ipv4.ip_forward=1",
        f"nft -f {shlex.quote(str(Path(node.node_dir) / 'config' / 'guard.nft'))}",
        *mounts, *dev_commands(device_node_commands("/dev", ncards)),
        "mkdir -p /run/containerd /var/run/cdi",
        "mount --make-rshared /",
    ])
    _sh("nsenter", "-t", str(holder.pid), "-m", "-n", "--", "sh", "-c", script)


def _route_to_peers(state_dir: Path, node: RealNode) -> None:
    """Routes between this node's pods and those of the cluster's other real nodes (each
    range via its node's address on the shared link): the host forwards nothing."""
    for path in nodes_dir(state_dir).glob("*/node.json"):
        if path.parent.name == node.name:
            continue
        with contextlib.suppress(DevClusterError, ValueError, KeyError, TypeError):
            peer = RealNode.load(state_dir, path.parent.name)
            if not peer.ours(peer.holder_pid):
                continue
            node.run("ip", "route", "replace", peer.pod_cidr, "via", peer.ip)
            peer.run("ip", "route", "replace", node.pod_cidr, "via", node.ip)


def _node_env(node: RealNode) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "EGPU_"))}
    env["PATH"] = f"{node.bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return env


def _start_containerd(node: RealNode) -> None:
    node_dir = Path(node.node_dir)
    argv = node.nsenter_argv(str(Path(node.bin_dir) / "containerd"), "--config",
                             str(node_dir / "config" / "containerd.toml"))
    _wait_socket(node, _start(node, "containerd", argv, env=_node_env(node)))


def _wait_socket(node: RealNode, containerd: ProcessInfo) -> None:
    sock = node.host_path(CONTAINERD_SOCKET)
    supervisor.wait_ready(containerd, sock.exists, f"containerd's socket on {node.name}",
                          SOCKET_WAIT_S, interval_s=0.1)


def _import_images(node: RealNode, images: dict[str, Path]) -> None:
    ctr = str(Path(node.bin_dir) / "ctr")
    for archive in images.values():
        node.run(ctr, f"--address={CONTAINERD_SOCKET}", "-n", "k8s.io", "images", "import",
                 str(archive), timeout=300)


def _start_kubelet(node: RealNode, labels: dict[str, str], taints: tuple[str, ...]) -> None:
    node_dir = Path(node.node_dir)
    all_labels = {"egpu.io/node": "true", "egpu.io/real-node": "true", **labels}
    argv = node.nsenter_argv(
        str(Path(node.bin_dir) / "kubelet"),
        f"--config={node_dir / 'config' / 'kubelet.yaml'}",
        f"--kubeconfig={node_dir / 'config' / 'kubelet.kubeconfig'}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--node-labels={','.join(f'{k}={v}' for k, v in sorted(all_labels.items()))}",
        *([f"--register-with-taints={','.join(taints)}"] if taints else []),
        "--v=2",
    )
    _start(node, "kubelet", argv, env=_node_env(node))


def _start_kube_proxy(node: RealNode) -> None:
    node_dir = Path(node.node_dir)
    argv = node.nsenter_argv(str(Path(node.bin_dir) / "kube-proxy"),
                             f"--config={node_dir / 'config' / 'kube-proxy.yaml'}", "--v=1")
    proc = _start(node, "kube-proxy", argv, env=_node_env(node))
    supervisor.wait_ready(
        proc, lambda: "kubernetes" in node.run("nft", "list", "table", "ip", "kube-proxy",
                                               check=False),
        f"kube-proxy's service rules on {node.name}", SOCKET_WAIT_S, interval_s=0.5)


def _wait_ready(info: ClusterInfo, node: RealNode, timeout_s: float) -> None:
    """Until the Node is Ready and untainted; fails at once when the kubelet exits."""
    client = info.api_client()

    def ready() -> bool:
        wait_nodes_ready(client, [node.name], timeout_s=2)  # raises while it is not
        return True

    try:
        supervisor.wait_ready(node.processes["kubelet"], ready, f"node {node.name} Ready",
                              timeout_s)
    finally:
        client.close()


def restart_part(state_dir: Path | str, name: str, part: str) -> RealNode:
    """Stop and start one of the node's daemons (``kubelet``, ``containerd`` or
    ``kube-proxy``) with the same command line, as ``systemctl restart`` would. Running
    containers stay (containerd's shims keep them)."""
    node = RealNode.load(state_dir, name)
    if part not in ("kubelet", "containerd", "kube-proxy"):
        raise DevClusterError(f"part must be kubelet, containerd or kube-proxy, not {part!r}")
    old = node.processes[part]
    node.stop(part)
    proc = _start(node, part, old.argv, env=_node_env(node))
    node.save()
    if part == "containerd":
        _wait_socket(node, proc)
    return node


def remove(state_dir: Path | str, name: str, delete_node_object: bool = True) -> None:
    """Stop every process of the node (daemons, shims, containers), remove its cgroups, link
    and route, and (``delete_node_object``) its Node. When no real node is left, the bridge
    and the relay go too and the kubelet's machine-wide sysctls are put back."""
    state_dir = Path(state_dir)
    node = RealNode.load(state_dir, name)
    for part in ("kube-proxy", "kubelet", "containerd"):
        node.stop(part, grace_s=5)
    for _ in range(20):
        # Only what is in the node's cgroups, and its holder if it is still the same process.
        pids = _cgroup_pids(node.cgroup) - {os.getpid()}
        if node.holder_pid and node.ours(node.holder_pid):
            pids.add(node.holder_pid)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        for pid in pids:
            supervisor.alive(pid)  # reaps the children of this process among them
    _remove_cgroups(node.cgroup)
    # The node's disk (containerd's images and snapshots, ~0.5 GB; the kubelet's pods) goes;
    # its logs and configuration stay for a look after a failure.
    for sub in ("var-lib-containerd", "var-lib-kubelet"):
        shutil.rmtree(Path(node.node_dir) / sub, ignore_errors=True)
    _sh("ip", "route", "del", node.pod_cidr, check=False)
    _sh("ip", "link", "del", f"egpu-v{node.index}", check=False)
    (Path(node.node_dir) / "node.json").unlink(missing_ok=True)
    if delete_node_object:
        with contextlib.suppress(Exception):
            _delete_node_object(state_dir, name)
    if not any(nodes_dir(state_dir).glob("*/node.json")):
        _last_node_gone(state_dir)


def _nodes_on_bridge() -> list[str]:
    """The veths of real nodes (of any cluster on this machine) still on the host bridge."""
    ports = Path(f"/sys/class/net/{HOST_BRIDGE}/brif")
    return sorted(p.name for p in ports.iterdir()) if ports.is_dir() else []


def _delete_node_object(state_dir: Path, name: str) -> None:
    info = ClusterInfo.load(state_dir)
    client = info.api_client()
    try:
        api_request(client, "DELETE", f"/api/v1/nodes/{name}")
    except ApiError as exc:
        if exc.status != 404:
            raise
    finally:
        client.close()


def _last_node_gone(state_dir: Path) -> None:
    relay = nodes_dir(state_dir) / "relay.json"
    with contextlib.suppress(FileNotFoundError, ValueError, TypeError, KeyError):
        running = _load_relay(relay)
        if running is not None:
            supervisor.stop(running[0].pid, grace_s=2, ticks=running[1])
    relay.unlink(missing_ok=True)
    with _host_lock():
        _put_back_host()


def _put_back_host() -> None:
    """The bridge, the sysctls and the mount points, once no real node of any cluster is left
    (under the host lock: a node being added elsewhere has its link on the bridge)."""
    if _nodes_on_bridge():  # another cluster's real node still runs on this machine
        return
    _sh("ip", "link", "del", HOST_BRIDGE, check=False)
    with contextlib.suppress(FileNotFoundError, ValueError):
        _write_sysctls(json.loads(SYSCTLS_BEFORE.read_text()))
    SYSCTLS_BEFORE.unlink(missing_ok=True)
    # The empty mount points add() made on the host (removing one that another node's mount
    # namespace still uses would detach it there, hence only once no node is left).
    for target in NODE_FOLDERS.values():
        with contextlib.suppress(OSError):
            Path(target).rmdir()


def remove_all(state_dir: Path | str) -> list[str]:
    """Remove every real node recorded in the state folder; returns their names."""
    names = [p.parent.name for p in sorted(nodes_dir(state_dir).glob("*/node.json"))]
    for name in names:
        with contextlib.suppress(DevClusterError):
            remove(state_dir, name, delete_node_object=False)
    if not names and nodes_dir(state_dir).exists():
        _last_node_gone(Path(state_dir))
    return names
