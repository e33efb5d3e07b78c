/* hooks_pool.c: memory pools and stream-ordered allocation (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync and their _ptsz variants, cuMemPool*). */
#define _GNU_SOURCE
#include "share.h"

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

/* The device whose memory a pool egpu did not see created holds (a device's default or
 * current pool, got with cuDeviceGetDefaultMemPool / cuDeviceGetMemPool): the device whose
 * default or current pool it is; -1 when none is. cuMemAllocFromPoolAsync may take a pool of
 * another device than the current one, and its memory is that device's. */
static int pool_device(CUmemoryPool pool)
{
    for (int d = 0; d < S->ndev; d++) {
        CUmemoryPool q = NULL;
        if (R.cuDeviceGetDefaultMemPool && R.cuDeviceGetDefaultMemPool(&q, d) == CUDA_SUCCESS && q == pool) return d;
        if (R.cuDeviceGetMemPool && R.cuDeviceGetMemPool(&q, d) == CUDA_SUCCESS && q == pool) return d;
    }
    return -1;
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

void pools_refresh(int only_dev)
{
    if (!S->npools) return;
    pthread_mutex_lock(&S->pool_mu);
    for (int i = 0; i < S->npools; i++)
        if (only_dev < 0 || S->pools[i].dev == only_dev) pool_sync_locked(&S->pools[i]);
    pthread_mutex_unlock(&S->pool_mu);
}

/* A stream-ordered call's stream captures a graph (capture.h). */
static int strm_capturing(CUstream s, int pt)
{
    return egpu_stream_capturing(R.cuStreamIsCapturing, egpu_stream_of(s, pt));
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
    CUresult (*fn_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        pt ? R.cuMemAllocFromPoolAsync_ptsz : R.cuMemAllocFromPoolAsync;
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
    egpu_pool_rec *p = pool_rec(pool, dev, 0);
    if (!p) { /* first seen here: charged to the device that holds it, not the current one */
        int owner = from_pool ? pool_device(pool) : dev;
        p = pool_rec(pool, owner >= 0 ? owner : dev, 1);
    }
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
    /* Captured, an allocation is a graph's allocation node: no memory now (its graph's is
     * booked at instantiation, hooks_graph.c). Asked only when a charge is due (the pool's
     * cache serves most allocations), and believed only when the driver answers: a stream it
     * cannot answer about is charged as usual (its call then fails anyway). */
    if (need && egpu_stream_capture_state(R.cuStreamIsCapturing, egpu_stream_of(st, pt)) == 1) need = 0;
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
        /* settle on what the driver reserved */
        pool_sync_locked(p);
    } /* else destroyed meanwhile: cuMemPoolDestroy gave back its charge, need included */
    pthread_mutex_unlock(&S->pool_mu);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && S->cfg.oversubscription) r = stream_fallback(dptr, size, pdev, st, pt);
    return r;
#undef CALL_REAL
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t n, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemAllocAsync);
    return pool_alloc(dptr, n, NULL, s, 0, 0);
}
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t n, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemAllocAsync_ptsz);
    return pool_alloc(dptr, n, NULL, s, 0, 1);
}
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemAllocFromPoolAsync);
    return pool_alloc(dptr, n, p, s, 1, 0);
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t n, CUmemoryPool p, CUstream s)
{
    REAL_OR_UNSUPPORTED(cuMemAllocFromPoolAsync_ptsz);
    return pool_alloc(dptr, n, p, s, 1, 1);
}

/* A stream-ordered free of pool memory leaves it cached in the pool (still charged); a
 * stream-ordered free of cuMemAlloc memory gives its charge back. FC-15: a managed fallback
 * (see stream_fallback) is not pool memory and cannot be freed in stream order: the stream
 * is synchronised first (its earlier work may still use the memory), then the memory is
 * freed with cuMemFree and its charge given back, so this free is synchronous. While the
 * stream captures a graph (a synchronisation would invalidate the capture) the driver's
 * stream-ordered free is called and its answer stands. */
struct fa {
    CUdeviceptr p;
    CUstream s;
    int pt;
};
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
