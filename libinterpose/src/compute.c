/* compute.c: the compute controller core (compute.h; design in docs/compute.md).
 *
 * Pure: it reads and writes the per-card region and a stream's launch meter with the clock
 * passed in; no CUDA, no sleeping (compute_sim runs it on a simulated clock). The launch gate
 * (compute_gate.c) measures launches with CUDA events and sleeps while this says wait. */
#define _GNU_SOURCE
#include "compute.h"

#include <string.h>
#include <time.h>

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
    p->lease_ns = p->burst_ns / 8;
    p->group_min_ns = 1000000ULL;
    p->group_max_ns = 2000000ULL;
    p->pi_ki_ppm = 100000;
    p->pi_limit_ppm = 30000;
    p->elastic_headroom_ppm = 20000;
    p->min_rate_ppm = 10000;
}

#define EST_INITIAL_NS 100000ULL /* first launch of a share: 100 us until measured */
#define EST_MIN_NS 100ULL /* the least estimate: a pre-charge that still counts launches */
/* Events complete when the GPU reaches them: a kernel shorter than the window between its
 * launch returning and its event being submitted cannot be told apart from an empty one. Such
 * a launch, alone on an idle stream, is charged at most this (about the least GPU time a real
 * kernel takes). */
#define UNRESOLVED_NS 1000ULL
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

/* What the other live, active shares on the card hold: their booked cores or, above that,
 * their measured use. */
#define CARD_FULL_SLACK_PPM 10000ULL /* booked to within 1 point of the whole card */
static uint64_t others_committed_ppm(const egpu_card_region *r, int self, const egpu_ctl_params *p, uint64_t now)
{
    uint64_t sum = 0;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        if (j == self || !o->owner) continue;
        uint64_t last = __atomic_load_n(&o->last_active_ns, __ATOMIC_RELAXED);
        if (!o->inflight_n && (!last || now - last > 4 * p->tick_ns)) continue; /* idle */
        sum += u64max((uint64_t)o->cores * 10000ULL, o->use_ppm);
    }
    return sum;
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
         * (burst clipping, estimate refunds) so the measured use converges on the cap. Held
         * while the card is booked whole and behind (more than a burst of the share's work
         * recorded and not yet measured): there a share's measured use is how the card works
         * off everyone's queue, late, not what its bucket let out, and raising a rate would
         * only grow the queue. */
        int64_t err = (int64_t)base - (int64_t)use;
        int behind = base + others_committed_ppm(r, i, p, now) >= PPM - CARD_FULL_SLACK_PPM;
        if (!behind && ((s->flags & EGPU_SLOT_WAITING) || err < 0)) {
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

void egpu_ctl_estimates(const egpu_card_region *r, int slot, int kind, uint64_t *est, uint64_t *unit)
{
    const egpu_card_slot *s = &r->slot[slot];
    int k = EGPU_LAUNCH_KIND(kind);
    uint64_t e = __atomic_load_n(k == EGPU_LAUNCH_GRAPH ? &s->est_graph_ns : &s->est_ns, __ATOMIC_RELAXED);
    uint64_t u = __atomic_load_n(&s->solo_ns[k], __ATOMIC_RELAXED);
    *est = e ? e : EST_INITIAL_NS;
    *unit = u ? u : *est;
}

/* ---- launch meters (per stream, kept by the launching thread) ------------------------ */

static uint32_t group_n(const egpu_group *g) { return g->n[0] + g->n[1]; }
static uint64_t group_est(const egpu_group *g) { return g->est_ns[0] + g->est_ns[1]; }

int egpu_meter_add(egpu_stream_meter *m, const egpu_ctl_params *p, int kind, int gated, uint64_t est,
                   uint64_t unit, uint64_t t0, uint64_t t_queued, egpu_group *closed)
{
    int out = 0;
    egpu_group *g = &m->open;
    if (group_n(g) && g->gated != (uint32_t)!!gated) {
        /* the share's mode changed (a low-priority share arrived or left): the open group
         * is settled by its estimates and a new one begins */
        *closed = *g;
        memset(g, 0, sizeof *g);
        out |= EGPU_METER_CLOSED;
    }
    /* the stream ran at least until the end of its last measured group */
    uint64_t measured = __atomic_load_n(&m->measured_end_ns, __ATOMIC_RELAXED);
    if (measured > m->pred_end_ns) m->pred_end_ns = measured;
    /* a one-launch group measures one launch's own time: best when it starts right behind the
     * stream's own queued work */
    int sample = m->sample_due && !group_n(g) &&
                 (m->pred_end_ns > t0 || m->sample_due++ >= EGPU_SAMPLE_PATIENCE);
    if (!group_n(g)) {
        g->t_first = u64max(t0, t_queued);
        g->gated = !!gated;
    } else if (t0 > m->pred_end_ns) {
        g->gap_ns += t0 - m->pred_end_ns; /* predicted drained before this launch: idle */
    }
    m->pred_end_ns = u64max(m->pred_end_ns, t0) + unit;
    int k = EGPU_LAUNCH_KIND(kind);
    g->n[k]++;
    g->est_ns[k] += est;
    uint64_t total = group_est(g);
    int outstanding = __atomic_load_n(&m->settled_seq, __ATOMIC_RELAXED) < m->rec_seq;
    /* a launch as long as a group is measured alone, outstanding event or not: at most one
     * event per group_min of GPU time */
    int whole = group_n(g) == 1 && total >= p->group_min_ns;
    int full = (total >= p->group_min_ns && group_n(g) >= EGPU_GROUP_MIN_LAUNCHES) ||
               t0 >= g->t_first + EGPU_GROUP_MAX_AGE_NS;
    if (sample || whole || total >= p->group_max_ns || (!outstanding && full)) out |= EGPU_METER_RECORD;
    return out;
}

egpu_group egpu_meter_take(egpu_stream_meter *m, uint64_t *seq)
{
    egpu_group g = m->open;
    memset(&m->open, 0, sizeof m->open);
    *seq = ++m->rec_seq;
    /* a one-launch group measures one launch's own time (the share's solo estimate, the
     * prediction's unit): one falls due after each of the first groups, then every 8th */
    if (group_n(&g) == 1 && m->sample_due) m->sample_due = 0;
    else if ((m->nrec++ < EGPU_SAMPLE_FIRST || m->nrec % EGPU_SOLO_SAMPLE_EVERY == 0) && !m->sample_due)
        m->sample_due = 1;
    return g;
}

static void store_max(uint64_t *w, uint64_t v)
{
    uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(w, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void egpu_meter_settled(egpu_stream_meter *m, uint64_t seq, uint64_t end_ns)
{
    if (end_ns) store_max(&m->measured_end_ns, end_ns);
    store_max(&m->settled_seq, seq);
}

uint64_t egpu_meter_queued(const egpu_stream_meter *m, uint64_t now)
{
    return m->pred_end_ns > now ? m->pred_end_ns - now : 0;
}

/* ---- admission (the slow path) --------------------------------------------------------- */

/* Low priority keeps what a high-priority launch finds queued ahead of it short: beyond two
 * launches, at most max_inflight of work; while high-priority work was seen in the last
 * second (a latency-sensitive neighbour), one launch unless the queue stays within
 * max_inflight. queued: the launching stream's predicted queue. */
static int low_queue_full(const egpu_ctl_params *p, int hi_recent, uint64_t e, uint64_t queued)
{
    if (hi_recent) return queued > 0 && queued + e > p->max_inflight_ns;
    return queued >= 2 * e && queued >= p->max_inflight_ns;
}

/* How long until the queue takes the launch (low_queue_full's inverse). */
static uint64_t low_queue_wait(const egpu_ctl_params *p, int hi_recent, uint64_t e, uint64_t queued)
{
    uint64_t room = hi_recent ? (p->max_inflight_ns > e ? p->max_inflight_ns - e : 0)
                              : u64max(2 * e, p->max_inflight_ns);
    return queued > room ? queued - room + 1000 : 1000;
}

int egpu_ctl_low_may_go(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t est, uint64_t queued_ns,
                        uint64_t now)
{
    uint64_t hi = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    if (hi && now < hi + p->hi_hold_ns) return 0;
    return !low_queue_full(p, hi && now < hi + HI_RECENT_NS, est, queued_ns);
}

/* A process of the share that died (or exited) with groups in flight never settles them:
 * forget in-flight work that has not moved for a long time, so that no one waits on it. */
static void expire_inflight_locked(egpu_card_slot *s, uint64_t now)
{
    if (!s->inflight_n) return;
    uint64_t quiet = u64max(250 * 1000000ULL, 8 * u64max(s->est_ns, s->est_graph_ns));
    uint64_t last = u64max(s->last_complete_ns, s->inflight_since_ns);
    if (now > last + quiet) {
        s->inflight_n = 0;
        s->inflight_ns = 0;
    }
}

/* Tokens a process held (or owes) go back into the bucket. */
static void fold_lease_locked(egpu_card_slot *s, const egpu_ctl_params *p, int64_t held)
{
    if (held && has_bucket(s)) s->level_ns = i64clamp(s->level_ns + held, debt_floor(s, p), (int64_t)p->burst_ns);
}

int egpu_ctl_admit(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, uint64_t now,
                   uint64_t queued_ns, int64_t *lease, uint64_t *est, uint64_t *wait_ns)
{
    int64_t held = lease ? *lease : 0;
    if (lease) *lease = 0;
    *est = 0;
    *wait_ns = 0;
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS) return EGPU_ADMIT_GO; /* released (exit) */
    if (egpu_card_lock(r) != 0) return EGPU_ADMIT_GO; /* never block work on a broken lock */
    egpu_card_slot *s = &r->slot[slot];
    tick_locked(r, slot, p, now);
    refill_locked(s, p, now);
    expire_inflight_locked(s, now);
    fold_lease_locked(s, p, held);
    uint64_t ke = EGPU_LAUNCH_KIND(kind) == EGPU_LAUNCH_GRAPH ? s->est_graph_ns : s->est_ns;
    uint64_t e = ke ? ke : EST_INITIAL_NS;
    int floor_go = 0, why = EGPU_ADMIT_GO;
    uint64_t hint = p->wait_step_ns;
    if (s->priority == EGPU_CARD_PRIO_LOW) {
        uint64_t hi = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
        if (hi && now < hi + p->hi_hold_ns) {
            if (s->floor_pct && s->floor_level_ns > 0 && !queued_ns && !s->inflight_n) {
                floor_go = 1; /* the floor: a trickle of launches, one at a time */
            } else {
                why = EGPU_ADMIT_WAIT_PRIO;
                hint = u64min(hint, hi + p->hi_hold_ns - now);
                if (s->floor_pct && s->floor_level_ns <= 0)
                    hint = u64min(hint, (uint64_t)(-s->floor_level_ns) * 100 / s->floor_pct + 1000);
            }
        } else {
            int hi_recent = hi && now < hi + HI_RECENT_NS;
            if (low_queue_full(p, hi_recent, e, queued_ns)) {
                why = EGPU_ADMIT_WAIT_INFLIGHT;
                hint = u64min(hint, low_queue_wait(p, hi_recent, e, queued_ns));
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
        int64_t x = lease ? i64clamp(s->level_ns, 0, (int64_t)p->lease_ns) : 0;
        if (bucket && x > (int64_t)e) {
            /* a new lease: up to lease_ns of the bucket, this launch's estimate drawn from it */
            s->level_ns -= x;
            *lease = x - (int64_t)e;
        } else if (has_bucket(s)) {
            /* a launch longer than a lease draws on the bucket itself (a debt stays in the
             * bucket, where the refill pays it back unclipped) */
            s->level_ns -= (int64_t)e;
        }
        if (floor_go) s->floor_level_ns -= (int64_t)e;
        __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
        *est = e;
    }
    egpu_card_unlock(r);
    if (why == EGPU_ADMIT_GO && s->priority == EGPU_CARD_PRIO_HIGH) egpu_ctl_hi_touch(r, now);
    *wait_ns = why == EGPU_ADMIT_GO ? 0 : u64max(hint, 20000);
    return why;
}

/* ---- settlement ------------------------------------------------------------------------ */

static void account_locked(egpu_card_slot *s, uint64_t charge)
{
    s->tick_busy_ns += charge;
    s->win_busy_ns += charge;
    s->busy_total_ns += charge;
}

/* Other shares' launches reach their slots when their pollers pass (every 0.5 ms while they
 * launch, every 5 ms while idle): a share counts as active this long after it was seen. */
#define ACTIVE_SLACK_NS 5000000ULL

/* Was another share's work on the card during [start, end)? Its measured work ended after
 * our start, or its queued work was predicted to, or it has recorded work outstanding since
 * before our end, or it launched (to within a poll) since our start, or high-priority work
 * was active (lock held). */
static int overlapped_locked(const egpu_card_region *r, int self, uint64_t start, uint64_t end)
{
    if (__atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED) > start && r->slot[self].priority == EGPU_CARD_PRIO_LOW)
        return 1;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        if (j == self || !o->owner) continue;
        if (o->busy_until_ns > start) return 1;
        if (__atomic_load_n(&o->queued_until_ns, __ATOMIC_RELAXED) > start) return 1;
        if (o->inflight_n && o->inflight_since_ns < end) return 1;
        if (__atomic_load_n(&o->last_active_ns, __ATOMIC_RELAXED) + ACTIVE_SLACK_NS > start) return 1;
    }
    return 0;
}

/* The per-launch EWMA x <- (7x + v) / 8 applied for each of n launches of value v:
 * x <- v + (x - v) * (7/8)^n. */
static uint64_t ewma_launches(uint64_t x, uint64_t v, uint32_t n)
{
    if (!x) return v;
    uint64_t w = 1u << 16; /* (7/8)^n, 16.16 fixed point */
    for (uint32_t i = 0; i < n && w; i++) w = w * 7 / 8;
    int64_t d = ((int64_t)x - (int64_t)v) * (int64_t)w / 65536;
    return (uint64_t)((int64_t)v + d);
}

/* A one-launch group measured one launch's own time. Alone on the card it is a sample of the
 * solo estimate; overlapped it is an upper bound of it: the estimate follows smaller ones at
 * once and larger ones slowly (kernels that grew), by at most 1/64 of itself a sample (one
 * launch queued behind another share's burst must not move it far). The first samples of a
 * share that starts beside busy ones are its launches queued behind their work: until it has
 * SOLO_FIRST of them, the estimate is their least. */
#define SOLO_FIRST 8
static void solo_sample_locked(egpu_card_slot *s, int k, int overlapped, uint64_t v)
{
    uint64_t *so = &s->solo_ns[k];
    int first = !s->solo_n[k]; /* an estimate set by unresolved launches only is replaced */
    if (s->solo_n[k] < SOLO_FIRST) s->solo_n[k]++;
    if (!*so || first) *so = v;
    else if (s->solo_n[k] < SOLO_FIRST && overlapped) *so = u64min(*so, v);
    else if (!overlapped) *so = (*so * 7 + v) / 8;
    else if (v < *so) *so = (*so + v) / 2;
    else *so += u64min(v - *so, *so) / 64;
}

/* What the group's launches cost alone, by their solo estimates (0: not known). */
static uint64_t solo_bound_locked(const egpu_card_slot *s, const egpu_group *g)
{
    uint64_t b = 0;
    for (int k = 0; k < 2; k++) {
        if (!g->n[k]) continue;
        if (!s->solo_ns[k]) return 0;
        b += g->n[k] * s->solo_ns[k];
    }
    return b;
}

/* Times from different processes' events differ by their anchors' errors (each process maps
 * GPU time to host time to within a few us): another share's end is trusted this much early,
 * and only for launches long enough (ANCHOR_SLACK_NS x 100) that such an error is at most 1%
 * of them; shorter ones rely on samples queued behind their own work. */
#define ANCHOR_SLACK_NS 2000ULL

/* The latest end of another share's measured work inside (start, end), or start. Kernels of
 * different contexts do not run at once: a single launch that ended at `end` began after it. */
static uint64_t others_end_within_locked(const egpu_card_region *r, int self, uint64_t start, uint64_t end)
{
    uint64_t latest = start;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        uint64_t e = o->busy_until_ns > ANCHOR_SLACK_NS ? o->busy_until_ns - ANCHOR_SLACK_NS : 0;
        if (j != self && o->owner && e > latest && o->busy_until_ns < end) latest = e;
    }
    return latest;
}

/* The group's measured GPU time: from its first launch (or the share's previous measured end)
 * to its event, less the time its stream was predicted idle between its launches; at most
 * its solo bound when another share's work overlapped it. */
static uint64_t measured_charge_locked(egpu_card_region *r, int slot, const egpu_group *g, uint64_t end_ns)
{
    egpu_card_slot *s = &r->slot[slot];
    uint64_t start = u64max(g->t_first, s->busy_until_ns);
    int single = group_n(g) == 1; /* a launch's own time: its event right after it */
    /* queued behind the stream's previous event: both ends of the interval are event times
     * (the host clock's offset from them cancels) */
    int behind = s->busy_until_ns >= g->t_first;
    /* one launch on an idle stream whose event fired by the time its record call returned:
     * the kernel was done before, and how long it ran is below what the event can tell (an
     * event completes when the GPU reaches it, not when the kernel ended; docs/compute.md,
     * Known limits) */
    int unresolved = single && g->rec_ns && !behind && end_ns <= g->rec_ns;
    uint64_t unit = s->solo_ns[g->n[1] ? 1 : 0];
    if (single && (unit ? unit : end_ns - start) >= 100 * ANCHOR_SLACK_NS)
        start = others_end_within_locked(r, slot, start, end_ns);
    uint64_t span = end_ns > start ? end_ns - start : 0;
    if (end_ns > s->busy_until_ns) s->busy_until_ns = end_ns;
    if (!span) return 0;
    int ov = overlapped_locked(r, slot, start, end_ns);
    /* an end the poller had to clamp to its own time (the anchor put it in the future) is
     * not a sample */
    if (unresolved) {
        /* its time is below what the event can tell: it is charged at most UNRESOLVED_NS, and
         * sets the share's estimate only when there is none (and is not counted as a sample:
         * the first measured one replaces it). A measured estimate stays: such launches of
         * kernels longer than a launch found the stream idle only because the CPU fell behind,
         * and lowering the prediction's unit would count their busy time as idle */
        uint64_t *so = &s->solo_ns[g->n[1] ? 1 : 0];
        if (span > UNRESOLVED_NS) span = UNRESOLVED_NS;
        if (!*so) *so = span;
    } else if (single && !g->end_clamped) {
        solo_sample_locked(s, g->n[1] ? 1 : 0, ov, span);
    }
    uint64_t bound = ov ? solo_bound_locked(s, g) : 0;
    if (ov) s->overlapped_total++;
    if (bound) {
        /* other shares' work is inside the interval, and the time the stream was predicted
         * idle may have been its launches queued behind theirs: the interval (which holds all
         * of the group's work) is bounded by what the launches cost alone */
        return bound < span ? bound : span;
    }
    return span > g->gap_ns ? span - g->gap_ns : 0;
}

/* The per-launch estimates follow the group's charge, split between kernels and graphs in
 * proportion to their estimates. */
static void learn_estimates_locked(egpu_card_slot *s, const egpu_group *g, uint64_t charge)
{
    uint64_t total = group_est(g);
    for (int k = 0; k < 2; k++) {
        if (!g->n[k]) continue;
        uint64_t part = total ? charge / total * g->est_ns[k] + charge % total * g->est_ns[k] / total
                              : charge * g->n[k] / group_n(g);
        uint64_t *ep = k == EGPU_LAUNCH_GRAPH ? &s->est_graph_ns : &s->est_ns;
        uint64_t v = ewma_launches(*ep, part / g->n[k], g->n[k]);
        __atomic_store_n(ep, v < EST_MIN_NS ? EST_MIN_NS : v, __ATOMIC_RELAXED);
    }
}

void egpu_ctl_settle(egpu_card_region *r, int slot, const egpu_ctl_params *p, const egpu_group *g, int counted,
                     uint64_t end_ns, uint64_t now)
{
    uint32_t n = group_n(g);
    if (!n || !r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    refill_locked(s, p, now);
    uint64_t est = group_est(g), charge = est;
    if (end_ns) {
        charge = measured_charge_locked(r, slot, g, end_ns);
        if (charge) learn_estimates_locked(s, g, charge);
    }
    if (g->gated) {
        s->last_complete_ns = now;
        if (has_bucket(s))
            s->level_ns = i64clamp(s->level_ns + (int64_t)est - (int64_t)charge, debt_floor(s, p), (int64_t)p->burst_ns);
    }
    if (counted) {
        s->inflight_ns = s->inflight_ns > est ? s->inflight_ns - est : 0;
        s->inflight_n = s->inflight_n > n ? s->inflight_n - n : 0;
        if (!s->inflight_n) s->inflight_ns = 0;
    }
    account_locked(s, charge);
    tick_locked(r, slot, p, now);
    egpu_card_unlock(r);
}

void egpu_ctl_batch_apply(egpu_card_region *r, int slot, const egpu_ctl_params *p, const egpu_ctl_batch *b,
                          uint64_t now)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    refill_locked(s, p, now);
    s->launches_total += b->launches;
    if (b->launches) __atomic_store_n(&s->last_active_ns, now, __ATOMIC_RELAXED);
    if (b->rec_n) {
        if (!s->inflight_n) s->inflight_since_ns = b->rec_since_ns;
        s->inflight_n += b->rec_n;
        s->inflight_ns += b->rec_est_ns;
    }
    fold_lease_locked(s, p, b->lease_back);
    s->events_total += b->events;
    if (b->queued_until_ns > s->queued_until_ns)
        __atomic_store_n(&s->queued_until_ns, b->queued_until_ns, __ATOMIC_RELAXED);
    tick_locked(r, slot, p, now);
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
