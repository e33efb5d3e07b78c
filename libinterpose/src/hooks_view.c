/* hooks_view.c: the capacity views. cuMemGetInfo(_v2), cuDeviceTotalMem(_v2) and NVML's
 * nvmlDeviceGetMemoryInfo(_v2) all show the share, not the card (FC-16: NVML's memory view
 * agrees with cuMemGetInfo). Cards that are not part of the share (config file mode) are
 * reported to NVML as the driver sees them. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
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
    graph_mem_refresh(); /* the graph memory pools' reserves (hooks_graph.c) */
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

/* ---- NVML process lists --------------------------------------------------------------
 * The driver lists every process on the card, a co-tenant's pid and memory included. A
 * container sees only its share's processes: those that hold a slot of its region (every
 * process of the container that has charged anything; egpu_acct_pids) and the caller itself.
 * The count/buffer protocol stays NVML's: the driver is asked with a buffer of our own (the
 * card's list may not fit the caller's room although the share's does); a share's list longer
 * than *infoCount (or any with a NULL buffer) answers NVML_ERROR_INSUFFICIENT_SIZE with the
 * count needed; otherwise *infoCount = what was written. pid is the first field of both
 * element layouts (nvmlProcessInfo_v1_t, nvmlProcessInfo_t). */
enum { PL_C1, PL_C2, PL_C3, PL_G1, PL_G2, PL_G3, PL_M1, PL_M2, PL_M3 };
/* the card's list may grow between the count and the fetch: ask again, with room to spare */
#define PL_TRIES 4
#define PL_SLACK_ENTRIES 16u

static nvmlReturn_t pl_real(int which, nvmlDevice_t dev, unsigned *n, void *buf)
{
    switch (which) {
    case PL_C1: return R.nvmlDeviceGetComputeRunningProcesses(dev, n, buf);
    case PL_C2: return R.nvmlDeviceGetComputeRunningProcesses_v2(dev, n, buf);
    case PL_C3: return R.nvmlDeviceGetComputeRunningProcesses_v3(dev, n, buf);
    case PL_G1: return R.nvmlDeviceGetGraphicsRunningProcesses(dev, n, buf);
    case PL_G2: return R.nvmlDeviceGetGraphicsRunningProcesses_v2(dev, n, buf);
    case PL_G3: return R.nvmlDeviceGetGraphicsRunningProcesses_v3(dev, n, buf);
    case PL_M1: return R.nvmlDeviceGetMPSComputeRunningProcesses(dev, n, buf);
    case PL_M2: return R.nvmlDeviceGetMPSComputeRunningProcesses_v2(dev, n, buf);
    default: return R.nvmlDeviceGetMPSComputeRunningProcesses_v3(dev, n, buf);
    }
}

static int pid_in(unsigned pid, const int32_t *pids, int n)
{
    for (int k = 0; k < n; k++)
        if ((unsigned)pids[k] == pid) return 1;
    return 0;
}

static nvmlReturn_t share_procs(int which, nvmlDevice_t dev, unsigned *count, void *infos, size_t elem)
{
    if (!count) return pl_real(which, dev, count, infos); /* the driver's own error */
    unsigned n = 0;
    char *buf = NULL;
    nvmlReturn_t r = pl_real(which, dev, &n, NULL);
    for (int t = 0; r == NVML_ERROR_INSUFFICIENT_SIZE && t < PL_TRIES; t++) {
        n += PL_SLACK_ENTRIES;
        char *nb = realloc(buf, (size_t)n * elem);
        if (!nb) {
            free(buf);
            return NVML_ERROR_MEMORY;
        }
        buf = nb;
        r = pl_real(which, dev, &n, buf);
    }
    if (r == NVML_SUCCESS && egpu_config_ready() != 0) r = EGPU_REFUSED_NVML;
    if (r != NVML_SUCCESS) {
        free(buf);
        return r;
    }
    static int32_t pids[EGPU_REGION_MAX_PROCS]; /* one list at a time (share_mu) */
    static pthread_mutex_t share_mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&share_mu);
    maybe_reap();
    int np = egpu_acct_pids(&S->acct, pids, EGPU_REGION_MAX_PROCS);
    unsigned kept = 0, self = (unsigned)getpid();
    for (unsigned k = 0; buf && k < n; k++) {
        unsigned pid;
        memcpy(&pid, buf + (size_t)k * elem, sizeof pid);
        if (pid != self && !pid_in(pid, pids, np)) continue; /* another share's */
        if (kept != k) memmove(buf + (size_t)kept * elem, buf + (size_t)k * elem, elem);
        kept++;
    }
    pthread_mutex_unlock(&share_mu);
    if (kept > *count || (kept && !infos)) r = NVML_ERROR_INSUFFICIENT_SIZE;
    else if (kept) memcpy(infos, buf, (size_t)kept * elem);
    *count = kept;
    free(buf);
    return r;
}

#define PROC_LIST_HOOK(name, which, type) \
    nvmlReturn_t name(nvmlDevice_t dev, unsigned int *count, type *infos) \
    { \
        pthread_once(&S->nvml_once, egpu_real_nvml_init); \
        if (!R.name) return NVML_ERROR_FUNCTION_NOT_FOUND; \
        return share_procs(which, dev, count, infos, sizeof(type)); \
    }
PROC_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses, PL_C1, nvmlProcessInfo_v1_t)
PROC_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v2, PL_C2, nvmlProcessInfo_t)
PROC_LIST_HOOK(nvmlDeviceGetComputeRunningProcesses_v3, PL_C3, nvmlProcessInfo_t)
PROC_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses, PL_G1, nvmlProcessInfo_v1_t)
PROC_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v2, PL_G2, nvmlProcessInfo_t)
PROC_LIST_HOOK(nvmlDeviceGetGraphicsRunningProcesses_v3, PL_G3, nvmlProcessInfo_t)
PROC_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses, PL_M1, nvmlProcessInfo_v1_t)
PROC_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v2, PL_M2, nvmlProcessInfo_t)
PROC_LIST_HOOK(nvmlDeviceGetMPSComputeRunningProcesses_v3, PL_M3, nvmlProcessInfo_t)
