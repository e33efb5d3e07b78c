/* pool_capture_race SECONDS MIB: one thread allocates MIB with cuMemAllocAsync on a stream,
 * again and again (never freeing), while another begins and ends captures on that stream
 * (RELAXED). An allocation made while the stream captures is a graph's node and takes no
 * memory; one made between captures is real. Runs SECONDS, or until this process holds more
 * of the card than its share. Prints "pool_capture_race rc=0 tries=N ok=N captures=N
 * max_held_mib=N total_mib=N used_mib=N": max_held_mib is the most the driver itself (NVML's
 * process list, which egpu does not interpose) said this process held after an allocation. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>
#include "probe_util.h"

#define MIB (1ull << 20)
#define NVML_MAX_PROCS 8
static CUcontext ctx;
static CUstream st;
static atomic_int stop;
static atomic_ulong captures;
static CUresult (*begin_capture)(CUstream, CUstreamCaptureMode);
static CUresult (*end_capture)(CUstream, CUgraph *);
static CUresult (*graph_destroy)(CUgraph);

static void *capturer(void *a)
{
    (void)a;
    p_cuCtxSetCurrent(ctx);
    while (!atomic_load(&stop)) {
        CUgraph g = NULL;
        if (begin_capture(st, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) continue;
        if (end_capture(st, &g) == CUDA_SUCCESS && g) graph_destroy(g);
        atomic_fetch_add(&captures, 1);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int seconds = argc > 1 ? atoi(argv[1]) : 3;
    size_t size = (argc > 2 ? strtoull(argv[2], NULL, 10) : 900) * MIB;
    load_cuda();
    load_nvml();
    CUdevice d = 0;
    if (p_nvmlInit_v2() || p_cuInit(0) || p_cuDeviceGet(&d, 0) || p_cuCtxCreate_v2(&ctx, 0, d) ||
        p_cuStreamCreate(&st, 0)) {
        printf("pool_capture_race rc=1\n");
        return 1;
    }
    *(void **)&begin_capture = dlsym(g_cuda, "cuStreamBeginCapture_v2");
    *(void **)&end_capture = dlsym(g_cuda, "cuStreamEndCapture");
    *(void **)&graph_destroy = dlsym(g_cuda, "cuGraphDestroy");
    nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
    *(void **)&procs = dlsym(g_nvml, "nvmlDeviceGetComputeRunningProcesses_v3");
    nvmlDevice_t nd;
    if (!begin_capture || !end_capture || !graph_destroy || !procs || p_nvmlDeviceGetHandleByIndex_v2(0, &nd)) {
        printf("pool_capture_race rc=2\n");
        return 1;
    }
    size_t f = 0, total = 0;
    p_cuMemGetInfo_v2(&f, &total);
    pthread_t t;
    pthread_create(&t, NULL, capturer, NULL);
    unsigned long tries = 0, ok = 0, nvml_fail = 0;
    unsigned long long held = 0, max_held = 0;
    time_t t0 = time(NULL);
    while (time(NULL) - t0 < seconds && max_held <= total) {
        CUdeviceptr p;
        tries++;
        if (p_cuMemAllocAsync(&p, size, st) == CUDA_SUCCESS) ok++;
        nvmlProcessInfo_t pi[NVML_MAX_PROCS];
        unsigned n = NVML_MAX_PROCS;
        held = 0;
        if (procs(nd, &n, pi) == NVML_SUCCESS) {
            for (unsigned i = 0; i < n; i++)
                if (pi[i].pid == (unsigned)getpid()) held = pi[i].usedGpuMemory;
        } else {
            nvml_fail++; /* the test then cannot see what the process holds: it fails */
        }
        if (held > max_held) max_held = held;
    }
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    p_cuMemGetInfo_v2(&f, &total);
    printf("pool_capture_race rc=0 tries=%lu ok=%lu nvml_fail=%lu captures=%lu max_held_mib=%llu total_mib=%llu "
           "used_mib=%llu\n",
           tries, ok, nvml_fail, (unsigned long)atomic_load(&captures), max_held / MIB, (unsigned long long)total / MIB,
           (unsigned long long)(total - f) / MIB);
    return 0;
}
