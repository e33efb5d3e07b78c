"""devcluster.build names egpu-kube-scheduler by the digest of what it is built from, so that a
clone never runs a binary built from other sources (two clones share ~/.cache/egpu).

Bugs caught: a source change that keeps the old binary (a stale stamp, or one written by
another clone's build), or a test file's change that rebuilds it for nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import build


@pytest.fixture()
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "kube-scheduler"
    (root / "plugin").mkdir(parents=True)
    (root / "go.mod").write_text("module example\n")
    (root / "go.sum").write_text("")
    (root / "plugin" / "plugin.go").write_text("package plugin\n")
    (root / "plugin" / "plugin_test.go").write_text("package plugin\n")
    monkeypatch.setattr(build, "PLUGIN_MODULE_DIR", root)
    return root


def digest() -> str:
    return build._plugin_digest(build.find_go(), build.go_env(), build.K8S_VERSION)


def test_a_source_go_mod_or_go_sum_change_names_another_binary(module: Path) -> None:
    before = digest()
    for name in ("plugin/plugin.go", "go.mod", "go.sum"):
        (module / name).write_text((module / name).read_text() + "// changed\n")
        after = digest()
        assert after != before, name
        before = after


def test_a_test_files_change_keeps_the_binary(module: Path) -> None:
    before = digest()
    (module / "plugin" / "plugin_test.go").write_text("package plugin\n// changed\n")
    assert digest() == before
