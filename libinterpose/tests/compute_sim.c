/* compute_sim.c: the compute controller core (compute.c) against a simulated card, with a
 * simulated clock: no CUDA, no sleeping; 20 simulated seconds run in milliseconds.
 *
 * The card model is the fake GPU's: kernels from every share run one after another in launch
 * order (start = max(launch, the stream's previous end, the card's clock)). Each share is an
 * application loop on one stream that launches through a model of the launch gate
 * (compute_gate.c): the estimate drawn from the process's lease, the slow path
 * (egpu_ctl_admit) when the lease runs out or a low-priority share must wait, sleeping for
 * the hint; the stream's meter (egpu_meter_add) decides when an event follows a launch. The
 * application keeps at most `depth` launches outstanding (as a launch queue or a periodic
 * synchronize does) and spends `cpu_ns` per launch. A poller every 500 us settles the groups
 * whose events fired (the event's time: the end of the stream's work when it was recorded),
 * hands the slot its batch and marks high-priority activity, as the gate's poller does.
 *
 * A driver's CPU per call (issue 17), where a case gives one (driver_costs): the launching
 * thread spends launch_ns in cuLaunchKernel, its kernel queued when the call returns, and
 * record_ns in each cuEventRecord of the gate, the event queued when that call returns (as the
 * fake GPU's realistic call costs do, fakegpu/src/fake_cuda.c). The gate reads its clock
 * before the launch (t0), when the call returned (a group's first launch) and after the record
 * (a one-launch sample), as compute_gate.c does. The poller's cuEventQuery calls run on their
 * own thread and take nothing from the launching one.
 *
 * Usage: compute_sim [case ...]   (no argument: all). Prints one line per check:
 *   ok|FAIL <case> <what> value=<v> want=<range>    and exits 1 on any FAIL;
 * and one line per figure that is reported, not checked:   info <case> <what> value=<v> */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "card_region.h"
#include "compute.h"

#define US 1000ULL
#define MS 1000000ULL
#define SEC 1000000000ULL
#define MAXQ 4096
#define MAXK 2500000
#define MAXP 4096
#define POLL_NS (500 * US)
#define NBINS 32000 /* per-ms busy time of a share, the first 32 s */

typedef struct { uint64_t launch, start, fin; } kern;
typedef struct { egpu_group g; uint64_t seq, fires; int counted; } sim_rec;
/* a driver's CPU per call (0: the call takes no time) */
typedef struct { uint64_t launch_ns, record_ns; } driver_costs;
static const driver_costs NO_COSTS = {0, 0};
/* fakegpu/src/fake_cuda.c's realistic figures and their sources */
static const driver_costs REAL_DRIVER = {2500, 2500};

typedef struct {
    const char *name;
    int slot;
    uint64_t kernel_ns;
    uint64_t period_ns;   /* 0: launch back to back; else one launch every period */
    int depth;            /* most launches outstanding before the app waits for the GPU */
    uint64_t cpu_ns;      /* host time per launch (default 5 us) */
    int burst;            /* >0: after `burst` launches the app waits for its stream, then */
    uint64_t idle_ns;     /* ... spends idle_ns on the CPU (a decode step's sampling) */
    int active;           /* 0: not launching (yet) */
    uint64_t start_at, stop_at;
    int priority;
    driver_costs dc;
    /* state */
    uint64_t next_period, stream_end, wait_from, sync_until;
    int phase;            /* with a driver's costs: 1 in the launch call, 2 in the record call */
    uint64_t t0, est;     /* ... the launch's clock read before the call, its estimate */
    int gated;
    uint64_t q[MAXQ];     /* fin times of launches the app still counts as outstanding */
    int qn, in_burst;
    kern *done;           /* every launch (the first MAXK), for the measurements */
    int ndone;
    uint64_t *busy_ms;    /* GPU time in each ms of the run (NBINS) */
    uint64_t last_launch, max_gap;
    /* the gate's model */
    int64_t lease;
    egpu_stream_meter m;
    sim_rec pend[MAXP];
    int npend;
    uint64_t launches, launches_batched, events, events_batched, launched_at, hi_marked;
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

static int watched(const share *s)
{
    /* the gate's watch mode: an uncapped high-priority share is never held, only seen */
    return s->priority == EGPU_CARD_PRIO_HIGH && g_region.slot[s->slot].cores % 100 == 0;
}

/* The gate's poll of its own events: settle the groups whose events fired, in order. */
static void settle_fired(share *s, uint64_t now)
{
    int k = 0;
    for (int i = 0; i < s->npend; i++) {
        sim_rec *pr = &s->pend[i];
        if (pr->fires <= now && k == 0) {
            egpu_ctl_settle(&g_region, s->slot, &g_p, &pr->g, pr->counted, pr->fires, now);
            egpu_meter_settled(&s->m, pr->seq, pr->fires);
        } else {
            s->pend[k++] = *pr;
        }
    }
    s->npend = k;
}

/* The poller's batch: launches, newly recorded groups in flight, events, an idle lease. */
static void batch(share *s, uint64_t now)
{
    egpu_ctl_batch b = {0};
    b.launches = s->launches - s->launches_batched;
    s->launches_batched = s->launches;
    if (b.launches) s->launched_at = now;
    for (int i = 0; i < s->npend; i++) {
        sim_rec *pr = &s->pend[i];
        if (pr->counted || !pr->g.gated) continue;
        pr->counted = 1;
        if (!b.rec_n || pr->g.t_first < b.rec_since_ns) b.rec_since_ns = pr->g.t_first;
        b.rec_n += pr->g.n[0] + pr->g.n[1];
        b.rec_est_ns += pr->g.est_ns[0] + pr->g.est_ns[1];
    }
    b.queued_until_ns = s->m.pred_end_ns;
    b.events = s->events - s->events_batched;
    s->events_batched = s->events;
    if (now - s->launched_at >= g_p.tick_ns) {
        b.lease_back = s->lease;
        s->lease = 0;
    }
    egpu_ctl_batch_apply(&g_region, s->slot, &g_p, &b, now);
}

static void launch(share *s, uint64_t now)
{
    kern x = {now, 0, 0};
    x.start = now;
    if (s->stream_end > x.start) x.start = s->stream_end;
    if (g_card_clock > x.start) x.start = g_card_clock;
    x.fin = x.start + s->kernel_ns;
    g_card_clock = s->stream_end = x.fin;
    s->q[s->qn++] = x.fin;
    if (s->ndone < MAXK) s->done[s->ndone++] = x;
    for (uint64_t t = x.start; t < x.fin && t / MS < NBINS;) {
        uint64_t end = (t / MS + 1) * MS < x.fin ? (t / MS + 1) * MS : x.fin;
        s->busy_ms[t / MS] += end - t;
        t = end;
    }
    if (s->last_launch && now - s->last_launch > s->max_gap) s->max_gap = now - s->last_launch;
    s->last_launch = now;
}

static void hi_mark(share *s, uint64_t now)
{
    if (s->hi_marked + g_p.hi_hold_ns / 4 > now) return;
    s->hi_marked = now;
    egpu_ctl_hi_touch(&g_region, now);
}

/* The gate before a launch: 1 go (*est drawn, *gated), else 0 and *next when to try again. */
static int gate_before(share *s, uint64_t now, uint64_t e, uint64_t *est, int *gated, uint64_t *next)
{
    *gated = 0;
    *est = e;
    if (watched(s)) return 1;
    *gated = 1;
    uint64_t queued = egpu_meter_queued(&s->m, now);
    int low_ok = s->priority != EGPU_CARD_PRIO_LOW || egpu_ctl_low_may_go(&g_region, &g_p, e, queued, now);
    int bucket = g_region.slot[s->slot].cores < 100;
    if (low_ok && (!bucket || s->lease >= (int64_t)e)) {
        if (bucket) s->lease -= (int64_t)e;
        return 1;
    }
    int64_t held = s->lease;
    uint64_t wait;
    s->lease = 0;
    int why = egpu_ctl_admit(&g_region, s->slot, &g_p, EGPU_LAUNCH_KERNEL, now, queued, &held, est, &wait);
    s->lease += held;
    if (why != EGPU_ADMIT_GO) {
        if (!s->wait_from) s->wait_from = now;
        settle_fired(s, now); /* the gate polls its own events while waiting */
        *next = now + (wait < g_p.wait_step_ns ? wait : g_p.wait_step_ns);
        return 0;
    }
    if (s->wait_from) {
        egpu_ctl_waited(&g_region, s->slot, &g_p, why, now - s->wait_from, now);
        s->wait_from = 0;
    }
    return 1;
}

/* An event after the stream's last launch: it fires when the stream's work is done. */
static void record(share *s, uint64_t now)
{
    if (s->npend >= MAXP) return;
    sim_rec *pr = &s->pend[s->npend++];
    pr->g = egpu_meter_take(&s->m, &pr->seq);
    pr->fires = s->stream_end > now ? s->stream_end : now;
    if (pr->g.n[0] + pr->g.n[1] == 1) pr->g.rec_ns = now; /* a one-launch sample */
    pr->counted = 0;
    s->events++;
}

/* The gate after a launch (t0: its clock before the call; now: the call returned): the
 * stream's meter. Returns 1 when an event is due after it. */
static int gate_after(share *s, uint64_t t0, uint64_t now, uint64_t est, int gated)
{
    uint64_t e, unit;
    egpu_ctl_estimates(&g_region, s->slot, EGPU_LAUNCH_KERNEL, &e, &unit);
    egpu_group closed;
    int a = egpu_meter_add(&s->m, &g_p, EGPU_LAUNCH_KERNEL, gated, est, unit, t0, now, &closed);
    s->launches++;
    if (a & EGPU_METER_CLOSED) egpu_ctl_settle(&g_region, s->slot, &g_p, &closed, 0, 0, now);
    return !!(a & EGPU_METER_RECORD);
}

/* The application's CPU after a launch (and its event, if any). */
static uint64_t launched(share *s, uint64_t now)
{
    s->in_burst++;
    if (s->period_ns) s->next_period = (s->next_period ? s->next_period : now) + s->period_ns;
    return now + (s->cpu_ns ? s->cpu_ns : 5 * US);
}

/* One application step at time now. Returns the next time it wants to act. */
static uint64_t app_step(share *s, uint64_t now)
{
    if (s->phase == 1) {
        /* the launch call returns: its kernel is queued */
        launch(s, now);
        if (!gate_after(s, s->t0, now, s->est, s->gated)) {
            s->phase = 0;
            return launched(s, now);
        }
        s->phase = 2;
        return now + s->dc.record_ns;
    }
    if (s->phase == 2) {
        /* the record call returns: its event is queued */
        record(s, now);
        s->phase = 0;
        return launched(s, now);
    }
    if (!s->active || now < s->start_at || (s->stop_at && now >= s->stop_at)) return now + 100 * US;
    if (s->period_ns && now < s->next_period) return s->next_period;
    if (now < s->sync_until) return s->sync_until;
    int k = 0;
    for (int i = 0; i < s->qn; i++)
        if (s->q[i] > now) s->q[k++] = s->q[i];
    s->qn = k;
    if (s->burst && s->in_burst >= s->burst) {
        /* a decode step's end: wait for the stream, then the CPU's share of the step */
        s->in_burst = 0;
        s->sync_until = (s->stream_end > now ? s->stream_end : now) + s->idle_ns;
        return s->sync_until;
    }
    if (s->qn >= s->depth) {
        /* app synchronizes: wait for the oldest of its launches */
        uint64_t t = s->q[0];
        for (int i = 1; i < s->qn; i++)
            if (s->q[i] < t) t = s->q[i];
        return t > now ? t : now + US;
    }
    uint64_t e, unit, est, next = 0;
    int gated;
    egpu_ctl_estimates(&g_region, s->slot, EGPU_LAUNCH_KERNEL, &e, &unit);
    if (!gate_before(s, now, e, &est, &gated, &next)) return next;
    if (s->priority == EGPU_CARD_PRIO_HIGH) hi_mark(s, now);
    if (s->dc.launch_ns || s->dc.record_ns) {
        s->t0 = now;
        s->est = est;
        s->gated = gated;
        s->phase = 1;
        return now + s->dc.launch_ns;
    }
    launch(s, now);
    if (gate_after(s, now, now, est, gated)) record(s, now);
    return launched(s, now);
}

/* GPU time of share s inside [a, b) (whole ms, in the first NBINS), in % of it. */
static double use_in(const share *s, uint64_t a, uint64_t b)
{
    uint64_t busy = 0;
    for (uint64_t i = a / MS; i < b / MS && i < NBINS; i++) busy += s->busy_ms[i];
    return 100.0 * (double)busy / (double)(b - a);
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
        sh[i].busy_ms = calloc(NBINS, sizeof(uint64_t));
        if (!sh[i].depth) sh[i].depth = 64;
    }
}

/* The gate's poller: settlements, the batch, the high-priority mark while outstanding. */
static void poll_all(share *sh, int n, uint64_t now)
{
    for (int i = 0; i < n; i++) {
        share *s = &sh[i];
        uint64_t seen = s->launches - s->launches_batched;
        batch(s, now);
        settle_fired(s, now);
        if (s->priority == EGPU_CARD_PRIO_HIGH && (s->npend || seen || s->m.pred_end_ns > now)) {
            egpu_ctl_hi_touch(&g_region, now);
            s->hi_marked = now;
        }
    }
    for (int i = 0; i < n; i++) egpu_ctl_tick(&g_region, sh[i].slot, &g_p, now);
}

static void run(share *sh, int n, uint64_t until)
{
    uint64_t now = 1, next_poll = 0;
    uint64_t next[8] = {0};
    while (now < until) {
        if (now >= next_poll) {
            poll_all(sh, n, now);
            next_poll = now + POLL_NS;
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
    for (int i = 0; i < n; i++) {
        free(sh[i].done);
        free(sh[i].busy_ms);
    }
    memset(sh, 0, sizeof(share) * (size_t)n);
}

/* The share's measured GPU time (the slot's counter) against the truth, both in % of the card
 * over the whole run. */
static double measured_pct(const share *s, uint64_t len) { return 100.0 * (double)g_region.slot[s->slot].busy_total_ns / (double)len; }

static double events_per_1000(const share *s) { return s->launches ? 1000.0 * (double)s->events / (double)s->launches : 0; }

/* A case line's tag: the kernel, the application's CPU per launch, the driver's costs. */
static void tag_run(char *tag, size_t n, uint64_t kernel_ns, uint64_t cpu_ns, const driver_costs *dc)
{
    snprintf(tag + strlen(tag), n - strlen(tag), "kernel=%lluus", (unsigned long long)(kernel_ns / US));
    if (cpu_ns) snprintf(tag + strlen(tag), n - strlen(tag), " cpu=%lluns", (unsigned long long)cpu_ns);
    if (dc->launch_ns || dc->record_ns)
        snprintf(tag + strlen(tag), n - strlen(tag), " launch=%lluns record=%lluns", (unsigned long long)dc->launch_ns,
                 (unsigned long long)dc->record_ns);
}

/* A strict cap alone on the card: each of two 10 s windows within cap +- 3, no multi-second
 * stalls, no 1 s above cap + 5. */
static void cap_run(const char *cs, uint64_t kernel_ns, int depth, uint64_t cpu_ns, const driver_costs *dc, int cap,
                    int print_windows)
{
    share sh[1] = {{.name = "a", .kernel_ns = kernel_ns, .active = 1, .depth = depth, .cpu_ns = cpu_ns, .dc = *dc}};
    int cores[] = {cap}, pol[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pol, 0);
    run(sh, 1, 21 * SEC);
    char what[192], tag[128];
    snprintf(tag, sizeof tag, "cap=%d ", cap);
    tag_run(tag, sizeof tag, kernel_ns, cpu_ns, dc);
    for (int w = 0; w < 2; w++) {
        double u = use_in(&sh[0], (1 + 10 * (uint64_t)w) * SEC, (11 + 10 * (uint64_t)w) * SEC);
        snprintf(what, sizeof what, "%s %s=%d use", tag, print_windows ? "window" : "w", w);
        check(cs, what, u, cap - 3, cap + 3);
    }
    snprintf(what, sizeof what, "%s max_gap_ms", tag);
    check(cs, what, (double)sh[0].max_gap / MS, 0, 1000);
    double worst = 0;
    for (uint64_t a = 1 * SEC; a + SEC <= 21 * SEC; a += SEC / 2) {
        double u = use_in(&sh[0], a, a + SEC);
        if (u > worst) worst = u;
    }
    snprintf(what, sizeof what, "%s worst_1s_use", tag);
    check(cs, what, worst, 0, cap + 5);
    /* what the events cost: at most 50 per 1000 launches of 10 us kernels (issue 17), and
     * never more than two per ms of the share's GPU time (at a real driver's ~2.5 us each,
     * 0.5% of it) */
    snprintf(what, sizeof what, "%s events_per_gpu_ms", tag);
    check(cs, what, (double)sh[0].events / (use_in(&sh[0], 0, 21 * SEC) * 210.0), 0, 2);
    if (kernel_ns <= 10 * US) {
        snprintf(what, sizeof what, "%s events_per_1000_launches", tag);
        check(cs, what, events_per_1000(&sh[0]), 0, 50);
    }
    teardown(sh, 1);
}

/* FC-13: a strict cap alone on the card, for long and short kernels. */
static void case_caps(void)
{
    uint64_t ks[] = {50 * US, 20 * MS};
    for (int k = 0; k < 2; k++)
        for (int cap = 10; cap <= 90; cap += 10) cap_run("FC-13-cap", ks[k], ks[k] > MS ? 4 : 64, 0, &NO_COSTS, cap, 1);
}

/* Issue 17: 10 us kernels launched back to back from one thread (the launch queue is the only
 * bound), with the fake's CPU cost per launch and with a real driver's. */
static void case_caps10us(void)
{
    uint64_t cpus[] = {300, 2600};
    for (int c = 0; c < 2; c++)
        for (int cap = 10; cap <= 90; cap += 10) cap_run("cap-10us", 10 * US, 1024, cpus[c], &NO_COSTS, cap, 0);
}

/* FC-13: shares of 30 and 70 split 30:70 (strict and elastic). */
static void split_run(const char *cs, uint64_t kernel_ns, int depth, uint64_t cpu_ns, const driver_costs *dc, int pol)
{
    share sh[2] = {{.name = "a", .kernel_ns = kernel_ns, .active = 1, .depth = depth, .cpu_ns = cpu_ns, .dc = *dc},
                   {.name = "b", .kernel_ns = kernel_ns, .active = 1, .depth = depth, .cpu_ns = cpu_ns, .dc = *dc}};
    int cores[] = {30, 70}, pols[] = {pol, pol};
    setup(sh, 2, cores, pols, 0);
    run(sh, 2, 21 * SEC);
    double a = use_in(&sh[0], SEC, 21 * SEC), b = use_in(&sh[1], SEC, 21 * SEC);
    char what[192], tag[128];
    snprintf(tag, sizeof tag, "%s ", pol ? "elastic" : "strict");
    tag_run(tag, sizeof tag, kernel_ns, cpu_ns, dc);
    snprintf(what, sizeof what, "%s share_of_30", tag);
    check(cs, what, 100.0 * a / (a + b), 27, 33);
    snprintf(what, sizeof what, "%s total_use", tag);
    check(cs, what, a + b, 90, 101);
    if (!pol) {
        snprintf(what, sizeof what, "%s use_a_le_cap", tag);
        check(cs, what, a, 0, 33);
        snprintf(what, sizeof what, "%s use_b_le_cap", tag);
        check(cs, what, b, 0, 73);
    }
    teardown(sh, 2);
}

static void case_split(void)
{
    uint64_t ks[] = {50 * US, 20 * MS};
    for (int pol = 0; pol < 2; pol++)
        for (int k = 0; k < 2; k++) split_run("FC-13-split", ks[k], ks[k] > MS ? 4 : 64, 0, &NO_COSTS, pol);
}

/* Issue 17: the 30:70 split with 10 us kernels back to back. */
static void case_split10us(void)
{
    for (int pol = 0; pol < 2; pol++) split_run("FC-13-split", 10 * US, 1024, 300, &NO_COSTS, pol);
}

/* Issue 17: 5 and 8 us kernels launched back to back from one thread, never synchronised (the
 * launch queue is the only bound), at a real driver's CPU cost per call: 2.5 us a launch,
 * 2.5 us an event record (REAL_DRIVER), and 0.1 us of the application's own a launch. Caps
 * 10..90 alone on the card, each 10 s window within 3 points, and the 30:70 split, strict and
 * elastic. Then 2 us kernels, shorter than a launch's CPU: the event of a launch on the idle
 * stream fires before its record call returns, and such a launch is charged at most 1 us
 * (docs/compute.md, Known limits): their use is reported (`info` lines), not checked. */
static void case_realistic(void)
{
    uint64_t ks[] = {5 * US, 8 * US};
    for (int k = 0; k < 2; k++)
        for (int cap = 10; cap <= 90; cap += 10) cap_run("realistic-cap", ks[k], 1024, 100, &REAL_DRIVER, cap, 1);
    for (int pol = 0; pol < 2; pol++)
        for (int k = 0; k < 2; k++) split_run("realistic-split", ks[k], 1024, 100, &REAL_DRIVER, pol);
    for (int cap = 30; cap <= 60; cap += 30) {
        share sh[1] = {
            {.name = "a", .kernel_ns = 2 * US, .active = 1, .depth = 1024, .cpu_ns = 100, .dc = REAL_DRIVER}};
        int cores[] = {cap}, pol[] = {EGPU_CARD_STRICT};
        setup(sh, 1, cores, pol, 0);
        run(sh, 1, 21 * SEC);
        char tag[128];
        snprintf(tag, sizeof tag, "cap=%d ", cap);
        tag_run(tag, sizeof tag, 2 * US, 100, &REAL_DRIVER);
        /* the truth over the steady 20 s; what the share was charged over the whole run, of it */
        printf("info realistic-2us %s use value=%.2f\n", tag, use_in(&sh[0], SEC, 21 * SEC));
        printf("info realistic-2us %s charged_over_true value=%.2f\n", tag,
               measured_pct(&sh[0], 21 * SEC) / use_in(&sh[0], 0, 21 * SEC));
        printf("info realistic-2us %s events_per_1000_launches value=%.2f\n", tag, events_per_1000(&sh[0]));
        teardown(sh, 1);
    }
}

/* Issue 17: what the meters measure where the stream idles between launches: decode steps
 * (200 kernels of 10 us back to back, then the stream drained and 2 ms on the CPU), and a
 * launch-bound loop (3 us kernels every 6 us). Uncapped beside a sleeping low-priority share
 * (watched: measured, not held) and capped at 30%: the measured use within 5% of the truth,
 * the cap within 3 points. */
static void case_gaps(void)
{
    struct { const char *name; uint64_t kernel_ns, cpu_ns; int burst; uint64_t idle_ns; } w[] = {
        {"decode", 10 * US, 2600, 200, 2 * MS},
        {"launch-bound", 3 * US, 6 * US, 0, 0},
    };
    for (int i = 0; i < 2; i++)
        for (int capped = 0; capped < 2; capped++) {
            share sh[2] = {{.name = "a", .kernel_ns = w[i].kernel_ns, .active = 1, .depth = 1024, .cpu_ns = w[i].cpu_ns,
                            .burst = w[i].burst, .idle_ns = w[i].idle_ns},
                           {.name = "idle-low", .priority = EGPU_CARD_PRIO_LOW}};
            int cores[] = {capped ? 30 : 0, 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
            setup(sh, 2, cores, pols, 0);
            run(sh, 2, 11 * SEC);
            double truth = use_in(&sh[0], 0, 11 * SEC);
            char what[128];
            snprintf(what, sizeof what, "%s %s measured_over_true", w[i].name, capped ? "cap=30" : "watched");
            check("gaps", what, measured_pct(&sh[0], 11 * SEC) / truth, 0.95, 1.05);
            if (capped) {
                snprintf(what, sizeof what, "%s cap=30 use", w[i].name);
                check("gaps", what, use_in(&sh[0], SEC, 11 * SEC), 27, 33);
            }
            snprintf(what, sizeof what, "%s %s events_per_1000_launches", w[i].name, capped ? "cap=30" : "watched");
            check("gaps", what, events_per_1000(&sh[0]), 0, 50);
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
    /* a low share that booked cores reserves none of them against a high share with nothing
     * booked (an elastic 0% guarantee): low priority yields, whatever it booked */
    for (int floor_pct = 0; floor_pct <= 10; floor_pct += 10) {
        share sh[2] = {{.name = "hi", .kernel_ns = 1 * MS, .active = 1, .depth = 1, .priority = EGPU_CARD_PRIO_HIGH},
                       {.name = "lo50", .kernel_ns = 1 * MS, .active = 1, .depth = 4, .priority = EGPU_CARD_PRIO_LOW}};
        int cores[] = {0, 50}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
        setup(sh, 2, cores, pols, floor_pct);
        run(sh, 2, 11 * SEC);
        char what[64];
        snprintf(what, sizeof what, "low capped 50 floor=%d hi_use", floor_pct);
        check("FC-14-floor", what, use_in(&sh[0], SEC, 11 * SEC), 90 - floor_pct, 100);
        snprintf(what, sizeof what, "low capped 50 floor=%d lo_use", floor_pct);
        check("FC-14-floor", what, use_in(&sh[1], SEC, 11 * SEC), floor_pct ? floor_pct - 3 : 0, floor_pct ? floor_pct + 3 : 1);
        teardown(sh, 2);
    }
}

int main(int argc, char **argv)
{
    struct { const char *name; void (*fn)(void); } cases[] = {
        {"caps", case_caps}, {"split", case_split}, {"elastic", case_elastic},
        {"priority", case_priority}, {"floor", case_floor}, {"caps10us", case_caps10us},
        {"split10us", case_split10us}, {"gaps", case_gaps}, {"realistic", case_realistic},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int want = argc < 2;
        for (int a = 1; a < argc; a++)
            if (!strcmp(argv[a], cases[i].name)) want = 1;
        if (want) cases[i].fn();
    }
    return g_fail;
}
