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

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m)
{
    pthread_once(&S->nvml_once, egpu_real_nvml_init);
    if (!R.nvmlDeviceGetMemoryInfo) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = R.nvmlDeviceGetMemoryInfo(dev, m);
    if (r != NVML_SUCCESS) return r;
    if (egpu_config_ready() != 0) return EGPU_REFUSED_NVML;
    int slot;
    uint64_t limit, t, u, f;
    if (nvml_card(dev, m->total, &slot, &limit) != 0) return r;
    egpu_view(slot, limit, m->free, &t, &u, &f);
    m->total = t;
    m->used = u;
    m->free = f;
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m)
{
    pthread_once(&S->nvml_once, egpu_real_nvml_init);
    if (!R.nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t r = R.nvmlDeviceGetMemoryInfo_v2(dev, m);
    if (r != NVML_SUCCESS) return r;
    if (egpu_config_ready() != 0) return EGPU_REFUSED_NVML;
    int slot;
    uint64_t limit, t, u, f;
    if (nvml_card(dev, m->total, &slot, &limit) != 0) return r;
    egpu_view(slot, limit, m->free, &t, &u, &f);
    m->total = t;
    m->reserved = 0;
    m->used = u;
    m->free = f;
    return r;
}
