/* fakegpu: a stand-in libnvidia-ml.so.1. NVML sees every configured card (it ignores
 * CUDA_VISIBLE_DEVICES, as the real library does); memory and processes come from the
 * card-wide shared state. XID events are injected by appending "<uuid> <xid>" lines to
 * $FAKEGPU_STATE_DIR/xid. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "fake_common.h"

static int memory_limits_supported(void);

struct nvmlDevice_st { int idx; };
struct nvmlEventSet_st { unsigned long long mask[FG_MAX_CARDS]; long consumed; };
static struct nvmlDevice_st g_dev[FG_MAX_CARDS];
static atomic_int g_init;

#define NEED_INIT() do { if (atomic_load(&g_init) <= 0) return NVML_ERROR_UNINITIALIZED; } while (0)
static int dev_idx(nvmlDevice_t d)
{
    if (!d || d < &g_dev[0] || d >= &g_dev[FG_MAX_CARDS]) return -1;
    return d->idx < fg_get()->ncards ? d->idx : -1;
}

FG_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    fg_world *w = fg_get();
    for (int i = 0; i < w->ncards; i++) g_dev[i].idx = i;
    atomic_fetch_add(&g_init, 1);
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
FG_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }
FG_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    NEED_INIT();
    atomic_fetch_sub(&g_init, 1);
    return NVML_SUCCESS;
}

FG_EXPORT const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

FG_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len)
{
    NEED_INIT();
    if (!v || !len) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(v, len, "%s", fg_get()->driver_version);
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n)
{
    NEED_INIT();
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)fg_get()->ncards;
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    NEED_INIT();
    if (!d || i >= (unsigned)fg_get()->ncards) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_dev[i];
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

FG_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    NEED_INIT();
    if (!uuid || !d) return NVML_ERROR_INVALID_ARGUMENT;
    fg_world *w = fg_get();
    for (int i = 0; i < w->ncards; i++)
        if (!strcmp(w->card[i].uuid, uuid)) { *d = &g_dev[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

#define DEV_OR_FAIL(d, i) int i = dev_idx(d); if (i < 0) return NVML_ERROR_INVALID_ARGUMENT

FG_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!uuid) return NVML_ERROR_INVALID_ARGUMENT;
    const char *u = fg_get()->card[i].uuid;
    if (len < strlen(u) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(uuid, u, strlen(u) + 1);
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!name) return NVML_ERROR_INVALID_ARGUMENT;
    const char *n = fg_get()->card[i].name;
    if (len < strlen(n) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(name, n, strlen(n) + 1);
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *idx)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!idx) return NVML_ERROR_INVALID_ARGUMENT;
    *idx = (unsigned)i;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t total = fg_get()->card[i].total, used = fg_card_used(i); /* dead processes reaped */
    m->total = total;
    m->used = used;
    m->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(d, &v1);
    m->total = v1.total;
    m->reserved = 0;
    m->used = v1.used;
    m->free = v1.free;
    uint64_t hard, used;
    if (memory_limits_supported() && fg_my_limit(i, &hard, &used) && hard < v1.total) {
        /* within a memory partition: the partition's figures (r615: "nvmlDeviceGetMemoryInfo_v2
         * ... account for cgroup memory partitions when called within the partition") */
        m->total = hard;
        m->used = used;
        uint64_t left = used < hard ? hard - used : 0;
        m->free = left < v1.free ? left : v1.free;
    }
    return NVML_SUCCESS;
}

/* ---- per-cgroup memory limits (r615; docs.nvidia.com/deploy/mps, "MPS v3 Memory
 * Partitioning"). The fake keeps the driver's "misc" backend (fake_common.c); it accepts the
 * cgroup v2 hierarchy wherever it is mounted (the real driver wants it at /sys/fs/cgroup). */
static int memory_limits_supported(void) { return fg_get()->driver_major >= FG_MEMORY_LIMITS_MIN_DRIVER; }

/* The cgroup v2 path of directory ``ns`` ("/..."), and the host path the hierarchy is mounted
 * at, from /proc/self/mountinfo; -1 when ``ns`` is no directory of a cgroup v2 mount. */
static int cgroup_of_namespace(const char *ns, char *group, size_t gn, char *mount, size_t mn)
{
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(ns, real) || stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) return -1;
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f) return -1;
    char line[4096];
    int found = -1;
    size_t best = 0;
    while (fgets(line, sizeof line, f)) {
        char root[PATH_MAX], point[PATH_MAX];
        const char *sep = strstr(line, " - ");
        if (!sep || strncmp(sep + 3, "cgroup2 ", 8) != 0) continue;
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, point) != 2) continue;
        size_t n = strlen(point);
        if (strncmp(real, point, n) != 0 || (real[n] != 0 && real[n] != '/' && strcmp(point, "/"))) continue;
        if (found == 0 && n <= best) continue;
        const char *rest = strcmp(point, "/") ? real + n : real;
        int g = snprintf(group, gn, "%s%s", strcmp(root, "/") ? root : "", *rest ? rest : (strcmp(root, "/") ? "" : "/"));
        int m = snprintf(mount, mn, "%s", strcmp(point, "/") ? point : "");
        if (g < 0 || (size_t)g >= gn || m < 0 || (size_t)m >= mn) continue;
        best = n;
        found = 0;
    }
    fclose(f);
    return found;
}

FG_EXPORT nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t d, nvmlSetMemoryLimits_v1_t *limits)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!limits || !limits->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    if (!memory_limits_supported()) return NVML_ERROR_NOT_SUPPORTED;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION; /* "setting limits is privileged" */
    if (limits->softLimit > limits->hardLimit) return NVML_ERROR_INVALID_ARGUMENT;
    char group[PATH_MAX], mount[PATH_MAX];
    if (cgroup_of_namespace(limits->nameSpace, group, sizeof group, mount, sizeof mount) != 0) return NVML_ERROR_NOT_FOUND;
    if (strlen(group) >= FG_CGROUP_PATH) return NVML_ERROR_INVALID_ARGUMENT;
    return fg_limit_set(i, group, mount, limits->softLimit, limits->hardLimit) == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t d, nvmlGetMemoryLimits_v1_t *limits)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!limits || !limits->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    if (!memory_limits_supported()) return NVML_ERROR_NOT_SUPPORTED;
    char group[PATH_MAX], mount[PATH_MAX];
    if (cgroup_of_namespace(limits->nameSpace, group, sizeof group, mount, sizeof mount) != 0) return NVML_ERROR_NOT_FOUND;
    uint64_t soft, hard, used;
    fg_limit_get(i, group, mount, &soft, &hard, &used);
    limits->softLimit = soft;
    limits->hardLimit = hard;
    limits->currentUsed = used;
    return NVML_SUCCESS;
}

/* The card's compute processes for the lists below (either element layout): their pids and
 * bytes, their count in *n and *count; NVML_ERROR_INSUFFICIENT_SIZE, with the count in *count,
 * where the caller's array (has_infos) is missing or shorter than *count says. */
static nvmlReturn_t compute_procs(nvmlDevice_t d, unsigned int *count, int has_infos,
                                  int32_t pids[FG_MAX_PROCS], uint64_t bytes[FG_MAX_PROCS], int *n)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *n = fg_card_procs(i, pids, bytes, FG_MAX_PROCS);
    if ((unsigned)*n > *count || (*n && !has_infos)) { *count = (unsigned)*n; return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = (unsigned)*n;
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos)
{
    int32_t pids[FG_MAX_PROCS];
    uint64_t bytes[FG_MAX_PROCS];
    int n = 0;
    nvmlReturn_t r = compute_procs(d, count, infos != NULL, pids, bytes, &n);
    for (int k = 0; r == NVML_SUCCESS && k < n; k++)
        infos[k] = (nvmlProcessInfo_t){(unsigned)pids[k], bytes[k], 0xFFFFFFFFu, 0xFFFFFFFFu};
    return r;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { return nvmlDeviceGetComputeRunningProcesses_v3(d, c, p); }
/* The unversioned (v1) list takes nvml.h's nvmlProcessInfo_v1_t: a shorter element. */
FG_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_v1_t *infos)
{
    int32_t pids[FG_MAX_PROCS];
    uint64_t bytes[FG_MAX_PROCS];
    int n = 0;
    nvmlReturn_t r = compute_procs(d, count, infos != NULL, pids, bytes, &n);
    for (int k = 0; r == NVML_SUCCESS && k < n; k++) infos[k] = (nvmlProcessInfo_v1_t){(unsigned)pids[k], bytes[k]};
    return r;
}

/* Graphics contexts and an MPS server: the fake has neither, so these lists are empty (as a
 * driver's are on a card with no display clients and no MPS daemon). */
static nvmlReturn_t no_procs(nvmlDevice_t d, unsigned int *count)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    (void)i;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { (void)p; return no_procs(d, c); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { (void)p; return no_procs(d, c); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) { (void)p; return no_procs(d, c); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { (void)p; return no_procs(d, c); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p) { (void)p; return no_procs(d, c); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *p) { (void)p; return no_procs(d, c); }

FG_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    fg_world *w = fg_get();
    uint64_t busy_until = w->sh->cards[w->slot[i]].clock_ns;
    u->gpu = busy_until > fg_now_ns() ? 100 : 0;
    u->memory = 0;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t d, unsigned int *node)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!node) return NVML_ERROR_INVALID_ARGUMENT;
    *node = (unsigned)fg_get()->card[i].numa_node;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!p) return NVML_ERROR_INVALID_ARGUMENT;
    memset(p, 0, sizeof *p);
    p->bus = (unsigned)i + 1;
    p->pciDeviceId = 0x20b510de;
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", (unsigned)(i + 1) & 0xffu);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", (unsigned)(i + 1) & 0xffu);
    return NVML_SUCCESS;
}
FG_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
FG_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

FG_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    NEED_INIT();
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

FG_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set)
{
    NEED_INIT();
    DEV_OR_FAIL(d, i);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[i] |= types;
    return NVML_SUCCESS;
}

FG_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms)
{
    NEED_INIT();
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    fg_world *w = fg_get();
    char path[600];
    snprintf(path, sizeof path, "%s/xid", w->state_dir);
    uint64_t deadline = fg_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        FILE *f = fopen(path, "r");
        if (f) {
            char line[256];
            long n = 0;
            while (fgets(line, sizeof line, f)) {
                if (n++ < set->consumed) continue;
                set->consumed = n;
                char uuid[64];
                unsigned long long xid;
                if (sscanf(line, "%63s %llu", uuid, &xid) != 2) continue;
                for (int i = 0; i < w->ncards; i++)
                    if (!strcmp(w->card[i].uuid, uuid) && (set->mask[i] & nvmlEventTypeXidCriticalError)) {
                        fclose(f);
                        *data = (nvmlEventData_t){&g_dev[i], nvmlEventTypeXidCriticalError, xid, 0xFFFFFFFFu, 0xFFFFFFFFu};
                        return NVML_SUCCESS;
                    }
            }
            fclose(f);
        }
        if (fg_now_ns() >= deadline) return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}
FG_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int t) { return nvmlEventSetWait_v2(set, data, t); }

FG_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    NEED_INIT();
    free(set);
    return NVML_SUCCESS;
}
