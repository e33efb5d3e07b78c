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

Needs root (namespaces, cgroups, mounts), runc, iptables/nft and the CNI plugins (Debian
packages; ``make system-deps``), and the binaries of ``devcluster.build``. Settings that only
this machine needs (cgroup v1, no swap check, no registry...) are listed in docs/devcluster.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devcluster import pki as pkimod
from devcluster.cluster import (
    ClusterInfo,
    DevClusterError,
    ProcessInfo,
    kubeconfig_text,
    wait_until,
)

REPO = Path(__file__).resolve().parents[1]
HOST_BRIDGE = "egpu-br0"
HOST_LINK_IP = pkimod.HOST_LINK_IP  # 198.18.0.1: the host's address on the node link
LINK_PREFIX_LEN = 24
CLUSTER_POD_CIDR = "198.18.16.0/20"  # every real node's pod range together (kube-proxy)
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet sets these machine-wide (they are not per namespace): kept and put back.
KUBELET_SYSCTLS = ("kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory",
                   "vm/panic_on_oom", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
# Their values before the first real node of any cluster on this machine started (host /run:
# gone at reboot, as the changes are).
SYSCTLS_BEFORE = Path("/run/egpu-devcluster/sysctls-before.json")
# Host folders that each node replaces with its own (bind mounts in its mount namespace).
NODE_FOLDERS = {
    "var-lib-kubelet": "/var/lib/kubelet",
    "var-lib-containerd": "/var/lib/containerd",
    "var-log": "/var/log",
    "var-lib-cni": "/var/lib/cni",  # the CNI plugins' cache (results, host-local leases)
    "etc-cdi": "/etc/cdi",
    "usr-local-egpu": "/usr/local/egpu",
}
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
MAX_NODES = 16  # node IPs 198.18.0.10..25, pod ranges 198.18.16..31.0/24 (CLUSTER_POD_CIDR)
NODE_READY_S = 90.0
SOCKET_WAIT_S = 30.0
STOP_GRACE_S = 10.0
# The fake GPU's cards on a real node: two H100s (shared input 01 asks for H100 or A100).
DEFAULT_CARDS = (
    ("GPU-7e1e0000-0000-4000-8000-000000000000", "NVIDIA H100 80GB HBM3", 81559, 0),
    ("GPU-7e1e0000-0000-4000-8000-000000000001", "NVIDIA H100 80GB HBM3", 81559, 0),
)


def cgroup_name(index: int, name: str) -> str:
    """The node's cgroup folder in every hierarchy (the index keeps two clusters' nodes of the
    same name apart)."""
    return f"egpu-node-{index}-{name}"


def node_ip(index: int) -> str:
    return f"198.18.0.{10 + index}"


def pod_cidr(index: int) -> str:
    return f"198.18.{16 + index}.0/24"


def cards_ini(cards: tuple[tuple[str, str, int, int], ...]) -> str:
    """The fake GPU's card list (``FAKEGPU_CONFIG`` ini): (uuid, model, MiB, NUMA node)."""
    return "".join(
        f"[card]\nuuid={u}\nname={name}\nmemory_mib={mib}\nnuma_node={numa}\n\n"
        for u, name, mib, numa in cards
    )


# --- configuration files (pure) -------------------------------------------------------------


def containerd_config(node_dir: Path, sandbox_image: str) -> str:
    """containerd 2.x config (version 3). CDI is always on in 2.x (``enable_cdi`` is an
    unknown key there). The default runtime ``nvidia`` is the fake GPU's toolkit wrapper, as
    the NVIDIA Container Toolkit is on a GPU node; ``egpu-hook`` is the OCI-hook route
    (docs/containerd.md): the same wrapper with a base spec that runs egpu-hook (containerd
    applies a base_runtime_spec to containers, not to pod sandboxes)."""
    wrapper = node_dir / "driver" / "nvidia-container-runtime"
    base_spec = node_dir / "config" / "egpu-base-spec.json"
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    runtimes = f"{runtime}.containerd.runtimes"
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

# No registry here: the sandbox image is imported (ctr images import) and pinned.
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox_image}"

[{runtime}]
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  # The machine's bounding set lacks CAP_SYS_RESOURCE: runc may only raise oom_score_adj.
  restrict_oom_score_adj = true

[{runtime}.cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{node_dir / 'cni'}"

[{runtime}.containerd]
  default_runtime_name = "nvidia"

[{runtimes}.nvidia]
  runtime_type = "io.containerd.runc.v2"

[{runtimes}.nvidia.options]
  BinaryName = "{wrapper}"
  SystemdCgroup = false

[{runtimes}.egpu-hook]
  runtime_type = "io.containerd.runc.v2"
  base_runtime_spec = "{base_spec}"

[{runtimes}.egpu-hook.options]
  BinaryName = "{wrapper}"
  SystemdCgroup = false
"""


def toolkit_wrapper(node_dir: Path) -> str:
    """The shell wrapper containerd runs as the ``nvidia`` runtime: runc for every call but
    ``create``, which goes through the fake toolkit (devcluster.fake_toolkit) first."""
    toolkit = shlex.quote(str(REPO / "devcluster" / "fake_toolkit.py"))
    driver = shlex.quote(str(node_dir / "driver"))
    return f"""#!/bin/sh
# The fake GPU's container toolkit (devcluster/fake_toolkit.py); written by devcluster.realnode.
for a in "$@"; do
  if [ "$a" = create ]; then
    exec /usr/bin/python3 {toolkit} --driver-root {driver} --runc {RUNC} -- "$@"
  fi
done
exec {RUNC} "$@"
"""


def cni_conflist(index: int) -> str:
    """The pod network of node ``index``: a bridge with host-local addresses, routed (no
    masquerade: the host routes the node's pod range to the node)."""
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "egpu-pods",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr(index)}]],
                      "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/run/cni-ipam"}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=1)


def kubelet_config(name: str, index: int, ca: Path) -> str:
    """KubeletConfiguration. Settings only these machines need: failCgroupV1 false (cgroup
    v1), failSwapOn false, image GC off (images are imported, there is no registry to pull
    them back from), low eviction thresholds (a shared build machine's disk)."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {node_ip(index)}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
containerRuntimeEndpoint: unix://{CONTAINERD_SOCKET}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_name(index, name)}/pods
failCgroupV1: false
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}
clusterDomain: cluster.local
serializeImagePulls: false
registerNode: true
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusReportFrequency: 10s
staticPodPath: ""
"""


def kube_proxy_config(name: str, kubeconfig: Path) -> str:
    """KubeProxyConfiguration: nftables mode, in the node's network namespace; conntrack
    sizes left as the machine has them (they are machine-wide)."""
    return f"""apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {name}
mode: nftables
clusterCIDR: {CLUSTER_POD_CIDR}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"""


# Where a node and its pods may send packets: loopback and the benchmark range (nodes, pods,
# Services, the host's bridge). Anything else (a registry, the host's DNS resolver) is dropped
# in the node's namespace, whatever the host forwards.
ALLOWED_DESTINATIONS = ("127.0.0.0/8", "198.18.0.0/15")


def guard_ruleset() -> str:
    """nftables rules for the node's network namespace: drop every packet the node or its pods
    send (output, forward) to an address outside ALLOWED_DESTINATIONS (IPv6: all but
    loopback), and answer with an ICMP refusal so that the sender fails at once."""
    allowed = ", ".join(ALLOWED_DESTINATIONS)
    return f"""table inet egpu-node-guard {{
  chain egress {{
    type filter hook output priority 0; policy accept;
    ip daddr != {{ {allowed} }} reject with icmp type admin-prohibited
    ip6 daddr != ::1 meta l4proto != ipv6-icmp reject with icmpv6 type admin-prohibited
  }}
  chain forwarded {{
    type filter hook forward priority 0; policy accept;
    ip daddr != {{ {allowed} }} reject with icmp type admin-prohibited
    meta nfproto ipv6 drop
  }}
}}
"""


def hook_base_spec() -> dict[str, Any]:
    """The base OCI spec of the ``egpu-hook`` runtime handler: containerd's defaults plus the
    egpu hook at createRuntime (docs/containerd.md, the OCI-hook route)."""
    return {"hooks": {"createRuntime": [{
        "path": "/usr/local/egpu/bin/egpu-hook", "args": ["egpu-hook", "createRuntime"],
        "timeout": 10}]}}


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
        return pid > 0 and _alive(pid) and _start_ticks(pid) == self.start_ticks.get(str(pid))

    def record(self, proc: ProcessInfo) -> None:
        self.processes[proc.name] = proc
        self.start_ticks[str(proc.pid)] = _start_ticks(proc.pid) or -1

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
        """Run crictl against the node's containerd; returns its stdout."""
        return self.run(str(Path(self.bin_dir) / "crictl"),
                        f"--runtime-endpoint=unix://{CONTAINERD_SOCKET}", *args, timeout=timeout)

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
    return {k: (Path("/proc/sys") / k).read_text().strip() for k in KUBELET_SYSCTLS}


def _write_sysctls(values: dict[str, str]) -> None:
    for key, value in values.items():
        with contextlib.suppress(OSError):
            (Path("/proc/sys") / key).write_text(value)


def _start(node_dir: Path, name: str, argv: list[str], env: dict[str, str] | None = None
           ) -> ProcessInfo:
    log = node_dir / "logs" / f"{name}.log"
    with open(log, "ab") as out:
        out.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=node_dir, env=env,
                                start_new_session=True)
    return ProcessInfo(name=name, pid=proc.pid, argv=argv, log=str(log))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    if state in ("Z", "X"):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def _start_ticks(pid: int) -> int | None:
    """The process' start time in clock ticks since boot (/proc/PID/stat field 22)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(fields[19])  # fields[0] is field 3 (state)


def _stop_pid(pid: int, grace_s: float = STOP_GRACE_S) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
        _alive(pid)


def _tail(path: str, n: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


# --- the relay and the kubernetes Service's endpoint ------------------------------------------


def _ensure_relay(info: ClusterInfo) -> ProcessInfo:
    """The relay from HOST_LINK_IP:<apiserver port> to the apiserver (one per cluster)."""
    path = nodes_dir(info.state_dir) / "relay.json"
    with contextlib.suppress(FileNotFoundError, ValueError, TypeError, KeyError):
        relay = _load_relay(path)
        if relay is not None:
            return relay
    port = info.ports["kube-apiserver"]
    argv = [sys.executable, "-m", "devcluster.relay", f"{HOST_LINK_IP}:{port}",
            f"127.0.0.1:{port}"]
    log = nodes_dir(info.state_dir) / "relay.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    relay = ProcessInfo(name="apiserver-relay", pid=proc.pid, argv=argv, log=str(log))
    path.write_text(json.dumps({**asdict(relay), "start_ticks": _start_ticks(proc.pid)}))
    return relay


def _load_relay(path: Path) -> ProcessInfo | None:
    """The recorded relay while it still runs (same pid and start time), else None."""
    data = json.loads(path.read_text())
    ticks = data.pop("start_ticks", None)
    relay = ProcessInfo(**data)
    alive = _alive(relay.pid) and ticks is not None and _start_ticks(relay.pid) == ticks
    return relay if alive else None


def _apiserver_endpoint(info: ClusterInfo) -> None:
    """Point the ``kubernetes`` Service at the relay (the apiserver runs with
    ``--endpoint-reconciler-type=none``: 127.0.0.1 may not be published)."""
    from devcluster.nodes import ApiError, api_request

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
    index = free_index() if index is None else index
    for sub in ("logs", "config", "cni", "pki", "driver/lib", "driver/state", *NODE_FOLDERS):
        (node_dir / sub).mkdir(parents=True, exist_ok=True)
    if images is None:
        from devcluster import images as imagesmod

        images = {ref: Path(p) for ref, p in imagesmod.ensure_images().items()}
    bins = Path(info.bin_dir)
    if not SYSCTLS_BEFORE.exists() and not _nodes_on_bridge():
        SYSCTLS_BEFORE.parent.mkdir(parents=True, exist_ok=True)
        SYSCTLS_BEFORE.write_text(json.dumps(_read_sysctls()))

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
        _start_namespaces(node)
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
    from devcluster import images as imagesmod

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


def _start_namespaces(node: RealNode) -> None:
    node_dir = Path(node.node_dir)
    holder = _start(node_dir, "holder", ["unshare", "--net", "--mount", "--propagation",
                                         "private", "--", "sleep", "infinity"])
    node.holder_pid = holder.pid
    node.record(holder)
    node.save()  # recorded at once: an interrupted add leaves nothing unknown behind
    _join_cgroup(node.cgroup, holder.pid)
    own_net = os.readlink("/proc/self/ns/net")
    wait_until("the node's namespaces", lambda: _alive(holder.pid) and
               os.readlink(f"/proc/{holder.pid}/ns/net") != own_net, timeout=10, interval=0.05)
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
        *mounts, "mkdir -p /run/containerd /var/run/cdi", "mount --make-rshared /",
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
    proc = _start(node_dir, "containerd", argv, env=_node_env(node))
    _join_cgroup(node.cgroup, proc.pid)
    node.record(proc)
    sock = node.host_path(CONTAINERD_SOCKET)
    try:
        wait_until("containerd's socket", lambda: _alive(proc.pid) and sock.exists(),
                   timeout=SOCKET_WAIT_S, interval=0.1)
    except DevClusterError as exc:
        raise DevClusterError(f"{exc}\n--- {proc.log}:\n{_tail(proc.log)}") from None


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
    proc = _start(node_dir, "kubelet", argv, env=_node_env(node))
    _join_cgroup(node.cgroup, proc.pid)
    node.record(proc)


def _start_kube_proxy(node: RealNode) -> None:
    node_dir = Path(node.node_dir)
    argv = node.nsenter_argv(str(Path(node.bin_dir) / "kube-proxy"),
                             f"--config={node_dir / 'config' / 'kube-proxy.yaml'}", "--v=1")
    proc = _start(node_dir, "kube-proxy", argv, env=_node_env(node))
    _join_cgroup(node.cgroup, proc.pid)
    node.record(proc)
    try:
        wait_until("kube-proxy's service rules", lambda: _alive(proc.pid) and "kubernetes"
                   in node.run("nft", "list", "table", "ip", "kube-proxy", check=False),
                   timeout=SOCKET_WAIT_S, interval=0.5)
    except DevClusterError as exc:
        raise DevClusterError(f"{exc}\n--- {proc.log}:\n{_tail(proc.log)}") from None


def _wait_ready(info: ClusterInfo, node: RealNode, timeout_s: float) -> None:
    from devcluster.nodes import wait_nodes_ready

    kubelet = node.processes["kubelet"]
    client = info.api_client()
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not _alive(kubelet.pid):
                raise DevClusterError(f"the kubelet of {node.name} exited:\n{_tail(kubelet.log)}")
            try:
                wait_nodes_ready(client, [node.name], timeout_s=2)
                return
            except DevClusterError:
                continue
        raise DevClusterError(f"node {node.name} not Ready after {timeout_s:.0f}s:\n"
                              f"{_tail(kubelet.log)}")
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
    if node.ours(old.pid):
        _stop_pid(old.pid)
    proc = _start(Path(node.node_dir), part, old.argv, env=_node_env(node))
    _join_cgroup(node.cgroup, proc.pid)
    node.record(proc)
    node.save()
    if part == "containerd":
        sock = node.host_path(CONTAINERD_SOCKET)
        wait_until("containerd's socket", lambda: _alive(proc.pid) and sock.exists(),
                   timeout=SOCKET_WAIT_S, interval=0.1)
    return node


def remove(state_dir: Path | str, name: str, delete_node_object: bool = True) -> None:
    """Stop every process of the node (daemons, shims, containers), remove its cgroups, link
    and route, and (``delete_node_object``) its Node. When no real node is left, the bridge
    and the relay go too and the kubelet's machine-wide sysctls are put back."""
    state_dir = Path(state_dir)
    node = RealNode.load(state_dir, name)
    for part in ("kube-proxy", "kubelet", "containerd"):
        proc = node.processes.get(part)
        if proc and node.ours(proc.pid):
            _stop_pid(proc.pid, grace_s=5)
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
            _alive(pid)
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
    from devcluster.nodes import ApiError, api_request

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
        proc = _load_relay(relay)
        if proc is not None:
            _stop_pid(proc.pid, grace_s=2)
    relay.unlink(missing_ok=True)
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
