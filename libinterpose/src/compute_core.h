/* compute_core.h: what the controller core's files share (internal; compute.h is its API):
 * compute.c (rates, ticks, admission), compute_meter.c (launch meters) and compute_settle.c
 * (settling measured groups). Pure: no CUDA, no sleeping, the clock passed in. */
#ifndef EGPU_COMPUTE_CORE_H
#define EGPU_COMPUTE_CORE_H

#include <stdint.h>
#include "compute.h"

#define PPM 1000000ULL

static inline uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }
static inline int64_t i64clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A share has a token bucket unless it booked the whole card. */
static inline int has_bucket(const egpu_card_slot *s) { return s->cores < 100; }

static inline int64_t debt_floor(const egpu_card_slot *s, const egpu_ctl_params *p)
{
    /* bounded debt: one launch far longer than its estimate waits at most max_stall_ns */
    return -(int64_t)((p->max_stall_ns / 1000) * s->rate_ppm / 1000);
}

/* Tokens a process held (or owes) go back into the bucket. */
static inline void fold_lease_locked(egpu_card_slot *s, const egpu_ctl_params *p, int64_t held)
{
    if (held && has_bucket(s)) s->level_ns = i64clamp(s->level_ns + held, debt_floor(s, p), (int64_t)p->burst_ns);
}

static inline uint32_t group_n(const egpu_group *g) { return g->n[0] + g->n[1]; }
static inline uint64_t group_est(const egpu_group *g) { return g->est_ns[0] + g->est_ns[1]; }

#pragma GCC visibility push(hidden)

/* compute.c, the card lock held: the bucket's refill up to `now`; the tick and window rolled
 * when due (smoothed use and demand, the rate). */
void refill_locked(egpu_card_slot *s, const egpu_ctl_params *p, uint64_t now);
void tick_locked(egpu_card_region *r, int i, const egpu_ctl_params *p, uint64_t now);

#pragma GCC visibility pop

#endif
