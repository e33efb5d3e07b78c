/* hook_table.c: the name table and lookups, generated from the one list in egpu_hooks.h. */
#include <stddef.h>
#include <string.h>
#include "egpu_state.h"

#define ENT(name, base, ver, pt, params) {#name, #base, ver, pt, (void *)name, offsetof(egpu_real_fns, name)},
const egpu_hook_ent egpu_hook_table[] = {
    EGPU_CU_HOOKS(ENT)
    EGPU_NVML_HOOKS(ENT)
};
#undef ENT
const int egpu_hook_count = (int)(sizeof egpu_hook_table / sizeof egpu_hook_table[0]);

EGPU_NO_SANITIZE const egpu_hook_ent *egpu_hook_by_name(const char *name)
{
    if (!name || (name[0] != 'c' && name[0] != 'n')) return NULL;
    for (int i = 0; i < egpu_hook_count; i++) {
        const char *a = egpu_hook_table[i].name, *b = name; /* plain loop: no interceptor */
        while (*a && *a == *b) { a++; b++; }
        if (*a == *b) return &egpu_hook_table[i];
    }
    return NULL;
}

/* cuGetProcAddress names that mean a hooked function of another name from a version on. */
typedef struct { const char *base; int version, per_thread; const char *name; } proc_alias;
#define ALIAS(base, ver, pt, name) {#base, ver, pt, #name},
static const proc_alias proc_aliases[] = {EGPU_CU_PROC_ALIASES(ALIAS)};
#undef ALIAS
#define N_PROC_ALIASES ((int)(sizeof proc_aliases / sizeof proc_aliases[0]))

const egpu_hook_ent *egpu_hook_by_proc(const char *base, int version, cuuint64_t flags)
{
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const egpu_hook_ent *best = NULL;
    int best_ver = 0, has_pt = 0;
    if (!base) return NULL;
    for (int i = 0; i < egpu_hook_count; i++)
        if (!strcmp(egpu_hook_table[i].base, base) && egpu_hook_table[i].per_thread) has_pt = 1;
    for (int i = 0; i < N_PROC_ALIASES; i++)
        if (!strcmp(proc_aliases[i].base, base) && proc_aliases[i].per_thread) has_pt = 1;
    for (int i = 0; i < egpu_hook_count; i++) {
        const egpu_hook_ent *h = &egpu_hook_table[i];
        if (strcmp(h->base, base) || h->version > version) continue;
        if (h->per_thread != (want_pt && has_pt)) continue;
        if (!best || h->version > best_ver) best = h, best_ver = h->version;
    }
    /* a later version's meaning wins: cuGraphInstantiate at 12000 is WithFlags, not _v2 */
    for (int i = 0; i < N_PROC_ALIASES; i++) {
        const proc_alias *a = &proc_aliases[i];
        if (strcmp(a->base, base) || a->version > version || a->per_thread != (want_pt && has_pt)) continue;
        if (!best || a->version > best_ver) best = egpu_hook_by_name(a->name), best_ver = a->version;
    }
    return best;
}

const egpu_hook_ent *egpu_hook_by_real(const void *real)
{
    if (!real) return NULL;
    for (int i = 0; i < egpu_hook_count; i++) {
        void *const *slot = (void *const *)((const char *)&egpu_g.real + egpu_hook_table[i].real_off);
        if (*slot == real) return &egpu_hook_table[i];
    }
    return NULL;
}
