/* compute_gate.c: the launch gate (compute.h; design in docs/compute.md, "Measuring").
 *
 * A gated launch, in the common case: the current context's device from the thread's cache,
 * the capture check, one clock read, the stream's meter from the thread's table, the
 * estimate drawn from the thread's lease of the share's bucket (a subtraction in the
 * thread's own state); after the launch, the meter's bookkeeping. No lock, no atomic
 * read-modify-write, no system call, no event. The slow paths: the lease ran out or the
 * launch must wait (the card lock, sleeps), an event is due for the stream's group (the
 * process lock and one cuEventRecord), a new context or thread (the process lock).
 *
 * A background thread per process polls the recorded events with cuEventQuery every 0.5 ms
 * and settles each group on its event; it also hands the slots what the launching threads
 * counted and keeps the card's high-priority mark fresh while the process's high-priority
 * work is outstanding. Neither holds a lock while sleeping, nor the card lock while calling
 * the driver. */
#define _GNU_SOURCE
#include "capture.h"
#include "compute.h"
#include "fastclock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MODE_NONE = 0, MODE_CTL = 1, MODE_WATCH = 2 };
#define MAX_PENDING 4096
#define MAX_FREE_EVENTS 1024
#define MAX_CTX 32
#define CU_STREAM_NON_BLOCKING_ 0x1
#define REANCHOR_NS 20000000000ULL
/* Launching threads that get a stream table; a thread beyond them records an event after each
 * of its launches (the measurement still holds, at the old cost). */
#define MAX_THREADS 256
/* Streams a thread keeps meters for; the least recently used one goes (its open group is
 * settled by its estimates). Inference engines launch from one or two streams per thread. */
#define THREAD_STREAMS 8

typedef struct {
    CUevent ev;
    CUcontext ctx;
    CUstream stream;
    egpu_group g;
    egpu_stream_meter *m; /* the stream's meter (NULL: a launch of a thread beyond the table) */
    uint64_t seq;         /* the event's number on that meter */
    int dev;
    int counted;          /* in the slot's in-flight figures (egpu_ctl_batch_apply) */
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
    int bucket;           /* the share has a token bucket on this card (cores < 100) */
    uint64_t est[2];      /* the share's per-launch estimate, kernels / graphs (atomic; poller) */
    uint64_t unit[2];     /* one launch's own time, for the meters' prediction (atomic; poller) */
    uint64_t hi_marked;   /* the last time this process marked high-priority activity (atomic) */
    uint64_t events;      /* events recorded since the poller's last batch (under g_c.mu) */
    uint64_t launches_seen; /* poller: the threads' launch counters summed at its last pass */
} card_ent;

/* One stream of one thread: the key and its meter. */
typedef struct {
    CUcontext ctx;
    CUstream stream;      /* as launched into (the per-thread stream for _ptsz entry points) */
    int dev;
    uint64_t used;        /* the thread's launch clock at its last use */
    egpu_stream_meter m;
} gate_stream;

/* A launching thread's state. Never freed: pending records point into it; a thread that
 * exits leaves it to the next one. */
typedef struct {
    int live;             /* owned by a live thread (under g_c.mu) */
    CUcontext ctx;        /* the context last seen, and its device */
    int ctx_dev;
    unsigned ctx_gen;     /* g_c.ctx_gen when cached */
    uint64_t clock;       /* launches of the thread (stream table recency) */
    int mru;              /* the stream slot used last */
    gate_stream st[THREAD_STREAMS];
    int64_t lease[EGPU_COMPUTE_MAX_DEVS];      /* GPU ns drawn from each card's bucket, spent
                                                * without a lock (the thread's own) */
    uint64_t launches[EGPU_COMPUTE_MAX_DEVS];   /* per card (written by the thread, read by the poller) */
    uint64_t busy_until[EGPU_COMPUTE_MAX_DEVS]; /* predicted end of its queued work per card (likewise) */
} gate_thread;

static struct {
    pthread_mutex_t mu;   /* everything below except the atomics and the threads' own state */
    int inited;
    egpu_compute_cfg cfg;
    egpu_ctl_params p;
    egpu_compute_drv d;
    card_ent card[EGPU_COMPUTE_MAX_DEVS];
    ctx_ent ctx[MAX_CTX];
    int nctx;
    unsigned ctx_gen;     /* bumped when a context must be looked at again (atomic) */
    struct { CUevent ev; CUcontext ctx; } freeev[MAX_FREE_EVENTS];
    int nfree;
    pending_rec pend[MAX_PENDING];
    int npend;
    gate_thread *threads[MAX_THREADS];
    int nthreads;
    pthread_key_t thread_key;
    pthread_t thr;
    int thr_started;
    int stop;             /* atomic */
    uint64_t poll_ns;
    uint64_t hi_mark_ns;  /* a launch marks high-priority activity at most this often */
    uint64_t last_modes_ns;
} g_c = {.mu = PTHREAD_MUTEX_INITIALIZER};

int egpu_compute_on;

/* The calling thread's state. initial-exec: the interposer is preloaded, so its TLS is static
 * and read without __tls_get_addr on the launch path. A forked child resets its one thread's. */
static __thread gate_thread *t_gate __attribute__((tls_model("initial-exec")));

static uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }
static uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }

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
    uint64_t burst = env_u64("EGPU_COMPUTE_BURST_US", p->burst_ns / 1000) * 1000;
    if (burst != p->burst_ns) p->lease_ns = burst / 8; /* the lease stays an eighth of the burst */
    p->burst_ns = burst;
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

/* The share's estimates, copied where a launch reads them without touching the region. */
static void refresh_estimates(card_ent *c)
{
    if (!c->r || c->slot < 0) return;
    for (int k = 0; k < 2; k++) {
        uint64_t e, u;
        egpu_ctl_estimates(c->r, c->slot, k, &e, &u);
        __atomic_store_n(&c->est[k], e, __ATOMIC_RELAXED);
        __atomic_store_n(&c->unit[k], u, __ATOMIC_RELAXED);
    }
}

/* ---- contexts, anchors, events (g_c.mu held) --------------------------------------- */

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
 * the launching thread, whose current context is ctx. */
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

/* ---- settling -------------------------------------------------------------------------- */

/* Settles group g of card dev on its event's end (0: by its estimates; a watched group, not
 * pre-charged, is then left out). */
static void settle(int dev, const egpu_group *g, int counted, uint64_t end_ns)
{
    card_ent *c = &g_c.card[dev];
    if (c->r && (g->gated || end_ns)) egpu_ctl_settle(c->r, c->slot, &g_c.p, g, counted, end_ns, egpu_now_ns());
}

/* Host time at which a completed event fired (0: cannot tell; the group is charged its
 * estimates). */
static uint64_t event_end_ns(pending_rec *pr, CUresult q, uint64_t now)
{
    ctx_ent *ce = ctx_find(pr->ctx);
    if (q != CUDA_SUCCESS || !ce || !ce->ok) return 0;
    float ms = 0;
    if (g_c.d.cuEventElapsedTime(&ms, ce->anchor, pr->ev) != CUDA_SUCCESS) {
        ce->ok = 0; /* re-anchor on the next launch in that context */
        __atomic_add_fetch(&g_c.ctx_gen, 1, __ATOMIC_RELAXED);
        return 0;
    }
    double e = (double)ce->anchor_ns + (double)ms * 1e6;
    uint64_t end = e > 0 ? (uint64_t)e : 0;
    if (end <= now) return end;
    pr->g.end_clamped = 1;
    return now;
}

/* Settles the recorded groups whose events fired (g_c.mu held). only_ctx: when not NULL, only
 * that context's records (a launching thread must not switch its current context). Returns
 * the number still pending; sets bit d of *busy_mask when one on card d has not fired. */
static int poll_locked_relaxed(CUcontext only_ctx, int switch_ctx, int *busy_mask)
{
    uint64_t now = egpu_now_ns();
    CUstream blocked[16];
    int nblocked = 0, kept = 0;
    CUcontext cur = NULL;
    for (int i = 0; i < g_c.npend; i++) {
        pending_rec *pr = &g_c.pend[i];
        int skip = (only_ctx && pr->ctx != only_ctx);
        for (int b = 0; !skip && b < nblocked; b++)
            if (blocked[b] == pr->stream) skip = 1; /* a stream's groups settle in order */
        CUresult q = CUDA_ERROR_NOT_READY;
        if (!skip) {
            if (switch_ctx && pr->ctx != cur) {
                g_c.d.cuCtxSetCurrent(pr->ctx);
                cur = pr->ctx;
            }
            q = g_c.d.cuEventQuery(pr->ev);
        }
        if (q == CUDA_ERROR_NOT_READY) {
            if (!skip && nblocked < 16) blocked[nblocked++] = pr->stream;
            if (busy_mask && pr->dev < 32) *busy_mask |= 1 << pr->dev;
            g_c.pend[kept++] = *pr;
            continue;
        }
        uint64_t end = event_end_ns(pr, q, now);
        settle(pr->dev, &pr->g, pr->counted, end);
        if (pr->m) egpu_meter_settled(pr->m, pr->seq, end);
        if (q == CUDA_SUCCESS) event_give(pr->ev, pr->ctx);
        else g_c.d.cuEventDestroy(pr->ev); /* maybe an event of a context that is gone */
    }
    g_c.npend = kept;
    return kept;
}

static int poll_locked(CUcontext only_ctx, int switch_ctx, int *busy_mask)
{
    if (!g_c.npend) return 0;
    egpu_capture_relax cr = relax_capture();
    int n = poll_locked_relaxed(only_ctx, switch_ctx, busy_mask);
    restore_capture(cr);
    return n;
}

int egpu_compute_poll_now(void)
{
    pthread_mutex_lock(&g_c.mu);
    int n = poll_locked(NULL, 0, NULL);
    pthread_mutex_unlock(&g_c.mu);
    return n;
}

/* ---- the poller ---------------------------------------------------------------------- */

/* What the process did on card d since the last pass, handed to the slot under one lock:
 * launches counted by its threads, groups newly recorded (in flight), events, the predicted
 * end of its queued work. Returns the launches. */
static uint64_t batch_card(int d, uint64_t now)
{
    card_ent *c = &g_c.card[d];
    egpu_ctl_batch b = {0};
    uint64_t sum = 0;
    for (int i = 0; i < g_c.nthreads; i++) sum += __atomic_load_n(&g_c.threads[i]->launches[d], __ATOMIC_RELAXED);
    b.launches = sum - c->launches_seen;
    c->launches_seen = sum;
    for (int i = 0; i < g_c.npend; i++) {
        pending_rec *pr = &g_c.pend[i];
        if (pr->dev != d || pr->counted || !pr->g.gated) continue;
        pr->counted = 1;
        if (!b.rec_n || pr->g.t_first < b.rec_since_ns) b.rec_since_ns = pr->g.t_first;
        b.rec_n += pr->g.n[0] + pr->g.n[1];
        b.rec_est_ns += pr->g.est_ns[0] + pr->g.est_ns[1];
    }
    b.events = c->events;
    c->events = 0;
    for (int i = 0; i < g_c.nthreads; i++) {
        uint64_t until = __atomic_load_n(&g_c.threads[i]->busy_until[d], __ATOMIC_RELAXED);
        b.queued_until_ns = u64max(b.queued_until_ns, until);
    }
    if (b.launches || b.rec_n || b.events || b.queued_until_ns > now)
        egpu_ctl_batch_apply(c->r, c->slot, &g_c.p, &b, now);
    return b.launches;
}

/* Is the process's work on card d predicted to be still running (its threads' queues)? */
static int threads_busy(int d, uint64_t now)
{
    for (int i = 0; i < g_c.nthreads; i++)
        if (__atomic_load_n(&g_c.threads[i]->busy_until[d], __ATOMIC_RELAXED) > now) return 1;
    return 0;
}

/* One pass: batches, settlements, the high-priority mark, the estimates (g_c.mu held).
 * Returns nonzero while there is work to watch closely. */
static int poll_pass(uint64_t *last_launches)
{
    int busy_mask = 0;
    uint64_t now = egpu_now_ns(), launches = 0;
    uint64_t per_dev[EGPU_COMPUTE_MAX_DEVS] = {0};
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++)
        if (g_c.card[d].r && g_c.card[d].slot >= 0) launches += per_dev[d] = batch_card(d, now);
    int n = poll_locked_relaxed(NULL, 1, &busy_mask);
    now = egpu_now_ns();
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        card_ent *c = &g_c.card[d];
        if (!c->r || c->slot < 0) continue;
        refresh_estimates(c);
        /* high priority: the card is marked while this process's work there is outstanding
         * (events not fired, queues predicted busy, launches since the last pass) */
        if (g_c.cfg.priority == EGPU_CARD_PRIO_HIGH && d < 32 &&
            (((busy_mask >> d) & 1) || per_dev[d] || threads_busy(d, now))) {
            egpu_ctl_hi_touch(c->r, now);
            __atomic_store_n(&c->hi_marked, now, __ATOMIC_RELAXED);
        }
    }
    int active = n || launches || *last_launches;
    *last_launches = launches;
    return active;
}

static void *poller(void *arg)
{
    (void)arg;
    uint64_t last_launches = 0;
    /* this thread only ever queries: RELAXED for good, so its polls need no exchange */
    (void)relax_capture();
    while (!__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&g_c.mu);
        if (__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) { /* shut down while we waited */
            pthread_mutex_unlock(&g_c.mu);
            break;
        }
        int active = poll_pass(&last_launches);
        uint64_t now = egpu_now_ns();
        if (now - g_c.last_modes_ns >= g_c.p.tick_ns / 4) {
            g_c.last_modes_ns = now;
            egpu_fastclock_rebase();
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
        sleep_ns(active ? g_c.poll_ns : u64min(g_c.poll_ns * 10, g_c.p.tick_ns / 4));
    }
    return NULL;
}

/* ---- launching threads ---------------------------------------------------------------- */

static void stream_close(gate_stream *gs)
{
    egpu_group *g = &gs->m.open;
    if (g->n[0] + g->n[1] && !__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) settle(gs->dev, g, 0, 0);
    memset(g, 0, sizeof *g);
}

/* Tokens held back go into card d's bucket. */
static void lease_return(int d, int64_t tokens)
{
    card_ent *c = &g_c.card[d];
    if (!tokens || !c->r || c->slot < 0) return;
    egpu_ctl_batch b = {.lease_back = tokens};
    egpu_ctl_batch_apply(c->r, c->slot, &g_c.p, &b, egpu_now_ns());
}

/* A launching thread exits: its open groups are settled by their estimates, its leases go
 * back to the buckets. */
static void thread_gone(void *arg)
{
    gate_thread *th = arg;
    if (!th || th != t_gate) return; /* a state of the parent process (fork) */
    for (int i = 0; i < THREAD_STREAMS; i++) stream_close(&th->st[i]);
    for (int d = 0; d < EGPU_COMPUTE_MAX_DEVS && !__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED); d++) {
        lease_return(d, th->lease[d]);
        th->lease[d] = 0;
    }
    pthread_mutex_lock(&g_c.mu);
    th->live = 0;
    pthread_mutex_unlock(&g_c.mu);
    t_gate = NULL;
}

static gate_thread *thread_take_locked(void)
{
    for (int i = 0; i < g_c.nthreads; i++) {
        gate_thread *th = g_c.threads[i];
        if (th->live) continue;
        /* a state left by a thread that exited (or, in a forked child, the parent's): keep
         * its counters and event numbers (pending records may still name them), nothing else */
        for (int s = 0; s < THREAD_STREAMS; s++) {
            gate_stream *gs = &th->st[s];
            gs->ctx = NULL;
            gs->stream = NULL;
            gs->used = 0;
            memset(&gs->m.open, 0, sizeof gs->m.open);
            gs->m.pred_end_ns = 0;
            gs->m.sample_due = 0;
            egpu_meter_settled(&gs->m, gs->m.rec_seq, 0); /* none outstanding for this thread */
        }
        th->ctx = NULL;
        memset(th->lease, 0, sizeof th->lease); /* a forked child's copy holds the parent's */
        th->live = 1;
        return th;
    }
    if (g_c.nthreads >= MAX_THREADS) return NULL;
    gate_thread *th = calloc(1, sizeof *th);
    if (!th) return NULL;
    th->live = 1;
    g_c.threads[g_c.nthreads++] = th;
    return th;
}

static gate_thread *thread_state_slow(void)
{
    pthread_mutex_lock(&g_c.mu);
    gate_thread *th = thread_take_locked();
    pthread_mutex_unlock(&g_c.mu);
    if (!th) return NULL;
    pthread_setspecific(g_c.thread_key, th);
    t_gate = th;
    return th;
}

static gate_thread *thread_state(void)
{
    gate_thread *th = t_gate;
    if (__builtin_expect(th != NULL, 1)) return th;
    return thread_state_slow();
}

/* The device of the current context: the thread's cache, or the process table (which makes
 * the context's anchor on first sight, and retries a failed one). */
static int ctx_device(gate_thread *th, CUcontext ctx)
{
    unsigned gen = __atomic_load_n(&g_c.ctx_gen, __ATOMIC_RELAXED);
    if (th && th->ctx == ctx && th->ctx_gen == gen) return th->ctx_dev;
    pthread_mutex_lock(&g_c.mu);
    ctx_ent *ce = ctx_get(ctx);
    /* the current context is ce->ctx here; without an anchor, launches are charged their
     * estimates (a driver without working events is told once, then left alone) */
    if (ce && !ce->ok && ce->failures < 3 && make_anchor(ce) != 0 && ce->failures == 3)
        fprintf(stderr, "egpu: cannot time launches with events; compute is charged by estimate\n");
    int dev = ce ? ce->dev : -1;
    int settled = ce && (ce->ok || ce->failures >= 3);
    pthread_mutex_unlock(&g_c.mu);
    if (th && settled) {
        th->ctx = ctx;
        th->ctx_dev = dev;
        th->ctx_gen = gen;
    }
    return dev;
}

static gate_stream *stream_get(gate_thread *th, CUcontext ctx, CUstream rs, int dev)
{
    th->clock++;
    gate_stream *gs = &th->st[th->mru];
    if (__builtin_expect(gs->stream == rs && gs->ctx == ctx, 1)) {
        gs->used = th->clock;
        return gs;
    }
    gate_stream *lru = &th->st[0];
    for (int i = 0; i < THREAD_STREAMS; i++) {
        gs = &th->st[i];
        if (gs->stream == rs && gs->ctx == ctx) {
            th->mru = i;
            gs->used = th->clock;
            return gs;
        }
        if (gs->used < lru->used) lru = gs;
    }
    stream_close(lru);
    lru->ctx = ctx;
    lru->stream = rs;
    lru->dev = dev;
    lru->used = th->clock;
    lru->m.pred_end_ns = 0;
    lru->m.sample_due = 0;
    th->mru = (int)(lru - th->st);
    return lru;
}

/* ---- the launch path ------------------------------------------------------------------ */

static void record_group(const egpu_launch_ticket *t, gate_stream *gs);

/* High-priority work is being launched on the card: mark it, at most every hi_mark_ns from
 * this process (the poller keeps the mark fresh while the work is outstanding). */
static void hi_mark(card_ent *c, uint64_t now)
{
    if (__atomic_load_n(&c->hi_marked, __ATOMIC_RELAXED) + g_c.hi_mark_ns > now) return;
    __atomic_store_n(&c->hi_marked, now, __ATOMIC_RELAXED);
    egpu_ctl_hi_touch(c->r, now);
}

/* The common case: the estimate drawn from the thread's lease (and, for a low-priority
 * share, no high-priority activity and a short queue). No lock, no system call. */
static int admit_fast(card_ent *c, gate_thread *th, gate_stream *gs, int dev, uint64_t e, uint64_t now)
{
    if (!th) return 0; /* a thread beyond the table: the slow path every time */
    if (g_c.cfg.priority == EGPU_CARD_PRIO_LOW &&
        !egpu_ctl_low_may_go(c->r, &g_c.p, e, egpu_meter_queued(&gs->m, now), now))
        return 0;
    if (!c->bucket) return 1;
    if (th->lease[dev] < (int64_t)e) return 0;
    th->lease[dev] -= (int64_t)e;
    return 1;
}

/* The slow path: a new lease from the bucket under the card lock, or a wait in short sleeps
 * (never holding a lock) until the bucket, the priority gate or the queue lets the launch go.
 * Returns the estimate drawn; *now is the time it may go. */
static uint64_t admit_slow(card_ent *c, gate_thread *th, gate_stream *gs, int dev, CUcontext ctx, int kind,
                           uint64_t *now)
{
    uint64_t est = 0, wait = 0, waited_from = 0;
    int why;
    for (;;) {
        uint64_t queued = gs ? egpu_meter_queued(&gs->m, *now) : 0;
        why = egpu_ctl_admit(c->r, c->slot, &g_c.p, kind, *now, queued, th ? &th->lease[dev] : NULL, &est, &wait);
        if (why == EGPU_ADMIT_GO || __atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) break;
        if (!waited_from) waited_from = *now;
        /* groups that settled while we wait refund the bucket: take them in */
        if (pthread_mutex_trylock(&g_c.mu) == 0) {
            poll_locked(ctx, 0, NULL);
            pthread_mutex_unlock(&g_c.mu);
        }
        sleep_ns(u64min(wait, g_c.p.wait_step_ns)); /* never a busy spin, never holding a lock */
        *now = egpu_now_ns();
    }
    if (waited_from) egpu_ctl_waited(c->r, c->slot, &g_c.p, why, *now - waited_from, *now);
    return est;
}

void egpu_compute_before(CUstream s, int kind, egpu_launch_ticket *t)
{
    t->dev = -1;
    t->gated = 0;
    t->kind = kind;
    t->stream = NULL;
    CUcontext ctx = NULL;
    if (!g_c.inited || g_c.d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return;
    gate_thread *th = thread_state();
    int dev = ctx_device(th, ctx);
    if (dev < 0 || dev >= EGPU_COMPUTE_MAX_DEVS) return;
    card_ent *c = &g_c.card[dev];
    int mode = __atomic_load_n(&c->mode, __ATOMIC_RELAXED);
    if (mode == MODE_NONE || stream_capturing(s, kind)) return;
    uint64_t now = egpu_fastclock_ns();
    int k = EGPU_LAUNCH_KIND(kind);
    gate_stream *gs = th ? stream_get(th, ctx, egpu_stream_of(s, kind & EGPU_LAUNCH_PTSZ), dev) : NULL;
    uint64_t e = __atomic_load_n(&c->est[k], __ATOMIC_RELAXED);
    if (mode == MODE_CTL) {
        if (!admit_fast(c, th, gs, dev, e, now)) e = admit_slow(c, th, gs, dev, ctx, kind, &now);
        t->gated = 1;
    }
    if (g_c.cfg.priority == EGPU_CARD_PRIO_HIGH) hi_mark(c, now);
    t->dev = dev;
    t->ctx = ctx;
    t->t0 = now;
    t->est = e;
    t->unit = __atomic_load_n(&c->unit[k], __ATOMIC_RELAXED);
    t->stream = gs;
}

/* Records an event after the stream's last launch for group g (the process lock held; one
 * driver call). 0 when it could not: the caller settles the group by its estimates. */
static int record_event_locked(const egpu_launch_ticket *t, CUstream rs, const egpu_group *g,
                               egpu_stream_meter *m, uint64_t seq)
{
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
        pr->g = *g;
        if (g->n[0] + g->n[1] == 1) pr->g.rec_ns = egpu_fastclock_ns(); /* a one-launch sample */
        pr->m = m;
        pr->seq = seq;
        pr->dev = t->dev;
        pr->counted = 0;
        g_c.card[t->dev].events++;
    }
    return ev != NULL;
}

/* An event right after the stream's last launch, for its open group. */
static void record_group(const egpu_launch_ticket *t, gate_stream *gs)
{
    pthread_mutex_lock(&g_c.mu);
    uint64_t seq;
    egpu_group g = egpu_meter_take(&gs->m, &seq);
    int ok = record_event_locked(t, gs->stream, &g, &gs->m, seq);
    pthread_mutex_unlock(&g_c.mu);
    if (ok) return;
    egpu_meter_settled(&gs->m, seq, 0);
    settle(t->dev, &g, 0, 0);
}

/* A thread beyond the gate's table: an event after each of its launches. */
static void record_single(const egpu_launch_ticket *t, CUstream s)
{
    egpu_group g = {.t_first = egpu_now_ns(), .gated = (uint32_t)t->gated};
    g.n[EGPU_LAUNCH_KIND(t->kind)] = 1;
    g.est_ns[EGPU_LAUNCH_KIND(t->kind)] = t->est;
    pthread_mutex_lock(&g_c.mu);
    int ok = record_event_locked(t, egpu_stream_of(s, t->kind & EGPU_LAUNCH_PTSZ), &g, NULL, 0);
    pthread_mutex_unlock(&g_c.mu);
    if (!ok) settle(t->dev, &g, 0, 0);
}

void egpu_compute_after(CUstream s, egpu_launch_ticket *t, CUresult r)
{
    card_ent *c = &g_c.card[t->dev];
    if (r != CUDA_SUCCESS) {
        /* the launch never happened: its estimate goes back (to the thread's lease) */
        if (t->gated && c->bucket && t->stream) t_gate->lease[t->dev] += (int64_t)t->est;
        else if (t->gated && c->bucket) lease_return(t->dev, (int64_t)t->est);
        return;
    }
    gate_stream *gs = t->stream;
    if (!gs) {
        record_single(t, s);
        return;
    }
    egpu_group closed;
    /* a group's interval begins when its first launch was queued: a clock read per group */
    uint64_t queued = egpu_meter_opens(&gs->m) ? egpu_fastclock_ns() : t->t0;
    int a = egpu_meter_add(&gs->m, &g_c.p, t->kind, t->gated, t->est, t->unit, t->t0, queued, &closed);
    gate_thread *th = t_gate;
    uint64_t *n = &th->launches[t->dev], *busy = &th->busy_until[t->dev];
    __atomic_store_n(n, *n + 1, __ATOMIC_RELAXED);
    if (gs->m.pred_end_ns > *busy) __atomic_store_n(busy, gs->m.pred_end_ns, __ATOMIC_RELAXED);
    if (a & EGPU_METER_CLOSED) settle(t->dev, &closed, 0, 0);
    if (a & EGPU_METER_RECORD) record_group(t, gs);
}

/* ---- set-up and teardown ------------------------------------------------------------------ */

static void atfork_child(void)
{
    /* the child has no poller and no CUDA state of its parent: start clean */
    pthread_mutex_init(&g_c.mu, NULL);
    g_c.thr_started = 0;
    g_c.npend = 0;
    g_c.nfree = 0;
    g_c.nctx = 0;
    t_gate = NULL; /* the child's one thread; the parent's states stay the parent's */
    for (int i = 0; i < g_c.nthreads; i++) g_c.threads[i]->live = 0;
}

static int open_card(int d, uint64_t owner)
{
    const egpu_compute_cfg *cfg = &g_c.cfg;
    card_ent *c = &g_c.card[d];
    c->slot = -1;
    c->cores = cfg->dev[d].cores;
    c->bucket = c->cores < 100;
    if (!cfg->dev[d].ours || !cfg->dev[d].region_path[0]) return 0;
    c->r = egpu_card_region_open(cfg->dev[d].region_path, cfg->dev[d].uuid);
    if (!c->r) {
        fprintf(stderr, "egpu: cannot open the card region %s (%s): compute on that card is not shared\n",
                cfg->dev[d].region_path, strerror(errno));
        return -1;
    }
    c->slot = egpu_card_claim(c->r, owner, (int32_t)getpid(), (uint32_t)cfg->priority, (uint32_t)cfg->policy,
                              (uint32_t)cfg->dev[d].cores, (uint32_t)cfg->floor_pct, egpu_now_ns());
    if (c->slot < 0) {
        fprintf(stderr, "egpu: card region %s has no free slot: compute on that card is not shared\n",
                cfg->dev[d].region_path);
        egpu_card_region_close(c->r);
        c->r = NULL;
        return -1;
    }
    refresh_estimates(c);
    return 1;
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
    g_c.hi_mark_ns = g_c.p.hi_hold_ns / 4; /* the hold stays between 3/4 of its length and all of it */
    pthread_key_create(&g_c.thread_key, thread_gone);
    egpu_fastclock_init();
    int rc = 0, any = 0;
    uint64_t owner = egpu_owner_id(cfg->share_key[0] ? cfg->share_key : "egpu-anonymous-share");
    for (int d = 0; d < cfg->ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        int o = open_card(d, owner);
        if (o < 0) rc = -1;
        if (o > 0) any = 1;
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
    if (__atomic_exchange_n(&g_c.stop, 1, __ATOMIC_RELAXED)) return; /* registered twice */
    /* the calling thread's open groups, then what is in flight, are charged by their
     * estimates (no driver call here: at exit the driver may be gone), so that the share's
     * figures stay true for its other processes; its leases go back to the buckets */
    gate_thread *th = t_gate;
    uint64_t now = egpu_now_ns();
    pthread_mutex_lock(&g_c.mu);
    for (int i = 0; th && i < THREAD_STREAMS; i++) {
        egpu_group *g = &th->st[i].m.open;
        settle(th->st[i].dev, g, 0, 0);
        memset(g, 0, sizeof *g);
    }
    for (int d = 0; d < EGPU_COMPUTE_MAX_DEVS; d++)
        if (g_c.card[d].r && g_c.card[d].slot >= 0) batch_card(d, now);
    for (int i = 0; i < g_c.npend; i++) settle(g_c.pend[i].dev, &g_c.pend[i].g, g_c.pend[i].counted, 0);
    g_c.npend = 0;
    for (int d = 0; d < EGPU_COMPUTE_MAX_DEVS; d++) {
        card_ent *c = &g_c.card[d];
        if (!c->r || c->slot < 0) continue;
        if (th) lease_return(d, th->lease[d]);
        if (th) th->lease[d] = 0;
        egpu_card_release(c->r, c->slot, (int32_t)getpid());
        c->slot = -1;
    }
    pthread_mutex_unlock(&g_c.mu);
}
