/* compute_gate.c: the launch gate (compute.h, compute_gate.h; design in docs/compute.md,
 * "Measuring"): the launch path, the launching threads' state, and the teardown. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "compute_gate.h"
#include "fastclock.h"

gate_state g_c = {.mu = PTHREAD_MUTEX_INITIALIZER};

int egpu_compute_on;

/* The calling thread's state. initial-exec: the interposer is preloaded, so its TLS is static
 * and read without __tls_get_addr on the launch path. A forked child resets its one thread's. */
static __thread gate_thread *t_gate __attribute__((tls_model("initial-exec")));

/* A launch into a capturing stream is recorded into a graph, not run: it is charged when the
 * graph is launched (cuGraphLaunch goes through the gate as one launch). */
static int stream_capturing(CUstream s, int kind)
{
    return egpu_stream_capturing(g_c.d.cuStreamIsCapturing, egpu_stream_of(s, kind & EGPU_LAUNCH_PTSZ));
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
void thread_gone(void *arg)
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
    if (ce && !ce->ok && ce->failures < ANCHOR_MAX_FAILURES && make_anchor(ce) != 0 &&
        ce->failures == ANCHOR_MAX_FAILURES)
        fprintf(stderr, "egpu: cannot time launches with events; compute is charged by estimate\n");
    int dev = ce ? ce->dev : -1;
    int settled = ce && (ce->ok || ce->failures >= ANCHOR_MAX_FAILURES);
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
        /* a low-priority launch decides on a fresh view of high-priority work (card_region.h) */
        if (g_c.cfg.priority == EGPU_CARD_PRIO_LOW)
            egpu_card_try_refresh(c->r, *now, g_c.p.hi_hold_ns / LOW_VIEW_FRESH_DIV);
        uint64_t queued = gs ? egpu_meter_queued(&gs->m, *now) : 0;
        why = egpu_ctl_admit(c->r, c->slot, &g_c.p, kind, *now, queued, th ? &th->lease[dev] : NULL, &est, &wait);
        if (why == EGPU_ADMIT_GO || __atomic_load_n(&g_c.stop, __ATOMIC_RELAXED)) break;
        if (!waited_from) waited_from = *now;
        /* held by a co-tenant's high-priority work: look at its mark again, not the poller's copy */
        if (why == EGPU_ADMIT_WAIT_PRIO) egpu_card_try_refresh(c->r, *now, 0);
        /* groups that settled while we wait refund the bucket: take them in */
        if (pthread_mutex_trylock(&g_c.mu) == 0) {
            poll_locked(ctx, 0, NULL);
            pthread_mutex_unlock(&g_c.mu);
        }
        egpu_sleep_ns(u64min(wait, g_c.p.wait_step_ns)); /* never a busy spin, never holding a lock */
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
    /* the first launch the poller will count since its nap (a launch it never counts, on a
     * card without the gate or into a capture, must not wake it: it would nap again at once) */
    if (__builtin_expect(__atomic_load_n(&g_c.napping, __ATOMIC_RELAXED), 0)) {
        poller_wake(c);
        mode = __atomic_load_n(&c->mode, __ATOMIC_RELAXED);
        if (mode == MODE_NONE) return;
    }
    uint64_t now = egpu_fastclock_ns();
    int k = EGPU_LAUNCH_KIND(kind);
    gate_stream *gs = th ? stream_get(th, ctx, egpu_stream_of(s, kind & EGPU_LAUNCH_PTSZ), dev) : NULL;
    uint64_t e = __atomic_load_n(&c->est[k], __ATOMIC_RELAXED);
    if (mode == MODE_CTL) {
        if (!admit_fast(c, th, gs, dev, e, now)) {
            e = admit_slow(c, th, gs, dev, ctx, kind, &now);
            /* a wait longer than the poller's quiet second lets it nap: this launch wakes it */
            if (__atomic_load_n(&g_c.napping, __ATOMIC_RELAXED)) poller_wake(c);
        }
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
static int record_event_locked(const egpu_launch_ticket *t, CUstream rs, const egpu_group *g, egpu_stream_meter *m,
                               uint64_t seq)
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
/* ---- fork and teardown ---------------------------------------------------------------- */

void atfork_child(void)
{
    /* the child has no poller and no CUDA state of its parent: start clean */
    pthread_mutex_init(&g_c.mu, NULL);
    g_c.thr_started = 0;
    g_c.npend = 0;
    g_c.nfree = 0;
    g_c.nctx = 0;
    t_gate = NULL; /* the child's one thread; the parent's states stay the parent's */
    for (int i = 0; i < g_c.nthreads; i++) g_c.threads[i]->live = 0;
    for (int d = 0; d < EGPU_COMPUTE_MAX_DEVS; d++) /* the parent's poller may have held it */
        if (g_c.card[d].r) pthread_mutex_init(&g_c.card[d].r->refresh_mu, NULL);
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
        egpu_card_detach(c->r, c->slot, (int32_t)getpid());
        c->slot = -1;
    }
    pthread_mutex_unlock(&g_c.mu);
}
