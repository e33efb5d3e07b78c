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

const egpu_hook_ent *egpu_hook_by_proc(const char *base, int version, cuuint64_t flags)
{
    int want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const egpu_hook_ent *best = NULL;
    int has_pt = 0;
    if (!base) return NULL;
    for (int i = 0; i < egpu_hook_count; i++)
        if (!strcmp(egpu_hook_table[i].base, base) && egpu_hook_table[i].per_thread) has_pt = 1;
    for (int i = 0; i < egpu_hook_count; i++) {
        const egpu_hook_ent *h = &egpu_hook_table[i];
        if (strcmp(h->base, base) || h->version > version) continue;
        if (h->per_thread != (want_pt && has_pt)) continue;
        if (!best || h->version > best->version) best = h;
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
