"""The shipped scheduler manifests: egpu-kube-scheduler with its plugin, and no Service."""

from __future__ import annotations

from pathlib import Path

import yaml

SCHEDULER = Path(__file__).resolve().parents[2] / "manifests" / "scheduler"


def _objects() -> list[dict]:
    return [o for f in sorted(SCHEDULER.glob("*.yaml")) for o in yaml.safe_load_all(f.read_text())
            if o and o.get("kind") != "Kustomization"]


def test_the_installed_scheduler_is_egpu_kube_scheduler_binding_with_its_plugin() -> None:
    """Bugs caught: the Deployment still running the stock kube-scheduler (which has no
    EgpuShares: every share pod Pending) or the extender beside it; the profile leaving an
    extension point to the extender, or DefaultBinder before the plugin (share pods bound
    without their allocation record)."""
    deployments = [o for o in _objects() if o["kind"] == "Deployment"]
    assert [d["metadata"]["name"] for d in deployments] == ["egpu-scheduler"]
    (container,) = deployments[0]["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("ghcr.io/egpu/egpu-kube-scheduler:")
    assert container["command"][0] == "egpu-kube-scheduler"
    config_map = next(o for o in _objects() if o["metadata"]["name"] == "egpu-scheduler-config")
    scheduler_config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert "extenders" not in scheduler_config
    assert scheduler_config["leaderElection"]["leaderElect"] is True
    (profile,) = scheduler_config["profiles"]
    plugins = profile["plugins"]
    for point in ("preFilter", "filter", "preScore", "score", "reserve", "permit"):
        assert [p["name"] for p in plugins[point]["enabled"]] == ["EgpuShares"], point
    assert [p["name"] for p in plugins["bind"]["enabled"]] == ["EgpuShares", "DefaultBinder"]
    assert plugins["bind"]["disabled"] == [{"name": "DefaultBinder"}]
    (args,) = [c["args"] for c in profile["pluginConfig"] if c["name"] == "EgpuShares"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert args["configFile"].rsplit("/", 1)[0] in mounts and args["configKeepDir"] in mounts


def test_no_service_exposes_the_extender() -> None:
    assert not [o for o in _objects() if o["kind"] == "Service"]
