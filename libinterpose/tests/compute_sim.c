/* compute_sim.c: the compute controller core (compute.c part 1) against a simulated card,
 * with a simulated clock: no CUDA, no sleeping; 20 simulated seconds run in milliseconds.
 *
 * The card model is the fake GPU's: kernels from every share run one after another in launch
 * order (start = max(launch, the stream's previous end, the card's clock)). Each share is an
 * application loop that launches through egpu_ctl_admit, sleeps for the hint when told to
 * wait, and keeps at most `depth` launches queued (as a real launch queue or a periodic
 * synchronize does). A poller completes finished launches every 500 us with their exact end
 * times, as the CUDA events would give them.
 *
 * Usage: compute_sim [case ...]   (no argument: all). Prints one line per check:
 *   ok|FAIL <case> <what> value=<v> want=<range>    and exits 1 on any FAIL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "card_region.h"
#include "compute.h"

#define US 1000ULL
#define MS 1000000ULL
#define SEC 1000000000ULL
#define MAXQ 256
#define MAXK 400000

typedef struct { uint64_t launch, start, fin, est; int gated; } kern;

typedef struct {
    const char *name;
    int slot;
    uint64_t kernel_ns;
    uint64_t period_ns;   /* 0: launch back to back; else one launch every period */
    int depth;            /* most launches outstanding before the app waits for the GPU */
    int active;           /* 0: not launching (yet) */
    uint64_t start_at, stop_at;
    int priority, gated_prio_high_hint;
    /* state */
    uint64_t next_try, next_period, stream_end, wait_from;
    kern q[MAXQ];
    int qn;               /* launched, not yet completed by the poller */
    kern *done;           /* every launch, for the measurements */
    int ndone;
    uint64_t last_launch, max_gap;
} share;

static egpu_card_region g_region;
static egpu_ctl_params g_p;
static uint64_t g_card_clock;

static int g_fail;
static void check(const char *cs, const char *what, double v, double lo, double hi)
{
    int ok = v >= lo && v <= hi;
    if (!ok) g_fail = 1;
    printf("%s %s %s value=%.2f want=[%.2f,%.2f]\n", ok ? "ok" : "FAIL", cs, what, v, lo, hi);
}

static void complete_upto(share *s, uint64_t now)
{
    int k = 0;
    for (int i = 0; i < s->qn; i++) {
        kern *x = &s->q[i];
        if (x->fin <= now) {
            egpu_ctl_complete(&g_region, s->slot, &g_p, EGPU_LAUNCH_KERNEL, x->gated, x->est, x->launch, x->fin, now);
        } else {
            s->q[k++] = *x;
        }
    }
    s->qn = k;
}

static void launch(share *s, uint64_t now, uint64_t est, int gated)
{
    kern x = {now, 0, 0, est, gated};
    x.start = now;
    if (s->stream_end > x.start) x.start = s->stream_end;
    if (g_card_clock > x.start) x.start = g_card_clock;
    x.fin = x.start + s->kernel_ns;
    g_card_clock = s->stream_end = x.fin;
    s->q[s->qn++] = x;
    if (s->ndone < MAXK) s->done[s->ndone++] = x;
    if (s->last_launch && now - s->last_launch > s->max_gap) s->max_gap = now - s->last_launch;
    s->last_launch = now;
}

/* One application step at time now. Returns the next time it wants to act. */
static uint64_t app_step(share *s, uint64_t now)
{
    if (!s->active || now < s->start_at || (s->stop_at && now >= s->stop_at)) return now + 100 * US;
    if (s->period_ns) {
        if (now < s->next_period) return s->next_period;
    }
    if (s->qn >= s->depth) {
        /* app synchronizes: wait for the oldest of its launches */
        uint64_t t = s->q[0].fin;
        for (int i = 1; i < s->qn; i++)
            if (s->q[i].fin < t) t = s->q[i].fin;
        return t > now ? t : now + US;
    }
    if (s->priority == EGPU_CARD_PRIO_HIGH && g_region.slot[s->slot].cores % 100 == 0) {
        /* the gate's watch mode: an uncapped high-priority share is never held, only seen */
        egpu_ctl_hi_touch(&g_region, now);
        launch(s, now, 0, 0);
        if (s->period_ns) s->next_period = (s->next_period ? s->next_period : now) + s->period_ns;
        return now + 5 * US;
    }
    uint64_t est, wait;
    int why = egpu_ctl_admit(&g_region, s->slot, &g_p, EGPU_LAUNCH_KERNEL, now, &est, &wait);
    if (why != EGPU_ADMIT_GO) {
        if (!s->wait_from) s->wait_from = now;
        complete_upto(s, now); /* the gate polls its own events while waiting */
        return now + (wait < g_p.wait_step_ns ? wait : g_p.wait_step_ns);
    }
    if (s->wait_from) {
        egpu_ctl_waited(&g_region, s->slot, &g_p, why, now - s->wait_from, now);
        s->wait_from = 0;
    }
    launch(s, now, est, 1);
    if (s->period_ns) s->next_period = (s->next_period ? s->next_period : now) + s->period_ns;
    return now + 5 * US; /* CPU cost of one launch */
}

/* GPU time of share s inside [a, b). */
static double use_in(const share *s, uint64_t a, uint64_t b)
{
    double busy = 0;
    for (int i = 0; i < s->ndone; i++) {
        uint64_t st = s->done[i].start > a ? s->done[i].start : a;
        uint64_t en = s->done[i].fin < b ? s->done[i].fin : b;
        if (en > st) busy += (double)(en - st);
    }
    return 100.0 * busy / (double)(b - a);
}

static void setup(share *sh, int n, const int *cores, const int *policy, int floor_pct)
{
    egpu_ctl_defaults(&g_p);
    egpu_card_region_init(&g_region, "GPU-sim", 1);
    g_card_clock = 0;
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "share-%d", i);
        sh[i].slot = egpu_card_claim(&g_region, egpu_owner_id(key), 1 /* self: never reaped */, (uint32_t)sh[i].priority,
                                     (uint32_t)policy[i], (uint32_t)cores[i], (uint32_t)floor_pct, 1);
        sh[i].done = calloc(MAXK, sizeof(kern));
        if (!sh[i].depth) sh[i].depth = 64;
    }
}

static void run(share *sh, int n, uint64_t until)
{
    uint64_t now = 1, next_poll = 0;
    uint64_t next[8] = {0};
    while (now < until) {
        if (now >= next_poll) {
            for (int i = 0; i < n; i++) {
                complete_upto(&sh[i], now);
                /* the poller sees high-priority work still outstanding */
                if (sh[i].priority == EGPU_CARD_PRIO_HIGH && sh[i].qn) egpu_ctl_hi_touch(&g_region, now);
            }
            for (int i = 0; i < n; i++) egpu_ctl_tick(&g_region, sh[i].slot, &g_p, now);
            next_poll = now + 500 * US;
        }
        uint64_t t = next_poll;
        for (int i = 0; i < n; i++) {
            if (now >= next[i]) next[i] = app_step(&sh[i], now);
            if (next[i] < t) t = next[i];
        }
        now = t > now ? t : now + 1;
    }
}

static void teardown(share *sh, int n)
{
    for (int i = 0; i < n; i++) free(sh[i].done);
    memset(sh, 0, sizeof(share) * (size_t)n);
}

/* FC-13: a strict cap alone on the card, for long and short kernels. */
static void case_caps(void)
{
    uint64_t ks[] = {50 * US, 20 * MS};
    for (int k = 0; k < 2; k++)
        for (int cap = 10; cap <= 90; cap += 10) {
            share sh[1] = {{.name = "a", .kernel_ns = ks[k], .active = 1, .depth = ks[k] > MS ? 4 : 64}};
            int cores[] = {cap}, pol[] = {EGPU_CARD_STRICT};
            setup(sh, 1, cores, pol, 0);
            run(sh, 1, 21 * SEC);
            char what[96];
            for (int w = 0; w < 2; w++) {
                double u = use_in(&sh[0], (1 + 10 * (uint64_t)w) * SEC, (11 + 10 * (uint64_t)w) * SEC);
                snprintf(what, sizeof what, "cap=%d kernel=%lluus window=%d use", cap, (unsigned long long)(ks[k] / US), w);
                check("FC-13-cap", what, u, cap - 3, cap + 3);
            }
            /* no multi-second stalls; and the cap holds over any 1 s as well (+5) */
            snprintf(what, sizeof what, "cap=%d kernel=%lluus max_gap_ms", cap, (unsigned long long)(ks[k] / US));
            check("FC-13-cap", what, (double)sh[0].max_gap / MS, 0, 1000);
            double worst = 0;
            for (uint64_t a = 1 * SEC; a + SEC <= 21 * SEC; a += SEC / 2) {
                double u = use_in(&sh[0], a, a + SEC);
                if (u > worst) worst = u;
            }
            snprintf(what, sizeof what, "cap=%d kernel=%lluus worst_1s_use", cap, (unsigned long long)(ks[k] / US));
            check("FC-13-cap", what, worst, 0, cap + 5);
            teardown(sh, 1);
        }
}

/* FC-13: shares of 30 and 70 split 30:70 (strict and elastic). */
static void case_split(void)
{
    uint64_t ks[] = {50 * US, 20 * MS};
    for (int pol = 0; pol < 2; pol++)
        for (int k = 0; k < 2; k++) {
            int depth = ks[k] > MS ? 4 : 64;
            share sh[2] = {{.name = "a", .kernel_ns = ks[k], .active = 1, .depth = depth},
                           {.name = "b", .kernel_ns = ks[k], .active = 1, .depth = depth}};
            int cores[] = {30, 70}, pols[] = {pol, pol};
            setup(sh, 2, cores, pols, 0);
            run(sh, 2, 21 * SEC);
            double a = use_in(&sh[0], SEC, 21 * SEC), b = use_in(&sh[1], SEC, 21 * SEC);
            char what[96];
            snprintf(what, sizeof what, "%s kernel=%lluus share_of_30", pol ? "elastic" : "strict",
                     (unsigned long long)(ks[k] / US));
            check("FC-13-split", what, 100.0 * a / (a + b), 27, 33);
            snprintf(what, sizeof what, "%s kernel=%lluus total_use", pol ? "elastic" : "strict",
                     (unsigned long long)(ks[k] / US));
            check("FC-13-split", what, a + b, 90, 101);
            if (!pol) {
                snprintf(what, sizeof what, "strict kernel=%lluus use_a_le_cap", (unsigned long long)(ks[k] / US));
                check("FC-13-split", what, a, 0, 33);
                snprintf(what, sizeof what, "strict kernel=%lluus use_b_le_cap", (unsigned long long)(ks[k] / US));
                check("FC-13-split", what, b, 0, 73);
            }
            teardown(sh, 2);
        }
}

/* Elastic: alone it takes the idle card; when the owner of the rest arrives it gives it back. */
static void case_elastic(void)
{
    share sh[2] = {{.name = "e30", .kernel_ns = 1 * MS, .active = 1, .depth = 8},
                   {.name = "s70", .kernel_ns = 1 * MS, .active = 1, .depth = 8, .start_at = 6 * SEC}};
    int cores[] = {30, 70}, pols[] = {EGPU_CARD_ELASTIC, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(sh, 2, 16 * SEC);
    check("elastic", "alone use", use_in(&sh[0], 1 * SEC, 6 * SEC), 90, 100);
    check("elastic", "beside strict-70 use_e30", use_in(&sh[0], 8 * SEC, 16 * SEC), 27, 33);
    check("elastic", "beside strict-70 use_s70", use_in(&sh[1], 8 * SEC, 16 * SEC), 67, 73);
    teardown(sh, 2);
}

/* FC-14: high priority goes first; low priority resumes within 20 ms once it is idle. */
static void case_priority(void)
{
    for (int capped = 0; capped < 2; capped++) {
        uint64_t solo_lat = 0;
        {
            share sh[1] = {{.name = "hi", .kernel_ns = 500 * US, .period_ns = 100 * MS, .active = 1, .priority = EGPU_CARD_PRIO_HIGH}};
            int cores[] = {capped ? 50 : 0}, pols[] = {EGPU_CARD_STRICT};
            setup(sh, 1, cores, pols, 0);
            run(sh, 1, 5 * SEC);
            for (int i = 0; i < sh[0].ndone; i++) solo_lat += sh[0].done[i].fin - sh[0].done[i].launch;
            solo_lat /= (uint64_t)sh[0].ndone;
            teardown(sh, 1);
        }
        share sh[2] = {{.name = "hi", .kernel_ns = 500 * US, .period_ns = 100 * MS, .active = 1, .priority = EGPU_CARD_PRIO_HIGH, .start_at = 2 * SEC, .stop_at = 8 * SEC},
                       {.name = "lo", .kernel_ns = 2 * MS, .active = 1, .depth = 16, .priority = EGPU_CARD_PRIO_LOW}};
        int cores[] = {capped ? 50 : 0, capped ? 50 : 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
        setup(sh, 2, cores, pols, 0);
        run(sh, 2, 10 * SEC);
        /* latency of the high-priority kernels: p99 */
        int n = sh[0].ndone;
        uint64_t *lat = calloc((size_t)n, sizeof *lat);
        for (int i = 0; i < n; i++) lat[i] = sh[0].done[i].fin - sh[0].done[i].launch;
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (lat[j] < lat[i]) { uint64_t t = lat[i]; lat[i] = lat[j]; lat[j] = t; }
        uint64_t p99 = lat[(n * 99) / 100 >= n ? n - 1 : (n * 99) / 100];
        free(lat);
        char what[96];
        snprintf(what, sizeof what, "%s hi_p99_ms (solo %.2f ms)", capped ? "capped-50" : "uncapped",
                 (double)solo_lat / MS);
        /* preemption is at kernel boundaries: at most two low kernels (2 ms each) ahead of it */
        check("FC-14-priority", what, (double)p99 / MS, 0, (double)solo_lat / MS + 4.6);
        /* low resumes after each high kernel: gap from the high kernel's end to the next low launch */
        uint64_t worst = 0;
        for (int i = 0; i < sh[0].ndone; i++) {
            uint64_t end = sh[0].done[i].fin, nxt = 0;
            for (int j = 0; j < sh[1].ndone; j++)
                if (sh[1].done[j].launch >= end) { nxt = sh[1].done[j].launch; break; }
            if (nxt && nxt - end > worst) worst = nxt - end;
        }
        snprintf(what, sizeof what, "%s lo_resume_ms", capped ? "capped-50" : "uncapped");
        check("FC-14-priority", what, (double)worst / MS, 0, 20);
        /* the low share still runs between the high kernels (about 90% idle time is left) */
        snprintf(what, sizeof what, "%s lo_use_beside_hi", capped ? "capped-50" : "uncapped");
        check("FC-14-priority", what, use_in(&sh[1], 3 * SEC, 8 * SEC), capped ? 40 : 80, capped ? 53 : 100);
        teardown(sh, 2);
    }
}

/* FC-14: the starvation floor (off by default). */
static void case_floor(void)
{
    for (int floor_pct = 0; floor_pct <= 10; floor_pct += 10) {
        share sh[2] = {{.name = "hi", .kernel_ns = 1 * MS, .active = 1, .depth = 1, .priority = EGPU_CARD_PRIO_HIGH},
                       {.name = "lo", .kernel_ns = 1 * MS, .active = 1, .depth = 4, .priority = EGPU_CARD_PRIO_LOW}};
        int cores[] = {0, 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
        setup(sh, 2, cores, pols, floor_pct);
        run(sh, 2, 11 * SEC);
        char what[64];
        snprintf(what, sizeof what, "floor=%d lo_use", floor_pct);
        check("FC-14-floor", what, use_in(&sh[1], SEC, 11 * SEC), floor_pct ? floor_pct - 3 : 0, floor_pct ? floor_pct + 3 : 1);
        teardown(sh, 2);
    }
}

int main(int argc, char **argv)
{
    struct { const char *name; void (*fn)(void); } cases[] = {
        {"caps", case_caps}, {"split", case_split}, {"elastic", case_elastic},
        {"priority", case_priority}, {"floor", case_floor},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int want = argc < 2;
        for (int a = 1; a < argc; a++)
            if (!strcmp(argv[a], cases[i].name)) want = 1;
        if (want) cases[i].fn();
    }
    return g_fail;
}
