/* compute_gate.h: what the launch gate's files share (internal; compute.h is the gate's API).
 *
 * compute_gate.c   the launch path (egpu_compute_before / _after), the launching threads'
 *                  state, the teardown;
 * compute_poll.c   contexts, anchors and events; settling groups; the poller thread;
 * compute_setup.c  the tunables, the cards' modes, egpu_compute_init.
 *
 * A gated launch, in the common case: the current context's device from the thread's cache,
 * the capture check, one clock read, the stream's meter from the thread's table, the
 * estimate drawn from the thread's lease of the share's bucket (a subtraction in the
 * thread's own state); after the launch, the meter's bookkeeping. No lock, no atomic
 * read-modify-write, no system call, no event. The slow paths: the lease ran out or the
 * launch must wait (the card lock, sleeps), an event is due for the stream's group (the
 * process lock and one cuEventRecord), a new context or thread (the process lock).
 *
 * A background thread per process polls the recorded events with cuEventQuery every 0.5 ms
 * and settles each group on its event; it also hands the slots what the launching threads
 * counted and keeps the card's high-priority mark fresh while the process's high-priority
 * work is outstanding. Neither holds a lock while sleeping, nor the card lock while calling
 * the driver. */
#ifndef EGPU_COMPUTE_GATE_H
#define EGPU_COMPUTE_GATE_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>
#include "capture.h"
#include "compute.h"

enum { MODE_NONE = 0, MODE_CTL = 1, MODE_WATCH = 2 };
#define MAX_PENDING 4096
#define MAX_FREE_EVENTS 1024
#define MAX_CTX 32
/* Launching threads that get a stream table; a thread beyond them records an event after each
 * of its launches (the measurement still holds, at the old cost). */
#define MAX_THREADS 256
/* Streams a thread keeps meters for; the least recently used one goes (its open group is
 * settled by its estimates). Inference engines launch from one or two streams per thread. */
#define THREAD_STREAMS 8

typedef struct {
    CUevent ev;
    CUcontext ctx;
    CUstream stream;
    egpu_group g;
    egpu_stream_meter *m; /* the stream's meter (NULL: a launch of a thread beyond the table) */
    uint64_t seq;         /* the event's number on that meter */
    int dev;
    int counted; /* in the slot's in-flight figures (egpu_ctl_batch_apply) */
} pending_rec;

typedef struct {
    CUcontext ctx;
    int dev;
    CUevent anchor;
    CUstream anchor_stream;
    uint64_t anchor_ns;   /* host time of the anchor event */
    uint64_t anchor_err_ns; /* ... to within this (half its tightest bracket) */
    uint64_t anchored_at; /* when it was made */
    int ok;
    int failures; /* anchoring attempts that failed: give up after a few */
} ctx_ent;
#define ANCHOR_MAX_FAILURES 3 /* a driver whose events cannot be timed is told once, then left alone */

typedef struct {
    egpu_card_region *r;
    int slot;
    int mode; /* MODE_* (atomic) */
    int cores;
    int bucket;             /* the share has a token bucket on this card (cores < 100) */
    uint64_t est[2];        /* the share's per-launch estimate, kernels / graphs (atomic; poller) */
    uint64_t unit[2];       /* one launch's own time, for the meters' prediction (atomic; poller) */
    uint64_t hi_marked;     /* the last time this process marked high-priority activity (atomic) */
    uint64_t events;        /* events recorded since the poller's last batch (under g_c.mu) */
    uint64_t launches_seen; /* poller: the threads' launch counters summed at its last pass */
} card_ent;

/* One stream of one thread: the key and its meter. */
typedef struct {
    CUcontext ctx;
    CUstream stream; /* as launched into (the per-thread stream for _ptsz entry points) */
    int dev;
    uint64_t used; /* the thread's launch clock at its last use */
    egpu_stream_meter m;
} gate_stream;

/* A launching thread's state. Never freed: pending records point into it; a thread that
 * exits leaves it to the next one. */
typedef struct {
    int live;      /* owned by a live thread (under g_c.mu) */
    CUcontext ctx; /* the context last seen, and its device */
    int ctx_dev;
    unsigned ctx_gen; /* g_c.ctx_gen when cached */
    uint64_t clock;   /* launches of the thread (stream table recency) */
    int mru;          /* the stream slot used last */
    gate_stream st[THREAD_STREAMS];
    int64_t lease[EGPU_COMPUTE_MAX_DEVS];       /* GPU ns drawn from each card's bucket, spent
                                                * without a lock (the thread's own) */
    uint64_t launches[EGPU_COMPUTE_MAX_DEVS];   /* per card (written by the thread, read by the poller) */
    uint64_t busy_until[EGPU_COMPUTE_MAX_DEVS]; /* predicted end of its queued work per card (likewise) */
} gate_thread;

typedef struct {
    pthread_mutex_t mu; /* everything below except the atomics and the threads' own state */
    int inited;
    egpu_compute_cfg cfg;
    egpu_ctl_params p;
    egpu_compute_drv d;
    card_ent card[EGPU_COMPUTE_MAX_DEVS];
    ctx_ent ctx[MAX_CTX];
    int nctx;
    unsigned ctx_gen; /* bumped when a context must be looked at again (atomic) */
    struct {
        CUevent ev;
        CUcontext ctx;
    } freeev[MAX_FREE_EVENTS];
    int nfree;
    pending_rec pend[MAX_PENDING];
    int npend;
    gate_thread *threads[MAX_THREADS];
    int nthreads;
    pthread_key_t thread_key;
    pthread_t thr;
    int thr_started;
    int stop; /* atomic */
    uint64_t poll_ns;
    uint64_t hi_mark_ns; /* a launch marks high-priority activity at most this often */
    uint64_t last_modes_ns;
    uint32_t napping; /* 1 while the poller naps, idle (atomic; the first launch wakes it) */
} gate_state;

#pragma GCC visibility push(hidden)

/* The process's gate (compute_gate.c). */
extern gate_state g_c;

/* compute_gate.c */
void thread_gone(void *arg);
void atfork_child(void);

/* compute_poll.c (g_c.mu held unless said) */
ctx_ent *ctx_get(CUcontext ctx);
int make_anchor(ctx_ent *e);
CUevent event_take(CUcontext ctx);
void settle(int dev, const egpu_group *g, int counted, uint64_t end_ns); /* any thread */
int poll_locked(CUcontext only_ctx, int switch_ctx, int *busy_mask);
uint64_t batch_card(int d, uint64_t now);
void *poller(void *arg);
void poller_wake(card_ent *c); /* a launching thread, g_c.mu not held */

/* compute_setup.c */
void update_modes(void);
void refresh_estimates(card_ent *c);

#pragma GCC visibility pop

static inline uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }
static inline uint64_t u64max(uint64_t a, uint64_t b) { return a > b ? a : b; }

/* The gate's own event queries, synchronisations and anchors run in RELAXED capture mode
 * (capture.h): an application's graph capture must never be invalidated by them. */
static inline egpu_capture_relax relax_capture(void)
{
    return egpu_capture_relaxed(g_c.d.cuThreadExchangeStreamCaptureMode);
}
static inline void restore_capture(egpu_capture_relax c)
{
    egpu_capture_restore(g_c.d.cuThreadExchangeStreamCaptureMode, c);
}

#endif
