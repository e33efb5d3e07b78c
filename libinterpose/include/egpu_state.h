/* egpu_state.h: the interposer's one owned state struct and its internal API. */
#ifndef EGPU_STATE_H
#define EGPU_STATE_H
#include <pthread.h>
#include <stdint.h>
#include "egpu_account.h"
#include "egpu_config.h"
#include "egpu_hooks.h"

/* Returned by cuInit (and every charged call) when no share is configured. */
#define EGPU_REFUSED_CU CUDA_ERROR_NOT_INITIALIZED
#define EGPU_REFUSED_NVML NVML_ERROR_NO_PERMISSION

#define EGPU_MAX_DEVS EGPU_REGION_MAX_CARDS

typedef struct {
    int slot;            /* region card slot, -1: not a card of this share (cap 0) */
    uint64_t limit;      /* min(share, physical) */
    uint64_t phys_total;
    char uuid[EGPU_UUID_LEN];
} egpu_dev;

/* Process-local maps: what each live allocation charged, so frees give back the same.
 * MAP_PTR, MAP_ARRAY: ctx = the context it was made in (freed with it).
 * MAP_VMM: key = handle; aux = VMM_REFS (handles: create, import, retain) | VMM_NMAPS << 32
 *          (mappings) | VMM_IMPORTED. MAP_VMAP: key = mapped address, bytes = length,
 *          aux = handle. MAP_GEXEC: key = executable graph ^ device << 56, bytes = what its
 *          allocation nodes booked on that device (hooks_graph.c).
 * MAP_LIMIT: key = context ^ limit << 56, bytes = what the limit's growth over the driver's
 *          default charged, aux = that default, ctx = the context (hooks_ctx.c). */
enum { MAP_PTR = 1, MAP_VMM, MAP_ARRAY, MAP_CTX, MAP_VMAP, MAP_GEXEC, MAP_LIMIT };
typedef struct { uint64_t key; uint64_t bytes; uint64_t aux; uint64_t ctx; int32_t dev; int32_t kind; } egpu_map_ent;
typedef struct {
    pthread_mutex_t mu;
    egpu_map_ent *slots;
    size_t cap, count, tombs;
} egpu_map;
void egpu_map_put(egpu_map *m, int kind, uint64_t key, uint64_t bytes, int dev);
int egpu_map_take(egpu_map *m, int kind, uint64_t key, uint64_t *bytes, int *dev);
void egpu_map_put_ent(egpu_map *m, const egpu_map_ent *e);
int egpu_map_take_ent(egpu_map *m, int kind, uint64_t key, egpu_map_ent *out);
/* The entry (kind, key) without removing it (a reader never sees it missing), and its aux
 * changed in place: 0, or -1 when there is none. */
int egpu_map_get_ent(egpu_map *m, int kind, uint64_t key, egpu_map_ent *out);
int egpu_map_set_aux(egpu_map *m, int kind, uint64_t key, uint64_t aux);
/* Removes every MAP_PTR/MAP_ARRAY/MAP_LIMIT entry of context ctx; returns how many, in *out
 * (malloc'd, caller frees; NULL when none or out of memory). */
size_t egpu_map_take_ctx(egpu_map *m, uint64_t ctx, egpu_map_ent **out);

/* charged = what the region holds for the pool: at least pending, and its reserve as last seen
 * unless the cap had no room for growth yet (an allocation settles it, hooks_pool.c); pending =
 * what in-flight allocations charged for growth; claims = the part of the pool's cache in-flight
 * allocations count on. id: unique (a destroyed pool's handle may come back), names the pool in its
 * allocations' map entries. created: made by cuMemPoolCreate, so it can be destroyed: live
 * counts its allocations not yet freed; dead: destroyed with some live, its charge stays until
 * the last is freed (hooks_pool.c). dev -1: created at a host location (CU_MEM_LOCATION_TYPE_HOST,
 * HOST_NUMA): its memory is host memory, never charged, and its allocations go straight to the
 * driver. */
typedef struct {
    CUmemoryPool pool;
    int dev;
    uint64_t charged, pending, claims;
    uint64_t id, live;
    int created, dead;
} egpu_pool_rec;
/* Memory bound to a multicast object (hooks_vmm.c): it keeps `mem` alive like a mapping. */
typedef struct { CUmemGenericAllocationHandle mc, mem; int dev; uint64_t mc_offset, size; } egpu_mc_bind;
#define EGPU_MAX_POOLS 256

typedef struct {
    /* real symbols */
    pthread_once_t real_once;
    void *libcuda;
    int real_ok;         /* required CUDA symbols present */
    pthread_once_t nvml_once;
    void *libnvml;
    egpu_real_fns real;
    /* config + region */
    pthread_once_t cfg_once;
    int refused;
    char why[512];
    egpu_config cfg;
    egpu_acct acct;
    /* devices (CUDA ordinals of this process) */
    pthread_mutex_t dev_mu;
    int devs_ready;      /* atomic */
    int ndev;
    egpu_dev dev[EGPU_MAX_DEVS];
    int primary_refs[EGPU_MAX_DEVS];
    /* allocations and pools */
    egpu_map map;
    pthread_mutex_t pool_mu;
    int npools;
    egpu_pool_rec pools[EGPU_MAX_POOLS];
    uint64_t pool_last_id; /* under pool_mu */
    uint64_t last_reap_ns;
    pthread_mutex_t vmm_mu; /* VMM handle/mapping bookkeeping; order: vmm_mu, pool_mu, region */
    egpu_mc_bind *mc_binds; /* under vmm_mu */
    int n_mc_binds, cap_mc_binds;
    CUcontext primary_ctx[EGPU_MAX_DEVS];
} egpu_state;

/* Defined in share.c; hidden, so that every file reaches it directly (not through the GOT). */
extern egpu_state egpu_g __attribute__((visibility("hidden")));

void egpu_real_init(void);      /* pthread_once'd: libcuda + symbols */
void egpu_real_nvml_init(void); /* pthread_once'd: libnvidia-ml + symbols */
void *egpu_real_dlsym(void *handle, const char *name);
int egpu_config_ready(void);    /* 0 ok, -1 refused (message printed once) */
/* hooks_graph.c: launch (fn: the driver's cuGraphLaunch or _ptsz) an executable graph with
 * the share's graph memory check around it (the cuGraphLaunch hooks, hooks_compute.c). */
CUresult egpu_graph_run(CUresult (*fn)(CUgraphExec, CUstream), CUgraphExec e, CUstream s)
    __attribute__((visibility("hidden")));
#endif
