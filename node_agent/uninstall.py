"""Removing egpu from the nodes (``helm uninstall``; docs/operating.md, "Removing egpu").

Two halves, both in the node agent's image:

- The agent, when it stops because its DaemonSet is being deleted in the foreground (the
  Job's way below; not a roll, not a restart of its pod, not a node shutdown, not a Helm
  upgrade that drops the DaemonSet: those never clean a node), removes what it put on its
  node: the node annotations it writes, its ResourceSlices, its CDI specs, the contents of the
  runtime and private folders and of the install folder (hook and interposer).
  ``daemonset_removed`` decides; ``remove_node_files`` and ``node_annotations_removal`` do it.
- The chart's pre-delete hook Job (``egpu-node-agent uninstall``, ``run_uninstall``) deletes
  the agent DaemonSets in the foreground, so that every agent stops while the agents' RBAC
  still exists (helm deletes the ClusterRoleBinding right after the DaemonSet otherwise), waits
  until they are gone, then removes the ``egpu.io/gpu`` capacity the kubelet keeps for a
  device plugin that stopped: the kubelet reports it for ``endpointStopGracePeriod`` (5 min,
  pkg/kubelet/cm/devicemanager), then sets it to 0 once and forgets it; the Job removes the
  key once it reads 0 (``capacity_removal``: a JSON patch that tests the 0 first, so that a
  plugin that registered again in between keeps its capacity).

Running share pods are not touched: their processes keep the interposer and the share they
mapped at start; their files on the node go, so a container of theirs cannot start again
with egpu (docs/operating.md says to drain them first).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from egpu.contract import (
    ANN_ALLOCATION_MODE,
    ANN_CONFIG,
    ANN_INVENTORY,
    ANN_INVENTORY_HEARTBEAT,
    ANN_USAGE,
    RES_GPU,
)

log = logging.getLogger(__name__)

FOREGROUND_DELETION = "foregroundDeletion"  # the finalizer of a foreground deletion
NODE_ANNOTATIONS = (ANN_INVENTORY, ANN_INVENTORY_HEARTBEAT, ANN_USAGE, ANN_ALLOCATION_MODE,
                    ANN_CONFIG)
AGENTS_GONE_WAIT_S = 120.0  # the agents' terminationGracePeriodSeconds (30 s) and then some
CAPACITY_WAIT_S = 360.0  # the kubelet's endpointStopGracePeriod (300 s) + a status update
POLL_INTERVAL_S = 2.0


def daemonset_removed(owner_uid: str, daemonset: Mapping[str, Any] | None) -> bool:
    """Whether the agent's own DaemonSet (uid ``owner_uid``) is being removed *with egpu*: a
    foreground deletion (deletionTimestamp and the ``foregroundDeletion`` finalizer, same uid),
    which the uninstall Job and docs/operating.md's kustomize commands make: the DaemonSet then
    stays until its agents have stopped. A DaemonSet that is simply gone (``daemonset`` None:
    404) is not: Helm deletes a DaemonSet an upgrade or rollback drops (the DRA pool's, handing
    its nodes to the other agent) in the background, and cleaning the node then would take the
    hook and every share's files from under running pods and the agent taking over. A
    DaemonSet of the same name with another uid is a new install, which takes the node over.
    An empty ``owner_uid`` (the pod has no DaemonSet owner, e.g. an agent started by hand)
    never counts as removal."""
    if not owner_uid or daemonset is None:
        return False
    meta = daemonset.get("metadata") or {}
    return (meta.get("uid") == owner_uid and bool(meta.get("deletionTimestamp"))
            and FOREGROUND_DELETION in (meta.get("finalizers") or ()))


def daemonset_owner(pod: Mapping[str, Any]) -> tuple[str, str]:
    """``(name, uid)`` of the pod's controlling DaemonSet owner reference, ``("", "")`` when
    it has none."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "DaemonSet" and ref.get("controller"):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return "", ""


def node_annotations_removal() -> dict[str, Any]:
    """The merge patch that removes the node annotations the agent writes."""
    return {"metadata": {"annotations": dict.fromkeys(NODE_ANNOTATIONS)}}


def _escape(name: str) -> str:
    """A JSON pointer token (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return name.replace("~", "~0").replace("/", "~1")


def capacity_removal(node: Mapping[str, Any], resource: str = RES_GPU
                     ) -> list[dict[str, Any]] | None:
    """The JSON patch (RFC 6902) for the node's status that removes ``resource`` from its
    capacity and allocatable, once the kubelet has forgotten it (capacity "0"); None while
    the kubelet still counts it (non-zero), or when the node has no such key."""
    status = node.get("status") or {}
    capacity = (status.get("capacity") or {}).get(resource)
    if capacity is None or str(capacity) != "0":
        return None
    token = _escape(resource)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/status/capacity/{token}", "value": "0"},
        {"op": "remove", "path": f"/status/capacity/{token}"},
    ]
    if resource in (status.get("allocatable") or {}):
        ops.append({"op": "remove", "path": f"/status/allocatable/{token}"})
    return ops


def _empty_folder(folder: str) -> list[str]:
    """Remove everything inside ``folder`` (the folder stays: it is a mount of the agent's);
    returns what could not be removed, with why."""
    left: list[str] = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return left
    except OSError as exc:
        return [f"{folder}: {exc}"]
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError as exc:
            left.append(f"{entry.path}: {exc}")
    return left


def remove_node_files(folders: Iterable[str], files: Iterable[str]) -> list[str]:
    """Empty each of ``folders`` and remove each of ``files`` (absent ones are fine); returns
    what could not be removed (empty when all went)."""
    left: list[str] = []
    for folder in folders:
        left += _empty_folder(folder)
    for path in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            left.append(f"{path}: {exc}")
    return left


def cdi_files(spec_dir: str) -> list[str]:
    """The agent's CDI specs in ``spec_dir``: egpu.json and every prepared claim's."""
    from node_agent.cdi import CLAIM_SPEC_PREFIX, SPEC_FILE_NAME

    try:
        names = os.listdir(spec_dir)
    except OSError:
        return []
    return [os.path.join(spec_dir, n) for n in sorted(names)
            if n == SPEC_FILE_NAME or (n.startswith(CLAIM_SPEC_PREFIX) and n.endswith(".json"))]


class Uninstaller:
    """The agent's half. ``owner``: the agent pod's DaemonSet ``(name, uid)``, read once at
    start (``from_pod``); ``removed()`` asks the API server at stop time."""

    def __init__(self, core_v1: Any, namespace: str, owner: tuple[str, str]) -> None:
        self.core_v1 = core_v1
        self.namespace = namespace
        self.owner = owner

    @classmethod
    def from_pod(cls, core_v1: Any, namespace: str, pod_name: str) -> Uninstaller:
        """Reads the agent's own pod; no owner (never removal) when it cannot be read."""
        try:
            pod = core_v1.api_client.sanitize_for_serialization(
                core_v1.read_namespaced_pod(pod_name, namespace))
        except Exception as exc:  # an agent that cannot read its pod just never cleans up
            log.warning("uninstall: cannot read my pod %s/%s (%s): the node is not cleaned "
                        "when the DaemonSet goes", namespace, pod_name, exc)
            return cls(core_v1, namespace, ("", ""))
        return cls(core_v1, namespace, daemonset_owner(pod))

    def removed(self) -> bool:
        """Whether this stop is the removal of egpu; False whenever unsure (an API error)."""
        name, uid = self.owner
        if not name:
            return False
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            found: Any = client.AppsV1Api(self.core_v1.api_client).read_namespaced_daemon_set(
                name, self.namespace)
            daemonset = self.core_v1.api_client.sanitize_for_serialization(found)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("uninstall: cannot read DaemonSet %s (%s): node kept", name, exc)
                return False
            daemonset = None
        except Exception as exc:
            log.warning("uninstall: cannot read DaemonSet %s (%s): node kept", name, exc)
            return False
        return daemonset_removed(uid, daemonset)


def clean_node(core_v1: Any, node: str, folders: Sequence[str], files: Sequence[str],
               withdraw_slices: Callable[[], None] | None) -> list[str]:
    """Remove egpu from this node (the agent's half); returns what is left, with why."""
    left = remove_node_files(folders, files)
    try:
        core_v1.patch_node(node, node_annotations_removal())
    except Exception as exc:
        left.append(f"node {node} annotations: {exc}")
    if withdraw_slices is not None:
        try:
            withdraw_slices()
        except Exception as exc:
            left.append(f"ResourceSlices of {node}: {exc}")
    return left


# --- the pre-delete hook Job ---------------------------------------------------------------

def _wait(done: Callable[[], bool], timeout_s: float, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> bool:
    deadline = clock() + timeout_s
    while True:
        if done():
            return True
        if clock() >= deadline:
            return False
        sleep(POLL_INTERVAL_S)


def _agent_nodes(core_v1: Any, apps_v1: Any, namespace: str, daemonsets: Sequence[str]
                 ) -> set[str]:
    """The nodes the agent DaemonSets' pods run on (only theirs get their capacity removed:
    a node whose egpu.io/gpu comes from elsewhere, such as a simulated one, is left alone)."""
    from kubernetes.client.exceptions import ApiException

    nodes: set[str] = set()
    for name in daemonsets:
        try:
            found = apps_v1.read_namespaced_daemon_set(name, namespace)
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise
        labels = found.spec.selector.match_labels or {}
        selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        for pod in core_v1.list_namespaced_pod(namespace, label_selector=selector).items:
            if pod.spec.node_name:
                nodes.add(pod.spec.node_name)
    return nodes


def run_uninstall(core_v1: Any, apps_v1: Any, namespace: str, daemonsets: Sequence[str],
                  agents_wait_s: float = AGENTS_GONE_WAIT_S,
                  capacity_wait_s: float = CAPACITY_WAIT_S) -> int:
    """Delete the agent DaemonSets (foreground), wait for them, then remove the kubelets'
    left-over ``egpu.io/gpu`` capacity on the nodes the agents ran on. Returns the exit
    status: 0 when everything went, 1 when something is left (logged, with what to run by
    hand)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    nodes = _agent_nodes(core_v1, apps_v1, namespace, daemonsets)
    for name in daemonsets:
        try:
            apps_v1.delete_namespaced_daemon_set(
                name, namespace, body=client.V1DeleteOptions(propagation_policy="Foreground"))
            log.info("deleting DaemonSet %s/%s (foreground)", namespace, name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def agents_gone() -> bool:
        for name in daemonsets:
            try:
                apps_v1.read_namespaced_daemon_set(name, namespace)
                return False
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return True

    if not _wait(agents_gone, agents_wait_s):
        log.error("the agent DaemonSets %s are still there after %.0f s", ", ".join(daemonsets),
                  agents_wait_s)
        return 1
    if capacity_wait_s <= 0:  # values.yaml: 0 does not wait (the key stays, at 0 after 5 min)
        log.info("agents gone from %s; not waiting for their kubelets to drop %s (capacity "
                 "wait 0): it reads 0 on each after 5 min and stays", ", ".join(sorted(nodes))
                 or "no node", RES_GPU)
        return 0
    log.info("agents gone from %s; waiting for their kubelets to drop %s",
             ", ".join(sorted(nodes)) or "no node", RES_GPU)

    def removed(name: str) -> bool:
        """Whether the node has no egpu.io/gpu capacity now (removed here if it could be)."""
        node = core_v1.api_client.sanitize_for_serialization(core_v1.read_node(name))
        if RES_GPU not in ((node.get("status") or {}).get("capacity") or {}):
            return True
        patch = capacity_removal(node)
        if patch is None:
            return False
        try:
            core_v1.patch_node_status(name, patch, _content_type="application/json-patch+json")
        except ApiException as exc:  # the test op failed: a plugin is back; read it again
            log.info("node %s: capacity not removed (%s)", name, exc.reason)
            return False
        log.info("node %s: %s capacity removed", name, RES_GPU)
        return True

    remaining = set(nodes)

    def capacity_gone() -> bool:
        remaining.difference_update({n for n in sorted(remaining) if removed(n)})
        return not remaining

    if not _wait(capacity_gone, capacity_wait_s):
        log.error("nodes still show %s capacity after %.0f s: %s; once their kubelet reads 0, "
                  "run: kubectl patch node NODE --subresource=status --type=json -p "
                  "'[{\"op\":\"remove\",\"path\":\"/status/capacity/egpu.io~1gpu\"}]'",
                  RES_GPU, capacity_wait_s, ", ".join(sorted(remaining)))
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="egpu-node-agent uninstall", description=run_uninstall.__doc__)
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "egpu-system"))
    p.add_argument("--daemonsets", default="egpu-node-agent,egpu-node-agent-dra",
                   help="comma list of the agent DaemonSets (default: %(default)s)")
    p.add_argument("--agents-wait-seconds", type=float, default=AGENTS_GONE_WAIT_S)
    p.add_argument("--capacity-wait-seconds", type=float, default=CAPACITY_WAIT_S,
                   help="how long to wait for the kubelets to drop egpu.io/gpu "
                        "(default: %(default)s; 0: do not wait)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``egpu-node-agent uninstall [options]``."""
    args = parser().parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s %(message)s")
    from kubernetes import client, config

    if args.kubeconfig:
        config.load_kube_config(args.kubeconfig)
    else:
        config.load_incluster_config()
    core_v1 = client.CoreV1Api()
    names = [n.strip() for n in args.daemonsets.split(",") if n.strip()]
    return run_uninstall(core_v1, client.AppsV1Api(core_v1.api_client), args.namespace, names,
                         args.agents_wait_seconds, args.capacity_wait_seconds)


if __name__ == "__main__":
    sys.exit(main())
