"""Host folders and files under the hook's runtime and private folders, never through a symlink.

The hook runs as root on the host. The folders it creates under ``RUNTIME_DIR`` (the
accounting folder ``containers/<pod-uid>_<container>/``, writable by the container, and the
card folders ``cards/<uuid>/``) and the files it creates there (a share's file in its card's
folder) must never be reached through a symlink or a hard link that someone planted: a
``chmod`` or a bind mount by path would then act on whatever host object the link names
(``containers/<uid>_app -> /`` made the host's root folder 0777 and mounted it into the
container).

So every path below a *base* folder (``--runtime-dir``, ``--private-dir``, trusted: the
node's configuration) is walked one component at a time from the base's file descriptor:
``mkdirat`` (mode 0700 first), then ``openat`` with ``O_NOFOLLOW|O_DIRECTORY`` (a symlink fails
with ELOOP, anything else than a folder with ENOTDIR), ``fstat`` to check the owner, and
``fchmod`` on the descriptor for the final mode: nothing is ever changed by path. Files are
opened with ``O_NOFOLLOW|O_NONBLOCK`` (a FIFO never blocks the hook) and must be regular files
with one link. The base itself is opened with ``O_NOFOLLOW`` on its last component and must
belong to root (the hook's user).

The descriptors stay open for the bind mounts, which use ``/proc/self/fd/<n>`` as their
source: what is mounted is exactly what was checked.
"""

from __future__ import annotations

import errno
import os
import stat

from egpu.contract import is_file_name
from egpu.safefile import NotRegularFile, open_regular

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class HostPathError(OSError):
    """A host path under the runtime or private folder is a symlink, of the wrong kind, or
    belongs to someone else; the message names it and says what was expected."""


def _check_name(name: str, where: str) -> None:
    if not is_file_name(name):
        raise HostPathError(f"{where}: {name!r} is not a single file name")


def _owned(fd: int, path: str, kind: str) -> os.stat_result:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid():
        raise HostPathError(f"{path}: {kind} belongs to uid {info.st_uid}, not to uid "
                            f"{os.geteuid()} (the hook); refusing to use it")
    return info


def _open_dir_at(parent: int | None, name: str, path: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            kind = "a symlink" if os.path.islink(path) else "not a folder"
            raise HostPathError(f"{path} is {kind}; egpu expects a folder it created there "
                                "(refusing to follow it)") from None
        raise


def open_base(path: str, mode: int) -> int:
    """An fd of the base folder ``path`` (created with its parents when missing; its last
    component must not be a symlink, and it must belong to the hook's user). ``mode`` is
    applied with fchmod. The caller closes the fd."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not name:  # "/" itself
        fd = os.open("/", _DIR_FLAGS)
    else:
        os.makedirs(parent, mode=0o755, exist_ok=True)
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = _subdir(parent_fd, name, path, mode, check_owner=False)
        finally:
            os.close(parent_fd)
    try:
        _owned(fd, path, "the folder")
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _subdir(parent: int, name: str, path: str, mode: int, *, check_owner: bool = True) -> int:
    try:  # noqa: SIM105 - contextlib costs the hook's startup
        os.mkdir(name, 0o700, dir_fd=parent)
    except FileExistsError:
        pass
    fd = _open_dir_at(parent, name, path)
    try:
        if check_owner:
            _owned(fd, path, "the folder")
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_dirs(base: int, base_path: str, names: tuple[str, ...] | list[str],
              modes: tuple[int, ...] | list[int]) -> int:
    """Create (or open) ``base/names[0]/names[1]/...`` without following any symlink and give
    each folder its mode from ``modes`` (fchmod). Returns the fd of the last folder (the
    caller closes it). Raises HostPathError naming the offending path."""
    fd = os.dup(base)
    path = base_path
    try:
        for name, mode in zip(names, modes, strict=True):
            _check_name(name, path)
            path = os.path.join(path, name)
            child = _subdir(fd, name, path, mode)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(folder: int, name: str, path: str, flags: int, mode: int) -> int:
    """egpu.safefile.open_regular, one link also when read; blocking again once checked."""
    _check_name(name, path)
    try:
        fd = open_regular(name, flags, mode, dir_fd=folder, where=os.path.dirname(path))
    except NotRegularFile as exc:
        raise HostPathError(str(exc)) from None
    try:
        links = os.fstat(fd).st_nlink
        if links != 1:
            raise HostPathError(f"{path} has {links} hard links; egpu expects a regular file "
                                "with one link (refusing to change it)")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_file(folder: int, folder_path: str, name: str, mode: int) -> int:
    """Open (creating it empty when missing) the regular file ``name`` in ``folder``, never
    through a symlink, and fchmod it to ``mode``. Its content is kept. Returns a read-write
    fd (the caller closes it). Raises HostPathError for a symlink, a FIFO, a device, a
    folder or a file with more than one hard link."""
    path = os.path.join(folder_path, name)
    fd = _open_file(folder, name, path, os.O_RDWR | os.O_CREAT, mode)
    try:
        # Another user's file (a folder once world-writable, a raw node's interposer): its
        # owner could later chmod it and lock the share out.
        _owned(fd, path, "file")
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_regular_file(folder: int, folder_path: str, name: str) -> bool:
    """Unlink ``name`` in ``folder`` if it is a regular file (whatever its owner or links:
    unlinking a name changes no file's content); anything else is left for the caller to
    refuse. Returns whether it removed one. Never follows a symlink."""
    _check_name(name, folder_path)
    try:
        info = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode):
        return False
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def read_file(folder: int, folder_path: str, name: str, limit: int = 1 << 20) -> bytes | None:
    """The content of regular file ``name`` in ``folder`` (at most ``limit`` bytes), None when
    it does not exist. Never follows a symlink."""
    try:
        fd = _open_file(folder, name, os.path.join(folder_path, name), os.O_RDONLY, 0)
    except FileNotFoundError:
        return None
    try:
        return os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def write_file(folder: int, folder_path: str, name: str, data: bytes, mode: int) -> int:
    """Make regular file ``name`` in ``folder`` hold ``data`` with ``mode`` and return its fd
    (for a bind mount; the caller closes it). An unchanged file
    is left alone; a change is written in place (never replaced): the file may already be
    bind-mounted into the container (a rerun), and a mount keeps its inode."""
    path = os.path.join(folder_path, name)
    fd = _open_file(folder, name, path, os.O_RDWR | os.O_CREAT, mode)
    try:
        if os.pread(fd, len(data) + 1, 0) != data:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd
