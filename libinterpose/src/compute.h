/* compute.h: compute shares (caps in 1% steps, strict / elastic) and priority gating.
 *
 * Two layers (docs/compute.md has the design and why it converges):
 *  - the controller core (egpu_ctl_*, egpu_meter_*): pure functions over the per-card region
 *    and a stream's launch meter, with the clock passed in; no CUDA, no sleeping; unit-tested
 *    with a simulated clock;
 *  - the launch gate (egpu_compute_*): called by the launch hooks. A launch of a capped share
 *    draws its estimate from its thread's lease of the share's token bucket (no lock, no
 *    system call) and joins its stream's open group; an event is recorded after a launch only
 *    when the stream has none outstanding (or after a GPU-time budget); a background thread
 *    polls the events (cuEventQuery, never on the launch path) and settles each group on its
 *    event. The card lock is taken when a lease runs out, when a launch must wait and by the
 *    poller.
 *
 * Hook usage (the uncapped path costs one load and one predicted branch):
 *
 *     egpu_launch_ticket tk;
 *     EGPU_COMPUTE_BEFORE(hStream, EGPU_LAUNCH_KERNEL, &tk);
 *     CUresult r = real(...);
 *     EGPU_COMPUTE_AFTER(hStream, &tk, r);
 */
#ifndef EGPU_COMPUTE_H
#define EGPU_COMPUTE_H

#include <stddef.h>
#include <stdint.h>
#include "card_region.h"
#include "egpu_cuda.h"

/* A low-priority share's copies of its co-tenants' slots (card_region.h) are read again when
 * older than hi_hold / this (0.25 ms by default): a high-priority mark seen late lets low
 * launches slip in front of high-priority work. */
#define LOW_VIEW_FRESH_DIV 8

/* ---- controller core ---------------------------------------------------------------- */

typedef struct {
    uint64_t tick_ns;          /* smoothing / PI / elastic-rate period (50 ms) */
    uint64_t window_ns;        /* exporter window: last_win_busy_ns over last_win_len_ns (1 s) */
    uint64_t burst_ns;         /* token-bucket capacity, GPU ns (10 ms) */
    uint64_t max_stall_ns;     /* debt is bounded so that one launch waits at most this long (2 s) */
    uint64_t max_inflight_ns;  /* low priority: estimated outstanding GPU work allowed beyond
                                * two launches (2 ms): what a high-priority launch queues behind */
    uint64_t hi_hold_ns;       /* high priority counts as active this long after it was seen (2 ms) */
    uint64_t wait_step_ns;     /* longest single sleep of a waiting launch (1 ms) */
    uint64_t lease_ns;         /* GPU time a thread draws from its share's bucket at a time, then
                                * spends without any lock (1.25 ms: an eighth of the burst) */
    uint64_t group_min_ns;     /* an event closes a group once it holds this much estimated GPU
                                * time and the stream has no event outstanding (1 ms) */
    uint64_t group_max_ns;     /* ... or this much, outstanding or not (2 ms) */
    uint32_t pi_ki_ppm;        /* integral gain per tick, ppm of the error (100000 = 0.1) */
    uint32_t pi_limit_ppm;     /* |PI correction| bound, ppm of wall time (30000 = 3 points) */
    uint32_t elastic_headroom_ppm; /* elastic shares leave this much of the card idle (20000) */
    uint32_t min_rate_ppm;     /* a share with nothing booked never drops below this (10000) */
} egpu_ctl_params;

void egpu_ctl_defaults(egpu_ctl_params *p);
/* A thread's lease is this fraction of the burst (1.25 ms of 10 ms): the card lock once per
 * lease, and little held back per launching thread. */
#define EGPU_LEASE_BURST_DIV 8

/* What a launch is (the estimates are kept apart: a graph is many kernels). */
enum { EGPU_LAUNCH_KERNEL = 0, EGPU_LAUNCH_GRAPH = 1, EGPU_LAUNCH_PTSZ = 0x100 /* or-ed: a _ptsz entry point */ };
#define EGPU_LAUNCH_KIND(k) ((k) & 1)

/* Outcome of egpu_ctl_admit. */
enum {
    EGPU_ADMIT_GO = 0,         /* launch now; *est was pre-charged */
    EGPU_ADMIT_WAIT_CAP = 1,   /* the share's bucket is empty */
    EGPU_ADMIT_WAIT_PRIO = 2,  /* low priority while high-priority work is active */
    EGPU_ADMIT_WAIT_INFLIGHT = 3 /* low priority with enough work queued already */
};

/* ---- launch groups: GPU time without an event per launch ----------------------------
 * Kernels on a stream finish in order, so one event after a run of launches bounds them all.
 * A stream's launches since its last event form its open group. An event is recorded after
 * a launch when the stream has none outstanding and the group holds group_min_ns of estimated
 * work in at least EGPU_GROUP_MIN_LAUNCHES launches (or began EGPU_GROUP_MAX_AGE_NS ago), or
 * when it holds group_max_ns, outstanding or not, or when the launch alone is group_min_ns
 * long. After each of a stream's first EGPU_SAMPLE_FIRST events and every
 * EGPU_SOLO_SAMPLE_EVERY-th one later, a one-launch sample falls due: the first launch right
 * after an event that finds the stream's own work still queued (it starts right behind it:
 * other shares' work is less likely between) -- or, after EGPU_SAMPLE_PATIENCE such
 * launches that did not, the next one -- gets an event of its own. The group is settled on
 * its event: its measured interval, less the time the stream was predicted idle between its
 * launches, replaces the estimates it was pre-charged. */
#define EGPU_SOLO_SAMPLE_EVERY 8          /* one-launch samples: an eighth more events */
#define EGPU_SAMPLE_FIRST 16              /* ... at first after every event: it settles fast */
#define EGPU_SAMPLE_PATIENCE 64           /* launches after an event a due sample waits for a
                                           * queued stream (then an idle one will do) */
#define EGPU_GROUP_MIN_LAUNCHES 32        /* an event's cost (~2.5 us) spread over 32 launches or more */
#define EGPU_GROUP_MAX_AGE_NS 10000000ULL /* sparse launches: at most 100 events a second */

typedef struct {
    uint64_t t_first;          /* host time the group's first launch was queued (its call returned) */
    uint64_t gap_ns;           /* time the stream was predicted idle between its launches */
    uint64_t est_ns[2];        /* the sum of its launches' estimates: kernels, graphs */
    uint32_t n[2];             /* its launches: kernels, graphs */
    uint32_t gated;            /* its estimates were pre-charged: given back when it settles */
    uint32_t end_clamped;      /* its event's time mapped past the poll: taken as the poll's */
    uint64_t rec_ns;           /* one-launch groups: host time the event's record call returned */
} egpu_group;

/* One stream's meter, kept by the launching thread. */
typedef struct {
    egpu_group open;           /* launches since the stream's last event */
    uint64_t pred_end_ns;      /* predicted end of the stream's queued work (host clock) */
    uint64_t rec_seq;          /* events recorded after its launches (the launching thread's) */
    uint64_t settled_seq;      /* the last of them settled (atomic: written by the poller) */
    uint64_t measured_end_ns;  /* end of the last settled group (atomic: written by the poller) */
    uint32_t nrec;             /* events recorded for groups (the one-launch samples' clock) */
    uint32_t sample_due;       /* a one-launch sample is due (0: not), 1 + the launches right
                                * after an event that were passed over for it */
} egpu_stream_meter;

/* egpu_meter_add's answer (bits). */
enum {
    EGPU_METER_RECORD = 1,     /* record an event after this launch now, then egpu_meter_take */
    EGPU_METER_CLOSED = 2      /* *closed holds a group to settle by its estimates (the launch
                                * was gated where the open group was not, or the reverse) */
};

/* A launch went out on the stream at t0 (host time just before the call) with estimate est
 * (pre-charged when gated) and `unit`, the share's one-launch time, for the prediction.
 * t_queued: when the call returned (its kernel cannot have started before the driver queued
 * it), needed only when the launch opens a group (egpu_meter_opens); else pass t0. */
int egpu_meter_add(egpu_stream_meter *m, const egpu_ctl_params *p, int kind, int gated, uint64_t est,
                   uint64_t unit, uint64_t t0, uint64_t t_queued, egpu_group *closed);
/* Does the next launch open a group (the stream's group is empty)? */
static inline int egpu_meter_opens(const egpu_stream_meter *m) { return !(m->open.n[0] | m->open.n[1]); }

/* An event was recorded after the stream's last launch: returns its group (now closed) and
 * the event's sequence number in *seq (give it to egpu_meter_settled). */
egpu_group egpu_meter_take(egpu_stream_meter *m, uint64_t *seq);

/* The event seq settled, the group's work having ended at end_ns (0: unknown). Any thread. */
void egpu_meter_settled(egpu_stream_meter *m, uint64_t seq, uint64_t end_ns);
/* Predicted work still queued on the stream at `now`. */
uint64_t egpu_meter_queued(const egpu_stream_meter *m, uint64_t now);

/* May the share in `slot` launch now? The slow path of a gated launch (the thread's lease of
 * the bucket ran out, or a low-priority share's fast checks failed). *lease: in, the tokens
 * the caller held (folded into the bucket); out, on GO, what it holds after this launch's
 * estimate (*est) was drawn: a new lease of up to p->lease_ns, less the estimate (NULL: no
 * lease, the estimate alone is drawn). queued_ns: the launching stream's predicted queued
 * work (a low-priority share's in-flight bound). Otherwise *wait_ns says how long until it
 * may be worth asking again (never more than p->wait_step_ns). Takes the lock. */
int egpu_ctl_admit(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, uint64_t now,
                   uint64_t queued_ns, int64_t *lease, uint64_t *est, uint64_t *wait_ns);
/* A group of the share's launches finished on the GPU: its event fired at end_ns (0: not
 * measured, charge the estimates). Charges the group's measured GPU time (intervals of the
 * share merged, predicted idle time taken out; a group that overlapped another share's work
 * is charged at most its launches' solo estimates), gives back its pre-charges (when gated).
 * counted: the group was counted in the slot's in-flight figures (egpu_ctl_batch). */
void egpu_ctl_settle(egpu_card_region *r, int slot, const egpu_ctl_params *p, const egpu_group *g, int counted,
                     uint64_t end_ns, uint64_t now);

/* What the poller hands the slot on each pass, under one lock. */
typedef struct {
    uint64_t launches;         /* launches counted by the process since the last batch */
    uint64_t rec_n, rec_est_ns;/* newly recorded gated groups: launches, estimates (in flight) */
    uint64_t rec_since_ns;     /* the earliest first launch among them */
    int64_t lease_back;        /* lease tokens given back (a thread or the process exits) */
    uint64_t events;           /* events recorded since the last batch */
    uint64_t queued_until_ns;  /* predicted end of the process's queued work on the card */
} egpu_ctl_batch;
void egpu_ctl_batch_apply(egpu_card_region *r, int slot, const egpu_ctl_params *p, const egpu_ctl_batch *b,
                          uint64_t now);
/* A launch of the share waited waited_ns (statistics and the demand signal). */
void egpu_ctl_waited(egpu_card_region *r, int slot, const egpu_ctl_params *p, int why,
                     uint64_t waited_ns, uint64_t now);
/* Rolls the tick / window when due (the poller calls it while the share is idle). */
void egpu_ctl_tick(egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now);
/* High-priority work on the card was launched or is still outstanding at `now`. Lock-free. */
void egpu_ctl_hi_touch(egpu_card_region *r, uint64_t now);
/* Is high-priority work active on the card (lock-free read)? */
int egpu_ctl_hi_active(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t now);
/* Whether share `slot`'s figures are at rest, so that ticking it would change nothing others
 * read: none in flight (or only a killed process's, past egpu_inflight_stale), nothing
 * measured or waited in the open tick, smoothed use and demand decayed to 0, and no launch
 * for the ticks after which co-tenants count it idle. */
int egpu_ctl_slot_at_rest(const egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now);
/* Number of slots other than `self` that booked cores (lock-free read). */
int egpu_ctl_others_booked(const egpu_card_region *r, int self);
/* The share's current estimates (lock-free reads): *est per launch (pre-charge), *unit a
 * launch's own time (for the prediction), for kind k. */
void egpu_ctl_estimates(const egpu_card_region *r, int slot, int kind, uint64_t *est, uint64_t *unit);
/* Low priority, fast path: may a launch go without the slow path (lock-free)? No high-priority
 * activity and the stream's queue within bounds; the bucket is the caller's lease. */
int egpu_ctl_low_may_go(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t est, uint64_t queued_ns,
                        uint64_t now);

/* ---- launch gate -------------------------------------------------------------------- */

/* The driver functions the gate calls (filled from the real-symbol table). */
typedef struct {
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxGetDevice)(CUdevice *dev);
    CUresult (*cuEventCreate)(CUevent *ev, unsigned int flags);
    CUresult (*cuEventDestroy)(CUevent ev);
    CUresult (*cuEventRecord)(CUevent ev, CUstream s);
    CUresult (*cuEventQuery)(CUevent ev);
    CUresult (*cuEventSynchronize)(CUevent ev);
    CUresult (*cuEventElapsedTime)(float *ms, CUevent a, CUevent b);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
    /* Optional (NULL on drivers before CUDA 10.1): stream capture. A launch into a capturing
     * stream is recorded into a graph, not run: it is neither gated nor measured, and the
     * gate's own event calls run in RELAXED capture mode so that they never invalidate an
     * application's capture (cuThreadExchangeStreamCaptureMode). */
    CUresult (*cuStreamIsCapturing)(CUstream s, CUstreamCaptureStatus *status);
    CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *mode);
} egpu_compute_drv;

/* How many of egpu_compute_drv's functions are required (those before the optional ones). */
#define EGPU_COMPUTE_DRV_REQUIRED (offsetof(egpu_compute_drv, cuStreamIsCapturing) / sizeof(void *))

#define EGPU_COMPUTE_MAX_DEVS 16

/* The share as the config file says (or EGPU_* env), indexed by CUDA ordinal. */
typedef struct {
    int ndev;
    struct {
        int ours;              /* 0: not a card of this share (never gated) */
        int cores;             /* 0..100 */
        char uuid[64];
        char region_path[512]; /* /var/run/egpu/cards/<uuid> */
    } dev[EGPU_COMPUTE_MAX_DEVS];
    int priority;              /* EGPU_CARD_PRIO_* */
    int policy;                /* EGPU_CARD_STRICT / EGPU_CARD_ELASTIC */
    int floor_pct;             /* low priority floor, % (0: off) */
    char share_key[512];       /* identifies the share across its processes (container region path) */
} egpu_compute_cfg;

/* Fills params from the environment (EGPU_COMPUTE_*; see docs/compute.md) and floor_pct from
 * EGPU_LOW_PRIORITY_FLOOR when cfg->floor_pct < 0. */
void egpu_compute_env(egpu_ctl_params *p, egpu_compute_cfg *cfg);
/* Sets the gate up (once, after the share's devices are known). 0 ok; -1 when a card region
 * cannot be opened (the share then runs its cards ungated, with a warning). */
int egpu_compute_init(const egpu_compute_cfg *cfg, const egpu_ctl_params *p, const egpu_compute_drv *drv);


typedef struct {
    int dev;          /* -1: nothing to do after the launch */
    int kind;
    int gated;        /* est was drawn from the lease: given back if the launch fails */
    uint64_t est;     /* the launch's estimate (pre-charged when gated) */
    uint64_t unit;    /* a launch's own time, for the stream's prediction */
    uint64_t t0;      /* host ns just before the launch */
    CUcontext ctx;
    void *stream;     /* the launching thread's meter of the stream (NULL: an event after
                       * this launch alone, for threads beyond the gate's table) */
} egpu_launch_ticket;

/* Nonzero while any card of this process needs the gate (cap, low priority, or high priority
 * beside low-priority shares). The only thing the uncapped path reads. */
extern int egpu_compute_on;

void egpu_compute_before(CUstream s, int kind, egpu_launch_ticket *t);
void egpu_compute_after(CUstream s, egpu_launch_ticket *t, CUresult r);

#define EGPU_COMPUTE_BEFORE(stream, kind, tk) \
    do { \
        (tk)->dev = -1; \
        if (__builtin_expect(__atomic_load_n(&egpu_compute_on, __ATOMIC_RELAXED), 0)) \
            egpu_compute_before((stream), (kind), (tk)); \
    } while (0)
#define EGPU_COMPUTE_AFTER(stream, tk, res) \
    do { \
        if (__builtin_expect((tk)->dev >= 0, 0)) egpu_compute_after((stream), (tk), (res)); \
    } while (0)

/* Sets the gate up from the interposer state (hooks_compute.c); the cuInit hook calls it. */
void egpu_compute_setup(void);

/* Test / diagnostics: process all completed measurements now; returns how many are pending. */
int egpu_compute_poll_now(void);
/* Stops the poller and releases the card slots (atexit). */
void egpu_compute_shutdown(void);

#endif
