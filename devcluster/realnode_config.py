"""What a real node of the dev cluster is made of, as pure functions: its addresses, its
cgroup name, and the text of its configuration files (containerd, the fake GPU's toolkit
wrapper, CNI, kubelet, kube-proxy, the nftables guard, the egpu-hook base spec).
devcluster.realnode writes them and starts the node; docs/devcluster.md explains the
settings that only these machines need.

Addresses (198.18.0.0/15, reserved for benchmark networks; never the private ranges):
    host bridge 198.18.0.1/24, node i 198.18.0.(10+i), its pods 198.18.(16+i).0/24.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLUSTER_POD_CIDR = "198.18.16.0/20"  # every real node's pod range together (kube-proxy)
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
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


HOST_DEV_IN_NODE = "/run/egpu-host-dev"  # the host's /dev, seen from a node's mount namespace


def dev_commands(device_nodes: list[str]) -> list[str]:
    """A real node's own /dev (commands run in its mount namespace, /run already its own):
    a tmpfs with every entry of the host's /dev bound into it (folders with what is mounted
    below them, links copied), then ``device_nodes`` (the commands that make the fake GPU's
    nodes there: ``fake_toolkit.device_node_commands``), as a GPU node's /dev has the
    driver's. The host's /dev is left as it is."""
    host = HOST_DEV_IN_NODE
    return [
        f"mkdir -p {host}", f"mount --rbind /dev {host}",
        "mount -t tmpfs -o mode=755,nosuid tmpfs /dev",
        f"for e in {host}/* {host}/.[!.]*; do "
        '[ -e "$e" ] || [ -L "$e" ] || continue; n="/dev/${e##*/}"; '
        'if [ -L "$e" ]; then cp -P "$e" "$n"; '
        'elif [ -d "$e" ]; then mkdir -p "$n"; mount --rbind "$e" "$n"; '
        'else : > "$n"; mount --bind "$e" "$n"; fi; done',
        *device_nodes,
    ]


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
    egpu hook at createRuntime and poststop (docs/containerd.md, the OCI-hook route: poststop
    frees a raw container's share)."""
    return {"hooks": {stage: [{
        "path": "/usr/local/egpu/bin/egpu-hook", "args": ["egpu-hook", stage],
        "timeout": 10}] for stage in ("createRuntime", "poststop")}}

