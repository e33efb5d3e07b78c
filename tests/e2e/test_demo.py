"""`egpu demo` end to end: every workload lands where its comment says (issue 9).

Runs the real demo (its own control plane, egpu-kube-scheduler, webhook, node agents on the
fake GPU, a runc container) in a private state folder, checks the placement through the API,
and stops it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from demo import run as demo
from egpu.cluster_view import cluster_view
from egpu.records import Allocation, Inventory
from tests.e2e.demo_cluster import DemoCluster

pytestmark = pytest.mark.e2e


class Outcome(DemoCluster):
    """The device-plugin-mode demo's cluster (tests/e2e/demo_cluster.py)."""

    def cards(self, pod: dict[str, Any]) -> list[tuple[str, Any, Any]]:
        """(container, card model, share) for each card of the pod's allocation."""
        allocation = Allocation.decode(pod["metadata"]["annotations"]["egpu.io/allocation"])
        node = self.nodes[pod["spec"]["nodeName"]]
        inventory = Inventory.decode(node["metadata"]["annotations"]["egpu.io/inventory"])
        models = {c.uuid: c for c in inventory.cards}
        return [(c.name, models[s.uuid], s) for c in allocation.containers for s in c.cards]



@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcome]:
    state_dir = tmp_path_factory.mktemp("demo")
    lines: list[str] = []
    try:
        assert demo.up(demo.Options(state_dir=state_dir, say=lines.append, wait_s=120)) == 0
        yield Outcome(state_dir, lines)
    finally:
        demo.down(state_dir, say=lines.append)


def env_of(pod: dict[str, Any], container: str) -> dict[str, str]:
    spec = next(c for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])
                if c["name"] == container)
    return {e["name"]: e.get("value", "") for e in spec.get("env", [])}


def test_the_shares_are_placed_by_egpu_kube_scheduler_not_the_extender(
        outcome: Outcome) -> None:
    """The demo runs the scheduler egpu installs: egpu-kube-scheduler serving egpu-scheduler,
    and the dev cluster's own kube-scheduler serves default-scheduler only, so every placed
    share below was placed by the plugin. Bug caught: the demo still starting the retired
    Python extender (or the dev cluster's egpu-scheduler profile), so that what a new user
    watches place their pods is not what egpu installs."""
    started = {p["name"] for p in json.loads((outcome.state_dir / "processes.json").read_text())}
    assert "egpu-kube-scheduler" in started and "extender" not in started
    profiles = [p["schedulerName"] for p in yaml.safe_load(
        (outcome.state_dir / "cluster" / "scheduler-config.yaml").read_text())["profiles"]]
    assert profiles == ["default-scheduler"]
    placed = [p for p in outcome.pods.values()
              if p["spec"].get("schedulerName") == "egpu-scheduler" and p["spec"].get("nodeName")]
    assert len(placed) >= 8


def test_online_serving_on_h100_or_a100_with_its_share(outcome: Outcome) -> None:
    pods = [p for p in outcome.named("chat-serving-")
            if p["metadata"]["namespace"] == "ml-serving"]  # not the right-sizing copy
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["schedulerName"] == "egpu-scheduler"
        assert pod["metadata"]["labels"]["egpu.io/priority"] == "high"
        [(_, card, share)] = outcome.cards(pod)
        assert "H100" in card.model or "A100" in card.model
        assert (share.memory_mib, share.cores) == (24000, 50)


def test_offline_training_on_two_distinct_cards_never_a10(outcome: Outcome) -> None:
    [pod] = outcome.named("lora-finetune-")
    cards = outcome.cards(pod)
    assert len({card.uuid for _, card, _ in cards}) == 2
    assert all(card.model.split()[-1] != "A10" for _, card, _ in cards)
    assert all((s.memory_mib, s.cores) == (30000, 30) for _, _, s in cards)
    assert pod["metadata"]["labels"]["egpu.io/priority"] == "low"
    assert env_of(pod, "trainer")["EGPU_COMPUTE_POLICY"] == "elastic"


def test_notebook_books_a_quarter_of_its_card(outcome: Outcome) -> None:
    [(_, card, share)] = outcome.cards(outcome.pods["notebook-ana"])
    assert share.memory_mib == card.memory_mib * 25 // 100 and share.cores == 10


def test_two_containers_binpacked_on_one_card(outcome: Outcome) -> None:
    cards = outcome.cards(outcome.pods["retrieval"])
    assert {(name, s.memory_mib, s.cores) for name, _, s in cards} == {
        ("embedding", 4000, 10), ("reranker", 6000, 10)}
    assert len({card.uuid for _, card, _ in cards}) == 1


def test_oversubscribed_share_keeps_its_limit(outcome: Outcome) -> None:
    pod = outcome.pods["tts-day"]
    [(_, _, share)] = outcome.cards(pod)
    assert share.memory_mib == 32000
    assert env_of(pod, "tts")["EGPU_MEMORY_OVERSUBSCRIPTION"] == "true"


def test_fc07_init_container_books_the_max(outcome: Outcome) -> None:
    pod = outcome.pods["ocr-with-warmup"]
    assert pod["spec"]["schedulerName"] == "egpu-scheduler"
    views = cluster_view(list(outcome.nodes.values()), [pod])
    booked = [c.booked_mib for v in views for c in v.cards if c.shares]
    assert booked == [12000]


def test_volcano_names_rewritten_and_booked(outcome: Outcome) -> None:
    pod = outcome.pods["translate-small"]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert not any(k.startswith("volcano.sh/") for k in limits)
    [(_, _, share)] = outcome.cards(pod)
    assert (share.memory_mib, share.cores) == (3000, 30)


def test_pods_without_egpu_resources_are_left_alone(outcome: Outcome) -> None:
    gateway = outcome.pods["api-gateway"]
    assert gateway["spec"]["schedulerName"] == "default-scheduler"
    assert gateway["status"]["phase"] == "Running"
    assert "egpu.io/priority" not in (gateway["metadata"].get("labels") or {})
    native = outcome.pods["benchmark-whole-card"]
    assert native["spec"]["schedulerName"] == "default-scheduler"
    assert "egpu.io/allocation" not in (native["metadata"].get("annotations") or {})


def test_the_four_mistakes_are_denied_with_actionable_messages(outcome: Outcome) -> None:
    for name in ("bad-cores", "bad-both-memory", "bad-zero-percentage", "bad-priority"):
        assert name not in outcome.pods
    text = outcome.text
    assert "container 'c': egpu.io/gpu-cores='150' is not allowed (out of range)" in text
    assert "egpu.io/gpu-memory-percentage='50' is not allowed (egpu.io/gpu-memory=4000 is " \
        "given too)" in text
    assert "egpu.io/gpu-memory-percentage='0' is not allowed" in text
    assert "pod annotation egpu.io/priority='urgent' is not allowed; allowed: high, low" in text


def test_the_runc_container_sees_its_share(outcome: Outcome) -> None:
    if "runc container skipped" in outcome.text:
        pytest.fail("runc or root missing (`make demo` installs runc; run as root)")
    assert "cuMemGetInfo in the container: total 4096 MiB" in outcome.text
    assert "cuMemAlloc(8192 MiB) in the container: CUDA_ERROR_OUT_OF_MEMORY" in outcome.text


def test_placement_table_lists_every_share(outcome: Outcome) -> None:
    table = outcome.text.split("Placement (egpu shares, card by card):")[1]
    for name in ("chat-serving", "lora-finetune", "notebook-ana", "retrieval", "tts-day",
                 "ocr-with-warmup", "translate-small"):
        assert name in table


def test_the_allocation_cannot_be_edited(outcome: Outcome) -> None:
    """The demo installs the ValidatingAdmissionPolicy of the install: an edited
    egpu.io/allocation is refused (before, the edit went through and `egpu top` lost the
    share)."""
    [pod] = outcome.named("notebook-ana")
    meta = pod["metadata"]
    edit = subprocess.run(outcome.kubectl(
        "-n", meta["namespace"], "annotate", "pod", meta["name"], "--overwrite",
        'egpu.io/allocation={"version":1}'), capture_output=True, text=True)
    assert edit.returncode != 0 and "egpu.io/allocation" in edit.stderr, edit.stderr


def test_a_workload_runs_as_a_real_container_on_the_real_node(outcome: Outcome) -> None:
    """As root, the demo adds a real kubelet + containerd node; shared input 03 runs there and
    its container sees exactly its share. The table marks that row as real."""
    from demo import real_node

    if real_node.prerequisite_missing():
        pytest.fail(real_node.prerequisite_missing())
    pod = outcome.pods[real_node.POD]
    assert pod["spec"]["nodeName"] == real_node.NAME
    assert pod["status"]["phase"] == "Running"
    [(_, card, share)] = outcome.cards(pod)
    assert share.memory_mib == card.memory_mib * 25 // 100
    row = next(line for line in outcome.text.splitlines() if real_node.POD in line
               and real_node.NAME in line)
    assert row.rstrip().endswith("yes")
    assert f"total {share.memory_mib} MiB" in outcome.text
    assert "1 MiB more: CUDA_ERROR_OUT_OF_MEMORY" in outcome.text


# --- issue 26: the demo's real Prometheus --------------------------------------------------

DASHBOARD = demo.REPO / "charts" / "egpu" / "files" / "egpu-dashboard.json"
MIB = 1 << 20


def prometheus_url(outcome: Outcome) -> str:
    url = demo.devcluster.ClusterInfo.load(outcome.state_dir / "cluster").prometheus_url
    assert url, "the demo started no Prometheus"
    return str(url)


def query(url: str, path: str, **params: str) -> Any:
    import json
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}",
                                timeout=30) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]


def test_every_dashboard_query_returns_data_from_the_demos_prometheus(outcome: Outcome) -> None:
    """Each template variable's label_values() through the label API, then each panel's query
    with the variables as Grafana expands "All" (the values joined into a regex): every one
    returns series. Bugs caught: a metric renamed under the dashboard, a variable that lists
    nothing (every panel empty), the share panels filtered on a namespace label that
    Prometheus renamed (PodMonitor without honorLabels: exported_namespace)."""
    import json
    import re

    url = prometheus_url(outcome)
    dashboard = json.loads(DASHBOARD.read_text())
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)",
                                     variable["query"]).groups()  # type: ignore[union-attr]
        found = query(url, f"/api/v1/label/{label}/values", **{"match[]": metric})
        assert found, f"${variable['name']} lists nothing ({variable['query']})"
        # node and namespace names are DNS labels: nothing to escape in a regex (a PromQL
        # string would take a backslash as its own escape)
        values[variable["name"]] = "|".join(found)
    assert "rightsizing" in values["namespace"]  # the shares' namespaces, not egpu-system's
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], target["expr"])
            assert query(url, "/api/v1/query", query=expr)["result"], \
                f"panel {panel['title']!r}: no data for {target['expr']}"


def test_the_alert_rules_run_in_the_demos_prometheus_and_the_agents_are_up(
        outcome: Outcome) -> None:
    """Every rule of the PrometheusRule loaded and evaluated without error, the node agents
    scraped under the Operator's job label (so EgpuNodeAgentDown stays quiet). Bugs caught:
    a rule Prometheus cannot parse or evaluate (promtool's unit tests pass on what they are
    given), a job label the rule does not match."""
    url = prometheus_url(outcome)
    rules = [r for g in query(url, "/api/v1/rules")["groups"] for r in g["rules"]]
    assert len(rules) >= 9 and all(r["health"] == "ok" for r in rules), \
        [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    up = query(url, "/api/v1/query", query='up{job="egpu-system/egpu-node-agent"}')["result"]
    assert len(up) == len(outcome.nodes) and all(s["value"][1] == "1" for s in up), up
    alerts = query(url, "/api/v1/alerts")["alerts"]
    assert "EgpuNodeAgentDown" not in {a["labels"]["alertname"] for a in alerts}


def test_kubectl_egpu_advise_reads_the_real_prometheus(outcome: Outcome) -> None:
    """`kubectl egpu advise -o json` (the shipped command, its Prometheus reader and
    egpu-kube-scheduler's placement) on the demo's history. The right-sizing Deployment's
    replicas hold 3000 MiB and touch 3000 MiB more for 2 s every 20 s, so their peak is 3000 +
    3000 + the 256 MiB context (the fake driver's overhead), mostly between scrapes; the
    notebook allocated all of its share and was refused 1 MiB more. Bugs caught: a peak read
    from the scraped samples only (3256), the refused counter's first value lost (a new
    container's refusal before its first scrape: the notebook advised to shrink), rows per pod
    instead of per workload, the command unable to reach Prometheus or the cluster."""
    import json
    import math
    import os

    from demo import real_node

    url = prometheus_url(outcome)
    info = demo.devcluster.ClusterInfo.load(outcome.state_dir / "cluster")
    proc = subprocess.run(
        [str(demo.BIN / "kubectl-egpu"), "advise", "--prometheus", url, "--since", "10m",
         "--min-history", "30s", "--min-samples", "4", "-o", "json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "KUBECONFIG": info.kubeconfig})
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    rows = {(w["namespace"], w["kind"], w["name"]): w for w in report["workloads"]}
    serving = rows[(real_node.RIGHTSIZING_NAMESPACE, "Deployment", "chat-serving")]
    pattern = real_node.PATTERN
    peak = int(pattern["BASE_MIB"]) + int(pattern["SPIKE_MIB"]) + 256
    assert (serving["pods"], serving["usage"]["peak_mib"]) == (2, peak)
    assert serving["advice"]["memoryMiB"] == math.ceil(peak * 1.15 / 256) * 256
    assert serving["advice"]["verdict"] == "lower"
    notebook = rows[(real_node.NAMESPACE, "Pod", real_node.POD)]
    assert notebook["usage"]["refused"] >= 1 and notebook["advice"]["verdict"] == "raise", \
        notebook
    assert report["cards"]["freed"] >= 0 and report["cards"]["nodes"] == len(outcome.nodes)


def test_kubectl_egpu_advise_finds_the_prometheus_the_chart_names(outcome: Outcome) -> None:
    """With no --prometheus, the command reads the URL the chart's monitoring.prometheusURL
    writes (ConfigMap egpu-system/egpu-monitoring, made here as the chart makes it) and reads
    the same history. Bug caught: the value written under a name the command does not read,
    or the command falling back to the agents (the demo's agents are no pods: no rows with
    history)."""
    import json
    import os

    from demo import real_node
    from egpu.contract import MONITORING_CONFIG_MAP, MONITORING_PROMETHEUS_URL_KEY, NAMESPACE

    url = prometheus_url(outcome)
    info = demo.devcluster.ClusterInfo.load(outcome.state_dir / "cluster")
    env = {**os.environ, "KUBECONFIG": info.kubeconfig}
    subprocess.run(info.kubectl_argv("create", "namespace", NAMESPACE), capture_output=True)
    made = subprocess.run(info.kubectl_argv(
        "-n", NAMESPACE, "create", "configmap", MONITORING_CONFIG_MAP,
        f"--from-literal={MONITORING_PROMETHEUS_URL_KEY}={url}"), capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    proc = subprocess.run(
        [str(demo.BIN / "kubectl-egpu"), "advise", "-n", real_node.RIGHTSIZING_NAMESPACE,
         "--since", "10m", "--min-history", "30s", "--min-samples", "4", "-o", "json"],
        capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"Prometheus {url} (from {NAMESPACE}/{MONITORING_CONFIG_MAP}" in proc.stderr
    (row,) = json.loads(proc.stdout)["workloads"]
    assert row["name"] == "chat-serving" and row["usage"]["samples"] >= 4
