"""The demo's real node: a kubelet + containerd node (devcluster.realnode) beside the simulated
fleet, with egpu's node side on it and one workload of the inputs running there as a real
container.

    prerequisite_missing() -> str             why the real node cannot run here ("" if it can)
    start(state_dir, info, config_file, start_process, dra=False) -> RealNode
    apply_workload(info, inputs, say) -> str  the pod's name
    probe(info, name, timeout_s) -> dict      what the container's CUDA and NVML say

On a cluster, the node DaemonSet installs the hook and the interposer and runs the node agent;
the demo runs no in-cluster egpu (its webhook and egpu-kube-scheduler are local processes), so
it does the DaemonSet's two steps itself: it installs the hook and the interposer into the
node's /usr/local/egpu, and runs the node agent inside the node's namespaces, where it
registers the device plugin with the real kubelet and writes its CDI spec (with ``dra``, as the
``manifests/dra`` component runs it: ``--dra --no-device-plugin``, the node's ResourceSlices
and the DRA kubelet plugin instead of the device plugin).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devcluster import build as devbuild
from devcluster import cluster as devcluster
from devcluster import realnode
from devcluster.images import IMAGE_EGPU
from devcluster.supervisor import ProcessInfo
from egpu.contract import DRA_DRIVER

REPO = Path(__file__).resolve().parent.parent
NAME = "egpu-real-demo"
NAMESPACE = "research"
POD = "notebook-on-real-node"
SOURCE = "03-notebook-percentage.yaml"
# Only pods that say so land on the real node: the other workloads' images are not there
# (no registry), and their cpu and memory would not fit a 2-core machine.
TAINT_KEY = "egpu.io/real-node"
TAINT = f"{TAINT_KEY}=true:NoSchedule"
# The agent's log line once the kubelet's NotifyRegistrationStatus accepted the DRA plugin.
DRA_REGISTERED = f"the kubelet registered the DRA plugin {DRA_DRIVER}"
AGENT_METRICS_PORT = 9400  # the node agent's /metrics, on the node's own address
PROBE_CPU = "10m"
PROBE_MEMORY = "128Mi"
INTERPOSER = REPO / "libinterpose" / "build" / "libegpu_interpose.so"
# What the probe containers run (the demo's and the e2e tests'): the CUDA driver API and NVML
# through ctypes, as any application loads them (the interposer, preloaded by the hook,
# sees every call).
# It frees what it allocated and exits on SIGTERM (pod deletion): as pid 1 without a handler
# it would ignore SIGTERM and hold its pod for the grace period, until SIGKILL (the fake
# driver, as a real one, then frees its memory: fakegpu/src/fake_common.c, row_alive). The
# handler is set first thing: at PROBE_CPU a container can stay throttled for seconds after
# printing. Its progress goes to /dev/termination-log (the terminated state's message). Its
# result also goes to PROBE_FILE in the container, for a reader whose log line was lost (a
# containerd restart can cut a container's output from its log).
PROBE_FILE = "/tmp/egpu-probe.json"
PROBE = textwrap.dedent('''
    import os, signal
    def _note(text):
        with open("/dev/termination-log", "w") as f:
            f.write(text)
    def _release(*_):
        _note("SIGTERM")
        g = globals()
        freed = [g["cuda"].cuMemFree_v2(g[p]) for p in ("ptr", "more") if "cuda" in g and p in g]
        _note(f"SIGTERM, cuMemFree {freed}")
        os._exit(0)
    signal.signal(signal.SIGTERM, _release)
    import ctypes as C, json, os, sys, time
    MIB = 1 << 20
    cuda = C.CDLL("libcuda.so.1")
    out = {"preload": open("/etc/ld.so.preload").read().strip()
           if os.path.exists("/etc/ld.so.preload") else "",
           "config": os.path.exists("/run/egpu/config.json")}
    out["dev_nodes"] = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    out["init"] = cuda.cuInit(0)
    dev = C.c_int()
    out["device"] = cuda.cuDeviceGet(C.byref(dev), 0)
    ctx = C.c_void_p()
    out["ctx"] = cuda.cuCtxCreate_v2(C.byref(ctx), 0, dev)
    free, total = C.c_size_t(), C.c_size_t()
    out["meminfo"] = cuda.cuMemGetInfo_v2(C.byref(free), C.byref(total))
    out["total_mib"], out["free_mib"] = total.value // MIB, free.value // MIB
    ptr = C.c_uint64()
    out["alloc_free"] = cuda.cuMemAlloc_v2(C.byref(ptr), C.c_size_t(free.value))
    more = C.c_uint64()
    out["alloc_one_more_mib"] = cuda.cuMemAlloc_v2(C.byref(more), C.c_size_t(MIB))
    nvml = C.CDLL("libnvidia-ml.so.1")
    out["nvml_init"] = nvml.nvmlInit_v2()
    handle = C.c_void_p()
    out["nvml_handle"] = nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(handle))
    class Memory(C.Structure):
        _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]
    mem = Memory()
    out["nvml_meminfo"] = nvml.nvmlDeviceGetMemoryInfo(handle, C.byref(mem))
    out["nvml_total_mib"] = mem.total // MIB
    count, name = C.c_uint(), C.create_string_buffer(96)
    nvml.nvmlDeviceGetCount_v2(C.byref(count))
    out["cards"] = [name.value.decode() for i in range(count.value)
                    if nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(handle)) == 0
                    and nvml.nvmlDeviceGetUUID(handle, name, 96) == 0]
    try:  # a read-only root filesystem keeps the log line only
        with open("@PROBE_FILE@.new", "w") as f:
            f.write(json.dumps(out))
        os.rename("@PROBE_FILE@.new", "@PROBE_FILE@")
    except OSError:
        pass
    print("PROBE " + json.dumps(out), flush=True)
    while True:
        time.sleep(3600)
''').replace("@PROBE_FILE@", PROBE_FILE)


# `egpu demo`'s right-sizing step (issue 26): input 01's Deployment (two replicas of 24000 MiB
# and 50% compute) on the real node, in its own namespace, each replica holding BASE_MIB and
# touching SPIKE_MIB more for SPIKE_S every PERIOD_S: a peak that a 15 s scrape mostly
# misses and the region's high-water mark keeps. Frees on SIGTERM (see PROBE).
RIGHTSIZING_SOURCE = "01-vllm-online.yaml"
RIGHTSIZING_NAMESPACE = "rightsizing"
PATTERN = {"BASE_MIB": "3000", "SPIKE_MIB": "3000", "PERIOD_S": "20", "SPIKE_S": "2"}
# The probes' allocations (PATTERN_PROBE, the e2e tests' probes): alloc(mib) keeps what it got
# in `held`, and SIGTERM frees all of it and exits (why: see PROBE).
HELD_ALLOCATIONS = textwrap.dedent('''
    import ctypes as C, os, signal
    MIB = 1 << 20
    cuda = C.CDLL("libcuda.so.1")
    held = []
    def release(*_):
        for p in held:
            cuda.cuMemFree_v2(p)
        os._exit(0)
    signal.signal(signal.SIGTERM, release)
    def alloc(mib):
        p = C.c_uint64()
        rc = cuda.cuMemAlloc_v2(C.byref(p), C.c_size_t(mib * MIB))
        if rc == 0:
            held.append(p)
        return rc
''')
PATTERN_PROBE = HELD_ALLOCATIONS + textwrap.dedent('''
    import time
    cuda.cuInit(0)
    dev, ctx = C.c_int(), C.c_void_p()
    cuda.cuDeviceGet(C.byref(dev), 0)
    cuda.cuCtxCreate_v2(C.byref(ctx), 0, dev)
    print("PATTERN base", alloc(int(os.environ["BASE_MIB"])), flush=True)
    while True:
        time.sleep(float(os.environ["PERIOD_S"]))
        if alloc(int(os.environ["SPIKE_MIB"])) == 0:
            time.sleep(float(os.environ["SPIKE_S"]))
            cuda.cuMemFree_v2(held.pop())
''')


def prerequisite_missing() -> str:
    """Why a real node cannot run here, or "" (root, runc, the CNI plugins, the binaries)."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces, cgroups)"
    if not shutil.which("runc") or not Path(realnode.CNI_BIN_DIR, "bridge").exists():
        return "runc or the CNI plugins are missing (make system-deps)"
    missing = [b for b in ("kubelet", "containerd", "kube-proxy") if b in devbuild.missing()]
    if missing:
        return f"{', '.join(missing)} not built (make k8s)"
    return ""


def start(state_dir: Path, info: devcluster.ClusterInfo, config_file: Path,
          start_process: Callable[[str, list[str], dict[str, str]], ProcessInfo],
          dra: bool = False) -> realnode.RealNode:
    """Add the real node (tainted), install the hook and the interposer on it, and start its
    node agent (``start_process(name, argv, env)`` records it with the demo's processes).
    Returns once the agent has registered the device plugin (the node offers egpu.io/gpu), or
    with ``dra`` (``--dra --no-device-plugin``, as the manifests/dra component runs it) once
    the node's ResourceSlices are published and the kubelet registered the DRA plugin."""
    node = realnode.add(info, name=NAME, taints=(TAINT,))
    install = Path(node.node_dir) / "usr-local-egpu"
    (install / "lib").mkdir(parents=True, exist_ok=True)
    (install / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(INTERPOSER, install / "lib" / "libegpu_interpose.so")
    hook = install / "bin" / "egpu-hook"
    subprocess.run([sys.executable, "-m", "runtime_hook.bundle", str(hook)], check=True,
                   cwd=REPO, capture_output=True)
    kubeconfig = state_dir / "real-node.kubeconfig"
    pki = Path(info.state_dir) / "pki"
    kubeconfig.write_text(devcluster.kubeconfig_text(
        f"https://{realnode.HOST_LINK_IP}:{info.ports['kube-apiserver']}", pki / "ca.crt",
        pki / "admin.crt", pki / "admin.key", "egpu-dev-admin"))
    driver = Path(node.node_dir) / "driver"
    agent = node.nsenter_argv(
        str(Path(sys.executable).parent / "egpu-node-agent"), "--node-name", NAME,
        "--kubeconfig", str(kubeconfig), "--config", str(config_file),
        "--nvml-library", str(driver / "lib" / "libnvidia-ml.so.1"),
        "--metrics-port", str(AGENT_METRICS_PORT), "--heartbeat-seconds", "10",
        *(("--dra", "--no-device-plugin") if dra else ()))
    proc = start_process(f"node-agent-{NAME}", agent, {
        "FAKEGPU_CONFIG": str(driver / "cards.ini"), "FAKEGPU_STATE_DIR": str(driver / "state")})
    log = Path(proc.log)
    # the log is appended to: only this agent's lines count (a Python agent needs seconds to
    # get that far, so nothing of this run's is missed)
    log_start = log.stat().st_size if log.exists() else 0

    def registered() -> bool:
        out = subprocess.run(info.kubectl_argv("get", "node", NAME, "-o", "json"),
                             capture_output=True, text=True, timeout=30).stdout
        return bool(out) and int(json.loads(out)["status"]["allocatable"].get(
            "egpu.io/gpu", "0")) > 0

    def dra_registered() -> bool:
        out = subprocess.run(info.kubectl_argv("get", "resourceslices", "-o", "json"),
                             capture_output=True, text=True, timeout=30).stdout
        published = bool(out) and any(
            s["spec"].get("driver") == DRA_DRIVER and s["spec"].get("nodeName") == NAME
            for s in json.loads(out)["items"])
        if not published or not log.exists():
            return False
        with log.open("rb") as lines:
            lines.seek(log_start)
            return DRA_REGISTERED in lines.read().decode(errors="replace")

    if dra:
        devcluster.wait_until("the real node's ResourceSlices and DRA kubelet plugin",
                              dra_registered, timeout=90, interval=1)
    else:
        devcluster.wait_until("the real node's device plugin", registered, timeout=90,
                              interval=1)
    return node


def workload(inputs: Path) -> dict[str, Any]:
    """Shared input 03 (a notebook with 25% of a card and 10% compute) as a real container on
    the real node: the same egpu resources, the demo's probe instead of Jupyter (the image is
    the locally built egpu image), a toleration and node selector for the real node."""
    pod = yaml.safe_load((inputs / "pods" / SOURCE).read_text())
    container = pod["spec"]["containers"][0]
    limits = {**container["resources"]["limits"], "cpu": PROBE_CPU, "memory": PROBE_MEMORY}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD, "namespace": NAMESPACE,
                     "annotations": pod["metadata"].get("annotations", {})},
        "spec": {
            "nodeSelector": {TAINT_KEY: "true"},
            "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": container["name"], "image": IMAGE_EGPU,
                            "command": ["python3", "-c", PROBE],
                            "resources": {"limits": limits}}],
        },
    }


def rightsizing_workload(inputs: Path) -> dict[str, Any]:
    """Input 01's Deployment (its egpu resources and annotations) on the real node, running
    PATTERN_PROBE in the locally built egpu image, in namespace RIGHTSIZING_NAMESPACE."""
    deployment = yaml.safe_load((inputs / "pods" / RIGHTSIZING_SOURCE).read_text())
    template = deployment["spec"]["template"]
    container = template["spec"]["containers"][0]
    limits = {**container["resources"]["limits"], "cpu": PROBE_CPU, "memory": PROBE_MEMORY}
    template["spec"] = {
        "nodeSelector": {TAINT_KEY: "true"},
        "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": container["name"], "image": IMAGE_EGPU,
                        "command": ["python3", "-c", PATTERN_PROBE],
                        "env": [{"name": k, "value": v} for k, v in PATTERN.items()],
                        "resources": {"limits": limits}}],
    }
    deployment["metadata"]["namespace"] = RIGHTSIZING_NAMESPACE
    return dict(deployment)


def probe(info: devcluster.ClusterInfo, timeout_s: float = 60.0) -> dict[str, Any]:
    """The probe's line from the real container's log; when it never printed, ``{"error":
    ...}`` with the last lines of its (previous) log, e.g. a crash."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        for previous in ((), ("--previous",)):
            logs = subprocess.run(info.kubectl_argv("logs", "-n", NAMESPACE, POD, *previous),
                                  capture_output=True, text=True, timeout=30).stdout
            for line in logs.splitlines():
                if line.startswith("PROBE "):
                    return dict(json.loads(line[len("PROBE "):]))
            last = logs.strip() or last
        time.sleep(1)
    return {"error": "\n".join(last.splitlines()[-3:]) or "no output"}
