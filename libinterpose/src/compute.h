/* compute.h: compute shares (caps in 1% steps, strict / elastic) and priority gating.
 *
 * Two layers (docs/compute.md has the design and why it converges):
 *  - the controller core (egpu_ctl_*): pure functions over the per-card region with the
 *    clock passed in; no CUDA, no sleeping; unit-tested with a simulated clock;
 *  - the launch gate (egpu_compute_*): called by the launch hooks; measures the GPU time of
 *    each gated launch with CUDA events (polled with cuEventQuery by a background thread,
 *    never on the launch path) and waits, in short sleeps, while the core says so.
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
    uint32_t pi_ki_ppm;        /* integral gain per tick, ppm of the error (100000 = 0.1) */
    uint32_t pi_limit_ppm;     /* |PI correction| bound, ppm of wall time (30000 = 3 points) */
    uint32_t elastic_headroom_ppm; /* elastic shares leave this much of the card idle (20000) */
    uint32_t min_rate_ppm;     /* a share with nothing booked never drops below this (10000) */
} egpu_ctl_params;

void egpu_ctl_defaults(egpu_ctl_params *p);

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

/* May the share in `slot` launch now? On GO, pre-charges the share's per-launch estimate
 * (returned in *est; give it back to egpu_ctl_complete). Otherwise *wait_ns says how long
 * until it may be worth asking again (never more than p->wait_step_ns). Takes the lock. */
int egpu_ctl_admit(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, uint64_t now,
                   uint64_t *est, uint64_t *wait_ns);
/* A gated launch finished on the GPU: it was launched (host time) at launch_ns and its
 * completion event fired at end_ns (0: not measured, charge the estimate). Charges the
 * measured GPU time (intervals of the share merged; a launch that overlapped another
 * share's work is charged at most its solo estimate), refunds the estimate. gated = 0: a
 * launch that was only measured (high priority beside low): statistics only. */
void egpu_ctl_complete(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, int gated,
                       uint64_t est, uint64_t launch_ns, uint64_t end_ns, uint64_t now);
/* A launch that never happened (the driver refused it): refunds the estimate. */
void egpu_ctl_cancel(egpu_card_region *r, int slot, uint64_t est);
/* A launch of the share waited waited_ns (statistics and the demand signal). */
void egpu_ctl_waited(egpu_card_region *r, int slot, const egpu_ctl_params *p, int why,
                     uint64_t waited_ns, uint64_t now);
/* Rolls the tick / window when due (the poller calls it while the share is idle). */
void egpu_ctl_tick(egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now);
/* High-priority work on the card was launched or is still outstanding at `now`. Lock-free. */
void egpu_ctl_hi_touch(egpu_card_region *r, uint64_t now);
/* Is high-priority work active on the card (lock-free read)? */
int egpu_ctl_hi_active(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t now);
/* Number of slots other than `self` that booked cores (lock-free read). */
int egpu_ctl_others_booked(const egpu_card_region *r, int self);

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
    int gated;        /* pre-charged: complete or cancel */
    uint64_t est;
    uint64_t t0;      /* host ns at launch */
    CUcontext ctx;
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
/* Monotonic host clock, ns. */
uint64_t egpu_now_ns(void);

#endif
