"""Read a container's accounting region (libinterpose/include/egpu_region.h, version 1).

The interposer keeps ``<RUNTIME_DIR>/containers/<pod-uid>_<container>/region``, a shared
mapping updated under a robust process-shared mutex by every process of the container. The
node agent only reads the header and the card table (the first 1680 bytes) with one pread;
it takes no lock (aligned 64-bit fields do not tear on the platforms egpu supports, and a
metric a moment stale is fine). The layout is egpu.region_layout's; of the card table, peak
and refused were reserved and zero before, so an older interposer's region reads 0 for both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from egpu import safefile
from egpu.contract import CONTAINER_REGION_FILE, CONTAINERS_SUBDIR
from egpu.region_layout import (
    CARD,
    HEADER,
    MAX_CARDS,
    READ_SIZE,
    REGION_MAGIC,
    REGION_SIZE,
    REGION_VERSION,
)


class RegionError(ValueError):
    """The file is not a version-1 region (short, wrong magic, version or size)."""


@dataclass(frozen=True)
class CardUsage:
    """One card of a container's share: limit, use and the highest use so far (bytes), and
    how many allocations the interposer refused because the share was full."""

    uuid: str
    limit_bytes: int
    used_bytes: int
    peak_bytes: int = 0
    refused: int = 0


@dataclass(frozen=True)
class RegionUsage:
    """The cards in use by one container (free slots left out)."""

    cards: tuple[CardUsage, ...]


def parse_region(data: bytes) -> RegionUsage:
    """Parse the first ``READ_SIZE`` bytes of a region. Raises RegionError."""
    if len(data) < READ_SIZE:
        raise RegionError(f"region too short: {len(data)} bytes, need {READ_SIZE}")
    magic, version, size, _lock, ncards, _pad, _repairs, _reaped, _res = HEADER.unpack_from(data)
    if magic != REGION_MAGIC:
        raise RegionError(f"bad magic {magic:#x}")
    if version != REGION_VERSION or size != REGION_SIZE:
        raise RegionError(f"region version {version} size {size}; this agent reads "
                          f"version {REGION_VERSION} size {REGION_SIZE}")
    cards = []
    for i in range(min(ncards, MAX_CARDS)):
        raw_uuid, limit, used, peak, refused, _ = CARD.unpack_from(
            data, HEADER.size + i * CARD.size)
        uuid = raw_uuid.split(b"\0", 1)[0].decode(errors="replace")
        if uuid:
            cards.append(CardUsage(uuid, limit, used, max(peak, used), refused))
    return RegionUsage(tuple(cards))


class NotARegionFile(OSError):
    """The path is a symlink, a FIFO, a device, a folder, or a file of another size."""


def open_regular(name: str, *, dir_fd: int | None = None, size: int | None = None,
                 min_size: int = 0) -> int:
    """A read-only fd of the regular file ``name`` (relative to ``dir_fd``), never blocking
    and never through a symlink (egpu.safefile.open_regular: a FIFO a container planted would
    otherwise stop the agent's heartbeat), of exactly ``size`` bytes (when given) and at least
    ``min_size``. The caller closes it. Raises OSError (NotARegionFile for the wrong kind or
    size)."""
    try:
        fd = safefile.open_regular(name, dir_fd=dir_fd)
    except safefile.NotRegularFile as exc:
        raise NotARegionFile(str(exc)) from None
    try:
        info = os.fstat(fd)
        if (size is not None and info.st_size != size) or info.st_size < min_size:
            raise NotARegionFile(f"{name}: {info.st_size} bytes, expected "
                                 f"{size if size is not None else f'>= {min_size}'}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_region(path: str, *, dir_fd: int | None = None) -> RegionUsage:
    """Read and parse the region file at ``path`` (relative to ``dir_fd`` when given): a
    regular file of REGION_SIZE bytes, opened without blocking or following a symlink.
    Raises OSError or RegionError."""
    fd = open_regular(path, dir_fd=dir_fd, size=REGION_SIZE)
    try:
        return parse_region(os.pread(fd, READ_SIZE, 0))
    finally:
        os.close(fd)


def split_dir_name(name: str) -> tuple[str, str]:
    """``<pod-uid>_<container>`` -> (pod uid, container); container names (DNS labels) hold no
    '_', so the split is at the last one. ``("", name)`` when there is none."""
    uid, sep, container = name.rpartition("_")
    return (uid, container) if sep else ("", name)


def scan(runtime_dir: str) -> dict[str, RegionUsage]:
    """Every readable region under ``<runtime_dir>/containers``: folder name -> usage.
    Unreadable or malformed regions are left out, and so are symlinks, FIFOs, devices and
    files of another size (never opened in a way that blocks or follows a link)."""
    folder = os.path.join(runtime_dir, CONTAINERS_SUBDIR)
    out: dict[str, RegionUsage] = {}
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return out
    for name in entries:
        # The container writes its folder (a bind mount): the folder is opened without
        # following a link, and the region inside it as a regular file only.
        try:
            dir_fd = os.open(os.path.join(folder, name),
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            out[name] = read_region(CONTAINER_REGION_FILE, dir_fd=dir_fd)
        except (OSError, RegionError):
            continue
        finally:
            os.close(dir_fd)
    return out
