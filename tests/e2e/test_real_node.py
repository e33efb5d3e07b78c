"""egpu installed for real on a real node: kubelet v1.37 + containerd 2.x + runc, the fake GPU
as the node's cards, everything above the driver real.

The install is ``kubectl apply -k`` of manifests/ with only the egpu image overridden to the
locally built tag; a share pod (shared input 01 on the real node) is admitted by the installed
webhook, placed by the installed egpu-scheduler, allocated by the real kubelet through the
node agent's device plugin, and gets the interposer through CDI (containerd 2.x) and,
separately, through the OCI-hook route (a RuntimeClass whose handler has the hook in its base
spec); inside it the probe sees exactly its share and gets CUDA_ERROR_OUT_OF_MEMORY one step
past it.
"""

from __future__ import annotations

import concurrent.futures
import json
import re

import pytest

from egpu.contract import METRIC_CONTAINER_MEMORY_LIMIT
from egpu.records import Allocation
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
NVML_SUCCESS = 0
SHARE_NS = inst.SHARE_NS
REAL_LABEL = inst.REAL_LABEL
BURST_PODS = 8
BURST_MIB = 2000


def test_real_node_runs_the_pinned_kubelet_and_containerd(real_cluster: RealCluster) -> None:
    node = inst.get_json(real_cluster, "node", real_cluster.node.name)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://2.")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_cluster.node.ip
    assert node["metadata"]["labels"][REAL_LABEL] == "true"


def test_kustomize_install_brings_every_part_ready_on_the_real_node(
        installed: RealCluster) -> None:
    pods = inst.get_json(installed, "pods", "-n", inst.NAMESPACE)["items"]
    names = sorted(p["metadata"]["name"].rsplit("-", 2)[0] if "scheduler" in
                   p["metadata"]["name"] or "webhook" in p["metadata"]["name"]
                   else p["metadata"]["name"].rsplit("-", 1)[0] for p in pods)
    assert names.count("egpu-webhook") == 2, names
    assert names.count("egpu-scheduler") == 2, names
    assert names.count("egpu-node-agent") == 1, names
    for pod in pods:
        assert pod["spec"]["nodeName"] == installed.node.name
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True", pod["metadata"]["name"]
    node = inst.get_json(installed, "node", installed.node.name)
    assert int(node["status"]["allocatable"]["egpu.io/gpu"]) > 0  # the device plugin's slots
    assert "egpu.io/inventory" in node["metadata"]["annotations"]


def _run_share_pod(cluster: RealCluster, name: str, runtime_class: str | None = None
                   ) -> tuple[dict, dict]:
    pod = inst.share_pod(name, SHARE_NS, cluster.inputs / "pods" / "01-vllm-online.yaml",
                         REAL_LABEL)
    if runtime_class:
        pod["spec"]["runtimeClassName"] = runtime_class
    inst.apply_json(cluster, pod)
    result = inst.probe_result(cluster, SHARE_NS, name)
    live = inst.get_json(cluster, "pod", "-n", SHARE_NS, name)
    return result, live


def _assert_exact_share(result: dict, live: dict) -> None:
    assert live["spec"]["schedulerName"] == "egpu-scheduler"  # the installed webhook
    assert live["metadata"]["labels"]["egpu.io/priority"] == "high"
    allocation = json.loads(live["metadata"]["annotations"]["egpu.io/allocation"])
    assert allocation  # the installed scheduler's bind
    assert result["preload"].endswith("libegpu_interpose.so"), result
    assert result["config"] is True, result
    for call in ("init", "device", "ctx", "meminfo", "alloc_free", "nvml_init", "nvml_handle",
                 "nvml_meminfo"):
        assert result[call] == CUDA_SUCCESS, (call, result)
    assert result["total_mib"] == 24000, result
    assert result["nvml_total_mib"] == 24000, result
    assert result["alloc_one_more_mib"] == CUDA_ERROR_OUT_OF_MEMORY, result
    # the CDI spec gave the container its card's device node and the control nodes, and no
    # other card's (the agent sees the node's /dev: before, it looked in its own and left
    # every node out)
    cards = [n for n in result["dev_nodes"] if n.removeprefix("nvidia").isdigit()]
    assert len(cards) == 1, (result, allocation)  # the input asks for one card
    assert {"nvidiactl", "nvidia-uvm"} <= set(result["dev_nodes"]), result


def test_share_pod_sees_exactly_its_share_through_cdi(installed: RealCluster) -> None:
    result, live = _run_share_pod(installed, "chat-serving-cdi")
    _assert_exact_share(result, live)
    # The share came through CDI: the kubelet passed the device plugin's CDI devices on.
    cid = live["status"]["containerStatuses"][0]["containerID"].split("//", 1)[1]
    spec = json.loads(installed.node.crictl("inspect", cid))
    text = json.dumps(spec)
    assert "egpu.io/gpu=" in text or "egpu-hook" in text, "no CDI device or hook in the spec"


# What `kubectl exec` runs in the share pod: NVML only (the pod's probe holds all of its share,
# so a new CUDA context would not fit): the cards it sees and the first one's memory.
EXEC_PROBE = """
import ctypes as C, json
nvml = C.CDLL("libnvidia-ml.so.1")
assert nvml.nvmlInit_v2() == 0
count, name, handle = C.c_uint(), C.create_string_buffer(96), C.c_void_p()
nvml.nvmlDeviceGetCount_v2(C.byref(count))
cards = [name.value.decode() for i in range(count.value)
         if nvml.nvmlDeviceGetHandleByIndex_v2(i, C.byref(handle)) == 0
         and nvml.nvmlDeviceGetUUID(handle, name, 96) == 0]
class Memory(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]
mem = Memory()
nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(handle))
nvml.nvmlDeviceGetMemoryInfo(handle, C.byref(mem))
print(json.dumps({"cards": cards, "total_mib": mem.total >> 20}))
"""


def test_a_process_kubectl_exec_starts_sees_the_same_cards_and_share(
        installed: RealCluster) -> None:
    """`kubectl exec` into the share pod: the new process gets containerd's copy of the
    container's environment, without what the (fake) toolkit added at create; it must still
    see the pod's card and its share. Bug caught: the fake driver, told nothing, showed its
    default card (a card outside the share) to exec'd processes."""
    live = inst.get_json(installed, "pod", "-n", SHARE_NS, "chat-serving-cdi")
    allocation = Allocation.decode(live["metadata"]["annotations"]["egpu.io/allocation"])
    uuids = [card.uuid for entry in allocation.containers for card in entry.cards]
    out = installed.kubectl("-n", SHARE_NS, "exec", "chat-serving-cdi", "--", "python3", "-c",
                            EXEC_PROBE, timeout=60)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen == {"cards": uuids, "total_mib": 24000}, (seen, allocation)


def test_exporter_shows_the_share_pods_memory_limit(installed: RealCluster) -> None:
    agent = inst.get_json(installed, "pods", "-n", inst.NAMESPACE, "-l",
                          "app.kubernetes.io/name=egpu-node-agent")["items"][0]
    text = inst.scrape(f"http://{agent['status']['podIP']}:9400/metrics")
    lines = [line for line in text.splitlines()
             if line.startswith(METRIC_CONTAINER_MEMORY_LIMIT) and "chat-serving-cdi" in line]
    assert lines, text[-3000:]
    assert float(lines[0].rsplit(" ", 1)[1]) == 24000 * (1 << 20)


def test_kubectl_egpu_advise_without_prometheus_reads_the_agents_window(
        installed: RealCluster) -> None:
    """Issue 26: `kubectl egpu advise` with no Prometheus reads each node agent's own window
    (GET /usage-history through the API server's pod proxy, as a user's kubeconfig reaches
    it). The share pod's probe allocated all of its 24000 MiB share and was refused 1 MiB
    more: its peak is 24000 MiB and the advice is to raise. Bugs caught: the window not
    served or not at the path the command asks, the agents not found by their labels, the
    proxy path without the metrics port, a refusal before the window's first sample lost."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    argv = [str(Path(sys.executable).parent / "kubectl-egpu"), "advise", "-n", SHARE_NS,
            "--min-history", "1s", "--min-samples", "1", "-o", "json"]
    env = {**os.environ, "KUBECONFIG": installed.kubeconfig}
    deadline = time.monotonic() + 90  # the agent samples every 15 s
    row: dict = {}
    while time.monotonic() < deadline:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        rows = {w["name"]: w for w in json.loads(proc.stdout)["workloads"]}
        row = rows.get("chat-serving-cdi", {})
        if (row.get("usage") or {}).get("samples", 0) >= 2:  # a span: two of the 15 s samples
            break
        time.sleep(3)
    assert (row.get("usage") or {}).get("samples", 0) >= 2, (proc.stdout, proc.stderr)
    assert (row["kind"], row["usage"]["peak_mib"]) == ("Pod", 24000)
    assert row["usage"]["refused"] >= 1 and row["advice"]["verdict"] == "raise", row


def test_share_pod_sees_exactly_its_share_through_the_oci_hook_route(
        installed: RealCluster) -> None:
    inst.apply_json(installed, {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                "metadata": {"name": "egpu-hook"}, "handler": "egpu-hook"})
    result, live = _run_share_pod(installed, "chat-serving-hook", runtime_class="egpu-hook")
    _assert_exact_share(result, live)
    installed.kubectl("-n", SHARE_NS, "delete", "pod", "chat-serving-hook", "--wait=true")


def test_deleting_a_share_pod_frees_its_booking_and_its_files(installed: RealCluster) -> None:
    live = inst.get_json(installed, "pod", "-n", SHARE_NS, "chat-serving-cdi")
    uid = live["metadata"]["uid"]
    runtime = installed.node.host_path("/var/run/egpu")
    assert any(uid in str(p) for p in runtime.rglob("*")), "no files of the pod on the node"
    installed.kubectl("-n", SHARE_NS, "delete", "pod", "chat-serving-cdi", "--wait=true",
                      timeout=90)
    installed.wait_for("the pod's files removed from the node",
                       lambda: not any(uid in str(p) for p in runtime.rglob("*")), timeout=60)
    # The booking is free again, in the node agent's view ...
    agent = inst.get_json(installed, "pods", "-n", inst.NAMESPACE, "-l",
                          "app.kubernetes.io/name=egpu-node-agent")["items"][0]
    text = inst.scrape(f"http://{agent['status']['podIP']}:9400/metrics")
    booked = [float(m.group(1)) for m in
              re.finditer(r"^egpu_card_memory_booked_bytes\{[^}]*\} (\S+)$", text, re.M)]
    assert booked and sum(booked) == 0.0, text[-2000:]
    # (the installed scheduler's books follow the pod's deletion from its informer: its
    # replicas' scale to 0 and back, tests/e2e/test_plugin_scheduler_e2e.py)


def test_a_burst_of_share_pods_all_start_on_the_real_kubelet(installed: RealCluster) -> None:
    """The start-up race found by hand: Allocate can run before the node agent's watch has
    delivered the pod. Every pod of a burst must start (no 'no pod bound' refusals)."""
    names = [f"burst-{i}" for i in range(BURST_PODS)]
    source = installed.inputs / "pods" / "01-vllm-online.yaml"
    pods = [inst.share_pod(n, SHARE_NS, source, REAL_LABEL,
                           overrides={"egpu.io/gpu-memory": BURST_MIB, "egpu.io/gpu-cores": 5})
            for n in names]
    with concurrent.futures.ThreadPoolExecutor(BURST_PODS) as pool:
        list(pool.map(lambda p: inst.apply_json(installed, p), pods))
    failures = []
    for name in names:
        result = inst.probe_result(installed, SHARE_NS, name)
        if result["total_mib"] != BURST_MIB or result["alloc_one_more_mib"] != 2:
            failures.append((name, result))
    installed.kubectl("-n", SHARE_NS, "delete", "pods", "-l", "egpu-e2e=real-node",
                      "--wait=true", timeout=120)
    assert failures == []


def test_probe_script_is_valid_python() -> None:
    compile(inst.PROBE, "probe", "exec")
