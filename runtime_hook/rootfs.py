"""Paths inside a container's root filesystem that never escape it.

A container image (or a volume inside it) may hold symlinks such as ``/var/run -> /run`` or a
hostile ``/etc -> /host/etc``. ``resolve_in_root`` walks the path one component at a time and
resolves every symlink as if ``root`` were ``/`` (the semantics of openat2(RESOLVE_IN_ROOT),
written out so that it runs on any kernel): ``..`` never climbs above ``root``, absolute link
targets restart at ``root``. ``open_in_root`` then opens the result with O_PATH|O_NOFOLLOW and
checks through /proc/self/fd that the object really lies inside ``root`` (a component swapped
for a symlink between the walk and the open is caught there).
"""

from __future__ import annotations

import os
import stat

MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP beyond)


class EscapeError(OSError):
    """A path would leave the root, loops through symlinks, or is of the wrong kind."""


def resolve_in_root(root: str, path: str) -> str:
    """The host path of ``path`` (absolute, as seen inside the container) under ``root``.

    Missing components are taken literally. Raises EscapeError on a symlink loop.
    """
    root = os.path.abspath(root)
    todo = path.split("/")[::-1]  # a stack: the next component last (no deque: startup time)
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = os.path.join(root, *done, part)
        try:
            info = os.lstat(candidate)
        except FileNotFoundError:
            done.append(part)
            continue
        except NotADirectoryError:
            raise EscapeError(f"{path}: a component under {root} is not a folder") from None
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise EscapeError(f"{path}: too many symlinks under {root}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            todo.extend(reversed(target.split("/")))
            continue
        done.append(part)
    return os.path.join(root, *done)


def _inside(root: str, real: str) -> bool:
    root = os.path.abspath(root)
    return real == root or real.startswith(root.rstrip("/") + "/")


def make_dirs_in_root(root: str, path: str, mode: int = 0o755) -> str:
    """Create the folder ``path`` (and its parents) inside ``root``; returns its host path.

    The path is resolved first (symlinks followed inside ``root``); every component of the
    result is then created or checked to be a real folder (not a symlink), so a link swapped
    in meanwhile is refused. Raises EscapeError."""
    root = os.path.abspath(root)
    host = resolve_in_root(root, path)
    current = root
    relative = os.path.relpath(host, root)
    for part in [] if relative == "." else relative.split("/"):
        current = os.path.join(current, part)
        try:  # noqa: SIM105 - contextlib costs the hook's startup
            os.mkdir(current, mode)
        except FileExistsError:
            pass
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            raise EscapeError(f"{path}: {current} is not a folder (under {root})")
    return host


def make_file_in_root(root: str, path: str, mode: int = 0o644) -> str:
    """Create an empty regular file ``path`` inside ``root`` (a mount point) unless one is
    there; returns its host path. Raises EscapeError for a non-regular file."""
    make_dirs_in_root(root, os.path.dirname(path))
    host = resolve_in_root(root, path)
    try:
        fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        os.close(fd)
    except FileExistsError:
        pass
    if not stat.S_ISREG(os.lstat(host).st_mode):
        raise EscapeError(f"{path} in {root} exists and is not a regular file")
    return host


def open_in_root(root: str, path: str) -> int:
    """An O_PATH file descriptor of ``path`` inside ``root``, checked to lie inside ``root``
    through ``/proc/self/fd``. The caller closes it. Raises EscapeError or OSError."""
    host = resolve_in_root(root, path)
    fd = os.open(host, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
        if not _inside(root, real):
            raise EscapeError(f"{path} resolves to {real}, outside {root}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_in_root(root: str, path: str, limit: int = 1 << 16) -> bytes | None:
    """The contents of regular file ``path`` inside ``root`` (at most ``limit`` bytes), or
    None when it does not exist. Raises EscapeError when it escapes or is not a file."""
    try:
        fd = open_in_root(root, path)
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EscapeError(f"{path} in {root} is not a regular file")
        with open(f"/proc/self/fd/{fd}", "rb") as handle:
            return handle.read(limit)
    finally:
        os.close(fd)
