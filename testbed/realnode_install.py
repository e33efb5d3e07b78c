"""Installing egpu on the real-node cluster and running share pods there (helpers of the
real-node e2e tests; no tests here).

The install is the user's: ``kubectl apply -k`` of a kustomization that names
``manifests/`` and overrides only the egpu image to the locally built tag, then the webhook's
TLS Secret and caBundle made with ``egpu certs`` as docs/operating.md says.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from demo import real_node
from devcluster import images as devimages

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = "egpu-system"
SHARE_NS = "ml-serving"
REAL_LABEL = "egpu.io/real-node"
READY_S = 240.0
# What a probe pod asks of the 2-core node, beside egpu's own pods (about 1.5 cores booked).
PROBE_CPU = real_node.PROBE_CPU
PROBE_MEMORY = real_node.PROBE_MEMORY
POD_START_S = 120.0

PROBE = real_node.PROBE  # the container's CUDA and NVML check (demo/real_node.py)
LOG_LOST_AFTER_S = 20.0  # a probe's log line missing this long: read its file (then as often)
HELD_ALLOCATIONS = real_node.HELD_ALLOCATIONS  # alloc(mib), freed on SIGTERM


# The published images the manifests and the chart name -> the dev images `make image` builds.
LOCAL_IMAGES = {"ghcr.io/egpu/egpu": devimages.IMAGE_EGPU,
                "ghcr.io/egpu/egpu-kube-scheduler": devimages.IMAGE_SCHEDULER}


def helm_image_values() -> dict[str, dict[str, str]]:
    """The chart's ``images`` values that run the dev images."""
    egpu_repo, _, egpu_tag = devimages.IMAGE_EGPU.rpartition(":")
    scheduler_repo, _, scheduler_tag = devimages.IMAGE_SCHEDULER.rpartition(":")
    return {"egpu": {"repository": egpu_repo, "tag": egpu_tag},
            "scheduler": {"repository": scheduler_repo, "tag": scheduler_tag}}


def kustomization(out_dir: Path) -> Path:
    """A kustomization naming manifests/ with egpu's images overridden to the dev ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes only relative paths; a kustomization folder may lie above
        "resources": [os.path.relpath(REPO / "manifests", out_dir)],
        "images": [{"name": name, "newName": ref.rpartition(":")[0],
                    "newTag": ref.rpartition(":")[2]} for name, ref in LOCAL_IMAGES.items()],
    }))
    return out_dir


def egpu_cli(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"egpu {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout


def create_webhook_tls(cluster: Any, work: Path) -> Path:
    """``egpu certs create`` and the Secret egpu-webhook-tls (docs/operating.md)."""
    certs = work / "webhook-certs"
    egpu_cli("certs", "create", "--service", "egpu-webhook", "--namespace", NAMESPACE,
             "--out", str(certs))
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("-n", NAMESPACE, "delete", "secret", "egpu-webhook-tls",
                    "--ignore-not-found")
    cluster.kubectl("-n", NAMESPACE, "create", "secret", "tls", "egpu-webhook-tls",
                    f"--cert={certs / 'tls.crt'}", f"--key={certs / 'tls.key'}")
    return certs / "ca.crt"


def inject_ca(cluster: Any, ca: Path) -> None:
    egpu_cli("certs", "inject-ca", "--ca", str(ca), "--kubeconfig", cluster.kubeconfig,
             "--name", "egpu-webhook")


def wait_installed(cluster: Any, timeout: float = READY_S, nodes: tuple[str, ...] = ()) -> None:
    """Every egpu Deployment and the DaemonSet rolled out (their pods Ready), and ``nodes``
    (default: the cluster's real node) offering their slots again (``wait_slots``)."""
    deadline = time.monotonic() + timeout
    for what in ("deployment/egpu-webhook", "deployment/egpu-scheduler",
                 "daemonset/egpu-node-agent"):
        left = max(5.0, deadline - time.monotonic())
        out = cluster.kubectl("-n", NAMESPACE, "rollout", "status", what,
                              f"--timeout={int(left)}s", check=False, timeout=left + 10)
        if "successfully rolled out" not in out:
            raise AssertionError(f"{what} not ready after {timeout:.0f}s:\n{out}\n"
                                 + describe_namespace(cluster))

    for node in nodes or ("",):
        wait_slots(cluster, timeout=max(10.0, deadline - time.monotonic()), node=node)


def _ready_since(obj: dict[str, Any]) -> str:
    """When the object's Ready condition last changed (RFC 3339, comparable as text)."""
    return next((c.get("lastTransitionTime", "") for c in obj["status"].get("conditions", [])
                 if c["type"] == "Ready"), "")


def wait_slots(cluster: Any, timeout: float = 90.0, node: str = "") -> None:
    """Wait until ``node`` (default: the cluster's real node) reports the device plugin's
    slots (and the agent's inventory) in a status written after its running node agent
    became Ready: a status from before (the old agent's slots, about to drop to 0) would let
    a pod in while the node offers none."""
    name = node or cluster.node.name
    # a named node: its own agent; else the first agent listed, as before the density waves
    # named nodes (the fresh-clone run of 0a2d923 failed four real-node tests after the
    # default path changed too; the cause is not found, so the default path is kept as it was)
    selector = ["--field-selector", f"spec.nodeName={name}"] if node else []
    agents = get_json(cluster, "pods", "-n", NAMESPACE, "-l",
                      "app.kubernetes.io/name=egpu-node-agent", *selector)["items"]
    if not agents:
        raise AssertionError(f"no egpu node agent pod on node {name}\n"
                             + describe_namespace(cluster))
    since = max(_ready_since(a) for a in agents) if node else _ready_since(agents[0])

    def serving() -> bool:
        node = get_json(cluster, "node", name)
        heartbeat = next((c.get("lastHeartbeatTime", "") for c in node["status"]["conditions"]
                          if c["type"] == "Ready"), "")
        return heartbeat > since \
            and int(node["status"]["allocatable"].get("egpu.io/gpu", "0")) > 0 \
            and "egpu.io/inventory" in node["metadata"].get("annotations", {})

    cluster.wait_for(f"the node agent's slots and inventory on {name}, reported after "
                     "the agent became Ready", serving, timeout=timeout, interval=1.0)


def describe_namespace(cluster: Any, namespace: str = NAMESPACE) -> str:
    pods = cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False)
    events = cluster.kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp",
                             check=False)
    return f"pods:\n{pods}\nevents (last 40 lines):\n" + "\n".join(events.splitlines()[-40:])


def share_pod(name: str, namespace: str, input_file: Path, node_label: str,
              overrides: dict[str, int] | None = None) -> dict[str, Any]:
    """The pod of a shared input's Deployment, on the real node, running the probe.

    Changed from the input, because a real 2-core, 24 GiB node cannot hold what a GPU server
    would: the image (the locally built egpu image), the command (the probe), cpu and memory
    (PROBE_CPU, PROBE_MEMORY instead of the input's). The egpu resources and annotations are
    the input's
    (``overrides`` replaces some of them, for the bursts)."""
    doc = yaml.safe_load(input_file.read_text())
    template = doc["spec"]["template"] if doc.get("kind") != "Pod" else doc
    meta = template.get("metadata", {})
    spec = template["spec"]
    container = spec["containers"][0]
    limits = {k: v for k, v in container["resources"]["limits"].items()
              if k.startswith(("egpu.io/", "volcano.sh/"))}
    limits.update(overrides or {})
    limits.update({"cpu": PROBE_CPU, "memory": PROBE_MEMORY})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {**meta.get("labels", {}), "egpu-e2e": "real-node"},
                     "annotations": meta.get("annotations", {})},
        "spec": {
            "nodeSelector": {node_label: "true"},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": container["name"], "image": devimages.IMAGE_EGPU,
                "command": ["python3", "-c", PROBE],
                "resources": {"limits": limits},
            }],
        },
    }


def apply_json(cluster: Any, obj: dict[str, Any]) -> None:
    proc = subprocess.run(cluster.info.kubectl_argv("apply", "-f", "-"), input=json.dumps(obj),
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl apply failed: {proc.stdout}{proc.stderr}")


def get_json(cluster: Any, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json"))


class ProbeFilePacer:
    """When a reader waiting for a probe's log line reads its file instead: LOG_LOST_AFTER_S
    after ``start`` (the wait began, or the container first ran), then at most once every
    LOG_LOST_AFTER_S (each read is a kubectl exec, a runc exec on the node)."""

    def __init__(self) -> None:
        self._next: float | None = None

    def start(self, now: float) -> None:
        """The wait begins at ``now`` (time.monotonic()); later calls change nothing."""
        if self._next is None:
            self._next = now + LOG_LOST_AFTER_S

    def due(self, now: float) -> bool:
        """Whether to read the file at ``now``: never before ``start``."""
        if self._next is None or now < self._next:
            return False
        self._next = now + LOG_LOST_AFTER_S
        return True


def read_probe_file(kubectl: Callable[..., str], namespace: str, pod: str
                    ) -> dict[str, Any] | None:
    """The probe's result from its file in the container (``real_node.PROBE_FILE``, through
    ``kubectl exec``: ``kubectl(*args)`` gives its stdout); None while there is none."""
    try:
        return dict(json.loads(kubectl("-n", namespace, "exec", pod, "--", "cat",
                                       real_node.PROBE_FILE)))
    except (ValueError, TypeError):
        return None


def probe_result(cluster: Any, namespace: str, pod: str, timeout: float = POD_START_S
                 ) -> dict[str, Any]:
    """The probe's JSON line from the container's log (kubectl logs: apiserver -> kubelet),
    with the log's other lines under ``"log"`` (the interposer's errors: why CUDA was
    refused, when it was). When the log has had no such line for LOG_LOST_AFTER_S, the
    probe's file in the container (``PROBE_FILE``, kubectl exec) answers too: a containerd
    restart can cut a running container's output from its log (its ``"source"`` says
    ``exec`` then)."""
    pacer = ProbeFilePacer()
    pacer.start(time.monotonic())

    def result() -> dict[str, Any] | None:
        logs = cluster.kubectl("-n", namespace, "logs", pod, check=False)
        lines = logs.splitlines()
        for line in lines:
            if line.startswith("PROBE "):
                found = dict(json.loads(line[len("PROBE "):]))
                found["log"] = [other for other in lines if not other.startswith("PROBE ")]
                return found
        if not pacer.due(time.monotonic()):
            return None
        from_file = read_probe_file(lambda *args: cluster.kubectl(*args, check=False),
                                    namespace, pod)
        if from_file is not None:
            from_file["log"], from_file["source"] = lines, "exec"
        return from_file

    try:
        return dict(cluster.wait_for(f"probe output of {namespace}/{pod}", result,
                                     timeout=timeout, interval=1.0))
    except Exception as exc:
        raise AssertionError(f"{exc}\n{container_diagnosis(cluster, namespace, pod)}\n"
                             f"{describe_namespace(cluster, namespace)}\n--- egpu-system:"
                             f"\n{describe_namespace(cluster)}\n--- the egpu scheduler's log:\n"
                             f"{scheduler_log_tail(cluster)}") from exc


def container_diagnosis(cluster: Any, namespace: str, pod: str) -> str:
    """What the node knows of the pod's first container, for a probe that said nothing: its
    state and log path in containerd (crictl inspect), the log file's last lines as the
    kubelet wrote them, and the container's processes (state, what they wait in). Tells a
    probe that hangs from one whose output never reached the log."""
    out = [f"--- the node's view of {namespace}/{pod}:"]
    try:
        body = get_json(cluster, "pod", "-n", namespace, pod)
        statuses = body.get("status", {}).get("containerStatuses") or [{}]
        cid = str(statuses[0].get("containerID", "")).split("//", 1)[-1]
        info = json.loads(cluster.node.crictl("inspect", cid)) if cid else {}
        state = (info.get("status") or {}).get("state")
        log_path = (info.get("status") or {}).get("logPath", "")
        pid = (info.get("info") or {}).get("pid", 0)
        out.append(f"container {cid[:13]}: state {state}, pid {pid}, log {log_path}")
        if log_path:
            lines = cluster.node.run("tail", "-n", "5", log_path, check=False).splitlines()
            out += [f"  log: {line[:300]}" for line in lines] or ["  log: (empty)"]
        if pid:
            tree = cluster.node.run("ps", "-o", "pid,stat,wchan:32,etime,args", "--ppid",
                                    str(pid), "-p", str(pid), check=False)
            out += [f"  ps: {line[:300]}" for line in tree.splitlines()]
    except Exception as exc:  # a diagnosis must not hide the failure it explains
        out.append(f"(no diagnosis: {exc!r})")
    return "\n".join(out)


def scheduler_log_tail(cluster: Any, lines: int = 30) -> str:
    """The last lines of every egpu-scheduler container's log (egpu-kube-scheduler)."""
    out = []
    for pod in get_json(cluster, "pods", "-n", NAMESPACE, "-l",
                        "app.kubernetes.io/name=egpu-scheduler")["items"]:
        for container in ("kube-scheduler",):
            text = cluster.kubectl("-n", NAMESPACE, "logs", pod["metadata"]["name"], "-c",
                                   container, f"--tail={lines}", check=False)
            out.append(f"[{pod['metadata']['name']}/{container}]\n{text}")
    return "\n".join(out)


def scrape(url: str, timeout: float = 5.0) -> str:
    """GET a metrics page; an https one without checking its certificate (egpu-kube-scheduler
    serves its /metrics with a self-signed one, as kube-scheduler does)."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
        return str(resp.read().decode())
