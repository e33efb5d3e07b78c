/* hooks_pool.c: memory pools and stream-ordered allocation (cuMemAllocAsync,
 * cuMemAllocFromPoolAsync, cuMemFreeAsync and their _ptsz variants, cuMemPool*). */
#define _GNU_SOURCE
#include "share.h"

/* ---- memory pools and stream-ordered allocation ------------------------------------
 * A pool is charged what the driver says it has reserved (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT):
 * memory a pool keeps cached after cuMemFreeAsync still counts, until the driver releases it
 * (at a synchronisation, down to the release threshold, or cuMemPoolTrimTo). The charge is
 * brought up to date before each pool allocation, on every capacity query, and before any
 * allocation is refused. Growth is charged against the cap, never forced past it: an
 * allocation that grew its pool beyond what the cap holds is undone (pool_settle). */
#define STREAM_LEGACY ((CUstream)0x1) /* cuda.h's CU_STREAM_LEGACY */

static egpu_pool_rec *pool_rec(CUmemoryPool pool, int dev, int create)
{
    for (int i = 0; i < S->npools; i++)
        if (S->pools[i].pool == pool && !S->pools[i].dead) return &S->pools[i];
    if (!create || S->npools >= EGPU_MAX_POOLS) return NULL;
    egpu_pool_rec *p = &S->pools[S->npools++];
    *p = (egpu_pool_rec){.pool = pool, .dev = dev, .id = ++S->pool_last_id};
    return p;
}

/* pool_mu held: the record of pool id (NULL once it is gone). Held across a driver call by id,
 * not by handle: a destroyed pool's handle may name a new pool. */
static egpu_pool_rec *pool_by_id(uint64_t id)
{
    for (int i = 0; i < S->npools; i++)
        if (S->pools[i].id == id) return &S->pools[i];
    return NULL;
}

static void pool_drop(egpu_pool_rec *p) { *p = S->pools[--S->npools]; }

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

/* The device of stream s: cuMemAllocAsync takes the current pool of the stream's device (CUDA
 * driver API, cuMemAllocAsync, cuDeviceSetMemPool), whatever context is current. NULL and the
 * legacy and per-thread default streams are the current context's. Drivers before 12.8 have no
 * cuStreamGetDevice: the stream's context, asked with it pushed current. */
static CUresult stream_dev(CUstream s, int *dev)
{
    if (!s || s == STREAM_LEGACY || s == EGPU_STREAM_PER_THREAD) return cur_dev(dev);
    CUdevice d = 0;
    if (R.cuStreamGetDevice && R.cuStreamGetDevice(s, &d) == CUDA_SUCCESS) {
        *dev = d;
        return CUDA_SUCCESS;
    }
    CUcontext c = NULL, cur = NULL, popped = NULL;
    if (!R.cuStreamGetCtx || R.cuStreamGetCtx(s, &c) != CUDA_SUCCESS || !c) return cur_dev(dev);
    if (R.cuCtxGetCurrent && R.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == c) return cur_dev(dev);
    if (!R.cuCtxPushCurrent_v2 || !R.cuCtxPopCurrent_v2 || R.cuCtxPushCurrent_v2(c) != CUDA_SUCCESS)
        return cur_dev(dev);
    CUresult r = cur_dev(dev);
    R.cuCtxPopCurrent_v2(&popped);
    return r;
}

/* The device whose memory a pool egpu has no record of holds (cuMemAllocFromPoolAsync: the
 * pool names it, whatever the stream's device; a pool egpu records names its own, pool_alloc):
 * the device whose default or current pool it is, else (a pool egpu cannot place) the stream's.
 * -1 when none can say. The stream's device costs up to 4 driver calls before CUDA 12.8. */
static int pool_owner(CUmemoryPool pool, CUstream s)
{
    int dev = pool_device(pool);
    if (dev < 0 && stream_dev(s, &dev) != CUDA_SUCCESS) dev = -1;
    return dev;
}

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute a)
{
    cuuint64_t v = 0;
    if (!R.cuMemPoolGetAttribute || R.cuMemPoolGetAttribute(pool, a, &v) != CUDA_SUCCESS) return 0;
    return v;
}


/* pool_mu held: charge against the cap without refreshing the pools (charge() refreshes them,
 * under pool_mu). A card outside the share (no slot) has no room. 0, or -1 over the cap. */
static int charge_locked(int dev, uint64_t bytes)
{
    if (dev < 0 || dev >= S->ndev || S->dev[dev].slot < 0) return -1;
    return egpu_acct_charge(&S->acct, S->dev[dev].slot, bytes, S->dev[dev].limit);
}

/* pool_mu held: the pool's charge follows its reserve. It keeps what in-flight allocations
 * charged for growth (their reserve may not show yet; dropping it would let a concurrent
 * allocation pass the cap check on memory that is about to be reserved), so growth that shows
 * is counted twice until its allocation settles. Only a reserve beyond all that is charged is
 * growth to charge, against the cap; what does not fit stays a shortfall (pool_shortfall) for
 * an allocation to settle (pool_settle). A destroyed pool's handle cannot be asked: its charge
 * stands. Returns the reserve. */
static uint64_t pool_sync_locked(egpu_pool_rec *p)
{
    if (p->dev < 0) return 0; /* a host pool: host memory, nothing to charge */
    if (p->dead) return p->charged;
    uint64_t reserved = pool_attr(p->pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
    uint64_t floor = sat_add(reserved, p->pending);
    if (p->charged > floor) {
        uncharge(p->dev, p->charged - floor);
        p->charged = floor;
    } else if (reserved > p->charged && charge_locked(p->dev, reserved - p->charged) == 0) {
        p->charged = reserved;
    }
    return reserved;
}

/* pool_mu held: the reserve the pool's charge does not cover (reserved: pool_sync_locked's
 * answer). */
static uint64_t pool_shortfall(const egpu_pool_rec *p, uint64_t reserved)
{
    return !p->dead && reserved > p->charged ? reserved - p->charged : 0;
}

void pools_refresh(int only_dev)
{
    if (!S->npools) return;
    pthread_mutex_lock(&S->pool_mu);
    /* a second pass where some growth found no room: another pool may have given back since */
    for (int pass = 0, again = 1; pass < 2 && again; pass++) {
        again = 0;
        for (int i = 0; i < S->npools; i++) {
            egpu_pool_rec *p = &S->pools[i];
            if (only_dev < 0 || p->dev == only_dev) again |= pool_shortfall(p, pool_sync_locked(p)) != 0;
        }
    }
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

/* Undoes a stream-ordered allocation: frees it and trims its pool back to `keep` bytes (what is
 * charged for it). A stream-ordered free may count as outstanding until the host has observed
 * it (cuMemPoolTrimTo), so the stream is synchronised before the trim. Where the stream
 * captures now (a capture began after the call), or the stream-ordered free fails, cuMemFree,
 * which frees stream-ordered allocations too, at once. In RELAXED mode (capture.h). 0 when the
 * allocation was freed. */
static int pool_undo(CUdeviceptr ptr, CUmemoryPool pool, CUstream st, int pt, uint64_t keep)
{
    CUstream s = egpu_stream_of(st, pt);
    egpu_capture_relax cr = egpu_capture_relaxed(R.cuThreadExchangeStreamCaptureMode);
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;
    if (egpu_stream_capture_state(R.cuStreamIsCapturing, s) == 0) {
        struct fa f = {ptr, st, pt};
        r = call_free_async(&f);
        if (r == CUDA_SUCCESS && R.cuStreamSynchronize) R.cuStreamSynchronize(s);
    }
    if (r != CUDA_SUCCESS && R.cuMemFree_v2) r = R.cuMemFree_v2(ptr);
    if (r == CUDA_SUCCESS && R.cuMemPoolTrimTo) R.cuMemPoolTrimTo(pool, keep);
    egpu_capture_restore(R.cuThreadExchangeStreamCaptureMode, cr);
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* The driver call grew pool id `short_by` bytes past its charge: its cache could not serve what
 * it seemed to (fragmentation, no reuse of another stream's frees), or the stream stopped
 * capturing before the call. The growth is charged against the cap; where it does not fit, the
 * allocation is undone and the answer is out of memory, as a card of the share's size would
 * give. */
static CUresult pool_settle(uint64_t id, int dev, uint64_t short_by, CUdeviceptr ptr, CUmemoryPool pool, CUstream st,
                            int pt)
{
    egpu_pool_rec *p;
    if (charge(dev, short_by) == CUDA_SUCCESS) {
        pthread_mutex_lock(&S->pool_mu);
        if ((p = pool_by_id(id))) {
            p->charged = sat_add(p->charged, short_by);
            pool_sync_locked(p); /* gives back what a concurrent refresh charged meanwhile */
        } else {
            uncharge(dev, short_by);
        }
        pthread_mutex_unlock(&S->pool_mu);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&S->pool_mu);
    p = pool_by_id(id);
    uint64_t keep = p && p->charged > p->pending ? p->charged - p->pending : 0;
    pthread_mutex_unlock(&S->pool_mu);
    int undone = pool_undo(ptr, pool, st, pt, keep) == 0;
    pthread_mutex_lock(&S->pool_mu);
    if ((p = pool_by_id(id))) {
        uint64_t left = pool_shortfall(p, pool_sync_locked(p));
        if (!undone && left) {
            /* the driver keeps memory egpu could not give back: it is counted, so that nothing
             * more is let through while it is held */
            EGPU_ERR("cannot undo a pool allocation past the cap; %llu bytes stay charged",
                     (unsigned long long)left);
            force(p->dev, left);
            p->charged = sat_add(p->charged, left);
        }
    }
    pthread_mutex_unlock(&S->pool_mu);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* An allocation of a created pool: counted, so that a destroyed pool's charge goes with its
 * last allocation (cuMemPoolDestroy). */
static void pool_track(uint64_t id, CUdeviceptr ptr, int dev)
{
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_by_id(id);
    int track = p && p->created;
    if (track) p->live++;
    pthread_mutex_unlock(&S->pool_mu);
    if (!track) return;
    egpu_map_ent e = {ptr, 0, PTR_POOL | id << PTR_POOL_ID_SHIFT, 0, dev, MAP_PTR};
    egpu_map_put_ent(&S->map, &e);
}

/* The driver releases a destroyed pool's memory once its last allocation is freed (at the
 * free's completion in stream order; egpu gives the charge back at the call). */
void pool_ptr_freed(uint64_t aux)
{
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_by_id(aux >> PTR_POOL_ID_SHIFT);
    if (p && p->live) p->live--;
    if (p && p->dead && !p->live) {
        uncharge(p->dev, p->charged);
        pool_drop(p);
    }
    pthread_mutex_unlock(&S->pool_mu);
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream st, int from_pool, int pt)
{
    int dev;
    CUresult (*fn_async)(CUdeviceptr *, size_t, CUstream) = pt ? R.cuMemAllocAsync_ptsz : R.cuMemAllocAsync;
    CUresult (*fn_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        pt ? R.cuMemAllocFromPoolAsync_ptsz : R.cuMemAllocFromPoolAsync;
#define CALL_REAL() (from_pool ? fn_pool(dptr, size, pool, st) : fn_async(dptr, size, st))
    if ((from_pool && !fn_pool) || (!from_pool && !fn_async)) return CUDA_ERROR_NOT_SUPPORTED;
    if (!dptr || !size) return CALL_REAL();
    if (!from_pool && stream_dev(egpu_stream_of(st, pt), &dev) != CUDA_SUCCESS) return CALL_REAL();
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!devs_ready() || (from_pool && !pool) || !R.cuMemPoolGetAttribute)
        return CALL_REAL(); /* let the driver report */
    /* Under pool_mu: what the pool's cache seems to hold, less what concurrent in-flight
     * allocations already count on (claims), is taken from the cache; the rest (need) is
     * charged against the cap BEFORE the driver call and kept as pending until the call has
     * returned and the charge is settled on the pool's reserve. So two threads can never
     * both count on the same cached bytes, nor both grow the pool past the cap. Where the
     * driver grows the pool more than that (pool_settle), the growth is charged after the
     * call or the allocation undone. */
    egpu_pool_rec *p = NULL;
    if (from_pool) {
        /* a pool egpu records names its device (its record's): looked up once, and pool_mu
         * held from there to the charge */
        pthread_mutex_lock(&S->pool_mu);
        p = pool_rec(pool, -1, 0);
        if (!p) pthread_mutex_unlock(&S->pool_mu);
    }
    if (!p) {
        /* no record yet: placed by driver calls made without pool_mu, then recorded under it
         * (or found, where another thread recorded it meanwhile) */
        if (from_pool) dev = pool_owner(pool, egpu_stream_of(st, pt));
        if (dev < 0 || dev >= S->ndev) return CALL_REAL();
        if (!from_pool && (!R.cuDeviceGetMemPool || R.cuDeviceGetMemPool(&pool, dev) != CUDA_SUCCESS)) pool = NULL;
        if (!pool) return CALL_REAL(); /* let the driver report */
        pthread_mutex_lock(&S->pool_mu);
        p = pool_rec(pool, dev, 1); /* first seen here: dev holds it (pool_owner) */
    }
    CUresult r;
    if (!p) {
        pthread_mutex_unlock(&S->pool_mu);
        EGPU_ERR("more than %d memory pools; refusing the allocation", EGPU_MAX_POOLS);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* a pool in host memory (dev -1, cuMemPoolCreate) takes none of the card's: not charged;
     * nor one made on a device outside the table */
    if (p->dev < 0 || p->dev >= S->ndev) {
        pthread_mutex_unlock(&S->pool_mu);
        return CALL_REAL();
    }
    int pdev = p->dev;
    uint64_t id = p->id;
    uint64_t reserved = pool_sync_locked(p);
    uint64_t used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
    uint64_t cached = reserved > used ? reserved - used : 0;
    cached = cached > p->claims ? cached - p->claims : 0;
    uint64_t from_cache = size < cached ? size : cached;
    uint64_t need = size - from_cache;
    /* Captured, an allocation is a graph's allocation node: no memory now (its graph's is
     * booked at instantiation, hooks_graph.c). Asked only when a charge is due (the pool's
     * cache serves most allocations), and believed only when the driver answers: a stream it
     * cannot answer about is charged as usual (its call then fails anyway). A capture that
     * ends before the call is caught by pool_settle. */
    if (need && egpu_stream_capture_state(R.cuStreamIsCapturing, egpu_stream_of(st, pt)) == 1) need = 0;
    p->claims += from_cache;
    if (need) {
        /* charge() may refresh pools (pool_mu) when the cap is reached: charge unlocked,
         * with the cache claim already visible to other threads */
        pthread_mutex_unlock(&S->pool_mu);
        r = charge(pdev, need);
        pthread_mutex_lock(&S->pool_mu);
        p = pool_by_id(id);
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
    p = pool_by_id(id);
    uint64_t short_by = 0;
    int created = p && p->created; /* a device's default pool is not tracked per allocation */
    if (p) {
        p->claims -= from_cache < p->claims ? from_cache : p->claims;
        p->pending -= need < p->pending ? need : p->pending;
        if (p->dead && r != CUDA_SUCCESS) { /* destroyed meanwhile, its charge kept: need goes */
            uint64_t back = need < p->charged ? need : p->charged;
            uncharge(pdev, back);
            p->charged -= back;
        }
        /* settle on what the driver reserved */
        short_by = pool_shortfall(p, pool_sync_locked(p));
    } /* else destroyed meanwhile: cuMemPoolDestroy gave back its charge, need included */
    pthread_mutex_unlock(&S->pool_mu);
    if (r == CUDA_SUCCESS && short_by) {
        r = pool_settle(id, pdev, short_by, *dptr, pool, st, pt);
        if (r != CUDA_SUCCESS) *dptr = 0;
    }
    if (r == CUDA_SUCCESS && created) pool_track(id, *dptr, pdev);
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
    if (had && (e.aux & PTR_POOL)) pool_ptr_freed(e.aux);
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

/* A pool at a host location (CUDA 12.2+: CU_MEM_LOCATION_TYPE_HOST, HOST_NUMA, whose id is a
 * NUMA node, not a device ordinal) keeps host memory, whichever devices cuMemPoolSetAccess lets
 * read it: it is recorded as such (so that cuMemAllocFromPoolAsync does not take it for a pool
 * of the stream's device) and never charged, as host-located cuMemCreate memory. */
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    REAL_OR_UNSUPPORTED(cuMemPoolCreate);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    CUresult r = R.cuMemPoolCreate(pool, props);
    if (r != CUDA_SUCCESS) return r;
    /* the driver makes pools only on a device or at a host location (HOST, HOST_NUMA) */
    int host = props->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_rec(*pool, host ? -1 : props->location.id, 1); /* host: dev -1 */
    if (p) p->created = 1;
    pthread_mutex_unlock(&S->pool_mu);
    if (!p && host)
        EGPU_WARN("more than %d memory pools: a host pool's allocations will be charged to the stream's device",
                  EGPU_MAX_POOLS);
    return r;
}

/* CUDA driver API, cuMemPoolDestroy: with allocations outstanding, the call returns at once
 * and the pool's resources are released once none is left. So its charge (its whole reserve,
 * read while the handle still answers) stays until its last allocation is freed
 * (pool_ptr_freed). */
CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    REAL_OR_UNSUPPORTED(cuMemPoolDestroy);
    pthread_mutex_lock(&S->pool_mu);
    egpu_pool_rec *p = pool_rec(pool, -1, 0);
    if (p) pool_sync_locked(p);
    pthread_mutex_unlock(&S->pool_mu);
    CUresult r = R.cuMemPoolDestroy(pool);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&S->pool_mu);
    p = pool_rec(pool, -1, 0);
    if (p && p->live) {
        p->dead = 1;
    } else if (p) {
        uncharge(p->dev, p->charged);
        pool_drop(p);
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
