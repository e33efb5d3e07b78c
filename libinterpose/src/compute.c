/* compute.c: the compute controller core (compute.h; design in docs/compute.md): the
 * parameters, each share's rate (strict, elastic, the PI trim), its bucket's refill and ticks,
 * and admission (the slow path of a gated launch). The launch meters are in compute_meter.c,
 * settling measured groups in compute_settle.c (compute_core.h is what they share).
 *
 * Pure: it reads and writes the per-card region and a stream's launch meter with the clock
 * passed in; no CUDA, no sleeping (compute_sim runs it on a simulated clock). The launch gate
 * (compute_gate.c) measures launches with CUDA events and sleeps while this says wait. */
#define _GNU_SOURCE
#include "compute_core.h"

/* ---- parameters ------------------------------------------------------------------------
 * egpu_ctl_params' defaults (docs/compute.md; where no config file exists, EGPU_COMPUTE_*
 * may change some: compute_setup.c). */
#define TICK_DEFAULT_NS 50000000ULL        /* 50 ms: rates follow load within a tick or two */
#define WINDOW_DEFAULT_NS 1000000000ULL    /* 1 s: the exporter's use figure (last_win_busy_ns) */
#define BURST_DEFAULT_NS 10000000ULL       /* 10 ms of GPU time: at most 0.1 point over a 10 s window */
#define MAX_STALL_DEFAULT_NS 2000000000ULL /* 2 s: the longest one overlong kernel stalls its share */
#define MAX_INFLIGHT_DEFAULT_NS 2000000ULL /* 2 ms: what a high-priority launch finds queued by low work */
#define HI_HOLD_DEFAULT_NS 2000000ULL      /* 2 ms: low work resumes ~3 ms (hold + poll) after high work */
#define WAIT_STEP_DEFAULT_NS 1000000ULL    /* 1 ms: a waiting launch looks again at least this often */
#define GROUP_MIN_DEFAULT_NS 1000000ULL    /* 1 ms: an event (~2.5 us of CPU) per ms of GPU work at most */
#define GROUP_MAX_DEFAULT_NS 2000000ULL    /* 2 ms: a group settles at most this much work late */
#define PI_KI_DEFAULT_PPM 100000           /* 0.1: the integral takes a tenth of a tick's error */
#define PI_LIMIT_DEFAULT_PPM 30000         /* 3 points: the trim corrects the bucket's losses, not the cap */
#define ELASTIC_HEADROOM_DEFAULT_PPM 20000 /* 2 points elastic shares leave idle for arriving shares */
#define MIN_RATE_DEFAULT_PPM 10000         /* 1 point: a share with nothing booked still progresses */

void egpu_ctl_defaults(egpu_ctl_params *p)
{
    p->tick_ns = TICK_DEFAULT_NS;
    p->window_ns = WINDOW_DEFAULT_NS;
    p->burst_ns = BURST_DEFAULT_NS;
    p->max_stall_ns = MAX_STALL_DEFAULT_NS;
    p->max_inflight_ns = MAX_INFLIGHT_DEFAULT_NS;
    p->hi_hold_ns = HI_HOLD_DEFAULT_NS;
    p->wait_step_ns = WAIT_STEP_DEFAULT_NS;
    p->lease_ns = p->burst_ns / EGPU_LEASE_BURST_DIV;
    p->group_min_ns = GROUP_MIN_DEFAULT_NS;
    p->group_max_ns = GROUP_MAX_DEFAULT_NS;
    p->pi_ki_ppm = PI_KI_DEFAULT_PPM;
    p->pi_limit_ppm = PI_LIMIT_DEFAULT_PPM;
    p->elastic_headroom_ppm = ELASTIC_HEADROOM_DEFAULT_PPM;
    p->min_rate_ppm = MIN_RATE_DEFAULT_PPM;
}

/* ---- rates and ticks -------------------------------------------------------------------- */

#define EST_INITIAL_NS 100000ULL         /* first launch of a share: 100 us until measured */
#define HI_RECENT_NS 1000000000ULL       /* high priority seen this recently: low keeps one launch queued */
#define PPM_PER_PCT 10000ULL             /* booked cores (%) as a rate */
#define IDLE_AFTER_TICKS 4               /* a share silent this many ticks (200 ms) reserves nothing */
#define WANTS_MORE_PPM 50000ULL          /* demand 5 points above use: the share wants more than it gets */
#define NEAR_GUARANTEE_PPM 20000ULL      /* use within 2 points of the guarantee: it may want all of it */
#define REFILL_MAX_GAP_NS 10000000000ULL /* 10 s: keeps one refill's products far from overflow */

/* What the other live shares on the card hold: their measured use, raised to their guarantee
 * while they want more than they get (demand above use; both as their files say, believed up
 * to their booking: card_region.c, sanitise) -- so that an elastic share gives
 * back what it borrowed as soon as the owner asks. Against a high-priority share a low one
 * holds only its floor: it yields while high-priority work runs, whatever it booked (else
 * its wait would count as demand and cut the high share's rate, and the gaps that leaves
 * would let it run). */
static uint64_t others_reserved_ppm(const egpu_card_region *r, int self, const egpu_ctl_params *p, uint64_t now)
{
    uint64_t sum = 0;
    int self_high = r->slot[self].priority == EGPU_CARD_PRIO_HIGH;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        const egpu_card_slot *o = &r->slot[j];
        if (j == self || !o->owner) continue;
        if (self_high && o->priority == EGPU_CARD_PRIO_LOW) {
            sum += (uint64_t)o->floor_pct * PPM_PER_PCT;
            continue;
        }
        uint64_t last = __atomic_load_n(&o->last_active_ns, __ATOMIC_RELAXED);
        if (!o->inflight_n && (!last || now - last > IDLE_AFTER_TICKS * p->tick_ns)) continue; /* idle */
        uint64_t res = o->use_ppm;
        uint64_t guarantee = (uint64_t)o->cores * PPM_PER_PCT;
        if (o->demand_ppm > o->use_ppm + WANTS_MORE_PPM || o->use_ppm + NEAR_GUARANTEE_PPM >= guarantee)
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
        if (!o->inflight_n && (!last || now - last > IDLE_AFTER_TICKS * p->tick_ns)) continue; /* idle */
        sum += u64max((uint64_t)o->cores * PPM_PER_PCT, o->use_ppm);
    }
    return sum;
}

static uint64_t base_rate_ppm(const egpu_card_region *r, int i, const egpu_ctl_params *p, uint64_t now)
{
    const egpu_card_slot *s = &r->slot[i];
    uint64_t guarantee = (uint64_t)s->cores * PPM_PER_PCT;
    if (s->policy == EGPU_CARD_STRICT && s->cores > 0) return guarantee;
    /* elastic, or nothing booked (lowest guarantee): at least the guarantee, plus what the
     * others leave idle */
    uint64_t others = others_reserved_ppm(r, i, p, now);
    uint64_t idle = PPM > others + p->elastic_headroom_ppm ? PPM - others - p->elastic_headroom_ppm : 0;
    return u64max(u64max(guarantee, idle), p->min_rate_ppm);
}

void refill_locked(egpu_card_slot *s, const egpu_ctl_params *p, uint64_t now)
{
    if (now <= s->refill_ns) return;
    uint64_t dt = u64min(now - s->refill_ns, REFILL_MAX_GAP_NS);
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

void tick_locked(egpu_card_region *r, int i, const egpu_ctl_params *p, uint64_t now)
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
         * while the card is booked whole (this share's rate and its co-tenants' committed
         * ones reach the card, within CARD_FULL_SLACK_PPM): there the card is behind, a
         * share's measured use is how it works off everyone's queue, late, not what its
         * bucket let out, and raising a rate would only grow the queue. */
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

static void atomic_raise(uint64_t *word, uint64_t to)
{
    uint64_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
    while (old < to && !__atomic_compare_exchange_n(word, &old, to, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

void egpu_ctl_hi_touch(egpu_card_region *r, uint64_t now)
{
    atomic_raise(&r->hi_active_ns, now);
    /* the mark co-tenants read: in the share's own file (card_region.h) */
    if (r->self >= 0) atomic_raise(&r->slot[r->self].hi_mark_ns, now);
}

int egpu_ctl_hi_active(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t now)
{
    uint64_t t = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    return t && now < t + p->hi_hold_ns;
}

int egpu_ctl_slot_at_rest(const egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now)
{
    const egpu_card_slot *s = &r->slot[slot];
    uint64_t last = __atomic_load_n(&s->last_active_ns, __ATOMIC_RELAXED);
    return (!s->inflight_n || egpu_inflight_stale(s, now)) && !s->tick_busy_ns && !s->tick_wait_ns &&
           !s->use_ppm && !s->demand_ppm && (!last || now - last > IDLE_AFTER_TICKS * p->tick_ns);
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

/* ---- admission (the slow path) --------------------------------------------------------- */

#define WAIT_MARGIN_NS 1000ULL               /* look again 1 us after the predicted time, not just before it */
#define MIN_WAIT_NS 20000ULL                 /* a waiting launch sleeps at least 20 us: never a busy spin */

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
    uint64_t room =
        hi_recent ? (p->max_inflight_ns > e ? p->max_inflight_ns - e : 0) : u64max(2 * e, p->max_inflight_ns);
    return queued > room ? queued - room + WAIT_MARGIN_NS : WAIT_MARGIN_NS;
}

int egpu_ctl_low_may_go(const egpu_card_region *r, const egpu_ctl_params *p, uint64_t est, uint64_t queued_ns,
                        uint64_t now)
{
    /* a view of co-tenants older than an eighth of the hold may miss high-priority work: the slow
     * path reads it again */
    if (egpu_card_stale(r, now, p->hi_hold_ns / LOW_VIEW_FRESH_DIV)) return 0;
    uint64_t hi = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    if (hi && now < hi + p->hi_hold_ns) return 0;
    return !low_queue_full(p, hi && now < hi + HI_RECENT_NS, est, queued_ns);
}

/* A process of the share that died (or exited) with groups in flight never settles them:
 * forget in-flight work that has not moved for a long time, so that no one waits on it. */
static void expire_inflight_locked(egpu_card_slot *s, uint64_t now)
{
    if (s->inflight_n && egpu_inflight_stale(s, now)) { /* card_region.h: readers apply the same rule */
        s->inflight_n = 0;
        s->inflight_ns = 0;
    }
}

int egpu_ctl_admit(egpu_card_region *r, int slot, const egpu_ctl_params *p, int kind, uint64_t now, uint64_t queued_ns,
                   int64_t *lease, uint64_t *est, uint64_t *wait_ns)
{
    int64_t held = lease ? *lease : 0;
    if (lease) *lease = 0;
    *est = 0;
    *wait_ns = 0;
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS) return EGPU_ADMIT_GO; /* released (exit) */
    if (egpu_card_lock(r, slot) != 0) return EGPU_ADMIT_GO;                    /* never block work on a broken lock */
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
                    hint = u64min(hint, (uint64_t)(-s->floor_level_ns) * 100 / s->floor_pct + WAIT_MARGIN_NS);
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
        uint64_t need = (uint64_t)(-s->level_ns) + WAIT_MARGIN_NS;
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
    egpu_card_unlock(r, slot);
    if (why == EGPU_ADMIT_GO && s->priority == EGPU_CARD_PRIO_HIGH) egpu_ctl_hi_touch(r, now);
    *wait_ns = why == EGPU_ADMIT_GO ? 0 : u64max(hint, MIN_WAIT_NS);
    return why;
}
