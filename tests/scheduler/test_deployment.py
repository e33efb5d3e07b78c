"""The shipped scheduler manifests keep the extender's verbs off the pod network."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import yaml

SCHEDULER = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"


def _objects() -> list[dict]:
    return [o for f in sorted(SCHEDULER.glob("*.yaml")) for o in yaml.safe_load_all(f.read_text())
            if o and o.get("kind") != "Kustomization"]


def test_the_extender_listens_on_loopback_beside_its_kube_scheduler() -> None:
    deployments = [o for o in _objects() if o["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == ["egpu-scheduler"]
    containers = {c["name"]: c for c in deployments[0]["spec"]["template"]["spec"]["containers"]}
    assert set(containers) == {"kube-scheduler", "extender"}
    command = containers["extender"]["command"]
    assert "--host=127.0.0.1" in command and "--metrics-port=8889" in command
    assert [p["containerPort"] for p in containers["extender"]["ports"]] == [8889]
    config_map = next(o for o in _objects() if o["metadata"]["name"] == "egpu-scheduler-config")
    scheduler_config = yaml.safe_load(config_map["data"]["config.yaml"])
    url = urlparse(scheduler_config["extenders"][0]["urlPrefix"])
    assert (url.hostname, url.port) == ("127.0.0.1", 8888)
    assert scheduler_config["leaderElection"]["leaderElect"] is True


def test_no_service_exposes_the_extender() -> None:
    assert not [o for o in _objects() if o["kind"] == "Service"]
