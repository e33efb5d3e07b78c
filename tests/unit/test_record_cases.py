"""The record cases of record_cases.yaml (its header says the format), run against
egpu.records, the one Python decoder of the allocation and inventory annotations: each text
decodes to the fields written (and an allocation encodes back to the text written, byte for
byte) or is refused with the words written. kube-scheduler/records/records_test.go runs the
same file against the Go port, so the two read and write the records alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu.records import Allocation, Inventory, RecordError

DOC: dict[str, Any] = yaml.safe_load(Path(__file__).with_name("record_cases.yaml").read_text())
CASES: list[dict[str, Any]] = DOC["cases"]


def allocation_fields(a: Allocation) -> dict[str, Any]:
    return {"node": a.node, "priority": a.priority, "compute_policy": a.compute_policy,
            "memory_oversubscription": a.memory_oversubscription,
            "containers": [{"name": c.name, "kind": c.kind, "init": c.init, "share": c.share,
                            "cards": [[s.uuid, s.index, s.memory_mib, s.cores]
                                      for s in c.cards]} for c in a.containers]}


def inventory_fields(inv: Inventory) -> dict[str, Any]:
    return {"cards": [{"uuid": c.uuid, "index": c.index, "model": c.model,
                       "memory_mib": c.memory_mib, "healthy": c.healthy,
                       "numa_node": c.numa_node, "driver_memory_limit": c.driver_memory_limit}
                      for c in inv.cards]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_record_reads_as_written(case: dict[str, Any]) -> None:
    assert set(case) <= {"name", "record", "text", "expect"}, sorted(case)
    expect = case["expect"]
    assert set(expect) <= {"decoded", "encoded", "error"}, sorted(expect)
    assert ("decoded" in expect) != ("error" in expect), "expect: decoded or error"
    decode = {"allocation": Allocation.decode, "inventory": Inventory.decode}[case["record"]]
    if "error" in expect:
        assert "encoded" not in expect and expect["error"], "error: a non-empty list of texts"
        with pytest.raises(RecordError) as caught:
            decode(case["text"])
        for text in expect["error"]:
            assert text in str(caught.value), f"{text!r} not in {str(caught.value)!r}"
        return
    record = decode(case["text"])
    if isinstance(record, Allocation):
        assert allocation_fields(record) == expect["decoded"]
        assert record.encode() == expect["encoded"]
    else:
        assert "encoded" not in expect, "the plugin writes no inventory"
        assert inventory_fields(record) == expect["decoded"]


def test_case_names_are_unique() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
