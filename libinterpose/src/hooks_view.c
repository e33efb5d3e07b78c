/* hooks_view.c: the capacity views. cuMemGetInfo(_v2), cuDeviceTotalMem(_v2) and NVML's
 * nvmlDeviceGetMemoryInfo(_v2) all show the share, not the card (FC-16: NVML's memory view
 * agrees with cuMemGetInfo). Cards that are not part of the share (config file mode) are
 * reported to NVML as the driver sees them. */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>
#include "share.h"

/* The views reclaim dead processes' charges at most this often: a reap checks every process
 * of the region under its lock, which a process that polls cuMemGetInfo must not pay each call. */
#define REAP_INTERVAL_NS (50 * 1000000ull)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void maybe_reap(void)
{
    uint64_t t = now_ns();
    if (t - S->last_reap_ns > REAP_INTERVAL_NS) {
        S->last_reap_ns = t;
        egpu_acct_reap(&S->acct);
    }
}

/* ---- capacity views ----------------------------------------------------------------
 * Every view agrees: total = min(cap, physical); used = the container's usage on the card
 * (all its processes, pools' reserved memory and context overheads included);
 * free = min(total - used, physical free), clamped to [0, total]. */
static void egpu_view(int slot, uint64_t limit, uint64_t phys_free, uint64_t *total, uint64_t *used, uint64_t *free_b)
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

/* ---- NVML --------------------------------------------------------------------------- */

/* Region slot and cap for an NVML device; -1 when the card is not ours. */
static int nvml_card(nvmlDevice_t dev, uint64_t phys_total, int *slot, uint64_t *limit)
{
    char uuid[96];
    if (!R.nvmlDeviceGetUUID || R.nvmlDeviceGetUUID(dev, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    uint64_t cap = egpu_config_limit(&S->cfg, uuid, phys_total);
    if (!cap) return -1;
    *limit = cap < phys_total ? cap : phys_total;
    *slot = egpu_acct_card(&S->acct, uuid, *limit);
    return *slot >= 0 ? 0 : -1;
}

/* Replace the driver's figures of `dev` by the share's view (total = min(cap, card), used =
 * the container's use, free clamped). 1 replaced; 0 not a card of this share (left as the
 * driver said); -1 CUDA is refused in this process. */
static int share_view(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used, unsigned long long *free_b)
{
    if (egpu_config_ready() != 0) return -1;
    int slot;
    uint64_t limit, t, u, f;
    if (nvml_card(dev, *total, &slot, &limit) != 0) return 0;
    egpu_view(slot, limit, *free_b, &t, &u, &f);
    *total = t;
    *used = u;
    *free_b = f;
    return 1;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
    pthread_once(&S->nvml_once, egpu_real_nvml_init);
    if (!R.nvmlDeviceGetMemoryInfo) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = R.nvmlDeviceGetMemoryInfo(dev, m);
    if (r != NVML_SUCCESS) return r;
    return share_view(dev, &m->total, &m->used, &m->free) < 0 ? EGPU_REFUSED_NVML : r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
    pthread_once(&S->nvml_once, egpu_real_nvml_init);
    if (!R.nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = R.nvmlDeviceGetMemoryInfo_v2(dev, m);
    if (r != NVML_SUCCESS) return r;
    int applied = share_view(dev, &m->total, &m->used, &m->free);
    if (applied < 0) return EGPU_REFUSED_NVML;
    if (applied) m->reserved = 0; /* the share's view has no driver-reserved part */
    return r;
}
