"""The Helm path on the real node: ``helm install`` of charts/egpu (values: the local egpu
image and the webhook's caBundle, nothing else) reaches the same Ready state as the kustomize
install and runs the same share pod. Runs after the kustomize tests (file order): it removes
that install first, and its own at the end.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster import build as devbuild
from testbed import realnode_install as inst
from tests.e2e.conftest import RealCluster

pytestmark = pytest.mark.e2e

CHART = inst.REPO / "charts" / "egpu"
RELEASE = "egpu"
HELM_TIMEOUT_S = 300
UNINSTALL_TIMEOUT = "10m"  # docs/operating.md: the kubelet keeps a stopped plugin's capacity 5 min
UNINSTALL_TIMEOUT_S = 630


def _helm(cluster: RealCluster, home: Path, *args: str) -> str:
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "HELM_CACHE_HOME": str(home / "c"),
           "HELM_CONFIG_HOME": str(home / "f"), "HELM_DATA_HOME": str(home / "d")}
    proc = subprocess.run([str(devbuild.binary_path("helm")), *args], capture_output=True,
                          text=True, env=env, timeout=UNINSTALL_TIMEOUT_S
                          if args[:1] == ("uninstall",) else HELM_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed: {proc.stdout}{proc.stderr}")
    return proc.stdout


@pytest.fixture(scope="module")
def helm_installed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[RealCluster]:
    work = tmp_path_factory.mktemp("helm")
    kustomize = inst.kustomization(work / "kustomize")
    real_cluster.kubectl("delete", "-k", str(kustomize), "--ignore-not-found", "--wait=true",
                         "--timeout=180s", timeout=200)  # the kustomize install, if any
    ca = inst.create_webhook_tls(real_cluster, work)
    repo_ref, _, tag = inst.devimages.IMAGE_EGPU.rpartition(":")
    _helm(real_cluster, work, "install", RELEASE, str(CHART), "--namespace", inst.NAMESPACE,
          "--set", "namespace.create=false",
          "--set", f"images.egpu.repository={repo_ref}", "--set", f"images.egpu.tag={tag}",
          "--set", f"webhook.caBundle={base64.b64encode(ca.read_bytes()).decode()}")
    inst.wait_installed(real_cluster)
    real_cluster.ensure_namespace(inst.SHARE_NS)
    yield real_cluster
    # what the module made; kubectl's own timeout, so that a slow deletion is reported by the
    # next module's checks, not raised here
    real_cluster.kubectl("-n", inst.SHARE_NS, "delete", "pods", "-l", "egpu-e2e=real-node",
                         "--wait=true", "--timeout=110s", check=False, timeout=130)
    if RELEASE in _helm(real_cluster, work, "list", "--namespace", inst.NAMESPACE, "-q").split():
        _helm(real_cluster, work, "uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait",
              "--timeout", UNINSTALL_TIMEOUT)


def test_helm_lint_is_clean(real_cluster: RealCluster, tmp_path: Path) -> None:
    out = _helm(real_cluster, tmp_path, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out


def test_helm_install_brings_every_part_ready_on_the_real_node(
        helm_installed: RealCluster, tmp_path: Path) -> None:
    status = _helm(helm_installed, tmp_path, "status", RELEASE, "--namespace", inst.NAMESPACE)
    assert "STATUS: deployed" in status
    pods = inst.get_json(helm_installed, "pods", "-n", inst.NAMESPACE)["items"]
    assert len(pods) == 5, [p["metadata"]["name"] for p in pods]  # 2 webhook, 2 scheduler, agent
    for pod in pods:
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "True", pod["metadata"]["name"]


def test_helm_installed_share_pod_sees_exactly_its_share(helm_installed: RealCluster) -> None:
    name = "chat-serving-helm"
    pod = inst.share_pod(name, inst.SHARE_NS,
                         helm_installed.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL)
    inst.apply_json(helm_installed, pod)
    result = inst.probe_result(helm_installed, inst.SHARE_NS, name)
    live = inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, name)
    assert live["spec"]["schedulerName"] == "egpu-scheduler"
    assert "egpu.io/allocation" in live["metadata"]["annotations"]
    assert result["total_mib"] == 24000 and result["nvml_total_mib"] == 24000, result
    assert result["alloc_free"] == 0 and result["alloc_one_more_mib"] == 2, result


# --- day two: upgrade with a values file, bad values, a bad ConfigMap (issue 22) ----------------
OVERSUBSCRIBED_MIB = 140000  # an 81559 MiB card books it at ratio 2.0, not at the default 1.5


def _values(cluster: RealCluster, work: Path, **config: object) -> Path:
    """The values file docs/operating.md's upgrade command takes (the caBundle: the one the
    install put into the MutatingWebhookConfiguration)."""
    import yaml

    repo_ref, _, tag = inst.devimages.IMAGE_EGPU.rpartition(":")
    registration = inst.get_json(cluster, "mutatingwebhookconfiguration", "egpu-webhook")
    path = work / "egpu-values.yaml"
    path.write_text(yaml.safe_dump({
        "namespace": {"create": False},
        "images": {"egpu": {"repository": repo_ref, "tag": tag}},
        "webhook": {"caBundle": registration["webhooks"][0]["clientConfig"]["caBundle"]},
        "logLevel": "DEBUG",
        "config": config,
    }))
    return path


def _metrics(cluster: RealCluster, selector: str, port: int) -> list[str]:
    return [inst.scrape(f"http://{p['status']['podIP']}:{port}/metrics")
            for p in inst.get_json(cluster, "pods", "-n", inst.NAMESPACE, "-l", selector)["items"]
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")]


def _rolled(cluster: RealCluster) -> None:
    for what in ("deployment/egpu-scheduler", "daemonset/egpu-node-agent",
                 "deployment/egpu-webhook"):
        cluster.kubectl("-n", inst.NAMESPACE, "rollout", "status", what, "--timeout=300s",
                        timeout=310)
    inst.wait_slots(cluster)


def _config_lines(cluster: RealCluster) -> list[str]:
    """`kubectl egpu`'s config lines (egpu top, as a user runs it): one per node whose agent
    said which config it runs."""
    proc = subprocess.run([sys.executable, "-m", "cli.main", "top", "--kubeconfig",
                           cluster.kubeconfig], capture_output=True, text=True, timeout=120,
                          cwd=inst.REPO, check=True)
    return [line for line in proc.stdout.splitlines() if " config " in line]


def _configmap_generation(cluster: RealCluster) -> str:
    from egpu.config import config_generation

    cm = inst.get_json(cluster, "configmap", "-n", inst.NAMESPACE, "egpu-config")
    return config_generation(cm["data"]["config.yaml"])


def test_helm_upgrade_with_a_values_file_applies_the_new_ratio_and_log_level(
        helm_installed: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    """docs/operating.md's upgrade: `helm upgrade -f values` (no --reuse-values) with a new
    oversubscription ratio and log level. The extender and the agents roll by themselves
    (config checksum), the next placement uses the new ratio, the running share pod keeps its
    share and its exporter series. Bugs caught: only the ConfigMap changed (the extender kept
    1.5 until a manual restart); a float from --set read as text crashed a restarting part."""
    home = tmp_path_factory.mktemp("helm-upgrade")
    before = inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, "chat-serving-helm")
    values = _values(helm_installed, home, memoryOversubscriptionRatio=2.0)
    _helm(helm_installed, home, "upgrade", RELEASE, str(CHART), "--namespace", inst.NAMESPACE,
          "-f", str(values), "--wait", "--timeout", "300s")
    _rolled(helm_installed)
    extender = [c for p in inst.get_json(helm_installed, "pods", "-n", inst.NAMESPACE, "-l",
                                         "app.kubernetes.io/name=egpu-scheduler")["items"]
                for c in p["spec"]["containers"] if c["name"] == "extender"]
    assert extender and all("--log-level=DEBUG" in c["command"] for c in extender)
    for text in _metrics(helm_installed, "app.kubernetes.io/name=egpu-scheduler", 8889):
        assert 'source="file"' in text and "egpu_config_info" in text, text[-500:]
    # `kubectl egpu` says the real node's agent runs the upgraded ConfigMap's config
    wanted = f"config {_configmap_generation(helm_installed)} (file)"
    helm_installed.wait_for("the agents' config lines at the new generation", lambda: (
        (lines := _config_lines(helm_installed)) and all(
            line.split(None, 1)[1] == wanted for line in lines)), timeout=90, interval=3.0)
    # the next placement books at 2.0: a share that 1.5 x 81559 MiB cannot hold
    pod = inst.share_pod("oversubscribed", inst.SHARE_NS,
                         helm_installed.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL,
                         overrides={"egpu.io/gpu-memory": OVERSUBSCRIBED_MIB})
    pod["metadata"]["annotations"]["egpu.io/memory-oversubscription"] = "true"
    pod["spec"]["containers"][0]["command"] = ["sleep", "3600"]
    inst.apply_json(helm_installed, pod)
    helm_installed.wait_for("the oversubscribed share bound", lambda: "egpu.io/allocation" in (
        inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, "oversubscribed")["metadata"]
        .get("annotations") or {}), timeout=60)
    after = inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, "chat-serving-helm")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    assert any('pod="chat-serving-helm"' in text and "egpu_container_memory_limit_bytes" in text
               for text in _metrics(helm_installed, "app.kubernetes.io/name=egpu-node-agent",
                                    9400))
    helm_installed.kubectl("-n", inst.SHARE_NS, "delete", "pod", "oversubscribed", "--wait=true",
                           timeout=90)


def test_a_bad_value_is_refused_by_helm_and_changes_nothing(
        helm_installed: RealCluster, tmp_path: Path) -> None:
    history = _helm(helm_installed, tmp_path, "history", RELEASE, "-n", inst.NAMESPACE)
    proc = subprocess.run(
        [str(devbuild.binary_path("helm")), "upgrade", RELEASE, str(CHART), "--namespace",
         inst.NAMESPACE, "--reuse-values", "--set", "config.memoryOversubscriptionRatio=0.5"],
        capture_output=True, text=True, timeout=HELM_TIMEOUT_S,
        env={**os.environ, "KUBECONFIG": helm_installed.kubeconfig,
             "HELM_CACHE_HOME": str(tmp_path / "c"), "HELM_CONFIG_HOME": str(tmp_path / "f"),
             "HELM_DATA_HOME": str(tmp_path / "d")})
    assert proc.returncode != 0 and "memoryOversubscriptionRatio" in proc.stderr, proc.stderr
    assert _helm(helm_installed, tmp_path, "history", RELEASE, "-n", inst.NAMESPACE) == history


def test_a_bad_configmap_edit_leaves_every_part_running_on_its_last_good_config(
        helm_installed: RealCluster) -> None:
    """A hand edit of egpu-config with a bad value, then the node agents rolled (new pods: the
    node keeps their last good config) and the extenders' containers restarted (as a crash
    or a liveness kill would: the pod's emptyDir keeps it): each comes back Ready on its
    last good config and says so (egpu_config_info source="last-good"). Bug caught: a
    restarting part went into a crash loop on the bad value."""
    cm = inst.get_json(helm_installed, "configmap", "-n", inst.NAMESPACE, "egpu-config")
    good = cm["data"]["config.yaml"]
    bad = good + "\nsharesPerCard: lots\n"
    helm_installed.kubectl("-n", inst.NAMESPACE, "patch", "configmap", "egpu-config",
                           "--type=merge", "-p", json.dumps({"data": {"config.yaml": bad}}))
    try:
        helm_installed.kubectl("-n", inst.NAMESPACE, "rollout", "restart",
                               "daemonset/egpu-node-agent")
        helm_installed.kubectl("-n", inst.NAMESPACE, "rollout", "status",
                               "daemonset/egpu-node-agent", "--timeout=300s", timeout=310)

        def files_updated() -> bool:  # the kubelet syncs ConfigMap volumes within a minute
            # the node's own extender containers (a host-wide pgrep also finds the extenders
            # of other lanes' real nodes, tests/lanes.py)
            containers = helm_installed.node.crictl("ps", "--name", "extender", "-q").split()
            return bool(containers) and all("lots" in helm_installed.node.crictl(
                "exec", cid, "cat", "/etc/egpu/config.yaml") for cid in containers)

        helm_installed.wait_for("the bad config in the extenders' volumes", files_updated,
                                timeout=120, interval=3.0)
        for cid in helm_installed.node.crictl("ps", "--name", "extender", "-q").split():
            helm_installed.node.crictl("stop", cid)

        def on_last_good(selector: str, port: int) -> bool:
            try:
                texts = _metrics(helm_installed, selector, port)
            except OSError:
                return False  # a container still restarting
            return bool(texts) and all('source="last-good"' in t for t in texts)

        for selector, port in (("app.kubernetes.io/name=egpu-node-agent", 9400),
                               ("app.kubernetes.io/name=egpu-scheduler", 8889)):
            helm_installed.wait_for(f"{selector} serving on its last good config",
                                    lambda s=selector, p=port: on_last_good(s, p), timeout=120,
                                    interval=2.0)
        # and `kubectl egpu` says so, beside the ConfigMap's (bad) generation
        kept = f"ConfigMap {_configmap_generation(helm_installed)}: the ConfigMap is bad"
        helm_installed.wait_for("the agents' config lines on the last good config", lambda: (
            (lines := _config_lines(helm_installed)) and all(
                "(last-good)" in line and kept in line for line in lines)),
            timeout=90, interval=3.0)
        restarts = {p["metadata"]["name"]: c.get("restartCount", 0)
                    for p in inst.get_json(helm_installed, "pods", "-n", inst.NAMESPACE)["items"]
                    for c in p["status"].get("containerStatuses", [])}
        assert all(n <= 1 for n in restarts.values()), f"a part restarting again: {restarts}"
    finally:
        helm_installed.kubectl("-n", inst.NAMESPACE, "patch", "configmap", "egpu-config",
                               "--type=merge", "-p", json.dumps({"data": {"config.yaml": good}}))
        helm_installed.kubectl("-n", inst.NAMESPACE, "rollout", "restart",
                               "deployment/egpu-scheduler", "daemonset/egpu-node-agent")
        _rolled(helm_installed)


# --- uninstall (last: it removes the install) ----------------------------------------------------
EGPU_NODE_FOLDERS = ("/var/run/egpu", "/var/run/egpu-node", "/usr/local/egpu")


def test_helm_uninstall_takes_egpu_off_the_node_and_leaves_share_pods_running(
        helm_installed: RealCluster, tmp_path: Path) -> None:
    """docs/operating.md's `helm uninstall` with a share pod running. Bugs caught: the node kept
    egpu's annotations, a 0 egpu.io/gpu capacity, /var/run/cdi/egpu.json, /var/run/egpu/*,
    /var/run/egpu-node/* and /usr/local/egpu after uninstall; an uninstall that killed the
    user's running pods."""
    cluster = helm_installed
    pod = inst.share_pod("survivor", inst.SHARE_NS,
                         cluster.inputs / "pods" / "01-vllm-online.yaml", inst.REAL_LABEL)
    pod["spec"]["containers"][0]["command"] = ["sleep", "3600"]
    inst.apply_json(cluster, pod)
    cluster.kubectl("-n", inst.SHARE_NS, "wait", "pod/survivor", "--for=condition=Ready",
                    "--timeout=120s", timeout=130)
    before = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, "survivor")
    node_before = inst.get_json(cluster, "node", cluster.node.name)
    assert "egpu.io/inventory" in node_before["metadata"]["annotations"]
    assert int(node_before["status"]["capacity"]["egpu.io/gpu"]) > 0
    assert cluster.node.run("ls", "-A", *EGPU_NODE_FOLDERS).split()  # something to remove

    try:
        _helm(cluster, tmp_path, "uninstall", RELEASE, "--namespace", inst.NAMESPACE, "--wait",
              "--timeout", UNINSTALL_TIMEOUT)
    except AssertionError as exc:  # say why: the Job's log and what is left
        raise AssertionError(f"{exc}\nthe hook Job's log:\n" + cluster.kubectl(
            "-n", inst.NAMESPACE, "logs", "job/egpu-uninstall", "--tail=40", check=False) +
            cluster.kubectl("-n", inst.NAMESPACE, "get", "pods,daemonsets,jobs", "-o", "wide",
                            check=False)) from None

    node = inst.get_json(cluster, "node", cluster.node.name)
    left = sorted(k for k in node["metadata"].get("annotations") or {} if k.startswith("egpu.io/"))
    assert left == [], f"egpu annotations left on the node: {left}"
    for part in ("capacity", "allocatable"):
        assert "egpu.io/gpu" not in node["status"][part], node["status"][part]
    listing = cluster.node.run("sh", "-c", "ls -A " + " ".join(EGPU_NODE_FOLDERS) +
                               " 2>/dev/null; ls /var/run/cdi 2>/dev/null", check=False)
    assert not [line for line in listing.split() if line and not line.endswith(":")
                and not line.startswith("nvidia")], f"left on the node:\n{listing}"
    jobs = cluster.kubectl("-n", inst.NAMESPACE, "get", "jobs,serviceaccounts", "-o", "name",
                           check=False)
    assert "egpu-uninstall" not in jobs, jobs
    after = inst.get_json(cluster, "pod", "-n", inst.SHARE_NS, "survivor")
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["status"]["phase"] == "Running"
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
