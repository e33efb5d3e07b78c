/* hooks_compute.c: the launch entry points go through the compute gate (compute.h).
 *
 * Uncapped path (no cap on any card of the share, not low priority, no low-priority share
 * beside a high one): one load of egpu_compute_on and a predicted branch around the real
 * call. The gate is set up once the share's devices are known (cuInit). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "compute.h"
#include "egpu_log.h"
#include "egpu_state.h"

#define R (egpu_g.real)

static pthread_mutex_t g_setup_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_setup_done;

/* Called by the cuInit hook after the device table is built; harmless to call again. */
void egpu_compute_setup(void)
{
    egpu_state *s = &egpu_g;
    if (__atomic_load_n(&g_setup_done, __ATOMIC_ACQUIRE)) return;
    if (!__atomic_load_n(&s->devs_ready, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&g_setup_mu);
    if (g_setup_done) { pthread_mutex_unlock(&g_setup_mu); return; }
    egpu_compute_drv d = {
        .cuCtxGetCurrent = R.cuCtxGetCurrent, .cuCtxSetCurrent = R.cuCtxSetCurrent,
        .cuCtxGetDevice = R.cuCtxGetDevice, .cuEventCreate = R.cuEventCreate,
        .cuEventDestroy = R.cuEventDestroy_v2, .cuEventRecord = R.cuEventRecord,
        .cuEventQuery = R.cuEventQuery, .cuEventSynchronize = R.cuEventSynchronize,
        .cuEventElapsedTime = R.cuEventElapsedTime, .cuStreamCreate = R.cuStreamCreate,
        .cuStreamIsCapturing = R.cuStreamIsCapturing,
        .cuThreadExchangeStreamCaptureMode = R.cuThreadExchangeStreamCaptureMode,
    };
    void **fns = (void **)&d;
    for (size_t i = 0; i < EGPU_COMPUTE_DRV_REQUIRED; i++)
        if (!fns[i]) {
            EGPU_ERR("the driver lacks the event functions: compute is not shared on this node");
            g_setup_done = 1;
            pthread_mutex_unlock(&g_setup_mu);
            return;
        }
    static egpu_compute_cfg c; /* large: not on the stack */
    memset(&c, 0, sizeof c);
    const char *rt = getenv(ENV_RUNTIME_DIR);
    if (!rt || !*rt) rt = EGPU_RUNTIME_DIR_DEFAULT;
    c.ndev = s->ndev < EGPU_COMPUTE_MAX_DEVS ? s->ndev : EGPU_COMPUTE_MAX_DEVS;
    for (int i = 0; i < c.ndev; i++) {
        const egpu_dev *dv = &s->dev[i];
        if (dv->slot < 0) continue; /* not a card of this share */
        c.dev[i].ours = 1;
        snprintf(c.dev[i].uuid, sizeof c.dev[i].uuid, "%s", dv->uuid);
        if (s->cfg.source == EGPU_SRC_FILE) {
            for (int k = 0; k < s->cfg.ncards; k++) {
                if (strcmp(s->cfg.cards[k].uuid, dv->uuid) != 0) continue;
                c.dev[i].cores = s->cfg.cards[k].cores;
                snprintf(c.dev[i].region_path, sizeof c.dev[i].region_path, "%s", s->cfg.cards[k].card_region);
            }
        } else {
            c.dev[i].cores = s->cfg.env_cores;
        }
        if (!c.dev[i].region_path[0])
            snprintf(c.dev[i].region_path, sizeof c.dev[i].region_path, "%s/%s/%s", rt, EGPU_CARDS_SUBDIR, dv->uuid);
    }
    c.priority = s->cfg.priority == EGPU_PRIORITY_LOW ? EGPU_CARD_PRIO_LOW : EGPU_CARD_PRIO_HIGH;
    c.policy = s->cfg.compute_policy == EGPU_POLICY_ELASTIC ? EGPU_CARD_ELASTIC : EGPU_CARD_STRICT;
    c.floor_pct = -1; /* EGPU_LOW_PRIORITY_FLOOR */
    /* the share's key: its accounting region, which all its processes name alike */
    size_t kn = strnlen(s->cfg.container_region, sizeof s->cfg.container_region);
    if (kn > sizeof c.share_key - 1) kn = sizeof c.share_key - 1;
    memcpy(c.share_key, s->cfg.container_region, kn);
    c.share_key[kn] = 0;
    egpu_ctl_params p;
    egpu_ctl_defaults(&p);
    int file_floor = s->cfg.source == EGPU_SRC_FILE ? s->cfg.low_priority_floor : -1;
    if (s->cfg.node_file)
        c.floor_pct = file_floor > 0 ? file_floor : 0; /* the node's config: never the pod's env */
    else if (file_floor >= 0)
        c.floor_pct = file_floor; /* a file that says (0 included) wins over the env */
    if (!s->cfg.node_file)
        egpu_compute_env(&p, &c); /* raw nodes and tests: tunables from the environment */
    egpu_compute_init(&c, &p, &d);
    __atomic_store_n(&g_setup_done, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_setup_mu);
}

#define NEED_REAL(fn) \
    do { \
        if (__builtin_expect(!R.fn, 0)) { \
            pthread_once(&egpu_g.real_once, egpu_real_init); \
            if (!R.fn) return egpu_g.real_ok ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_NOT_INITIALIZED; \
        } \
    } while (0)

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                        unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params, void **extra)
{
    NEED_REAL(cuLaunchKernel);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL, &tk);
    CUresult r = R.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                             unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params,
                             void **extra)
{
    NEED_REAL(cuLaunchKernel_ptsz);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL | EGPU_LAUNCH_PTSZ, &tk);
    CUresult r = R.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params, extra);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    NEED_REAL(cuLaunchKernelEx);
    CUstream s = config ? config->hStream : NULL;
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL, &tk);
    CUresult r = R.cuLaunchKernelEx(config, f, params, extra);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **params, void **extra)
{
    NEED_REAL(cuLaunchKernelEx_ptsz);
    CUstream s = config ? config->hStream : NULL;
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL | EGPU_LAUNCH_PTSZ, &tk);
    CUresult r = R.cuLaunchKernelEx_ptsz(config, f, params, extra);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                   unsigned int by, unsigned int bz, unsigned int shmem, CUstream s, void **params)
{
    NEED_REAL(cuLaunchCooperativeKernel);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL, &tk);
    CUresult r = R.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                                        CUstream s, void **params)
{
    NEED_REAL(cuLaunchCooperativeKernel_ptsz);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_KERNEL | EGPU_LAUNCH_PTSZ, &tk);
    CUresult r = R.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, s, params);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec g, CUstream s)
{
    NEED_REAL(cuGraphLaunch);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_GRAPH, &tk);
    CUresult r = egpu_graph_run(R.cuGraphLaunch, g, s);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s)
{
    NEED_REAL(cuGraphLaunch_ptsz);
    egpu_launch_ticket tk;
    EGPU_COMPUTE_BEFORE(s, EGPU_LAUNCH_GRAPH | EGPU_LAUNCH_PTSZ, &tk);
    CUresult r = egpu_graph_run(R.cuGraphLaunch_ptsz, g, s);
    EGPU_COMPUTE_AFTER(s, &tk, r);
    return r;
}
