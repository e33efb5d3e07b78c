"""runtime_hook.rootfs: paths resolved inside a root never escape it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime_hook.rootfs import (
    EscapeError,
    make_dirs_in_root,
    make_file_in_root,
    open_in_root,
    read_in_root,
    resolve_in_root,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "rootfs"
    (r / "run").mkdir(parents=True)
    (r / "var").mkdir()
    os.symlink("../run", r / "var" / "run")  # relative, inside
    os.symlink("/run", r / "abs")  # absolute: means <root>/run
    os.symlink("/../../../../etc", r / "evil")  # climbs: must stay in root
    os.symlink("loop2", r / "loop1")
    os.symlink("loop1", r / "loop2")
    return r


def test_relative_and_absolute_links_resolve_inside(root: Path) -> None:
    assert resolve_in_root(str(root), "/var/run/egpu/x") == f"{root}/run/egpu/x"
    assert resolve_in_root(str(root), "/abs/egpu") == f"{root}/run/egpu"


def test_dotdot_and_hostile_links_stay_inside(root: Path) -> None:
    assert resolve_in_root(str(root), "/../../etc/passwd") == f"{root}/etc/passwd"
    assert resolve_in_root(str(root), "/evil/ld.so.preload") == f"{root}/etc/ld.so.preload"


def test_symlink_loop_is_an_error(root: Path) -> None:
    with pytest.raises(EscapeError):
        resolve_in_root(str(root), "/loop1/x")


def test_make_dirs_and_files_follow_links_inside(root: Path) -> None:
    host = make_dirs_in_root(str(root), "/var/run/egpu/containers/u_c")
    assert host == f"{root}/run/egpu/containers/u_c" and os.path.isdir(host)
    f = make_file_in_root(str(root), "/evil/ld.so.preload")
    assert f == f"{root}/etc/ld.so.preload" and os.path.isfile(f)
    assert not os.path.exists("/etc/ld.so.preload") or Path("/etc/ld.so.preload").read_bytes() \
        != b"should-not-be-touched"


def test_file_in_place_of_folder_is_refused(root: Path) -> None:
    (root / "run" / "egpu").write_text("not a folder")
    with pytest.raises(EscapeError):
        make_dirs_in_root(str(root), "/run/egpu/x")


def test_open_checks_the_final_object(root: Path) -> None:
    (root / "etc").mkdir()
    (root / "etc" / "f").write_text("hello")
    fd = open_in_root(str(root), "/etc/f")
    os.close(fd)
    assert read_in_root(str(root), "/etc/f") == b"hello"
    assert read_in_root(str(root), "/etc/none") is None
