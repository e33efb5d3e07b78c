"""docs/dra.md's settings a cluster admin should copy are what the dev cluster runs (and what
bench/scheduling.py measured them with). Bug caught: the documented KubeSchedulerConfiguration,
feature gate, GOGC or controller-manager limits drifting from devcluster/cluster.py's, so that
an admin copies settings no benchmark measured."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from devcluster import cluster

DOC = Path(__file__).resolve().parents[2] / "docs" / "dra.md"


def documented_block() -> str:
    """The YAML block of docs/dra.md that holds the KubeSchedulerConfiguration."""
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    (block,) = [b for b in blocks if "kind: KubeSchedulerConfiguration" in b]
    return block


def test_the_documented_scheduler_configuration_is_the_dev_clusters() -> None:
    doc: dict[str, Any] = yaml.safe_load(documented_block())
    assert doc["clientConnection"] == {"qps": cluster.SCHEDULER_CLIENT_QPS,
                                       "burst": 2 * cluster.SCHEDULER_CLIENT_QPS}
    assert doc["percentageOfNodesToScore"] == cluster.SCHEDULER_PERCENTAGE_OF_NODES_TO_SCORE


def test_the_documented_flags_and_environment_are_the_dev_clusters() -> None:
    block = documented_block()
    assert f"--feature-gates={cluster.SCHEDULER_FEATURE_GATES}" in block
    assert f"GOGC={cluster.SCHEDULER_GOGC}" in block
    assert (f"--kube-api-qps={cluster.CONTROLLER_MANAGER_QPS} "
            f"--kube-api-burst={2 * cluster.CONTROLLER_MANAGER_QPS}") in block
