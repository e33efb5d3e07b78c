/* compute.c: compute shares and priority gating (compute.h; design in docs/compute.md).
 *
 * Part 1, the controller core, is pure: it reads and writes the per-card region with the
 * clock passed in. Part 2, the launch gate, measures launches with CUDA events and sleeps
 * while part 1 says wait. Neither holds the card lock while sleeping or calling the driver. */
#define _GNU_SOURCE
#include "capture.h"
#include "compute.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PPM 1000000ULL

uint64_t egpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ===================================================================================== */
/* Part 1: the controller core                                                           */
/* ===================================================================================== */

void egpu_ctl_defaults(egpu_ctl_params *p)
{
    p->tick_ns = 50000000ULL;
    p->window_ns = 1000000000ULL;
    p->burst_ns = 10000000ULL;
    p->max_stall_ns = 2000000000ULL;
    p->max_inflight_ns = 2000000ULL;
    p->hi_hold_ns = 2000000ULL;
    p->wait_step_ns = 1000000ULL;
    p->pi_ki_ppm = 100000;
    p->pi_limit_ppm = 30000;
    p->elastic_headroom_ppm = 20000;
    p->min_rate_ppm = 10000;
}

#define EST_INITIAL_NS 100000ULL /* first launch of a share: 100 us until measured */
#define HI_RECENT_NS 1000000000ULL /* high priority seen this recently: low keeps one launch queued */

static uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }
static int64_t i64clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A share has a token bucket unless it booked the whole card. */
static int has_bucket(const egpu_card_slot *s) { return s->cores < 100; }

static int64_t debt_floor(const egpu_card_slot *s, const egpu_ctl_params *p)
{
    /* bounded debt: one launch far longer than its estimate waits at most max_stall_ns */
    return -(int64_t)((p->max_stall_ns / 1000) * s->rate_ppm / 1000);
}

/* What the other live shares on the card hold: their measured use, raised to their guarantee
 * while they want more than they get (demand above use) -- so that an elastic share gives
 * back what it borrowed as soon as the owner asks. */
static uint64_t others_reserved_ppm(const egpu_card_region *r, int self, const egpu_ctl_params *p,
                                    uint64_t now)
{
    uint64_t sum = 0;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        if (j == self || !o->owner) continue;
        uint64_t last = __atomic_load_n(&o->last_active_ns, __ATOMIC_RELAXED);
        if (!o->inflight_n && (!last || now - last > 4 * p->tick_ns)) continue; /* idle */
        uint64_t res = o->use_ppm;
        uint64_t guarantee = (uint64_t)o->cores * 10000ULL;
        if (o->demand_ppm > o->use_ppm + 50000 || o->use_ppm + 20000 >= guarantee)
            res = u64max(res, u64min(guarantee, o->demand_ppm));
        sum += res;
    }
    return u64min(sum, PPM);
}

static uint64_t base_rate_ppm(const egpu_card_region *r, int i, const egpu_ctl_params *p, uint64_t now)
{
    const egpu_card_slot *s = &r->slot[i];
    uint64_t guarantee = (uint64_t)s->cores * 10000ULL;
    if (s->policy == EGPU_CARD_STRICT && s->cores > 0) return guarantee;
    /* elastic, or nothing booked (lowest guarantee): at least the guarantee, plus what the
     * others leave idle */
    uint64_t others = others_reserved_ppm(r, i, p, now);
    uint64_t idle = PPM > others + p->elastic_headroom_ppm ? PPM - others - p->elastic_headroom_ppm : 0;
    return u64max(u64max(guarantee, idle), p->min_rate_ppm);
}

static void refill_locked(egpu_card_slot *s, const egpu_ctl_params *p, uint64_t now)
{
    if (now <= s->refill_ns) return;
    uint64_t dt = u64min(now - s->refill_ns, 10000000000ULL);
    s->refill_ns = now;
    if (has_bucket(s)) {
        int64_t add = (int64_t)((dt / 100) * s->rate_ppm / 10000);
        s->level_ns = i64clamp(s->level_ns + add, debt_floor(s, p), (int64_t)p->burst_ns);
    }
    if (s->floor_pct) {
        int64_t add = (int64_t)(dt * s->floor_pct / 100);
        s->floor_level_ns = i64clamp(s->floor_level_ns + add, -(int64_t)p->max_stall_ns, (int64_t)p->burst_ns);
    }
}

static void tick_locked(egpu_card_region *r, int i, const egpu_ctl_params *p, uint64_t now)
{
    egpu_card_slot *s = &r->slot[i];
    if (!s->tick_start_ns || now < s->tick_start_ns) s->tick_start_ns = now;
    if (!s->win_start_ns || now < s->win_start_ns) s->win_start_ns = now;
    if (now - s->win_start_ns >= p->window_ns) {
        s->last_win_busy_ns = s->win_busy_ns;
        s->last_win_len_ns = now - s->win_start_ns;
        s->win_busy_ns = 0;
        s->win_start_ns = now;
    }
    if (s->rate_ppm == 0) s->rate_ppm = (uint32_t)base_rate_ppm(r, i, p, now);
    if (now - s->tick_start_ns < p->tick_ns) return;
    uint64_t len = now - s->tick_start_ns;
    /* unclamped for the PI: a tick may see more than its length (a launch is charged
     * whole when it completes); clamping would bias the integral upwards */
    uint64_t use = s->tick_busy_ns * PPM / len;
    uint64_t dem = u64min(PPM, (s->tick_busy_ns + s->tick_wait_ns) * PPM / len);
    s->use_ppm = (s->use_ppm + u64min(use, PPM)) / 2;
    s->demand_ppm = (s->demand_ppm + dem) / 2;
    uint64_t base = base_rate_ppm(r, i, p, now);
    int64_t rate = (int64_t)base;
    if (s->policy == EGPU_CARD_STRICT && s->cores > 0 && s->cores < 100) {
        /* PI trim on the measured tick: only while the cap is what limits the share (anti
         * windup), or when it ran above the cap. Corrects the bucket's systematic losses
         * (burst clipping, estimate refunds) so the measured use converges on the cap. */
        int64_t err = (int64_t)base - (int64_t)use;
        if ((s->flags & EGPU_SLOT_WAITING) || err < 0) {
            s->pi_integral_ppm += err * (int64_t)p->pi_ki_ppm / (int64_t)PPM;
            s->pi_integral_ppm = i64clamp(s->pi_integral_ppm, -(int64_t)p->pi_limit_ppm, (int64_t)p->pi_limit_ppm);
        }
        rate += s->pi_integral_ppm;
        rate = i64clamp(rate, (int64_t)base / 2, (int64_t)PPM);
    }
    s->rate_ppm = (uint32_t)rate;
    s->flags &= ~EGPU_SLOT_WAITING;
    s->tick_busy_ns = 0;
    s->tick_wait_ns = 0;
    s->tick_start_ns = now;
}

void egpu_ctl_hi_touch(egpu_card_region *r, uint64_t now)
{
    uint64_t old = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    while (old < now && !__atomic_compare_exchange_n(&r->hi_active_ns, &old, now, 1,
                                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

int egpu_ctl_hi_active(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t now)
{
    uint64_t t = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    return t && now < t + p->hi_hold_ns;
}

int egpu_ctl_others_booked(const egpu_card_region *r, int self)
{
    int n = 0;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++)
        if (j != self && __atomic_load_n(&r->slot[j].owner, __ATOMIC_RELAXED) &&
            __atomic_load_n(&r->slot[j].cores, __ATOMIC_RELAXED) > 0)
            n++;
    return n;
}

int egpu_ctl_admit(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, uint64_t now,
                   uint64_t *est, uint64_t *wait_ns)
{
    *est = 0;
    *wait_ns = 0;
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS) return EGPU_ADMIT_GO; /* released (exit) */
    if (egpu_card_lock(r) != 0) return EGPU_ADMIT_GO; /* never block work on a broken lock */
    egpu_card_slot *s = &r->slot[slot];
    tick_locked(r, slot, p, now);
    refill_locked(s, p, now);
    if (s->inflight_n) {
        /* A process of the share that died (or exited) with launches in flight never
         * completes them: forget in-flight work that has not moved for a long time, so
         * that no one waits on it forever. */
        uint64_t quiet = u64max(250 * 1000000ULL, 8 * u64max(s->est_ns, s->est_graph_ns));
        uint64_t last = u64max(s->last_complete_ns, s->inflight_since_ns);
        if (now > last + quiet) {
            s->inflight_n = 0;
            s->inflight_ns = 0;
        }
    }
    uint64_t ke = EGPU_LAUNCH_KIND(kind) == EGPU_LAUNCH_GRAPH ? s->est_graph_ns : s->est_ns;
    uint64_t e = ke ? ke : EST_INITIAL_NS;
    int floor_go = 0, why = EGPU_ADMIT_GO;
    uint64_t hint = p->wait_step_ns;
    if (s->priority == EGPU_CARD_PRIO_LOW) {
        uint64_t hi = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
        if (hi && now < hi + p->hi_hold_ns) {
            if (s->floor_pct && s->floor_level_ns > 0 && !s->inflight_n) {
                floor_go = 1; /* the floor: a trickle of launches, one at a time */
            } else {
                why = EGPU_ADMIT_WAIT_PRIO;
                hint = u64min(hint, hi + p->hi_hold_ns - now);
                if (s->floor_pct && s->floor_level_ns <= 0 && s->floor_pct)
                    hint = u64min(hint, (uint64_t)(-s->floor_level_ns) * 100 / s->floor_pct + 1000);
            }
        } else {
            /* Keeps what a high-priority launch finds queued ahead of it short: beyond two
             * launches, at most max_inflight of work; while high-priority work was seen in
             * the last second (a latency-sensitive neighbour), one launch unless the queue
             * stays within max_inflight. */
            int hi_recent = hi && now < hi + HI_RECENT_NS;
            int full = hi_recent ? (s->inflight_n >= 1 && s->inflight_ns + e > p->max_inflight_ns)
                                 : (s->inflight_n >= 2 && s->inflight_ns >= p->max_inflight_ns);
            if (full) {
                why = EGPU_ADMIT_WAIT_INFLIGHT;
                /* sleep until the queued work should be done (it began at inflight_since) */
                uint64_t done = s->inflight_since_ns + s->inflight_ns;
                hint = u64min(hint, done > now ? done - now : 0);
            }
        }
    }
    /* the floor's launches pass the bucket unless the share has a strict cap of its own */
    int bucket = has_bucket(s) && !(floor_go && !(s->policy == EGPU_CARD_STRICT && s->cores > 0));
    if (why == EGPU_ADMIT_GO && bucket && s->level_ns <= 0) {
        why = EGPU_ADMIT_WAIT_CAP;
        uint64_t rate = s->rate_ppm ? s->rate_ppm : 1;
        uint64_t need = (uint64_t)(-s->level_ns) + 1000;
        hint = u64min(hint, need / rate * PPM + (need % rate) * PPM / rate);
        s->flags |= EGPU_SLOT_WAITING;
    }
    if (why == EGPU_ADMIT_GO) {
        if (has_bucket(s)) s->level_ns -= (int64_t)e;
        if (floor_go) s->floor_level_ns -= (int64_t)e;
        s->inflight_ns += e;
        if (!s->inflight_n++) s->inflight_since_ns = now;
        s->launches_total++;
        __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
        *est = e;
    }
    egpu_card_unlock(r);
    if (why == EGPU_ADMIT_GO && s->priority == EGPU_CARD_PRIO_HIGH) egpu_ctl_hi_touch(r, now);
    *wait_ns = why == EGPU_ADMIT_GO ? 0 : u64max(hint, 20000);
    return why;
}

static void account_locked(egpu_card_slot *s, uint64_t charge)
{
    s->tick_busy_ns += charge;
    s->win_busy_ns += charge;
    s->busy_total_ns += charge;
}

/* Was another share's work on the card during [start, end)? Its measured work ended after
 * our start, or it has work outstanding since before our end, or high-priority work was
 * active (lock held). */
static int overlapped_locked(const egpu_card_region *r, int self, uint64_t start, uint64_t end)
{
    if (__atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED) > start && r->slot[self].priority == EGPU_CARD_PRIO_LOW)
        return 1;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        if (j == self || !o->owner) continue;
        if (o->busy_until_ns > start) return 1;
        if (o->inflight_n && o->inflight_since_ns < end) return 1;
    }
    return 0;
}

void egpu_ctl_complete(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, int gated,
                       uint64_t est, uint64_t launch_ns, uint64_t end_ns, uint64_t now)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    refill_locked(s, p, now);
    int k = EGPU_LAUNCH_KIND(kind);
    uint64_t charge = est;
    if (end_ns) {
        /* the share's GPU intervals merged: time before its previous measured end, or before
         * the launch itself, is not this launch's */
        uint64_t start = u64max(launch_ns, s->busy_until_ns);
        charge = end_ns > start ? end_ns - start : 0;
        if (end_ns > s->busy_until_ns) s->busy_until_ns = end_ns;
        if (charge) {
            uint64_t *so = &s->solo_ns[k];
            if (overlapped_locked(r, slot, start, end_ns)) {
                /* the interval holds other shares' time (time-sliced or queued ahead of
                 * ours): charge what the launch costs alone, never more than measured. A
                 * measurement is an upper bound of the launch's own time, so the estimate
                 * follows smaller ones at once and larger ones slowly (kernels that grew). */
                if (!*so) *so = charge;
                else if (charge < *so) *so = (*so + charge) / 2;
                else *so += (charge - *so) / 64;
                if (*so < charge) charge = *so;
                s->overlapped_total++;
            } else {
                *so = *so ? (*so * 7 + charge) / 8 : charge;
            }
        }
        uint64_t *ep = k == EGPU_LAUNCH_GRAPH ? &s->est_graph_ns : &s->est_ns;
        *ep = *ep ? (*ep * 7 + charge) / 8 : charge;
        if (*ep < 1000) *ep = 1000;
    }
    if (gated) {
        s->last_complete_ns = now;
        if (has_bucket(s))
            s->level_ns = i64clamp(s->level_ns + (int64_t)est - (int64_t)charge, debt_floor(s, p), (int64_t)p->burst_ns);
        s->inflight_ns = s->inflight_ns > est ? s->inflight_ns - est : 0;
        if (s->inflight_n) s->inflight_n--;
        if (!s->inflight_n) s->inflight_ns = 0;
    }
    account_locked(s, charge);
    tick_locked(r, slot, p, now);
    egpu_card_unlock(r);
}

void egpu_ctl_cancel(egpu_card_region *r, int slot, uint64_t est)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    if (has_bucket(s)) s->level_ns += (int64_t)est;
    s->inflight_ns = s->inflight_ns > est ? s->inflight_ns - est : 0;
    if (s->inflight_n) s->inflight_n--;
    egpu_card_unlock(r);
}

void egpu_ctl_waited(egpu_card_region *r, int slot, const egpu_ctl_params *p, int why,
                     uint64_t waited_ns, uint64_t now)
{
    (void)why;
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    s->tick_wait_ns += waited_ns;
    s->wait_total_ns += waited_ns;
    tick_locked(r, slot, p, now);
    egpu_card_unlock(r);
}

void egpu_ctl_tick(egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    tick_locked(r, slot, p, now);
    refill_locked(&r->slot[slot], p, now);
    egpu_card_unlock(r);
}

/* ===================================================================================== */
/* Part 2: the launch gate                                                               */
/* ===================================================================================== */

enum { MODE_NONE = 0, MODE_CTL = 1, MODE_WATCH = 2 };
#define MAX_PENDING 4096
#define MAX_FREE_EVENTS 1024
#define MAX_CTX 32
#define CU_STREAM_NON_BLOCKING_ 0x1
#define REANCHOR_NS 20000000000ULL

typedef struct {
    CUevent ev;
    CUcontext ctx;
    CUstream stream;
    uint64_t t0, est;
    int dev;
    int gated;
    int kind;
} pending_rec;

typedef struct {
    CUcontext ctx;
    int dev;
    CUevent anchor;
    CUstream anchor_stream;
    uint64_t anchor_ns;   /* host time of the anchor event */
    uint64_t anchored_at; /* when it was made */
    int ok;
    int failures;         /* anchoring attempts that failed: give up after a few */
} ctx_ent;

typedef struct {
    egpu_card_region *r;
    int slot;
    int mode;             /* MODE_* (atomic) */
    int cores;
} card_ent;

static struct {
    pthread_mutex_t mu;   /* everything below except the atomics */
    int inited;
    egpu_compute_cfg cfg;
    egpu_ctl_params p;
    egpu_compute_drv d;
    card_ent card[EGPU_COMPUTE_MAX_DEVS];
    ctx_ent ctx[MAX_CTX];
    int nctx;
    struct { CUevent ev; CUcontext ctx; } freeev[MAX_FREE_EVENTS];
    int nfree;
    pending_rec pend[MAX_PENDING];
    int npend;
    pthread_t thr;
    int thr_started;
    int stop;             /* atomic */
    uint64_t poll_ns;
    uint64_t last_modes_ns;
} g_c = {.mu = PTHREAD_MUTEX_INITIALIZER};

int egpu_compute_on;

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
    }
}

static uint64_t env_u64(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    /* 0 or garbage keeps the default: a zero tick or burst would divide by zero or spin. */
    return end != v && !*end && x > 0 && x < (1ull << 40) ? (uint64_t)x : def;
}

void egpu_compute_env(egpu_ctl_params *p, egpu_compute_cfg *cfg)
{
    /* Tunables, microseconds (tests scale time with them); docs/compute.md lists them. */
    p->tick_ns = env_u64("EGPU_COMPUTE_TICK_US", p->tick_ns / 1000) * 1000;
    p->window_ns = env_u64("EGPU_COMPUTE_WINDOW_US", p->window_ns / 1000) * 1000;
    p->burst_ns = env_u64("EGPU_COMPUTE_BURST_US", p->burst_ns / 1000) * 1000;
    p->max_inflight_ns = env_u64("EGPU_COMPUTE_INFLIGHT_US", p->max_inflight_ns / 1000) * 1000;
    p->hi_hold_ns = env_u64("EGPU_COMPUTE_HI_HOLD_US", p->hi_hold_ns / 1000) * 1000;
    p->max_stall_ns = env_u64("EGPU_COMPUTE_MAX_STALL_US", p->max_stall_ns / 1000) * 1000;
    if (cfg && cfg->floor_pct < 0) {
        uint64_t f = env_u64("EGPU_LOW_PRIORITY_FLOOR", 0);
        cfg->floor_pct = f > 100 ? 100 : (int)f;
    }
}

static int want_mode(int dev)
{
    card_ent *c = &g_c.card[dev];
    if (!c->r || c->slot < 0) return MODE_NONE;
    if (g_c.cfg.priority == EGPU_CARD_PRIO_LOW) return MODE_CTL;
    if (c->cores > 0 && c->cores < 100) return MODE_CTL;
    if (c->cores == 0 && egpu_ctl_others_booked(c->r, c->slot) > 0) return MODE_CTL;
    if (__atomic_load_n(&c->r->n_low, __ATOMIC_RELAXED) > 0) return MODE_WATCH;
    return MODE_NONE;
}

static void update_modes(void)
{
    int any = 0;
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        int m = want_mode(d);
        __atomic_store_n(&g_c.card[d].mode, m, __ATOMIC_RELAXED);
        any |= m != MODE_NONE;
    }
    __atomic_store_n(&egpu_compute_on, any, __ATOMIC_RELAXED);
}

/* ctx -> entry (lock held). */
static ctx_ent *ctx_find(CUcontext ctx)
{
    for (int i = 0; i < g_c.nctx; i++)
        if (g_c.ctx[i].ctx == ctx) return &g_c.ctx[i];
    return NULL;
}

/* The gate's own event queries, synchronisations and anchors run in RELAXED capture mode
 * (capture.h): an application's graph capture must never be invalidated by them. */
static egpu_capture_relax relax_capture(void) { return egpu_capture_relaxed(g_c.d.cuThreadExchangeStreamCaptureMode); }
static void restore_capture(egpu_capture_relax c) { egpu_capture_restore(g_c.d.cuThreadExchangeStreamCaptureMode, c); }

/* A launch into a capturing stream is recorded into a graph, not run: it is charged when the
 * graph is launched (cuGraphLaunch goes through the gate as one launch). */
static int stream_capturing(CUstream s, int kind)
{
    return egpu_stream_capturing(g_c.d.cuStreamIsCapturing, egpu_stream_of(s, kind & EGPU_LAUNCH_PTSZ));
}

/* Host time of an anchor event: record on our own idle stream, wait, take the midpoint of
 * the tightest of three tries. The current context must be ctx. */
static int make_anchor_relaxed(ctx_ent *e);
static int make_anchor(ctx_ent *e)
{
    egpu_capture_relax cr = relax_capture();
    int rc = make_anchor_relaxed(e);
    restore_capture(cr);
    return rc;
}

static int make_anchor_relaxed(ctx_ent *e)
{
    const egpu_compute_drv *d = &g_c.d;
    if (!e->anchor_stream && d->cuStreamCreate(&e->anchor_stream, CU_STREAM_NON_BLOCKING_) != CUDA_SUCCESS)
        return -1;
    CUevent best = NULL;
    uint64_t best_span = UINT64_MAX, best_mid = 0;
    for (int i = 0; i < 3; i++) {
        CUevent ev;
        if (d->cuEventCreate(&ev, 0) != CUDA_SUCCESS) break;
        uint64_t t0 = egpu_now_ns();
        if (d->cuEventRecord(ev, e->anchor_stream) != CUDA_SUCCESS || d->cuEventSynchronize(ev) != CUDA_SUCCESS) {
            d->cuEventDestroy(ev);
            break;
        }
        uint64_t t1 = egpu_now_ns();
        if (t1 - t0 < best_span) {
            if (best) d->cuEventDestroy(best);
            best = ev;
            best_span = t1 - t0;
            best_mid = t0 + (t1 - t0) / 2;
        } else {
            d->cuEventDestroy(ev);
        }
    }
    if (!best) {
        e->failures++;
        return -1;
    }
    if (e->anchor) d->cuEventDestroy(e->anchor);
    e->anchor = best;
    e->anchor_ns = best_mid;
    e->anchored_at = egpu_now_ns();
    e->ok = 1;
    return 0;
}

/* The context's entry, made (device looked up, anchor recorded) on first sight. Called on
 * the launching thread, whose current context is ctx. Lock held. */
static ctx_ent *ctx_get(CUcontext ctx)
{
    ctx_ent *e = ctx_find(ctx);
    if (e) return e;
    if (g_c.nctx >= MAX_CTX) return NULL;
    CUdevice dev;
    if (g_c.d.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return NULL;
    static int exit_hook;
    if (!exit_hook) {
        /* Registered at the first gated launch, after the CUDA runtime registered its own
         * teardown: at exit ours runs first and stops the poller before the driver goes. */
        exit_hook = 1;
        atexit(egpu_compute_shutdown);
    }
    e = &g_c.ctx[g_c.nctx++];
    memset(e, 0, sizeof *e);
    e->ctx = ctx;
    e->dev = dev;
    if (make_anchor(e) != 0) e->ok = 0;
    return e;
}

static CUevent event_take(CUcontext ctx)
{
    for (int i = g_c.nfree - 1; i >= 0; i--) {
        if (g_c.freeev[i].ctx != ctx) continue;
        CUevent ev = g_c.freeev[i].ev;
        g_c.freeev[i] = g_c.freeev[--g_c.nfree];
        return ev;
    }
    CUevent ev = NULL;
    egpu_capture_relax cr = relax_capture(); /* not a stream operation: keep it out of captures */
    CUresult r = g_c.d.cuEventCreate(&ev, 0);
    restore_capture(cr);
    return r == CUDA_SUCCESS ? ev : NULL;
}

static void event_give(CUevent ev, CUcontext ctx)
{
    if (g_c.nfree < MAX_FREE_EVENTS) {
        g_c.freeev[g_c.nfree].ev = ev;
        g_c.freeev[g_c.nfree].ctx = ctx;
        g_c.nfree++;
    } else {
        g_c.d.cuEventDestroy(ev);
    }
}

/* Completes finished records (lock held). only_ctx: when not NULL, only that context's
 * records (a launching thread must not switch its current context). Returns the number
 * still pending; sets *hi_busy when one of them is not finished. */
static int poll_locked_relaxed(CUcontext only_ctx, int switch_ctx, int *hi_busy_mask);
static int poll_locked(CUcontext only_ctx, int switch_ctx, int *hi_busy_mask)
{
    if (!g_c.npend) return 0;
    egpu_capture_relax cr = relax_capture();
    int n = poll_locked_relaxed(only_ctx, switch_ctx, hi_busy_mask);
    restore_capture(cr);
    return n;
}

static int poll_locked_relaxed(CUcontext only_ctx, int switch_ctx, int *hi_busy_mask)
{
    const egpu_compute_drv *d = &g_c.d;
    uint64_t now = egpu_now_ns();
    CUstream blocked[16];
    int nblocked = 0, kept = 0;
    CUcontext cur = NULL;
    for (int i = 0; i < g_c.npend; i++) {
        pending_rec *pr = &g_c.pend[i];
        int keep = 1;
        int skip = (only_ctx && pr->ctx != only_ctx);
        for (int b = 0; !skip && b < nblocked; b++)
            if (blocked[b] == pr->stream) skip = 1;
        if (!skip) {
            if (switch_ctx && pr->ctx != cur) {
                d->cuCtxSetCurrent(pr->ctx);
                cur = pr->ctx;
            }
            CUresult q = d->cuEventQuery(pr->ev);
            if (q == CUDA_ERROR_NOT_READY) {
                if (nblocked < 16) blocked[nblocked++] = pr->stream;
            } else {
                uint64_t end = 0;
                ctx_ent *ce = ctx_find(pr->ctx);
                if (q == CUDA_SUCCESS && ce && ce->ok) {
                    float ms = 0;
                    if (d->cuEventElapsedTime(&ms, ce->anchor, pr->ev) == CUDA_SUCCESS) {
                        double e = (double)ce->anchor_ns + (double)ms * 1e6;
                        end = e > 0 ? (uint64_t)e : 0;
                        if (end > now) end = now;
                    } else {
                        ce->ok = 0; /* re-anchor on the next launch in that context */
                    }
                }
                card_ent *c = &g_c.card[pr->dev];
                if (c->r && (pr->gated || end))
                    egpu_ctl_complete(c->r, c->slot, &g_c.p, pr->kind, pr->gated, pr->est, pr->t0, end, now);
                if (q == CUDA_SUCCESS) event_give(pr->ev, pr->ctx);
                keep = 0;
            }
        }
        if (keep) {
            if (hi_busy_mask && g_c.cfg.priority == EGPU_CARD_PRIO_HIGH && pr->dev < 32) *hi_busy_mask |= 1 << pr->dev;
            g_c.pend[kept++] = *pr;
        }
    }
    g_c.npend = kept;
    return kept;
}

int egpu_compute_poll_now(void)
{
    pthread_mutex_lock(&g_c.mu);
    int n = poll_locked(NULL, 0, NULL);
    pthread_mutex_unlock(&g_c.mu);
    return n;
}

static void *poller(void *arg)
{
    (void)arg;
    /* this thread only ever queries: RELAXED for good, so its polls need no exchange */
    (void)relax_capture();
    while (!__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) {
        int hi_mask = 0, n;
        pthread_mutex_lock(&g_c.mu);
        if (__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) { /* shut down while we waited */
            pthread_mutex_unlock(&g_c.mu);
            break;
        }
        n = poll_locked_relaxed(NULL, 1, &hi_mask);
        uint64_t now = egpu_now_ns();
        for (int dv = 0; dv < g_c.cfg.ndev && dv < 32; dv++)
            if ((hi_mask >> dv) & 1) egpu_ctl_hi_touch(g_c.card[dv].r, now);
        if (now - g_c.last_modes_ns >= g_c.p.tick_ns / 4) {
            g_c.last_modes_ns = now;
            update_modes();
            for (int dv = 0; dv < g_c.cfg.ndev; dv++)
                if (g_c.card[dv].r && g_c.card[dv].slot >= 0) egpu_ctl_tick(g_c.card[dv].r, g_c.card[dv].slot, &g_c.p, now);
            /* re-anchor contexts: float milliseconds lose precision far from the anchor */
            for (int i = 0; i < g_c.nctx; i++) {
                ctx_ent *e = &g_c.ctx[i];
                if (e->ok && now - e->anchored_at > REANCHOR_NS && g_c.d.cuCtxSetCurrent(e->ctx) == CUDA_SUCCESS)
                    make_anchor(e);
            }
        }
        pthread_mutex_unlock(&g_c.mu);
        sleep_ns(n ? g_c.poll_ns : u64min(g_c.poll_ns * 10, g_c.p.tick_ns / 4));
    }
    return NULL;
}

static void atfork_child(void)
{
    /* the child has no poller and no CUDA state of its parent: start clean */
    pthread_mutex_init(&g_c.mu, NULL);
    g_c.thr_started = 0;
    g_c.npend = 0;
    g_c.nfree = 0;
    g_c.nctx = 0;
}

int egpu_compute_init(const egpu_compute_cfg *cfg, const egpu_ctl_params *p, const egpu_compute_drv *drv)
{
    pthread_mutex_lock(&g_c.mu);
    if (g_c.inited) { pthread_mutex_unlock(&g_c.mu); return 0; }
    g_c.cfg = *cfg;
    if (g_c.cfg.floor_pct < 0) g_c.cfg.floor_pct = 0;
    g_c.p = *p;
    g_c.d = *drv;
    g_c.poll_ns = env_u64("EGPU_COMPUTE_POLL_US", 500) * 1000;
    if (g_c.poll_ns < 50000) g_c.poll_ns = 50000;
    int rc = 0, any = 0;
    uint64_t owner = egpu_owner_id(cfg->share_key[0] ? cfg->share_key : "egpu-anonymous-share");
    for (int d = 0; d < cfg->ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        card_ent *c = &g_c.card[d];
        c->slot = -1;
        c->cores = cfg->dev[d].cores;
        if (!cfg->dev[d].ours || !cfg->dev[d].region_path[0]) continue;
        c->r = egpu_card_region_open(cfg->dev[d].region_path, cfg->dev[d].uuid);
        if (!c->r) {
            fprintf(stderr, "egpu: cannot open the card region %s (%s): compute on that card is not shared\n",
                    cfg->dev[d].region_path, strerror(errno));
            rc = -1;
            continue;
        }
        c->slot = egpu_card_claim(c->r, owner, (int32_t)getpid(), (uint32_t)cfg->priority, (uint32_t)cfg->policy,
                                  (uint32_t)cfg->dev[d].cores, (uint32_t)g_c.cfg.floor_pct, egpu_now_ns());
        if (c->slot < 0) {
            fprintf(stderr, "egpu: card region %s has no free slot: compute on that card is not shared\n",
                    cfg->dev[d].region_path);
            egpu_card_region_close(c->r);
            c->r = NULL;
            rc = -1;
            continue;
        }
        any = 1;
    }
    g_c.inited = 1;
    update_modes();
    if (any && !g_c.thr_started) {
        pthread_atfork(NULL, NULL, atfork_child);
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&g_c.thr, &a, poller, NULL) == 0) g_c.thr_started = 1;
        /* frees the slots at exit; registered again at the first gated launch (ctx_get) so
         * that it also runs before the CUDA runtime's teardown */
        atexit(egpu_compute_shutdown);
        pthread_attr_destroy(&a);
        if (!g_c.thr_started) fprintf(stderr, "egpu: cannot start the compute poller: compute is not shared\n");
        if (!g_c.thr_started) __atomic_store_n(&egpu_compute_on, 0, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g_c.mu);
    return rc;
}

void egpu_compute_shutdown(void)
{
    __atomic_store_n(&egpu_compute_on, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_c.stop, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&g_c.mu);
    /* in-flight launches are given back, so that the share's in-flight count stays true
     * for its other processes (no driver call here: at exit the driver may be gone) */
    for (int i = 0; i < g_c.npend; i++) {
        pending_rec *pr = &g_c.pend[i];
        if (pr->gated && g_c.card[pr->dev].r) egpu_ctl_cancel(g_c.card[pr->dev].r, g_c.card[pr->dev].slot, pr->est);
    }
    g_c.npend = 0;
    for (int d = 0; d < EGPU_COMPUTE_MAX_DEVS; d++) {
        card_ent *c = &g_c.card[d];
        if (c->r && c->slot >= 0) egpu_card_release(c->r, c->slot, (int32_t)getpid());
        c->slot = -1;
    }
    pthread_mutex_unlock(&g_c.mu);
}

void egpu_compute_before(CUstream s, int kind, egpu_launch_ticket *t)
{
    t->dev = -1;
    t->gated = 0;
    t->est = 0;
    t->kind = kind;
    CUcontext ctx = NULL;
    if (!g_c.inited || g_c.d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return;
    pthread_mutex_lock(&g_c.mu);
    ctx_ent *ce = ctx_get(ctx);
    /* the current context is ce->ctx here; without an anchor, launches are charged their
     * estimates (a driver without working events is told once, then left alone) */
    if (ce && !ce->ok && ce->failures < 3 && make_anchor(ce) != 0 && ce->failures == 3)
        fprintf(stderr, "egpu: cannot time launches with events; compute is charged by estimate\n");
    int dev = ce ? ce->dev : -1;
    pthread_mutex_unlock(&g_c.mu);
    if (dev < 0 || dev >= EGPU_COMPUTE_MAX_DEVS) return;
    card_ent *c = &g_c.card[dev];
    int mode = __atomic_load_n(&c->mode, __ATOMIC_RELAXED);
    if (mode == MODE_NONE || stream_capturing(s, kind)) return;
    uint64_t now = egpu_now_ns();
    if (mode == MODE_CTL) {
        uint64_t est = 0, wait = 0, waited_from = 0;
        int why;
        for (;;) {
            why = egpu_ctl_admit(c->r, c->slot, &g_c.p, kind, now, &est, &wait);
            if (why == EGPU_ADMIT_GO || __atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) break;
            if (!waited_from) waited_from = now;
            /* measurements that finished while we wait refund the bucket: take them in */
            if (pthread_mutex_trylock(&g_c.mu) == 0) {
                poll_locked(ctx, 0, NULL);
                pthread_mutex_unlock(&g_c.mu);
            }
            sleep_ns(u64min(wait, g_c.p.wait_step_ns)); /* never a busy spin, never holding a lock */
            now = egpu_now_ns();
        }
        if (waited_from) egpu_ctl_waited(c->r, c->slot, &g_c.p, why, now - waited_from, now);
        t->gated = 1;
        t->est = est;
    } else if (g_c.cfg.priority == EGPU_CARD_PRIO_HIGH) {
        egpu_ctl_hi_touch(c->r, now);
    }
    t->dev = dev;
    t->ctx = ctx;
    t->t0 = now;
}

void egpu_compute_after(CUstream s, egpu_launch_ticket *t, CUresult r)
{
    card_ent *c = &g_c.card[t->dev];
    if (r != CUDA_SUCCESS) {
        if (t->gated) egpu_ctl_cancel(c->r, c->slot, t->est);
        return;
    }
    /* _ptsz entry points: stream 0 is the calling thread's default stream */
    CUstream rs = egpu_stream_of(s, t->kind & EGPU_LAUNCH_PTSZ);
    pthread_mutex_lock(&g_c.mu);
    CUevent ev = g_c.npend < MAX_PENDING ? event_take(t->ctx) : NULL;
    if (ev && g_c.d.cuEventRecord(ev, rs) != CUDA_SUCCESS) {
        g_c.d.cuEventDestroy(ev); /* maybe an event of a context that is gone: never reuse */
        ev = NULL;
    }
    if (ev) {
        pending_rec *pr = &g_c.pend[g_c.npend++];
        pr->ev = ev;
        pr->ctx = t->ctx;
        pr->stream = rs;
        pr->t0 = t->t0;
        pr->est = t->est;
        pr->dev = t->dev;
        pr->gated = t->gated;
        pr->kind = t->kind;
    }
    pthread_mutex_unlock(&g_c.mu);
    if (!ev && t->gated) egpu_ctl_complete(c->r, c->slot, &g_c.p, t->kind, 1, t->est, t->t0, 0, egpu_now_ns());
}
