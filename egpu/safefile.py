"""One safe way to open a regular file in a folder a container can write to (the card
folders, the containers' accounting folders, the hook's host folders).

``open_regular(name, flags, mode, dir_fd=, where=)``: checked by ``lstat`` first (a FIFO,
device, folder or symlink is never opened), opened ``O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC`` (a FIFO
swapped in between never blocks the caller, a symlink fails), checked again by ``fstat``;
opened for writing it must have exactly one link (a hard link to another file is never
written or chmod-ed). The fd stays non-blocking (regular files ignore it). Raises
FileNotFoundError (absent, without O_CREAT), NotRegularFile (its message names the path, what
is there and what egpu expects) or another OSError.
"""

from __future__ import annotations

import errno
import os
import stat


class NotRegularFile(OSError):
    """Something other than a regular file of one link where egpu expects one."""


def _what(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "is a symlink"
    if stat.S_ISDIR(mode):
        return "is a folder"
    return f"is not a regular file (mode {mode:o})"


def _refuse(path: str, mode: int) -> NotRegularFile:
    tail = " (refusing to follow it)" if stat.S_ISLNK(mode) else ""
    return NotRegularFile(f"{path} {_what(mode)}; egpu expects a regular file there{tail}")


def open_regular(name: str, flags: int = os.O_RDONLY, mode: int = 0o600, *,
                 dir_fd: int | None = None, where: str | None = None) -> int:
    """The fd of regular file ``name`` (relative to ``dir_fd``; ``where``: its folder's name
    in messages). See the module docstring. The caller closes it."""
    path = f"{where}/{name}" if where else name
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
    else:
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, info.st_mode)
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode,
                     dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, stat.S_IFLNK) from None
        if exc.errno == errno.EISDIR:
            raise _refuse(path, stat.S_IFDIR) from None
        if exc.errno == errno.ENXIO:  # a FIFO without a reader, swapped in after the lstat
            raise _refuse(path, stat.S_IFIFO) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse(path, info.st_mode)
        if flags & (os.O_RDWR | os.O_WRONLY) and info.st_nlink != 1:
            raise NotRegularFile(f"{path} has {info.st_nlink} hard links; egpu expects a "
                                 "regular file with one link (refusing to change it)")
    except BaseException:
        os.close(fd)
        raise
    return fd
