/* hooks_mem.c: the charged CUDA entry points and the capacity views.
 *
 * Every charged path: find the card (from the current context, or from the allocation's
 * properties for VMM), charge the bytes against the container's cap in the shared region
 * BEFORE calling the driver (so two processes cannot both pass the check), call the driver,
 * give the charge back if the driver fails, and remember what was charged so that the free
 * gives back exactly that. Over the cap: CUDA_ERROR_OUT_OF_MEMORY. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "egpu_log.h"
#include "egpu_state.h"
#include "capture.h" /* FC-15 fallbacks beside a graph capture */
#include "compute.h" /* compute gate (issue 8): egpu_compute_setup */

egpu_state egpu_g = {
    .real_once = PTHREAD_ONCE_INIT,
    .nvml_once = PTHREAD_ONCE_INIT,
    .cfg_once = PTHREAD_ONCE_INIT,
    .dev_mu = PTHREAD_MUTEX_INITIALIZER,
    .map = {.mu = PTHREAD_MUTEX_INITIALIZER},
    .pool_mu = PTHREAD_MUTEX_INITIALIZER,
    .vmm_mu = PTHREAD_MUTEX_INITIALIZER,
};
#define S (&egpu_g)
#define R (egpu_g.real)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- config and region ------------------------------------------------------------- */
static void atfork_child(void) { egpu_acct_forget(&egpu_g.acct); }

static void cfg_init(void)
{
    egpu_state *s = S;
    char err[400];
    if (egpu_config_load(&s->cfg, err, sizeof err) != 0) {
        snprintf(s->why, sizeof s->why, "%s", err);
        s->refused = 1;
    } else if (egpu_acct_open(&s->acct, s->cfg.container_region, err, sizeof err) != 0) {
        snprintf(s->why, sizeof s->why, "accounting region unavailable: %s", err);
        s->refused = 1;
    } else {
        pthread_atfork(NULL, NULL, atfork_child);
        EGPU_INFO("share from %s, region %s", s->cfg.source == EGPU_SRC_FILE ? "config file" : "environment",
                  s->cfg.container_region);
    }
    if (s->refused) EGPU_ERR("CUDA is refused in this process: %s", s->why);
}

int egpu_config_ready(void)
{
    pthread_once(&S->cfg_once, cfg_init);
    return S->refused ? -1 : 0;
}

__attribute__((destructor)) static void egpu_fini(void)
{
    /* The driver frees everything a process held when it exits; so do we. */
    if (S->acct.r) egpu_acct_detach(&S->acct);
}

static int real_ready(void)
{
    pthread_once(&S->real_once, egpu_real_init);
    return S->real_ok;
}

/* ---- devices: CUDA ordinal -> card UUID -> region slot and cap ---------------------- */
static void fmt_uuid(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* 1 when the device table is built (needs cuInit to have succeeded), else 0. */
static int devs_ready(void)
{
    if (atomic_load_explicit((_Atomic int *)&S->devs_ready, memory_order_acquire)) return 1;
    if (egpu_config_ready() != 0 || !real_ready()) return 0;
    pthread_mutex_lock(&S->dev_mu);
    int n = 0;
    if (!S->devs_ready && R.cuDeviceGetCount(&n) == CUDA_SUCCESS) {
        if (n > EGPU_MAX_DEVS) n = EGPU_MAX_DEVS;
        for (int i = 0; i < n; i++) {
            egpu_dev *d = &S->dev[i];
            CUdevice dev = 0;
            CUuuid u;
            size_t total = 0;
            d->slot = -1;
            if (R.cuDeviceGet(&dev, i) != CUDA_SUCCESS || R.cuDeviceGetUuid(&u, dev) != CUDA_SUCCESS ||
                !R.cuDeviceTotalMem_v2 || R.cuDeviceTotalMem_v2(&total, dev) != CUDA_SUCCESS) {
                EGPU_ERR("cannot identify CUDA device %d; it gets no memory", i);
                continue;
            }
            fmt_uuid(&u, d->uuid, sizeof d->uuid);
            d->phys_total = total;
            uint64_t cap = egpu_config_limit(&S->cfg, d->uuid, total);
            d->limit = cap < total ? cap : total;
            /* issue 8, FC-15: an oversubscribed share may be booked beyond the card; the
             * excess is served from managed memory (call_alloc_v2) */
            if (S->cfg.oversubscription) d->limit = cap;
            if (cap == 0) EGPU_WARN("device %d (%s) is not part of this share: no memory on it", i, d->uuid);
            else d->slot = egpu_acct_card(&S->acct, d->uuid, d->limit);
            EGPU_INFO("device %d = %s, cap %llu MiB", i, d->uuid, (unsigned long long)(d->limit >> 20));
        }
        S->ndev = n;
        atomic_store_explicit((_Atomic int *)&S->devs_ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&S->dev_mu);
    return S->devs_ready;
}

static void maybe_reap(void)
{
    uint64_t t = now_ns();
    if (t - S->last_reap_ns > 50 * 1000000ull) {
        S->last_reap_ns = t;
        egpu_acct_reap(&S->acct);
    }
}

static void pools_refresh(int only_dev);

/* Charge bytes on CUDA device dev. CUDA_SUCCESS, OUT_OF_MEMORY, or the refusal code. */
static CUresult charge(int dev, uint64_t bytes)
{
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!devs_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= S->ndev) return CUDA_ERROR_INVALID_DEVICE;
    egpu_dev *d = &S->dev[dev];
    if (d->slot < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (egpu_acct_charge(&S->acct, d->slot, bytes, d->limit) == 0) return CUDA_SUCCESS;
    /* Memory our pools cache may have been released at a synchronisation: look again. */
    pools_refresh(dev);
    if (egpu_acct_charge(&S->acct, d->slot, bytes, d->limit) == 0) return CUDA_SUCCESS;
    EGPU_DBG("out of memory on device %d: %llu bytes asked, cap %llu", dev, (unsigned long long)bytes,
             (unsigned long long)d->limit);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static void uncharge(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < S->ndev && S->dev[dev].slot >= 0) egpu_acct_uncharge(&S->acct, S->dev[dev].slot, bytes);
}

static void force(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < S->ndev && S->dev[dev].slot >= 0) egpu_acct_force(&S->acct, S->dev[dev].slot, bytes);
}

static CUresult cur_dev(int *dev)
{
    CUdevice d = 0;
    CUresult r = R.cuCtxGetDevice(&d);
    *dev = d;
    return r;
}

/* The calling thread's current context (0 when none or unknown): allocations made in it are
 * freed by the driver when it is destroyed. */
static uint64_t cur_ctx_key(void)
{
    CUcontext c = NULL;
    if (!R.cuCtxGetCurrent || R.cuCtxGetCurrent(&c) != CUDA_SUCCESS) return 0;
    return (uint64_t)(uintptr_t)c;
}

#define REAL_OR_UNSUPPORTED(fn) do { if (!real_ready() || !R.fn) return real_ready() ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; } while (0)

/* ---- cuInit ------------------------------------------------------------------------- */
CUresult cuInit(unsigned int flags)
{
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!real_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = R.cuInit(flags);
    if (r == CUDA_SUCCESS && devs_ready()) egpu_compute_setup(); /* issue 8: compute gate */
    return r;
}

/* ---- linear allocations ------------------------------------------------------------- */
/* An allocation call: the driver call, its key in *key_out, and in *aux_out what the map
 * entry must remember besides (0, or PTR_MANAGED_FALLBACK). */
typedef CUresult (*alloc_call)(void *ctx, uint64_t *key_out, uint64_t *aux_out);

/* The common charged path: reserve `bytes` on the current device, run the driver call,
 * remember (kind, key) -> bytes. */
static CUresult charged_alloc(int dev, uint64_t bytes, int kind, alloc_call call, void *ctx)
{
    CUresult r = charge(dev, bytes);
    if (r != CUDA_SUCCESS) return r;
    uint64_t key = 0, aux = 0;
    r = call(ctx, &key, &aux);
    if (r != CUDA_SUCCESS) {
        uncharge(dev, bytes);
        return r;
    }
    egpu_map_ent e = {key, bytes, aux, kind == MAP_CTX ? 0 : cur_ctx_key(), dev, kind};
    egpu_map_put_ent(&S->map, &e);
    return CUDA_SUCCESS;
}

static CUresult charged_free(int kind, uint64_t key, CUresult (*call)(void *), void *ctx)
{
    egpu_map_ent e;
    int had = egpu_map_take_ent(&S->map, kind, key, &e) == 0;
    CUresult r = call(ctx);
    if (r != CUDA_SUCCESS) {
        if (had) egpu_map_put_ent(&S->map, &e);
        return r;
    }
    if (had) uncharge(e.dev, e.bytes);
    return r;
}

/* The driver frees the memory made in a context when the context is destroyed (cuCtxDestroy,
 * or the primary context's last release / reset): give back what it held. */
static void ctx_gone(uint64_t ctx)
{
    if (!ctx) return;
    egpu_map_ent *v = NULL;
    size_t n = egpu_map_take_ctx(&S->map, ctx, &v);
    for (size_t i = 0; i < n; i++) uncharge(v[i].dev, v[i].bytes);
    free(v);
}

/* ---- FC-15: managed memory for an oversubscribed share ------------------------------
 * For a share with memory_oversubscription, what the card cannot hold comes from managed
 * memory (cuMemAllocManaged, CU_MEM_ATTACH_GLOBAL): the excess lives in host memory and
 * migrates on touch. Every fallback is made only AFTER the share's cap was charged for it,
 * so nothing is ever allocated beyond the cap; the charge is exactly what was allocated. Such
 * pointers are MAP_PTR entries with aux = PTR_MANAGED_FALLBACK: cuMemFree gives the charge
 * back, and a stream-ordered free (cuMemFreeAsync) synchronises the stream, then frees. */
#define PTR_MANAGED_FALLBACK 1ull
static int strm_capturing(CUstream s, int pt) { return egpu_stream_capturing(R.cuStreamIsCapturing, egpu_stream_of(s, pt)); }

/* The managed allocation itself (the cap already charged by the caller). The driver's
 * answer was out-of-memory: that stays the answer when managed memory cannot be had. */
static CUresult managed_fallback(CUdeviceptr *dptr, size_t size)
{
    if (!S->cfg.oversubscription || !R.cuMemAllocManaged || !dptr || !size) return CUDA_ERROR_OUT_OF_MEMORY;
    egpu_capture_relax cr = egpu_capture_relaxed(R.cuThreadExchangeStreamCaptureMode);
    CUdeviceptr p = 0;
    CUresult r = R.cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL);
    egpu_capture_restore(R.cuThreadExchangeStreamCaptureMode, cr);
    if (r != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    *dptr = p;
    return CUDA_SUCCESS;
}

struct a2 { CUdeviceptr *dptr; size_t size; unsigned flags; };
static CUresult call_alloc_v2(void *c, uint64_t *k, uint64_t *aux)
{
    struct a2 *a = c;
    CUresult r = R.cuMemAlloc_v2(a->dptr, a->size);
    /* issue 8, FC-15: the share's cap was charged already (charged_alloc), so what the card
     * cannot hold comes from managed memory, never beyond the cap */
    if (r == CUDA_ERROR_OUT_OF_MEMORY && S->cfg.oversubscription && managed_fallback(a->dptr, a->size) == CUDA_SUCCESS) {
        r = CUDA_SUCCESS;
        *aux = PTR_MANAGED_FALLBACK;
    }
    if (r == CUDA_SUCCESS) *k = *a->dptr;
    return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL_OR_UNSUPPORTED(cuMemAlloc_v2);
    int dev;
    if (!dptr || !bytesize || cur_dev(&dev) != CUDA_SUCCESS) return R.cuMemAlloc_v2(dptr, bytesize);
    struct a2 a = {dptr, bytesize, 0};
    return charged_alloc(dev, bytesize, MAP_PTR, call_alloc_v2, &a);
}

struct a1 { CUdeviceptr_v1 *dptr; unsigned size; };
static CUresult call_alloc_v1(void *c, uint64_t *k, uint64_t *aux)
{
    (void)aux;
    struct a1 *a = c;
    CUresult r = R.cuMemAlloc(a->dptr, a->size);
    if (r == CUDA_SUCCESS) *k = *a->dptr;
    return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    REAL_OR_UNSUPPORTED(cuMemAlloc);
    int dev;
    if (!dptr || !bytesize || cur_dev(&dev) != CUDA_SUCCESS) return R.cuMemAlloc(dptr, bytesize);
    struct a1 a = {dptr, bytesize};
    return charged_alloc(dev, bytesize, MAP_PTR, call_alloc_v1, &a);
}

static CUresult call_managed(void *c, uint64_t *k, uint64_t *aux)
{
    (void)aux;
    struct a2 *a = c;
    CUresult r = R.cuMemAllocManaged(a->dptr, a->size, a->flags);
    if (r == CUDA_SUCCESS) *k = *a->dptr;
    return r;
}

/* Managed memory is charged in full to the current device (where it lives by default). */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL_OR_UNSUPPORTED(cuMemAllocManaged);
    int dev;
    if (!dptr || !bytesize || cur_dev(&dev) != CUDA_SUCCESS) return R.cuMemAllocManaged(dptr, bytesize, flags);
    struct a2 a = {dptr, bytesize, flags};
    return charged_alloc(dev, bytesize, MAP_PTR, call_managed, &a);
}

static CUresult call_free_v2(void *c) { return R.cuMemFree_v2(*(CUdeviceptr *)c); }
CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL_OR_UNSUPPORTED(cuMemFree_v2);
    if (!dptr) return R.cuMemFree_v2(dptr);
    return charged_free(MAP_PTR, dptr, call_free_v2, &dptr);
}

static CUresult call_free_v1(void *c) { return R.cuMemFree(*(CUdeviceptr_v1 *)c); }
CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    REAL_OR_UNSUPPORTED(cuMemFree);
    if (!dptr) return R.cuMemFree(dptr);
    return charged_free(MAP_PTR, dptr, call_free_v1, &dptr);
}

/* Pitched allocations: charge an estimate (rows padded to PITCH_ALIGN bytes), then settle
 * on the pitch the driver chose. PITCH_ALIGN is the pitch alignment current drivers use for
 * cuMemAllocPitch (512 bytes); the fake GPU pads alike. A size that does not fit in 64 bits
 * is refused with CUDA_ERROR_INVALID_VALUE before the driver is called (as for arrays). */
#define PITCH_ALIGN 512ull
#define PITCH_TOO_BIG UINT64_MAX
static uint64_t pitch_of(uint64_t w) { return w > UINT64_MAX - (PITCH_ALIGN - 1) ? PITCH_TOO_BIG : (w + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN; }
static uint64_t pitch_estimate(uint64_t w, uint64_t h)
{
    uint64_t p = pitch_of(w), bytes;
    if (p == PITCH_TOO_BIG || __builtin_mul_overflow(p, h, &bytes) || bytes == PITCH_TOO_BIG) return PITCH_TOO_BIG;
    return bytes;
}

static CUresult settle_pitch(int dev, uint64_t est, uint64_t actual, uint64_t key, uint64_t aux, CUresult (*undo)(uint64_t))
{
    if (actual > est) {
        if (charge(dev, actual - est) != CUDA_SUCCESS) {
            undo(key);
            uncharge(dev, est);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else if (actual < est) {
        uncharge(dev, est - actual);
    }
    egpu_map_ent e = {key, actual, aux, cur_ctx_key(), dev, MAP_PTR};
    egpu_map_put_ent(&S->map, &e);
    return CUDA_SUCCESS;
}
static CUresult undo_v2(uint64_t k) { return R.cuMemFree_v2(k); }
static CUresult undo_v1(uint64_t k) { return R.cuMemFree((CUdeviceptr_v1)k); }

/* FC-15: the driver is out of memory and `est` bytes are charged: managed memory of
 * pitch x h with the pitch the driver would have used (the width rounded up to PITCH_ALIGN),
 * never more than the charge (pitch x h is the estimate itself; a layout that would exceed
 * it is refused). The address and the pitch must fit in `max` (the 32-bit entry point: a
 * 64-bit driver's managed memory in practice never does, and the driver's out-of-memory
 * stands). */
static CUresult pitch_fallback(uint64_t w, uint64_t h, uint64_t est, uint64_t max, CUdeviceptr *p, uint64_t *pitch)
{
    uint64_t pp = pitch_of(w), bytes;
    if (pp == PITCH_TOO_BIG || pp > max || __builtin_mul_overflow(pp, h, &bytes) || bytes > est)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (managed_fallback(p, bytes) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    if (*p > max) {
        egpu_capture_relax cr = egpu_capture_relaxed(R.cuThreadExchangeStreamCaptureMode);
        R.cuMemFree_v2(*p);
        egpu_capture_restore(R.cuThreadExchangeStreamCaptureMode, cr);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pitch = pp;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t w, size_t h, unsigned int elem)
{
    REAL_OR_UNSUPPORTED(cuMemAllocPitch_v2);
    int dev;
    if (!dptr || !pPitch || !w || !h || cur_dev(&dev) != CUDA_SUCCESS) return R.cuMemAllocPitch_v2(dptr, pPitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h), aux = 0;
    if (est == PITCH_TOO_BIG) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = charge(dev, est);
    if (r != CUDA_SUCCESS) return r;
    r = R.cuMemAllocPitch_v2(dptr, pPitch, w, h, elem);
    CUdeviceptr p = 0;
    uint64_t pitch = 0;
    if (r == CUDA_ERROR_OUT_OF_MEMORY && pitch_fallback(w, h, est, UINT64_MAX, &p, &pitch) == CUDA_SUCCESS) {
        *dptr = p;
        *pPitch = pitch;
        aux = PTR_MANAGED_FALLBACK;
        r = CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) { uncharge(dev, est); return r; }
    return settle_pitch(dev, est, (uint64_t)*pPitch * h, *dptr, aux, undo_v2);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int w, unsigned int h, unsigned int elem)
{
    REAL_OR_UNSUPPORTED(cuMemAllocPitch);
    int dev;
    if (!dptr || !pPitch || !w || !h || cur_dev(&dev) != CUDA_SUCCESS) return R.cuMemAllocPitch(dptr, pPitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h), aux = 0; /* < 2^64: both factors < 2^32 + 1 */
    CUresult r = charge(dev, est);
    if (r != CUDA_SUCCESS) return r;
    r = R.cuMemAllocPitch(dptr, pPitch, w, h, elem);
    CUdeviceptr p = 0;
    uint64_t pitch = 0;
    if (r == CUDA_ERROR_OUT_OF_MEMORY && pitch_fallback(w, h, est, UINT32_MAX, &p, &pitch) == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned)pitch;
        aux = PTR_MANAGED_FALLBACK;
        r = CUDA_SUCCESS;
    }
    if (r != CUDA_SUCCESS) { uncharge(dev, est); return r; }
    return settle_pitch(dev, est, (uint64_t)*pPitch * h, *dptr, aux, undo_v1);
}

/* ---- memory pools and stream-ordered allocation ------------------------------------
 * A pool is charged what the driver says it has reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT):
 * memory a pool keeps cached after cuMemFreeAsync still counts, until the driver releases it
 * (at a synchronisation, down to the release threshold, or cuMemPoolTrimTo). The charge is
 * brought up to date before each pool allocation, on every capacity query, and before any
 * allocation is refused. */
static egpu_pool_rec *pool_rec(CUmemoryPool pool, int dev, int create)
{
    for (int i = 0; i < S->npools; i++)
        if (S->pools[i].pool == pool) return &S->pools[i];
    if (!create || S->npools >= EGPU_MAX_POOLS) return NULL;
    egpu_pool_rec *p = &S->pools[S->npools++];
    *p = (egpu_pool_rec){pool, dev, 0, 0, 0};
    return p;
}

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a)
{
    cuuint64_t v = 0;
    if (!R.cuMemPoolGetAttribute || R.cuMemPoolGetAttribute(pool, a, &v) != CUDA_SUCCESS) return 0;
    return v;
}

/* pool_mu held: the pool's charge = its reserve + what in-flight allocations charged for
 * growth (their reserve may not show yet; dropping it would let a concurrent allocation pass
 * the cap check on memory that is about to be reserved). */
static void pool_sync_locked(egpu_pool_rec *p)
{
    uint64_t reserved = pool_attr(p->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    uint64_t target = reserved > UINT64_MAX - p->pending ? UINT64_MAX : reserved + p->pending;
    if (target > p->charged) force(p->dev, target - p->charged);
    else if (target < p->charged) uncharge(p->dev, p->charged - target);
    p->charged = target;
}

static void pools_refresh(int only_dev)
{
    if (!S->npools) return;
    pthread_mutex_lock(&S->pool_mu);
    for (int i = 0; i < S->npools; i++)
        if (only_dev < 0 || S->pools[i].dev == only_dev) pool_sync_locked(&S->pools[i]);
    pthread_mutex_unlock(&S->pool_mu);
}

/* FC-15: a stream-ordered allocation the driver could not serve, for an oversubscribed
 * share: managed memory of the same size, charged against the cap first like a cuMemAlloc
 * allocation (to the pool's device) and recorded as a plain pointer, so that cuMemFree or
 * cuMemFreeAsync of it gives the charge back. It is usable at once, so also by the stream's
 * later work. Not while the stream captures a graph: there the driver's answer stands (the
 * allocation would have to become a graph memory node). */
static CUresult stream_fallback(CUdeviceptr *dptr, size_t size, int dev, CUstream st, int pt)
{
    if (!R.cuMemAllocManaged || strm_capturing(st, pt)) return CUDA_ERROR_OUT_OF_MEMORY;
    if (charge(dev, size) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr p = 0;
    if (managed_fallback(&p, size) != CUDA_SUCCESS) {
        uncharge(dev, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    egpu_map_ent e = {p, size, PTR_MANAGED_FALLBACK, cur_ctx_key(), dev, MAP_PTR};
    egpu_map_put_ent(&S->map, &e);
    *dptr = p;
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream st, int from_pool, int pt)
{
    int dev;
    CUresult (*fn_async)(CUdeviceptr *, size_t, CUstream) = pt ? R.cuMemAllocAsync_ptsz : R.cuMemAllocAsync;
    CUresult (*fn_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) = pt ? R.cuMemAllocFromPoolAsync_ptsz : R.cuMemAllocFromPoolAsync;
#define CALL_REAL() (from_pool ? fn_pool(dptr, size, pool, st) : fn_async(dptr, size, st))
    if ((from_pool && !fn_pool) || (!from_pool && !fn_async)) return CUDA_ERROR_NOT_SUPPORTED;
    if (!dptr || !size || cur_dev(&dev) != CUDA_SUCCESS) return CALL_REAL();
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!devs_ready() || dev >= S->ndev) return CALL_REAL();
    if (!from_pool && (!R.cuDeviceGetMemPool || R.cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS)) pool = NULL;
    if (!pool || !R.cuMemPoolGetAttribute) return CALL_REAL(); /* let the driver report */
    /* Under pool_mu: what the pool's cache can serve, less what concurrent in-flight
     * allocations already count on (claims), is taken from the cache; the rest (need) is
     * charged against the cap BEFORE the driver call and kept as pending until the call has
     * returned and the charge is settled on the pool's reserve. So two threads can never
     * both count on the same cached bytes, nor both grow the pool past the cap. */
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_rec(pool, dev, 1);
    CUresult r;
    if (!p) {
        pthread_mutex_unlock(&S->pool_mu);
        EGPU_ERR("more than %d memory pools; refusing the allocation", EGPU_MAX_POOLS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    int pdev = p->dev;
    pool_sync_locked(p);
    uint64_t reserved = p->charged - p->pending;
    uint64_t used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t cached = reserved > used ? reserved - used : 0;
    cached = cached > p->claims ? cached - p->claims : 0;
    uint64_t from_cache = size < cached ? size : cached;
    uint64_t need = size - from_cache;
    p->claims += from_cache;
    if (need) {
        /* charge() may refresh pools (pool_mu) when the cap is reached: charge unlocked,
         * with the cache claim already visible to other threads */
        pthread_mutex_unlock(&S->pool_mu);
        r = charge(pdev, need);
        pthread_mutex_lock(&S->pool_mu);
        p = pool_rec(pool, pdev, 0);
        if (r != CUDA_SUCCESS || !p) {
            if (p) p->claims -= from_cache;
            pthread_mutex_unlock(&S->pool_mu);
            if (r == CUDA_SUCCESS) uncharge(pdev, need); /* the pool was destroyed meanwhile */
            return r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_VALUE;
        }
        p->charged += need;
        p->pending += need;
    }
    pthread_mutex_unlock(&S->pool_mu);
    r = CALL_REAL();
    pthread_mutex_lock(&S->pool_mu);
    p = pool_rec(pool, pdev, 0);
    if (p) {
        p->claims -= from_cache < p->claims ? from_cache : p->claims;
        p->pending -= need < p->pending ? need : p->pending;
        pool_sync_locked(p); /* settle on what the driver reserved */
    } /* else destroyed meanwhile: cuMemPoolDestroy gave back its charge, need included */
    pthread_mutex_unlock(&S->pool_mu);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && S->cfg.oversubscription) r = stream_fallback(dptr, size, pdev, st, pt);
    return r;
#undef CALL_REAL
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s) { REAL_OR_UNSUPPORTED(cuMemAllocAsync); return pool_alloc(dptr, n, NULL, s, 0, 0); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s) { REAL_OR_UNSUPPORTED(cuMemAllocAsync_ptsz); return pool_alloc(dptr, n, NULL, s, 0, 1); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s) { REAL_OR_UNSUPPORTED(cuMemAllocFromPoolAsync); return pool_alloc(dptr, n, p, s, 1, 0); }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s) { REAL_OR_UNSUPPORTED(cuMemAllocFromPoolAsync_ptsz); return pool_alloc(dptr, n, p, s, 1, 1); }

/* A stream-ordered free of pool memory leaves it cached in the pool (still charged); a
 * stream-ordered free of cuMemAlloc memory gives its charge back. FC-15: a managed fallback
 * (see stream_fallback) is not pool memory and cannot be freed in stream order: the stream
 * is synchronised first (its earlier work may still use the memory), then the memory is
 * freed with cuMemFree and its charge given back, so this free is synchronous. While the
 * stream captures a graph (a synchronisation would invalidate the capture) the driver's
 * stream-ordered free is called and its answer stands. */
struct fa { CUdeviceptr p; CUstream s; int pt; };
static CUresult call_free_async(void *c)
{
    struct fa *f = c;
    return f->pt ? R.cuMemFreeAsync_ptsz(f->p, f->s) : R.cuMemFreeAsync(f->p, f->s);
}

static CUresult free_managed_synced(CUdeviceptr p, CUstream s, int pt)
{
    egpu_capture_relax cr = egpu_capture_relaxed(R.cuThreadExchangeStreamCaptureMode);
    CUresult r = R.cuStreamSynchronize(egpu_stream_of(s, pt));
    if (r == CUDA_SUCCESS) r = R.cuMemFree_v2(p);
    egpu_capture_restore(R.cuThreadExchangeStreamCaptureMode, cr);
    return r;
}

static CUresult free_async(CUdeviceptr p, CUstream s, int pt)
{
    egpu_map_ent e;
    int had = p && egpu_map_take_ent(&S->map, MAP_PTR, p, &e) == 0;
    CUresult r;
    if (had && (e.aux & PTR_MANAGED_FALLBACK) && R.cuStreamSynchronize && !strm_capturing(s, pt)) {
        r = free_managed_synced(p, s, pt);
    } else {
        struct fa f = {p, s, pt};
        r = call_free_async(&f);
    }
    if (r != CUDA_SUCCESS) {
        if (had) egpu_map_put_ent(&S->map, &e);
        return r;
    }
    if (had) uncharge(e.dev, e.bytes);
    return r;
}

CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemFreeAsync);
    return free_async(p, s, 0);
}
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemFreeAsync_ptsz);
    return free_async(p, s, 1);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REAL_OR_UNSUPPORTED(cuMemPoolCreate);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuMemPoolCreate(pool, props);
    if (r == CUDA_SUCCESS && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        pthread_mutex_lock(&S->pool_mu);
        pool_rec(*pool, props->location.id, 1);
        pthread_mutex_unlock(&S->pool_mu);
    }
    return r;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL_OR_UNSUPPORTED(cuMemPoolDestroy);
    CUresult r = R.cuMemPoolDestroy(pool);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_rec(pool, -1, 0);
    if (p) {
        uncharge(p->dev, p->charged);
        *p = S->pools[--S->npools];
    }
    pthread_mutex_unlock(&S->pool_mu);
    return r;
}

static void pool_resync(CUmemoryPool pool)
{
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_rec(pool, -1, 0);
    if (p) pool_sync_locked(p);
    pthread_mutex_unlock(&S->pool_mu);
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep)
{
    REAL_OR_UNSUPPORTED(cuMemPoolTrimTo);
    CUresult r = R.cuMemPoolTrimTo(pool, keep);
    if (r == CUDA_SUCCESS) pool_resync(pool);
    return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    REAL_OR_UNSUPPORTED(cuMemPoolSetAttribute);
    CUresult r = R.cuMemPoolSetAttribute(pool, attr, value);
    if (r == CUDA_SUCCESS) pool_resync(pool);
    return r;
}

/* ---- virtual memory management -----------------------------------------------------
 * Physical memory is charged at cuMemCreate to the device named in its properties (not the
 * calling thread's context, which may not exist: FC-01); host-located memory is not charged.
 * Reserving address ranges costs nothing. As the driver (cuMemRelease, cuMemUnmap): the
 * memory is freed only when every handle to it is released AND every mapping of it is
 * unmapped, so the charge is given back then, not at cuMemRelease of a still-mapped handle
 * (the documented create-map-release pattern). Handles: cuMemCreate, each
 * cuMemRetainAllocationHandle and each cuMemImportFromShareableHandle take one; mappings:
 * cuMemMap/cuMemUnmap ranges. An imported allocation is charged to the importing container:
 * its size cannot be asked of the driver (no API gives a handle's size), so it is charged
 * the allocation granularity at import and then the largest extent (offset + size, rounded
 * up to the granularity) any mapping of it reaches, checked against the cap before cuMemMap.
 * All under vmm_mu, held across the driver call so that the bookkeeping follows the
 * driver's order of events. */
static int loc_is_device(const CUmemAllocationProp *p) { return p && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE; }

#define VMM_REFS(aux) ((aux) & 0xffffffffull)
#define VMM_NMAPS(aux) (((aux) >> 32) & 0x7fffffffull)
#define VMM_IMPORTED (1ull << 63)
#define VMM_AUX(refs, nmaps, imported) ((uint64_t)(refs) | ((uint64_t)(nmaps) << 32) | ((imported) ? VMM_IMPORTED : 0))

/* vmm_mu held: put the handle record back, or give its charge back when it has no handle and
 * no mapping left. */
static void vmm_settle_locked(egpu_map_ent *h, uint64_t refs, uint64_t nmaps)
{
    if (refs == 0 && nmaps == 0) {
        uncharge(h->dev, h->bytes);
        return;
    }
    h->aux = VMM_AUX(refs, nmaps, h->aux & VMM_IMPORTED);
    egpu_map_put_ent(&S->map, h);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMemCreate);
    if (!handle || !size || !loc_is_device(prop)) return R.cuMemCreate(handle, size, prop, flags);
    int dev = prop->location.id;
    CUresult r = charge(dev, size);
    if (r == CUDA_ERROR_INVALID_DEVICE || r == CUDA_ERROR_NOT_INITIALIZED) return R.cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) return r;
    r = R.cuMemCreate(handle, size, prop, flags);
    if (r != CUDA_SUCCESS) { uncharge(dev, size); return r; }
    egpu_map_ent e = {*handle, size, VMM_AUX(1, 0, 0), 0, dev, MAP_VMM};
    pthread_mutex_lock(&S->vmm_mu);
    egpu_map_put_ent(&S->map, &e);
    pthread_mutex_unlock(&S->vmm_mu);
    return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL_OR_UNSUPPORTED(cuMemRelease);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemRelease(handle);
    egpu_map_ent h;
    if (r == CUDA_SUCCESS && egpu_map_take_ent(&S->map, MAP_VMM, handle, &h) == 0) {
        uint64_t refs = VMM_REFS(h.aux);
        vmm_settle_locked(&h, refs ? refs - 1 : 0, VMM_NMAPS(h.aux));
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

static uint64_t vmm_granularity(const CUmemAllocationProp *prop)
{
    size_t g = 0;
    if (!R.cuMemGetAllocationGranularity || R.cuMemGetAllocationGranularity(&g, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
        g = 2ull << 20;
    return g;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    REAL_OR_UNSUPPORTED(cuMemMap);
    pthread_mutex_lock(&S->vmm_mu);
    egpu_map_ent h;
    int had = egpu_map_take_ent(&S->map, MAP_VMM, handle, &h) == 0;
    uint64_t extra = 0;
    if (had && (h.aux & VMM_IMPORTED) && size && offset <= UINT64_MAX - size) {
        /* an import: its charge follows the largest extent mapped (see above) */
        CUmemAllocationProp prop;
        uint64_t g = R.cuMemGetAllocationPropertiesFromHandle && R.cuMemGetAllocationPropertiesFromHandle(&prop, handle) == CUDA_SUCCESS
                         ? vmm_granularity(&prop) : (2ull << 20);
        uint64_t end = offset + size;
        end = end > UINT64_MAX - (g - 1) ? end : (end + g - 1) / g * g;
        if (end > h.bytes) {
            extra = end - h.bytes;
            CUresult c = charge(h.dev, extra);
            if (c != CUDA_SUCCESS) {
                egpu_map_put_ent(&S->map, &h);
                pthread_mutex_unlock(&S->vmm_mu);
                return c;
            }
        }
    }
    CUresult r = R.cuMemMap(ptr, size, offset, handle, flags);
    if (had) {
        if (r == CUDA_SUCCESS) {
            h.bytes += extra;
            h.aux = VMM_AUX(VMM_REFS(h.aux), VMM_NMAPS(h.aux) + 1, h.aux & VMM_IMPORTED);
            egpu_map_ent m = {ptr, size, handle, 0, h.dev, MAP_VMAP};
            egpu_map_put_ent(&S->map, &m);
        } else if (extra) {
            uncharge(h.dev, extra);
        }
        egpu_map_put_ent(&S->map, &h);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_UNSUPPORTED(cuMemUnmap);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemUnmap(ptr, size);
    /* the range is whole mappings, contiguous: walk them from its start */
    for (uint64_t a = ptr, end = ptr + size; r == CUDA_SUCCESS && a < end && end > ptr;) {
        egpu_map_ent m, h;
        if (egpu_map_take_ent(&S->map, MAP_VMAP, a, &m) != 0 || !m.bytes) break;
        if (egpu_map_take_ent(&S->map, MAP_VMM, m.aux, &h) == 0) {
            uint64_t n = VMM_NMAPS(h.aux);
            vmm_settle_locked(&h, VMM_REFS(h.aux), n ? n - 1 : 0);
        }
        a += m.bytes;
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* Another handle to memory we already track: no new charge, one more reference. */
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL_OR_UNSUPPORTED(cuMemRetainAllocationHandle);
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemRetainAllocationHandle(handle, addr);
    egpu_map_ent h;
    if (r == CUDA_SUCCESS && handle && egpu_map_take_ent(&S->map, MAP_VMM, *handle, &h) == 0) {
        h.aux = VMM_AUX(VMM_REFS(h.aux) + 1, VMM_NMAPS(h.aux), h.aux & VMM_IMPORTED);
        egpu_map_put_ent(&S->map, &h);
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType type)
{
    REAL_OR_UNSUPPORTED(cuMemImportFromShareableHandle);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    pthread_mutex_lock(&S->vmm_mu);
    CUresult r = R.cuMemImportFromShareableHandle(handle, osHandle, type);
    egpu_map_ent h;
    CUmemAllocationProp prop;
    if (r != CUDA_SUCCESS || !handle) {
        /* the driver's answer */
    } else if (egpu_map_take_ent(&S->map, MAP_VMM, *handle, &h) == 0) {
        /* an allocation this process already holds: one more reference */
        h.aux = VMM_AUX(VMM_REFS(h.aux) + 1, VMM_NMAPS(h.aux), h.aux & VMM_IMPORTED);
        egpu_map_put_ent(&S->map, &h);
    } else if (R.cuMemGetAllocationPropertiesFromHandle && R.cuMemGetAllocationPropertiesFromHandle(&prop, *handle) == CUDA_SUCCESS &&
               loc_is_device(&prop) && devs_ready() && prop.location.id >= 0 && prop.location.id < S->ndev) {
        int dev = prop.location.id;
        uint64_t g = vmm_granularity(&prop);
        CUresult c = charge(dev, g);
        if (c != CUDA_SUCCESS) {
            R.cuMemRelease(*handle);
            r = c;
        } else {
            egpu_map_ent e = {*handle, g, VMM_AUX(1, 0, 1), 0, dev, MAP_VMM};
            egpu_map_put_ent(&S->map, &e);
        }
    }
    pthread_mutex_unlock(&S->vmm_mu);
    return r;
}

/* ---- arrays ------------------------------------------------------------------------
 * Estimate: rows padded to 512 bytes x height x depth (x6 faces for a cubemap), each
 * mipmap level halving width/height (and depth unless layered). Real layouts are tiled and
 * may differ by a little; the estimate is what is charged and given back. */
static unsigned fmt_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}

/* ARR_TOO_BIG: the size does not fit in 64 bits (checked multiplication): refused with
 * CUDA_ERROR_INVALID_VALUE, as the driver refuses such a size. Otherwise the estimate, which
 * the cap judges (huge but representable sizes get out-of-memory). */
#define ARR_TOO_BIG UINT64_MAX
static uint64_t arr_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch, unsigned flags)
{
    uint64_t row, bytes, depth = d ? d : 1;
    if ((flags & CUDA_ARRAY3D_CUBEMAP) && !(flags & CUDA_ARRAY3D_LAYERED)) depth = 6;
    if (__builtin_mul_overflow(w, (uint64_t)fmt_bytes(f) * (ch ? ch : 1), &row) || row > UINT64_MAX - 511 ||
        __builtin_mul_overflow((row + 511) / 512 * 512, h ? h : 1, &bytes) || __builtin_mul_overflow(bytes, depth, &bytes) ||
        bytes == ARR_TOO_BIG)
        return ARR_TOO_BIG;
    return bytes;
}

struct arr { void *out; const void *desc; int which; unsigned levels; };
static CUresult call_arr(void *c, uint64_t *k, uint64_t *aux)
{
    (void)aux;
    struct arr *a = c;
    CUresult r;
    switch (a->which) {
    case 0: r = R.cuArrayCreate((CUarray *)a->out, a->desc); break;
    case 1: r = R.cuArrayCreate_v2((CUarray *)a->out, a->desc); break;
    case 2: r = R.cuArray3DCreate((CUarray *)a->out, a->desc); break;
    case 3: r = R.cuArray3DCreate_v2((CUarray *)a->out, a->desc); break;
    default: r = R.cuMipmappedArrayCreate((CUmipmappedArray *)a->out, a->desc, a->levels); break;
    }
    if (r == CUDA_SUCCESS) *k = (uint64_t)(uintptr_t)*(void **)a->out;
    return r;
}

static CUresult arr_create(void *out, const void *desc, int which, unsigned levels, uint64_t bytes)
{
    int dev;
    struct arr a = {out, desc, which, levels};
    uint64_t dummy;
    if (!out || !desc || cur_dev(&dev) != CUDA_SUCCESS) return call_arr(&a, &dummy, &dummy);
    if (bytes == ARR_TOO_BIG) return CUDA_ERROR_INVALID_VALUE;
    return charged_alloc(dev, bytes, MAP_ARRAY, call_arr, &a);
}

CUresult cuArrayCreate(CUarray *h, const CUDA_ARRAY_DESCRIPTOR_v1 *d)
{
    REAL_OR_UNSUPPORTED(cuArrayCreate);
    return arr_create(h, d, 0, 0, d ? arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 0) : 0);
}
CUresult cuArrayCreate_v2(CUarray *h, const CUDA_ARRAY_DESCRIPTOR *d)
{
    REAL_OR_UNSUPPORTED(cuArrayCreate_v2);
    return arr_create(h, d, 1, 0, d ? arr_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels, 0) : 0);
}
CUresult cuArray3DCreate(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d)
{
    REAL_OR_UNSUPPORTED(cuArray3DCreate);
    return arr_create(h, d, 2, 0, d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0);
}
CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    REAL_OR_UNSUPPORTED(cuArray3DCreate_v2);
    return arr_create(h, d, 3, 0, d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0);
}
CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    REAL_OR_UNSUPPORTED(cuMipmappedArrayCreate);
    uint64_t total = 0;
    if (d) {
        uint64_t w = d->Width, hh = d->Height, z = d->Depth;
        for (unsigned l = 0; l < levels && l < 32; l++) {
            uint64_t lv = arr_bytes(w, hh, z, d->Format, d->NumChannels, d->Flags);
            total = lv == ARR_TOO_BIG || total >= ARR_TOO_BIG - lv ? ARR_TOO_BIG : total + lv;
            w = w > 1 ? w / 2 : 1;
            hh = hh > 1 ? hh / 2 : hh;
            if (!(d->Flags & CUDA_ARRAY3D_LAYERED)) z = z > 1 ? z / 2 : z;
        }
    }
    return arr_create(h, d, 4, levels, total);
}

static CUresult call_arr_destroy(void *c) { return R.cuArrayDestroy(*(CUarray *)c); }
CUresult cuArrayDestroy(CUarray h)
{
    REAL_OR_UNSUPPORTED(cuArrayDestroy);
    return charged_free(MAP_ARRAY, (uint64_t)(uintptr_t)h, call_arr_destroy, &h);
}
static CUresult call_mip_destroy(void *c) { return R.cuMipmappedArrayDestroy(*(CUmipmappedArray *)c); }
CUresult cuMipmappedArrayDestroy(CUmipmappedArray h)
{
    REAL_OR_UNSUPPORTED(cuMipmappedArrayDestroy);
    return charged_free(MAP_ARRAY, (uint64_t)(uintptr_t)h, call_mip_destroy, &h);
}

/* ---- contexts ----------------------------------------------------------------------
 * A context costs device memory the allocation calls never see. egpu charges a documented
 * constant per context (EGPU_CONTEXT_OVERHEAD_MIB, default 256 MiB) on creation and gives it
 * back on destruction; the primary context is charged once while it is retained. */
struct cc { CUcontext *pctx; unsigned flags; CUdevice dev; int which; void *params; int n; };
static CUresult call_ctx(void *c, uint64_t *k, uint64_t *aux)
{
    (void)aux;
    struct cc *a = c;
    CUresult r;
    switch (a->which) {
    case 0: r = R.cuCtxCreate(a->pctx, a->flags, a->dev); break;
    case 1: r = R.cuCtxCreate_v2(a->pctx, a->flags, a->dev); break;
    case 2: r = R.cuCtxCreate_v3(a->pctx, a->params, a->n, a->flags, a->dev); break;
    default: r = R.cuCtxCreate_v4(a->pctx, a->params, a->flags, a->dev); break;
    }
    if (r == CUDA_SUCCESS) *k = (uint64_t)(uintptr_t)*a->pctx;
    return r;
}

static CUresult ctx_create(struct cc *a)
{
    uint64_t dummy;
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!a->pctx || !devs_ready() || a->dev < 0 || a->dev >= S->ndev) return call_ctx(a, &dummy, &dummy);
    return charged_alloc(a->dev, S->cfg.context_overhead, MAP_CTX, call_ctx, a);
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuCtxCreate);
    struct cc a = {pctx, flags, dev, 0, NULL, 0};
    return ctx_create(&a);
}
CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuCtxCreate_v2);
    struct cc a = {pctx, flags, dev, 1, NULL, 0};
    return ctx_create(&a);
}
CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuCtxCreate_v3);
    struct cc a = {pctx, flags, dev, 2, params, n};
    return ctx_create(&a);
}
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuCtxCreate_v4);
    struct cc a = {pctx, flags, dev, 3, params, 0};
    return ctx_create(&a);
}

static CUresult call_ctx_destroy(void *c) { return R.cuCtxDestroy(*(CUcontext *)c); }
static CUresult call_ctx_destroy_v2(void *c) { return R.cuCtxDestroy_v2(*(CUcontext *)c); }
CUresult cuCtxDestroy(CUcontext ctx)
{
    REAL_OR_UNSUPPORTED(cuCtxDestroy);
    CUresult r = charged_free(MAP_CTX, (uint64_t)(uintptr_t)ctx, call_ctx_destroy, &ctx);
    if (r == CUDA_SUCCESS) ctx_gone((uint64_t)(uintptr_t)ctx);
    return r;
}
CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    REAL_OR_UNSUPPORTED(cuCtxDestroy_v2);
    CUresult r = charged_free(MAP_CTX, (uint64_t)(uintptr_t)ctx, call_ctx_destroy_v2, &ctx);
    if (r == CUDA_SUCCESS) ctx_gone((uint64_t)(uintptr_t)ctx);
    return r;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxRetain);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!pctx || !devs_ready() || dev < 0 || dev >= S->ndev) return R.cuDevicePrimaryCtxRetain(pctx, dev);
    pthread_mutex_lock(&S->dev_mu);
    int first = S->primary_refs[dev] == 0;
    CUresult r = first ? charge(dev, S->cfg.context_overhead) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        r = R.cuDevicePrimaryCtxRetain(pctx, dev);
        if (r == CUDA_SUCCESS) {
            S->primary_refs[dev]++;
            S->primary_ctx[dev] = *pctx;
        }
        else if (first) uncharge(dev, S->cfg.context_overhead);
    }
    pthread_mutex_unlock(&S->dev_mu);
    return r;
}

static CUresult primary_down(CUdevice dev, CUresult (*fn)(CUdevice), int reset)
{
    if (!devs_ready() || dev < 0 || dev >= S->ndev) return fn(dev);
    pthread_mutex_lock(&S->dev_mu);
    CUresult r = fn(dev);
    if (r == CUDA_SUCCESS && S->primary_refs[dev] > 0) {
        S->primary_refs[dev] = reset ? 0 : S->primary_refs[dev] - 1;
        if (S->primary_refs[dev] == 0) {
            uncharge(dev, S->cfg.context_overhead);
            ctx_gone((uint64_t)(uintptr_t)S->primary_ctx[dev]); /* the driver destroyed it */
        }
    }
    pthread_mutex_unlock(&S->dev_mu);
    return r;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxRelease); return primary_down(dev, R.cuDevicePrimaryCtxRelease, 0); }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxRelease_v2); return primary_down(dev, R.cuDevicePrimaryCtxRelease_v2, 0); }
CUresult cuDevicePrimaryCtxReset(CUdevice dev) { REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxReset); return primary_down(dev, R.cuDevicePrimaryCtxReset, 1); }
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxReset_v2); return primary_down(dev, R.cuDevicePrimaryCtxReset_v2, 1); }

/* ---- capacity views ----------------------------------------------------------------
 * Every view agrees: total = min(cap, physical); used = the container's usage on the card
 * (all its processes, pools' reserved memory and context overheads included);
 * free = min(total - used, physical free), clamped to [0, total]. */
void egpu_view(int slot, uint64_t limit, uint64_t phys_free, uint64_t *total, uint64_t *used, uint64_t *free_b);
void egpu_view(int slot, uint64_t limit, uint64_t phys_free, uint64_t *total, uint64_t *used, uint64_t *free_b)
{
    maybe_reap();
    uint64_t u = slot >= 0 ? egpu_acct_used(&S->acct, slot) : 0;
    uint64_t f = limit > u ? limit - u : 0;
    /* issue 8, FC-15: an oversubscribed share's excess comes from managed memory, so the
     * card's free memory does not bound what it may still allocate */
    if (f > phys_free && !S->cfg.oversubscription) f = phys_free;
    *total = limit;
    *used = u;
    *free_b = f;
}

static int view_dev(int *dev)
{
    if (egpu_config_ready() != 0 || !devs_ready()) return -1;
    if (cur_dev(dev) != CUDA_SUCCESS || *dev < 0 || *dev >= S->ndev) return -1;
    pools_refresh(*dev);
    return 0;
}

CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
    REAL_OR_UNSUPPORTED(cuMemGetInfo_v2);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuMemGetInfo_v2(free_b, total_b);
    int dev;
    if (r != CUDA_SUCCESS || view_dev(&dev) != 0) return r;
    uint64_t t, u, f;
    egpu_view(S->dev[dev].slot, S->dev[dev].limit, *free_b, &t, &u, &f);
    *total_b = t;
    *free_b = f;
    return r;
}

CUresult cuMemGetInfo(unsigned int *free_b, unsigned int *total_b)
{
    REAL_OR_UNSUPPORTED(cuMemGetInfo);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuMemGetInfo(free_b, total_b);
    int dev;
    if (r != CUDA_SUCCESS || view_dev(&dev) != 0) return r;
    uint64_t t, u, f, phys_free = *free_b == 0xffffffffu ? UINT64_MAX : *free_b;
    egpu_view(S->dev[dev].slot, S->dev[dev].limit, phys_free, &t, &u, &f);
    *total_b = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
    *free_b = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
    return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDeviceTotalMem_v2);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuDeviceTotalMem_v2(bytes, dev);
    if (r == CUDA_SUCCESS && devs_ready() && dev >= 0 && dev < S->ndev) *bytes = S->dev[dev].limit;
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDeviceTotalMem);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuDeviceTotalMem(bytes, dev);
    if (r == CUDA_SUCCESS && devs_ready() && dev >= 0 && dev < S->ndev && S->dev[dev].limit < *bytes)
        *bytes = (unsigned)S->dev[dev].limit;
    return r;
}
