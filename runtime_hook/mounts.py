"""Bind mounts into a container that is being created (Linux: setns(2), mount(2) via libc).

Where this runs (OCI runtime spec v1.1, config.md "POSIX-platform Hooks"): ``prestart`` and
``createRuntime`` hooks run in the *runtime's* namespaces after the container's root and mounts
are prepared but before pivot_root; ``createContainer`` hooks run in the container's mount
namespace at the same point. A mount made from the runtime's namespace would not reach the
container (its mount namespace is a private/slave copy), so ``in_mount_namespace`` forks a child
that joins the container's mount namespace (/proc/<pid>/ns/mnt, as libnvidia-container does)
when it is not already there. Paths inside it are still host-like (the root is not pivoted):
the container's root is ``<rootfs>``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import time

from runtime_hook.rootfs import open_in_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

CLONE_NEWNS = 0x00020000
CLONE_FS = 0x00000200  # unshare(2): a copy of the filesystem attributes of its own
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000

_libc = ctypes.CDLL(None, use_errno=True)


class MountError(OSError):
    """A namespace could not be joined or a mount failed; the message says which and why."""


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise MountError(err, f"{what}: {os.strerror(err)}")


def same_mount_namespace(pid: int) -> bool:
    """Whether this process already is in the mount namespace of ``pid``."""
    return os.stat("/proc/self/ns/mnt").st_ino == os.stat(f"/proc/{pid}/ns/mnt").st_ino


def in_mount_namespace(pid: int, action: Callable[[], None]) -> None:
    """Run ``action`` in the mount namespace of ``pid`` (in a forked child unless already
    there). Raises MountError with the child's message when it fails, and for a ``pid`` that
    names no process (<= 0): mounts made here would miss the container."""
    if pid <= 0:
        raise MountError(f"no container process (pid {pid}) whose mount namespace to enter")
    if same_mount_namespace(pid):
        action()
        return
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        code = 0
        try:
            os.close(read_end)
            # setns(CLONE_NEWNS) refuses (EINVAL) a process that shares its filesystem
            # attributes with another: threads a library's fork handler started in this
            # child (gRPC's does) share them. Unsharing them first makes the join hold.
            _check(_libc.unshare(CLONE_FS), "unshare(CLONE_FS)")
            fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
            _check(_libc.setns(fd, CLONE_NEWNS), f"setns(/proc/{pid}/ns/mnt)")
            os.close(fd)
            action()
        except BaseException as exc:
            os.write(write_end, str(exc).encode()[:4000])
            code = 1
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise MountError(message or f"mount helper exited with status {status}")


def _lookup_report(path: str) -> str:
    """Where a lookup of ``path`` failed: this process's and init's mount namespaces, and the
    entries of ``path``'s folder as seen here."""
    def link(name: str) -> str:
        try:
            return os.readlink(name)
        except OSError as exc:
            return f"? ({exc.strerror})"

    folder = os.path.dirname(path)
    try:
        entries = ", ".join(sorted(os.listdir(folder))) or "empty"
    except OSError as exc:
        entries = f"? ({exc.strerror})"
    return (f"mount namespaces: here {link('/proc/self/ns/mnt')}, init "
            f"{link('/proc/1/ns/mnt')}; {folder} here: {entries}")


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo (octal)."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 1 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _file_id(file: str | int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of a path or an open descriptor (O_PATH ones too); None when it
    cannot be read (a source still missing: its bind tries again and says why)."""
    try:
        st = os.fstat(file) if isinstance(file, int) else os.stat(file)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def mount_points() -> set[str]:
    """The mount points of this process's mount namespace (/proc/self/mountinfo field 5)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        return {_unescape(line.split()[4]) for line in handle if len(line.split()) > 4}


# A host path source is looked up in the namespace the mount is made in: the container's.
# That lookup of the interposer has failed with ENOENT, rarely, while the node agent was being
# rolled (the file there the whole time: the kubelet's restart of the container found it).
PATH_SOURCE_TRIES = 5
PATH_SOURCE_RETRY_S = 0.1


def bind(source: str | int, root: str, target: str, *, read_only: bool,
         label: str = "") -> bool:
    """Bind-mount ``source`` onto ``target`` inside ``root`` (which must exist), read-only
    (and nosuid, nodev) when asked. ``source``: a host path (an ENOENT is tried again,
    PATH_SOURCE_TRIES times, PATH_SOURCE_RETRY_S apart; the last one's message says which
    mount namespaces were involved and what the source's folder held), or an open file
    descriptor (the very file or folder it names is mounted, through /proc/self/fd: no path
    is resolved again); ``label``: its name in messages. Returns False when ``target``
    already is a mount point of ``source`` itself (a rerun: idempotent), True when mounted.

    A mount point of anything else at ``target`` is covered, not kept: runc has mounted the
    pod's volumes before createRuntime hooks run, so a volumeMount (a configMap subPath at
    /etc/ld.so.preload, /run/egpu/config.json or the interposer's path) would otherwise
    leave the container without its interposer, or with limits it wrote itself."""
    tries = PATH_SOURCE_TRIES
    if isinstance(source, int):
        label = label or f"fd {source}"
        source = f"/proc/self/fd/{source}"
        tries = 1
    label = label or source
    fd = open_in_root(root, target)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
        if real in mount_points():
            ours = _file_id(source)  # stat follows /proc/self/fd/N to the file itself
            if ours is not None and _file_id(fd) == ours:
                return False
            print(f"egpu-hook: {target} is a mount point of something else (a volume of the "
                  f"pod?): covering it with {label}", file=sys.stderr)
        for attempt in range(tries):
            if _libc.mount(source.encode(), f"/proc/self/fd/{fd}".encode(), None, MS_BIND,
                           None) == 0:
                break
            err = ctypes.get_errno()
            if err != errno.ENOENT or attempt + 1 == tries:
                where = f"; {_lookup_report(source)}" if err == errno.ENOENT and tries > 1 else ""
                raise MountError(err, f"bind {label} -> {target}: {os.strerror(err)}{where}")
            time.sleep(PATH_SOURCE_RETRY_S)
    finally:
        os.close(fd)
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(_libc.mount(None, real.encode(), None, flags, None), f"remount {target} read-only")
    return True
