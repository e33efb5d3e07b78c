"""Experiment (issue 24), not shipped: bench/scheduling.py with the egpu-scheduler profile
served by a kube-scheduler that runs EgpuCardFit (main.go) in place of the extender.

    .venv/bin/python bench/experiments/plugin_ceiling/run.py [scheduling.py's args]

It first builds that kube-scheduler: main.go in the wrapper module that ``make k8s`` wrote
for k8s.io/kubernetes (its go.mod and go.sum, ``devcluster.build.write_wrapper``), with the
Go port of the placement (kube-scheduler/, this checkout's, by a replace directive), with
devcluster.build's Go environment and version flags, from the module cache only.

The bench runs as it is; only its two extender calls change: ``ExtenderProcess`` starts
nothing, and ``set_extender`` restarts the dev cluster's kube-scheduler as <bin> with the
plugin's profile (and, at the end, as the cluster's own binary with its own config).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from bench import scheduling  # noqa: E402
from devcluster import build, cluster  # noqa: E402
from devcluster.net import insecure_context  # noqa: E402

PLUGIN = "EgpuCardFit"
PORT_MODULE = "github.com/egpu/egpu/kube-scheduler"  # kube-scheduler/go.mod's module
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
                              "permit": {"enabled": on()},
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


def build_scheduler(out: Path) -> Path:
    """Build the kube-scheduler with EgpuCardFit into ``out`` (see the module's docstring)."""
    wrapper = build.version_dir() / "src" / "kubernetes"
    env = {**build.go_env(), "GOPROXY": "off"}  # the module cache only
    with tempfile.TemporaryDirectory(prefix="egpu-plugin-") as work:
        for name in ("go.mod", "go.sum"):
            shutil.copy(wrapper / name, Path(work) / name)
        with (Path(work) / "go.mod").open("a") as mod:  # the port, from this checkout
            mod.write(f"\nrequire {PORT_MODULE} v0.0.0\n"
                      f"replace {PORT_MODULE} => {REPO / 'kube-scheduler'}\n")
        shutil.copy(Path(__file__).with_name("main.go"), Path(work) / "main.go")
        subprocess.run([build.find_go(), "build", "-p", "2", "-trimpath",
                        f"-ldflags={build.k8s_version_ldflags()}", "-o", str(out), "."],
                       cwd=work, env=env, check=True)
    return out


def main() -> int:
    binary = build_scheduler(Path(tempfile.mkdtemp(prefix="egpu-plugin-bin-")) /
                             "kube-scheduler")
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
