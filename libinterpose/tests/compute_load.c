/* compute_load.c: a kernel-launching application for the compute tests (tests/compute).
 *
 * Reaches the driver as applications do (dlopen + dlsym), so that under LD_PRELOAD of the
 * interposer its launches go through the compute gate. Against the fake GPU every launch
 * takes FAKEGPU_KERNEL_US of simulated device time, so GPU use = launches x kernel time.
 *
 *   compute_load -t SECONDS [-d NDEV] [-s SYNC_EVERY] [-p PERIOD_US] [-k KERNEL_US] [-i EMPTY_US]
 *     -d   use devices 0..NDEV-1, one thread each (a multi-card container)
 *     -s   loop mode: synchronize the stream every SYNC_EVERY launches (default 16)
 *     -p   periodic mode: one launch every PERIOD_US, synchronized; latency recorded
 *     -k   the kernel time this program assumes for its figures (default FAKEGPU_KERNEL_US)
 *     -e   launch with cuLaunchKernelEx; -c with cuLaunchCooperativeKernel
 *     -g   graph mode: first queue 8 kernels (measurements pending), then capture N kernels
 *          into a graph on a second stream in GLOBAL mode, staying in capture for 50 ms
 *          (the gate's poller runs meanwhile), then launch that graph instead of kernels
 *
 * Prints one JSON object per device on stdout:
 *   {"dev":0,"launches":N,"wall_s":W,"use_pct":U,"win_use_pct":[...1 s windows...],
 *    "max_gap_ms":G,"t0_ns":T0,"idle_pct":I,"empty_over_ms":O,"empty_over_n":C,
 *    "lat_us_p50":..,"lat_us_p99":..,"lat_us_max":..}
 * t0_ns: CLOCK_MONOTONIC at the start of the loop (windows begin there; comparable across
 * processes of one host). The stream's own work is taken to end where its kernels would (each
 * queued when its launch call returned, after the previous one, for the kernel time).
 * idle_pct: the time before each launch call since that end, in % of the wall time: the
 * host's, this program's or a co-tenant's kernels' delay, never the gate's (the gate holds a
 * launch inside its call). empty_over_ms / empty_over_n: the gaps from that end (or from the
 * last synchronisation's return, if later: a co-tenant's kernels may have run first) to the
 * next launch's return (the gate's hold included) longer than -i EMPTY_US (default 1000): what
 * exceeds it, summed, and how many: where a co-tenant's low-priority work may go beside this
 * share.
 * win_use_pct: GPU use in consecutive 1 s windows (scaled by -w WINDOW_MS).
 *
 *   compute_load -t SECONDS -b CHUNK    (bench mode, bench/compute.py)
 * launches back to back, never synchronising, in chunks of CHUNK launches timed apart, and
 * prints {"launches":N,"wall_s":W,"best_ns":B,"median_ns":M}: the fastest and the median
 * chunk's ns per launch (a shared machine's preemptions land in some chunks, not in all). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "egpu_cuda.h"

static CUresult (*p_cuInit)(unsigned);
static CUresult (*p_cuDeviceGet)(CUdevice *, int);
static CUresult (*p_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*p_cuCtxSetCurrent)(CUcontext);
static CUresult (*p_cuStreamCreate)(CUstream *, unsigned);
static CUresult (*p_cuStreamSynchronize)(CUstream);
static CUresult (*p_cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream, void **, void **);
static CUresult (*p_cuLaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
static CUresult (*p_cuLaunchCooperativeKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, CUstream, void **);
static CUresult (*p_cuStreamBeginCapture_v2)(CUstream, CUstreamCaptureMode);
static CUresult (*p_cuStreamEndCapture)(CUstream, CUgraph *);
static CUresult (*p_cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
static CUresult (*p_cuGraphLaunch)(CUgraphExec, CUstream);
static int g_entry; /* 0 cuLaunchKernel, 'e' Ex, 'c' cooperative */
static int g_graph; /* -g: kernels per graph (0: launch kernels) */

static CUresult launch(CUfunction f, CUstream s)
{
    if (g_entry == 'e') {
        CUlaunchConfig c = {1, 1, 1, 32, 1, 1, 0, s, NULL, 0};
        return p_cuLaunchKernelEx(&c, f, NULL, NULL);
    }
    if (g_entry == 'c') return p_cuLaunchCooperativeKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL);
    return p_cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL);
}

static double g_seconds = 3, g_kernel_us, g_window_ms = 1000;
static long g_chunk; /* -b: bench mode */
static int g_ndev = 1, g_sync = 16;
static long g_period_us;
static double g_empty_over_us = 1000;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

#define CK(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: %d\n", #call, r_); exit(2); } } while (0)

typedef struct { int dev; char json[8192]; } job;

static void *run_dev(void *arg)
{
    job *j = arg;
    CUdevice d;
    CUcontext ctx;
    CUstream s;
    CK(p_cuDeviceGet(&d, j->dev));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, d));
    CK(p_cuCtxSetCurrent(ctx));
    CK(p_cuStreamCreate(&s, 0));
    CUfunction f = (CUfunction)(uintptr_t)0x1000;
    CUgraphExec gx = NULL;
    int capture_rc = -1;
    if (g_graph) {
        CUstream cs;
        CUgraph g = NULL;
        CK(p_cuStreamCreate(&cs, 0));
        for (int i = 0; i < 8; i++) CK(launch(f, s)); /* the gate has measurements pending */
        CK(p_cuStreamBeginCapture_v2(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
        for (int i = 0; i < g_graph; i++) CK(launch(f, cs));
        struct timespec st = {0, 50 * 1000 * 1000};
        nanosleep(&st, NULL);
        capture_rc = (int)p_cuStreamEndCapture(cs, &g);
        if (capture_rc == CUDA_SUCCESS) CK(p_cuGraphInstantiateWithFlags(&gx, g, 0));
        CK(p_cuStreamSynchronize(s));
    }
    size_t cap = 1 << 22, n = 0, nl = 0;
    uint64_t *ts = malloc(cap * sizeof *ts), *lat = malloc(cap * sizeof *lat);
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(g_seconds * 1e9), last = t0, max_gap = 0;
    uint64_t next = t0;
    double unit_us = g_kernel_us * (g_graph ? g_graph : 1); /* device time of one launch */
    uint64_t unit_ns = (uint64_t)(unit_us * 1e3), over_ns = (uint64_t)(g_empty_over_us * 1e3);
    /* own_end: where the stream's own kernels end; empty_end: also no earlier than the last
     * synchronisation's return (a co-tenant's kernels may have run before them) */
    uint64_t own_end = t0, empty_end = t0, idle = 0, empty_over = 0, empty_over_n = 0;
    while (now_ns() < end && n < cap) {
        if (g_period_us) {
            uint64_t t = now_ns();
            if (t < next) { struct timespec st = {0, (long)(next - t)}; nanosleep(&st, NULL); }
            next += (uint64_t)g_period_us * 1000;
        }
        uint64_t a = now_ns();
        if (a > own_end) idle += a - own_end;
        if (g_graph && gx) CK(p_cuGraphLaunch(gx, s));
        else if (!g_graph) CK(launch(f, s));
        else break; /* the capture failed: nothing to launch */
        uint64_t b = now_ns();
        if (b > empty_end + over_ns) {
            empty_over += b - empty_end - over_ns;
            empty_over_n++;
        }
        own_end = (b > own_end ? b : own_end) + unit_ns;
        empty_end = (b > empty_end ? b : empty_end) + unit_ns;
        ts[n++] = b;
        if (b - last > max_gap) max_gap = b - last;
        last = b;
        if (g_period_us || n % (size_t)g_sync == 0) {
            CK(p_cuStreamSynchronize(s));
            uint64_t t = now_ns(); /* the stream is empty: its work ended by now */
            if (t > empty_end) empty_end = t;
            if (g_period_us) lat[nl++] = t - a;
        }
    }
    CK(p_cuStreamSynchronize(s));
    uint64_t t1 = now_ns();
    double wall = (double)(t1 - t0) / 1e9;
    int off = snprintf(j->json, sizeof j->json,
                       "{\"dev\":%d,\"launches\":%zu,\"wall_s\":%.4f,\"use_pct\":%.3f,\"max_gap_ms\":%.3f,",
                       j->dev, n, wall, 100.0 * (double)n * unit_us / 1e6 / wall, (double)max_gap / 1e6);
    off += snprintf(j->json + off, sizeof j->json - (size_t)off,
                    "\"t0_ns\":%llu,\"idle_pct\":%.3f,\"empty_over_ms\":%.3f,\"empty_over_n\":%llu,",
                    (unsigned long long)t0, 100.0 * (double)idle / 1e9 / wall, (double)empty_over / 1e6,
                    (unsigned long long)empty_over_n);
    if (g_graph)
        off += snprintf(j->json + off, sizeof j->json - (size_t)off, "\"capture_rc\":%d,\"graph_kernels\":%d,",
                        capture_rc, g_graph);
    off += snprintf(j->json + off, sizeof j->json - (size_t)off, "\"win_use_pct\":[");
    uint64_t win = (uint64_t)(g_window_ms * 1e6);
    size_t i = 0;
    for (uint64_t w0 = t0; w0 + win <= t1 && off < (int)sizeof j->json - 64; w0 += win) {
        size_t c = 0;
        while (i < n && ts[i] < w0 + win) { if (ts[i] >= w0) c++; i++; }
        off += snprintf(j->json + off, sizeof j->json - (size_t)off, "%s%.3f", w0 == t0 ? "" : ",",
                        100.0 * (double)c * unit_us * 1e3 / (double)win);
    }
    off += snprintf(j->json + off, sizeof j->json - (size_t)off, "]");
    if (nl) {
        qsort(lat, nl, sizeof *lat, cmp_u64);
        snprintf(j->json + off, sizeof j->json - (size_t)off, ",\"lat_n\":%zu,\"lat_us_p50\":%.1f,\"lat_us_p99\":%.1f,\"lat_us_max\":%.1f}",
                 nl, (double)lat[nl / 2] / 1e3, (double)lat[(nl * 99) / 100 < nl ? (nl * 99) / 100 : nl - 1] / 1e3,
                 (double)lat[nl - 1] / 1e3);
    } else {
        snprintf(j->json + off, sizeof j->json - (size_t)off, "}");
    }
    free(ts);
    free(lat);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* -b: chunks of back-to-back launches on one stream, each timed. */
static int bench_mode(void)
{
    CUdevice d;
    CUcontext ctx;
    CUstream s;
    CK(p_cuDeviceGet(&d, 0));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, d));
    CK(p_cuCtxSetCurrent(ctx));
    CK(p_cuStreamCreate(&s, 0));
    CUfunction f = (CUfunction)(uintptr_t)0x1000;
    for (int i = 0; i < 1000; i++) CK(launch(f, s)); /* warm: the gate has met this stream */
    enum { MAXC = 100000 };
    static double per[MAXC];
    int nc = 0;
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(g_seconds * 1e9), n = 0;
    while (nc < MAXC) {
        uint64_t a = now_ns();
        if (a >= end) break;
        for (long i = 0; i < g_chunk; i++) CK(launch(f, s));
        per[nc++] = (double)(now_ns() - a) / (double)g_chunk;
        n += (uint64_t)g_chunk;
    }
    CK(p_cuStreamSynchronize(s));
    double wall = (double)(now_ns() - t0) / 1e9;
    qsort(per, (size_t)nc, sizeof per[0], cmp_double);
    printf("{\"launches\":%llu,\"wall_s\":%.4f,\"best_ns\":%.1f,\"median_ns\":%.1f}\n", (unsigned long long)n, wall,
           nc ? per[0] : 0.0, nc ? per[nc / 2] : 0.0);
    return 0;
}

int main(int argc, char **argv)
{
    const char *k = getenv("FAKEGPU_KERNEL_US");
    g_kernel_us = k ? atof(k) : 0;
    int opt;
    while ((opt = getopt(argc, argv, "t:d:s:p:k:w:g:b:i:ec")) != -1) {
        switch (opt) {
        case 't': g_seconds = atof(optarg); break;
        case 'd': g_ndev = atoi(optarg); break;
        case 's': g_sync = atoi(optarg) > 0 ? atoi(optarg) : 1; break;
        case 'p': g_period_us = atol(optarg); break;
        case 'k': g_kernel_us = atof(optarg); break;
        case 'w': g_window_ms = atof(optarg); break;
        case 'i': g_empty_over_us = atof(optarg); break;
        case 'e': case 'c': g_entry = opt; break;
        case 'g': g_graph = atoi(optarg) > 0 ? atoi(optarg) : 1; break;
        case 'b': g_chunk = atol(optarg) > 0 ? atol(optarg) : 10000; break;
        default: fprintf(stderr, "usage: see the comment at the top of compute_load.c\n"); return 2;
        }
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 90; }
#define LD(n) do { *(void **)&p_##n = dlsym(lib, #n); if (!p_##n) { fprintf(stderr, "no %s\n", #n); return 91; } } while (0)
    LD(cuInit); LD(cuDeviceGet); LD(cuDevicePrimaryCtxRetain); LD(cuCtxSetCurrent);
    LD(cuStreamCreate); LD(cuStreamSynchronize); LD(cuLaunchKernel);
    if (g_entry == 'e') LD(cuLaunchKernelEx);
    if (g_entry == 'c') LD(cuLaunchCooperativeKernel);
    if (g_graph) {
        LD(cuStreamBeginCapture_v2); LD(cuStreamEndCapture); LD(cuGraphInstantiateWithFlags); LD(cuGraphLaunch);
    }
    CK(p_cuInit(0));
    if (g_chunk) return bench_mode();
    if (g_ndev < 1 || g_ndev > 16) g_ndev = 1;
    job jobs[16];
    pthread_t th[16];
    for (int i = 0; i < g_ndev; i++) {
        jobs[i].dev = i;
        pthread_create(&th[i], NULL, run_dev, &jobs[i]);
    }
    for (int i = 0; i < g_ndev; i++) {
        pthread_join(th[i], NULL);
        printf("%s\n", jobs[i].json);
    }
    return 0;
}
