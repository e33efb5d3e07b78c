"""devcluster.build names egpu-kube-scheduler by the digest of what it is built from, so that a
clone never runs a binary built from other sources (two clones share ~/.cache/egpu).

Bugs caught: a source change that keeps the old binary (a stale stamp, or one written by
another clone's build), or a test file's change that rebuilds it for nothing.
"""

from __future__ import annotations

import re
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


def test_the_dockerfile_builds_the_version_and_flags_make_k8s_builds() -> None:
    """kube-scheduler/Dockerfile (the published image) and `make k8s` (the dev image) build
    one binary. Bug caught: the Dockerfile left at an older kube-scheduler version or Go than
    go.mod names, so the published image reports (and gates features by) another version."""
    text = (build.PLUGIN_MODULE_DIR / "Dockerfile").read_text()
    flags = re.findall(r"-X ([^=\s]+)=([^\s\"\\]+)", text)
    want = re.findall(r"-X (\S+)=(\S+)", build.k8s_version_ldflags(build.K8S_VERSION))
    assert sorted(f for f in flags if "buildDate" not in f[0]) == \
        sorted(f for f in want if "buildDate" not in f[0])
    go_line = re.search(r"^go (\d+\.\d+)", (build.PLUGIN_MODULE_DIR / "go.mod").read_text(),
                        re.M)
    assert go_line and f"FROM golang:{go_line.group(1)}-" in text
    assert "CGO_ENABLED=0" in text and "-trimpath" in text
