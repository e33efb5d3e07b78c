"""The egpu package ships the product only (issue 23): not the demo, the dev cluster or the test
bed, which are the repository's development tools; their commands say where to run them."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cli import demo_cmd, dev_cluster_cmd

REPO = Path(__file__).resolve().parents[2]
PRODUCT = {"certs", "cli", "egpu", "node_agent", "runtime_hook", "scheduler", "webhook"}


def test_the_wheel_holds_the_product_packages_only(tmp_path: Path) -> None:
    # built from a copy of the tracked files: setuptools leaves a build/ folder behind, and
    # an old one in the clone could hand the wheel packages the list no longer names
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, tracked):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, src / rel)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(tmp_path), str(src)],
                   check=True, capture_output=True)
    wheel = next(tmp_path.glob("egpu-*.whl"))
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == PRODUCT


@pytest.mark.parametrize(("module", "command", "missing"), [
    (demo_cmd, "egpu demo", "demo"), (dev_cluster_cmd, "egpu dev-cluster", "devcluster")])
def test_the_demo_and_dev_cluster_commands_say_where_they_run(
        module: object, command: str, missing: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An installed egpu without the clone: a clear message, no traceback."""
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as outside a clone
    args = argparse.Namespace(arguments=["status"], state_dir=None, down=True)
    assert module.run(args) == 1  # type: ignore[attr-defined]
    err = capsys.readouterr().err
    assert err.startswith(f"{command}: ") and "clone of the egpu repository" in err
