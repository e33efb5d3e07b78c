/* compute_poll.c: the gate's measurements (compute_gate.h): contexts and their anchors, the
 * events recorded after launch groups, settling the groups on them, and the poller thread
 * that does it off the launch path. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute_gate.h"
#include "fastclock.h"

#define CU_STREAM_NON_BLOCKING_ 0x1
#define REANCHOR_NS 20000000000ULL /* 20 s: float milliseconds lose precision far from the anchor */
#define ANCHOR_TRIES 3             /* an anchor's time: the tightest of three round trips */
#define MAX_BLOCKED_STREAMS 16     /* streams one poll remembers as not fired (their later groups wait) */
#define MODES_PER_TICK 4           /* modes, clock base, ticks and anchors: every quarter tick (12.5 ms) */
#define IDLE_POLL_FACTOR 10        /* nothing in flight: poll ten times less often (5 ms) */
/* Quiet (nothing in flight or queued, and the share's file says idle to its co-tenants and
 * the exporter): nap this long between passes, or until a launch wakes the poller. An idle
 * process then costs a pass every 250 ms, not every 5 ms (~7 ms of CPU a second). */
#define QUIET_NAP_NS 250000000ULL
/* ... once it has been quiet this long (a process that just made its context, or just ran
 * work, is about to launch): the exporter's own idle time. */
#define QUIET_AFTER_NS 1000000000ULL

/* ---- contexts, anchors, events (g_c.mu held) --------------------------------------- */

static ctx_ent *ctx_find(CUcontext ctx)
{
    for (int i = 0; i < g_c.nctx; i++)
        if (g_c.ctx[i].ctx == ctx) return &g_c.ctx[i];
    return NULL;
}

/* Host time of an anchor event: record on our own idle stream, wait, take the midpoint of
 * the tightest of three brackets (from the record call's return to the wait's). The current context must be ctx. */
static int make_anchor_relaxed(ctx_ent *e);
int make_anchor(ctx_ent *e)
{
    egpu_capture_relax cr = relax_capture();
    int rc = make_anchor_relaxed(e);
    restore_capture(cr);
    return rc;
}

static int make_anchor_relaxed(ctx_ent *e)
{
    const egpu_compute_drv *d = &g_c.d;
    if (!e->anchor_stream && d->cuStreamCreate(&e->anchor_stream, CU_STREAM_NON_BLOCKING_) != CUDA_SUCCESS) return -1;
    CUevent best = NULL;
    uint64_t best_span = UINT64_MAX, best_mid = 0;
    for (int i = 0; i < ANCHOR_TRIES; i++) {
        CUevent ev;
        if (d->cuEventCreate(&ev, 0) != CUDA_SUCCESS) break;
        /* the bracket opens when the record call returns: the event is queued then, and a
         * driver call's own CPU (~2.5 us for a record) must not pull the anchor early, or every
         * group measured from it ends early and a short-kernel share runs over its cap */
        if (d->cuEventRecord(ev, e->anchor_stream) != CUDA_SUCCESS) {
            d->cuEventDestroy(ev);
            break;
        }
        uint64_t t0 = egpu_now_ns();
        if (d->cuEventSynchronize(ev) != CUDA_SUCCESS) {
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
    e->anchor_err_ns = best_span / 2;
    e->anchored_at = egpu_now_ns();
    e->ok = 1;
    return 0;
}

/* The context's entry, made (device looked up, anchor recorded) on first sight. Called on
 * the launching thread, whose current context is ctx. */
ctx_ent *ctx_get(CUcontext ctx)
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

CUevent event_take(CUcontext ctx)
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
void settle(int dev, const egpu_group *g, int counted, uint64_t end_ns)
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
    /* a one-launch sample whose event fired by its record call's return cannot tell its
     * kernel's time (compute_settle.c): "by" as far as the anchor can tell, within its error */
    if (pr->g.rec_ns) pr->g.rec_ns += ce->anchor_err_ns;
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
    CUstream blocked[MAX_BLOCKED_STREAMS];
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
            if (!skip && nblocked < MAX_BLOCKED_STREAMS) blocked[nblocked++] = pr->stream;
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

int poll_locked(CUcontext only_ctx, int switch_ctx, int *busy_mask)
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

/* The first gated launch after a nap: wakes the poller, and brings the card's view of its
 * co-tenants and the gate's modes up to date for this launch (they are a nap old). */
void poller_wake(card_ent *c)
{
    if (!__atomic_exchange_n(&g_c.napping, 0, __ATOMIC_ACQ_REL)) return; /* another launch did */
    egpu_nap_wake(&g_c.napping);
    if (__atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) return; /* shut down: the gate stays off */
    egpu_card_refresh(c->r, egpu_now_ns(), 0);
    update_modes();
}

/* The launches the process's threads counted on card d so far. */
static uint64_t launches_counted(int d)
{
    uint64_t sum = 0;
    for (int i = 0; i < g_c.nthreads; i++) sum += __atomic_load_n(&g_c.threads[i]->launches[d], __ATOMIC_RELAXED);
    return sum;
}

/* What the process did on card d since the last pass, handed to the slot under one lock:
 * launches counted by its threads, groups newly recorded (in flight), events, the predicted
 * end of its queued work. Returns the launches. */
uint64_t batch_card(int d, uint64_t now)
{
    card_ent *c = &g_c.card[d];
    egpu_ctl_batch b = {0};
    uint64_t sum = launches_counted(d);
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
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        if (!g_c.card[d].r || g_c.card[d].slot < 0) continue;
        /* co-tenants' slots and marks, read from their files; the roster every quarter tick */
        egpu_card_refresh(g_c.card[d].r, now, g_c.p.tick_ns / MODES_PER_TICK);
        launches += per_dev[d] = batch_card(d, now);
    }
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

/* How long the poller may nap (g_c.mu held, after a pass that found nothing pending; 0: not
 * quiet). Quiet on every card it shares: nothing queued, and its share's own figures at rest,
 * so that a pass would change nothing that co-tenants, the exporter or its next launch read
 * (egpu_ctl_slot_at_rest). A
 * launch through the gate wakes it; a card in MODE_NONE launches past the gate, so there the
 * nap is the modes' own period (a co-tenant that turns the gate on is seen as soon as now). */
static uint64_t nap_ns(uint64_t now)
{
    uint64_t ns = QUIET_NAP_NS;
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        card_ent *c = &g_c.card[d];
        if (!c->r || c->slot < 0) continue;
        if (threads_busy(d, now) || !egpu_ctl_slot_at_rest(c->r, c->slot, &g_c.p, now)) return 0;
        if (__atomic_load_n(&c->mode, __ATOMIC_RELAXED) == MODE_NONE) ns = u64min(ns, g_c.p.tick_ns / MODES_PER_TICK);
    }
    return ns;
}

/* Arms the nap (g_c.mu held): `napping` set, then the launches counted again, so that a
 * launch whose gate read `napping` as 0 just before it was set and has counted itself keeps
 * the poller awake. One still between its gate and its count (a few us; no fence on the
 * launch path) is seen at the next launch's gate or at the nap's end, 250 ms at worst; one
 * that waited in admission wakes the poller itself after its wait. Returns whether to nap. */
static int nap_arm(void)
{
    __atomic_store_n(&g_c.napping, 1, __ATOMIC_SEQ_CST);
    for (int d = 0; d < g_c.cfg.ndev && d < EGPU_COMPUTE_MAX_DEVS; d++) {
        if (launches_counted(d) != g_c.card[d].launches_seen) {
            __atomic_store_n(&g_c.napping, 0, __ATOMIC_RELAXED);
            return 0;
        }
    }
    return 1;
}

void *poller(void *arg)
{
    (void)arg;
    uint64_t last_launches = 0, busy_ns = egpu_now_ns(); /* last pass with work to watch */
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
        if (now - g_c.last_modes_ns >= g_c.p.tick_ns / MODES_PER_TICK) {
            g_c.last_modes_ns = now;
            egpu_fastclock_rebase();
            update_modes();
            for (int dv = 0; dv < g_c.cfg.ndev; dv++)
                if (g_c.card[dv].r && g_c.card[dv].slot >= 0)
                    egpu_ctl_tick(g_c.card[dv].r, g_c.card[dv].slot, &g_c.p, now);
            /* re-anchor contexts: float milliseconds lose precision far from the anchor */
            for (int i = 0; i < g_c.nctx; i++) {
                ctx_ent *e = &g_c.ctx[i];
                if (e->ok && now - e->anchored_at > REANCHOR_NS && g_c.d.cuCtxSetCurrent(e->ctx) == CUDA_SUCCESS)
                    make_anchor(e);
            }
        }
        if (active) busy_ns = now;
        uint64_t nap = now - busy_ns < QUIET_AFTER_NS ? 0 : nap_ns(now);
        if (nap && !nap_arm()) nap = 0;
        pthread_mutex_unlock(&g_c.mu);
        if (nap) {
            egpu_nap_ns(&g_c.napping, nap);
            /* a launch cut the nap short: poll as after work, not nap again at once */
            if (!__atomic_exchange_n(&g_c.napping, 0, __ATOMIC_ACQ_REL)) busy_ns = egpu_now_ns();
        } else
            egpu_sleep_ns(active ? g_c.poll_ns : u64min(g_c.poll_ns * IDLE_POLL_FACTOR, g_c.p.tick_ns / MODES_PER_TICK));
    }
    return NULL;
}
