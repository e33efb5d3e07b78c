"""Experiment (issue 24), not shipped: bench/scheduling.py with the egpu-scheduler profile
served by a kube-scheduler that runs EgpuCardFit (main.go) in place of the extender.

    go build ... -o <bin> bench/experiments/plugin_ceiling   (see the header of main.go)
    .venv/bin/python bench/experiments/plugin_ceiling/run.py <bin> [scheduling.py's args]

The bench runs as it is; only its two extender calls change: ``ExtenderProcess`` starts
nothing, and ``set_extender`` restarts the dev cluster's kube-scheduler as <bin> with the
plugin's profile (and, at the end, as the cluster's own binary with its own config).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from bench import scheduling  # noqa: E402
from devcluster import cluster  # noqa: E402
from devcluster.net import insecure_context  # noqa: E402

PLUGIN = "EgpuCardFit"
MARKER = "plugin://egpu-card-fit"


def plugin_config(kubeconfig: str) -> str:
    """The cluster's scheduler config (no extender) with EgpuCardFit in the egpu profile."""
    doc: dict[str, Any] = yaml.safe_load(cluster.scheduler_config(kubeconfig, None))
    for profile in doc["profiles"]:
        if profile["schedulerName"] != cluster.EGPU_SCHEDULER:
            continue
        def on() -> list[dict[str, str]]:
            return [{"name": PLUGIN}]
        profile["plugins"] = {"preFilter": {"enabled": on()}, "filter": {"enabled": on()},
                              "score": {"enabled": on()}, "reserve": {"enabled": on()},
                              "bind": {"enabled": on(), "disabled": [{"name": "DefaultBinder"}]}}
        profile["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {
            "ignoredResources": [n for n, ignored in cluster.EXTENDER_MANAGED_RESOURCES
                                 if ignored]}}]
    return yaml.safe_dump(doc)


class NoExtender:
    url = MARKER

    def __init__(self, *_: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def restart_scheduler(binary: Path, original: list[str]) -> Any:
    def set_extender(info: Any, url: str | None, ca_file: Any = None) -> Any:
        state_dir = Path(info.state_dir)
        old = info.processes["kube-scheduler"]
        config = next(a.split("=", 1)[1] for a in old.argv if a.startswith("--config="))
        argv = list(original)
        if url == MARKER:
            argv[0] = str(binary)
            text = plugin_config(info.kubeconfig)
        else:
            text = cluster.scheduler_config(info.kubeconfig, url, ca_file)
        with cluster._locked(state_dir):
            Path(config).write_text(text)
            cluster._stop(old)
            starter = cluster._Starter(state_dir, 90.0)
            new = starter.start("kube-scheduler", argv, env=cluster.scheduler_env())
            health = f"https://{cluster.HOST}:{info.ports['kube-scheduler']}/healthz"
            starter.wait(new, cluster._answers_200(health, insecure_context()), health)
            info.processes["kube-scheduler"] = new
            info.extender_url = url if url != MARKER else None
            info.save()
        print(f"kube-scheduler: {argv[0]}", flush=True)
        return info
    return set_extender


def main() -> int:
    binary = Path(sys.argv[1]).resolve()
    state_dir = cluster.default_state_dir()
    if not cluster.status(state_dir).up:
        cluster.up(cluster.Config(state_dir=state_dir))
    info = cluster.ClusterInfo.load(state_dir)
    original = list(info.processes["kube-scheduler"].argv)
    scheduling.ExtenderProcess = NoExtender  # type: ignore[attr-defined,assignment]
    # scheduling.devcluster is this module
    cluster.set_extender = restart_scheduler(binary, original)
    return scheduling.main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
