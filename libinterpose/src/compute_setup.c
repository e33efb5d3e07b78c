/* compute_setup.c: setting the launch gate up (compute_gate.h): the tunables from the
 * environment, each card's mode (gated, watched or not at all), its region slot, and the
 * poller thread. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "compute_gate.h"
#include "fastclock.h"

#define ENV_MAX_US (1ull << 40) /* ~12 days: a tunable in us, times 1000, stays far from overflow */
#define POLL_DEFAULT_US 500     /* 0.5 ms: a group settles within half a millisecond of its event */
#define POLL_MIN_NS 50000ULL    /* 50 us: polling more often would take a core */
#define HI_MARK_DIV 4           /* a launch marks high priority every quarter hold (0.5 ms) */

static uint64_t env_u64(const char *name, uint64_t def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    /* 0 or garbage keeps the default: a zero tick or burst would divide by zero or spin. */
    return end != v && !*end && x > 0 && x < ENV_MAX_US ? (uint64_t)x : def;
}

void egpu_compute_env(egpu_ctl_params *p, egpu_compute_cfg *cfg)
{
    /* Tunables, microseconds (tests scale time with them); docs/compute.md lists them. */
    p->tick_ns = env_u64("EGPU_COMPUTE_TICK_US", p->tick_ns / 1000) * 1000;
    p->window_ns = env_u64("EGPU_COMPUTE_WINDOW_US", p->window_ns / 1000) * 1000;
    uint64_t burst = env_u64("EGPU_COMPUTE_BURST_US", p->burst_ns / 1000) * 1000;
    if (burst != p->burst_ns) p->lease_ns = burst / EGPU_LEASE_BURST_DIV; /* the lease stays an eighth of the burst */
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

void update_modes(void)
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
void refresh_estimates(card_ent *c)
{
    if (!c->r || c->slot < 0) return;
    for (int k = 0; k < 2; k++) {
        uint64_t e, u;
        egpu_ctl_estimates(c->r, c->slot, k, &e, &u);
        __atomic_store_n(&c->est[k], e, __ATOMIC_RELAXED);
        __atomic_store_n(&c->unit[k], u, __ATOMIC_RELAXED);
    }
}

/* ---- set-up ---------------------------------------------------------------------------- */

/* The share's folder name (the roster's name for it): the folder of its container region. */
static void share_name(const char *key, char *out, size_t n)
{
    const char *end = strrchr(key, '/'), *start = end;
    while (start && start > key && start[-1] != '/') start--;
    size_t len = end && start ? (size_t)(end - start) : 0;
    if (len >= n) len = n - 1;
    memcpy(out, start ? start : "", len);
    out[len] = 0;
}

static int open_card(int d, uint64_t owner)
{
    const egpu_compute_cfg *cfg = &g_c.cfg;
    card_ent *c = &g_c.card[d];
    c->slot = -1;
    c->cores = cfg->dev[d].cores;
    c->bucket = c->cores < 100;
    if (!cfg->dev[d].ours || !cfg->dev[d].region_path[0]) return 0;
    char name[32];
    share_name(cfg->share_key, name, sizeof name);
    egpu_share_terms t = {.owner = owner, .priority = (uint32_t)cfg->priority, .policy = (uint32_t)cfg->policy,
                          .cores = (uint32_t)cfg->dev[d].cores, .floor_pct = (uint32_t)cfg->floor_pct,
                          .name = name};
    c->r = egpu_card_attach(cfg->dev[d].region_path, cfg->dev[d].uuid, &t, (int32_t)getpid(), &c->slot);
    if (!c->r) {
        fprintf(stderr, "egpu: cannot join card %s (%s): compute on that card is not shared\n",
                cfg->dev[d].region_path, strerror(errno));
        c->slot = -1;
        return -1;
    }
    refresh_estimates(c);
    return 1;
}

int egpu_compute_init(const egpu_compute_cfg *cfg, const egpu_ctl_params *p, const egpu_compute_drv *drv)
{
    pthread_mutex_lock(&g_c.mu);
    if (g_c.inited) {
        pthread_mutex_unlock(&g_c.mu);
        return 0;
    }
    g_c.cfg = *cfg;
    if (g_c.cfg.floor_pct < 0) g_c.cfg.floor_pct = 0;
    g_c.p = *p;
    g_c.d = *drv;
    g_c.poll_ns = env_u64("EGPU_COMPUTE_POLL_US", POLL_DEFAULT_US) * 1000;
    if (g_c.poll_ns < POLL_MIN_NS) g_c.poll_ns = POLL_MIN_NS;
    g_c.hi_mark_ns = g_c.p.hi_hold_ns / HI_MARK_DIV; /* the hold stays between 3/4 of its length and all of it */
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
