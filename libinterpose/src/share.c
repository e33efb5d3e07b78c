/* share.c: the share's state (egpu_g), its configuration and accounting region, the device
 * table, and charging: the paths every memory hook shares (share.h), cuInit, and FC-15's
 * managed memory for an oversubscribed share. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "share.h"
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

/* ---- devices: CUDA ordinal -> card UUID -> region slot and cap ---------------------- */
static void fmt_uuid(const CUuuid *u, char *out, size_t n)
{
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int devs_ready(void)
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

CUresult charge(int dev, uint64_t bytes)
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
    egpu_acct_refused(&S->acct, d->slot); /* the node agent exports it: OOMs seen */
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* ---- cuInit ------------------------------------------------------------------------- */
CUresult cuInit(unsigned int flags)
{
    if (egpu_config_ready() != 0) return EGPU_REFUSED_CU;
    if (!real_ready()) return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = R.cuInit(flags);
    if (r == CUDA_SUCCESS && devs_ready()) egpu_compute_setup(); /* issue 8: compute gate */
    return r;
}

/* ---- what a destroyed context held ------------------------------------------------- */
/* The driver frees the memory made in a context when the context is destroyed (cuCtxDestroy,
 * or the primary context's last release / reset): give back what it held. */
void ctx_gone(uint64_t ctx)
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

/* The managed allocation itself (the cap already charged by the caller). The driver's
 * answer was out-of-memory: that stays the answer when managed memory cannot be had. */
CUresult managed_fallback(CUdeviceptr *dptr, size_t size)
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
