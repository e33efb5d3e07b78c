"""Experiment (issue 24): bench/scheduling.py with the egpu-scheduler profile served by
egpu-kube-scheduler, kube-scheduler with egpu's plugin EgpuShares (kube-scheduler/plugin), in
place of the extender.

    .venv/bin/python bench/experiments/plugin_ceiling/run.py [scheduling.py's args]

It first builds egpu-kube-scheduler from this checkout (``devcluster.build.plugin_scheduler``:
reused while its sources are the same). Until 2026-12-06 15:30 UTC this experiment built its
own plugin, EgpuCardFit (main.go, removed in the commit that moved it into
kube-scheduler/plugin); the results of those runs name it.

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
from devcluster import build, cluster  # noqa: E402
from devcluster.net import insecure_context  # noqa: E402

MARKER = "plugin://egpu-shares"


def plugin_config(kubeconfig: str) -> str:
    """The cluster's scheduler config (no extender) with EgpuShares in the egpu profile, its
    args the bench's egpu config (bench/scheduling.py)."""
    doc: dict[str, Any] = yaml.safe_load(cluster.scheduler_config(kubeconfig, None))
    doc["profiles"] = [
        cluster.plugin_profile(cluster.EGPU_SCHEDULER, {
            "sharesPerCard": scheduling.SHARES, "heartbeatTimeoutSeconds": 3600})
        if profile["schedulerName"] == cluster.EGPU_SCHEDULER else profile
        for profile in doc["profiles"]]
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
    binary = build.plugin_scheduler()
    state_dir = cluster.default_state_dir()
    started = not cluster.status(state_dir).up
    if started:
        cluster.up(cluster.Config(state_dir=state_dir))
    try:
        info = cluster.ClusterInfo.load(state_dir)
        original = list(info.processes["kube-scheduler"].argv)
        scheduling.ExtenderProcess = NoExtender  # type: ignore[attr-defined,assignment]
        # scheduling.devcluster is this module
        cluster.set_extender = restart_scheduler(binary, original)
        return scheduling.main(sys.argv[1:])
    finally:  # a cluster this run started goes with it (scheduling.py keeps one it found)
        if started:
            cluster.down(state_dir)


if __name__ == "__main__":
    raise SystemExit(main())
