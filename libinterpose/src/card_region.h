/* card_region.h: the per-card state of the compute controller, and the files behind it.
 *
 * On the node (docs/security.md, "Node-side state"), per card, a folder
 * <runtime>/cards/<uuid>/ that the runtime hook makes (root's, 0755) and mounts READ-ONLY
 * into every container with a share of the card:
 *   roster               written only by the node (the hook; the node agent removes pods'
 *                        entries): one entry per share, its slot index, priority, policy,
 *                        booked cores and floor. Layout: egpu_card_roster below.
 *   share-<owner:016x>   one share's slot (egpu_card_slot, 4096 bytes), written by that share
 *                        alone: the hook mounts it read-write into its own container only.
 * A process maps its own share file and reads the others' with bounded preads into a
 * process-private copy (egpu_card_region, never a file): a co-tenant that truncates, grows,
 * rewrites or locks its own file can only mislead the others about itself, within what the
 * roster booked for it, and never crash, hang or hold them. Priority, caps and floors of
 * others come only from the roster.
 *
 * Raw nodes (egpu run, tests) without the hook: a process whose folder is writable
 * registers its share in the roster itself (flag EGPU_ROSTER_RAW), under an flock on the
 * roster; such entries are freed when no process of the share holds its liveness lock.
 *
 * Rules: fixed-width fields only, little-endian (x86_64 / aarch64), no pointers. Times are
 * CLOCK_MONOTONIC nanoseconds, which every process on a node shares. Never sleep holding
 * a slot's mutex. Fields written outside the mutex (marked "atomic") are aligned 64-bit
 * words read and written with relaxed atomics. */
#ifndef EGPU_CARD_REGION_H
#define EGPU_CARD_REGION_H

#include <assert.h>
#include <pthread.h>
#include <stdint.h>

#define EGPU_CARD_SLOTS 32     /* shares (containers) per card */
#define EGPU_CARD_SLOT_PIDS 16 /* processes per share tracked for liveness */

enum { EGPU_CARD_PRIO_HIGH = 0, EGPU_CARD_PRIO_LOW = 1 };
enum { EGPU_CARD_STRICT = 0, EGPU_CARD_ELASTIC = 1 };

/* Slot flags. */
#define EGPU_SLOT_CAPPED 0x1u  /* the share has a token bucket (0 < cores < 100) */
#define EGPU_SLOT_WAITING 0x2u /* a launch of the share waited in the current window */

/* ---- the roster: <card folder>/roster, written by the node ---------------------------- */

#define EGPU_ROSTER_FILE "roster"
#define EGPU_SHARE_FILE_PREFIX "share-"
#define EGPU_ROSTER_MAGIC 0x54534F5255504745ULL /* "EGPUROST" as little-endian bytes */
#define EGPU_ROSTER_VERSION 1u
#define EGPU_ROSTER_RAW 0x1u /* registered by the interposer itself (raw node, no hook) */

typedef struct {        /* 64 bytes */
    uint64_t owner;     /* 0 = free; else the share's key, FNV-1a 64 of its container region path */
    uint32_t priority;  /* EGPU_CARD_PRIO_* */
    uint32_t policy;    /* EGPU_CARD_STRICT or EGPU_CARD_ELASTIC */
    uint32_t cores;     /* booked %, 0..100 */
    uint32_t floor_pct; /* low priority: % kept while high-priority work is active */
    uint32_t flags;     /* EGPU_ROSTER_* */
    uint32_t reserved;
    char name[32]; /* the share's folder name, <pod-uid>_<container>, NUL-padded */
} egpu_roster_entry;

typedef struct {          /* 128 + 32 * 64 = 2176 bytes */
    uint64_t magic;       /* EGPU_ROSTER_MAGIC */
    uint32_t version;     /* EGPU_ROSTER_VERSION */
    uint32_t nslots;      /* EGPU_CARD_SLOTS */
    uint32_t entry_size;  /* sizeof(egpu_roster_entry) */
    uint32_t header_size; /* 128 */
    uint64_t generation;  /* bumped by every change */
    char uuid[64];        /* the card's UUID, NUL-terminated */
    uint8_t pad[32];
    egpu_roster_entry entry[EGPU_CARD_SLOTS]; /* index = the share's slot */
} egpu_card_roster;

static_assert(sizeof(egpu_roster_entry) == 64, "roster entry layout changed: update docs/security.md");
static_assert(sizeof(egpu_card_roster) == 128 + 64 * EGPU_CARD_SLOTS, "roster layout changed");

/* One share on the card: 4096 bytes, its share file. The first 512 are the controller's
 * (what others and the node agent read: docs/compute.md); then the share's own mutex. */
typedef struct {
    uint64_t owner;                    /* 0 = free; else FNV-1a 64 of the share key (container region path) */
    int32_t pids[EGPU_CARD_SLOT_PIDS]; /* attached processes, 0 = empty; all dead => slot is freed */
    uint32_t priority;                 /* EGPU_CARD_PRIO_* */
    uint32_t policy;                   /* EGPU_CARD_STRICT or EGPU_CARD_ELASTIC */
    uint32_t cores;                    /* booked %, 0..100 (0: nothing booked, runs on idle compute) */
    uint32_t flags;                    /* EGPU_SLOT_* */
    uint32_t floor_pct;                /* low priority: % kept even while high-priority work is active */
    uint32_t rate_ppm;                 /* current refill rate, parts per million of wall time */
    /* token bucket, GPU nanoseconds (shared by the share's processes; under the mutex) */
    int64_t level_ns;        /* may go negative (debt) after a kernel longer than estimated */
    uint64_t refill_ns;      /* last refill */
    int64_t floor_level_ns;  /* the floor's own bucket (low priority only) */
    int64_t pi_integral_ppm; /* PI controller's integral term */
    uint64_t est_ns;         /* EWMA of measured GPU time per launch (pre-charge estimate) */
    uint64_t inflight_ns;    /* estimated GPU time of recorded groups not yet measured */
    /* measurement (under the mutex) */
    uint64_t win_start_ns;      /* current window began */
    uint64_t win_busy_ns;       /* GPU time measured in the current window */
    uint64_t last_win_busy_ns;  /* the previous complete window: GPU time ... */
    uint64_t last_win_len_ns;   /* ... over this wall time (use = busy / len) */
    uint64_t busy_total_ns;     /* monotonic counter of measured GPU time (exporter: rate) */
    uint64_t launches_total;    /* monotonic counter of gated launches (the poller adds them) */
    uint64_t wait_total_ns;     /* monotonic counter of time launches spent waiting */
    uint64_t last_active_ns;    /* last launch, to within a poll (atomic) */
    uint64_t busy_until_ns;     /* end of the latest measured GPU interval (merging) */
    uint64_t use_ppm;           /* smoothed measured use, ppm of wall time (for others' elastic) */
    uint64_t demand_ppm;        /* smoothed time with work outstanding or waiting, ppm */
    uint64_t tick_start_ns;     /* controller tick (smoothing, PI, elastic rate) began */
    uint64_t tick_busy_ns;      /* GPU time measured in the current tick */
    uint64_t tick_wait_ns;      /* launch wait time in the current tick */
    uint64_t inflight_n;        /* launches of recorded groups not yet measured (the poller
                                * counts a group in when it sees its event recorded) */
    uint64_t inflight_since_ns; /* first launch of the groups that began the outstanding period */
    uint64_t est_graph_ns;      /* as est_ns, for graph launches */
    uint64_t solo_ns[2];        /* one launch's own GPU time (kernel, graph), from one-launch
                                * groups: the bound of an overlapped group, the unit of the
                                * launch meters' prediction */
    uint64_t overlapped_total;  /* monotonic counter of groups measured while others were active */
    uint64_t last_complete_ns;  /* last measured completion (in-flight expiry) */
    uint64_t reserved[1];       /* reserved[0]: EGPU_SLOT_PID_OFD */
    uint64_t events_total;      /* monotonic counter of the events the gate recorded to measure
                                * the share's launches (one per group of launches) */
    uint64_t queued_until_ns;   /* predicted end of the share's queued work, as its processes'
                                * pollers last saw it (others' overlap test; atomic) */
    uint32_t solo_n[2];         /* one-launch samples taken into solo_ns (kernel, graph) */
    uint64_t hi_mark_ns;        /* high priority: last time its work was launched or outstanding
                                * (atomic; others read it, if the roster books the share high) */
    uint64_t reserved2[20];
    /* offset 512: the share's own (not the card's) lock, robust and process-shared */
    union {
        pthread_mutex_t mu;
        uint8_t mu_bytes[64];
    };
    uint64_t share_magic;   /* EGPU_SHARE_MAGIC once the file is initialised */
    uint32_t share_version; /* EGPU_SHARE_VERSION */
    uint32_t pad_share;
    uint8_t tail[4096 - 592];
} egpu_card_slot;

#define EGPU_SHARE_MAGIC 0x4552414855504745ULL /* "EGPUHARE" */
#define EGPU_SHARE_VERSION 2u
#define EGPU_SLOT_PUBLIC_BYTES 512 /* what is read of a co-tenant's share file */

/* Bit p set: the process in pids[p] holds an OFD write lock (fcntl F_OFD_SETLK) on the first
 * byte of its pids[p] cell in the share file, which the kernel drops when it dies; a peer
 * frees the cell iff no other open file description holds that lock: liveness across pid
 * namespaces (containers). Bit clear: the pid, judged in the peer's own pid namespace. */
#define EGPU_SLOT_PID_OFD(s) ((s)->reserved[0])

/* A process's view of the card: process-private memory, never a file. slot[self] is the
 * share's own file mapped over it (MAP_SHARED|MAP_FIXED: page-aligned); the other slots are
 * copies refreshed from their files by egpu_card_refresh, validated against the roster.
 * (compute_sim uses one region for all its shares, in plain memory.) */
typedef struct {
    union {
        struct {
            char uuid[64];                             /* the card's UUID */
            int32_t self;                              /* the slot of this process's share, -1 in plain memory */
            int32_t dir_fd;                            /* the card folder; -1 in plain memory */
            int32_t own_fd;                            /* the share file (liveness locks); -1 in plain memory */
            int32_t other_fd[EGPU_CARD_SLOTS];         /* co-tenants' share files, opened read-only */
            uint64_t other_owner[EGPU_CARD_SLOTS];     /* whom other_fd[j] belongs to */
            uint64_t roster_read_ns;                   /* last full read of the roster */
            uint64_t refreshed_ns;                     /* last read of the co-tenants' slots (atomic) */
            egpu_roster_entry roster[EGPU_CARD_SLOTS]; /* the node's word on each slot */
            uint64_t unbooked_ppm;                     /* the part of the card roster[] leaves unbooked */
            /* card-wide priority state (atomic words) */
            uint64_t hi_active_ns;      /* last time high-priority work was launched or outstanding */
            uint32_t n_low;             /* low-priority shares on the card (the roster's) */
            pthread_mutex_t refresh_mu; /* process-private: one refresh at a time */
            /* each co-tenant's measured work as this process believes it, what may explain a
             * wait of ours (compute_settle.c): other_credit_ns, the growth of its
             * busy_total_ns not yet used to explain one (atomic), at most what its booking
             * could have let out (other_allow_ns, refilled at egpu_credit_bound_ppm);
             * other_seen_ns: its busy_total_ns when last read (EGPU_BUSY_UNSEEN: not yet) */
            uint64_t other_credit_ns[EGPU_CARD_SLOTS];
            uint64_t other_allow_ns[EGPU_CARD_SLOTS];
            uint64_t other_seen_ns[EGPU_CARD_SLOTS];
        };
        uint8_t header_bytes[4096];
    };
    egpu_card_slot slot[EGPU_CARD_SLOTS];
} egpu_card_region;

static_assert(sizeof(pthread_mutex_t) <= 64, "mutex must fit its 64-byte cell");
static_assert(sizeof(egpu_card_slot) == 4096, "share file layout changed: update docs/compute.md");
static_assert(__builtin_offsetof(egpu_card_region, slot) == 4096, "slots must be page-aligned");
static_assert(__builtin_offsetof(egpu_card_slot, level_ns) == 96, "slot level offset");
static_assert(__builtin_offsetof(egpu_card_slot, busy_total_ns) == 176, "slot busy_total offset");
static_assert(__builtin_offsetof(egpu_card_slot, hi_mark_ns) == 344, "slot hi mark offset");
static_assert(__builtin_offsetof(egpu_card_slot, mu) == 512, "slot mutex offset");

/* A share's launches in flight are forgotten once nothing moved for EGPU_INFLIGHT_QUIET_NS or
 * EGPU_INFLIGHT_QUIET_ESTIMATES of its launch estimates, whichever is longer, since its last
 * completion or the start of its outstanding period: a process killed with groups in flight
 * never settles them. Its own processes clear them at their next launch (compute.c); every
 * reader applies the same rule to what it reads (card_region.c's refresh,
 * node_agent/metrics/card_region.py), so a share whose last process was killed stops counting
 * as active for its co-tenants and the node agent. */
#define EGPU_INFLIGHT_QUIET_NS (250 * 1000000ULL) /* 250 ms */
#define EGPU_INFLIGHT_QUIET_ESTIMATES 8
static inline int egpu_inflight_stale(const egpu_card_slot *s, uint64_t now_ns)
{
    uint64_t est = s->est_ns > s->est_graph_ns ? s->est_ns : s->est_graph_ns;
    uint64_t quiet =
        est > UINT64_MAX / EGPU_INFLIGHT_QUIET_ESTIMATES ? UINT64_MAX : est * EGPU_INFLIGHT_QUIET_ESTIMATES;
    if (quiet < EGPU_INFLIGHT_QUIET_NS) quiet = EGPU_INFLIGHT_QUIET_NS;
    uint64_t last = s->last_complete_ns > s->inflight_since_ns ? s->last_complete_ns : s->inflight_since_ns;
    return now_ns > last && now_ns - last > quiet;
}

/* The most a share's word about its own use is believed by its co-tenants, ppm of the card,
 * by what the roster booked: its cores and the FC-13 slack (a strict share's 1 s window within
 * cap + 3 points: the node agent's use_bound_ppm), the whole card for a share that booked it
 * whole. The same for an elastic share (or one with nothing booked): what it uses above its
 * guarantee is idle time it borrowed, not a claim on anyone, and no reader can tell that from
 * a lie (card_region.c, compute_settle.c). */
#define EGPU_CARD_PPM 1000000ULL       /* the whole card, ppm */
#define EGPU_PPM_PER_PCT 10000ULL       /* one booked point (%), ppm */
#define EGPU_CLAIM_SLACK_PPM 30000ULL   /* 3 points of the card */
static inline uint64_t egpu_claim_bound_ppm(uint32_t cores)
{
    if (cores >= 100) return EGPU_CARD_PPM;
    uint64_t b = (uint64_t)cores * EGPU_PPM_PER_PCT + EGPU_CLAIM_SLACK_PPM;
    return b < EGPU_CARD_PPM ? b : EGPU_CARD_PPM;
}

/* The most of the card a co-tenant's claimed use and demand are believed, ppm: a strict share
 * never runs past its cap (its claim bound); an elastic share (or one with nothing booked) may
 * take idle compute, so up to the whole card. Bounding an elastic co-tenant's claim to its
 * booking too starved elastic neighbours: in an elastic 30/35/35 mix of 2 ms / 1 ms / 50 us
 * kernels, the 50 us share got 2% of the card (compute_sim elastic-mix). */
static inline uint64_t egpu_use_bound_ppm(const egpu_roster_entry *e)
{
    return e->policy == EGPU_CARD_STRICT && e->cores ? egpu_claim_bound_ppm(e->cores) : EGPU_CARD_PPM;
}

/* The most of the card a co-tenant's measured work is believed to have taken, ppm, when it
 * explains a wait of ours (compute_settle.c): its claim bound, and for a share that may use
 * idle compute (elastic, or nothing booked) the part of the card nobody booked (unbooked_ppm):
 * handed to us, that harms no share with a booking. */
static inline uint64_t egpu_credit_bound_ppm(const egpu_roster_entry *e, uint64_t unbooked_ppm)
{
    uint64_t b = egpu_claim_bound_ppm(e->cores);
    if (e->cores < 100 && (e->policy == EGPU_CARD_ELASTIC || !e->cores)) b += unbooked_ppm;
    return b < EGPU_CARD_PPM ? b : EGPU_CARD_PPM;
}
#define EGPU_BUSY_UNSEEN UINT64_MAX /* other_seen_ns: not read yet */

/* What the node (or a raw share's own config) says of a share. */
typedef struct {
    uint64_t owner;
    uint32_t priority, policy, cores, floor_pct;
    const char *name; /* the folder name (roster entry), may be NULL */
} egpu_share_terms;

/* card_region.c */
/* Attaches process pid to share t->owner on the card whose folder is dir (module comment):
 * finds the share in the roster (registering it there when the folder is writable: raw
 * nodes), maps its share file over its slot of a new private region and joins it. Returns
 * the region and *slot, or NULL (errno, a line on stderr): no folder, no roster entry and
 * no right to add one, a full card, a share file that is a link or not a regular file. */
egpu_card_region *egpu_card_attach(const char *dir, const char *uuid, const egpu_share_terms *t, int32_t pid,
                                   int *slot);
/* Detaches pid from its share (process exit); the mapping stays (other threads may still
 * read it while the process exits). */
void egpu_card_detach(egpu_card_region *r, int slot, int32_t pid);
/* Refreshes the copies of the co-tenants' slots from their files (bounded preads), the
 * roster at most every roster_every_ns (0: now), the card-wide priority state and each
 * co-tenant's credit (other_credit_ns). A file that is short, foreign or lying is read as an
 * idle share with what the roster booked: values are clamped (use and demand to the booking,
 * egpu_claim_bound_ppm; times to now; launches in flight to none once quiet past
 * egpu_inflight_stale; a high-priority mark only from a share the roster books high). Never
 * blocks, never maps a co-tenant's file. */
void egpu_card_refresh(egpu_card_region *r, uint64_t now_ns, uint64_t roster_every_ns);
/* As egpu_card_refresh (the roster aside), when the copies are older than older_than_ns
 * and no other thread is refreshing them (a low-priority launch: its view of high-priority
 * work must be fresh). */
void egpu_card_try_refresh(egpu_card_region *r, uint64_t now_ns, uint64_t older_than_ns);
/* Whether the copies of the co-tenants' slots are older than older_than_ns (plain memory:
 * never). */
static inline int egpu_card_stale(const egpu_card_region *r, uint64_t now_ns, uint64_t older_than_ns)
{
    return r->dir_fd >= 0 && now_ns > __atomic_load_n(&r->refreshed_ns, __ATOMIC_RELAXED) + older_than_ns;
}
/* Plain-memory regions (compute_sim, unit tests): every slot's mutex ready, no files. */
void egpu_card_region_init(egpu_card_region *r, const char *uuid, uint64_t now_ns);
/* Joins (or claims) the slot of share `owner` in a plain-memory region (compute_sim). */
int egpu_card_claim(egpu_card_region *r, uint64_t owner, int32_t pid, uint32_t priority, uint32_t policy,
                    uint32_t cores, uint32_t floor_pct, uint64_t now_ns);
/* The share's own lock (slot's mutex). Robust: recovers a dead owner's lock (the data is
 * kept: every update is a few stores that leave it consistent enough). 0 on success;
 * ETIMEDOUT when another process of the SAME share held it for over 200 ms (logged once):
 * the caller then goes on uncoordinated, never waits forever. No co-tenant can take it. */
int egpu_card_lock(egpu_card_region *r, int slot);
void egpu_card_unlock(egpu_card_region *r, int slot);
/* FNV-1a 64 of a string; never 0. */
uint64_t egpu_owner_id(const char *key);

#endif
