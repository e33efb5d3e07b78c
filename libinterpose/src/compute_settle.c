/* compute_settle.c: settling a group of launches on its measured end (compute.h): the GPU
 * time it is charged (merged with the share's other intervals, predicted idle time taken out,
 * bounded by solo estimates beside other shares), the estimates it teaches, and what the
 * poller and waiting launches hand the slot. */
#define _GNU_SOURCE
#include "compute_core.h"

#define EST_MIN_NS 100ULL /* the least estimate: a pre-charge that still counts launches */
/* Events complete when the GPU reaches them: a kernel shorter than the window between its
 * launch returning and its event being submitted cannot be told apart from an empty one. Such
 * a launch, alone on an idle stream, is charged at most this (about the least GPU time a real
 * kernel takes). */
#define UNRESOLVED_NS 1000ULL

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
#define SOLO_RISE_DIV 64 /* a larger overlapped sample raises the estimate by 1/64 of itself at most */
static void solo_sample_locked(egpu_card_slot *s, int k, int overlapped, uint64_t v)
{
    uint64_t *so = &s->solo_ns[k];
    int first = !s->solo_n[k]; /* an estimate set by unresolved launches only is replaced */
    if (s->solo_n[k] < SOLO_FIRST) s->solo_n[k]++;
    if (!*so || first) *so = v;
    else if (s->solo_n[k] < SOLO_FIRST && overlapped) *so = u64min(*so, v);
    else if (!overlapped) *so = (*so * 7 + v) / 8;
    else if (v < *so) *so = (*so + v) / 2;
    else *so += u64min(v - *so, *so) / SOLO_RISE_DIV;
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

/* Where the launch began, by other shares' measured ends inside (start, end): kernels of
 * different contexts do not run at once, so a single launch that ended at `end` began after
 * them. An end is the other share's word only (its busy_until_ns): written at every moment as
 * "ended 1 ms ago", it moved every sample's start to 1 ms before its end, and a strict 30% share
 * with 20 ms kernels ran at 100% charged 4.6%. So the interval up to each end is believed only
 * as far as credit pays for it (card_region.h, other_credit_ns: work a share measured and
 * counted as its own use, within its booking), and uses that credit up: the part up to a
 * share's end is paid by that share or one whose end is later (its work may lie anywhere
 * before its end), never by one whose end is earlier; the start moves as far as it is paid. */
static uint64_t launch_start_locked(egpu_card_region *r, int self, uint64_t start, uint64_t end)
{
    int who[EGPU_CARD_SLOTS], n = 0;
    uint64_t at_end[EGPU_CARD_SLOTS]; /* the ends, read once (a refresh may rewrite the copies) */
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) { /* the others' ends inside, in order */
        uint64_t e = __atomic_load_n(&r->slot[j].busy_until_ns, __ATOMIC_RELAXED);
        if (j == self || !r->slot[j].owner || e >= end || e <= start + ANCHOR_SLACK_NS) continue;
        int k = n++;
        for (; k > 0 && at_end[k - 1] > e; k--) {
            at_end[k] = at_end[k - 1];
            who[k] = who[k - 1];
        }
        at_end[k] = e;
        who[k] = j;
    }
    uint64_t at = start;
    for (int i = 0; i < n; i++) {
        uint64_t e = at_end[i] - ANCHOR_SLACK_NS;
        for (int k = i; k < n && e > at; k++) { /* its own credit first, then later ones' */
            uint64_t *credit = &r->other_credit_ns[who[k]];
            uint64_t pay = u64min(e - at, __atomic_load_n(credit, __ATOMIC_RELAXED));
            __atomic_sub_fetch(credit, pay, __ATOMIC_RELAXED);
            at += pay;
        }
    }
    return at;
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
    int k = g->n[1] ? 1 : 0;
    uint64_t unit = s->solo_ns[k];
    if (single && !unresolved && (unit ? unit : end_ns - start) >= 100 * ANCHOR_SLACK_NS)
        start = launch_start_locked(r, slot, start, end_ns);
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
    if (!n || !r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r, slot) != 0) return;
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
            s->level_ns =
                i64clamp(s->level_ns + (int64_t)est - (int64_t)charge, debt_floor(s, p), (int64_t)p->burst_ns);
    }
    if (counted) {
        s->inflight_ns = s->inflight_ns > est ? s->inflight_ns - est : 0;
        s->inflight_n = s->inflight_n > n ? s->inflight_n - n : 0;
        if (!s->inflight_n) s->inflight_ns = 0;
    }
    account_locked(s, charge);
    tick_locked(r, slot, p, now);
    egpu_card_unlock(r, slot);
}

void egpu_ctl_batch_apply(egpu_card_region *r, int slot, const egpu_ctl_params *p, const egpu_ctl_batch *b,
                          uint64_t now)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r, slot) != 0) return;
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
    egpu_card_unlock(r, slot);
}

void egpu_ctl_waited(egpu_card_region *r, int slot, const egpu_ctl_params *p, int why, uint64_t waited_ns, uint64_t now)
{
    (void)why;
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r, slot) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    s->tick_wait_ns += waited_ns;
    s->wait_total_ns += waited_ns;
    tick_locked(r, slot, p, now);
    egpu_card_unlock(r, slot);
}

void egpu_ctl_tick(egpu_card_region *r, int slot, const egpu_ctl_params *p, uint64_t now)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r, slot) != 0) return;
    tick_locked(r, slot, p, now);
    refill_locked(&r->slot[slot], p, now);
    egpu_card_unlock(r, slot);
}
