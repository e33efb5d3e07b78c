"""egpu's CDI spec (node_agent.cdi): what the node agent and ``egpu cdi generate`` write, how
it is written, and how an NVIDIA Container Toolkit spec is found."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from node_fixtures import CARD_UUIDS

from cli.main import main as egpu
from egpu.records import Card, Inventory
from node_agent.cdi import (
    CdiPublisher,
    SpecFolders,
    cdi_spec,
    device_names,
    vendor_device_name,
    write_spec,
)
from node_agent.main import hook_args

HOOK = "/usr/local/egpu/bin/egpu-hook"
CARDS = tuple(Card(u, i, "NVIDIA A10", 24576) for i, u in enumerate(CARD_UUIDS[:2]))


def test_each_card_is_a_device_by_index_and_uuid_and_the_hook_runs_for_any() -> None:
    spec = cdi_spec(CARDS, HOOK)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", "egpu.io/gpu")
    assert [d["name"] for d in spec["devices"]] == ["0", CARD_UUIDS[0], "1", CARD_UUIDS[1],
                                                   "unallocated"]
    assert spec["devices"][3]["containerEdits"] == {
        "env": [f"EGPU_CDI_CARD_1={CARD_UUIDS[1]}"], "deviceNodes": [{"path": "/dev/nvidia1"}]}
    common = spec["containerEdits"]
    assert common["hooks"] == [{"hookName": "createRuntime", "path": HOOK,
                                "args": ["egpu-hook", "createRuntime"]},
                               {"hookName": "poststop", "path": HOOK,  # frees a raw share
                                "args": ["egpu-hook", "poststop"]}]
    assert [n["path"] for n in common["deviceNodes"]] == [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def test_device_nodes_missing_on_the_host_are_left_out() -> None:
    existing = {"/dev/nvidiactl", "/dev/nvidia0"}
    spec = cdi_spec(CARDS, HOOK, existing.__contains__)
    edits = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert edits["0"]["deviceNodes"] == [{"path": "/dev/nvidia0"}]
    assert "deviceNodes" not in edits["1"] and edits["1"]["env"]  # CDI needs some edit
    assert spec["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidiactl"}]
    none = cdi_spec(CARDS, HOOK, lambda _path: False)
    assert "deviceNodes" not in none["containerEdits"]
    assert all("deviceNodes" not in d["containerEdits"] for d in none["devices"])


def test_the_hook_gets_the_agents_folders_where_they_are_not_its_defaults() -> None:
    assert hook_args("/var/run/egpu", "/var/run/egpu-node") == []
    args = hook_args("/srv/run", "/var/run/egpu-node")
    assert args == ["--runtime-dir", "/srv/run"]
    spec = cdi_spec(CARDS, HOOK, hook_args=args)
    assert spec["containerEdits"]["hooks"][0]["args"] == [
        "egpu-hook", "--runtime-dir", "/srv/run", "createRuntime"]


def test_the_cli_writes_the_spec_the_agent_writes(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.json"
    inventory.write_text(Inventory(cards=CARDS).encode())
    out = tmp_path / "etc-cdi" / "egpu.json"
    assert egpu(["cdi", "generate", "--inventory", str(inventory), "--no-device-nodes",
                 "-o", str(out)]) == 0
    agent = CdiPublisher(str(tmp_path / "run-cdi"), [], HOOK, present=lambda _path: False)
    assert agent.publish(CARDS)
    assert out.read_text() == (tmp_path / "run-cdi" / "egpu.json").read_text()
    assert json.loads(out.read_text())["kind"] == "egpu.io/gpu"


def test_the_spec_file_is_replaced_atomically_and_only_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "cdi" / "egpu.json"
    old = os.umask(0o077)  # the file is 0644 whatever the umask
    try:
        assert write_spec(str(path), "one\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    inode = path.stat().st_ino
    assert not write_spec(str(path), "one\n")  # unchanged: not written again
    assert path.stat().st_ino == inode
    assert write_spec(str(path), "two\n")
    assert path.read_text() == "two\n" and path.stat().st_ino != inode  # a rename, not in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["egpu.json"]  # no temporary left


def test_a_spec_that_cannot_be_written_is_logged_and_names_no_device(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "cdi").write_text("")  # a file where the folder should be
    publisher = CdiPublisher(str(tmp_path / "cdi"), [], HOOK, present=lambda _path: False)
    with caplog.at_level(logging.WARNING, logger="node_agent.cdi"):
        assert not publisher.publish(CARDS)
    assert "cannot write the CDI spec" in caplog.text
    assert publisher.names([CARD_UUIDS[0]], CARDS) == []


@pytest.mark.parametrize(("names", "expected"), [
    ({CARD_UUIDS[1], "1", "all"}, CARD_UUIDS[1]),  # --device-name-strategy=uuid (and index)
    ({"0", "1", "all"}, "1"),  # index
    ({"gpu0", "gpu1", "all"}, "gpu1"),  # type-index
    ({"0", "all"}, None),  # a spec without this card
])
def test_the_nvidia_device_name_follows_nvidia_ctks_naming(names: set[str],
                                                          expected: str | None) -> None:
    assert vendor_device_name(CARD_UUIDS[1], 1, names) == expected


def test_allocate_names_egpu_devices_then_the_nvidia_ones_it_knows() -> None:
    indexes = {CARD_UUIDS[0]: 0, CARD_UUIDS[1]: 1}
    uuids = [CARD_UUIDS[1], CARD_UUIDS[0]]
    assert device_names(uuids, indexes, frozenset()) == [
        f"egpu.io/gpu={CARD_UUIDS[1]}", f"egpu.io/gpu={CARD_UUIDS[0]}"]
    assert device_names(uuids, indexes, {"1"})[2:] == ["nvidia.com/gpu=1"]


def test_spec_folders_find_a_kind_in_json_and_yaml_and_skip_broken_files(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    etc, run = tmp_path / "etc", tmp_path / "run"
    etc.mkdir()
    run.mkdir()
    (etc / "nvidia.yaml").write_text(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n"
        "  - name: '0'\n    containerEdits: {deviceNodes: [{path: /dev/nvidia0}]}\n")
    (run / "mgmt.json").write_text(json.dumps(
        {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": "GPU-x"}]}))
    (run / "other.json").write_text(json.dumps({"kind": "example.com/net",
                                                "devices": [{"name": "eth"}]}))
    (run / "broken.yaml").write_text("kind: [unclosed\n")
    (run / ".egpu.json.tmp").write_text("{")  # a write in progress: not a spec
    folders = SpecFolders([str(etc), str(run), str(tmp_path / "missing")])
    with caplog.at_level(logging.WARNING, logger="node_agent.cdi"):
        assert folders.device_names("nvidia.com/gpu") == {"0", "GPU-x"}
        assert folders.device_names("nvidia.com/gpu") == {"0", "GPU-x"}  # cached
    assert caplog.text.count("broken.yaml") == 1
    (etc / "nvidia.yaml").unlink()
    assert folders.device_names("nvidia.com/gpu") == {"GPU-x"}
    assert folders.device_names("nvidia.com/none") == frozenset()
