"""The DRA ShareConfig: one encoder and one decoder, clear refusals (egpu/dra/shareconfig.py)."""

from __future__ import annotations

from typing import Any

import pytest

from egpu.dra.shareconfig import ShareConfig, ShareConfigError


def test_parameters_decode_to_the_same_config() -> None:
    cfg = ShareConfig(priority="low", compute_policy="elastic", memory_oversubscription=True)
    assert ShareConfig.decode(cfg.parameters()) == cfg
    assert cfg.opaque()["driver"] == "gpu.egpu.io"


def test_fields_left_out_take_their_defaults() -> None:
    cfg = ShareConfig.decode({"apiVersion": "gpu.egpu.io/v1alpha1", "kind": "ShareConfig"})
    assert cfg == ShareConfig(
        priority="high", compute_policy="strict", memory_oversubscription=False
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"priority": "urgent"}, "ShareConfig.priority: 'urgent'; allowed: high, low"),
        (
            {"computePolicy": "loose"},
            "ShareConfig.computePolicy: 'loose'; allowed: strict, elastic",
        ),
        (
            {"memoryOversubscription": "yes"},
            "ShareConfig.memoryOversubscription: 'yes' is not a bool",
        ),
        ({"priority": 1}, "ShareConfig.priority: 1 is not a str"),
        ({"cores": 30}, "ShareConfig: unknown field 'cores'"),
        ({"kind": "Other"}, "ShareConfig.kind: 'Other'; allowed: ShareConfig"),
        ({"apiVersion": "gpu.egpu.io/v2"}, "ShareConfig.apiVersion: 'gpu.egpu.io/v2'"),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(change: dict[str, Any], named: str) -> None:
    parameters = {**ShareConfig().parameters(), **change}
    with pytest.raises(ShareConfigError, match="^" + named.replace("(", r"\(").replace(")", r"\)")):
        ShareConfig.decode(parameters)


def test_a_non_object_is_refused() -> None:
    with pytest.raises(ShareConfigError, match="list is not an object"):
        ShareConfig.decode([])
