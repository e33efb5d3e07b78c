"""Where the demo keeps its state, and the stop command it prints."""

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
