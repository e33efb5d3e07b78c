/* hooks_alloc.c: linear allocations, the charged paths of share.h: cuMemAlloc(_v2),
 * cuMemAllocManaged, cuMemAllocPitch(_v2) and cuMemFree(_v2). For an oversubscribed share
 * (FC-15), what the card cannot hold comes from managed memory, within the cap. */
#define _GNU_SOURCE
#include "share.h"

struct a2 {
    CUdeviceptr *dptr;
    size_t size;
    unsigned flags;
};
static CUresult call_alloc_v2(void *c, uint64_t *k, uint64_t *aux)
{
    struct a2 *a = c;
    CUresult r = R.cuMemAlloc_v2(a->dptr, a->size);
    /* issue 8, FC-15: the share's cap was charged already (charged_alloc), so what the card
     * cannot hold comes from managed memory, never beyond the cap */
    if (r == CUDA_ERROR_OUT_OF_MEMORY && S->cfg.oversubscription &&
        managed_fallback(a->dptr, a->size) == CUDA_SUCCESS) {
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

struct a1 {
    CUdeviceptr_v1 *dptr;
    unsigned size;
};
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

/* Pitched allocations: charge an estimate (rows padded to PITCH_ALIGN_BYTES), then settle
 * on the pitch the driver chose. PITCH_ALIGN_BYTES is the pitch alignment current drivers use for
 * cuMemAllocPitch (512 bytes); the fake GPU pads alike. A size that does not fit in 64 bits
 * is refused with CUDA_ERROR_INVALID_VALUE before the driver is called (as for arrays). */
#define PITCH_ALIGN_BYTES 512ull
#define PITCH_TOO_BIG UINT64_MAX
static uint64_t pitch_of(uint64_t w)
{
    return w > UINT64_MAX - (PITCH_ALIGN_BYTES - 1)
               ? PITCH_TOO_BIG
               : (w + PITCH_ALIGN_BYTES - 1) / PITCH_ALIGN_BYTES * PITCH_ALIGN_BYTES;
}
static uint64_t pitch_estimate(uint64_t w, uint64_t h)
{
    uint64_t p = pitch_of(w), bytes;
    if (p == PITCH_TOO_BIG || __builtin_mul_overflow(p, h, &bytes) || bytes == PITCH_TOO_BIG) return PITCH_TOO_BIG;
    return bytes;
}

static CUresult settle_pitch(int dev, uint64_t est, uint64_t actual, uint64_t key, uint64_t aux,
                             CUresult (*undo)(uint64_t))
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
 * pitch x h with the pitch the driver would have used (the width rounded up to PITCH_ALIGN_BYTES),
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
    if (!dptr || !pPitch || !w || !h || cur_dev(&dev) != CUDA_SUCCESS)
        return R.cuMemAllocPitch_v2(dptr, pPitch, w, h, elem);
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
    if (r != CUDA_SUCCESS) {
        uncharge(dev, est);
        return r;
    }
    return settle_pitch(dev, est, (uint64_t)*pPitch * h, *dptr, aux, undo_v2);
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int w, unsigned int h, unsigned int elem)
{
    REAL_OR_UNSUPPORTED(cuMemAllocPitch);
    int dev;
    if (!dptr || !pPitch || !w || !h || cur_dev(&dev) != CUDA_SUCCESS)
        return R.cuMemAllocPitch(dptr, pPitch, w, h, elem);
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
    if (r != CUDA_SUCCESS) {
        uncharge(dev, est);
        return r;
    }
    return settle_pitch(dev, est, (uint64_t)*pPitch * h, *dptr, aux, undo_v1);
}
