/* fc06_paths: every way of finding cuMemAlloc_v2 must give the interposer's function, and a
 * 2 GiB allocation must fail on each path under a 1024 MiB share (FC-06). */
#include <string.h>
#include "probe_util.h"

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

static int check(const char *path, void *fn)
{
    Dl_info di;
    const char *lib = fn && dladdr(fn, &di) && di.dli_fname ? di.dli_fname : "?";
    const char *sym = fn && dladdr(fn, &di) && di.dli_sname ? di.dli_sname : "?";
    int ours = strstr(lib, "egpu_interpose") != NULL;
    CUresult big = CUDA_ERROR_UNKNOWN, small = CUDA_ERROR_UNKNOWN;
    if (fn) {
        CUdeviceptr p = 0;
        big = ((alloc_fn)fn)(&p, 2048ull << 20);
        if (big == CUDA_SUCCESS) p_cuMemFree_v2(p);
        small = ((alloc_fn)fn)(&p, 1 << 20);
        if (small == CUDA_SUCCESS) p_cuMemFree_v2(p);
    }
    printf("%s fn=%s sym=%s ours=%d big_rc=%d small_rc=%d\n", path, fn ? "set" : "null", sym, ours, big, small);
    return fn && ours && big == CUDA_ERROR_OUT_OF_MEMORY && small == CUDA_SUCCESS;
}

int main(void)
{
    load_cuda();
    CUcontext c;
    if (p_cuInit(0) || p_cuCtxCreate_v2(&c, 0, 0)) { printf("setup failed\n"); return 1; }
    int ok = 1;
    int versions[] = {11030, 12000, 13000};
    for (int i = 0; i < 3; i++) {
        void *fn = NULL;
        char path[64];
        p_cuGetProcAddress("cuMemAlloc", &fn, versions[i], 0);
        snprintf(path, sizeof path, "getproc@%d", versions[i]);
        ok &= check(path, fn);
        fn = NULL;
        CUdriverProcAddressQueryResult st;
        p_cuGetProcAddress_v2("cuMemAlloc", &fn, versions[i], CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
        snprintf(path, sizeof path, "getproc_v2_ptds@%d", versions[i]);
        ok &= check(path, fn);
        fn = NULL;
        p_cuGetProcAddress_v2("cuMemAlloc", &fn, versions[i], CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st);
        snprintf(path, sizeof path, "getproc_v2_legacy@%d", versions[i]);
        ok &= check(path, fn);
    }
    ok &= check("dlsym_next", dlsym(RTLD_NEXT, "cuMemAlloc_v2"));
    ok &= check("dlsym_default", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    ok &= check("dlopen_dlsym", h ? dlsym(h, "cuMemAlloc_v2") : NULL);
    ok &= check("direct", (void *)p_cuMemAlloc_v2);
    /* cuGetProcAddress for cuGetProcAddress itself, then through it again. */
    void *gpa = NULL;
    p_cuGetProcAddress("cuGetProcAddress", &gpa, 12000, 0);
    Dl_info di;
    int gpa_ours = gpa && dladdr(gpa, &di) && strstr(di.dli_fname, "egpu_interpose");
    printf("getproc_self fn=%s ours=%d sym=%s\n", gpa ? "set" : "null", gpa_ours, gpa && di.dli_sname ? di.dli_sname : "?");
    ok &= gpa_ours;
    if (gpa) {
        void *fn = NULL;
        ((CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))gpa)("cuMemAlloc", &fn, 12000, 0, NULL);
        ok &= check("getproc_via_self", fn);
    }
    printf("%s\n", ok ? "ALL-OK" : "FAILED");
    return ok ? 0 : 1;
}
