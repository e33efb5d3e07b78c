/* real.c: finding the real driver's functions, once, under pthread_once.
 *
 * We export our own dlsym (so that dlsym(libcuda, "cuMemAlloc_v2") and dlsym(RTLD_NEXT, ...)
 * return our hooks). Calling dlsym by name from here would therefore call ourselves. The real
 * one is reached through dlvsym, which we do not interpose: glibc exports dlsym under a
 * symbol version (GLIBC_2.2.5 on x86_64, GLIBC_2.17 on aarch64, and GLIBC_2.34 since libdl
 * moved into libc), and dlvsym(RTLD_NEXT, "dlsym", <version>) names glibc's implementation
 * directly, never ours. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>
#include "egpu_log.h"
#include "egpu_state.h"

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn g_real_dlsym;
static pthread_once_t g_dlsym_once = PTHREAD_ONCE_INIT;

EGPU_NO_SANITIZE static void find_real_dlsym(void)
{
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !g_real_dlsym; i++)
        g_real_dlsym = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!g_real_dlsym) EGPU_ERR("cannot find the C library's dlsym; symbol lookups will fail");
}

EGPU_NO_SANITIZE void *egpu_real_dlsym(void *handle, const char *name)
{
    pthread_once(&g_dlsym_once, find_real_dlsym);
    return g_real_dlsym ? g_real_dlsym(handle, name) : NULL;
}

static void *sym(void *lib, const char *name, int required, int *ok)
{
    dlerror();
    void *p = egpu_real_dlsym(lib, name);
    const char *e = dlerror();
    if (!p || e) {
        if (required) {
            EGPU_ERR("the driver lacks %s (%s)", name, e ? e : "not found");
            *ok = 0;
        }
        return NULL;
    }
    return p;
}

#define IS_REQ_R 1
#define IS_REQ_O 0

void egpu_real_init(void)
{
    egpu_state *s = &egpu_g;
    s->libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!s->libcuda) {
        EGPU_ERR("cannot load libcuda.so.1: %s", dlerror());
        return;
    }
    int ok = 1;
    /* Forwarding targets of every hook are optional (an old driver may lack cuMemCreate);
     * a hook whose real function is missing answers CUDA_ERROR_NOT_SUPPORTED. */
#define LOAD_HOOK(name, base, ver, pt, params) *(void **)&s->real.name = sym(s->libcuda, #name, 0, &ok);
#define LOAD_CALL(name, req, params) *(void **)&s->real.name = sym(s->libcuda, #name, IS_REQ_##req, &ok);
    EGPU_CU_HOOKS(LOAD_HOOK)
    EGPU_CU_CALLS(LOAD_CALL)
#undef LOAD_HOOK
#undef LOAD_CALL
    if (!s->real.cuInit || !s->real.cuMemAlloc_v2 || !s->real.cuMemFree_v2 || !s->real.cuMemGetInfo_v2) {
        EGPU_ERR("libcuda.so.1 lacks the basic memory functions");
        ok = 0;
    }
    s->real_ok = ok;
}

void egpu_real_nvml_init(void)
{
    egpu_state *s = &egpu_g;
    s->libnvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!s->libnvml) {
        EGPU_ERR("cannot load libnvidia-ml.so.1: %s", dlerror());
        return;
    }
    int ok = 1;
#define LOAD_HOOK(name, base, ver, pt, params) *(void **)&s->real.name = sym(s->libnvml, #name, 0, &ok);
#define LOAD_CALL(name, req, params) *(void **)&s->real.name = sym(s->libnvml, #name, IS_REQ_##req, &ok);
    EGPU_NVML_HOOKS(LOAD_HOOK)
    EGPU_NVML_CALLS(LOAD_CALL)
#undef LOAD_HOOK
#undef LOAD_CALL
}
