/* fakegpu: a stand-in libcuda.so.1 over host memory.
 *
 * Device pointers are fake address ranges (a bump allocator over a virtual address
 * counter); only the bytes are accounted, card-wide across processes (fake_common.c).
 * Error codes follow the real driver for the cases egpu relies on. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "fake_common.h"

#define MIB (1ull << 20)
#define GRAN (2 * MIB) /* VMM and pool granularity */
#define CTX_MAGIC 0x43545831u
/* the fake's device shape (cuDeviceGetAttribute): an sm_80 card's 2048 resident threads a SM */
#define FAKE_SM_COUNT 80u
#define FAKE_THREADS_PER_SM 2048u
#define STREAM_MAGIC 0x5354524du
#define EVENT_MAGIC 0x45564e54u
#define POOL_MAGIC 0x504f4f4cu
#define VMM_MAGIC 0x564d4d31u
#define ARR_MAGIC 0x41525231u
#define GRAPH_MAGIC 0x47524146u
#define GEXEC_MAGIC 0x47455843u
#define GNODE_MAGIC 0x474e4f44u
#define STREAM_NON_BLOCKING 0x1u
#define STREAM_PER_THREAD ((CUstream)0x2)

struct CUstream_st;
struct CUctx_st {
    uint32_t magic;
    int dev;
    int alive;
    int primary;
    unsigned flags;
    uint64_t null_end_ns; /* the default stream's simulated end */
    size_t limit[CU_LIMIT_MAX]; /* cuCtxSetLimit's values (ctx_limits_reset: the defaults) */
    uint64_t limit_bytes;       /* card memory the limits took above their defaults */
};
/* A graph holds what was captured: kernels on the simulated timeline, as their total time,
 * and its nodes (a kernel node per captured launch; memory allocation and free nodes). */
struct CUgraphNode_st {
    uint32_t magic; int type; /* CUgraphNodeType */
    int dev; uint64_t dptr, size; /* memory nodes: the device, the address, its size */
    int freed; /* an allocation node freed by a free node of the same graph */
    struct CUgraph_st *child; /* a child graph node: its embedded graph, the node's own */
    struct CUgraphNode_st *next;
};
/* owned: the embedded graph of a child graph node (cloned into it, or moved there with
 * CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): not destroyed, instantiated or given memory nodes
 * on its own (cuGraphChildGraphNodeGetGraph; CUgraphChildGraphNodeOwnership). */
struct CUgraph_st { uint32_t magic; uint64_t work_ns; unsigned nkernels; struct CUgraphNode_st *nodes, *last; size_t nnodes; int owned; };
/* An allocation node that its graph does not free (esc: escaping): each launch leaves it
 * live (graph_live below). */
struct gexec_esc { uint64_t dptr, bytes; int dev; };
/* An executable graph. Its allocation nodes' memory (mem, per device, each node rounded up to
 * the granularity) is mapped from the device's graph memory pool (reserved) at its first
 * launch or upload and kept until it is destroyed or trimmed while idle
 * (cuDeviceGraphMemTrim). */
struct CUgraphExec_st {
    uint32_t magic; uint64_t work_ns; unsigned nkernels;
    uint64_t mem[FG_MAX_CARDS]; int reserved; uint64_t end_ns; /* its last launch's simulated end */
    struct gexec_esc *esc; size_t nesc, cap_esc; /* its escaping allocation nodes */
    struct CUgraphExec_st *next;
};
/* A graph allocation a launch left live (its node not freed in its graph). As the driver
 * (programming guide, "Graph Memory Nodes"): it keeps its memory in the graph memory pool
 * after its executable graph is destroyed (owner NULL), until cuMemFree / cuMemFreeAsync;
 * its memory then stays reserved, unused, until cuDeviceGraphMemTrim (or a launch reuses
 * it). While its owner is mapped it is part of the owner's mapping. */
struct graph_live { uint64_t dptr, bytes; int dev; struct CUgraphExec_st *owner; struct graph_live *next; };
struct CUstream_st {
    uint32_t magic; struct CUctx_st *ctx; uint64_t end_ns; struct CUstream_st *next;
    unsigned flags;
    struct CUgraph_st *capture; /* while capturing (under g_mu): the graph being recorded */
    int cap_mode;               /* CUstreamCaptureMode of the capture */
    pthread_t cap_thread;       /* the thread that began it */
    int cap_invalid;            /* invalidated: cuStreamEndCapture fails */
};
struct CUevent_st { uint32_t magic; uint64_t ts; int recorded; int captured; /* last recorded in a capture */ };
/* Memory freed with cuMemFreeAsync whose completion the host has not observed yet: another
 * stream may reuse it only as the pool's reuse policies allow (CUmemPool_attribute, REUSE_*). */
struct pool_free {
    uint64_t stream;       /* the freeing stream's key (stream_key); 0: its stream is gone */
    struct CUctx_st *ctx;  /* the stream's context (cuCtxSynchronize observes it) */
    uint64_t bytes, end_ns; /* end_ns: the stream's simulated end when it was freed */
    struct pool_free *next;
};
struct CUmemPoolHandle_st {
    uint32_t magic;
    int dev; /* -1: a pool at a host location (host memory: no card's) */
    int alive; /* 0 once destroyed: its memory stays until its last allocation is freed */
    uint64_t reserved, used, threshold, reserved_high, used_high;
    struct CUmemPoolHandle_st *next;
    int reuse_follow, reuse_opportunistic, reuse_internal; /* CU_MEMPOOL_ATTR_REUSE_*, default 1 */
    struct pool_free *frees; /* part of the cache (reserved - used), under g_mu */
    int access[FG_MAX_CARDS]; /* cuMemPoolSetAccess, per device (CUmemAccess_flags) */
};
/* A physical VMM allocation. As the driver: the memory is freed only when every handle to it
 * is released (cuMemCreate/cuMemImportFromShareableHandle/cuMemRetainAllocationHandle each
 * add one) AND every mapping of it is unmapped (refs and nmaps under g_mu), in every process:
 * once exported, its holders across processes are counted in the shared vmm_export below. */
typedef struct vmm_handle vmm_handle;
typedef struct vmm_export vmm_export;
/* (shareable handles, below) */
struct vmm_export {
    uint32_t magic; int dev, card; uint64_t size; CUmemAllocationProp prop;
    uint64_t owner;       /* the fake's identity (fg_world.token) of the process charged */
    atomic_int holders;   /* vmm_handles alive in every process (each: handles or mappings) */
};
/* A multicast binding: `size` bytes of `mem` from memory offset mem_offset, at mc_offset of
 * the multicast object, for mem's device. It keeps mem alive (counted in mem->nmaps). */
typedef struct { vmm_handle *mem; uint64_t mc_offset, size; } mc_binding;
struct vmm_handle {
    uint32_t magic; int dev; uint64_t size; CUmemAllocationProp prop;
    int refs, nmaps;
    int imported; /* an import of another allocation: its card memory is the exporter's */
    vmm_export *x; /* exported or imported: the allocation's shared record (mapped), else NULL */
    int x_fd;      /* its memfd (each export opens it anew), -1 none */
    /* a multicast object (dev -1: no memory of its own): its devices, its bindings */
    int multicast, mc_want, mc_ndevs, mc_devs[FG_MAX_CARDS], mc_nbinds;
    mc_binding mc_binds[FG_MAX_CARDS * 8];
};
typedef struct { uint32_t magic; int dev; uint64_t bytes; struct CUctx_st *ctx; } arr_handle;

/* ---- global driver state ------------------------------------------------------------ */
static atomic_int g_inited;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_nvis;
static int g_vis[FG_MAX_CARDS]; /* ordinal -> card index in the config */
static struct CUctx_st g_primary[FG_MAX_CARDS];
static int g_primary_refs[FG_MAX_CARDS];
static struct CUmemPoolHandle_st g_default_pool[FG_MAX_CARDS];
static CUmemoryPool g_cur_pool[FG_MAX_CARDS];
static struct CUmemPoolHandle_st *g_pools;  /* user pools */
static struct CUstream_st *g_streams;
static uint64_t g_kernel_ns;
static atomic_ullong g_va = 0x7f0000000000ull;
static atomic_uint g_va_low = 0x10000000u;
static uint64_t g_ctx_bytes;
static void graph_free_nodes(struct CUgraph_st *g);
static void pool_put_back(struct CUmemPoolHandle_st *p, uint64_t bytes, int ordered, uint64_t key, struct CUctx_st *ctx,
                          uint64_t end_ns);
static struct CUgraphExec_st *g_execs; /* live executable graphs (cuDeviceGraphMemTrim) */
/* the graph memory pool of each device: what it holds on the card (CU_GRAPH_MEM_ATTR_
 * RESERVED_MEM_*); what is in use is graph_used() */
static uint64_t g_graph_reserved[FG_MAX_CARDS], g_graph_reserved_high[FG_MAX_CARDS], g_graph_used_high[FG_MAX_CARDS];
static struct graph_live *g_graph_live;
static int graph_live_free(uint64_t ptr);
static void meet_init(void); /* FAKEGPU_GRAPH_LAUNCH_MEET (cuGraphLaunch) */

static __thread struct CUctx_st *t_stack[32];
static __thread int t_depth;

/* ---- stream capture rules (CUDA driver API: cuStreamBeginCapture_v2,
 * cuThreadExchangeStreamCaptureMode; CUDA programming guide, "Prohibited and Unhandled
 * Operations"). During a capture some calls are "potentially unsafe": they are not enqueued
 * and not seen by the capture (synchronous allocation and free, event and stream queries and
 * synchronisation). A thread not in RELAXED mode is refused them
 * (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) while it has a non-relaxed capture of its own going,
 * or, in GLOBAL mode (the default), while any thread has a GLOBAL capture going; each capture
 * concerned is invalidated (cuStreamEndCapture then answers
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED). */
static atomic_int g_ncaptures;
static __thread int t_capture_mode; /* CU_STREAM_CAPTURE_MODE_GLOBAL (0) until exchanged */

static CUresult capture_unsafe_call(void)
{
    if (!atomic_load(&g_ncaptures) || t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    int hit = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *s = g_streams; s; s = s->next) {
        if (!s->capture || s->cap_mode == CU_STREAM_CAPTURE_MODE_RELAXED) continue;
        if (pthread_equal(s->cap_thread, self) ||
            (t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && s->cap_mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            s->cap_invalid = 1;
            hit = 1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* The legacy default stream of a context in which a blocking stream captures: using it would
 * make it depend on captured work (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT); a use (not a mere
 * status query) invalidates those captures. */
static CUresult capture_legacy_use(struct CUctx_st *c, int invalidate)
{
    if (!atomic_load(&g_ncaptures)) return CUDA_SUCCESS;
    int hit = 0;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *s = g_streams; s; s = s->next)
        if (s->capture && s->ctx == c && !(s->flags & STREAM_NON_BLOCKING)) {
            if (invalidate) s->cap_invalid = 1;
            hit = 1;
        }
    pthread_mutex_unlock(&g_mu);
    return hit ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

/* Querying or synchronising a stream that captures is invalid: refused, capture invalidated. */
static int capture_stream_busy(struct CUstream_st *s)
{
    pthread_mutex_lock(&g_mu);
    int busy = s->capture != NULL;
    if (busy) s->cap_invalid = 1;
    pthread_mutex_unlock(&g_mu);
    return busy;
}

/* ---- CPU cost per driver call (issue 17) ----------------------------------------------
 * The fake's calls take tens of nanoseconds; a real driver's take microseconds, which is what
 * an interposer's extra driver calls (an event record after a launch, the queries of its
 * poller) cost an application. With FAKEGPU_CALL_COSTS=realistic, each call below first spins
 * (busy, as a driver does) for the time a real driver takes; FAKEGPU_CALL_COST_NS_LAUNCH,
 * _EVENT_RECORD and _EVENT_QUERY set or override one figure (0 turns it off). Off by default.
 * The realistic figures, from published measurements:
 *  - cuLaunchKernel (every launch entry point, and cuGraphLaunch): 2500 ns. Launching an
 *    empty kernel took 4.9 us from C in 2017 ("mostly spent in libcuda", JuliaGPU/CUDAdrv.jl
 *    pull request 15) and ~3 us asynchronously on older cards (University of Virginia,
 *    "CUDA Kernel Overhead", 334 000 launches a second at best); current drivers are at the
 *    low end of that range: 2.5 us.
 *  - cuEventRecord: 2500 ns. "A default event record (timing enabled) has a throughput of
 *    about 400K records per second" (Mark Harris, NVIDIA, NVIDIA/NVTX issue 3; V100,
 *    CUDA 10.2).
 *  - cuEventQuery: 1000 ns. No direct published figure was found: a record plus polling
 *    queries took 5.2 us an iteration with timing events (ICLDisco/parsec pull request 576),
 *    2.5 us of which is the record; 1 us is assumed for a query.
 *  - cuStreamGetDevice and cuStreamGetCtx ("stream_device"), cuDeviceGetAttribute
 *    ("device_attribute"): counted only (no published figure: 0 unless set), so that tests
 *    see which of these queries an interposer adds.
 * FAKEGPU_CALL_COUNTS=PATH: at exit each process appends one JSON line of how many of these
 * calls it made: {"pid":N,"launch":N,"event_record":N,"event_query":N,"stream_device":N,
 * "device_attribute":N}. */
enum { COST_LAUNCH, COST_EVENT_RECORD, COST_EVENT_QUERY, COST_STREAM_DEVICE, COST_DEVICE_ATTRIBUTE, NCOSTS };
static const struct { const char *env; uint64_t realistic_ns; const char *name; } g_cost_def[NCOSTS] = {
    {"FAKEGPU_CALL_COST_NS_LAUNCH", 2500, "launch"},
    {"FAKEGPU_CALL_COST_NS_EVENT_RECORD", 2500, "event_record"},
    {"FAKEGPU_CALL_COST_NS_EVENT_QUERY", 1000, "event_query"},
    {"FAKEGPU_CALL_COST_NS_STREAM_DEVICE", 0, "stream_device"},
    {"FAKEGPU_CALL_COST_NS_DEVICE_ATTRIBUTE", 0, "device_attribute"},
};
static uint64_t g_cost_ns[NCOSTS];
static int g_count_calls;
static struct { _Alignas(64) atomic_ullong n; } g_calls[NCOSTS]; /* apart: threads count apart */

static void costs_init(void)
{
    const char *preset = getenv("FAKEGPU_CALL_COSTS");
    int realistic = preset && !strcmp(preset, "realistic");
    for (int i = 0; i < NCOSTS; i++) {
        const char *v = getenv(g_cost_def[i].env);
        g_cost_ns[i] = v && *v ? strtoull(v, NULL, 10) : realistic ? g_cost_def[i].realistic_ns : 0;
    }
    const char *counts = getenv("FAKEGPU_CALL_COUNTS");
    g_count_calls = counts && *counts;
}

/* The CPU a real driver would spend in call `which`: a busy wait, as the driver's own work. */
static void call_cost(int which)
{
    if (g_count_calls) atomic_fetch_add_explicit(&g_calls[which].n, 1, memory_order_relaxed);
    uint64_t ns = g_cost_ns[which];
    if (!ns) return;
    uint64_t end = fg_now_ns() + ns;
    while (fg_now_ns() < end) {
    }
}

__attribute__((destructor)) static void calls_report(void)
{
    const char *path = getenv("FAKEGPU_CALL_COUNTS");
    if (!g_count_calls || !path) return;
    char line[256];
    int n = snprintf(line, sizeof line, "{\"pid\":%d", (int)getpid());
    for (int i = 0; i < NCOSTS; i++)
        n += snprintf(line + n, sizeof line - (size_t)n, ",\"%s\":%llu", g_cost_def[i].name,
                      (unsigned long long)atomic_load(&g_calls[i].n));
    n += snprintf(line + n, sizeof line - (size_t)n, "}\n");
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, line, (size_t)n); /* one short write: lines of processes never mix */
    (void)w;
    close(fd);
}

/* ---- allocation table (ptr -> size, card, pool) ------------------------------------ */
typedef struct alloc_ent {
    uint64_t ptr, size; int dev; int kind; struct CUmemPoolHandle_st *pool; struct alloc_ent *next;
    struct CUctx_st *ctx; /* K_DEV/K_MANAGED: the owning context (freed with it) */
    vmm_handle *vmm;      /* K_MAP: the mapped allocation */
} alloc_ent;
enum { K_DEV = 1, K_MANAGED, K_HOST, K_POOL, K_RESERVE, K_MAP, K_ARR };
#define NBUCKET 4096
static alloc_ent *g_tab[NBUCKET];
static unsigned hsh(uint64_t p) { return (unsigned)((p >> 12) * 0x9E3779B97F4A7C15ull >> 52) % NBUCKET; }

static void tab_put(uint64_t ptr, uint64_t size, int dev, int kind, struct CUmemPoolHandle_st *pool)
{
    alloc_ent *e = malloc(sizeof *e);
    if (!e) abort();
    *e = (alloc_ent){ptr, size, dev, kind, pool, NULL, t_depth > 0 ? t_stack[t_depth - 1] : NULL, NULL};
    pthread_mutex_lock(&g_mu);
    e->next = g_tab[hsh(ptr)];
    g_tab[hsh(ptr)] = e;
    pthread_mutex_unlock(&g_mu);
}

static int tab_take(uint64_t ptr, int kind, alloc_ent *out)
{
    pthread_mutex_lock(&g_mu);
    for (alloc_ent **pp = &g_tab[hsh(ptr)]; *pp; pp = &(*pp)->next) {
        alloc_ent *e = *pp;
        if (e->ptr == ptr && (kind == 0 || e->kind == kind || (kind == K_DEV && e->kind == K_MANAGED))) {
            *pp = e->next;
            pthread_mutex_unlock(&g_mu);
            *out = *e;
            free(e);
            return 0;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return -1;
}

static uint64_t va_take(uint64_t size)
{
    uint64_t sz = (size + GRAN - 1) / GRAN * GRAN;
    if (!sz) sz = GRAN;
    return atomic_fetch_add(&g_va, sz);
}

/* ---- helpers ------------------------------------------------------------------------ */
#define NEED_INIT() do { if (!atomic_load(&g_inited)) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

static struct CUctx_st *cur_ctx(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }
static int ctx_ok(struct CUctx_st *c) { return c && c->magic == CTX_MAGIC && c->alive; }
static int dev_ok(CUdevice d) { return d >= 0 && d < g_nvis; }
static int card_of(CUdevice d) { return g_vis[d]; }

static void sleep_until(uint64_t t)
{
    uint64_t now = fg_now_ns();
    while (now < t) {
        struct timespec ts = {(time_t)((t - now) / 1000000000ull), (long)((t - now) % 1000000000ull)};
        nanosleep(&ts, NULL);
        now = fg_now_ns();
    }
}

static int parse_visible(void)
{
    fg_world *w = fg_get();
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!cvd) {
        for (int i = 0; i < w->ncards; i++) g_vis[i] = i;
        return w->ncards;
    }
    int n = 0;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", cvd);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && n < FG_MAX_CARDS; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        int found = -1;
        if (isdigit((unsigned char)*tok)) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (v >= 0 && v < w->ncards) found = (int)v;
        } else if (!strncmp(tok, "GPU-", 4)) {
            for (int i = 0; i < w->ncards; i++)
                if (!strncmp(w->card[i].uuid, tok, strlen(tok))) { found = i; break; }
        }
        if (found < 0) break; /* the real driver stops at the first invalid entry */
        for (int j = 0; j < n; j++)
            if (g_vis[j] == found) found = -2;
        if (found == -2) break;
        g_vis[n++] = found;
    }
    return n;
}

/* ---- init / version / devices ------------------------------------------------------- */
FG_EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (!atomic_load(&g_inited)) {
        g_nvis = parse_visible();
        const char *k = getenv("FAKEGPU_KERNEL_US");
        g_kernel_ns = k ? strtoull(k, NULL, 10) * 1000ull : 0;
        const char *c = getenv("FAKEGPU_CONTEXT_MIB");
        g_ctx_bytes = c ? strtoull(c, NULL, 10) * MIB : 0;
        costs_init();
        meet_init();
        for (int d = 0; d < g_nvis; d++) {
            g_primary[d] = (struct CUctx_st){.magic = CTX_MAGIC, .dev = d, .primary = 1};
            g_default_pool[d] = (struct CUmemPoolHandle_st){POOL_MAGIC, d, 1, 0, 0, 0, 0, 0, NULL, 1, 1, 1, NULL, {0}};
            g_default_pool[d].access[d] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            g_cur_pool[d] = &g_default_pool[d];
        }
        atomic_store(&g_inited, 1);
    }
    pthread_mutex_unlock(&g_mu);
    return g_nvis ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

FG_EXPORT CUresult cuDriverGetVersion(int *v)
{
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = 13000;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    if (!n) return CUDA_ERROR_INVALID_VALUE;
    *n = g_nvis;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    NEED_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", fg_get()->card[card_of(d)].name);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d)
{
    NEED_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = fg_get()->card[card_of(d)].total;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice d)
{
    size_t b = 0;
    if (!bytes) return atomic_load(&g_inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = cuDeviceTotalMem_v2(&b, d);
    if (r == CUDA_SUCCESS) *bytes = b > 0xffffffffu ? 0xffffffffu : (unsigned int)b;
    return r;
}

FG_EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d)
{
    NEED_INIT();
    if (!u) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (fg_parse_uuid(fg_get()->card[card_of(d)].uuid, (unsigned char *)u->bytes) != 0) memset(u, 0, sizeof *u);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }

FG_EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    NEED_INIT();
    call_cost(COST_DEVICE_ATTRIBUTE);
    if (!v || (int)a <= 0 || a >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = FAKE_SM_COUNT; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = FAKE_THREADS_PER_SM; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = card_of(d) + 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 8; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: *v = fg_get()->card[card_of(d)].multicast; break;
    default: *v = 0;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice d)
{
    NEED_INIT();
    if (!bus || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(bus, (size_t)len, "0000:%02x:00.0", card_of(d) + 1);
    return CUDA_SUCCESS;
}

/* ---- contexts ----------------------------------------------------------------------- */
/* A context's limits start at the driver's defaults (cuCtxGetLimit on a new context; CUDA
 * programming guide: the malloc heap is 8 MiB by default, the printf FIFO 1 MiB, the stack
 * 1 KiB a thread). What the defaults take is part of the context's own cost
 * (FAKEGPU_CONTEXT_MIB). */
#define FAKE_STACK_DEFAULT_BYTES 1024u
#define FAKE_PRINTF_FIFO_DEFAULT_BYTES (1u << 20)
#define FAKE_MALLOC_HEAP_DEFAULT_BYTES (8u << 20)
#define FAKE_SYNC_DEPTH_DEFAULT 2u
#define FAKE_PENDING_LAUNCHES_DEFAULT 2048u
#define FAKE_L2_FETCH_DEFAULT_BYTES 64u
static void ctx_limits_reset(struct CUctx_st *c)
{
    memset(c->limit, 0, sizeof c->limit);
    c->limit[CU_LIMIT_STACK_SIZE] = FAKE_STACK_DEFAULT_BYTES;
    c->limit[CU_LIMIT_PRINTF_FIFO_SIZE] = FAKE_PRINTF_FIFO_DEFAULT_BYTES;
    c->limit[CU_LIMIT_MALLOC_HEAP_SIZE] = FAKE_MALLOC_HEAP_DEFAULT_BYTES;
    c->limit[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = FAKE_SYNC_DEPTH_DEFAULT;
    c->limit[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = FAKE_PENDING_LAUNCHES_DEFAULT;
    c->limit[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = FAKE_L2_FETCH_DEFAULT_BYTES;
    c->limit_bytes = 0;
}

static CUresult ctx_new(CUcontext *pctx, CUdevice d)
{
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (g_ctx_bytes && fg_charge(card_of(d), g_ctx_bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    *c = (struct CUctx_st){.magic = CTX_MAGIC, .dev = d, .alive = 1};
    ctx_limits_reset(c);
    if (t_depth < 32) t_stack[t_depth++] = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxCreate(CUcontext *c, unsigned int f, CUdevice d) { (void)f; return ctx_new(c, d); }
FG_EXPORT CUresult cuCtxCreate_v2(CUcontext *c, unsigned int f, CUdevice d) { (void)f; return ctx_new(c, d); }
FG_EXPORT CUresult cuCtxCreate_v3(CUcontext *c, CUexecAffinityParam *p, int n, unsigned int f, CUdevice d)
{
    (void)p; (void)n; (void)f;
    return ctx_new(c, d);
}
FG_EXPORT CUresult cuCtxCreate_v4(CUcontext *c, CUctxCreateParams *p, unsigned int f, CUdevice d)
{
    (void)p; (void)f;
    return ctx_new(c, d);
}

static int managed_host(void);
/* As the driver: destroying a context (or the primary context going down) frees the memory
 * allocated in it: linear allocations and arrays. Pools and VMM allocations are not owned by
 * a context. */
static void free_ctx_memory(struct CUctx_st *c)
{
    pthread_mutex_lock(&g_mu);
    for (int b = 0; b < NBUCKET; b++)
        for (alloc_ent **pp = &g_tab[b]; *pp;) {
            alloc_ent *e = *pp;
            if (e->ctx != c || (e->kind != K_DEV && e->kind != K_MANAGED && e->kind != K_ARR)) { pp = &e->next; continue; }
            *pp = e->next;
            if (e->kind == K_ARR) ((arr_handle *)(uintptr_t)e->ptr)->magic = 0; /* kept, poisoned */
            if (!(e->kind == K_MANAGED && managed_host())) fg_uncharge(card_of(e->dev), e->size);
            free(e);
        }
    pthread_mutex_unlock(&g_mu);
}

static void drop_from_stacks(struct CUctx_st *c)
{
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == c) {
            memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - i - 1) * sizeof t_stack[0]);
            t_depth--;
            i--;
        }
}

FG_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    NEED_INIT();
    struct CUctx_st *c = ctx;
    if (!c || c->magic != CTX_MAGIC || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    c->alive = 0;
    if (g_ctx_bytes) fg_uncharge(card_of(c->dev), g_ctx_bytes);
    if (c->limit_bytes) fg_uncharge(card_of(c->dev), c->limit_bytes); /* heap, stack, FIFO */
    c->limit_bytes = 0;
    free_ctx_memory(c);
    /* its streams go with it, and so do their captures (the structs are kept, poisoned) */
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st **pp = &g_streams; *pp;) {
        struct CUstream_st *s = *pp;
        if (s->ctx != c) { pp = &s->next; continue; }
        *pp = s->next;
        if (s->capture) {
            graph_free_nodes(s->capture);
        free(s->capture);
            s->capture = NULL;
            atomic_fetch_sub(&g_ncaptures, 1);
        }
        s->magic = 0;
    }
    pthread_mutex_unlock(&g_mu);
    drop_from_stacks(c);
    return CUDA_SUCCESS; /* the struct is kept (poisoned) so stale handles are detected */
}
FG_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return cuCtxDestroy_v2(ctx); }

FG_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx) { if (t_depth) t_depth--; return CUDA_SUCCESS; }
    if (ctx->magic != CTX_MAGIC) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ctx->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (t_depth == 0) t_depth = 1;
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetCurrent(CUcontext *ctx)
{
    NEED_INIT();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = cur_ctx();
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    NEED_INIT();
    if (!ctx_ok(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth >= 32) return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *ctx)
{
    NEED_INIT();
    if (!t_depth) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = t_stack[--t_depth];
    if (ctx) *ctx = c;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetDevice(CUdevice *d)
{
    NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *d, CUcontext ctx)
{
    NEED_INIT();
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = ctx ? ctx : cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *d = c->dev;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice d)
{
    NEED_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    /* the first retain, or the first after a reset (which kept the count), makes it live */
    if (g_primary_refs[d]++ == 0 || !g_primary[d].alive) {
        if (g_ctx_bytes && fg_charge(card_of(d), g_ctx_bytes) != 0) { g_primary_refs[d]--; r = CUDA_ERROR_OUT_OF_MEMORY; }
        else {
            g_primary[d].alive = 1;
            ctx_limits_reset(&g_primary[d]); /* a reset reset its limits too */
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS) *pctx = &g_primary[d];
    return r;
}

static void primary_down(CUdevice d) /* g_mu held */
{
    g_primary[d].alive = 0;
    if (g_ctx_bytes) fg_uncharge(card_of(d), g_ctx_bytes);
    if (g_primary[d].limit_bytes) fg_uncharge(card_of(d), g_primary[d].limit_bytes);
    g_primary[d].limit_bytes = 0;
    pthread_mutex_unlock(&g_mu);
    free_ctx_memory(&g_primary[d]);
    pthread_mutex_lock(&g_mu);
}

FG_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    NEED_INIT();
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g_primary_refs[d] <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--g_primary_refs[d] == 0 && g_primary[d].alive) primary_down(d);
    pthread_mutex_unlock(&g_mu);
    return r;
}
FG_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return cuDevicePrimaryCtxRelease_v2(d); }

/* CUDA driver API, cuDevicePrimaryCtxReset: "Destroy all allocations and reset all state on
 * the primary context ... Resetting the primary context does not release it, an application
 * that has retained the primary context should explicitly release its usage." The count of
 * retains stays; the next retain makes the context live again. */

FG_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d)
{
    NEED_INIT();
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    if (g_primary_refs[d] > 0 && g_primary[d].alive) primary_down(d);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) { return cuDevicePrimaryCtxReset_v2(d); }

/* cuCtxSetLimit / cuCtxGetLimit, on the current context. The malloc heap, the printf FIFO and
 * the stack (each thread's, for every thread the device can hold resident: SMs x threads per
 * SM) are device memory the driver takes from the card when the limit is set; a size the card
 * cannot hold is CUDA_ERROR_OUT_OF_MEMORY (one of cuCtxSetLimit's documented codes) and the
 * limit stays as it was. Lowering a limit gives the memory above the new size back. The fake
 * neither rounds values nor refuses a heap set after a kernel used malloc. */
static uint64_t limit_card_bytes(CUlimit l, size_t v)
{
    switch (l) {
    case CU_LIMIT_STACK_SIZE:
        return v > FAKE_STACK_DEFAULT_BYTES ? (v - FAKE_STACK_DEFAULT_BYTES) * FAKE_SM_COUNT * FAKE_THREADS_PER_SM : 0;
    case CU_LIMIT_PRINTF_FIFO_SIZE: return v > FAKE_PRINTF_FIFO_DEFAULT_BYTES ? v - FAKE_PRINTF_FIFO_DEFAULT_BYTES : 0;
    case CU_LIMIT_MALLOC_HEAP_SIZE: return v > FAKE_MALLOC_HEAP_DEFAULT_BYTES ? v - FAKE_MALLOC_HEAP_DEFAULT_BYTES : 0;
    default: return 0;
    }
}

FG_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    NEED_INIT();
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if ((int)limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    if (limit == CU_LIMIT_PERSISTING_L2_CACHE_SIZE) return CUDA_ERROR_UNSUPPORTED_LIMIT; /* no L2 set-aside */
    if (limit == CU_LIMIT_STACK_SIZE && value > SIZE_MAX / (FAKE_SM_COUNT * FAKE_THREADS_PER_SM))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t was = limit_card_bytes(limit, c->limit[limit]), now = limit_card_bytes(limit, value);
    CUresult r = CUDA_SUCCESS;
    if (now > was && fg_charge(card_of(c->dev), now - was) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        if (now < was) fg_uncharge(card_of(c->dev), was - now);
        c->limit_bytes = c->limit_bytes - was + now;
        c->limit[limit] = value;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    NEED_INIT();
    if (!pvalue) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if ((int)limit < 0 || limit >= CU_LIMIT_MAX) return CUDA_ERROR_UNSUPPORTED_LIMIT;
    *pvalue = c->limit[limit];
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active)
{
    NEED_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = g_primary[d].flags;
    *active = g_primary_refs[d] > 0;
    return CUDA_SUCCESS;
}

/* ---- device memory ------------------------------------------------------------------ */
/* FAKEGPU_MANAGED_HOST=1 (issue 8, FC-15 tests): managed memory lives in host memory, as the
 * part of a real managed allocation that does not fit on the card does; it never takes
 * card memory. Unset: managed memory is charged to the card like device memory. */
static int managed_host(void)
{
    const char *v = getenv("FAKEGPU_MANAGED_HOST");
    return v && *v == '1';
}

static CUresult dev_alloc(CUdeviceptr *out, uint64_t size, int kind)
{
    NEED_INIT();
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    if (!(kind == K_MANAGED && managed_host()) && fg_charge(card_of(c->dev), size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t p = va_take(size);
    tab_put(p, size, c->dev, kind, NULL);
    *out = p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return dev_alloc(dptr, size, K_DEV); }

FG_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != 2) return atomic_load(&g_inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return dev_alloc(dptr, size, K_MANAGED);
}

FG_EXPORT CUresult cuMemFree_v2(CUdeviceptr p)
{
    NEED_INIT();
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    if (p == 0) return CUDA_SUCCESS;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    alloc_ent e;
    if (tab_take(p, K_DEV, &e) != 0) {
        /* CUDA driver API, cuMemFree: memory of cuMemAllocAsync / cuMemAllocFromPoolAsync too,
         * back to its pool at once (no implicit synchronisation) */
        if (tab_take(p, K_POOL, &e) != 0) {
            /* a graph allocation left live (its graph does not free it) */
            pthread_mutex_lock(&g_mu);
            int found = graph_live_free(p) == 0;
            pthread_mutex_unlock(&g_mu);
            return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        }
        pthread_mutex_lock(&g_mu);
        pool_put_back(e.pool, e.size, 0, 0, NULL, 0);
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    if (!(e.kind == K_MANAGED && managed_host())) fg_uncharge(card_of(e.dev), e.size);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t w, size_t h, unsigned int elem)
{
    NEED_INIT();
    if (!dptr || !pitch || !w || !h || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (w + 511) / 512 * 512;
    CUresult r = dev_alloc(dptr, (uint64_t)p * h, K_DEV);
    if (r == CUDA_SUCCESS) *pitch = p;
    return r;
}

/* 32-bit legacy entry points: allocations come from a low address arena. */
FG_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int size)
{
    NEED_INIT();
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!size) return CUDA_ERROR_INVALID_VALUE;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    if (fg_charge(card_of(c->dev), size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned sz = (size + 0xfffu) & ~0xfffu;
    unsigned p = atomic_fetch_add(&g_va_low, sz);
    tab_put(p, size, c->dev, K_DEV, NULL);
    *dptr = p;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) { return cuMemFree_v2(p); }
FG_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int elem)
{
    NEED_INIT();
    if (!dptr || !pitch || !w || !h || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    unsigned p = (w + 511) / 512 * 512;
    if ((uint64_t)p * h > 0xffffffffull) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cuMemAlloc(dptr, p * h);
    if (r == CUDA_SUCCESS) *pitch = p;
    return r;
}

FG_EXPORT CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    NEED_INIT();
    if (!free_b || !total_b) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    int card = card_of(c->dev);
    uint64_t total = fg_get()->card[card].total, used = fg_card_used(card);
    *total_b = total;
    *free_b = used < total ? total - used : 0;
    uint64_t hard, group_used;
    if (fg_get()->driver_major >= FG_MEMORY_LIMITS_MIN_DRIVER && fg_my_limit(card, &hard, &group_used) && hard < total) {
        /* in a cgroup with a memory limit (r615): the limit, and the headroom under it */
        uint64_t left = group_used < hard ? hard - group_used : 0;
        *total_b = hard;
        *free_b = left < *free_b ? left : *free_b;
    }
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    size_t f = 0, t = 0;
    if (!free_b || !total_b) return atomic_load(&g_inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = cuMemGetInfo_v2(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
        *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    }
    return r;
}

/* Pinned host memory: real host memory, never charged to a card. */
FG_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    if (!pp || !size) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    void *p = malloc(size);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    tab_put((uint64_t)(uintptr_t)p, size, -1, K_HOST, NULL);
    *pp = p;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
FG_EXPORT CUresult cuMemAllocHost(void **pp, unsigned int size) { return cuMemHostAlloc(pp, size, 0); }
FG_EXPORT CUresult cuMemFreeHost(void *p)
{
    NEED_INIT();
    alloc_ent e;
    if (!p || tab_take((uint64_t)(uintptr_t)p, K_HOST, &e) != 0) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

/* ---- streams, events, simulated timeline ------------------------------------------- */
static int is_default_stream(CUstream s) { return s == NULL || (uintptr_t)s == 1 || (uintptr_t)s == 2; }

static CUresult stream_end(CUstream s, struct CUctx_st **ctx, uint64_t **end)
{
    if (is_default_stream(s)) {
        struct CUctx_st *c = cur_ctx();
        if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
        *ctx = c;
        *end = &c->null_end_ns;
        return CUDA_SUCCESS;
    }
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    *ctx = s->ctx;
    *end = &s->end_ns;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuStreamCreate(CUstream *ps, unsigned int flags)
{
    NEED_INIT();
    if (!ps) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = STREAM_MAGIC;
    s->ctx = c;
    s->flags = flags;
    pthread_mutex_lock(&g_mu);
    s->next = g_streams;
    g_streams = s;
    pthread_mutex_unlock(&g_mu);
    *ps = s;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int prio) { (void)prio; return cuStreamCreate(ps, flags); }

/* Stream priorities as current cards have them: 0 (least) to -5 (greatest); the fake runs every
 * stream alike (cuda.core asks for the range before it makes a stream). */
FG_EXPORT CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    NEED_INIT();
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

/* ---- pool caches: stream-ordered frees and the reuse policies ---------------------------
 * A pool's cache (reserved - used) serves an allocation only as the driver would: memory
 * whose free the host has observed (a synchronisation), the allocating stream's own frees
 * (stream order), and other streams' frees not yet observed only as the pool's reuse
 * policies allow (CUDA driver API, CUmemPool_attribute): ALLOW_INTERNAL_DEPENDENCIES (the
 * driver makes the stream wait on the free), ALLOW_OPPORTUNISTIC (the free has run on the
 * timeline). FOLLOW_EVENT_DEPENDENCIES is not modelled (the fake keeps no event dependencies
 * between streams): with the other two off, another stream's unobserved free is not reused
 * and the pool grows instead. */

/* The key of the stream a call means: a created stream, or its context's default stream
 * (the fake runs the legacy and per-thread default streams alike). */
static uint64_t stream_key(CUstream s, struct CUctx_st *c)
{
    return is_default_stream(s) ? (uint64_t)(uintptr_t)c : (uint64_t)(uintptr_t)s;
}

static int pool_free_usable(const struct CUmemPoolHandle_st *p, const struct pool_free *f, uint64_t key, uint64_t now)
{
    if (f->stream && f->stream == key) return 1;
    return p->reuse_internal || (p->reuse_opportunistic && f->end_ns <= now);
}

/* g_mu held: how much of a `size` allocation on stream `key` the cache can serve; with take,
 * it is taken (the unobserved frees it reuses are consumed). Its own stream's frees first,
 * then observed free memory, then other streams' frees the policies allow. */
static uint64_t pool_cache_serve(struct CUmemPoolHandle_st *p, uint64_t key, uint64_t size, int take)
{
    uint64_t pend = 0, got = 0, now = fg_now_ns();
    for (struct pool_free *f = p->frees; f; f = f->next) pend += f->bytes;
    uint64_t cached = p->reserved - p->used, observed = cached > pend ? cached - pend : 0;
    for (int pass = 0; pass < 3 && got < size; pass++) {
        if (pass == 1) {
            got += observed < size - got ? observed : size - got;
            continue;
        }
        for (struct pool_free *f = p->frees; f && got < size; f = f->next) {
            int own = f->stream && f->stream == key;
            if ((pass == 0) != own || !pool_free_usable(p, f, key, now)) continue;
            uint64_t t = f->bytes < size - got ? f->bytes : size - got;
            got += t;
            if (take) f->bytes -= t;
        }
    }
    for (struct pool_free **pp = &p->frees; take && *pp;) {
        struct pool_free *f = *pp;
        if (f->bytes) { pp = &f->next; continue; }
        *pp = f->next;
        free(f);
    }
    return got;
}

/* g_mu held: unobserved frees are part of the cache; after a release they cannot exceed it. */
static void pool_frees_clamp(struct CUmemPoolHandle_st *p)
{
    uint64_t pend = 0, cached = p->reserved - p->used;
    for (struct pool_free *f = p->frees; f; f = f->next) pend += f->bytes;
    for (struct pool_free **pp = &p->frees; *pp && pend > cached;) {
        struct pool_free *f = *pp;
        uint64_t t = f->bytes < pend - cached ? f->bytes : pend - cached;
        f->bytes -= t;
        pend -= t;
        if (f->bytes) { pp = &f->next; continue; }
        *pp = f->next;
        free(f);
    }
}

static void pool_frees_drop(struct CUmemPoolHandle_st *p)
{
    while (p->frees) {
        struct pool_free *f = p->frees;
        p->frees = f->next;
        free(f);
    }
}

/* A pool's memory is its device's card's; a pool at a host location takes host memory only
 * (none of any card's, so cuMemGetInfo does not move). 0, or -1 when the card is full. */
static int pool_charge(const struct CUmemPoolHandle_st *p, uint64_t bytes)
{
    return p->dev < 0 ? 0 : fg_charge(card_of(p->dev), bytes);
}
static void pool_uncharge(const struct CUmemPoolHandle_st *p, uint64_t bytes)
{
    if (p->dev >= 0) fg_uncharge(card_of(p->dev), bytes);
}

/* g_mu held: `bytes` of p's memory are free again. A stream-ordered free (ordered, on stream
 * key of ctx) stays unobserved until a synchronisation; a destroyed pool goes with its last
 * allocation (cuMemPoolDestroy). */
static void pool_put_back(struct CUmemPoolHandle_st *p, uint64_t bytes, int ordered, uint64_t key,
                          struct CUctx_st *ctx, uint64_t end_ns)
{
    p->used -= bytes;
    if (!p->alive) {
        if (!p->used) {
            pool_uncharge(p, p->reserved);
            p->reserved = 0;
            pool_frees_drop(p);
        }
        return;
    }
    if (!ordered) return;
    for (struct pool_free *f = p->frees; f; f = f->next)
        if (f->stream == key && f->ctx == ctx) { /* one record a stream: the latest end stands */
            f->bytes += bytes;
            if (end_ns > f->end_ns) f->end_ns = end_ns;
            return;
        }
    struct pool_free *f = malloc(sizeof *f);
    if (!f) abort();
    *f = (struct pool_free){key, ctx, bytes, end_ns, p->frees};
    p->frees = f;
}

/* g_mu held: calls f on every pool (the devices' default pools and the created ones). */
static void pools_each(void (*f)(struct CUmemPoolHandle_st *, uint64_t, struct CUctx_st *), uint64_t key,
                       struct CUctx_st *ctx)
{
    for (int d = 0; d < g_nvis; d++) f(&g_default_pool[d], key, ctx);
    for (struct CUmemPoolHandle_st *p = g_pools; p; p = p->next) f(p, key, ctx);
}

/* The host observed the frees of stream key (key 0: of every stream of ctx). */
static void pool_observe(struct CUmemPoolHandle_st *p, uint64_t key, struct CUctx_st *ctx)
{
    for (struct pool_free **pp = &p->frees; *pp;) {
        struct pool_free *f = *pp;
        if (key ? f->stream != key : f->ctx != ctx) { pp = &f->next; continue; }
        *pp = f->next;
        free(f);
    }
}
static void pools_observe(uint64_t key, struct CUctx_st *ctx)
{
    pthread_mutex_lock(&g_mu);
    pools_each(pool_observe, key, ctx);
    pthread_mutex_unlock(&g_mu);
}

/* A destroyed stream's unobserved frees belong to no stream any more (a later stream may
 * get its address). */
static void pool_orphan(struct CUmemPoolHandle_st *p, uint64_t key, struct CUctx_st *ctx)
{
    (void)ctx;
    for (struct pool_free *f = p->frees; f; f = f->next)
        if (f->stream == key) f->stream = 0;
}

FG_EXPORT CUresult cuStreamDestroy_v2(CUstream s)
{
    NEED_INIT();
    if (is_default_stream(s) || s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st **pp = &g_streams; *pp; pp = &(*pp)->next)
        if (*pp == s) { *pp = s->next; break; }
    if (s->capture) {
        graph_free_nodes(s->capture);
        free(s->capture);
        atomic_fetch_sub(&g_ncaptures, 1);
    }
    pools_each(pool_orphan, stream_key(s, s->ctx), NULL);
    pthread_mutex_unlock(&g_mu);
    s->magic = 0;
    free(s);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

/* Synchronisation releases what pools cache above their release threshold (as the driver does). */
static void pools_trim_dev(int dev, int to_threshold, uint64_t keep_min)
{
    pthread_mutex_lock(&g_mu);
    struct CUmemPoolHandle_st *all[64];
    int n = 0;
    all[n++] = &g_default_pool[dev];
    for (struct CUmemPoolHandle_st *p = g_pools; p && n < 64; p = p->next)
        if ((p->dev == dev || p->dev < 0) && p->alive) all[n++] = p; /* host pools: any sync */
    for (int i = 0; i < n; i++) {
        struct CUmemPoolHandle_st *p = all[i];
        uint64_t keep = to_threshold ? p->threshold : keep_min;
        uint64_t used_r = (p->used + GRAN - 1) / GRAN * GRAN;
        if (keep < used_r) keep = used_r;
        if (p->reserved > keep) {
            pool_uncharge(p, p->reserved - keep);
            p->reserved = keep;
            pool_frees_clamp(p);
        }
    }
    pthread_mutex_unlock(&g_mu);
}

/* The capture rules for waiting on / asking about a stream (see capture_unsafe_call). */
static CUresult capture_stream_check(CUstream s, struct CUctx_st *c)
{
    if (!atomic_load(&g_ncaptures)) return CUDA_SUCCESS;
    if (!is_default_stream(s) && capture_stream_busy(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if ((s == NULL || (uintptr_t)s == 1) && capture_legacy_use(c, 1) != CUDA_SUCCESS) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    return capture_unsafe_call();
}

FG_EXPORT CUresult cuStreamSynchronize(CUstream s)
{
    NEED_INIT();
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if ((r = capture_stream_check(s, c)) != CUDA_SUCCESS) return r;
    sleep_until(*end);
    pools_observe(stream_key(s, c), c);
    pools_trim_dev(c->dev, 1, 0);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }

FG_EXPORT CUresult cuStreamQuery(CUstream s)
{
    NEED_INIT();
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if ((r = capture_stream_check(s, c)) != CUDA_SUCCESS) return r;
    return fg_now_ns() >= *end ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FG_EXPORT CUresult cuCtxSynchronize(void)
{
    NEED_INIT();
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t end = c->null_end_ns;
    int capturing = 0;
    pthread_mutex_lock(&g_mu);
    for (struct CUstream_st *s = g_streams; s; s = s->next) {
        if (s->ctx == c && s->end_ns > end) end = s->end_ns;
        if (s->ctx == c && s->capture) {
            s->cap_invalid = 1; /* a context-wide wait would include captured work */
            capturing = 1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    sleep_until(end);
    pools_observe(0, c);
    pools_trim_dev(c->dev, 1, 0);
    return CUDA_SUCCESS;
}

/* g_mu held: a new node at the end of graph g (NULL when out of host memory). */
static struct CUgraphNode_st *graph_add_node(struct CUgraph_st *g, int type, int dev, uint64_t dptr, uint64_t size)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    *n = (struct CUgraphNode_st){GNODE_MAGIC, type, dev, dptr, size, 0, NULL, NULL};
    if (g->last) g->last->next = n;
    else g->nodes = n;
    g->last = n;
    g->nnodes++;
    return n;
}

/* Pushes `ns` of simulated work (`kernels` kernels) on a stream: into the stream's graph while
 * it captures, otherwise onto the card's timeline. Kernels on one card run one after another:
 * each starts at the later of now, the stream's previous work and the card's clock (shared by
 * every process on the card). */
static CUresult stream_push(CUstream s, uint64_t ns, unsigned kernels)
{
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if (atomic_load(&g_ncaptures)) {
        if (!is_default_stream(s)) {
            pthread_mutex_lock(&g_mu);
            struct CUgraph_st *g = s->capture;
            int lost = 0;
            if (g) {
                g->work_ns += ns;
                g->nkernels += kernels;
                if (kernels) lost = !graph_add_node(g, CU_GRAPH_NODE_TYPE_KERNEL, c->dev, 0, 0);
            }
            pthread_mutex_unlock(&g_mu);
            if (g) return lost ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
        } else if (s != STREAM_PER_THREAD && (r = capture_legacy_use(c, 1)) != CUDA_SUCCESS) {
            return r;
        }
    }
    if (!ns) return CUDA_SUCCESS;
    fg_world *w = fg_get();
    _Atomic uint64_t *clk = (_Atomic uint64_t *)&w->sh->cards[w->slot[card_of(c->dev)]].clock_ns;
    uint64_t now = fg_now_ns(), old = atomic_load(clk), start, fin;
    do {
        start = now > old ? now : old;
        if (*end > start) start = *end;
        fin = start + ns;
    } while (!atomic_compare_exchange_weak(clk, &old, fin));
    *end = fin;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    (void)shmem; (void)params; (void)extra;
    NEED_INIT();
    call_cost(COST_LAUNCH);
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024) return CUDA_ERROR_INVALID_VALUE;
    return stream_push(s, g_kernel_ns, 1);
}
FG_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                       unsigned bz, unsigned shmem, CUstream s, void **params, void **extra)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s ? s : STREAM_PER_THREAD, params, extra);
}
/* issue 8: the other launch entry points, on the same simulated timeline */
FG_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    return cuLaunchKernel(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
                          c->sharedMemBytes, c->hStream, params, extra);
}
FG_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra)
{
    return cuLaunchKernelEx(c, f, params, extra);
}
FG_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                             unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL);
}
FG_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                                  unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params)
{
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, NULL);
}

FG_EXPORT CUresult cuEventCreate(CUevent *pe, unsigned int flags)
{
    (void)flags;
    NEED_INIT();
    if (!pe) return CUDA_ERROR_INVALID_VALUE;
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUevent_st *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = EVENT_MAGIC;
    *pe = e;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventRecord(CUevent e, CUstream s)
{
    NEED_INIT();
    call_cost(COST_EVENT_RECORD);
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if (atomic_load(&g_ncaptures)) {
        int captured = 0;
        if (!is_default_stream(s)) {
            pthread_mutex_lock(&g_mu);
            captured = s->capture != NULL;
            pthread_mutex_unlock(&g_mu);
        } else if (s != STREAM_PER_THREAD && (r = capture_legacy_use(c, 1)) != CUDA_SUCCESS) {
            return r;
        }
        if (captured) { /* a node of the graph: it fires when the graph runs, not now */
            e->captured = 1;
            e->recorded = 1;
            return CUDA_SUCCESS;
        }
    }
    uint64_t now = fg_now_ns();
    e->ts = *end > now ? *end : now;
    e->recorded = 1;
    e->captured = 0;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s ? s : STREAM_PER_THREAD); }

FG_EXPORT CUresult cuEventSynchronize(CUevent e)
{
    NEED_INIT();
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (e->captured) return CUDA_ERROR_CAPTURED_EVENT;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    if (e->recorded) sleep_until(e->ts);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuEventQuery(CUevent e)
{
    NEED_INIT();
    call_cost(COST_EVENT_QUERY);
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (e->captured) return CUDA_ERROR_CAPTURED_EVENT;
    CUresult cr = capture_unsafe_call();
    if (cr != CUDA_SUCCESS) return cr;
    return !e->recorded || fg_now_ns() >= e->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

FG_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    NEED_INIT();
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || a->magic != EVENT_MAGIC || b->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    if (a->captured || b->captured) return CUDA_ERROR_CAPTURED_EVENT;
    uint64_t now = fg_now_ns();
    if (now < a->ts || now < b->ts) return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(b->ts - a->ts)) / 1e6);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime(ms, a, b); }

FG_EXPORT CUresult cuEventDestroy_v2(CUevent e)
{
    NEED_INIT();
    if (!e || e->magic != EVENT_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0;
    free(e);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

/* ---- stream capture and graphs (CUDA driver API; rules at capture_unsafe_call) --------
 * The fake captures into streams made with cuStreamCreate only (not the default streams).
 * A graph is the simulated time of the kernels captured into it; cuGraphLaunch runs that
 * time on the card's timeline as one piece of work. */
static CUresult begin_capture(CUstream s, int mode)
{
    NEED_INIT();
    if (is_default_stream(s)) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    pthread_mutex_lock(&g_mu);
    if (s->capture) {
        pthread_mutex_unlock(&g_mu);
        free(g);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    s->capture = g;
    s->cap_mode = mode;
    s->cap_thread = pthread_self();
    s->cap_invalid = 0;
    atomic_fetch_add(&g_ncaptures, 1);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamBeginCapture(CUstream s) { return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
FG_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) { return begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL); }
FG_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) { return begin_capture(s, (int)mode); }
FG_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) { return begin_capture(s, (int)mode); }

FG_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *pg)
{
    NEED_INIT();
    if (!pg) return CUDA_ERROR_INVALID_VALUE;
    if (is_default_stream(s) || s->magic != STREAM_MAGIC) return CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_lock(&g_mu);
    struct CUgraph_st *g = s->capture;
    if (!g) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    if (s->cap_mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(s->cap_thread, pthread_self())) {
        pthread_mutex_unlock(&g_mu);
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    int invalid = s->cap_invalid;
    s->capture = NULL;
    s->cap_invalid = 0;
    atomic_fetch_sub(&g_ncaptures, 1);
    pthread_mutex_unlock(&g_mu);
    if (invalid) {
        graph_free_nodes(g);
        free(g);
        *pg = NULL;
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    *pg = g;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *pg) { return cuStreamEndCapture(s, pg); }

FG_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *st)
{
    NEED_INIT();
    if (!st) return CUDA_ERROR_INVALID_VALUE;
    *st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (is_default_stream(s)) {
        struct CUctx_st *c = cur_ctx();
        if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
        return s == STREAM_PER_THREAD ? CUDA_SUCCESS : capture_legacy_use(c, 0);
    }
    if (s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!atomic_load(&g_ncaptures)) return CUDA_SUCCESS; /* no capture anywhere in the process */
    pthread_mutex_lock(&g_mu);
    if (s->capture) *st = s->cap_invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st)
{
    return cuStreamIsCapturing(s ? s : STREAM_PER_THREAD, st);
}

/* CUDA driver API, cuStreamGetCtx / cuStreamGetDevice: a created stream's context (its
 * device); for NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD the calling thread's current
 * context. */
FG_EXPORT CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx)
{
    NEED_INIT();
    call_cost(COST_STREAM_DEVICE);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r == CUDA_SUCCESS) *pctx = c;
    return r;
}
FG_EXPORT CUresult cuStreamGetDevice(CUstream s, CUdevice *dev)
{
    NEED_INIT();
    call_cost(COST_STREAM_DEVICE);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r == CUDA_SUCCESS) *dev = c->dev;
    return r;
}
FG_EXPORT CUresult cuStreamGetDevice_ptsz(CUstream s, CUdevice *dev)
{
    return cuStreamGetDevice(s ? s : STREAM_PER_THREAD, dev);
}

FG_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (!mode || (int)*mode < CU_STREAM_CAPTURE_MODE_GLOBAL || (int)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = t_capture_mode;
    t_capture_mode = (int)*mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphCreate(CUgraph *pg, unsigned int flags)
{
    NEED_INIT();
    if (!pg || flags) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = GRAPH_MAGIC;
    *pg = g;
    return CUDA_SUCCESS;
}

static void graph_free_nodes(struct CUgraph_st *g)
{
    for (struct CUgraphNode_st *n = g->nodes, *next; n; n = next) {
        next = n->next;
        if (n->child) { /* a child graph node's embedded graph goes with it */
            graph_free_nodes(n->child);
            n->child->magic = 0;
            free(n->child);
        }
        n->magic = 0;
        free(n);
    }
    g->nodes = g->last = NULL;
    g->nnodes = 0;
}

FG_EXPORT CUresult cuGraphDestroy(CUgraph g)
{
    NEED_INIT();
    if (!g || g->magic != GRAPH_MAGIC || g->owned) return CUDA_ERROR_INVALID_VALUE;
    g->magic = 0;
    graph_free_nodes(g);
    free(g);
    return CUDA_SUCCESS;
}

static int graph_ok(CUgraph g) { return g && g->magic == GRAPH_MAGIC; }
static int node_ok(CUgraphNode n) { return n && n->magic == GNODE_MAGIC; }

FG_EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *num)
{
    NEED_INIT();
    if (!graph_ok(g) || !num) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    if (nodes) { /* as the driver: up to *num handles, NULL after the last, *num = how many there are */
        size_t i = 0;
        for (struct CUgraphNode_st *n = g->nodes; n && i < *num; n = n->next) nodes[i++] = n;
        for (; i < *num; i++) nodes[i] = NULL;
    }
    *num = g->nnodes;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType *type)
{
    NEED_INIT();
    if (!node_ok(n) || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = (CUgraphNodeType)n->type;
    return CUDA_SUCCESS;
}

/* cuGraphAddMemAllocNode: the address is given now (params->dptr) and stays the node's; no
 * memory is taken until an executable graph made from it is launched or uploaded. */
FG_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    (void)deps;
    NEED_INIT();
    if (!pn || !graph_ok(g) || g->owned || !params || !params->bytesize || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    const CUmemPoolProps *pp = &params->poolProps;
    if (pp->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || pp->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(pp->location.id)) return CUDA_ERROR_INVALID_DEVICE;
    uint64_t dptr = va_take(params->bytesize);
    pthread_mutex_lock(&g_mu);
    struct CUgraphNode_st *n = graph_add_node(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, pp->location.id, dptr, params->bytesize);
    pthread_mutex_unlock(&g_mu);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    params->dptr = dptr;
    *pn = n;
    return CUDA_SUCCESS;
}

/* g_mu held: a free node in g for dptr, which must be an allocation node of g not yet freed
 * in it (the fake does not free one graph's allocation in another graph). */
static CUresult graph_free_node(struct CUgraph_st *g, uint64_t dptr, CUgraphNode *pn)
{
    struct CUgraphNode_st *a = g->nodes;
    while (a && !(a->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && a->dptr == dptr && !a->freed)) a = a->next;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = graph_add_node(g, CU_GRAPH_NODE_TYPE_MEM_FREE, a->dev, dptr, a->size);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    a->freed = 1;
    if (pn) *pn = n;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUdeviceptr dptr)
{
    (void)deps;
    NEED_INIT();
    if (!pn || !graph_ok(g) || g->owned || (ndeps && !deps)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = graph_free_node(g, dptr, pn);
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS *out)
{
    NEED_INIT();
    if (!node_ok(n) || !out || n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    memset(out, 0, sizeof *out);
    out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    out->poolProps.location.id = n->dev;
    out->bytesize = n->size;
    out->dptr = n->dptr;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphMemFreeNodeGetParams(CUgraphNode n, CUdeviceptr *dptr)
{
    NEED_INIT();
    if (!node_ok(n) || !dptr || n->type != CU_GRAPH_NODE_TYPE_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *dptr = n->dptr;
    return CUDA_SUCCESS;
}

/* ---- child graph nodes (cuGraphAddChildGraphNode, cuGraphAddNode with a graph) -------- */
/* g_mu held: whether g or a graph nested in it has a memory allocation or free node. */
static int graph_has_mem_nodes(const struct CUgraph_st *g)
{
    for (const struct CUgraphNode_st *n = g->nodes; n; n = n->next)
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->type == CU_GRAPH_NODE_TYPE_MEM_FREE ||
            (n->child && graph_has_mem_nodes(n->child)))
            return 1;
    return 0;
}

/* g_mu held: a copy of g (child graphs copied too), or NULL when out of host memory. */
static struct CUgraph_st *graph_clone(const struct CUgraph_st *g)
{
    struct CUgraph_st *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    *c = (struct CUgraph_st){GRAPH_MAGIC, g->work_ns, g->nkernels, NULL, NULL, 0, 0};
    for (const struct CUgraphNode_st *n = g->nodes; n; n = n->next) {
        struct CUgraphNode_st *m = graph_add_node(c, n->type, n->dev, n->dptr, n->size);
        if (m && n->child && !(m->child = graph_clone(n->child))) m = NULL;
        if (!m) {
            graph_free_nodes(c);
            free(c);
            return NULL;
        }
        m->freed = n->freed;
        if (m->child) m->child->owned = 1;
    }
    return c;
}

#define FG_CHILD_GRAPH_OWNERSHIP_CLONE 0 /* CUgraphChildGraphNodeOwnership */
#define FG_CHILD_GRAPH_OWNERSHIP_MOVE 1
/* A child graph node in g embedding child: cloned (no memory nodes allowed in it), or, MOVE,
 * the child itself, memory nodes allowed (CUDA_CHILD_GRAPH_NODE_PARAMS). */
static CUresult add_child_graph_node(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     CUgraph child, int ownership)
{
    NEED_INIT();
    if (!pn || !graph_ok(g) || !graph_ok(child) || child == g || child->owned || (ndeps && !deps))
        return CUDA_ERROR_INVALID_VALUE;
    if (ownership != FG_CHILD_GRAPH_OWNERSHIP_CLONE && ownership != FG_CHILD_GRAPH_OWNERSHIP_MOVE)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct CUgraph_st *embedded = child;
    if (ownership == FG_CHILD_GRAPH_OWNERSHIP_CLONE) {
        if (graph_has_mem_nodes(child)) r = CUDA_ERROR_INVALID_VALUE;
        else if (!(embedded = graph_clone(child))) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct CUgraphNode_st *n = NULL;
    if (r == CUDA_SUCCESS && !(n = graph_add_node(g, CU_GRAPH_NODE_TYPE_GRAPH, 0, 0, 0))) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        if (embedded != child) {
            graph_free_nodes(embedded);
            free(embedded);
        }
    }
    if (n) {
        n->child = embedded;
        embedded->owned = 1;
        *pn = n;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuGraphAddChildGraphNode(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
    return add_child_graph_node(pn, g, deps, ndeps, child, FG_CHILD_GRAPH_OWNERSHIP_CLONE);
}

/* CUgraphNodeParams (CUDA 12.2): the node's type, then a union of each type's parameters at
 * offset 16; 256 bytes. The fake makes child graph nodes only. */
typedef struct {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        struct { CUgraph graph; int ownership; } graph; /* CUDA_CHILD_GRAPH_NODE_PARAMS */
    };
    long long reserved2;
} fg_graph_node_params;
_Static_assert(sizeof(fg_graph_node_params) == 256, "CUgraphNodeParams is 256 bytes");

FG_EXPORT CUresult cuGraphAddNode(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, size_t ndeps, fg_graph_node_params *p)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (p->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_NOT_SUPPORTED; /* not modelled */
    return add_child_graph_node(pn, g, deps, ndeps, p->graph.graph, p->graph.ownership);
}
FG_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *pn, CUgraph g, const CUgraphNode *deps, const void *edge_data,
                                     size_t ndeps, fg_graph_node_params *p)
{
    (void)edge_data;
    return cuGraphAddNode(pn, g, deps, ndeps, p);
}

/* The node's embedded graph itself, not a copy (it stays the node's). */
FG_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode n, CUgraph *pg)
{
    NEED_INIT();
    if (!node_ok(n) || !pg || n->type != CU_GRAPH_NODE_TYPE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *pg = n->child;
    return CUDA_SUCCESS;
}

/* g_mu held: adds g's allocation nodes (child graphs' included, each rounded up to the
 * granularity) to mem[], its kernels' time to e, and the nodes g does not free to e->esc.
 * -1 when out of host memory. */
static int graph_sum(const struct CUgraph_st *g, struct CUgraphExec_st *e)
{
    e->work_ns += g->work_ns;
    e->nkernels += g->nkernels;
    for (const struct CUgraphNode_st *n = g->nodes; n; n = n->next) {
        if (n->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
            uint64_t bytes = (n->size + GRAN - 1) / GRAN * GRAN;
            e->mem[n->dev] += bytes;
            if (!n->freed) {
                if (e->nesc == e->cap_esc) {
                    size_t cap = e->cap_esc ? 2 * e->cap_esc : 4;
                    struct gexec_esc *a = realloc(e->esc, cap * sizeof *a);
                    if (!a) return -1;
                    e->esc = a;
                    e->cap_esc = cap;
                }
                e->esc[e->nesc++] = (struct gexec_esc){n->dptr, bytes, n->dev};
            }
        }
        if (n->child && graph_sum(n->child, e) != 0) return -1;
    }
    return 0;
}

/* g_mu held: the graph memory of device d in use: mapped executable graphs' memory, and live
 * allocations outside a mapped owner (their owner trimmed or destroyed). */
static uint64_t graph_used(int d)
{
    uint64_t u = 0;
    for (const struct CUgraphExec_st *e = g_execs; e; e = e->next)
        if (e->reserved) u += e->mem[d];
    for (const struct graph_live *a = g_graph_live; a; a = a->next)
        if (a->dev == d && !(a->owner && a->owner->reserved)) u += a->bytes;
    return u;
}

static void graph_highs(int d)
{
    uint64_t u = graph_used(d);
    if (u > g_graph_used_high[d]) g_graph_used_high[d] = u;
    if (g_graph_reserved[d] > g_graph_reserved_high[d]) g_graph_reserved_high[d] = g_graph_reserved[d];
}

/* g_mu held: map the executable graph's memory on its cards (all or nothing): the pool's
 * unused reserve serves first, the rest grows the reserve (taken from the card). */
static CUresult gexec_reserve(struct CUgraphExec_st *e)
{
    if (e->reserved) return CUDA_SUCCESS;
    uint64_t grow[FG_MAX_CARDS] = {0};
    for (int d = 0; d < g_nvis; d++) {
        if (!e->mem[d]) continue;
        uint64_t held = 0; /* its live allocations, in use already: its mapping covers them */
        for (const struct graph_live *a = g_graph_live; a; a = a->next)
            if (a->owner == e && a->dev == d) held += a->bytes;
        uint64_t used = graph_used(d) + (e->mem[d] > held ? e->mem[d] - held : 0);
        grow[d] = used > g_graph_reserved[d] ? used - g_graph_reserved[d] : 0;
        if (!grow[d] || fg_charge(card_of(d), grow[d]) == 0) continue;
        while (--d >= 0)
            if (grow[d]) fg_uncharge(card_of(d), grow[d]);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->reserved = 1;
    for (int d = 0; d < g_nvis; d++) {
        g_graph_reserved[d] += grow[d];
        graph_highs(d);
    }
    return CUDA_SUCCESS;
}

/* g_mu held: a launch of e leaves its escaping allocations live (one already live stays). */
static void gexec_leave_live(struct CUgraphExec_st *e)
{
    for (size_t i = 0; i < e->nesc; i++) {
        struct graph_live *a = g_graph_live;
        while (a && a->dptr != e->esc[i].dptr) a = a->next;
        if (a || !(a = calloc(1, sizeof *a))) continue;
        *a = (struct graph_live){e->esc[i].dptr, e->esc[i].bytes, e->esc[i].dev, e, g_graph_live};
        g_graph_live = a;
    }
    for (int d = 0; d < g_nvis; d++) graph_highs(d);
}

/* g_mu held: frees the live graph allocation at ptr (cuMemFree, cuMemFreeAsync): its memory
 * stays in the pool, unused (a mapped owner keeps it mapped). 0, or -1 when ptr is none. */
static int graph_live_free(uint64_t ptr)
{
    for (struct graph_live **pp = &g_graph_live; *pp; pp = &(*pp)->next)
        if ((*pp)->dptr == ptr) {
            struct graph_live *a = *pp;
            *pp = a->next;
            free(a);
            return 0;
        }
    return -1;
}

/* g_mu held: the device's unused graph memory goes back to the card. */
static void graph_pool_trim(int d)
{
    uint64_t used = graph_used(d);
    if (g_graph_reserved[d] <= used) return;
    fg_uncharge(card_of(d), g_graph_reserved[d] - used);
    g_graph_reserved[d] = used;
}

/* Launches (or, work_ns 0, uploads) e on s: its memory first, then its work on the timeline. */
static CUresult gexec_run(struct CUgraphExec_st *e, CUstream s, int launch)
{
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&g_mu);
    r = gexec_reserve(e);
    pthread_mutex_unlock(&g_mu);
    if (r != CUDA_SUCCESS || !launch) return r;
    r = stream_push(s, e->work_ns, e->nkernels);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&g_mu);
        if (*end > e->end_ns) e->end_ns = *end;
        gexec_leave_live(e);
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

static CUresult instantiate(CUgraphExec *pe, CUgraph g)
{
    NEED_INIT();
    if (!pe || !graph_ok(g) || g->owned) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = GEXEC_MAGIC;
    pthread_mutex_lock(&g_mu);
    if (graph_sum(g, e) != 0) {
        pthread_mutex_unlock(&g_mu);
        free(e->esc);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    e->next = g_execs;
    g_execs = e;
    pthread_mutex_unlock(&g_mu);
    *pe = e;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *pe, CUgraph g, unsigned long long flags)
{
    (void)flags;
    return instantiate(pe, g);
}
/* CUDA 10/11 form: (exec, graph, error node, log buffer, its size) */
FG_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *pe, CUgraph g, void *err_node, char *log, size_t n)
{
    (void)err_node;
    if (log && n) log[0] = 0;
    return cuGraphInstantiateWithFlags(pe, g, 0);
}
FG_EXPORT CUresult cuGraphInstantiate(CUgraphExec *pe, CUgraph g, void *err_node, char *log, size_t n)
{
    return cuGraphInstantiate_v2(pe, g, err_node, log, n);
}

FG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e);
/* CUDA 12 form: CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD uploads into params->hUploadStream, which
 * reserves the graph's memory now (out of memory: no executable graph is made). */
FG_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (!params) return atomic_load(&g_inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    params->hErrNode_out = NULL;
    params->result_out = 0; /* CUDA_GRAPH_INSTANTIATE_SUCCESS */
    CUresult r = instantiate(pe, g);
    if (r != CUDA_SUCCESS || !(params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD)) return r;
    r = gexec_run(*pe, params->hUploadStream, 0);
    if (r != CUDA_SUCCESS) {
        cuGraphExecDestroy(*pe);
        *pe = NULL;
    }
    return r;
}
FG_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *pe, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (params && !params->hUploadStream) params->hUploadStream = STREAM_PER_THREAD;
    return cuGraphInstantiateWithParams(pe, g, params);
}

FG_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e)
{
    NEED_INIT();
    if (!e || e->magic != GEXEC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    /* its live allocations stay (the driver keeps them until they are freed); the rest of its
     * mapping goes back to the card (a simplification: the driver keeps it reserved until a
     * trim) */
    uint64_t before[FG_MAX_CARDS];
    for (int d = 0; d < g_nvis; d++) before[d] = graph_used(d);
    for (struct graph_live *a = g_graph_live; a; a = a->next)
        if (a->owner == e) a->owner = NULL;
    e->reserved = 0;
    for (struct CUgraphExec_st **pp = &g_execs; *pp; pp = &(*pp)->next)
        if (*pp == e) {
            *pp = e->next;
            break;
        }
    for (int d = 0; d < g_nvis; d++) {
        uint64_t back = before[d] - graph_used(d);
        fg_uncharge(card_of(d), back);
        g_graph_reserved[d] -= back;
    }
    e->magic = 0;
    pthread_mutex_unlock(&g_mu);
    free(e->esc);
    free(e);
    return CUDA_SUCCESS;
}

/* FAKEGPU_GRAPH_LAUNCH_MEET=N (tests): each cuGraphLaunch waits in the driver until N launches
 * are in it together (each N-th arrival completes a group), at most
 * FAKEGPU_GRAPH_LAUNCH_MEET_MS (default 5000); still short of N by then, it answers
 * CUDA_ERROR_TIMEOUT and launches nothing. A lock that an interposer holds across the call
 * keeps the second launch out, so the first times out. */
static int g_meet_n, g_meet_ms;
static unsigned long long g_meet_in; /* under g_meet_mu */
static int g_meet_waiting;           /* under g_meet_mu: launches waiting for their group */
static pthread_mutex_t g_meet_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_meet_cv = PTHREAD_COND_INITIALIZER;

static void meet_init(void)
{
    const char *n = getenv("FAKEGPU_GRAPH_LAUNCH_MEET"), *ms = getenv("FAKEGPU_GRAPH_LAUNCH_MEET_MS");
    g_meet_n = n ? atoi(n) : 0;
    g_meet_ms = ms && *ms ? atoi(ms) : 5000;
}

static CUresult graph_launch_meet(void)
{
    if (g_meet_n < 2) return CUDA_SUCCESS;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += g_meet_ms / 1000;
    until.tv_nsec += (long)(g_meet_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_meet_mu);
    unsigned long long group_end = (g_meet_in / (unsigned)g_meet_n + 1) * (unsigned)g_meet_n;
    g_meet_in++;
    pthread_cond_broadcast(&g_meet_cv);
    int rc = 0;
    g_meet_waiting++;
    while (g_meet_in < group_end && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g_meet_cv, &g_meet_mu, &until);
    g_meet_waiting--;
    int met = g_meet_in >= group_end;
    if (!met) g_meet_in--; /* withdrawn: the next launch starts its own group, not this one */
    pthread_mutex_unlock(&g_meet_mu);
    return met ? CUDA_SUCCESS : CUDA_ERROR_TIMEOUT;
}

/* Tests (not a driver call): how many cuGraphLaunch calls wait in the driver for their group
 * (FAKEGPU_GRAPH_LAUNCH_MEET), so that a test knows a launch is inside before it goes on. */
FG_EXPORT int fakegpu_graph_launches_waiting(void)
{
    pthread_mutex_lock(&g_meet_mu);
    int n = g_meet_waiting;
    pthread_mutex_unlock(&g_meet_mu);
    return n;
}

FG_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s)
{
    NEED_INIT();
    call_cost(COST_LAUNCH);
    if (!e || e->magic != GEXEC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = graph_launch_meet();
    return r != CUDA_SUCCESS ? r : gexec_run(e, s, 1);
}
FG_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s ? s : STREAM_PER_THREAD); }

FG_EXPORT CUresult cuGraphUpload(CUgraphExec e, CUstream s)
{
    NEED_INIT();
    if (!e || e->magic != GEXEC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
    return gexec_run(e, s, 0);
}
FG_EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec e, CUstream s) { return cuGraphUpload(e, s ? s : STREAM_PER_THREAD); }

/* Unmaps every executable graph on the device whose launches have all finished on the
 * simulated timeline (they map it again at their next launch), then gives the pool's unused
 * reserve back to the card; live allocations (not freed yet) are in use and stay. */
FG_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    uint64_t now = fg_now_ns();
    pthread_mutex_lock(&g_mu);
    for (struct CUgraphExec_st *e = g_execs; e; e = e->next)
        if (e->reserved && e->mem[dev] && e->end_ns <= now) e->reserved = 0;
    graph_pool_trim(dev);
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* The fake reuses no memory between a graph's allocations: used is what mapped executable
 * graphs and live allocations outside them hold; reserved adds the pool's unused memory. */
FG_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value)
{
    NEED_INIT();
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = graph_used(dev); break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *(cuuint64_t *)value = g_graph_reserved[dev]; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = g_graph_used_high[dev]; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *(cuuint64_t *)value = g_graph_reserved_high[dev]; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ---- memory pools and stream-ordered allocation ------------------------------------- */
static int pool_ok(CUmemoryPool p) { return p && p->magic == POOL_MAGIC && p->alive; }

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool p, CUstream s)
{
    NEED_INIT();
    if (!dptr || !size) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if (!p) p = g_cur_pool[c->dev];
    if (!pool_ok(p)) return CUDA_ERROR_INVALID_VALUE;
    if (atomic_load(&g_ncaptures) && !is_default_stream(s)) {
        /* captured: an allocation node of the stream's graph, its address now, its memory
         * the executable graph's (programming guide, "Graph Memory Nodes", stream capture).
         * The fake's graph memory is device memory: a host pool's allocation is not captured. */
        pthread_mutex_lock(&g_mu);
        struct CUgraph_st *g = s->capture;
        if (g && p->dev < 0) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
        uint64_t ptr = g ? va_take(size) : 0;
        struct CUgraphNode_st *n = g ? graph_add_node(g, CU_GRAPH_NODE_TYPE_MEM_ALLOC, p->dev, ptr, size) : NULL;
        pthread_mutex_unlock(&g_mu);
        if (g) {
            if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
            *dptr = ptr;
            return CUDA_SUCCESS;
        }
    }
    static int delay_us = -1; /* FAKEGPU_POOL_ALLOC_DELAY_US: widen race windows in tests */
    if (delay_us < 0) { const char *e = getenv("FAKEGPU_POOL_ALLOC_DELAY_US"); delay_us = e ? atoi(e) : 0; }
    if (delay_us > 0) usleep((useconds_t)delay_us);
    pthread_mutex_lock(&g_mu);
    uint64_t key = stream_key(s, c), served = pool_cache_serve(p, key, size, 0);
    if (served < size) { /* what the cache cannot serve grows the pool */
        uint64_t grow = (size - served + GRAN - 1) / GRAN * GRAN;
        if (pool_charge(p, grow) != 0) {
            pthread_mutex_unlock(&g_mu);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        p->reserved += grow;
        if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
    }
    pool_cache_serve(p, key, size, 1);
    p->used += size;
    if (p->used > p->used_high) p->used_high = p->used;
    pthread_mutex_unlock(&g_mu);
    uint64_t ptr = va_take(size);
    tab_put(ptr, size, p->dev, K_POOL, p);
    *dptr = ptr;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *d, size_t n, CUstream s) { return pool_alloc(d, n, NULL, s); }
FG_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *d, size_t n, CUstream s) { return pool_alloc(d, n, NULL, s); }
FG_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    if (!p) return atomic_load(&g_inited) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    return pool_alloc(d, n, p, s);
}
FG_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *d, size_t n, CUmemoryPool p, CUstream s)
{
    return cuMemAllocFromPoolAsync(d, n, p, s);
}

FG_EXPORT CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream s)
{
    NEED_INIT();
    struct CUctx_st *c;
    uint64_t *end;
    CUresult r = stream_end(s, &c, &end);
    if (r != CUDA_SUCCESS) return r;
    if (atomic_load(&g_ncaptures) && !is_default_stream(s)) {
        /* captured, a free becomes a free node of the stream's graph and must name an
         * allocation node of that graph (anything else is refused; nothing is freed) */
        pthread_mutex_lock(&g_mu);
        struct CUgraph_st *g = s->capture;
        r = g ? graph_free_node(g, ptr, NULL) : CUDA_SUCCESS;
        pthread_mutex_unlock(&g_mu);
        if (g) return r;
    }
    alloc_ent e;
    if (tab_take(ptr, K_POOL, &e) != 0) {
        if (tab_take(ptr, K_DEV, &e) != 0) {
            /* a graph allocation left live: back to the graph memory pool, unused (the fake
             * frees it at the call, not when the stream reaches it) */
            pthread_mutex_lock(&g_mu);
            int found = graph_live_free(ptr) == 0;
            pthread_mutex_unlock(&g_mu);
            return found ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
        }
        /* cuMemAlloc'd (or managed) memory freed stream-ordered */
        if (!(e.kind == K_MANAGED && managed_host())) fg_uncharge(card_of(e.dev), e.size);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_mu);
    pool_put_back(e.pool, e.size, 1, stream_key(s, c), c, *end); /* back to the pool's cache: still reserved */
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr ptr, CUstream s) { return cuMemFreeAsync(ptr, s); }

/* CUDA driver API, cuMemPoolCreate: a pool on a device (CU_MEM_LOCATION_TYPE_DEVICE, id the
 * device), or (CUDA 12.2+) in host memory: CU_MEM_LOCATION_TYPE_HOST (id ignored; not IPC
 * capable: handleTypes must be 0) or CU_MEM_LOCATION_TYPE_HOST_NUMA (id a host NUMA node; the
 * fake does not check the host's nodes, only that it is not negative). HOST_NUMA_CURRENT, or
 * any other type, is CUDA_ERROR_INVALID_VALUE. A device pool is accessible from its device, a
 * host pool from the host CPU only until cuMemPoolSetAccess. */
FG_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pp, const CUmemPoolProps *props)
{
    NEED_INIT();
    if (!pp || !props) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    switch (props->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        if (!dev_ok(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        dev = props->location.id;
        break;
    case CU_MEM_LOCATION_TYPE_HOST:
        if (props->handleTypes != CU_MEM_HANDLE_TYPE_NONE) return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
        if (props->location.id < 0) return CUDA_ERROR_INVALID_VALUE;
        break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    struct CUmemPoolHandle_st *p = calloc(1, sizeof *p);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    p->magic = POOL_MAGIC;
    p->dev = dev;
    if (dev >= 0) p->access[dev] = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    p->alive = 1;
    p->reuse_follow = p->reuse_opportunistic = p->reuse_internal = 1;
    pthread_mutex_lock(&g_mu);
    p->next = g_pools;
    g_pools = p;
    pthread_mutex_unlock(&g_mu);
    *pp = p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool p)
{
    NEED_INIT();
    if (!pool_ok(p) || (p->dev >= 0 && p == &g_default_pool[p->dev])) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    /* CUDA driver API, cuMemPoolDestroy: with allocations outstanding it returns at once and
     * the pool's memory goes when the last of them is freed (pool_put_back) */
    p->alive = 0;
    pool_frees_drop(p);
    if (!p->used) {
        pool_uncharge(p, p->reserved);
        p->reserved = 0;
    }
    for (int d = 0; d < g_nvis; d++)
        if (g_cur_pool[d] == p) g_cur_pool[d] = &g_default_pool[d];
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool p, size_t keep)
{
    NEED_INIT();
    if (!pool_ok(p)) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t k = keep, used_r = (p->used + GRAN - 1) / GRAN * GRAN;
    if (k < used_r) k = used_r;
    if (p->reserved > k) {
        pool_uncharge(p, p->reserved - k);
        p->reserved = k;
        pool_frees_clamp(p);
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    NEED_INIT();
    if (!pool_ok(p) || !v) return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: p->threshold = *(cuuint64_t *)v; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: p->reserved_high = 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: p->used_high = 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: p->reuse_follow = *(int *)v != 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: p->reuse_opportunistic = *(int *)v != 0; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: p->reuse_internal = *(int *)v != 0; return CUDA_SUCCESS;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

FG_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool p, CUmemPool_attribute a, void *v)
{
    NEED_INIT();
    if (!pool_ok(p) || !v) return CUDA_ERROR_INVALID_VALUE;
    cuuint64_t *o = v;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    switch (a) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *o = p->threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *o = p->reserved; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *o = p->reserved_high; break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *o = p->used; break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *o = p->used_high; break;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: *(int *)v = p->reuse_follow; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC: *(int *)v = p->reuse_opportunistic; break;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)v = p->reuse_internal; break;
    default: r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* CUDA driver API, cuMemPoolSetAccess: which devices may access the pool's memory (each
 * descriptor a device and CU_MEM_ACCESS_FLAGS_PROT_*). Access takes no memory: a host pool made
 * accessible to a device stays host memory. A device pool's own device keeps read-write
 * access. */
static int access_flags_ok(int f)
{
    return f == CU_MEM_ACCESS_FLAGS_PROT_NONE || f == CU_MEM_ACCESS_FLAGS_PROT_READ || f == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

FG_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool p, const CUmemAccessDesc *map, size_t count)
{
    NEED_INIT();
    if (!pool_ok(p) || !map || !count) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++) {
        if (map[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !access_flags_ok(map[i].flags))
            return CUDA_ERROR_INVALID_VALUE;
        if (!dev_ok(map[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
        if (map[i].location.id == p->dev && map[i].flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < count; i++) p->access[map[i].location.id] = map[i].flags;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* CUDA driver API, cuMemPoolGetAccess: the access of a location to the pool; the host's to a
 * host pool is read-write, to a device pool none. */
FG_EXPORT CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool p, CUmemLocation *loc)
{
    NEED_INIT();
    if (!pool_ok(p) || !flags || !loc) return CUDA_ERROR_INVALID_VALUE;
    if (loc->type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!dev_ok(loc->id)) return CUDA_ERROR_INVALID_DEVICE;
        pthread_mutex_lock(&g_mu);
        *flags = (CUmemAccess_flags)p->access[loc->id];
        pthread_mutex_unlock(&g_mu);
        return CUDA_SUCCESS;
    }
    if (loc->type != CU_MEM_LOCATION_TYPE_HOST && loc->type != CU_MEM_LOCATION_TYPE_HOST_NUMA) return CUDA_ERROR_INVALID_VALUE;
    *flags = p->dev < 0 ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pp, CUdevice d)
{
    NEED_INIT();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    *pp = &g_default_pool[d];
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pp, CUdevice d)
{
    NEED_INIT();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    *pp = g_cur_pool[d];
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuDeviceSetMemPool(CUdevice d, CUmemoryPool p)
{
    NEED_INIT();
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (!pool_ok(p) || p->dev != d) return CUDA_ERROR_INVALID_VALUE;
    g_cur_pool[d] = p;
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ------------------------------------------------------ */
static int loc_is_host(CUmemLocationType t)
{
    return t == CU_MEM_LOCATION_TYPE_HOST || t == CU_MEM_LOCATION_TYPE_HOST_NUMA || t == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
}

FG_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o)
{
    (void)o;
    NEED_INIT();
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = GRAN;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    NEED_INIT();
    if (!h || !prop || flags || !size || size % GRAN || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    int dev = -1;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        if (!dev_ok(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
        dev = prop->location.id;
    } else if (!loc_is_host(prop->location.type)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (dev >= 0 && fg_charge(card_of(dev), size) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    vmm_handle *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    *v = (vmm_handle){.magic = VMM_MAGIC, .dev = dev, .size = size, .prop = *prop, .refs = 1, .x_fd = -1};
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

/* g_mu held: frees the allocation once it has no handle and no mapping left. */
static void vmm_maybe_free_locked(vmm_handle *v)
{
    if (v->refs > 0 || v->nmaps > 0) return;
    if (v->x) { /* shared: the memory goes with its last holder in any process */
        if (atomic_fetch_sub(&v->x->holders, 1) == 1) fg_uncharge_owner(v->x->owner, v->x->card, v->x->size);
        munmap(v->x, sizeof *v->x);
        if (v->x_fd >= 0) close(v->x_fd);
    } else if (v->dev >= 0 && !v->imported) {
        fg_uncharge(card_of(v->dev), v->size);
    }
    v->magic = 0;
    for (int i = 0; i < v->mc_nbinds; i++) { /* a multicast object goes: its bindings too */
        v->mc_binds[i].mem->nmaps--;
        vmm_maybe_free_locked(v->mc_binds[i].mem);
    }
    free(v);
}

static vmm_handle *vmm_live(CUmemGenericAllocationHandle h)
{
    vmm_handle *v = (vmm_handle *)(uintptr_t)h;
    return v && v->magic == VMM_MAGIC && v->refs > 0 ? v : NULL;
}

FG_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    vmm_handle *v = vmm_live(h);
    if (v) {
        v->refs--;
        vmm_maybe_free_locked(v); /* still mapped: the memory stays until the last unmap */
    }
    pthread_mutex_unlock(&g_mu);
    return v ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FG_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    vmm_handle *v = vmm_live(h);
    if (!prop || !v) return CUDA_ERROR_INVALID_VALUE;
    *prop = v->prop;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags)
{
    (void)align; (void)addr;
    NEED_INIT();
    if (!ptr || !size || size % GRAN || flags) return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = va_take(size);
    tab_put(p, size, -1, K_RESERVE, NULL);
    *ptr = p;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    alloc_ent e;
    if (tab_take(ptr, K_RESERVE, &e) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (e.size != size) { tab_put(e.ptr, e.size, e.dev, e.kind, NULL); return CUDA_ERROR_INVALID_VALUE; }
    return CUDA_SUCCESS;
}

/* Mappings (K_MAP entries), a plain list under g_mu: few per process. */
static alloc_ent *g_maps;

/* g_mu held: the mapping that covers address a, or NULL. */
static alloc_ent *map_at_locked(uint64_t a, uint64_t *start)
{
    for (alloc_ent *e = g_maps; e; e = e->next)
        if (a >= e->ptr && a - e->ptr < e->size) { *start = e->ptr; return e; }
    return NULL;
}

FG_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags)
{
    NEED_INIT();
    if (!ptr || !size || flags || ptr % GRAN || size % GRAN || offset % GRAN) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    vmm_handle *v = vmm_live(h);
    uint64_t st;
    CUresult r = CUDA_SUCCESS;
    if (!v || offset > v->size || size > v->size - offset) r = CUDA_ERROR_INVALID_VALUE;
    else if (v->multicast && v->mc_ndevs < v->mc_want) r = CUDA_ERROR_INVALID_VALUE; /* devices first */
    else if (map_at_locked(ptr, &st) || map_at_locked(ptr + size - 1, &st)) r = CUDA_ERROR_INVALID_VALUE; /* already mapped */
    else v->nmaps++;
    pthread_mutex_unlock(&g_mu);
    if (r != CUDA_SUCCESS) return r;
    alloc_ent *e = malloc(sizeof *e);
    if (!e) abort();
    *e = (alloc_ent){ptr, size, v->dev, K_MAP, NULL, NULL, NULL, v};
    pthread_mutex_lock(&g_mu);
    e->next = g_maps;
    g_maps = e;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

/* As the driver: the range must be whole mappings (one or several contiguous ones); an
 * allocation whose handles are all released is freed with its last mapping. */
FG_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    if (!ptr || !size || size % GRAN) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t a = ptr, end = ptr + size, st;
    CUresult r = CUDA_SUCCESS;
    while (a < end) { /* validate first: all or nothing */
        alloc_ent *e = map_at_locked(a, &st);
        if (!e || st != a || e->size > end - a) { r = CUDA_ERROR_INVALID_VALUE; break; }
        a += e->size;
    }
    for (a = ptr; r == CUDA_SUCCESS && a < end;) {
        alloc_ent **pp = &g_maps;
        while ((*pp)->ptr != a) pp = &(*pp)->next;
        alloc_ent *e = *pp;
        *pp = e->next;
        a += e->size;
        e->vmm->nmaps--;
        vmm_maybe_free_locked(e->vmm);
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* A new reference to the allocation mapped at addr (released with cuMemRelease). */
FG_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    NEED_INIT();
    if (!h || !addr) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t st;
    alloc_ent *e = map_at_locked((uint64_t)(uintptr_t)addr, &st);
    if (e) {
        e->vmm->refs++;
        *h = (CUmemGenericAllocationHandle)(uintptr_t)e->vmm;
    }
    pthread_mutex_unlock(&g_mu);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Shareable handles (POSIX file descriptor only): the descriptor is a memfd holding the
 * allocation's shared record; each export opens it anew (another open file, as the driver's
 * exports are). An import is a new handle to the same physical memory: it costs the card
 * nothing more, and keeps the memory (the exporter's charge, on its row) until the last
 * holder in any process lets go. What the fake does not do: an open descriptor alone does not
 * keep the memory (the driver's does), and a dead exporter's row is reclaimed with its charge. */
/* ---- multicast objects (CUDA driver API, "Multicast Object Management"), on the cards the
 * config marks `multicast = 1` (NVSwitch); elsewhere CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED is
 * 0 and every call answers CUDA_ERROR_NOT_SUPPORTED. A multicast object is a VMM handle with no
 * memory of its own (dev -1, nothing charged): each device binds cuMemCreate memory to it
 * (cuMulticastBindMem/BindAddr), which the binding keeps alive, like a mapping, until it is
 * unbound or the object is freed (its handles released, its mappings unmapped). It maps once
 * every device is added. */
#define MC_GRAN_RECOMMENDED (512 * MIB)

static int multicast_anywhere(void)
{
    fg_world *w = fg_get();
    for (int d = 0; d < g_nvis; d++)
        if (w->card[card_of(d)].multicast) return 1;
    return 0;
}

static vmm_handle *mc_live(CUmemGenericAllocationHandle h)
{
    vmm_handle *v = vmm_live(h);
    return v && v->multicast ? v : NULL;
}

FG_EXPORT CUresult cuMulticastGetGranularity(size_t *g, const CUmulticastObjectProp *prop, CUmulticastGranularity_flags option)
{
    NEED_INIT();
    if (!multicast_anywhere()) return CUDA_ERROR_NOT_SUPPORTED;
    if (!g || !prop || (option != CU_MULTICAST_GRANULARITY_MINIMUM && option != CU_MULTICAST_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *g = option == CU_MULTICAST_GRANULARITY_RECOMMENDED ? MC_GRAN_RECOMMENDED : GRAN;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop)
{
    NEED_INIT();
    if (!multicast_anywhere()) return CUDA_ERROR_NOT_SUPPORTED;
    if (!mc || !prop || !prop->numDevices || prop->numDevices > (unsigned)g_nvis || !prop->size || prop->size % GRAN ||
        prop->flags)
        return CUDA_ERROR_INVALID_VALUE;
    vmm_handle *v = calloc(1, sizeof *v);
    if (!v) return CUDA_ERROR_OUT_OF_MEMORY;
    v->magic = VMM_MAGIC;
    v->dev = -1;
    v->size = prop->size;
    v->refs = 1;
    v->multicast = 1;
    v->mc_want = (int)prop->numDevices;
    *mc = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (!fg_get()->card[card_of(dev)].multicast) return CUDA_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&g_mu);
    vmm_handle *v = mc_live(mc);
    CUresult r = v && v->mc_ndevs < v->mc_want ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; r == CUDA_SUCCESS && i < v->mc_ndevs; i++)
        if (v->mc_devs[i] == dev) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) v->mc_devs[v->mc_ndevs++] = dev;
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* g_mu held: bind `size` bytes of m from mem_offset at mc_offset of v. */
static CUresult mc_bind_locked(vmm_handle *v, size_t mc_offset, vmm_handle *m, uint64_t mem_offset, size_t size)
{
    if (!v || !m || m->multicast || m->dev < 0 || !size || size % GRAN || mc_offset % GRAN || mem_offset % GRAN ||
        mem_offset > m->size || size > m->size - mem_offset || mc_offset > v->size || size > v->size - mc_offset)
        return CUDA_ERROR_INVALID_VALUE;
    if (v->mc_ndevs < v->mc_want) return CUDA_ERROR_INVALID_VALUE; /* every device first */
    int member = 0;
    for (int i = 0; i < v->mc_ndevs; i++) member |= v->mc_devs[i] == m->dev;
    if (!member || v->mc_nbinds >= (int)(sizeof v->mc_binds / sizeof v->mc_binds[0])) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < v->mc_nbinds; i++) { /* a device's ranges do not overlap */
        mc_binding *b = &v->mc_binds[i];
        if (b->mem->dev == m->dev && mc_offset < b->mc_offset + b->size && b->mc_offset < mc_offset + size)
            return CUDA_ERROR_INVALID_VALUE;
    }
    v->mc_binds[v->mc_nbinds++] = (mc_binding){m, mc_offset, size};
    m->nmaps++; /* bound memory stays while bound */
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset, CUmemGenericAllocationHandle mem,
                                      size_t mem_offset, size_t size, unsigned long long flags)
{
    NEED_INIT();
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = mc_bind_locked(mc_live(mc), mc_offset, vmm_live(mem), mem_offset, size);
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr memptr, size_t size,
                                       unsigned long long flags)
{
    NEED_INIT();
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uint64_t start = 0;
    alloc_ent *e = map_at_locked(memptr, &start);
    CUresult r = e ? mc_bind_locked(mc_live(mc), mc_offset, e->vmm, memptr - start, size) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    vmm_handle *v = mc_live(mc);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; v && i < v->mc_nbinds; i++) {
        mc_binding b = v->mc_binds[i];
        if (b.mem->dev != dev || b.mc_offset != mc_offset || b.size != size) continue;
        v->mc_binds[i] = v->mc_binds[--v->mc_nbinds];
        b.mem->nmaps--;
        vmm_maybe_free_locked(b.mem);
        r = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

FG_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type, unsigned long long flags)
{
    NEED_INIT();
    vmm_handle *v = vmm_live(h);
    if (!out || !v || flags) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(v->prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!v->x) { /* the first export: the shared record, held by this handle */
        int xfd = memfd_create("fakegpu-vmm", MFD_CLOEXEC);
        vmm_export *x = MAP_FAILED;
        if (xfd >= 0 && ftruncate(xfd, sizeof *x) == 0)
            x = mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED, xfd, 0);
        if (x == MAP_FAILED) {
            if (xfd >= 0) close(xfd);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *x = (vmm_export){VMM_MAGIC, v->dev, v->dev >= 0 ? card_of(v->dev) : -1, v->size, v->prop, fg_get()->token, 1};
            v->x = x;
            v->x_fd = xfd;
        }
    }
    int fd = -1;
    if (r == CUDA_SUCCESS) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", v->x_fd);
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS) *(int *)out = fd;
    return r;
}

FG_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle, CUmemAllocationHandleType type)
{
    NEED_INIT();
    if (!h || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size != (off_t)sizeof(vmm_export)) return CUDA_ERROR_INVALID_VALUE;
    char path[64]; /* the record is written through a description of our own: fd may be read-only */
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int xfd = open(path, O_RDWR | O_CLOEXEC);
    vmm_export *x = xfd < 0 ? MAP_FAILED : mmap(NULL, sizeof *x, PROT_READ | PROT_WRITE, MAP_SHARED, xfd, 0);
    if (x == MAP_FAILED) {
        if (xfd >= 0) close(xfd);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int n = x->magic == VMM_MAGIC ? atomic_load(&x->holders) : 0;
    while (n > 0 && !atomic_compare_exchange_weak(&x->holders, &n, n + 1)) {
    }
    vmm_handle *v = n > 0 ? calloc(1, sizeof *v) : NULL;
    if (!v) { /* freed already (see above), or no memory for the handle */
        if (n > 0) atomic_fetch_sub(&x->holders, 1);
        munmap(x, sizeof *x);
        close(xfd);
        return n > 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
    }
    *v = (vmm_handle){.magic = VMM_MAGIC, .dev = x->dev, .size = x->size, .prop = x->prop, .refs = 1, .imported = 1,
                      .x = x, .x_fd = xfd}; /* (kept to export it again) */
    *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    NEED_INIT();
    if (!ptr || !size || !desc || !count) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type == CU_MEM_LOCATION_TYPE_DEVICE && !dev_ok(desc[i].location.id)) return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;
}

/* ---- arrays ------------------------------------------------------------------------- */
static unsigned fmt_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

/* UINT64_MAX when the size does not fit in 64 bits: such an array is refused (INVALID_VALUE). */
static uint64_t arr_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch, unsigned flags)
{
    uint64_t row, bytes, depth = d ? d : 1;
    if ((flags & CUDA_ARRAY3D_CUBEMAP) && !(flags & CUDA_ARRAY3D_LAYERED)) depth = 6;
    if (__builtin_mul_overflow((uint64_t)w, (uint64_t)fmt_bytes(f) * (ch ? ch : 1), &row) || row > UINT64_MAX - 511 ||
        __builtin_mul_overflow((row + 511) / 512 * 512, (uint64_t)(h ? h : 1), &bytes) ||
        __builtin_mul_overflow(bytes, depth, &bytes))
        return UINT64_MAX;
    return bytes;
}

static CUresult arr_new(void **out, uint64_t bytes, int valid)
{
    NEED_INIT();
    if (!out || !valid || bytes == UINT64_MAX) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *c = cur_ctx();
    if (!ctx_ok(c)) return CUDA_ERROR_INVALID_CONTEXT;
    if (fg_charge(card_of(c->dev), bytes) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    arr_handle *a = calloc(1, sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    *a = (arr_handle){ARR_MAGIC, c->dev, bytes, c};
    tab_put((uint64_t)(uintptr_t)a, bytes, c->dev, K_ARR, NULL);
    *out = a;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)
{
    return arr_new((void **)a, d ? arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 0) : 0,
                   d && d->Width && (d->NumChannels == 1 || d->NumChannels == 2 || d->NumChannels == 4));
}
FG_EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    return arr_new((void **)a, d ? arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 0) : 0,
                   d && d->Width && (d->NumChannels == 1 || d->NumChannels == 2 || d->NumChannels == 4));
}
FG_EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    return arr_new((void **)a, d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0,
                   d && d->Width && (d->NumChannels == 1 || d->NumChannels == 2 || d->NumChannels == 4));
}
FG_EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    return arr_new((void **)a, d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0,
                   d && d->Width && (d->NumChannels == 1 || d->NumChannels == 2 || d->NumChannels == 4));
}

static CUresult arr_free(void *h)
{
    NEED_INIT();
    arr_handle *a = h;
    alloc_ent e;
    if (!a || tab_take((uint64_t)(uintptr_t)a, K_ARR, &e) != 0 || a->magic != ARR_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    fg_uncharge(card_of(a->dev), a->bytes);
    a->magic = 0;
    free(a);
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuArrayDestroy(CUarray a) { return arr_free(a); }

FG_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *m, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    uint64_t total = 0;
    if (d && levels) {
        size_t w = d->Width, h = d->Height, z = d->Depth;
        for (unsigned l = 0; l < levels; l++) {
            uint64_t lv = arr_bytes(w, h, z, d->Format, d->NumChannels, d->Flags);
            total = lv == UINT64_MAX || total > UINT64_MAX - 1 - lv ? UINT64_MAX : total + lv;
            w = w > 1 ? w / 2 : 1;
            h = h > 1 ? h / 2 : h;
            if (!(d->Flags & CUDA_ARRAY3D_LAYERED)) z = z > 1 ? z / 2 : z;
        }
    }
    return arr_new((void **)m, total, d && d->Width && levels);
}
FG_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray m) { return arr_free(m); }

/* ---- modules, functions and copies (issue 25: numba-cuda, cuda.core) -----------------
 * The fake keeps no device bytes and runs no code: a module (cuModuleLoadData*, cuLibrary
 * LoadData) is accepted when its image is non-empty and names functions by any name; a copy
 * checks that its device range lies inside one live allocation and moves nothing (a copy to
 * the host leaves the host buffer as it was); a memset checks its range likewise. What the
 * fake only pretends to do is listed in docs/interposer.md ("Real clients"). */
#define MOD_MAGIC 0x4d4f4431u
#define FUNC_MAGIC 0x46554e43u
struct CUmod_st { uint32_t magic; int alive; int library; };
struct CUfunc_st { uint32_t magic; struct CUmod_st *mod; };
typedef struct CUmod_st *CUmodule;
typedef struct CUmod_st *CUlibrary;
typedef struct CUfunc_st *CUkernel;

/* Whether [p, p + n) lies inside one live device allocation (device, managed, pool or a
 * mapped VMM range). A scan of the whole table: copies are rare next to launches. */
static int dev_range_ok(uint64_t p, uint64_t n)
{
    int ok = 0;
    pthread_mutex_lock(&g_mu);
    for (unsigned b = 0; b < NBUCKET && !ok; b++)
        for (alloc_ent *e = g_tab[b]; e; e = e->next)
            if ((e->kind == K_DEV || e->kind == K_MANAGED || e->kind == K_POOL || e->kind == K_MAP) &&
                p >= e->ptr && p - e->ptr <= e->size && n <= e->size - (p - e->ptr)) {
                ok = 1;
                break;
            }
    pthread_mutex_unlock(&g_mu);
    return ok;
}

static CUresult copy_check(uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n)
{
    NEED_INIT();
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    if (!n) return CUDA_SUCCESS;
    if ((dst_dev && !dev_range_ok(dst, n)) || (src_dev && !dev_range_ok(src, n)) ||
        (!dst_dev && !dst) || (!src_dev && !src))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult copy_async(uint64_t dst, int dst_dev, uint64_t src, int src_dev, size_t n, CUstream s)
{
    CUresult r = copy_check(dst, dst_dev, src, src_dev, n);
    return r != CUDA_SUCCESS ? r : stream_push(s, 0, 0);
}

FG_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *h, size_t n) { return copy_check(d, 1, (uint64_t)(uintptr_t)h, 0, n); }
FG_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr d, const void *h, size_t n) { return cuMemcpyHtoD_v2(d, h, n); }
FG_EXPORT CUresult cuMemcpyDtoH_v2(void *h, CUdeviceptr d, size_t n) { return copy_check((uint64_t)(uintptr_t)h, 0, d, 1, n); }
FG_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *h, CUdeviceptr d, size_t n) { return cuMemcpyDtoH_v2(h, d, n); }
FG_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr a, CUdeviceptr b, size_t n) { return copy_check(a, 1, b, 1, n); }
FG_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr a, CUdeviceptr b, size_t n) { return cuMemcpyDtoD_v2(a, b, n); }
FG_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *h, size_t n, CUstream s) { return copy_async(d, 1, (uint64_t)(uintptr_t)h, 0, n, s); }
FG_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr d, const void *h, size_t n, CUstream s) { return cuMemcpyHtoDAsync_v2(d, h, n, s ? s : STREAM_PER_THREAD); }
FG_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *h, CUdeviceptr d, size_t n, CUstream s) { return copy_async((uint64_t)(uintptr_t)h, 0, d, 1, n, s); }
FG_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *h, CUdeviceptr d, size_t n, CUstream s) { return cuMemcpyDtoHAsync_v2(h, d, n, s ? s : STREAM_PER_THREAD); }
FG_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { return copy_async(a, 1, b, 1, n, s); }
FG_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr a, CUdeviceptr b, size_t n, CUstream s) { return cuMemcpyDtoDAsync_v2(a, b, n, s ? s : STREAM_PER_THREAD); }
FG_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { (void)v; return copy_check(d, 1, 1, 0, n); }
FG_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
FG_EXPORT CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { (void)v; return copy_async(d, 1, 1, 0, n, s); }
FG_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return cuMemsetD8Async(d, v, n, s ? s : STREAM_PER_THREAD); }

static CUresult mod_new(struct CUmod_st **out, const void *image, int library)
{
    NEED_INIT();
    if (!out || !image) return CUDA_ERROR_INVALID_VALUE;
    if (!library && !ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    if (!*(const unsigned char *)image) return CUDA_ERROR_INVALID_IMAGE;
    struct CUmod_st *m = calloc(1, sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *m = (struct CUmod_st){MOD_MAGIC, 1, library};
    *out = m;
    return CUDA_SUCCESS;
}
static int mod_ok(const struct CUmod_st *m, int library) { return m && m->magic == MOD_MAGIC && m->alive && m->library == library; }
static CUresult func_new(struct CUfunc_st **out, struct CUmod_st *m, const char *name, int library)
{
    NEED_INIT();
    if (!out || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!mod_ok(m, library)) return CUDA_ERROR_INVALID_HANDLE;
    struct CUfunc_st *f = calloc(1, sizeof *f);
    if (!f) return CUDA_ERROR_OUT_OF_MEMORY;
    *f = (struct CUfunc_st){FUNC_MAGIC, m};
    *out = f;
    return CUDA_SUCCESS;
}
static CUresult mod_unload(struct CUmod_st *m, int library)
{
    NEED_INIT();
    if (!mod_ok(m, library)) return CUDA_ERROR_INVALID_HANDLE;
    m->alive = 0; /* functions keep pointing at it: never freed */
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) { return mod_new(m, image, 0); }
FG_EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, void *opts, void **vals)
{
    (void)n; (void)opts; (void)vals;
    return mod_new(m, image, 0);
}
FG_EXPORT CUresult cuModuleLoadFatBinary(CUmodule *m, const void *image) { return mod_new(m, image, 0); }
FG_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) { return func_new(f, m, name, 0); }
FG_EXPORT CUresult cuModuleUnload(CUmodule m) { return mod_unload(m, 0); }
FG_EXPORT CUresult cuLibraryLoadData(CUlibrary *l, const void *code, void *jo, void **jv, unsigned nj, void *lo,
                                     void **lv, unsigned nl)
{
    (void)jo; (void)jv; (void)nj; (void)lo; (void)lv; (void)nl;
    return mod_new(l, code, 1);
}
FG_EXPORT CUresult cuLibraryGetKernel(CUkernel *k, CUlibrary l, const char *name) { return func_new(k, l, name, 1); }
FG_EXPORT CUresult cuLibraryUnload(CUlibrary l) { return mod_unload(l, 1); }
FG_EXPORT CUresult cuLibraryGetModule(CUmodule *m, CUlibrary l)
{
    NEED_INIT();
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    if (!mod_ok(l, 1)) return CUDA_ERROR_INVALID_HANDLE;
    struct CUmod_st *mod = calloc(1, sizeof *mod); /* the library's module: lives as long */
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    *mod = (struct CUmod_st){MOD_MAGIC, 1, 0};
    *m = mod;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuKernelGetFunction(CUfunction *f, CUkernel k)
{
    NEED_INIT();
    if (!f) return CUDA_ERROR_INVALID_VALUE;
    if (!k || k->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_ok(cur_ctx())) return CUDA_ERROR_INVALID_CONTEXT;
    *f = k;
    return CUDA_SUCCESS;
}

/* CUfunction_attribute values: a small kernel as the driver reports it on an sm_90 card. */
static CUresult func_attr(int *v, int attr, const struct CUfunc_st *f)
{
    NEED_INIT();
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    if (!f || f->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    static const int values[] = {
        1024, /* MAX_THREADS_PER_BLOCK */ 0, /* SHARED_SIZE_BYTES */ 0, /* CONST_SIZE_BYTES */
        0, /* LOCAL_SIZE_BYTES */ 16, /* NUM_REGS */ 90, /* PTX_VERSION */ 90, /* BINARY_VERSION */
        0, /* CACHE_MODE_CA */ 48 * 1024, /* MAX_DYNAMIC_SHARED_SIZE_BYTES */ -1, /* PREFERRED_SHARED_MEMORY_CARVEOUT */
    };
    if (attr < 0 || attr > 15) return CUDA_ERROR_INVALID_VALUE;
    *v = attr < (int)(sizeof values / sizeof values[0]) ? values[attr] : 0;
    return CUDA_SUCCESS;
}
FG_EXPORT CUresult cuFuncGetAttribute(int *v, int attr, CUfunction f) { return func_attr(v, attr, f); }
FG_EXPORT CUresult cuKernelGetAttribute(int *v, int attr, CUkernel k, CUdevice d)
{
    if (atomic_load(&g_inited) && !dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    return func_attr(v, attr, k);
}
FG_EXPORT CUresult cuKernelSetAttribute(int attr, int v, CUkernel k, CUdevice d)
{
    (void)v;
    NEED_INIT();
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    if (!k || k->magic != FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    return attr >= 0 && attr <= 15 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
FG_EXPORT CUresult cuKernelSetCacheConfig(CUkernel k, int config, CUdevice d)
{
    (void)config;
    NEED_INIT();
    if (!dev_ok(d)) return CUDA_ERROR_INVALID_DEVICE;
    return k && k->magic == FUNC_MAGIC ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

/* ---- entry-point lookup ------------------------------------------------------------- */
FG_EXPORT CUresult cuGetExportTable(const void **table, const CUuuid *id)
{
    (void)id;
    if (table) *table = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

typedef struct { const char *base; int ver; const char *sym; void *fn; const char *ptsym; void *ptfn; } fg_proc_ent;
extern const fg_proc_ent fg_procs[];
extern const int fg_nprocs;

static CUresult lookup(const char *symbol, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    const fg_proc_ent *best = NULL;
    int known = 0;
    for (int i = 0; i < fg_nprocs; i++) {
        if (strcmp(fg_procs[i].base, symbol) != 0) continue;
        known = 1;
        if (fg_procs[i].ver <= ver && (!best || fg_procs[i].ver > best->ver)) best = &fg_procs[i];
    }
    if (!best) {
        if (st) *st = known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    *pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) ? best->ptfn : best->fn;
    if (st) *st = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
}

FG_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
    return lookup(symbol, pfn, ver, flags, NULL);
}

FG_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    return lookup(symbol, pfn, ver, flags, st);
}

/* Functions the fake does not model resolve to stubs (stubs.c, generated) that say so. */
CUresult fg_not_supported(void);
CUresult fg_not_supported(void) { return atomic_load(&g_inited) ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; }
