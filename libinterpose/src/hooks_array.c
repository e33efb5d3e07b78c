/* hooks_array.c: CUDA arrays (cuArrayCreate(_v2), cuArray3DCreate(_v2),
 * cuMipmappedArrayCreate and their destroys), charged by an estimate of their size. */
#define _GNU_SOURCE
#include "share.h"

/* ---- arrays ------------------------------------------------------------------------
 * Estimate: rows padded to ARR_ROW_ALIGN_BYTES x height x depth (x6 faces for a cubemap), each
 * mipmap level halving width/height (and depth unless layered). Real layouts are tiled and
 * may differ by a little; the estimate is what is charged and given back. */
#define ARR_ROW_ALIGN_BYTES 512 /* rows padded as pitched allocations are (hooks_alloc.c) */
#define MIP_MAX_LEVELS 32       /* bounds the estimate's loop: real arrays have fewer (extents < 2^32) */
static unsigned fmt_bytes(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
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
    if (__builtin_mul_overflow(w, (uint64_t)fmt_bytes(f) * (ch ? ch : 1), &row) ||
        row > UINT64_MAX - (ARR_ROW_ALIGN_BYTES - 1) ||
        __builtin_mul_overflow((row + (ARR_ROW_ALIGN_BYTES - 1)) / ARR_ROW_ALIGN_BYTES * ARR_ROW_ALIGN_BYTES, h ? h : 1,
                               &bytes) ||
        __builtin_mul_overflow(bytes, depth, &bytes) || bytes == ARR_TOO_BIG)
        return ARR_TOO_BIG;
    return bytes;
}

struct arr {
    void *out;
    const void *desc;
    int which;
    unsigned levels;
};
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
    if (r == CUDA_SUCCESS) *k = (uint64_t)(uintptr_t)(*(void **)a->out);
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
    return arr_create(h, d, 2, 0,
                      d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0);
}
CUresult cuArray3DCreate_v2(CUarray *h, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    REAL_OR_UNSUPPORTED(cuArray3DCreate_v2);
    return arr_create(h, d, 3, 0,
                      d ? arr_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags) : 0);
}
CUresult cuMipmappedArrayCreate(CUmipmappedArray *h, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
    REAL_OR_UNSUPPORTED(cuMipmappedArrayCreate);
    uint64_t total = 0;
    if (d) {
        uint64_t w = d->Width, hh = d->Height, z = d->Depth;
        for (unsigned l = 0; l < levels && l < MIP_MAX_LEVELS; l++) {
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
