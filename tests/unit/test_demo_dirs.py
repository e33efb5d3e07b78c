"""Where the demo keeps its state, the stop command it prints, its --dra flag and the DRA
placement table's rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo import run as demo


def test_state_folder_follows_the_documented_variables(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.delenv("EGPU_DEMO_DIR", raising=False)
    monkeypatch.delenv("EGPU_STATE_DIR", raising=False)
    assert demo.default_state_dir() == Path.home() / ".cache" / "egpu" / "demo"
    monkeypatch.setenv("EGPU_STATE_DIR", str(tmp_path / "mine"))
    assert demo.default_state_dir() == tmp_path / "mine" / "demo"
    monkeypatch.setenv("EGPU_DEMO_DIR", str(tmp_path / "d"))
    assert demo.default_state_dir() == tmp_path / "d"


def test_the_stop_command_names_a_private_state_folder(tmp_path: Path) -> None:
    assert demo._stop_command(Path.home() / ".cache" / "egpu" / "demo").endswith(
        "egpu demo --down")
    assert demo._stop_command(tmp_path).startswith(f"EGPU_DEMO_DIR={tmp_path} ")


def test_down_says_when_nothing_runs(tmp_path: Path) -> None:
    said: list[str] = []
    demo.down(tmp_path, say=said.append)
    assert said == [f"no demo is running from {tmp_path}"]


def test_egpu_demo_dra_runs_the_demo_in_dra_mode(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """`egpu demo --dra` (`make demo DEMO_ARGS=--dra`) asks for the DRA demo; without the flag
    the demo stays in extender mode."""
    from cli.main import main

    asked: list[demo.Options] = []
    monkeypatch.setattr(demo, "up", lambda options: asked.append(options) or 0)
    assert main(["demo", "--dra", "--state-dir", str(tmp_path)]) == 0
    assert main(["demo", "--state-dir", str(tmp_path)]) == 0
    assert [o.dra for o in asked] == [True, False]
    assert asked[0].state_dir == tmp_path


def test_the_dra_placement_rows_read_the_share_from_the_claim() -> None:
    """In DRA mode the table's row comes from the pod's allocated ResourceClaim (the decoder of
    `kubectl egpu`) and ends with the claim's name."""
    from egpu.config import Config
    from egpu.contract import ANN_INVENTORY
    from egpu.records import Inventory
    from tests.dra_objects import CARDS, NODE, share_claim, share_pod

    node = {"metadata": {"name": NODE, "labels": {},
                         "annotations": {ANN_INVENTORY: Inventory(cards=CARDS).encode()}}}
    pod = share_pod()
    pod["status"]["phase"] = "Running"
    rows = demo.placement_rows([node], [pod], Config(), [share_claim("8Gi", "30")])
    assert rows == [("ml/share-pod", "main", NODE, "0", "NVIDIA H100 80GB HBM3", "8192", "30%",
                     "high", "-", "share-pod-gpu-x")]
    assert demo.placement_rows([node], [pod], Config()) == []  # extender mode: no claims read
