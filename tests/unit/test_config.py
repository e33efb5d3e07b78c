"""The YAML configuration: defaults, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from egpu.config import Config, ConfigError, load_config, load_config_keeping
from egpu.policies import Priority


def test_empty_is_defaults() -> None:
    assert load_config(None) == Config() == load_config("")
    assert Config().scheduler_name == "egpu-scheduler"


def test_full_config() -> None:
    config = load_config("""
schedulerName: my-egpu
defaults: {priority: low, computePolicy: elastic, gpuPolicy: spread, nodePolicy: spread}
priorityClasses: {online: high, batch: low}
sharesPerCard: 4
memoryOversubscriptionRatio: 2
coresOversubscriptionRatio: 1.5
ignoredNamespaces: [kube-system]
allowPrivileged: true
heartbeatTimeoutSeconds: 30
lowPriorityFloorPercent: 10
""")
    assert config.scheduler_name == "my-egpu" and config.defaults.gpu_policy == "spread"
    assert config.shares_per_card == 4 and config.memory_oversubscription_ratio == 2.0
    assert config.priority_classes == {"online": "high", "batch": "low"}
    assert config.low_priority_floor_percent == 10 and Config().low_priority_floor_percent == 0


def test_numbers_written_as_text_are_read_as_numbers() -> None:
    """``helm --set config.memoryOversubscriptionRatio=2.0`` renders "2.0" (Helm types only
    integers and booleans): read as 2.0, not refused (a restarting part fell into a crash
    loop on it)."""
    config = load_config("memoryOversubscriptionRatio: '2.0'\nsharesPerCard: ' 12 '\n"
                         "heartbeatTimeoutSeconds: '60'")
    assert (config.memory_oversubscription_ratio, config.shares_per_card,
            config.heartbeat_timeout_seconds) == (2.0, 12, 60)


@pytest.mark.parametrize(("text", "fragment"), [
    ("schedulerNam: x", "schedulerNam: unknown key"),
    ("defaults: {priority: urgent}", "defaults.priority: 'urgent'"),
    ("defaults: {colour: red}", "defaults.colour: unknown key"),
    ("sharesPerCard: 0", "sharesPerCard: 0 is out of range"),
    # a card's roster holds 32 shares: a 33rd container would fail to start (CardFullError)
    ("sharesPerCard: 33", "sharesPerCard: 33 is out of range; allowed: 1..32"),
    ("sharesPerCard: true", "sharesPerCard: True is not an integer"),
    ("memoryOversubscriptionRatio: 0.5", "memoryOversubscriptionRatio: 0.5 is out of range"),
    ("priorityClasses: {batch: medium}", "priorityClasses.batch: 'medium'"),
    ("resourceAliases: {x.io/a: egpu.io/nope}", "resourceAliases.x.io/a"),
    ("ignoredNamespaces: kube-system", "ignoredNamespaces"),
    ("allowPrivileged: 'yes'", "allowPrivileged"),
    ("lowPriorityFloorPercent: 101", "lowPriorityFloorPercent: 101 is out of range"),
    ("lowPriorityFloorPercent: 5.5", "lowPriorityFloorPercent: 5.5 is not an integer"),
    ("memoryOversubscriptionRatio: 'two'", "memoryOversubscriptionRatio: 'two' is not a number"),
    ("sharesPerCard: '1.5'", "sharesPerCard: '1.5' is not an integer"),
    ("memoryOversubscriptionRatio: '0.5'", "memoryOversubscriptionRatio: 0.5 is out of range"),
    ("[1, 2]", "config: expected a mapping"),
    ("a: [", "not valid YAML"),
    # bugs caught: the last of two equal keys won silently; a number or null as a
    # PriorityClass name was read as the text '1' or 'None'; nvidia.com/gpu (whole cards) was
    # accepted as an alias of a share
    ("allowPrivileged: false\nallowPrivileged: true", "key 'allowPrivileged' is given twice"),
    ("priorityClasses: {batch: low, batch: high}", "key 'batch' is given twice"),
    ("priorityClasses: {1: low}", "priorityClasses: key 1 is not allowed; allowed: a "
                                  "PriorityClass name"),
    ("priorityClasses: {null: high}", "priorityClasses: key None is not allowed"),
    ("resourceAliases: {nvidia.com/gpu: egpu.io/gpu}",
     "resourceAliases.nvidia.com/gpu: nvidia.com/gpu cannot be an alias"),
])
def test_errors_name_the_key(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(text)
    assert fragment in str(info.value)


def test_a_bad_config_after_a_good_one_runs_on_the_last_good_one(tmp_path: Path) -> None:
    """A hand-edited ConfigMap with a bad value must not take down a restarting part: it
    runs on the last config it loaded well, and says so (source, error, generation)."""
    path, keep = tmp_path / "config.yaml", tmp_path / "keep"
    path.write_text("sharesPerCard: 7\n")
    good = load_config_keeping(str(path), str(keep))
    assert (good.source, good.config.shares_per_card, good.error) == ("file", 7, "")
    path.write_text("sharesPerCard: 7\nmemoryOversubscriptionRatio: lots\n")
    fallen = load_config_keeping(str(path), str(keep))
    assert fallen.source == "last-good" and fallen.config.shares_per_card == 7
    assert "memoryOversubscriptionRatio" in fallen.error and fallen.generation == good.generation
    path.write_text("sharesPerCard: 9\n")
    fixed = load_config_keeping(str(path), str(keep))
    assert (fixed.source, fixed.config.shares_per_card) == ("file", 9)
    assert fixed.generation != good.generation


def test_a_part_that_never_had_a_good_config_refuses_to_start(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("sharesPerCard: none\n")
    with pytest.raises(ConfigError, match="sharesPerCard"):
        load_config_keeping(str(path), str(tmp_path / "keep"))


def test_a_yaml_merge_key_may_be_overridden() -> None:
    """``<<: *base`` then the same key is YAML's override, not a key given twice."""
    config = load_config("priorityClasses: {<<: {a: low, b: low}, a: high}")
    assert config.priority_classes == {"a": Priority.HIGH, "b": Priority.LOW}
