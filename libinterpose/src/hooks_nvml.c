/* hooks_nvml.c: NVML's memory view agrees with cuMemGetInfo (FC-16). Cards that are not
 * part of the share (config file mode) are reported as the driver sees them. */
#define _GNU_SOURCE
#include <string.h>
#include "egpu_log.h"
#include "egpu_state.h"

#define S (&egpu_g)
#define R (egpu_g.real)

void egpu_view(int slot, uint64_t limit, uint64_t phys_free, uint64_t *total, uint64_t *used, uint64_t *free_b);

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
static int share_view(nvmlDevice_t dev, unsigned long long *total, unsigned long long *used,
                      unsigned long long *free_b)
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
