"""A card whose device node is missing on the host is unhealthy, and says so (issue 23).

Before: the CDI spec left a missing /dev/nvidia* out at INFO level and the card stayed
healthy, so pods were placed on a card no container could use; and the agent looked for the
nodes in its own container's /dev, which never has them on a real node unless privileged
mode copied them at start.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from devcluster.fake_toolkit import device_node_commands, device_nodes, make_device_nodes
from devcluster.realnode_config import dev_commands
from egpu.records import Card
from node_agent.devnodes import missing_card_nodes, present_under
from node_agent.main import CardState

CARDS = tuple(Card(uuid=f"GPU-{i}", index=i, model="NVIDIA A10", memory_mib=24576,
                   healthy=True) for i in range(3))


def _present(*paths: str) -> Callable[[str], bool]:
    return lambda path: path in paths


def test_a_missing_card_node_marks_only_that_card() -> None:
    present = _present("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia2")
    assert missing_card_nodes(CARDS, present) == {"GPU-1": ("/dev/nvidia1",)}


def test_a_missing_control_node_marks_every_card() -> None:
    present = _present("/dev/nvidia0", "/dev/nvidia1")
    assert missing_card_nodes(CARDS, present) == {
        "GPU-0": ("/dev/nvidiactl",), "GPU-1": ("/dev/nvidiactl",),
        "GPU-2": ("/dev/nvidiactl", "/dev/nvidia2")}


def test_missing_uvm_nodes_leave_the_cards_healthy() -> None:
    """nvidia-uvm is made on demand by nvidia-modprobe: its absence is no broken card."""
    present = _present("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2")
    assert missing_card_nodes(CARDS, present) == {}


def test_only_character_devices_under_the_dev_root_count(tmp_path: Path) -> None:
    make_device_nodes(tmp_path, 1)
    (tmp_path / "nvidia1").write_text("")  # a regular file is a broken setup, not a card
    present = present_under(str(tmp_path))
    assert present("/dev/nvidiactl") and present("/dev/nvidia0")
    assert not present("/dev/nvidia1") and not present("/dev/nvidia2")
    with pytest.raises(ValueError, match="not under /dev"):
        present("/etc/passwd")


def test_card_state_marks_and_clears_and_says_which_node(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    state = CardState(CARDS)
    with caplog.at_level(logging.WARNING, logger="egpu-node-agent"):
        assert state.set_missing_nodes({"GPU-1": ("/dev/nvidia1",)})
        assert [c.healthy for c in state.get()] == [True, False, True]
        assert "card GPU-1 (index 1): device node /dev/nvidia1 missing" in caplog.text
        assert not state.set_missing_nodes({"GPU-1": ("/dev/nvidia1",)})  # no change
        assert state.set_missing_nodes({})
    assert [c.healthy for c in state.get()] == [True, True, True]
    assert "card GPU-1: its device nodes are back" in caplog.text


def test_an_xid_stays_unhealthy_when_the_nodes_are_there() -> None:
    state = CardState(CARDS)
    state.mark_unhealthy("GPU-2")
    state.set_missing_nodes({})
    assert [c.healthy for c in state.get()] == [True, True, False]


def test_the_fake_gpu_provides_a_node_per_card_and_the_control_nodes(tmp_path: Path) -> None:
    names = [name for name, _, _ in device_nodes(2)]
    assert names == ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1"]
    make_device_nodes(tmp_path, 2)
    assert sorted(os.listdir(tmp_path)) == sorted(names)
    assert missing_card_nodes(CARDS[:2], present_under(str(tmp_path))) == {}
    # a real node's own /dev gets the same nodes, as character devices
    assert device_node_commands("/dev", 2)[-1] == "mknod -m 666 /dev/nvidia1 c 195 1"
    assert dev_commands(device_node_commands("/dev", 2))[-5:] == device_node_commands("/dev", 2)
