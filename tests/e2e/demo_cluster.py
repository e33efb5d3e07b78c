"""What a demo run (demo.run.up) printed and the pods and nodes it left in its cluster: the
shared part of the demo tests (tests/e2e/test_demo.py, tests/e2e/test_demo_dra.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from demo import run as demo


class DemoCluster:
    """The demo's output (``text``) and its cluster's objects, read once through kubectl."""

    def __init__(self, state_dir: Path, lines: list[str]) -> None:
        self.state_dir = state_dir
        self.text = "\n".join(lines)
        info = demo.devcluster.ClusterInfo.load(state_dir / "cluster")
        self.kubectl = info.kubectl_argv
        self.pods = {p["metadata"]["name"]: p for p in self.get("pods", "-A")}
        self.nodes = {n["metadata"]["name"]: n for n in self.get("nodes")}

    def get(self, *args: str) -> list[dict[str, Any]]:
        """``kubectl get ARGS -o json``'s items."""
        out = subprocess.run(self.kubectl("get", *args, "-o", "json"), capture_output=True,
                             text=True, check=True).stdout
        return list(json.loads(out)["items"])

    def named(self, prefix: str) -> list[dict[str, Any]]:
        return [p for name, p in self.pods.items() if name.startswith(prefix)]
