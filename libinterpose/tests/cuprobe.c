/* cuprobe: runs a script of driver calls given as arguments and prints one line per step,
 * "<step> rc=<CUresult> [key=value ...]", so that pytest can drive every allocation path.
 *
 *   init | ctx [dev] | primary [dev] | primary_release [dev] | primary_reset [dev]
 *   alloc MiB | alloc_v1 MiB | free | freeall | managed MiB
 *   pitch W H | meminfo | meminfo_v1 | totalmem [dev] | totalmem_v1 [dev]
 *   nvml [idx] | nvml2 [idx] | async MiB | freeasync | sync | pool_create [dev] | pool_alloc MiB
 *   pool_default DEV (the device's default pool becomes the one pool_alloc takes from)
 *   pool_trim MiB | pool_threshold MiB | pool_destroy
 *   pool_host host|numa|numa_current [ID] (a pool at a host location: CU_MEM_LOCATION_TYPE_HOST,
 *             HOST_NUMA (ID: the NUMA node) or HOST_NUMA_CURRENT, the one pool_alloc takes from)
 *   pool_access DEV (cuMemPoolSetAccess: device DEV may read and write the pool)
 *   pool_attr ("pool_attr rc=R reserved=BYTES used=BYTES": the driver's RESERVED/USED_MEM_CURRENT)
 *   pool_reuse 0|1 (the pool's three CU_MEMPOOL_ATTR_REUSE_* policies)
 *   stream (a new stream of the current context; the stream-ordered steps use it from then on)
 *   on K (async, freeasync, pool_alloc and sync use stream K: 0 NULL, 1.. the streams made)
 *   setctx K (make the K-th context made by "ctx" current, from 0)
 *   free_aptr (cuMemFree of the last async / pool pointer)
 *   held [idx] (what the driver itself says this process holds on card idx: its own row of
 *               NVML's process list, which egpu filters to the share's processes, this one
 *               always among them; "held rc=0 used=BYTES")
 *   procs LIST [idx] [room] (NVML's process list LIST, one of compute compute_v2 compute_v3
 *               graphics graphics_v2 graphics_v3 mps mps_v2 mps_v3, with room for `room`
 *               entries (default 64); "procs rc=R count=N pids=P,P,... mine=1|0")
 *   setlimit heap|stack|printf BYTES | getlimit heap|stack|printf (cuCtxSetLimit/GetLimit)
 *   vmm MiB host|dev ID | vmm_map | vmm_unmap | vmm_release | thread_vmm MiB DEV
 *   vmm_retain (retain the handle of the last mapping: a new handle entry)
 *   vmm_share (export the last handle as a POSIX fd and import it: a new handle entry)
 *   vmm_share_foreign (the same, the fd opened again first: another open file, as an fd of
 *                      another container's export is)
 *   vmm_release_prev (release the handle before the last one: the creator of a shared one)
 *   vmm_map_part MiB (map only the first MiB of the last handle)
 *   ctx_destroy (destroy the last context made by "ctx")
 *   array W H | array3d W H D [CH] | mipmap W H LEVELS | array_destroy | hostalloc MiB | hostfree
 *   sleep MS | hold (print "holding" and sleep until killed) | kill (SIGKILL itself)
 *   loop N <steps...> ;  (repeat steps up to ";" N times, printing only failures; then
 *                         the longest iteration, max_iter_us)
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "probe_util.h"

#define MIB (1ull << 20)
static CUdeviceptr ptrs[4096];
static int nptr;
static CUdeviceptr aptrs[64];
static int naptr;
static CUmemoryPool pool;
static CUstream streams[64]; /* [0] NULL; "stream" adds, "on" picks */
static int nstream = 1, cur_stream;
static CUmemGenericAllocationHandle vh[256];
static size_t vsz[256];
static int nvh;
static CUdeviceptr vaddr[256];
static CUdeviceptr maddr[256]; /* mappings made by vmm_map(_part), a stack: vmm_unmap pops */
static size_t mres[256], mlen[256];
static int nmap;
static CUarray arrs[64];
static int narr;
static int arr_is_mip[64];
static void *hosts[64];
static int nhost;
static int quiet;

static void out(const char *step, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void out(const char *step, int rc, const char *fmt, ...)
{
    if (quiet && rc == 0) return;
    char extra[512] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(extra, sizeof extra, fmt, ap);
        va_end(ap);
    }
    printf("%s rc=%d%s%s\n", step, rc, extra[0] ? " " : "", extra);
    fflush(stdout);
}

struct tv { size_t mib; int dev; CUresult rc; };
static void *thread_vmm(void *p)
{
    struct tv *t = p;
    CUmemAllocationProp prop = {0};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = t->dev;
    t->rc = p_cuMemCreate(&vh[nvh], t->mib * MIB, &prop, 0);
    if (t->rc == CUDA_SUCCESS) vsz[nvh++] = t->mib * MIB;
    return NULL;
}

static int run(int argc, char **argv, int i);

static int step(int argc, char **argv, int i)
{
    const char *s = argv[i++];
#define ARG(def) (i < argc && argv[i][0] >= '0' && argv[i][0] <= '9' ? strtoull(argv[i++], NULL, 10) : (def))
    static CUcontext ctxs[64];
    static int nctx;
    if (!strcmp(s, "init")) out(s, p_cuInit(0), NULL);
    else if (!strcmp(s, "ctx")) {
        CUcontext c;
        int d = (int)ARG(0);
        CUresult r = p_cuCtxCreate_v2(&c, 0, d);
        if (!r && nctx < 64) ctxs[nctx++] = c;
        out(s, r, NULL);
    } else if (!strcmp(s, "ctx_destroy")) {
        out(s, nctx ? p_cuCtxDestroy_v2(ctxs[--nctx]) : 1, NULL);
        if (nctx) p_cuCtxSetCurrent(ctxs[nctx - 1]);
    } else if (!strcmp(s, "primary")) {
        CUcontext c = NULL;
        int d = (int)ARG(0);
        CUresult r = p_cuDevicePrimaryCtxRetain(&c, d);
        if (r == CUDA_SUCCESS) r = p_cuCtxSetCurrent(c);
        out(s, r, NULL);
    } else if (!strcmp(s, "primary_release")) {
        out(s, p_cuDevicePrimaryCtxRelease_v2((int)ARG(0)), NULL);
    } else if (!strcmp(s, "primary_reset")) {
        out(s, p_cuDevicePrimaryCtxReset_v2((int)ARG(0)), NULL);
    } else if (!strcmp(s, "alloc")) {
        CUdeviceptr p = 0;
        CUresult r = p_cuMemAlloc_v2(&p, ARG(1) * MIB);
        if (r == CUDA_SUCCESS) ptrs[nptr++] = p;
        out(s, r, NULL);
    } else if (!strcmp(s, "alloc_v1")) {
        CUdeviceptr_v1 p = 0;
        CUresult r = p_cuMemAlloc(&p, (unsigned)(ARG(1) * MIB));
        if (r == CUDA_SUCCESS) ptrs[nptr++] = p;
        out(s, r, NULL);
    } else if (!strcmp(s, "managed")) {
        CUdeviceptr p = 0;
        CUresult r = p_cuMemAllocManaged(&p, ARG(1) * MIB, CU_MEM_ATTACH_GLOBAL);
        if (r == CUDA_SUCCESS) ptrs[nptr++] = p;
        out(s, r, NULL);
    } else if (!strcmp(s, "pitch")) {
        CUdeviceptr p = 0;
        size_t pitch = 0, w = ARG(1000), h = ARG(1000);
        CUresult r = p_cuMemAllocPitch_v2(&p, &pitch, w, h, 4);
        if (r == CUDA_SUCCESS) ptrs[nptr++] = p;
        out(s, r, "pitch=%zu", pitch);
    } else if (!strcmp(s, "free")) {
        out(s, nptr ? p_cuMemFree_v2(ptrs[--nptr]) : 1, NULL);
    } else if (!strcmp(s, "freeall")) {
        CUresult r = 0;
        while (nptr && !r) r = p_cuMemFree_v2(ptrs[--nptr]);
        out(s, r, NULL);
    } else if (!strcmp(s, "meminfo")) {
        size_t f = 0, t = 0;
        CUresult r = p_cuMemGetInfo_v2(&f, &t);
        out(s, r, "free=%zu total=%zu used=%zu", f, t, t - f);
    } else if (!strcmp(s, "meminfo_v1")) {
        unsigned f = 0, t = 0;
        CUresult r = p_cuMemGetInfo(&f, &t);
        out(s, r, "free=%u total=%u used=%u", f, t, t - f);
    } else if (!strcmp(s, "meminfo_null")) {
        size_t t = 0;
        out(s, p_cuMemGetInfo_v2(NULL, &t), NULL);
    } else if (!strcmp(s, "totalmem")) {
        size_t t = 0;
        CUresult r = p_cuDeviceTotalMem_v2(&t, (int)ARG(0));
        out(s, r, "total=%zu", t);
    } else if (!strcmp(s, "totalmem_v1")) {
        unsigned t = 0;
        CUresult r = p_cuDeviceTotalMem(&t, (int)ARG(0));
        out(s, r, "total=%u", t);
    } else if (!strcmp(s, "held")) {
        if (!g_nvml) { load_nvml(); p_nvmlInit_v2(); }
        nvmlReturn_t (*procs)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
        *(void **)&procs = dlsym(g_nvml, "nvmlDeviceGetComputeRunningProcesses_v3");
        nvmlDevice_t d;
        nvmlProcessInfo_t pi[64];
        unsigned n = 64;
        unsigned long long used = 0;
        nvmlReturn_t r = procs ? p_nvmlDeviceGetHandleByIndex_v2((unsigned)ARG(0), &d) : NVML_ERROR_UNINITIALIZED;
        if (r == NVML_SUCCESS) r = procs(d, &n, pi);
        for (unsigned k = 0; r == NVML_SUCCESS && k < n; k++)
            if (pi[k].pid == (unsigned)getpid()) used = pi[k].usedGpuMemory;
        out(s, r, "used=%llu", used);
    } else if (!strcmp(s, "procs")) {
        if (!g_nvml) { load_nvml(); p_nvmlInit_v2(); }
        const char *list = i < argc ? argv[i++] : "compute_v3";
        unsigned idx = (unsigned)ARG(0), room = (unsigned)ARG(64), n = room > 64 ? 64 : room;
        char name[80];
        const char *v = strchr(list, '_');
        snprintf(name, sizeof name, "nvmlDevice%s%sRunningProcesses%s",
                 !strncmp(list, "graphics", 8) ? "Get" : !strncmp(list, "mps", 3) ? "GetMPS" : "Get",
                 !strncmp(list, "graphics", 8) ? "Graphics" : "Compute", v ? v : "");
        void *fn = dlsym(g_nvml, name);
        nvmlDevice_t d;
        nvmlProcessInfo_t pi[64];       /* _v2, _v3 */
        nvmlProcessInfo_v1_t p1[64];    /* v1: the shorter element */
        nvmlReturn_t r = fn ? p_nvmlDeviceGetHandleByIndex_v2(idx, &d) : NVML_ERROR_FUNCTION_NOT_FOUND;
        if (r == NVML_SUCCESS && v) r = ((nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *))fn)(d, &n, pi);
        else if (r == NVML_SUCCESS) r = ((nvmlReturn_t(*)(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *))fn)(d, &n, p1);
        char pids[400] = "";
        int mine = 0;
        for (unsigned k = 0; r == NVML_SUCCESS && k < n && k < 64; k++) {
            unsigned pid = v ? pi[k].pid : p1[k].pid;
            mine |= pid == (unsigned)getpid();
            snprintf(pids + strlen(pids), sizeof pids - strlen(pids), "%s%u", k ? "," : "", pid);
        }
        out(s, r, "count=%u pids=%s mine=%d", n, pids[0] ? pids : "-", mine);
    } else if (!strcmp(s, "setlimit") || !strcmp(s, "getlimit")) {
        const char *l = i < argc ? argv[i++] : "heap";
        CUlimit lim = !strcmp(l, "stack") ? CU_LIMIT_STACK_SIZE
                      : !strcmp(l, "printf") ? CU_LIMIT_PRINTF_FIFO_SIZE : CU_LIMIT_MALLOC_HEAP_SIZE;
        size_t v = 0;
        if (!strcmp(s, "setlimit")) out(s, p_cuCtxSetLimit(lim, (size_t)ARG(0)), NULL);
        else {
            CUresult r = p_cuCtxGetLimit(&v, lim);
            out(s, r, "value=%zu", v);
        }
    } else if (!strcmp(s, "nvml") || !strcmp(s, "nvml2") || !strcmp(s, "nvml_null")) {
        if (!g_nvml) { load_nvml(); p_nvmlInit_v2(); }
        nvmlDevice_t d;
        unsigned idx = (unsigned)ARG(0);
        nvmlReturn_t r = p_nvmlDeviceGetHandleByIndex_v2(idx, &d);
        if (r == NVML_SUCCESS && !strcmp(s, "nvml")) {
            nvmlMemory_t m = {0};
            r = p_nvmlDeviceGetMemoryInfo(d, &m);
            out(s, r, "free=%llu total=%llu used=%llu", m.free, m.total, m.used);
        } else if (r == NVML_SUCCESS && !strcmp(s, "nvml2")) {
            nvmlMemory_v2_t m = {0};
            m.version = nvmlMemory_v2;
            r = p_nvmlDeviceGetMemoryInfo_v2(d, &m);
            out(s, r, "free=%llu total=%llu used=%llu", m.free, m.total, m.used);
        } else if (r == NVML_SUCCESS) {
            out(s, p_nvmlDeviceGetMemoryInfo(d, NULL), NULL);
        } else out(s, r, NULL);
    } else if (!strcmp(s, "async")) {
        CUdeviceptr p = 0;
        CUresult r = p_cuMemAllocAsync(&p, ARG(1) * MIB, streams[cur_stream]);
        if (r == CUDA_SUCCESS) aptrs[naptr++] = p;
        out(s, r, NULL);
    } else if (!strcmp(s, "freeasync")) {
        out(s, naptr ? p_cuMemFreeAsync(aptrs[--naptr], streams[cur_stream]) : 1, NULL);
    } else if (!strcmp(s, "free_aptr")) {
        out(s, naptr ? p_cuMemFree_v2(aptrs[--naptr]) : 1, NULL);
    } else if (!strcmp(s, "sync")) {
        out(s, p_cuStreamSynchronize(streams[cur_stream]), NULL);
    } else if (!strcmp(s, "stream")) {
        CUresult r = nstream < 64 ? p_cuStreamCreate(&streams[nstream], 0) : 1;
        if (!r) cur_stream = nstream++;
        out(s, r, NULL);
    } else if (!strcmp(s, "on")) {
        int k = (int)ARG(0);
        cur_stream = k < nstream ? k : 0;
    } else if (!strcmp(s, "setctx")) {
        int k = (int)ARG(0);
        out(s, k < nctx ? p_cuCtxSetCurrent(ctxs[k]) : 1, NULL);
    } else if (!strcmp(s, "pool_reuse")) {
        int v = (int)ARG(1);
        CUresult r = 0;
        CUmemPool_attribute reuse[] = {CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
                                       CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                                       CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES};
        for (int a = 0; a < 3 && !r; a++) r = p_cuMemPoolSetAttribute(pool, reuse[a], &v);
        out(s, r, NULL);
    } else if (!strcmp(s, "pool_create")) {
        CUmemPoolProps pr;
        memset(&pr, 0, sizeof pr);
        pr.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        pr.location.id = (int)ARG(0);
        out(s, p_cuMemPoolCreate(&pool, &pr), NULL);
    } else if (!strcmp(s, "pool_host")) {
        const char *where = i < argc ? argv[i++] : "host";
        CUmemPoolProps pr;
        memset(&pr, 0, sizeof pr);
        pr.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        pr.location.type = !strcmp(where, "numa")           ? CU_MEM_LOCATION_TYPE_HOST_NUMA
                           : !strcmp(where, "numa_current") ? CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT
                                                            : CU_MEM_LOCATION_TYPE_HOST;
        pr.location.id = (int)ARG(0);
        out(s, p_cuMemPoolCreate(&pool, &pr), NULL);
    } else if (!strcmp(s, "pool_access")) {
        CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, (int)ARG(0)}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        out(s, p_cuMemPoolSetAccess(pool, &ad, 1), NULL);
    } else if (!strcmp(s, "pool_attr")) {
        cuuint64_t res = 0, used = 0;
        CUresult r = p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &res);
        if (!r) r = p_cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
        out(s, r, "reserved=%llu used=%llu", (unsigned long long)res, (unsigned long long)used);
    } else if (!strcmp(s, "pool_default")) { /* the default pool of a device, to allocate from */
        out(s, p_cuDeviceGetDefaultMemPool(&pool, (int)ARG(0)), NULL);
    } else if (!strcmp(s, "pool_alloc")) {
        CUdeviceptr p = 0;
        CUresult r = p_cuMemAllocFromPoolAsync(&p, ARG(1) * MIB, pool, streams[cur_stream]);
        if (r == CUDA_SUCCESS) aptrs[naptr++] = p;
        out(s, r, NULL);
    } else if (!strcmp(s, "pool_trim")) {
        out(s, p_cuMemPoolTrimTo(pool, ARG(0) * MIB), NULL);
    } else if (!strcmp(s, "pool_threshold")) {
        cuuint64_t v = ARG(0) * MIB;
        out(s, p_cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v), NULL);
    } else if (!strcmp(s, "pool_destroy")) {
        out(s, p_cuMemPoolDestroy(pool), NULL);
    } else if (!strcmp(s, "vmm")) {
        size_t mib = ARG(2);
        const char *where = i < argc ? argv[i++] : "dev";
        int id = (int)ARG(0);
        CUmemAllocationProp prop = {0};
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = !strcmp(where, "host") ? CU_MEM_LOCATION_TYPE_HOST_NUMA : CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = id;
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        CUresult r = p_cuMemCreate(&vh[nvh], mib * MIB, &prop, 0);
        if (r == CUDA_SUCCESS) vsz[nvh++] = mib * MIB;
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_map")) {
        int k = nvh - 1;
        CUresult r = k < 0 ? 1 : p_cuMemAddressReserve(&vaddr[k], vsz[k], 0, 0, 0);
        if (!r) r = p_cuMemMap(vaddr[k], vsz[k], 0, vh[k], 0);
        CUmemAccessDesc ad = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, 3};
        if (!r) r = p_cuMemSetAccess(vaddr[k], vsz[k], &ad, 1);
        if (!r) { maddr[nmap] = vaddr[k]; mres[nmap] = mlen[nmap] = vsz[k]; nmap++; }
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_unmap")) {
        int k = nmap - 1;
        CUresult r = k < 0 ? 1 : p_cuMemUnmap(maddr[k], mlen[k]);
        if (!r) r = p_cuMemAddressFree(maddr[k], mres[k]);
        if (!r) nmap--;
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_map_part")) {
        int k = nvh - 1;
        size_t len = ARG(2) * MIB;
        CUresult r = k < 0 ? 1 : p_cuMemAddressReserve(&vaddr[k], vsz[k], 0, 0, 0);
        if (!r) r = p_cuMemMap(vaddr[k], len, 0, vh[k], 0);
        if (!r) { maddr[nmap] = vaddr[k]; mres[nmap] = vsz[k]; mlen[nmap] = len; nmap++; }
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_retain")) {
        int k = nmap - 1;
        CUresult r = k < 0 ? 1 : p_cuMemRetainAllocationHandle(&vh[nvh], (void *)(uintptr_t)maddr[k]);
        if (!r) { vsz[nvh] = mres[k]; nvh++; }
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_share") || !strcmp(s, "vmm_share_foreign")) {
        int k = nvh - 1, fd = -1, import_fd = -1;
        CUresult r = k < 0 ? 1 : p_cuMemExportToShareableHandle(&fd, vh[k], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (!r && !strcmp(s, "vmm_share_foreign")) {
            char path[64];
            snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
            import_fd = open(path, O_RDONLY | O_CLOEXEC);
            if (import_fd < 0) r = 1;
        }
        if (!r) r = p_cuMemImportFromShareableHandle(&vh[nvh], (void *)(intptr_t)(import_fd >= 0 ? import_fd : fd),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (!r) { vsz[nvh] = vsz[k]; nvh++; }
        if (fd >= 0) close(fd);
        if (import_fd >= 0) close(import_fd);
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_release_prev")) {
        CUresult r = nvh < 2 ? 1 : p_cuMemRelease(vh[nvh - 2]);
        if (!r) { vh[nvh - 2] = vh[nvh - 1]; vsz[nvh - 2] = vsz[nvh - 1]; nvh--; }
        out(s, r, NULL);
    } else if (!strcmp(s, "vmm_release")) {
        out(s, nvh ? p_cuMemRelease(vh[--nvh]) : 1, NULL);
    } else if (!strcmp(s, "thread_vmm")) {
        struct tv t = {ARG(64), 0, 0};
        t.dev = (int)ARG(0);
        pthread_t th;
        pthread_create(&th, NULL, thread_vmm, &t);
        pthread_join(th, NULL);
        out(s, t.rc, NULL);
    } else if (!strcmp(s, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {ARG(1024), ARG(1024), CU_AD_FORMAT_FLOAT, 4};
        CUresult r = p_cuArrayCreate_v2(&arrs[narr], &d);
        if (!r) arr_is_mip[narr++] = 0;
        out(s, r, NULL);
    } else if (!strcmp(s, "array3d")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {ARG(256), ARG(256), ARG(256), CU_AD_FORMAT_FLOAT, 1, 0};
        d.NumChannels = (unsigned)ARG(1);
        CUresult r = p_cuArray3DCreate_v2(&arrs[narr], &d);
        if (!r) arr_is_mip[narr++] = 0;
        out(s, r, NULL);
    } else if (!strcmp(s, "mipmap")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {ARG(1024), ARG(1024), 0, CU_AD_FORMAT_FLOAT, 4, 0};
        unsigned lv = (unsigned)ARG(4);
        CUresult r = p_cuMipmappedArrayCreate((CUmipmappedArray *)&arrs[narr], &d, lv);
        if (!r) arr_is_mip[narr++] = 1;
        out(s, r, NULL);
    } else if (!strcmp(s, "array_destroy")) {
        CUresult r = 1;
        if (narr) {
            narr--;
            r = arr_is_mip[narr] ? p_cuMipmappedArrayDestroy((CUmipmappedArray)arrs[narr]) : p_cuArrayDestroy(arrs[narr]);
        }
        out(s, r, NULL);
    } else if (!strcmp(s, "hostalloc")) {
        CUresult r = p_cuMemHostAlloc(&hosts[nhost], ARG(1) * MIB, 0);
        if (!r) nhost++;
        out(s, r, NULL);
    } else if (!strcmp(s, "hostfree")) {
        out(s, nhost ? p_cuMemFreeHost(hosts[--nhost]) : 1, NULL);
    } else if (!strcmp(s, "launch")) {
        int n = (int)ARG(1);
        CUresult r = 0;
        for (int k = 0; k < n && !r; k++) r = p_cuLaunchKernel((CUfunction)(uintptr_t)0x1000, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        out(s, r, NULL);
    } else if (!strcmp(s, "ctxsync")) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CUresult r = p_cuCtxSynchronize();
        clock_gettime(CLOCK_MONOTONIC, &b);
        out(s, r, "waited_us=%lld", (long long)((b.tv_sec - a.tv_sec) * 1000000LL + (b.tv_nsec - a.tv_nsec) / 1000));
    } else if (!strcmp(s, "sleep")) {
        usleep((useconds_t)ARG(10) * 1000);
    } else if (!strcmp(s, "hold")) {
        out(s, 0, NULL);
        for (;;) pause();
    } else if (!strcmp(s, "kill")) {
        raise(SIGKILL);
    } else if (!strcmp(s, "loop")) {
        int n = (int)ARG(1), end = i;
        while (end < argc && strcmp(argv[end], ";")) end++;
        quiet++;
        long long max_iter_us = 0; /* the longest iteration: a wait on a peer's lock shows here */
        for (int k = 0; k < n; k++) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            run(end, argv, i);
            clock_gettime(CLOCK_MONOTONIC, &b);
            long long us = (b.tv_sec - a.tv_sec) * 1000000LL + (b.tv_nsec - a.tv_nsec) / 1000;
            if (us > max_iter_us) max_iter_us = us;
        }
        quiet--;
        out("loop", 0, "n=%d max_iter_us=%lld", n, max_iter_us);
        return end < argc ? end + 1 : end;
    } else {
        fprintf(stderr, "unknown step %s\n", s);
        exit(2);
    }
    return i;
}

static int run(int argc, char **argv, int i)
{
    while (i < argc) i = step(argc, argv, i);
    return i;
}

int main(int argc, char **argv)
{
    load_cuda();
    run(argc, argv, 1);
    return 0;
}
