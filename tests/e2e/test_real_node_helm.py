"""The Helm path on the real node: ``helm install`` of charts/egpu (values: the local egpu
image and the webhook's caBundle, nothing else) reaches the same Ready state as the kustomize
install and runs the same share pod; upgrades and bad values. Its own lane and real node
(tests/lanes.py); ``helm uninstall`` is begun by test_real_node_helm_uninstall.py, next in the
lane, and checked by test_real_node_helm_uninstalled.py.
"""

from __future__ import annotations

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
from tests.e2e.helm import CHART, HELM_TIMEOUT_S, RELEASE, install, uninstall_if_installed
from tests.e2e.helm import helm as _helm

pytestmark = pytest.mark.e2e

# Not waiting for the kubelets at uninstall (the module's teardown): that wait and what it
# removes are test_real_node_helm_uninstalled.py's; it would add 5 min here. The teardown's
# uninstall checks that 0 means no wait: the Job used to fail with it (exit 1 after one look),
# and helm uninstall with the Job.
NO_CAPACITY_WAIT = "uninstall.capacityWaitSeconds=0"


@pytest.fixture(scope="module")
def helm_installed(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[RealCluster]:
    work = tmp_path_factory.mktemp("helm")
    install(real_cluster, work, NO_CAPACITY_WAIT)
    yield real_cluster
    uninstall_if_installed(real_cluster, work)


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

    registration = inst.get_json(cluster, "mutatingwebhookconfiguration", "egpu-webhook")
    path = work / "egpu-values.yaml"
    path.write_text(yaml.safe_dump({
        "namespace": {"create": False},
        "images": inst.helm_image_values(),
        "webhook": {"caBundle": registration["webhooks"][0]["clientConfig"]["caBundle"]},
        "logLevel": "DEBUG",
        "config": config,
        "uninstall": {"capacityWaitSeconds": 0},  # NO_CAPACITY_WAIT, kept by the upgrade
    }))
    return path


SCHEDULER = ("app.kubernetes.io/name=egpu-scheduler", 10259, "https")  # egpu-kube-scheduler
AGENT = ("app.kubernetes.io/name=egpu-node-agent", 9400, "http")


def _metrics(cluster: RealCluster, selector: str, port: int, scheme: str = "http") -> list[str]:
    return [inst.scrape(f"{scheme}://{p['status']['podIP']}:{port}/metrics")
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
    oversubscription ratio and log level. The scheduler and the agents roll by themselves
    (config checksum), the next placement uses the new ratio, the running share pod keeps its
    share and its exporter series. Bugs caught: only the ConfigMap changed (the scheduler kept
    1.5 until a manual restart); a float from --set read as text crashed a restarting part."""
    home = tmp_path_factory.mktemp("helm-upgrade")
    before = inst.get_json(helm_installed, "pod", "-n", inst.SHARE_NS, "chat-serving-helm")
    values = _values(helm_installed, home, memoryOversubscriptionRatio=2.0)
    _helm(helm_installed, home, "upgrade", RELEASE, str(CHART), "--namespace", inst.NAMESPACE,
          "-f", str(values), "--wait", "--timeout", "300s")
    _rolled(helm_installed)
    scheduler = [c for p in inst.get_json(helm_installed, "pods", "-n", inst.NAMESPACE, "-l",
                                          SCHEDULER[0])["items"]
                 for c in p["spec"]["containers"] if c["name"] == "kube-scheduler"]
    assert scheduler and all("--v=4" in c["command"] for c in scheduler)  # DEBUG
    generation = _configmap_generation(helm_installed)
    for text in _metrics(helm_installed, *SCHEDULER):
        assert f'egpu_config_info{{generation="{generation}",part="scheduler",source="file"}} 1' \
            in text, text[-500:]
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
    node keeps their last good config) and the schedulers' containers restarted (as a crash
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

        def mounted_config(cid: str) -> str:
            """The config file as the container sees it, read on the node from its volume's
            host folder (the scheduler's image has no shell or cat to exec)."""
            mounts = json.loads(helm_installed.node.crictl("inspect", cid))["status"]["mounts"]
            folder = next(m["hostPath"] for m in mounts if m["containerPath"] == "/etc/egpu")
            return helm_installed.node.run("cat", f"{folder}/config.yaml", check=False)

        def files_updated() -> bool:  # the kubelet syncs ConfigMap volumes within a minute
            # the node's own scheduler containers (a host-wide pgrep also finds the schedulers
            # of other lanes' real nodes, tests/lanes.py)
            containers = helm_installed.node.crictl("ps", "--name", "kube-scheduler",
                                                    "-q").split()
            return bool(containers) and all("lots" in mounted_config(cid) for cid in containers)

        helm_installed.wait_for("the bad config in the schedulers' volumes", files_updated,
                                timeout=120, interval=3.0)
        for cid in helm_installed.node.crictl("ps", "--name", "kube-scheduler", "-q").split():
            helm_installed.node.crictl("stop", cid)

        def on_last_good(selector: str, port: int, scheme: str) -> bool:
            try:
                texts = _metrics(helm_installed, selector, port, scheme)
            except OSError:
                return False  # a container still restarting
            return bool(texts) and all('source="last-good"' in t for t in texts)

        for selector, port, scheme in (AGENT, SCHEDULER):
            helm_installed.wait_for(f"{selector} serving on its last good config",
                                    lambda s=selector, p=port, k=scheme: on_last_good(s, p, k),
                                    timeout=120, interval=2.0)
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
