"""The request cases of request_cases.yaml (its header says the format), run against
egpu.requests.read_pod with the default config: each pod reads to the shares written, or is
refused with the words written, or is not an egpu pod. kube-scheduler/plugin/demand_test.go runs
the same file against the plugin's reader, so that the extender and the plugin read pods
alike. Bug caught: a rule or a refusal's words changed on one side only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu.requests import read_pod

DOC: dict[str, Any] = yaml.safe_load(Path(__file__).with_name("request_cases.yaml").read_text())
CASES: list[dict[str, Any]] = DOC["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_pod_reads_as_written(case: dict[str, Any]) -> None:
    assert set(case) == {"name", "pod", "expect"}, sorted(case)
    expect = case["expect"]
    assert len(expect) == 1 and set(expect) <= {"none", "shares", "says"}, sorted(expect)
    reading = read_pod(case["pod"])
    if "none" in expect:
        assert expect["none"] is True and not reading.is_egpu_pod, reading
    elif "says" in expect:
        assert reading.request is None
        assert "; ".join(e.message for e in reading.errors) == expect["says"]
    else:
        assert reading.request is not None, [e.message for e in reading.errors]
        shares = []
        for c in reading.request.containers:
            memory = ({"memory_mib": c.share.memory_mib} if c.share.memory_mib is not None
                      else {"memory_percentage": c.share.memory_percentage})
            shares.append({"name": c.name, "kind": c.kind.value, "gpus": c.share.gpus,
                           **memory, "cores": c.share.cores})
        assert shares == expect["shares"]


def test_case_names_are_unique() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
