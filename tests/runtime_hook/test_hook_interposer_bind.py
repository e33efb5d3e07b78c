"""The runtime hook's bind of a host path (the interposer) into a container: runtime_hook.mounts
``bind`` run by ``in_mount_namespace``, as the hook runs them, with real mount(2) calls, in a
mount namespace of its own held by ``unshare -m --propagation private`` (nothing reaches the
host).

A host path source is looked up in the container's mount namespace; that lookup of the
interposer failed with ENOENT once in a while during a node agent roll
(tests/e2e/test_real_node_density.py, the [agent] case), and the kubelet's restart of the
container found the file. Bugs caught: a hook that refuses the container at the first ENOENT
(the container fails to start during a roll), one that retries forever or on other errors, and
a refusal that does not say where the lookup failed."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from egpu.contract import INTERPOSER_PATH_IN_CONTAINER
from runtime_hook import mounts, rootfs

RETRY_PAUSE_S = 60.0  # one retry would take this long


@pytest.fixture
def namespace() -> Iterator[int]:
    """The pid of a process holding a private mount namespace. Root and unshare(1) are on
    every machine `make test` runs on: their absence is a failure, not a skip."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare(1) (make test, as root)")
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "600"])
    try:
        deadline = time.monotonic() + 10
        while mounts.same_mount_namespace(holder.pid):  # until unshare has exec'd sleep
            assert time.monotonic() < deadline, "unshare did not make a mount namespace"
            time.sleep(0.01)
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def container_root(tmp_path: Path) -> str:
    root = tmp_path / "rootfs"
    root.mkdir()
    rootfs.make_file_in_root(str(root), INTERPOSER_PATH_IN_CONTAINER)
    return str(root)


def test_a_library_found_at_a_later_try_is_bound(tmp_path: Path, namespace: int) -> None:
    root, library = container_root(tmp_path), tmp_path / "lib" / "libegpu_interpose.so"
    seen = tmp_path / "seen"

    def inside() -> None:
        # the library appears 0.25 s after the first try (tries are 0.1 s apart)
        threading.Timer(0.25, lambda: (library.parent.mkdir(), library.write_bytes(b"lib"))).start()
        mounts.bind(str(library), root, INTERPOSER_PATH_IN_CONTAINER, read_only=True)
        seen.write_bytes((Path(root) / INTERPOSER_PATH_IN_CONTAINER.lstrip("/")).read_bytes())

    mounts.in_mount_namespace(namespace, inside)
    assert seen.read_bytes() == b"lib"
    assert (Path(root) / INTERPOSER_PATH_IN_CONTAINER.lstrip("/")).read_bytes() == b""  # not here


def test_a_library_missing_at_every_try_refuses_naming_the_namespaces(
        tmp_path: Path, namespace: int) -> None:
    root, missing = container_root(tmp_path), tmp_path / "nowhere" / "libegpu_interpose.so"
    with pytest.raises(mounts.MountError) as refused:
        mounts.in_mount_namespace(namespace, lambda: mounts.bind(
            str(missing), root, INTERPOSER_PATH_IN_CONTAINER, read_only=True))
    message = str(refused.value)
    assert f"bind {missing} -> {INTERPOSER_PATH_IN_CONTAINER}: No such file or directory" in message
    assert "mount namespaces: here mnt:[" in message and ", init " in message, message
    assert f"{missing.parent} here: ? (No such file or directory)" in message, message


def test_other_errors_are_not_tried_again(tmp_path: Path, namespace: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Bug caught: every error tried again. The pause between tries is made a minute long,
    so that a retry shows whatever the host's load (a bound near the real 0.1 s pause failed
    under the parallel lanes' load: 0.63 s for one refused bind)."""
    monkeypatch.setattr(mounts, "PATH_SOURCE_RETRY_S", RETRY_PAUSE_S)
    root = container_root(tmp_path)
    folder = tmp_path / "a-folder"  # a folder onto a file: ENOTDIR, at once
    folder.mkdir()
    started = time.monotonic()
    with pytest.raises(mounts.MountError) as refused:
        mounts.in_mount_namespace(namespace, lambda: mounts.bind(
            str(folder), root, INTERPOSER_PATH_IN_CONTAINER, read_only=True))
    took = time.monotonic() - started
    assert "mount namespaces" not in str(refused.value), refused.value
    assert took < RETRY_PAUSE_S / 2, took


@pytest.mark.parametrize("source_kind", ["path", "fd"])
def test_a_volume_the_pod_mounted_at_a_target_is_covered_not_kept(
        tmp_path: Path, namespace: int, source_kind: str) -> None:
    """runc mounts the pod's volumes before createRuntime hooks run. Bug caught: bind took
    any mount point at its target for its own earlier mount and skipped it, so a configMap
    subPath volumeMount at the interposer's path (or /etc/ld.so.preload, or the config)
    started the container without its interposer, exit status 0."""
    root, library = container_root(tmp_path), tmp_path / "libegpu_interpose.so"
    library.write_bytes(b"the interposer")
    tenant = tmp_path / "tenant.so"
    tenant.write_bytes(b"the tenant's own library")
    target = Path(root) / INTERPOSER_PATH_IN_CONTAINER.lstrip("/")
    seen, results = tmp_path / "seen", tmp_path / "results"

    def inside() -> None:
        subprocess.run(["mount", "--bind", str(tenant), str(target)], check=True)
        fd = os.open(library, os.O_RDONLY | os.O_CLOEXEC)
        source: str | int = str(library) if source_kind == "path" else fd
        first = mounts.bind(source, root, INTERPOSER_PATH_IN_CONTAINER, read_only=True)
        again = mounts.bind(source, root, INTERPOSER_PATH_IN_CONTAINER, read_only=True)
        os.close(fd)
        results.write_text(f"{first} {again}")
        seen.write_bytes(target.read_bytes())

    mounts.in_mount_namespace(namespace, inside)
    assert seen.read_bytes() == b"the interposer"
    # the first covers the pod's volume; a rerun finds its own mount and leaves it
    assert results.read_text() == "True False"


def test_the_namespace_is_joined_from_a_process_that_serves_grpc(
        tmp_path: Path, namespace: int) -> None:
    """setns(CLONE_NEWNS) refuses (EINVAL) a process that shares its filesystem attributes
    with another, and gRPC's fork handlers start threads in a forked child that do. Bug
    caught: every bind of this module failed with "setns(...): Invalid argument" on a pytest
    worker that had served the device plugin's gRPC before (a lanes run of 2026-12-05); the
    hook itself can load such a library too."""
    from concurrent import futures

    import grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_insecure_port(f"unix://{tmp_path}/grpc.sock")
    server.start()
    channel = grpc.insecure_channel(f"unix://{tmp_path}/grpc.sock")
    try:
        grpc.channel_ready_future(channel).result(timeout=10)
        for i in range(5):
            mark = tmp_path / f"joined-{i}"
            mounts.in_mount_namespace(namespace, mark.touch)
            assert mark.exists()
    finally:
        channel.close()
        server.stop(0)
