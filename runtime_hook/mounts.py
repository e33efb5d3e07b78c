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
import os

from runtime_hook.rootfs import open_in_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

CLONE_NEWNS = 0x00020000
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


def mount_points() -> set[str]:
    """The mount points of this process's mount namespace (/proc/self/mountinfo field 5)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
        return {_unescape(line.split()[4]) for line in handle if len(line.split()) > 4}


def bind(source: str | int, root: str, target: str, *, read_only: bool,
         label: str = "") -> bool:
    """Bind-mount ``source`` onto ``target`` inside ``root`` (which must exist), read-only
    (and nosuid, nodev) when asked. ``source``: a host path, or an open file descriptor (the
    very file or folder it names is mounted, through /proc/self/fd: no path is resolved
    again); ``label``: its name in messages. Returns False when ``target`` already is a mount
    point (a rerun: idempotent), True when mounted."""
    if isinstance(source, int):
        label = label or f"fd {source}"
        source = f"/proc/self/fd/{source}"
    label = label or source
    fd = open_in_root(root, target)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
        if real in mount_points():
            return False
        _check(_libc.mount(source.encode(), f"/proc/self/fd/{fd}".encode(), None, MS_BIND, None),
               f"bind {label} -> {target}")
    finally:
        os.close(fd)
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(_libc.mount(None, real.encode(), None, flags, None), f"remount {target} read-only")
    return True
