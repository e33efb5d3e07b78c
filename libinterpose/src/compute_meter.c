/* compute_meter.c: a stream's launch meter (compute.h, "launch groups"): which launches form
 * a group, when an event is due, and the stream's predicted queue. Kept by the launching
 * thread; the poller only marks events settled. */
#define _GNU_SOURCE
#include <string.h>
#include "compute_core.h"

int egpu_meter_add(egpu_stream_meter *m, const egpu_ctl_params *p, int kind, int gated, uint64_t est, uint64_t unit,
                   uint64_t t0, uint64_t t_queued, egpu_group *closed)
{
    int out = 0;
    egpu_group *g = &m->open;
    if (group_n(g) && g->gated != (uint32_t)(!!gated)) {
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
    int sample = m->sample_due && !group_n(g) && (m->pred_end_ns > t0 || m->sample_due++ >= EGPU_SAMPLE_PATIENCE);
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
    int full =
        (total >= p->group_min_ns && group_n(g) >= EGPU_GROUP_MIN_LAUNCHES) || t0 >= g->t_first + EGPU_GROUP_MAX_AGE_NS;
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
    while (old < v && !__atomic_compare_exchange_n(w, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
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
