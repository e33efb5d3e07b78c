/* hooks_ctx.c: contexts (cuCtxCreate*, cuCtxDestroy*, the primary context's retain, release
 * and reset): each is charged a constant, and its destruction gives back what was made in it. */
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
