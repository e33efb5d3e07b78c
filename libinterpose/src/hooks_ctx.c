/* hooks_ctx.c: contexts (cuCtxCreate*, cuCtxDestroy*, the primary context's retain, release
 * and reset): each is charged a constant, and its destruction gives back what was made in it;
 * cuCtxSetLimit: the limits that take device memory (heap, stack, printf FIFO). */
#define _GNU_SOURCE
#include "share.h"

/* ---- contexts ----------------------------------------------------------------------
 * A context costs device memory the allocation calls never see. egpu charges a documented
 * constant per context (EGPU_CONTEXT_OVERHEAD_MIB, default 256 MiB) on creation and gives it
 * back on destruction; the primary context is charged once while it is retained. */
struct cc {
    CUcontext *pctx;
    unsigned flags;
    CUdevice dev;
    int which;
    void *params;
    int n;
};
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
        } else if (first) uncharge(dev, S->cfg.context_overhead);
    }
    pthread_mutex_unlock(&S->dev_mu);
    return r;
}

/* Release: one retain less; the last one destroys the context, its allocations with it.
 * Reset (CUDA driver API, cuDevicePrimaryCtxReset): the driver destroys every allocation of
 * the primary context but keeps the count of retains ("Resetting the primary context does
 * not release it"): the allocations' charges go, the count and the context's own charge
 * stay until the last release. Counting a reset as the last release let a tenant
 * (retain, reset, retain, allocate, release) see its charges dropped while its memory lived. */
static CUresult primary_down(CUdevice dev, CUresult (*fn)(CUdevice), int reset)
{
    if (!devs_ready() || dev < 0 || dev >= S->ndev) return fn(dev);
    pthread_mutex_lock(&S->dev_mu);
    CUresult r = fn(dev);
    if (r == CUDA_SUCCESS && S->primary_refs[dev] > 0) {
        if (reset) {
            ctx_gone((uint64_t)(uintptr_t)S->primary_ctx[dev]); /* its allocations are gone */
        } else if (--S->primary_refs[dev] == 0) {
            uncharge(dev, S->cfg.context_overhead);
            ctx_gone((uint64_t)(uintptr_t)S->primary_ctx[dev]); /* the driver destroyed it */
        }
    }
    pthread_mutex_unlock(&S->dev_mu);
    return r;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxRelease);
    return primary_down(dev, R.cuDevicePrimaryCtxRelease, 0);
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxRelease_v2);
    return primary_down(dev, R.cuDevicePrimaryCtxRelease_v2, 0);
}
CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxReset);
    return primary_down(dev, R.cuDevicePrimaryCtxReset, 1);
}
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    REAL_OR_UNSUPPORTED(cuDevicePrimaryCtxReset_v2);
    return primary_down(dev, R.cuDevicePrimaryCtxReset_v2, 1);
}

/* ---- context limits that take device memory (cuCtxSetLimit) --------------------------
 * CUDA's programming guide: the device-side malloc heap (CU_LIMIT_MALLOC_HEAP_SIZE) is device
 * memory in addition to what cuMemAlloc gives, and so is the printf FIFO; the stack
 * (CU_LIMIT_STACK_SIZE) is local memory reserved for every thread the device can hold resident
 * (stack x SMs x resident threads a SM). What the driver's defaults take is part of the
 * context's own charge (EGPU_CONTEXT_OVERHEAD_MIB); a limit's growth past the default it had
 * in this context is charged against the cap before the driver is called (over it:
 * CUDA_ERROR_OUT_OF_MEMORY, which cuCtxSetLimit documents, and the limit is left as it was),
 * given back when the limit is lowered and when the context goes (ctx_gone: destroy, the
 * primary context's last release or reset, which resets its limits). The stack is charged
 * because a real user who raises it (deep recursion, big local arrays) does take that memory
 * on every resident thread: 64 KiB is 17 GiB on an H100. The driver's own growth of the stack
 * at a launch that needs more is not seen (docs/security.md). */
#define LIMIT_KEY_SHIFT 56
/* no device attributes: an H100 SXM's resident threads (132 SMs x 2048), the largest card */
#define RESIDENT_THREADS_FALLBACK (132ull * 2048ull)

/* Under dev_mu: each device's resident threads as the driver gave them, 0 until asked. A
 * device's SM count and threads a SM never change, so cuCtxSetLimit asks them once per device,
 * not on every call. */
static uint64_t resident_cache[EGPU_MAX_DEVS];

/* dev_mu held, 0 <= dev < S->ndev. The fallback is not cached: a later call asks again. */
static uint64_t resident_threads(int dev)
{
    if (resident_cache[dev]) return resident_cache[dev];
    int sms = 0, per_sm = 0;
    if (!R.cuDeviceGetAttribute || R.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) ||
        R.cuDeviceGetAttribute(&per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev) || sms <= 0 ||
        per_sm <= 0)
        return RESIDENT_THREADS_FALLBACK;
    return resident_cache[dev] = (uint64_t)sms * (uint64_t)per_sm;
}

/* Device bytes a limit takes at `value` beyond what it takes at `base` (saturating); per: the
 * copies of it the device holds (the stack: resident threads; the others: 1). */
static uint64_t limit_bytes(size_t value, size_t base, uint64_t per)
{
    if (value <= base) return 0;
    uint64_t grow = value - base;
    return grow > UINT64_MAX / per ? UINT64_MAX : grow * per;
}

CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    REAL_OR_UNSUPPORTED(cuCtxSetLimit);
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    int dev;
    uint64_t ctx = cur_ctx_key();
    int takes_memory = limit == CU_LIMIT_MALLOC_HEAP_SIZE || limit == CU_LIMIT_STACK_SIZE ||
                       limit == CU_LIMIT_PRINTF_FIFO_SIZE;
    if (!takes_memory || !ctx || !R.cuCtxGetLimit || !devs_ready() || cur_dev(&dev) != CUDA_SUCCESS || dev < 0 ||
        dev >= S->ndev)
        return R.cuCtxSetLimit(limit, value); /* the driver's answer (no context: its error) */
    uint64_t key = ctx ^ ((uint64_t)limit << LIMIT_KEY_SHIFT);
    pthread_mutex_lock(&S->dev_mu); /* one change of a limit at a time: the charge follows it */
    egpu_map_ent e;
    if (egpu_map_take_ent(&S->map, MAP_LIMIT, key, &e) != 0) {
        size_t base = 0; /* this context's limit before egpu saw it set: the default */
        CUresult g = R.cuCtxGetLimit(&base, limit);
        if (g != CUDA_SUCCESS) {
            pthread_mutex_unlock(&S->dev_mu);
            return R.cuCtxSetLimit(limit, value);
        }
        e = (egpu_map_ent){key, 0, base, ctx, dev, MAP_LIMIT};
    }
    uint64_t per = limit == CU_LIMIT_STACK_SIZE ? resident_threads(dev) : 1; /* once a device */
    uint64_t want = limit_bytes(value, (size_t)e.aux, per);
    uint64_t grow = want > e.bytes ? want - e.bytes : 0;
    CUresult r = grow ? charge(dev, grow) : CUDA_SUCCESS;
    if (r == CUDA_SUCCESS) {
        r = R.cuCtxSetLimit(limit, value);
        if (r != CUDA_SUCCESS) {
            uncharge(dev, grow); /* the driver refused: the limit stays */
        } else {
            /* the driver may round the value: the charge follows what it set */
            size_t got = value;
            if (R.cuCtxGetLimit(&got, limit) != CUDA_SUCCESS) got = value;
            uint64_t held = e.bytes + grow, now = limit_bytes(got, (size_t)e.aux, per);
            if (now > held) force(dev, now - held);
            else uncharge(dev, held - now);
            e.bytes = now;
        }
    }
    egpu_map_put_ent(&S->map, &e);
    pthread_mutex_unlock(&S->dev_mu);
    return r;
}
