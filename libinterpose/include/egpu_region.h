/* egpu_region.h: layout of the per-container accounting region
 * (<runtime>/containers/<pod-uid>_<container>/region), shared by every process of the
 * container and read by the node agent. Change the layout => bump EGPU_REGION_VERSION. */
#ifndef EGPU_REGION_H
#define EGPU_REGION_H
#include <pthread.h>
#include <stdint.h>

#define EGPU_REGION_MAGIC 0x3147455250474545ULL /* "EEGPREG1" little-endian */
#define EGPU_REGION_VERSION 1u
#define EGPU_REGION_MAX_CARDS 16
#define EGPU_REGION_MAX_PROCS 1024
#define EGPU_UUID_LEN 48

typedef struct {
    char uuid[EGPU_UUID_LEN]; /* NVML UUID, "" = free slot */
    uint64_t limit_bytes;     /* the share's cap (informational: each process enforces its config) */
    uint64_t used_bytes;      /* sum of procs[].used[this card] */
    /* Since the region was created (zero in regions of interposers before these fields:
     * the layout is unchanged, they were reserved and zero): */
    uint64_t peak_bytes;      /* the highest used_bytes reached (right-sizing reads it:
                               * a 15 s scrape misses a short peak) */
    uint64_t refused;         /* charges refused because the share was full (OOMs seen) */
    uint64_t reserved[2];
} egpu_region_card;

/* procs[].flags */
#define EGPU_PROC_F_OFD 0x1u  /* liveness: the process holds an OFD write lock (fcntl
                               * F_OFD_SETLK) on the slot's first byte of the region file; the
                               * kernel drops it when the process dies (or execs), in whatever
                               * pid namespace. A peer may reclaim the slot iff no other open
                               * file description holds that lock. Without the flag (lock not
                               * available): the pid and its start time, judged in the peer's
                               * own pid namespace. */

#define EGPU_PROC_F_SHARED 0x2u /* (with EGPU_PROC_F_OFD) not a process: one allocation exported
                               * by a process of the container (a POSIX fd, NCCL) and held by
                               * one or more of its processes, charged here once. pid: the
                               * exporter; start_time: the exporter's private duplicate of the
                               * exported fd (kcmp finds an import's match), or ~0 once the
                               * exporter let go; each holder holds an OFD *read* lock on the
                               * slot's first byte, so the slot lives while any holder does. */
typedef struct {
    int32_t pid;              /* 0 = free slot; as seen in the owner's pid namespace */
    uint32_t flags;           /* EGPU_PROC_F_* */
    uint64_t start_time;      /* /proc/<pid>/stat starttime, to detect pid reuse */
    uint64_t used[EGPU_REGION_MAX_CARDS];
} egpu_region_proc;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t size;            /* sizeof(egpu_region) */
    union { pthread_mutex_t mutex; char pad[64]; } lock; /* robust, process-shared */
    uint32_t ncards;
    uint32_t pad0;
    uint64_t repairs;         /* times a dead lock owner's state was repaired */
    uint64_t reaped;          /* dead processes reclaimed */
    uint8_t reserved[40];
    egpu_region_card cards[EGPU_REGION_MAX_CARDS];
    egpu_region_proc procs[EGPU_REGION_MAX_PROCS];
} egpu_region;

_Static_assert(sizeof(pthread_mutex_t) <= 64, "mutex fits its slot");
_Static_assert(sizeof(egpu_region_card) == 96, "card slot layout");
_Static_assert(sizeof(egpu_region_proc) == 144, "proc slot layout");
_Static_assert(sizeof(egpu_region) == 16 + 64 + 64 + 96 * EGPU_REGION_MAX_CARDS + 144 * EGPU_REGION_MAX_PROCS,
               "region layout is part of the contract with the node agent");
#endif
