"""The layout of a container's accounting region (libinterpose/include/egpu_region.h,
version 1), shared by its readers: the node agent's exporter (node_agent.metrics.region) and
the runtime hook, which asks whether a process of an earlier instance of the container still
holds it (``held_by_a_process``).

Layout, little-endian (sizes in bytes)::

    header (144): u64 magic "EEGPREG1" | u32 version (1) | u32 size | 64 lock | u32 ncards
                  | u32 pad | u64 repairs | u64 reaped | 40 reserved
    cards[16] (96 each): char uuid[48] | u64 limit | u64 used | u64 peak | u64 refused | 16
    procs[1024] (144 each): i32 pid | u32 flags | u64 start_time | u64 used[16]

A process of the container holds an OFD lock on its slot's first byte for as long as it lives
(EGPU_PROC_F_OFD; a shared allocation's holders hold read locks on theirs): the kernel drops
it when the process dies, whatever its pid namespace.
"""

from __future__ import annotations

import fcntl
import struct

REGION_MAGIC = 0x3147455250474545
REGION_VERSION = 1
MAX_CARDS = 16
MAX_PROCS = 1024
HEADER = struct.Struct("<QII64sIIQQ40s")
CARD = struct.Struct("<48sQQQQ16s")
PROC = struct.Struct("<iIQ16Q")  # pid, flags, start_time, used[16] bytes
PROC_SIZE = PROC.size
PROCS_OFFSET = HEADER.size + CARD.size * MAX_CARDS  # the first process slot
READ_SIZE = PROCS_OFFSET  # the header and the card table: what the exporter reads
REGION_SIZE = PROCS_OFFSET + PROC_SIZE * MAX_PROCS

assert HEADER.size == 144 and CARD.size == 96 and PROC_SIZE == 144 and REGION_SIZE == 149136

# struct flock (x86-64 and aarch64): short l_type, short l_whence, off_t l_start, off_t l_len,
# pid_t l_pid, padding
_FLOCK = struct.Struct("@hhqqi4x")


def held_by_a_process(fd: int) -> bool:
    """Whether some process holds a lock on any process slot of the region open at ``fd``
    (F_OFD_GETLK for a write lock over the slot table: it reports any read or write lock of
    another open file description). Raises OSError."""
    query = _FLOCK.pack(fcntl.F_WRLCK, 0, PROCS_OFFSET, PROC_SIZE * MAX_PROCS, 0)
    l_type = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_OFD_GETLK, query))[0]
    return bool(l_type != fcntl.F_UNLCK)
