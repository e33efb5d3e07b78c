/* share.h: what the memory hooks share (internal; the files that include it are share.c,
 * hooks_alloc.c, hooks_pool.c, hooks_vmm.c, hooks_array.c, hooks_ctx.c, hooks_graph.c and
 * hooks_view.c).
 *
 * The share's state lives in egpu_g (egpu_state.h). Every charged path: find the card (from
 * the current context, or from the allocation's properties for VMM), charge the bytes
 * against the container's cap in the shared region BEFORE calling the driver (so two
 * processes cannot both pass the check), call the driver, give the charge back if the driver
 * fails, and remember what was charged so that the free gives back exactly that. Over the
 * cap: CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Nothing here is exported (the library is built with -fvisibility=hidden and a version
 * script that names only the hooks). */
#ifndef EGPU_SHARE_H
#define EGPU_SHARE_H

#include <stdint.h>
#include "capture.h" /* FC-15 fallbacks beside a graph capture */
#include "egpu_log.h"
#include "egpu_state.h"

#define S (&egpu_g)
#define R (egpu_g.real)

/* A hook whose real function is missing answers NOT_SUPPORTED (NOT_INITIALIZED when there is
 * no driver at all). */
#define REAL_OR_UNSUPPORTED(fn) \
    do { \
        if (!real_ready() || !R.fn) return real_ready() ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; \
    } while (0)

/* MAP_PTR aux: the pointer is managed memory that stands in for device memory the card could
 * not give an oversubscribed share (FC-15; share.c, managed_fallback). */
#define PTR_MANAGED_FALLBACK 1ull
/* MAP_PTR aux: the pointer is an allocation of a pool made by cuMemPoolCreate, whose id
 * (egpu_pool_rec) is aux >> PTR_POOL_ID_SHIFT. It charges nothing itself (bytes 0: its pool's
 * reserve is charged) and is no context's (ctx 0); its free may let a destroyed pool go. */
#define PTR_POOL 2ull
#define PTR_POOL_ID_SHIFT 8

static inline int real_ready(void)
{
    pthread_once(&S->real_once, egpu_real_init);
    return S->real_ok;
}

static inline void uncharge(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < S->ndev && S->dev[dev].slot >= 0) egpu_acct_uncharge(&S->acct, S->dev[dev].slot, bytes);
}

static inline void force(int dev, uint64_t bytes)
{
    if (dev >= 0 && dev < S->ndev && S->dev[dev].slot >= 0) egpu_acct_force(&S->acct, S->dev[dev].slot, bytes);
}

static inline CUresult cur_dev(int *dev)
{
    CUdevice d = 0;
    CUresult r = R.cuCtxGetDevice(&d);
    *dev = d;
    return r;
}

/* The calling thread's current context (0 when none or unknown): allocations made in it are
 * freed by the driver when it is destroyed. */
static inline uint64_t cur_ctx_key(void)
{
    CUcontext c = NULL;
    if (!R.cuCtxGetCurrent || R.cuCtxGetCurrent(&c) != CUDA_SUCCESS) return 0;
    return (uint64_t)(uintptr_t)c;
}

#pragma GCC visibility push(hidden)

/* share.c */
/* 1 when the device table is built (needs cuInit to have succeeded), else 0. */
int devs_ready(void);
/* Charge bytes on CUDA device dev. CUDA_SUCCESS, OUT_OF_MEMORY, or the refusal code. */
CUresult charge(int dev, uint64_t bytes);

/* The driver freed what context ctx held: give its charges back. */
void ctx_gone(uint64_t ctx);
/* FC-15: managed memory of `size` bytes (the cap already charged by the caller). */
CUresult managed_fallback(CUdeviceptr *dptr, size_t size);

/* hooks_vmm.c: the driver's minimum allocation granularity for prop, else
 * VMM_GRANULARITY_FALLBACK_BYTES: what an import is charged at first, what mapping extents
 * and graph allocation nodes are rounded up to. */
#define VMM_GRANULARITY_FALLBACK_BYTES (2ull << 20) /* device memory's on current drivers */
uint64_t vmm_granularity(const CUmemAllocationProp *prop);

/* hooks_pool.c: bring the pools' charges up to date (only_dev < 0: every device). */
void pools_refresh(int only_dev);
/* hooks_pool.c: a PTR_POOL pointer was freed (aux: its map entry's). */
void pool_ptr_freed(uint64_t aux);
/* hooks_graph.c: bring the graph memory pools' charges up to date (a capacity view). */
void graph_mem_refresh(void);

#pragma GCC visibility pop

/* ---- the common charged paths (inline: each hook's driver call is inlined into its copy) --- */

/* An allocation call: the driver call, its key in *key_out, and in *aux_out what the map
 * entry must remember besides (0, or PTR_MANAGED_FALLBACK). */
typedef CUresult (*alloc_call)(void *ctx, uint64_t *key_out, uint64_t *aux_out);

/* The common charged path: reserve `bytes` on the current device, run the driver call,
 * remember (kind, key) -> bytes. */
static inline CUresult charged_alloc(int dev, uint64_t bytes, int kind, alloc_call call, void *ctx)
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

static inline CUresult charged_free(int kind, uint64_t key, CUresult (*call)(void *), void *ctx)
{
    egpu_map_ent e;
    int had = egpu_map_take_ent(&S->map, kind, key, &e) == 0;
    CUresult r = call(ctx);
    if (r != CUDA_SUCCESS) {
        if (had) egpu_map_put_ent(&S->map, &e);
        return r;
    }
    if (had) uncharge(e.dev, e.bytes);
    if (had && kind == MAP_PTR && (e.aux & PTR_POOL)) pool_ptr_freed(e.aux);
    return r;
}

#endif
