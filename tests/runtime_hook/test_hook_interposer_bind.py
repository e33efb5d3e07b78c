"""The runtime hook's bind of the interposer (runtime_hook.main.bind_interposer), with real
mount(2) calls, in a child process in a mount namespace of its own (nothing reaches the host).

The library's path is looked up in the container's mount namespace; that lookup failed with
ENOENT once in a while during a node agent roll (tests/e2e/test_real_node_density.py, the
[agent] case), and the kubelet's restart of the container found the file. Bugs caught: a hook
that refuses the container at the first ENOENT (the container fails to start during a roll),
one that retries forever or on other errors, and a refusal that does not say where the lookup
failed."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from pathlib import Path

import pytest

from egpu.contract import INTERPOSER_PATH_IN_CONTAINER
from runtime_hook import main, rootfs

CLONE_NEWNS = 0x00020000
MS_REC, MS_PRIVATE = 0x4000, 0x40000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mount(2) needs root")


def in_private_mount_namespace(body) -> str:  # type: ignore[no-untyped-def]
    """Run ``body()`` in a forked child in a new, private mount namespace; its result (a
    string) or its error, as text."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            if libc.unshare(CLONE_NEWNS) or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE,
                                                       None):
                raise OSError(ctypes.get_errno(), "unshare/make-private")
            text = f"ok {body()}"
        except BaseException as exc:  # every failure is the answer
            text = f"error {type(exc).__name__} {exc}"
        os.write(write_end, text.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        out = pipe.read().decode()
    os.waitpid(child, 0)
    return out


def test_a_library_found_at_a_later_try_is_bound(tmp_path: Path) -> None:
    root, library = tmp_path / "rootfs", tmp_path / "lib" / "libegpu_interpose.so"
    root.mkdir()
    rootfs.make_file_in_root(str(root), INTERPOSER_PATH_IN_CONTAINER)

    def body() -> str:
        # the library appears 0.25 s after the first try (tries are 0.1 s apart)
        threading.Timer(0.25, lambda: (library.parent.mkdir(), library.write_bytes(b"lib"))).start()
        main.bind_interposer(str(library), str(root), os.getpid())
        return (root / INTERPOSER_PATH_IN_CONTAINER.lstrip("/")).read_text()

    assert in_private_mount_namespace(body) == "ok lib"


def test_a_library_missing_at_every_try_refuses_naming_the_namespaces(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    rootfs.make_file_in_root(str(root), INTERPOSER_PATH_IN_CONTAINER)
    missing = tmp_path / "nowhere" / "libegpu_interpose.so"

    def body() -> str:
        started = time.monotonic()
        try:
            main.bind_interposer(str(missing), str(root), os.getpid())
        finally:
            took = time.monotonic() - started
        return f"bound after {took:.2f} s"

    out = in_private_mount_namespace(body)
    assert out.startswith("error FileNotFoundError [Errno 2] bind"), out
    assert "No such file or directory" in out and f"bind {missing}" in out, out
    assert "mount namespaces: here mnt:[" in out and "container mnt:[" in out, out
    assert f"{missing.parent} here: ? (No such file or directory)" in out, out


def test_other_errors_are_not_tried_again(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()  # no target file inside: open_in_root fails at once, not ENOENT of the mount
    (root / "usr").write_text("a file where a folder must be")
    library = tmp_path / "libegpu_interpose.so"
    library.write_bytes(b"lib")

    def body() -> str:
        started = time.monotonic()
        try:
            main.bind_interposer(str(library), str(root), os.getpid())
        except OSError:
            return f"refused after {time.monotonic() - started:.2f} s"
        return "bound"

    out = in_private_mount_namespace(body)
    assert out.startswith("ok refused after"), out
    assert float(out.split()[-2]) < main.INTERPOSER_BIND_RETRY_S, out
