"""The config cases of config_cases.yaml (its header says the format), run against
egpu.config.load_config: each file reads to the values written, or is refused with the words
written. kube-scheduler/config/config_test.go runs the same file against egpu-kube-scheduler's
reader, so that the Python parts and the scheduler accept and refuse the same files alike. Bug
caught: a key, default, bound or refusal's words changed on one side only.
"""

from __future__ import annotations

from dataclasses import fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml

from egpu.config import Config, ConfigError, Defaults, load_config

DOC: dict[str, Any] = yaml.safe_load(Path(__file__).with_name("config_cases.yaml").read_text())
CASES: list[dict[str, Any]] = DOC["cases"]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _plain(value: Any) -> Any:
    """A Config's value as the cases write it: enums as their strings, tuples as lists."""
    if isinstance(value, Defaults):
        return {"priority": str(value.priority), "computePolicy": str(value.compute_policy),
                "gpuPolicy": str(value.gpu_policy), "nodePolicy": str(value.node_policy)}
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def as_written(config: Config) -> dict[str, Any]:
    """Every key of ``config`` under its file name (camelCase)."""
    return {_camel(f.name): _plain(getattr(config, f.name))
            for f in fields(config)}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_each_config_reads_as_written(case: dict[str, Any]) -> None:
    assert set(case) == {"name", "text", "expect"}, sorted(case)
    expect = case["expect"]
    assert len(expect) == 1 and set(expect) <= {"config", "says", "yaml"}, sorted(expect)
    if "config" in expect:
        read = as_written(load_config(case["text"]))
        assert {k: read[k] for k in expect["config"]} == expect["config"]
        return
    with pytest.raises(ConfigError) as refused:
        load_config(case["text"])
    if "yaml" in expect:
        assert expect["yaml"] is True
        assert str(refused.value).startswith("config: not valid YAML ("), refused.value
    else:
        assert str(refused.value) == expect["says"]


def test_the_defaults_case_names_every_key() -> None:
    """Bug caught: a key added to Config that neither reader's cases check."""
    assert set(CASES[0]["expect"]["config"]) == set(as_written(Config()))


def test_case_names_are_unique() -> None:
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
