"""Golden answers for every shared pod input (../shared/inputs/pods): the exact patch,
warnings or denial. Workload objects are reviewed through their pod template as a Pod.

Regenerate after a deliberate change: ``EGPU_UPDATE_GOLDEN=1 pytest tests/webhook``, then
read the diff of tests/webhook/golden/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from egpu.config import Config

from .support import GOLDEN, admitted, answer, decoded_patch, input_pods

UPDATE = os.environ.get("EGPU_UPDATE_GOLDEN") == "1"


def _inputs() -> list[Path]:
    from tests.conftest import SHARED

    return sorted((SHARED / "inputs" / "pods").glob("*.yaml"))


def _readable(response: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in response.items() if k != "patch"}
    if "patch" in response:
        out["patch"] = decoded_patch(response)
    return out


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: p.stem)
def test_golden_answer(path: Path) -> None:
    got = [{"object": label, "response": _readable(answer(pod, Config()))}
           for label, pod in input_pods(path)]
    golden = GOLDEN / f"{path.stem}.json"
    if UPDATE or not golden.exists():
        golden.write_text(json.dumps(got, indent=2) + "\n")
        if not UPDATE:
            pytest.fail(f"golden {golden.name} was missing; written, check it in")
    assert got == json.loads(golden.read_text())


@pytest.mark.parametrize("path", _inputs(), ids=lambda p: p.stem)
def test_golden_inputs_patch_applies_and_second_pass_is_empty(path: Path) -> None:
    for _label, pod in input_pods(path):
        first = answer(pod)
        if not first["allowed"]:
            continue
        once = jsonpatch.apply_patch(pod, decoded_patch(first))
        assert once == admitted(pod)
        assert "patch" not in answer(once)


def test_every_input_has_a_golden() -> None:
    stems = {p.stem for p in _inputs()}
    if not stems:
        pytest.fail("shared inputs not found (set EGPU_SHARED_DIR)")
    assert stems <= {p.stem for p in GOLDEN.glob("*.json")}
