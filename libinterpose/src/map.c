/* map.c: process-local open-addressing hash map, (kind, key) -> (bytes, device). */
#include <stdlib.h>
#include <string.h>
#include "egpu_state.h"

static size_t hash(uint64_t key, int kind)
{
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h ^ (h >> 29));
}

#define TOMB (-1)

static int grow(egpu_map *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    if (m->count * 4 < m->cap) ncap = m->cap; /* mostly tombstones: rehash in place size */
    egpu_map_ent *ns = calloc(ncap, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < m->cap; i++) {
        egpu_map_ent *e = &m->slots[i];
        if (e->kind <= 0) continue;
        size_t j = hash(e->key, e->kind) & (ncap - 1);
        while (ns[j].kind) j = (j + 1) & (ncap - 1);
        ns[j] = *e;
    }
    free(m->slots);
    m->slots = ns;
    m->cap = ncap;
    m->tombs = 0;
    return 0;
}

void egpu_map_put(egpu_map *m, int kind, uint64_t key, uint64_t bytes, int dev)
{
    egpu_map_ent e = {key, bytes, 0, 0, dev, kind};
    egpu_map_put_ent(m, &e);
}

void egpu_map_put_ent(egpu_map *m, const egpu_map_ent *e)
{
    pthread_mutex_lock(&m->mu);
    if ((m->count + m->tombs + 1) * 2 > m->cap && grow(m) != 0) {
        pthread_mutex_unlock(&m->mu);
        return; /* out of host memory: the charge stays until the process exits */
    }
    size_t j = hash(e->key, e->kind) & (m->cap - 1);
    while (m->slots[j].kind > 0) j = (j + 1) & (m->cap - 1);
    if (m->slots[j].kind == TOMB) m->tombs--;
    m->slots[j] = *e;
    m->count++;
    pthread_mutex_unlock(&m->mu);
}

int egpu_map_take(egpu_map *m, int kind, uint64_t key, uint64_t *bytes, int *dev)
{
    egpu_map_ent e;
    if (egpu_map_take_ent(m, kind, key, &e) != 0) return -1;
    *bytes = e.bytes;
    *dev = e.dev;
    return 0;
}

size_t egpu_map_take_ctx(egpu_map *m, uint64_t ctx, egpu_map_ent **out)
{
    size_t n = 0, cap = 0;
    *out = NULL;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->cap; i++) {
        egpu_map_ent *e = &m->slots[i];
        if ((e->kind != MAP_PTR && e->kind != MAP_ARRAY && e->kind != MAP_LIMIT) || e->ctx != ctx) continue;
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            egpu_map_ent *ns = realloc(*out, nc * sizeof *ns);
            if (!ns) break; /* out of host memory: the rest stays charged until exit */
            *out = ns;
            cap = nc;
        }
        (*out)[n++] = *e;
        e->kind = TOMB;
        m->count--;
        m->tombs++;
    }
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* m->mu held: the live entry (kind, key), or NULL. */
static egpu_map_ent *find_locked(egpu_map *m, int kind, uint64_t key)
{
    if (!m->cap) return NULL;
    for (size_t j = hash(key, kind) & (m->cap - 1); m->slots[j].kind; j = (j + 1) & (m->cap - 1))
        if (m->slots[j].kind == kind && m->slots[j].key == key) return &m->slots[j];
    return NULL;
}

int egpu_map_take_ent(egpu_map *m, int kind, uint64_t key, egpu_map_ent *out)
{
    pthread_mutex_lock(&m->mu);
    egpu_map_ent *e = find_locked(m, kind, key);
    if (e) {
        *out = *e;
        e->kind = TOMB;
        m->count--;
        m->tombs++;
    }
    pthread_mutex_unlock(&m->mu);
    return e ? 0 : -1;
}

int egpu_map_get_ent(egpu_map *m, int kind, uint64_t key, egpu_map_ent *out)
{
    pthread_mutex_lock(&m->mu);
    egpu_map_ent *e = find_locked(m, kind, key);
    if (e) *out = *e;
    pthread_mutex_unlock(&m->mu);
    return e ? 0 : -1;
}

int egpu_map_set_aux(egpu_map *m, int kind, uint64_t key, uint64_t aux)
{
    pthread_mutex_lock(&m->mu);
    egpu_map_ent *e = find_locked(m, kind, key);
    if (e) e->aux = aux;
    pthread_mutex_unlock(&m->mu);
    return e ? 0 : -1;
}
