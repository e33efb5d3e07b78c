"""What the real-node density modules share (test_real_node_density.py,
test_real_node_density_restarts.py; issue 21): a second real node with 4 cards beside the
session's (``second_node``, a session fixture both modules use), Deployments of share
pods and the checks that every replica runs with exactly its share.

Each case ends with every pod Running with exactly its share, as its probe sees it: the
cuMemGetInfo total equal to the share, one MiB past it CUDA_ERROR_OUT_OF_MEMORY, and NVML's
cards exactly the cards of its ``egpu.io/allocation``; no pod Failed or restarted; and after
the scale to 0, no file of a deleted pod left on the node.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from egpu.records import Allocation
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

SECOND_NODE = "egpu-real-1"
SECOND_CARDS = tuple((f"GPU-7e1e0001-0000-4000-8000-00000000000{i}", "NVIDIA H100 80GB HBM3",
                      81559, 0) for i in range(4))
SHARES_PER_CARD = 10  # manifests/base/config.yaml
SLOTS_PER_NODE = len(SECOND_CARDS) * SHARES_PER_CARD  # 40: the first node has 4 cards too
REPLICAS = 2 * SLOTS_PER_NODE  # every slot of both nodes
SHARE_MIB = 1000
CUDA_ERROR_OUT_OF_MEMORY = 2
START_S = 480.0  # 80 containers, each a Python probe, on the 2-core machine


@contextlib.contextmanager
def second_node_running(installed: RealCluster) -> Iterator[Any]:
    """A second real node with 4 cards; the installed DaemonSet's agent on it offers its 40
    slots before the block starts. Removed at its end (``second_node`` in
    tests/e2e/conftest.py: one for both density modules)."""
    from devcluster import realnode

    node = realnode.add(installed.info, name=SECOND_NODE, cards=SECOND_CARDS)

    def serving() -> bool:
        obj = inst.get_json(installed, "node", SECOND_NODE)
        return int(obj["status"].get("allocatable", {}).get("egpu.io/gpu", "0")) \
            == SLOTS_PER_NODE and "egpu.io/inventory" in obj["metadata"].get("annotations", {})

    try:
        installed.wait_for("the second node's agent serving its slots", serving, timeout=300,
                           interval=2.0)
        yield node
    finally:  # its pods go with their kubelet still there, then the node
        installed.kubectl("-n", inst.SHARE_NS, "delete", "pods", "--all", "--field-selector",
                          f"spec.nodeName={SECOND_NODE}", "--wait=true", "--timeout=120s",
                          check=False, timeout=150)
        realnode.remove(installed.info.state_dir, SECOND_NODE)


def delete_deployment(cluster: RealCluster, app: str) -> None:
    """Delete Deployment ``app`` and wait until every pod of it is gone (foreground cascade:
    the Deployment stays until its ReplicaSets and pods are deleted). A pod that does not go
    fails the test that made it, with the namespace's state, instead of blocking whatever runs
    next on the node (a replica left Terminating once failed the Helm module's teardown)."""
    in_flight = sys.exc_info()[1]  # called from a finally of a failing test
    cluster.kubectl("-n", inst.SHARE_NS, "delete", "deployment", app, "--cascade=foreground",
                    "--ignore-not-found", "--wait=true", "--timeout=240s", check=False,
                    timeout=260)
    try:
        cluster.wait_for(f"every pod of {app} gone", lambda: not inst.get_json(
            cluster, "pods", "-n", inst.SHARE_NS, "-l", f"app={app}")["items"],
            timeout=60, interval=2.0)
    except Exception as exc:
        state = f"{exc}\n{inst.describe_namespace(cluster, inst.SHARE_NS)}"
        if in_flight is not None:
            print(state)  # never hide the failure of the test itself
            return
        raise AssertionError(state) from exc


def deployment(name: str, replicas: int, pod: dict[str, Any]) -> dict[str, Any]:
    """A Deployment of ``replicas`` copies of ``pod`` (a share pod of realnode_install)."""
    template = copy.deepcopy(pod)
    labels = {**template["metadata"].get("labels", {}), "app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": inst.SHARE_NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": labels,
                                      "annotations": template["metadata"].get("annotations", {})},
                         "spec": template["spec"]},
        },
    }


def share_template(cluster: RealCluster, mib: int) -> dict[str, Any]:
    return inst.share_pod("x", inst.SHARE_NS, cluster.inputs / "pods" / "01-vllm-online.yaml",
                          inst.REAL_LABEL, overrides={"egpu.io/gpu-memory": mib,
                                                      "egpu.io/gpu-cores": 2})


def pods_of(cluster: RealCluster, app: str) -> list[dict[str, Any]]:
    return list(inst.get_json(cluster, "pods", "-n", inst.SHARE_NS, "-l", f"app={app}")["items"])


def broken(pod: dict[str, Any]) -> str:
    """Why a pod is not on its way to Running with its share ("" when it is)."""
    status = pod.get("status", {})
    if status.get("phase") == "Failed":
        return f"Failed: {status.get('reason')}: {status.get('message')}"
    for c in status.get("containerStatuses", []):
        waiting = c.get("state", {}).get("waiting", {})
        if c.get("restartCount", 0) or waiting.get("reason") in (
                "CrashLoopBackOff", "CreateContainerError", "RunContainerError"):
            return f"container {c['name']}: {waiting.get('reason')} {waiting.get('message', '')}"
    return ""


def wait_running(cluster: RealCluster, app: str, count: int) -> list[dict[str, Any]]:
    """All ``count`` pods of ``app`` Running; fails at once on a pod that cannot get there."""
    def running() -> list[dict[str, Any]] | None:
        pods = pods_of(cluster, app)
        bad = {p["metadata"]["name"]: why for p in pods if (why := broken(p))}
        if bad:
            raise AssertionError(f"pods that will not start with their share: {bad}\n"
                                 + inst.describe_namespace(cluster, inst.SHARE_NS))
        up = [p for p in pods if p.get("status", {}).get("phase") == "Running"
              and not p["metadata"].get("deletionTimestamp")]
        return up if len(up) == count and len(pods) == count else None

    try:
        return list(cluster.wait_for(f"{count} pods of {app} Running", running,
                                     timeout=START_S, interval=2.0))
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{inst.describe_namespace(cluster, inst.SHARE_NS)}\n"
                             f"{inst.scheduler_log_tail(cluster)}") from exc


def wrong_shares(cluster: RealCluster, pods: list[dict[str, Any]], mib: int) -> list[str]:
    """Each pod whose probe does not see exactly its share on exactly its cards."""
    wrong = []
    for pod in pods:
        name = pod["metadata"]["name"]
        record = Allocation.decode(pod["metadata"]["annotations"]["egpu.io/allocation"])
        probe = pod["spec"]["containers"][0]["name"]  # the app container runs the probe
        cards = sorted(next(c for c in record.containers if c.name == probe).uuids)
        result = inst.probe_result(cluster, inst.SHARE_NS, name, timeout=120)
        seen = (result["total_mib"], result["alloc_one_more_mib"],
                sorted(result.get("cards") or []))
        if seen != (mib, CUDA_ERROR_OUT_OF_MEMORY, cards):  # with all it saw: which call failed
            wrong.append(f"{name}: total/one-more/cards {seen}, placed {mib} MiB on {cards}; "
                         f"the probe: {json.dumps(result)}; the region's holders: "
                         f"{region_holders(cluster, pod, probe)}")
    return wrong


def every_card_full_and_every_share_exact(cluster: RealCluster, pods: list[dict[str, Any]]
                                          ) -> list[str]:
    """What is wrong with ``REPLICAS`` replicas of ``SHARE_MIB`` filling both nodes: each
    pod whose probe does not see exactly its share (``wrong_shares``), and the replicas per
    card unless each of the 8 cards has 10 (every slot: with 80 replicas on 80 slots, any
    other count means a card overbooked past its shares)."""
    per_card: dict[str, int] = {}
    for p in pods:
        for c in Allocation.decode(p["metadata"]["annotations"]["egpu.io/allocation"]).containers:
            for uuid in c.uuids:
                per_card[uuid] = per_card.get(uuid, 0) + 1
    wrong = wrong_shares(cluster, pods, SHARE_MIB)
    if sorted(per_card.values()) != [SHARES_PER_CARD] * (REPLICAS // SHARES_PER_CARD):
        wrong.append(f"replicas per card, {SHARES_PER_CARD} on each of the "
                     f"{REPLICAS // SHARES_PER_CARD} cards expected: {per_card}")
    return wrong


def region_holders(cluster: RealCluster, pod: dict[str, Any], container: str) -> list[str]:
    """Which host processes hold the container's accounting region open (pid, state, name,
    cgroup), and the region's process slots: what a wrong share is told apart by (a process
    of an earlier instance of the container still holding the share, or a stale slot)."""
    import os

    from devcluster import realnode
    from egpu.contract import container_dir_name, container_region_path
    from egpu.region_layout import PROC, PROC_SIZE, PROCS_OFFSET

    uid = pod["metadata"]["uid"]
    node = pod["spec"].get("nodeName", "")
    owner = cluster.node if node == cluster.node.name else realnode.RealNode.load(
        cluster.info.state_dir, node)
    path = owner.host_path(container_region_path(container_dir_name(uid, container)))
    out: list[str] = []
    try:
        info = os.stat(path)
        data = path.read_bytes()
    except OSError as exc:
        return [f"{path}: {exc}"]
    for i in range((len(data) - PROCS_OFFSET) // PROC_SIZE):
        pid, flags, start, *used = PROC.unpack_from(data, PROCS_OFFSET + i * PROC_SIZE)
        if pid:
            out.append(f"slot {i}: pid {pid} flags {flags} start {start} "
                       f"used {sum(used) >> 20} MiB")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                st = os.stat(fd)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (info.st_dev, info.st_ino):
                try:
                    status = (proc / "status").read_text()
                    state = re.search(r"State:\s*(.*)", status)
                    cgroup = (proc / "cgroup").read_text().strip().splitlines()[-1]
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:80]
                except OSError as exc:
                    out.append(f"pid {proc.name}: {exc}")
                    break
                out.append(f"pid {proc.name} holds it: {state.group(1) if state else '?'} "
                           f"{cmd!r} cgroup {cgroup}")
                break
    return out


def node_files(cluster: RealCluster) -> set[str]:
    """Pod uids that still have files on either node (allocation files, hook and region
    folders)."""
    from devcluster import realnode

    second = realnode.RealNode.load(cluster.info.state_dir, SECOND_NODE)
    uids = set()
    for node in (cluster.node, second):
        for base in ("/var/run/egpu-node/allocations", "/var/run/egpu-node/hook",
                     "/var/run/egpu/containers"):
            folder = Path(node.host_path(base))
            if folder.is_dir():
                uids |= {p.name.removesuffix(".json").split("_")[0] for p in folder.iterdir()}
    return uids


def scale(cluster: RealCluster, app: str, replicas: int) -> None:
    cluster.kubectl("-n", inst.SHARE_NS, "scale", f"deployment/{app}", f"--replicas={replicas}")
