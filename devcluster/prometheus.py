"""A real Prometheus for the local cluster (issue 26): built from its Go module at the version
pinned in devcluster/build.py, cached like the Kubernetes binaries, listening on loopback.

What it scrapes and evaluates comes from the install's own monitoring objects, so that the
dev cluster meets what a cluster with the Prometheus Operator would run:

- one scrape job per PodMonitor endpoint of
  manifests/monitoring/prometheus-operator/podmonitors.yaml, written the way the Operator
  writes it (job_name ``podMonitor/<namespace>/<name>/<index>``, its interval, path and
  honorLabels, the ``job`` label ``<namespace>/<name>``, the target's ``namespace``, ``pod``,
  ``container`` and ``endpoint`` labels). The Operator discovers the targets from the pods;
  in the dev cluster the node agents of the simulated nodes are host processes, not pods, so
  each job reads file_sd files that whoever starts an agent writes (``add_target``) with the
  labels its pod would have;
- the alert rules of manifests/monitoring/prometheus-operator/prometheusrule.yaml
  (``spec.groups``, as the Operator mounts them).

``attach(info)`` runs it as a process of the dev cluster (``down`` stops it) and records its
URL in the cluster's record (``ClusterInfo.prometheus_url``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from devcluster import build as buildmod
from devcluster import supervisor
from devcluster.cluster import ClusterInfo
from devcluster.errors import DevClusterError
from devcluster.net import HOST, free_port, http_ok

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "manifests" / "monitoring" / "prometheus-operator"
PODMONITORS = MONITORING / "podmonitors.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
PROCESS = "prometheus"
READY_TIMEOUT_S = 60.0
# Prometheus' own default is 1m; the PodMonitors say 15s: the global default only serves a
# job that states none.
GLOBAL_SCRAPE_INTERVAL = "15s"
EVALUATION_INTERVAL = "15s"


def load_documents(path: Path, kind: str) -> list[dict[str, Any]]:
    """The YAML documents of ``kind`` in ``path``."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == kind]


def job_label(podmonitor: dict[str, Any]) -> str:
    """The ``job`` label the Prometheus Operator gives a PodMonitor's targets when it names no
    ``jobLabel``: ``<namespace>/<name>``."""
    meta = podmonitor["metadata"]
    return f"{meta['namespace']}/{meta['name']}"


def scrape_configs(podmonitors: list[dict[str, Any]], targets_dir: Path) -> list[dict[str, Any]]:
    """Prometheus scrape_configs for ``podmonitors`` (module docstring): one job per
    podMetricsEndpoint, its targets read from ``<targets_dir>/<podmonitor>/*.json``."""
    jobs = []
    for monitor in podmonitors:
        meta = monitor["metadata"]
        for index, endpoint in enumerate(monitor["spec"]["podMetricsEndpoints"]):
            jobs.append({
                "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
                "honor_labels": bool(endpoint.get("honorLabels", False)),
                "scrape_interval": endpoint.get("interval", GLOBAL_SCRAPE_INTERVAL),
                "metrics_path": endpoint.get("path", "/metrics"),
                "scheme": endpoint.get("scheme", "http"),
                "file_sd_configs": [{"files": [str(targets_dir / meta["name"] / "*.json")],
                                     "refresh_interval": "5s"}],
                "relabel_configs": [
                    {"target_label": "job", "replacement": job_label(monitor)},
                    {"target_label": "endpoint", "replacement": str(endpoint.get("port", ""))},
                ],
            })
    return jobs


def rule_file(prometheus_rule: dict[str, Any]) -> dict[str, Any]:
    """The rule file a PrometheusRule becomes: its ``spec.groups``."""
    return {"groups": prometheus_rule["spec"]["groups"]}


def config(targets_dir: Path, rules_path: Path) -> dict[str, Any]:
    """The whole prometheus.yml."""
    return {
        "global": {"scrape_interval": GLOBAL_SCRAPE_INTERVAL,
                   "evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(rules_path)],
        "scrape_configs": scrape_configs(load_documents(PODMONITORS, "PodMonitor"),
                                         targets_dir),
    }


def home(state_dir: Path | str) -> Path:
    """Prometheus' folder in a dev cluster's state folder."""
    return Path(state_dir) / "prometheus"


def add_target(state_dir: Path | str, podmonitor: str, pod: str, address: str,
               container: str, namespace: str = "egpu-system") -> Path:
    """Have the job of PodMonitor ``podmonitor`` scrape ``address`` (host:port) as the pod
    ``namespace/pod``'s container ``container``; Prometheus reads the file within 5 s.
    Returns the file written."""
    folder = home(state_dir) / "targets" / podmonitor
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{pod}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [address], "labels": {
        "namespace": namespace, "pod": pod, "container": container}}]))
    os.replace(tmp, path)  # file_sd must never read half a file
    return path


def start(state_dir: Path | str, bin_dir: Path | None = None,
          timeout_s: float = READY_TIMEOUT_S) -> tuple[supervisor.ProcessInfo, str]:
    """Write the config and the rules, start Prometheus on a free loopback port and wait until
    /-/ready answers. Returns the process and its URL. Raises DevClusterError naming the log
    when it exits or is not ready in time."""
    root = home(state_dir)
    for monitor in load_documents(PODMONITORS, "PodMonitor"):  # file_sd watches each folder
        (root / "targets" / monitor["metadata"]["name"]).mkdir(parents=True, exist_ok=True)
    rules = root / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule_file(
        load_documents(PROMETHEUS_RULE, "PrometheusRule")[0]), sort_keys=False))
    config_path = root / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config(root / "targets", rules), sort_keys=False))
    port = free_port()
    binary = (bin_dir or buildmod.bin_dir()) / "prometheus"
    proc = supervisor.start(PROCESS, [
        str(binary), f"--config.file={config_path}", f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address={HOST}:{port}", "--web.enable-lifecycle",
        "--storage.tsdb.retention.time=1d", "--log.level=warn"], root / "prometheus.log",
        cwd=root)
    url = f"http://{HOST}:{port}"
    try:
        supervisor.wait_ready(proc, lambda: http_ok(f"{url}/-/ready"), f"GET {url}/-/ready",
                              timeout_s)
    except supervisor.ProcessFailed as exc:
        raise DevClusterError(str(exc)) from None
    return proc, url


def attach(info: ClusterInfo) -> str:
    """Start Prometheus beside the dev cluster of ``info`` (its state folder), record it in
    the cluster's record (``down`` stops it) and return its URL."""
    proc, url = start(info.state_dir, Path(info.bin_dir))
    info.processes[PROCESS] = proc
    info.prometheus_url = url
    info.save()
    return url
