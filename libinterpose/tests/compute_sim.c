/* compute_sim.c: the shipped launch gate on a simulated card and a simulated clock: no CUDA,
 * no real sleeping; 20 simulated seconds of a share run in well under a second of CPU.
 *
 * What runs is the code that ships: compute_gate.c, compute_poll.c and compute_setup.c (the
 * launch path, the lease, the slow path's waits, the poller thread, the events and anchors),
 * compute.c, compute_meter.c, compute_settle.c (the controller) and card_region.c (the card
 * folder, its roster and share files, the co-tenants read from their files). They are linked
 * into build/gate_sim.so WITHOUT fastclock.c: this program defines the clock functions
 * (fastclock.h: egpu_now_ns, egpu_fastclock_ns, egpu_sleep_ns, ...), a link-time seam, so that
 * every clock read of the gate is the simulated clock and every sleep of it waits for
 * simulated time. Each share is one process of the real world: a copy of gate_sim.so of its
 * own (its own g_c, its own poller thread, its own share file in a real card folder),
 * loaded with dlopen from a file copy (the loader keeps one instance per file).
 *
 * Threads run one at a time (a discrete-event scheduler): a thread runs until it sleeps
 * (egpu_sleep_ns, or the application's own CPU time) or waits for a lock, and the simulated
 * clock then moves to the earliest wake-up. Each thread is a coroutine on the one OS thread:
 * this program defines pthread_create (the gate's poller becomes a scheduled coroutine) and
 * pthread_mutex_lock / _unlock (a contended lock waits for its release in simulated time, so
 * a thread that holds the process lock inside a driver call's CPU time holds up the poller as
 * it would). The gate's thread-local state stays per thread: each share's copy has its own,
 * and one application thread a share launches. Each run is a child process (fresh copies, a
 * fresh card folder) that exits when the run ends.
 *
 * The card model is the fake GPU's: kernels from every share run one after another in launch
 * order (start = max(launch, the stream's previous end, the card's clock)). Each share's
 * application loop launches on one stream through the gate (egpu_compute_before / _after),
 * keeps at most `depth` launches outstanding (as a launch queue or a periodic synchronize
 * does) and spends `cpu_ns` per launch. The driver's functions (egpu_compute_drv) work on that
 * model: an event fires when its stream's work before it is done; cuEventElapsedTime answers
 * in float milliseconds as the driver does. A driver's CPU per call (issue 17), where a case
 * gives one (driver_costs): launch_ns in cuLaunchKernel (the kernel queued when the call
 * returns) and record_ns in each cuEventRecord (the event queued when that call returns), as
 * the fake GPU's realistic call costs do (fakegpu/src/fake_cuda.c).
 *
 * Usage: compute_sim [case ...]   (no argument: all). Prints one line per check:
 *   ok|FAIL <case> <what> value=<v> want=<range>    and exits 1 on any FAIL;
 * and one line per figure that is reported, not checked:   info <case> <what> value=<v> */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include "card_region.h"
#include "compute.h"

#define US 1000ULL
#define MS 1000000ULL
#define SEC 1000000000ULL
#define MAXQ 4096
#define MAXK 2500000
#define NBINS 32000      /* per-ms busy time of a share, the first 32 s */
#define MAX_SHARES 3     /* gate copies one run loads */
#define MAX_ACTORS 16    /* threads of a run: the director, and an application and a poller a share */
#define LOCK_SPIN_NS 100 /* a contended lock is tried again this often (simulated) */
#define RUN_LIMIT_S 120  /* a run that takes longer (real seconds) is stuck: it fails */
#define ACTOR_STACK_BYTES (1 << 20)

/* ---- the scheduler: one thread runs at a time, in simulated time --------------------- */

/* A thread of the run (the director, a share's application, a gate's poller): a coroutine
 * on the one OS thread, with what a thread of its own would keep (its current context). */
typedef struct {
    ucontext_t uc;
    void *stack;
    void *(*fn)(void *);
    void *arg;
    uint64_t wake, seq;
    uint64_t sleeps; /* times it slept or napped (a poller: its passes) */
    int alive;
    pthread_mutex_t *blocked_on; /* waits for this lock's release */
    uint32_t *napping_on;        /* naps on this word (egpu_nap_ns) until woken or its time */
    CUcontext ctx;               /* the driver's current context of this thread */
    CUstreamCaptureMode capture_mode;
} actor;

static actor g_actors[MAX_ACTORS];
static int g_nactors;
static actor *g_cur; /* the running one (NULL: before the run) */
static uint64_t g_now = 1, g_seq;

static actor *actor_new(void)
{
    if (g_nactors >= MAX_ACTORS) {
        fprintf(stderr, "compute_sim: more than %d threads\n", MAX_ACTORS);
        _exit(3);
    }
    actor *a = &g_actors[g_nactors++];
    memset(a, 0, sizeof *a);
    a->wake = g_now;
    a->seq = ++g_seq;
    a->alive = 1;
    return a;
}

/* Hands the run to the thread that wakes first (ties: the one that asked first), moving the
 * clock to its wake-up. */
static void reschedule(actor *self)
{
    actor *next = NULL;
    for (int i = 0; i < g_nactors; i++) {
        actor *a = &g_actors[i];
        if (a->alive && !a->blocked_on &&
            (!next || a->wake < next->wake || (a->wake == next->wake && a->seq < next->seq)))
            next = a;
    }
    if (!next) {
        fprintf(stderr, "compute_sim: every thread waits for a lock\n");
        _exit(3);
    }
    if (next->wake > g_now) g_now = next->wake;
    if (next == self) return;
    g_cur = next;
    swapcontext(&self->uc, &next->uc);
}

static void sim_sleep(uint64_t ns)
{
    actor *a = g_cur;
    if (!a) { /* not in a run */
        g_now += ns;
        return;
    }
    a->wake = g_now + ns;
    a->seq = ++g_seq;
    a->sleeps++;
    reschedule(a);
}

static void actor_main(void)
{
    actor *a = g_cur;
    a->fn(a->arg);
    a->alive = 0;
    reschedule(a); /* never back */
}

/* Every thread made in a run (the gate's pollers included) is a scheduled one: it first
 * runs when the thread that made it sleeps. */
int pthread_create(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    (void)attr;
    actor *a = actor_new();
    a->stack = malloc(ACTOR_STACK_BYTES);
    if (!a->stack || getcontext(&a->uc) != 0) return EAGAIN;
    a->uc.uc_stack.ss_sp = a->stack;
    a->uc.uc_stack.ss_size = ACTOR_STACK_BYTES;
    a->uc.uc_link = NULL;
    a->fn = fn;
    a->arg = arg;
    makecontext(&a->uc, actor_main, 0);
    *th = (pthread_t)(a - g_actors);
    return 0;
}

/* A contended lock waits for its release in simulated time (its holder sleeps inside, e.g.
 * in a driver call's CPU), as a blocked thread would. */
int pthread_mutex_lock(pthread_mutex_t *m)
{
    for (;;) {
        int e = pthread_mutex_trylock(m);
        if (e != EBUSY || !g_cur) return e;
        g_cur->blocked_on = m;
        g_cur->seq = ++g_seq;
        reschedule(g_cur);
    }
}

int pthread_mutex_unlock(pthread_mutex_t *m)
{
    static int (*real_unlock)(pthread_mutex_t *);
    if (!real_unlock) *(void **)&real_unlock = dlsym(RTLD_NEXT, "pthread_mutex_unlock");
    int e = real_unlock(m);
    for (int i = 0; i < g_nactors; i++)
        if (g_actors[i].blocked_on == m) {
            g_actors[i].blocked_on = NULL;
            g_actors[i].wake = g_now;
        }
    return e;
}

/* ---- the clock seam (fastclock.h) ---------------------------------------------------- */

uint64_t egpu_now_ns(void) { return g_now; }
uint64_t egpu_fastclock_ns(void) { return g_now; }
void egpu_fastclock_init(void) {}
void egpu_fastclock_rebase(void) {}
void egpu_sleep_ns(uint64_t ns) { sim_sleep(ns); }

void egpu_nap_ns(uint32_t *word, uint64_t ns)
{
    if (__atomic_load_n(word, __ATOMIC_RELAXED) != 1) return;
    if (g_cur) g_cur->napping_on = word;
    sim_sleep(ns);
    if (g_cur) g_cur->napping_on = NULL;
}

/* The napping thread runs next, at the waker's time, once the waker sleeps. */
void egpu_nap_wake(uint32_t *word)
{
    for (int i = 0; i < g_nactors; i++)
        if (g_actors[i].alive && g_actors[i].napping_on == word) {
            g_actors[i].napping_on = NULL;
            g_actors[i].wake = g_now;
            g_actors[i].seq = ++g_seq;
        }
}

/* ---- the card and the driver --------------------------------------------------------- */

typedef struct { uint64_t launch, start, fin; } kern;
/* a driver's CPU per call (0: the call takes no time) */
typedef struct { uint64_t launch_ns, record_ns; } driver_costs;
static const driver_costs NO_COSTS = {0, 0};
/* fakegpu/src/fake_cuda.c's realistic figures and their sources */
static const driver_costs REAL_DRIVER = {2500, 2500};

typedef struct share share;
struct CUctx_st { share *s; };
struct CUstream_st { share *s; uint64_t end; int app; };
struct CUevent_st { share *s; uint64_t fires; int app; };

/* One copy of the shipped gate: a process's launch gate. */
typedef struct {
    void *h;
    int *on;
    void (*defaults)(egpu_ctl_params *p);
    int (*init)(const egpu_compute_cfg *cfg, const egpu_ctl_params *p, const egpu_compute_drv *drv);
    void (*before)(CUstream s, int kind, egpu_launch_ticket *t);
    void (*after)(CUstream s, egpu_launch_ticket *t, CUresult r);
    uint64_t (*owner_id)(const char *key);
} gate_lib;

struct share {
    const char *name;
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
    int lie;              /* LIE_*: a hostile process of the share writes its file (below) */
    uint64_t kill_at;     /* >0: its process is SIGKILLed after this, with groups in flight */
    /* state */
    gate_lib lib;
    struct CUctx_st ctx;
    struct CUstream_st stream;
    char key[512]; /* the share's key: its folder names it (compute_setup.c) */
    uint64_t next_period, sync_until;
    uint64_t q[MAXQ]; /* fin times of launches the app still counts as outstanding */
    int qn, in_burst;
    kern *done; /* every launch (the first MAXK), for the measurements */
    int ndone;
    uint64_t *busy_ms; /* GPU time in each ms of the run (NBINS) */
    uint64_t last_launch, max_gap, launches, events;
    int actor_first, actor_end, app_actor; /* its process's threads: poller(s), application */
    uint64_t killed_inflight;              /* launches in flight in its file when it was killed */
};

static uint64_t g_card_clock;
static char g_dir[256];       /* the program's temporary folder (the gate copies) */
static char g_card[400];      /* a run's card folder */

static uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }

static CUresult drv_ctx_get_current(CUcontext *c)
{
    *c = g_cur->ctx;
    return CUDA_SUCCESS;
}
static CUresult drv_ctx_set_current(CUcontext c)
{
    g_cur->ctx = c;
    return CUDA_SUCCESS;
}
static CUresult drv_ctx_get_device(CUdevice *d)
{
    *d = 0;
    return g_cur->ctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
static CUresult drv_event_create(CUevent *ev, unsigned flags)
{
    (void)flags;
    *ev = calloc(1, sizeof **ev);
    if (!*ev) return CUDA_ERROR_OUT_OF_MEMORY;
    (*ev)->s = g_cur->ctx ? g_cur->ctx->s : NULL;
    return CUDA_SUCCESS;
}
static CUresult drv_event_destroy(CUevent ev)
{
    free(ev);
    return CUDA_SUCCESS;
}
/* The event fires when the stream's work queued before it is done. */
static CUresult drv_event_record(CUevent ev, CUstream st)
{
    share *s = st->s;
    if (s->dc.record_ns) sim_sleep(s->dc.record_ns); /* queued when the call returns */
    ev->fires = u64max(st->end, g_now);
    ev->app = st->app;
    if (st->app) s->events++;
    return CUDA_SUCCESS;
}
static CUresult drv_event_query(CUevent ev) { return ev->fires <= g_now ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY; }
static CUresult drv_event_synchronize(CUevent ev)
{
    if (ev->fires > g_now) sim_sleep(ev->fires - g_now);
    return CUDA_SUCCESS;
}
/* float milliseconds, as the driver answers (about 0.5 us of resolution near the anchor) */
static CUresult drv_event_elapsed(float *ms, CUevent a, CUevent b)
{
    *ms = (float)((double)((int64_t)b->fires - (int64_t)a->fires) / 1e6);
    return CUDA_SUCCESS;
}
static CUresult drv_stream_create(CUstream *st, unsigned flags)
{
    (void)flags;
    *st = calloc(1, sizeof **st);
    if (!*st) return CUDA_ERROR_OUT_OF_MEMORY;
    (*st)->s = g_cur->ctx ? g_cur->ctx->s : NULL;
    return CUDA_SUCCESS;
}
/* A share whose application stream captures (its launches are recorded into a graph, not
 * run) from g_capture.from to g_capture.to: none but the nap case's. */
static struct { share *s; uint64_t from, to; } g_capture;

static CUresult drv_stream_is_capturing(CUstream st, CUstreamCaptureStatus *status)
{
    int on = g_capture.s && st && st->s == g_capture.s && g_now >= g_capture.from && g_now < g_capture.to;
    *status = on ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}
static CUresult drv_exchange_capture_mode(CUstreamCaptureMode *mode)
{
    CUstreamCaptureMode old = g_cur->capture_mode;
    g_cur->capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static const egpu_compute_drv SIM_DRIVER = {
    drv_ctx_get_current, drv_ctx_set_current, drv_ctx_get_device, drv_event_create, drv_event_destroy,
    drv_event_record, drv_event_query, drv_event_synchronize, drv_event_elapsed, drv_stream_create,
    drv_stream_is_capturing, drv_exchange_capture_mode,
};

/* A kernel queued on share s's stream at now. */
static void launch(share *s, uint64_t now)
{
    kern x = {now, 0, 0};
    x.start = u64max(u64max(now, s->stream.end), g_card_clock);
    x.fin = x.start + s->kernel_ns;
    g_card_clock = s->stream.end = x.fin;
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

/* One launch through the gate, as the interposer's cuLaunchKernel hook makes it. */
static void gated_launch(share *s)
{
    egpu_launch_ticket t;
    t.dev = -1;
    if (__atomic_load_n(s->lib.on, __ATOMIC_RELAXED)) s->lib.before(&s->stream, EGPU_LAUNCH_KERNEL, &t);
    if (s->dc.launch_ns) sim_sleep(s->dc.launch_ns);
    launch(s, g_now); /* queued when the call returns */
    if (t.dev >= 0) s->lib.after(&s->stream, &t, CUDA_SUCCESS);
    s->launches++;
}

/* The application: launches on its stream as the case says, forever (the run ends it). */
static void *app_main(void *arg)
{
    share *s = arg;
    g_cur->ctx = &s->ctx;
    for (;;) {
        uint64_t now = g_now;
        if (!s->active || now < s->start_at || (s->stop_at && now >= s->stop_at)) {
            sim_sleep(100 * US);
            continue;
        }
        if (s->period_ns && now < s->next_period) {
            sim_sleep(s->next_period - now);
            continue;
        }
        if (now < s->sync_until) {
            sim_sleep(s->sync_until - now);
            continue;
        }
        int k = 0;
        for (int i = 0; i < s->qn; i++)
            if (s->q[i] > now) s->q[k++] = s->q[i];
        s->qn = k;
        if (s->burst && s->in_burst >= s->burst) {
            /* a decode step's end: wait for the stream, then the CPU's share of the step */
            s->in_burst = 0;
            s->sync_until = u64max(s->stream.end, now) + s->idle_ns;
            continue;
        }
        if (s->qn >= s->depth) {
            /* the app synchronizes: waits for the oldest of its launches */
            uint64_t t = s->q[0];
            for (int i = 1; i < s->qn; i++)
                if (s->q[i] < t) t = s->q[i];
            sim_sleep(t > now ? t - now : US);
            continue;
        }
        gated_launch(s);
        s->in_burst++;
        if (s->period_ns) s->next_period = (s->next_period ? s->next_period : now) + s->period_ns;
        sim_sleep(s->cpu_ns ? s->cpu_ns : 5 * US);
    }
    return NULL;
}

/* ---- runs: each a child process ------------------------------------------------------ */

static int g_fail;
static void check(const char *cs, const char *what, double v, double lo, double hi)
{
    int ok = v >= lo && v <= hi;
    if (!ok) g_fail = 1;
    printf("%s %s %s value=%.2f want=[%.2f,%.2f]\n", ok ? "ok" : "FAIL", cs, what, v, lo, hi);
}

static int copy_file(const char *from, const char *to)
{
    int in = open(from, O_RDONLY | O_CLOEXEC), out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0700);
    char buf[65536];
    ssize_t n = 0;
    while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n) n = -1;
    int ok = in >= 0 && out >= 0 && n == 0;
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    return ok ? 0 : -1;
}

static void load_gate(gate_lib *g, int i)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/gate-%d.so", g_dir, i);
    g->h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g->h) {
        fprintf(stderr, "compute_sim: %s\n", dlerror());
        _exit(3);
    }
    g->on = dlsym(g->h, "egpu_compute_on");
    *(void **)&g->defaults = dlsym(g->h, "egpu_ctl_defaults");
    *(void **)&g->init = dlsym(g->h, "egpu_compute_init");
    *(void **)&g->before = dlsym(g->h, "egpu_compute_before");
    *(void **)&g->after = dlsym(g->h, "egpu_compute_after");
    *(void **)&g->owner_id = dlsym(g->h, "egpu_owner_id");
    if (!g->on || !g->defaults || !g->init || !g->before || !g->after || !g->owner_id) {
        fprintf(stderr, "compute_sim: gate_sim.so lacks a symbol\n");
        _exit(3);
    }
}

/* Share s's file in the run's card folder. */
static void share_file_path(const share *s, char *path, size_t n)
{
    snprintf(path, n, "%s/%s%016llx", g_card, EGPU_SHARE_FILE_PREFIX, (unsigned long long)s->lib.owner_id(s->key));
}

/* ---- hostile tenants ----------------------------------------------------------------- */

/* What a hostile process of a share writes into its own share file (its container mounts it
 * read-write), every LIE_PERIOD_NS, beside the share's own gate, launching nothing itself. */
enum {
    LIE_NONE,
    LIE_FULL_USE,        /* use and demand 100%, launched just now */
    LIE_WORK_JUST_ENDED, /* its measured work ended LIE_ENDED_AGO_NS ago, launched just now */
    LIE_WORK_COUNTED     /* the same, and its busy_total_ns counts all the time since as its own */
};
#define LIE_PERIOD_NS (100 * US)
#define LIE_ENDED_AGO_NS (1 * MS)

/* A share's hostile process (lie), or its SIGKILL (kill_at): the application and the poller
 * stop where they are, at the first moment after kill_at that its file shows groups in flight. */
static void *hostile_main(void *arg)
{
    share *s = arg;
    char path[PATH_MAX + 64];
    share_file_path(s, path, sizeof path);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    egpu_card_slot *f = fd < 0 ? MAP_FAILED : mmap(NULL, sizeof *f, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED) {
        fprintf(stderr, "compute_sim: cannot map %s\n", path);
        _exit(3);
    }
    for (;;) {
        if (s->lie == LIE_FULL_USE) {
            f->use_ppm = f->demand_ppm = 1000000;
            f->last_active_ns = g_now;
        } else if (s->lie == LIE_WORK_JUST_ENDED || s->lie == LIE_WORK_COUNTED) {
            if (s->lie == LIE_WORK_COUNTED) f->busy_total_ns += LIE_PERIOD_NS;
            f->busy_until_ns = g_now - LIE_ENDED_AGO_NS;
            f->last_active_ns = g_now;
        }
        if (s->kill_at && g_now >= s->kill_at && g_actors[s->app_actor].alive && f->inflight_n) {
            s->killed_inflight = f->inflight_n;
            g_actors[s->app_actor].alive = 0;
            for (int a = s->actor_first; a < s->actor_end; a++) g_actors[a].alive = 0;
        }
        sim_sleep(LIE_PERIOD_NS);
    }
    return NULL;
}

/* In the run's child: each share's gate copy set up on the run's card folder as a process
 * of that share (its share file, its poller), its application thread made. */
static void setup(share *sh, int n, const int *cores, const int *policy, int floor_pct)
{
    snprintf(g_card, sizeof g_card, "%.256s/run-%d", g_dir, (int)getpid());
    mkdir(g_card, 0700);
    strncat(g_card, "/GPU-sim", sizeof g_card - strlen(g_card) - 1);
    mkdir(g_card, 0755);
    g_cur = actor_new(); /* this thread: the run's director */
    for (int i = 0; i < n; i++) {
        share *s = &sh[i];
        load_gate(&s->lib, i);
        s->ctx.s = s;
        s->stream = (struct CUstream_st){.s = s, .app = 1};
        s->done = calloc(MAXK, sizeof(kern));
        s->busy_ms = calloc(NBINS, sizeof(uint64_t));
        if (!s->depth) s->depth = 64;
        snprintf(s->key, sizeof s->key, "%.400s/share-%d/region", g_card, i);
        egpu_compute_cfg cfg = {.ndev = 1, .priority = s->priority, .policy = policy[i], .floor_pct = floor_pct};
        cfg.dev[0].ours = 1;
        cfg.dev[0].cores = cores[i];
        snprintf(cfg.dev[0].uuid, sizeof cfg.dev[0].uuid, "GPU-sim");
        snprintf(cfg.dev[0].region_path, sizeof cfg.dev[0].region_path, "%s", g_card);
        snprintf(cfg.share_key, sizeof cfg.share_key, "%s", s->key);
        egpu_ctl_params p;
        s->lib.defaults(&p);
        g_cur->ctx = &s->ctx; /* the process's context, as after cuInit */
        s->actor_first = g_nactors;
        if (s->lib.init(&cfg, &p, &SIM_DRIVER) != 0) {
            fprintf(stderr, "compute_sim: share %d cannot join the card\n", i);
            _exit(3);
        }
        s->actor_end = g_nactors;
    }
    g_cur->ctx = NULL;
    for (int i = 0; i < n; i++) {
        pthread_t th;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        sh[i].app_actor = g_nactors;
        pthread_create(&th, &a, app_main, &sh[i]);
        if (sh[i].lie || sh[i].kill_at) pthread_create(&th, &a, hostile_main, &sh[i]);
        pthread_attr_destroy(&a);
    }
}

/* The run: simulated time passes until `until`; every other thread then stays where it is. */
static void run(uint64_t until) { sim_sleep(until > g_now ? until - g_now : 0); }

/* A run in a child process: body() sets up, runs, checks and prints; it returns one figure
 * for the caller (or 0). The child's FAILs and its crash are the caller's. */
static double in_child(double (*body)(const void *), const void *arg)
{
    int fd[2];
    if (pipe(fd) != 0) _exit(3);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        alarm(RUN_LIMIT_S);
        double v = body(arg);
        fflush(stdout);
        if (write(fd[1], &v, sizeof v) != sizeof v) _exit(3);
        _exit(g_fail);
    }
    close(fd[1]);
    double v = 0;
    ssize_t got = read(fd[0], &v, sizeof v);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (got != sizeof v || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        g_fail = 1;
        if (!WIFEXITED(st) || WEXITSTATUS(st) > 1)
            printf("FAIL run %s\n", WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "did not finish");
    }
    return v;
}

/* ---- measurements -------------------------------------------------------------------- */

/* GPU time of share s inside [a, b) (whole ms, in the first NBINS), in % of it. */
static double use_in(const share *s, uint64_t a, uint64_t b)
{
    uint64_t busy = 0;
    for (uint64_t i = a / MS; i < b / MS && i < NBINS; i++) busy += s->busy_ms[i];
    return 100.0 * (double)busy / (double)(b - a);
}

/* What the gate charged the share (its share file's busy_total_ns, read as the node agent
 * reads it) against the run's length, in % of the card. */
static double measured_pct(const share *s, uint64_t len)
{
    char path[PATH_MAX + 64];
    share_file_path(s, path, sizeof path);
    uint64_t busy = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pread(fd, &busy, sizeof busy, offsetof(egpu_card_slot, busy_total_ns)) != sizeof busy) busy = 0;
    if (fd >= 0) close(fd);
    return 100.0 * (double)busy / (double)len;
}

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

/* ---- the cases ----------------------------------------------------------------------- */

typedef struct {
    const char *cs;
    uint64_t kernel_ns;
    int depth;
    uint64_t cpu_ns;
    const driver_costs *dc;
    int cap, print_windows, pol;
} load_case;

/* A strict cap alone on the card: each of two 10 s windows within cap +- 3, no multi-second
 * stalls, no 1 s above cap + 5. */
static double cap_body(const void *arg)
{
    const load_case *c = arg;
    share sh[1] = {{.name = "a", .kernel_ns = c->kernel_ns, .active = 1, .depth = c->depth, .cpu_ns = c->cpu_ns,
                    .dc = *c->dc}};
    int cores[] = {c->cap}, pol[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pol, 0);
    run(21 * SEC);
    char what[192], tag[128];
    snprintf(tag, sizeof tag, "cap=%d ", c->cap);
    tag_run(tag, sizeof tag, c->kernel_ns, c->cpu_ns, c->dc);
    for (int w = 0; w < 2; w++) {
        double u = use_in(&sh[0], (1 + 10 * (uint64_t)w) * SEC, (11 + 10 * (uint64_t)w) * SEC);
        snprintf(what, sizeof what, "%s %s=%d use", tag, c->print_windows ? "window" : "w", w);
        check(c->cs, what, u, c->cap - 3, c->cap + 3);
    }
    snprintf(what, sizeof what, "%s max_gap_ms", tag);
    check(c->cs, what, (double)sh[0].max_gap / MS, 0, 1000);
    double worst = 0;
    for (uint64_t a = 1 * SEC; a + SEC <= 21 * SEC; a += SEC / 2) {
        double u = use_in(&sh[0], a, a + SEC);
        if (u > worst) worst = u;
    }
    snprintf(what, sizeof what, "%s worst_1s_use", tag);
    check(c->cs, what, worst, 0, c->cap + 5);
    /* what the events cost: at most 50 per 1000 launches of 10 us kernels (issue 17), and
     * never more than two per ms of the share's GPU time (at a real driver's ~2.5 us each,
     * 0.5% of it) */
    snprintf(what, sizeof what, "%s events_per_gpu_ms", tag);
    check(c->cs, what, (double)sh[0].events / (use_in(&sh[0], 0, 21 * SEC) * 210.0), 0, 2);
    if (c->kernel_ns <= 10 * US) {
        snprintf(what, sizeof what, "%s events_per_1000_launches", tag);
        check(c->cs, what, events_per_1000(&sh[0]), 0, 50);
    }
    return 0;
}

static void cap_run(const char *cs, uint64_t kernel_ns, int depth, uint64_t cpu_ns, const driver_costs *dc, int cap,
                    int print_windows)
{
    load_case c = {cs, kernel_ns, depth, cpu_ns, dc, cap, print_windows, 0};
    in_child(cap_body, &c);
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
static double split_body(const void *arg)
{
    const load_case *c = arg;
    share sh[2] = {
        {.name = "a", .kernel_ns = c->kernel_ns, .active = 1, .depth = c->depth, .cpu_ns = c->cpu_ns, .dc = *c->dc},
        {.name = "b", .kernel_ns = c->kernel_ns, .active = 1, .depth = c->depth, .cpu_ns = c->cpu_ns, .dc = *c->dc}};
    int cores[] = {30, 70}, pols[] = {c->pol, c->pol};
    setup(sh, 2, cores, pols, 0);
    run(21 * SEC);
    double a = use_in(&sh[0], SEC, 21 * SEC), b = use_in(&sh[1], SEC, 21 * SEC);
    char what[192], tag[128];
    snprintf(tag, sizeof tag, "%s ", c->pol ? "elastic" : "strict");
    tag_run(tag, sizeof tag, c->kernel_ns, c->cpu_ns, c->dc);
    snprintf(what, sizeof what, "%s share_of_30", tag);
    check(c->cs, what, 100.0 * a / (a + b), 27, 33);
    snprintf(what, sizeof what, "%s total_use", tag);
    check(c->cs, what, a + b, 90, 101);
    if (!c->pol) {
        snprintf(what, sizeof what, "%s use_a_le_cap", tag);
        check(c->cs, what, a, 0, 33);
        snprintf(what, sizeof what, "%s use_b_le_cap", tag);
        check(c->cs, what, b, 0, 73);
    }
    return 0;
}

static void split_run(const char *cs, uint64_t kernel_ns, int depth, uint64_t cpu_ns, const driver_costs *dc, int pol)
{
    load_case c = {cs, kernel_ns, depth, cpu_ns, dc, 0, 0, pol};
    in_child(split_body, &c);
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

/* 2 us kernels, shorter than a launch's CPU: reported, not checked. */
static double short_body(const void *arg)
{
    const load_case *c = arg;
    share sh[1] = {{.name = "a", .kernel_ns = 2 * US, .active = 1, .depth = 1024, .cpu_ns = 100, .dc = REAL_DRIVER}};
    int cores[] = {c->cap}, pol[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pol, 0);
    run(21 * SEC);
    char tag[128];
    snprintf(tag, sizeof tag, "cap=%d ", c->cap);
    tag_run(tag, sizeof tag, 2 * US, 100, &REAL_DRIVER);
    /* the truth over the steady 20 s; what the share was charged over the whole run, of it */
    printf("info realistic-2us %s use value=%.2f\n", tag, use_in(&sh[0], SEC, 21 * SEC));
    printf("info realistic-2us %s charged_over_true value=%.2f\n", tag,
           measured_pct(&sh[0], 21 * SEC) / use_in(&sh[0], 0, 21 * SEC));
    printf("info realistic-2us %s events_per_1000_launches value=%.2f\n", tag, events_per_1000(&sh[0]));
    return 0;
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
        load_case c = {"realistic-2us", 2 * US, 1024, 100, &REAL_DRIVER, cap, 0, 0};
        in_child(short_body, &c);
    }
}

/* Issue 17: what the meters measure where the stream idles between launches: decode steps
 * (200 kernels of 10 us back to back, then the stream drained and 2 ms on the CPU), and a
 * launch-bound loop (3 us kernels every 6 us). Uncapped beside a sleeping low-priority share
 * (watched: measured, not held) and capped at 30%: the measured use within 5% of the truth,
 * the cap within 3 points. */
typedef struct { const char *name; uint64_t kernel_ns, cpu_ns; int burst; uint64_t idle_ns; int capped; } gap_case;

static double gaps_body(const void *arg)
{
    const gap_case *w = arg;
    share sh[2] = {{.name = "a", .kernel_ns = w->kernel_ns, .active = 1, .depth = 1024, .cpu_ns = w->cpu_ns,
                    .burst = w->burst, .idle_ns = w->idle_ns},
                   {.name = "idle-low", .priority = EGPU_CARD_PRIO_LOW}};
    int cores[] = {w->capped ? 30 : 0, 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(11 * SEC);
    double truth = use_in(&sh[0], 0, 11 * SEC);
    char what[128];
    snprintf(what, sizeof what, "%s %s measured_over_true", w->name, w->capped ? "cap=30" : "watched");
    check("gaps", what, measured_pct(&sh[0], 11 * SEC) / truth, 0.95, 1.05);
    if (w->capped) {
        snprintf(what, sizeof what, "%s cap=30 use", w->name);
        check("gaps", what, use_in(&sh[0], SEC, 11 * SEC), 27, 33);
    }
    snprintf(what, sizeof what, "%s %s events_per_1000_launches", w->name, w->capped ? "cap=30" : "watched");
    check("gaps", what, events_per_1000(&sh[0]), 0, 50);
    return 0;
}

static void case_gaps(void)
{
    gap_case w[] = {
        {"decode", 10 * US, 2600, 200, 2 * MS, 0},
        {"launch-bound", 3 * US, 6 * US, 0, 0, 0},
    };
    for (int i = 0; i < 2; i++)
        for (int capped = 0; capped < 2; capped++) {
            w[i].capped = capped;
            in_child(gaps_body, &w[i]);
        }
}

/* Elastic: alone it takes the idle card; when the owner of the rest arrives it gives it back. */
static double elastic_body(const void *arg)
{
    (void)arg;
    share sh[2] = {{.name = "e30", .kernel_ns = 1 * MS, .active = 1, .depth = 8},
                   {.name = "s70", .kernel_ns = 1 * MS, .active = 1, .depth = 8, .start_at = 6 * SEC}};
    int cores[] = {30, 70}, pols[] = {EGPU_CARD_ELASTIC, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(16 * SEC);
    check("elastic", "alone use", use_in(&sh[0], 1 * SEC, 6 * SEC), 90, 100);
    check("elastic", "beside strict-70 use_e30", use_in(&sh[0], 8 * SEC, 16 * SEC), 27, 33);
    check("elastic", "beside strict-70 use_s70", use_in(&sh[1], 8 * SEC, 16 * SEC), 67, 73);
    return 0;
}

static void case_elastic(void) { in_child(elastic_body, NULL); }

/* FC-14: high priority goes first; low priority resumes within 20 ms once it is idle. */
typedef struct { int capped; double solo_ms; } prio_case;

static double prio_solo_body(const void *arg)
{
    const prio_case *c = arg;
    share sh[1] = {{.name = "hi", .kernel_ns = 500 * US, .period_ns = 100 * MS, .active = 1, .priority = EGPU_CARD_PRIO_HIGH}};
    int cores[] = {c->capped ? 50 : 0}, pols[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pols, 0);
    run(5 * SEC);
    uint64_t lat = 0;
    for (int i = 0; i < sh[0].ndone; i++) lat += sh[0].done[i].fin - sh[0].done[i].launch;
    return (double)(lat / (uint64_t)sh[0].ndone) / MS;
}

static double prio_body(const void *arg)
{
    const prio_case *c = arg;
    share sh[2] = {{.name = "hi", .kernel_ns = 500 * US, .period_ns = 100 * MS, .active = 1, .priority = EGPU_CARD_PRIO_HIGH, .start_at = 2 * SEC, .stop_at = 8 * SEC},
                   {.name = "lo", .kernel_ns = 2 * MS, .active = 1, .depth = 16, .priority = EGPU_CARD_PRIO_LOW}};
    int cores[] = {c->capped ? 50 : 0, c->capped ? 50 : 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(10 * SEC);
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
    const char *tag = c->capped ? "capped-50" : "uncapped";
    snprintf(what, sizeof what, "%s hi_p99_ms (solo %.2f ms)", tag, c->solo_ms);
    /* preemption is at kernel boundaries: at most two low kernels (2 ms each) ahead of it */
    check("FC-14-priority", what, (double)p99 / MS, 0, c->solo_ms + 4.6);
    /* low resumes after each high kernel: gap from the high kernel's end to the next low launch */
    uint64_t worst = 0;
    for (int i = 0; i < sh[0].ndone; i++) {
        uint64_t end = sh[0].done[i].fin, nxt = 0;
        for (int j = 0; j < sh[1].ndone; j++)
            if (sh[1].done[j].launch >= end) { nxt = sh[1].done[j].launch; break; }
        if (nxt && nxt - end > worst) worst = nxt - end;
    }
    snprintf(what, sizeof what, "%s lo_resume_ms", tag);
    check("FC-14-priority", what, (double)worst / MS, 0, 20);
    /* the low share still runs between the high kernels (about 90% idle time is left) */
    snprintf(what, sizeof what, "%s lo_use_beside_hi", tag);
    check("FC-14-priority", what, use_in(&sh[1], 3 * SEC, 8 * SEC), c->capped ? 40 : 80, c->capped ? 53 : 100);
    return 0;
}

static void case_priority(void)
{
    for (int capped = 0; capped < 2; capped++) {
        prio_case c = {capped, 0};
        c.solo_ms = in_child(prio_solo_body, &c);
        in_child(prio_body, &c);
    }
}

/* FC-14: the starvation floor (off by default). */
typedef struct { int floor_pct, lo_cores; } floor_case;

static double floor_body(const void *arg)
{
    const floor_case *c = arg;
    share sh[2] = {{.name = "hi", .kernel_ns = 1 * MS, .active = 1, .depth = 1, .priority = EGPU_CARD_PRIO_HIGH},
                   {.name = "lo", .kernel_ns = 1 * MS, .active = 1, .depth = 4, .priority = EGPU_CARD_PRIO_LOW}};
    int cores[] = {0, c->lo_cores}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, c->floor_pct);
    run(11 * SEC);
    char what[64];
    const char *tag = c->lo_cores ? "low capped 50 " : "";
    if (c->lo_cores) {
        snprintf(what, sizeof what, "%sfloor=%d hi_use", tag, c->floor_pct);
        check("FC-14-floor", what, use_in(&sh[0], SEC, 11 * SEC), 90 - c->floor_pct, 100);
    }
    snprintf(what, sizeof what, "%sfloor=%d lo_use", tag, c->floor_pct);
    check("FC-14-floor", what, use_in(&sh[1], SEC, 11 * SEC), c->floor_pct ? c->floor_pct - 3 : 0,
          c->floor_pct ? c->floor_pct + 3 : 1);
    return 0;
}

/* The floor, and a low share that booked cores: it reserves none of them against a high share
 * with nothing booked (an elastic 0% guarantee): low priority yields, whatever it booked. */
static void case_floor(void)
{
    for (int lo_cores = 0; lo_cores <= 50; lo_cores += 50)
        for (int floor_pct = 0; floor_pct <= 10; floor_pct += 10) {
            floor_case c = {floor_pct, lo_cores};
            in_child(floor_body, &c);
        }
}

/* An idle process's poller naps (compute_poll.c, QUIET_NAP_NS): a share that made its context
 * and launched nothing for 3 s passes at most 5 times in a quiet second (polling at its idle
 * 5 ms it passed 200 times); its first launch wakes it at once (a nap that only times out
 * would leave it asleep until 3.25 s), and the cap holds from the first second. */
static uint64_t poller_passes(const share *s)
{
    uint64_t n = 0;
    for (int a = s->actor_first; a < s->actor_end; a++) n += g_actors[a].sleeps;
    return n;
}

static double nap_body(const void *arg)
{
    (void)arg;
    share sh[1] = {{.name = "a", .kernel_ns = 50 * US, .active = 1, .start_at = 3100 * MS}};
    int cores[] = {30}, pols[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pols, 0);
    run(1500 * MS);
    uint64_t quiet_from = poller_passes(&sh[0]);
    run(2500 * MS);
    check("nap", "quiet_second_passes", (double)(poller_passes(&sh[0]) - quiet_from), 0, 5);
    run(3100 * MS);
    uint64_t woken_from = poller_passes(&sh[0]);
    run(3200 * MS);
    check("nap", "passes_in_first_100ms_of_work", (double)(poller_passes(&sh[0]) - woken_from), 20, 1e9);
    run(4100 * MS);
    check("nap", "use_first_second", use_in(&sh[0], 3100 * MS, 4100 * MS), 27, 33);
    return 0;
}

/* A launch that waits in admission longer than the poller's quiet second (a strict 10% share
 * of 200 ms kernels, one at a time: each waits ~1.9 s) wakes the napping poller after its
 * wait, so that its high-priority mark stays fresh while the kernel runs: a low co-tenant
 * launches nothing inside a high kernel (past its first 3 ms). A gate that wakes the poller
 * only before the wait: 12 of 14 high kernels had low launches inside. */
static double nap_wait_body(const void *arg)
{
    (void)arg;
    share sh[2] = {{.name = "hi", .kernel_ns = 200 * MS, .depth = 1, .active = 1, .priority = EGPU_CARD_PRIO_HIGH},
                   {.name = "lo", .kernel_ns = 2 * MS, .active = 1, .depth = 16, .priority = EGPU_CARD_PRIO_LOW}};
    int cores[] = {10, 0}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(20 * SEC);
    int inside = 0;
    for (int i = 0; i < sh[0].ndone; i++) {
        const kern *h = &sh[0].done[i];
        for (int j = 0; j < sh[1].ndone; j++)
            if (sh[1].done[j].launch > h->start + 3 * MS && sh[1].done[j].launch < h->fin) {
                inside++;
                break;
            }
    }
    check("nap", "hi_kernels_run", sh[0].ndone, 8, 1e9);
    check("nap", "hi_kernels_with_low_launches_inside_after_a_wait", inside, 0, 0);
    return 0;
}

/* Launches the poller never counts (into a capturing stream) do not wake it from its nap: in
 * a second of 100 000 such launches after 2 s idle it naps on (4 passes), where a poller woken
 * by each and napping again at once passed 100 001 times. */
static double nap_capture_body(const void *arg)
{
    (void)arg;
    share sh[1] = {{.name = "a", .kernel_ns = 1 * US, .active = 1, .depth = 100000, .cpu_ns = 10 * US,
                    .start_at = 2000 * MS, .stop_at = 3000 * MS}};
    int cores[] = {30}, pols[] = {EGPU_CARD_STRICT};
    setup(sh, 1, cores, pols, 0);
    g_capture.s = &sh[0];
    g_capture.from = 2000 * MS;
    g_capture.to = 3000 * MS;
    run(2000 * MS);
    uint64_t from = poller_passes(&sh[0]);
    run(3000 * MS);
    check("nap", "passes_in_a_second_of_captured_launches", (double)(poller_passes(&sh[0]) - from), 0, 250);
    return 0;
}

static void case_nap(void)
{
    in_child(nap_body, NULL);
    in_child(nap_wait_body, NULL);
    in_child(nap_capture_body, NULL);
}

/* ---- hostile co-tenants: a lie may cost the liar, never a co-tenant (docs/security.md) -- */

/* A strict 10% share that never launches and writes use = demand = 100% (LIE_FULL_USE) is
 * believed only within its booking (cores + 3 points): an elastic 30% neighbour takes the rest
 * of the card (100 - 13 - 2 headroom = 85%), where it was held at 30% with the card 70% idle. */
static double liar_use_body(const void *arg)
{
    (void)arg;
    share sh[2] = {{.name = "e30", .kernel_ns = 1 * MS, .active = 1, .depth = 8},
                   {.name = "liar", .kernel_ns = 1 * MS, .lie = LIE_FULL_USE}};
    int cores[] = {30, 10}, pols[] = {EGPU_CARD_ELASTIC, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(11 * SEC);
    check("liar-use", "elastic-30 beside a strict-10 claiming 100% use", use_in(&sh[0], SEC, 11 * SEC), 82, 88);
    return 0;
}

static void case_liar_use(void) { in_child(liar_use_body, NULL); }

/* Three elastic shares, all busy, of 30, 35 and 35% with 2 ms, 1 ms and 50 us kernels, 8 deep:
 * each keeps its guarantee, within 4 points (the meter's error on mixed kernel lengths, docs/
 * compute.md known limits). Catches an elastic co-tenant's claimed use bounded to its booking:
 * the 50 us share got 2% of the card. */
static double elastic_mix_body(const void *arg)
{
    (void)arg;
    share sh[3] = {{.name = "e30", .kernel_ns = 2 * MS, .active = 1, .depth = 8},
                   {.name = "e35a", .kernel_ns = 1 * MS, .active = 1, .depth = 8},
                   {.name = "e35b", .kernel_ns = 50 * US, .active = 1, .depth = 8}};
    int cores[] = {30, 35, 35}, pols[] = {EGPU_CARD_ELASTIC, EGPU_CARD_ELASTIC, EGPU_CARD_ELASTIC};
    setup(sh, 3, cores, pols, 0);
    run(11 * SEC);
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "elastic %s of 30/35/35 (2ms/1ms/50us) keeps its share", sh[i].name);
        check("elastic-mix", what, use_in(&sh[i], SEC, 11 * SEC), cores[i] - 4, 100);
    }
    return 0;
}

static void case_elastic_mix(void) { in_child(elastic_mix_body, NULL); }

/* A share whose only process is SIGKILLed with groups in flight (they never settle; its file
 * keeps inflight_n > 0 and its last use) counts as idle for its co-tenants once its in-flight
 * work is quiet for the owner's own expiry (250 ms): an elastic 30% neighbour takes the card
 * (98%), where it was held at 38% for as long as the dead share stayed in the roster. */
static double killed_body(const void *arg)
{
    (void)arg;
    share sh[2] = {{.name = "e30", .kernel_ns = 1 * MS, .active = 1, .depth = 8},
                   {.name = "killed", .kernel_ns = 1 * MS, .active = 1, .depth = 8, .kill_at = 3 * SEC}};
    int cores[] = {30, 60}, pols[] = {EGPU_CARD_ELASTIC, EGPU_CARD_STRICT};
    setup(sh, 2, cores, pols, 0);
    run(11 * SEC);
    check("killed", "strict-60 killed with launches in flight", (double)sh[1].killed_inflight, 1, 1e9);
    check("killed", "elastic-30 after its co-tenant was killed", use_in(&sh[0], 5 * SEC, 11 * SEC), 95, 100);
    return 0;
}

static void case_killed(void) { in_child(killed_body, NULL); }

/* A co-tenant that writes "my work ended 1 ms ago" (LIE_WORK_JUST_ENDED, and launched just now)
 * into its file at every moment moved every one-launch sample's start of its neighbours to
 * 1 ms before its end: a strict 30% share with 20 ms kernels ran at 100% charged 4.6% (beside
 * a strict 50% share: 50% each, charged 8% of it; with 50 us kernels the 50% share got 3.9%).
 * Such an end is believed only as far as the liar counted that work as its own: not at all,
 * and the caps and charges hold. One that also counts all that time as its own use
 * (LIE_WORK_COUNTED: the node agent then reports it busy) is believed up to its booking
 * (10% + 3 points of the time); what that still moves, through the solo estimate, to the
 * share's other launches is reported (info lines), not checked: not bounded yet. */
typedef struct { uint64_t third_kernel_ns; int lie; } shift_case;

static double liar_shift_body(const void *arg)
{
    const shift_case *c = arg;
    int third = c->third_kernel_ns > 0, counted = c->lie == LIE_WORK_COUNTED;
    share sh[3] = {{.name = "s30", .kernel_ns = 20 * MS, .active = 1, .depth = 4},
                   {.name = "liar", .kernel_ns = 1 * MS, .lie = c->lie},
                   {.name = "s50", .kernel_ns = c->third_kernel_ns, .active = 1,
                    .depth = c->third_kernel_ns > MS ? 4 : 64}};
    int cores[] = {30, 10, 50}, pols[] = {EGPU_CARD_STRICT, EGPU_CARD_STRICT, EGPU_CARD_STRICT};
    setup(sh, third ? 3 : 2, cores, pols, 0);
    run(11 * SEC);
    char tag[96], what[192];
    snprintf(tag, sizeof tag, "%s", counted ? "counted" : "uncounted");
    if (third) {
        snprintf(tag + strlen(tag), sizeof tag - strlen(tag), " beside-strict-50 ");
        tag_run(tag, sizeof tag, c->third_kernel_ns, 0, &NO_COSTS);
    }
    double a = use_in(&sh[0], SEC, 11 * SEC), charged = measured_pct(&sh[0], 11 * SEC) / use_in(&sh[0], 0, 11 * SEC);
    double b = third ? use_in(&sh[2], SEC, 11 * SEC) : 0;
    if (counted) {
        printf("info liar-shift %s strict-30-20ms use value=%.2f\n", tag, a);
        if (third) printf("info liar-shift %s strict-50 use value=%.2f\n", tag, b);
        return 0;
    }
    snprintf(what, sizeof what, "%s strict-30-20ms use", tag);
    check("liar-shift", what, a, 27, 33);
    snprintf(what, sizeof what, "%s strict-30-20ms charged_over_true", tag);
    check("liar-shift", what, charged, 0.95, 1.05);
    if (third) {
        snprintf(what, sizeof what, "%s strict-50 use", tag);
        check("liar-shift", what, b, 47, 53);
    }
    return 0;
}

static void case_liar_shift(void)
{
    shift_case cs[] = {{0, LIE_WORK_JUST_ENDED}, {20 * MS, LIE_WORK_JUST_ENDED}, {50 * US, LIE_WORK_JUST_ENDED},
                       {0, LIE_WORK_COUNTED}, {20 * MS, LIE_WORK_COUNTED}};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) in_child(liar_shift_body, &cs[i]);
}

/* The program's folder: the gate copies (one file each, so that each loads as its own). */
static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    char self[PATH_MAX], lib[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 3;
    self[n] = 0;
    *strrchr(self, '/') = 0;
    snprintf(lib, sizeof lib, "%s/gate_sim.so", self);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%.200s/egpu-compute-sim-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) return 3;
    for (int i = 0; i < MAX_SHARES; i++) {
        char to[PATH_MAX + 32];
        snprintf(to, sizeof to, "%s/gate-%d.so", g_dir, i);
        if (copy_file(lib, to) != 0) {
            fprintf(stderr, "compute_sim: cannot copy %s\n", lib);
            return 3;
        }
    }
    struct { const char *name; void (*fn)(void); } cases[] = {
        {"caps", case_caps}, {"split", case_split}, {"elastic", case_elastic},
        {"priority", case_priority}, {"floor", case_floor}, {"caps10us", case_caps10us},
        {"split10us", case_split10us}, {"gaps", case_gaps}, {"realistic", case_realistic},
        {"liar-use", case_liar_use}, {"elastic-mix", case_elastic_mix}, {"killed", case_killed}, {"liar-shift", case_liar_shift},
        {"nap", case_nap},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int want = argc < 2;
        for (int a = 1; a < argc; a++)
            if (!strcmp(argv[a], cases[i].name)) want = 1;
        if (want) cases[i].fn();
    }
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return g_fail;
}
