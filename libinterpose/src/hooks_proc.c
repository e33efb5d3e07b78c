/* hooks_proc.c: every way of finding a driver function leads to our hooks (FC-06).
 *
 * cuGetProcAddress(_v2): the real driver resolves the versioned name (cuMemAlloc at 3020 is
 * cuMemAlloc_v2, per-thread flags pick _ptsz/_ptds). If the address it returns is the real
 * function behind one of our hooks, we hand back that hook; so the versioned choice is the
 * driver's own. As a second check, names we hook are also resolved by our table (base,
 * version, per-thread) in case a driver returns an address that is not its exported symbol.
 * Everything else is the driver's own entry point, untouched.
 *
 * dlsym: a hooked name gives our hook whatever the handle (libcuda's handle, RTLD_NEXT,
 * RTLD_DEFAULT), never NULL; other names go to the C library's dlsym. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include "egpu_log.h"
#include "egpu_state.h"

#define R (egpu_g.real)

static void *pick_hook(const char *symbol, void *real_fn, int version, cuuint64_t flags)
{
    const egpu_hook_ent *h = egpu_hook_by_real(real_fn);
    if (!h) h = egpu_hook_by_proc(symbol, version, flags);
    if (h && strncmp(h->name, "nvml", 4) != 0) return h->hook;
    return real_fn;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    pthread_once(&egpu_g.real_once, egpu_real_init);
    if (!R.cuGetProcAddress) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = R.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = pick_hook(symbol, *pfn, cudaVersion, flags);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *status)
{
    pthread_once(&egpu_g.real_once, egpu_real_init);
    if (!R.cuGetProcAddress_v2) return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = R.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn) *pfn = pick_hook(symbol, *pfn, cudaVersion, flags);
    return r;
}

EGPU_NO_SANITIZE void *dlsym(void *handle, const char *symbol)
{
    const egpu_hook_ent *h = egpu_hook_by_name(symbol);
    if (h) return h->hook;
    return egpu_real_dlsym(handle, symbol);
}
