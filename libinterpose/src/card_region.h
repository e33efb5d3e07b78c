/* card_region.h: the per-card shared region, /var/run/egpu/cards/<uuid>.
 *
 * Every share (container) on a card maps this file. It holds, under one robust
 * process-shared mutex, the compute controller of each share (token bucket, measured GPU
 * time) and the card-wide priority state (when high-priority work was last active). The
 * node agent reads it (read-only, no lock) for the compute-used metrics: the layout is
 * documented byte by byte in docs/compute.md; change both together and bump the version.
 *
 * Rules: fixed-width fields only, little-endian (x86_64 / aarch64), no pointers. Times are
 * CLOCK_MONOTONIC nanoseconds, which every process on a node shares. Never sleep holding
 * the mutex. Fields written outside the mutex (marked "atomic") are aligned 64-bit words
 * read and written with relaxed atomics. */
#ifndef EGPU_CARD_REGION_H
#define EGPU_CARD_REGION_H

#include <assert.h>
#include <pthread.h>
#include <stdint.h>

#define EGPU_CARD_MAGIC 0x4452414355504745ULL /* "EGPUCARD" as little-endian bytes */
#define EGPU_CARD_VERSION 1u
#define EGPU_CARD_SLOTS 32      /* shares (containers) per card */
#define EGPU_CARD_SLOT_PIDS 16  /* processes per share tracked for liveness */

enum { EGPU_CARD_PRIO_HIGH = 0, EGPU_CARD_PRIO_LOW = 1 };
enum { EGPU_CARD_STRICT = 0, EGPU_CARD_ELASTIC = 1 };

/* Slot flags. */
#define EGPU_SLOT_CAPPED 0x1u  /* the share has a token bucket (0 < cores < 100) */
#define EGPU_SLOT_WAITING 0x2u /* a launch of the share waited in the current window */

/* One share on the card: 512 bytes. */
typedef struct {
    uint64_t owner;            /* 0 = free; else FNV-1a 64 of the share key (container region path) */
    int32_t pids[EGPU_CARD_SLOT_PIDS]; /* attached processes, 0 = empty; all dead => slot is freed */
    uint32_t priority;         /* EGPU_CARD_PRIO_* */
    uint32_t policy;           /* EGPU_CARD_STRICT or EGPU_CARD_ELASTIC */
    uint32_t cores;            /* booked %, 0..100 (0: nothing booked, runs on idle compute) */
    uint32_t flags;            /* EGPU_SLOT_* */
    uint32_t floor_pct;        /* low priority: % kept even while high-priority work is active */
    uint32_t rate_ppm;         /* current refill rate, parts per million of wall time */
    /* token bucket, GPU nanoseconds (shared by the share's processes; under the mutex) */
    int64_t level_ns;          /* may go negative (debt) after a kernel longer than estimated */
    uint64_t refill_ns;        /* last refill */
    int64_t floor_level_ns;    /* the floor's own bucket (low priority only) */
    int64_t pi_integral_ppm;   /* PI controller's integral term */
    uint64_t est_ns;           /* EWMA of measured GPU time per launch (pre-charge estimate) */
    uint64_t inflight_ns;      /* estimated GPU time of recorded groups not yet measured */
    /* measurement (under the mutex) */
    uint64_t win_start_ns;     /* current window began */
    uint64_t win_busy_ns;      /* GPU time measured in the current window */
    uint64_t last_win_busy_ns; /* the previous complete window: GPU time ... */
    uint64_t last_win_len_ns;  /* ... over this wall time (use = busy / len) */
    uint64_t busy_total_ns;    /* monotonic counter of measured GPU time (exporter: rate) */
    uint64_t launches_total;   /* monotonic counter of gated launches (the poller adds them) */
    uint64_t wait_total_ns;    /* monotonic counter of time launches spent waiting */
    uint64_t last_active_ns;   /* last launch, to within a poll (atomic) */
    uint64_t busy_until_ns;    /* end of the latest measured GPU interval (merging) */
    uint64_t use_ppm;          /* smoothed measured use, ppm of wall time (for others' elastic) */
    uint64_t demand_ppm;       /* smoothed time with work outstanding or waiting, ppm */
    uint64_t tick_start_ns;    /* controller tick (smoothing, PI, elastic rate) began */
    uint64_t tick_busy_ns;     /* GPU time measured in the current tick */
    uint64_t tick_wait_ns;     /* launch wait time in the current tick */
    uint64_t inflight_n;       /* launches of recorded groups not yet measured (the poller
                                * counts a group in when it sees its event recorded) */
    uint64_t inflight_since_ns; /* first launch of the groups that began the outstanding period */
    uint64_t est_graph_ns;     /* as est_ns, for graph launches */
    uint64_t solo_ns[2];       /* one launch's own GPU time (kernel, graph), from one-launch
                                * groups: the bound of an overlapped group, the unit of the
                                * launch meters' prediction */
    uint64_t overlapped_total; /* monotonic counter of groups measured while others were active */
    uint64_t last_complete_ns; /* last measured completion (in-flight expiry) */
    uint64_t reserved[1];      /* reserved[0]: EGPU_SLOT_PID_OFD */
    uint64_t events_total;     /* monotonic counter of the events the gate recorded to measure
                                * the share's launches (one per group of launches) */
    uint64_t queued_until_ns;  /* predicted end of the share's queued work, as its processes'
                                * pollers last saw it (others' overlap test; atomic) */
    uint32_t solo_n[2];        /* one-launch samples taken into solo_ns (kernel, graph) */
    uint64_t reserved2[21];
} egpu_card_slot;

/* Bit p set: the process in pids[p] holds an OFD write lock (fcntl F_OFD_SETLK) on the first
 * byte of its pids[p] cell in the region file, which the kernel drops when it dies; a peer
 * frees the cell iff no other open file description holds that lock: liveness across pid
 * namespaces (containers). Bit clear: the pid, judged in the peer's own pid namespace. */
#define EGPU_SLOT_PID_OFD(s) ((s)->reserved[0])

/* The region: a 4096-byte header followed by the slots. */
typedef struct {
    uint64_t magic;            /* EGPU_CARD_MAGIC */
    uint32_t version;          /* EGPU_CARD_VERSION */
    uint32_t size;             /* sizeof(egpu_card_region) */
    uint32_t nslots;           /* EGPU_CARD_SLOTS */
    uint32_t slot_size;        /* sizeof(egpu_card_slot) */
    char uuid[64];             /* the card's UUID, NUL-terminated */
    uint64_t created_ns;
    uint8_t pad0[32];
    union {                    /* offset 128 */
        pthread_mutex_t mu;    /* robust, process-shared */
        uint8_t mu_bytes[64];
    };
    /* card-wide priority state, offset 192 (atomic words) */
    uint64_t hi_active_ns;     /* last time high-priority work was launched or outstanding */
    uint64_t hi_launches;      /* monotonic counter of high-priority launches seen */
    uint32_t n_low;            /* live low-priority slots (under the mutex) */
    uint32_t n_high;           /* live high-priority slots (under the mutex) */
    uint64_t generation;       /* bumped on every slot claim/free (under the mutex) */
    uint8_t pad1[4096 - 224];
    egpu_card_slot slot[EGPU_CARD_SLOTS];
} egpu_card_region;

static_assert(sizeof(pthread_mutex_t) <= 64, "mutex must fit its 64-byte cell");
static_assert(sizeof(egpu_card_slot) == 512, "card slot layout changed: update docs/compute.md");
static_assert(sizeof(egpu_card_region) == 4096 + 512 * EGPU_CARD_SLOTS,
              "card region layout changed: update docs/compute.md");
static_assert(__builtin_offsetof(egpu_card_region, mu) == 128, "mutex offset");
static_assert(__builtin_offsetof(egpu_card_region, hi_active_ns) == 192, "hi_active_ns offset");
static_assert(__builtin_offsetof(egpu_card_region, slot) == 4096, "slots offset");
static_assert(__builtin_offsetof(egpu_card_slot, level_ns) == 96, "slot level offset");
static_assert(__builtin_offsetof(egpu_card_slot, busy_total_ns) == 176, "slot busy_total offset");

/* card_region.c */
/* Opens the region at path, creating it, or initialising in place an existing EMPTY regular
 * file (the runtime hook pre-creates it), under an flock on the file. Refuses (NULL, errno,
 * a line on stderr) a link, a non-regular file, a file of another size or layout. */
egpu_card_region *egpu_card_region_open(const char *path, const char *uuid);
/* Initialises a region in caller memory (unit tests; process-private memory works too). */
void egpu_card_region_init(egpu_card_region *r, const char *uuid, uint64_t now_ns);
void egpu_card_region_close(egpu_card_region *r);
/* Robust lock: recovers a dead owner's lock (the data is kept: every update is a few
 * stores that leave it consistent enough; counters may lose one update). 0 on success;
 * ETIMEDOUT when another process held it for over 200 ms (logged once): the caller then
 * goes on uncoordinated, never waits forever. */
int egpu_card_lock(egpu_card_region *r);
void egpu_card_unlock(egpu_card_region *r);
/* Claims (or joins) the slot of share `owner` for process pid; frees slots whose processes
 * all died. Returns the slot index or -1 when the card has no free slot. Takes the lock. */
int egpu_card_claim(egpu_card_region *r, uint64_t owner, int32_t pid, uint32_t priority,
                    uint32_t policy, uint32_t cores, uint32_t floor_pct, uint64_t now_ns);
/* Detaches pid from its slot (process exit); frees the slot when no process is left. */
void egpu_card_release(egpu_card_region *r, int slot, int32_t pid);
/* FNV-1a 64 of a string; never 0. */
uint64_t egpu_owner_id(const char *key);

#endif
