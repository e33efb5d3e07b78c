/* fakegpu: card config (FAKEGPU_CONFIG, ini; else /etc/fakegpu/cards.ini where present) and the
 * card-wide shared state (FAKEGPU_STATE_DIR/state, else /var/run/fakegpu where present, mmap'd, robust process-shared mutex, per-pid usage so that a
 * dead process's memory is reclaimed). */
#define _GNU_SOURCE
#include "fake_common.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static fg_world g_world;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

uint64_t fg_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = 0;
    if (e > s + 1 && (*s == '"' || *s == '\'') && e[-1] == *s) { e[-1] = 0; s++; }
    return s;
}

/* Where the fake container toolkit (devcluster/fake_toolkit.py) puts the container's card list
 * and the card-wide state: read there when the environment does not say, as the real driver
 * needs no environment (a process `kubectl exec` starts gets containerd's copy of the
 * container's environment, without what the toolkit added at create). */
#define FG_CONTAINER_CONFIG "/etc/fakegpu/cards.ini"
#define FG_CONTAINER_STATE "/var/run/fakegpu"

static const char *env_or_present(const char *name, const char *fallback, int want_dir)
{
    const char *v = getenv(name);
    if (v && *v) return v;
    struct stat st;
    if (stat(fallback, &st) == 0 && (want_dir ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode))) return fallback;
    return NULL;
}

/* Config: ini sections "[card]" with uuid=, name=, memory_mib=, numa_node=. */
static void load_config(fg_world *w)
{
    const char *path = env_or_present("FAKEGPU_CONFIG", FG_CONTAINER_CONFIG, 0);
    FILE *f = path && *path ? fopen(path, "r") : NULL;
    if (path && *path && !f) fprintf(stderr, "fakegpu: cannot open FAKEGPU_CONFIG %s\n", path);
    if (!f) {
        w->ncards = 1;
        snprintf(w->card[0].uuid, sizeof w->card[0].uuid, "GPU-00000000-0000-0000-0000-000000000000");
        snprintf(w->card[0].name, sizeof w->card[0].name, "NVIDIA Fake GPU");
        w->card[0].total = 24576ull << 20;
        w->card[0].numa_node = 0;
        return;
    }
    char line[512];
    fg_card_cfg *c = NULL;
    while (fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (!*s || *s == '#' || *s == ';') continue;
        if (*s == '[') {
            if (w->ncards >= FG_MAX_CARDS) break;
            c = &w->card[w->ncards++];
            memset(c, 0, sizeof *c);
            snprintf(c->uuid, sizeof c->uuid, "GPU-%08x-0000-0000-0000-%012x", w->ncards - 1, w->ncards - 1);
            snprintf(c->name, sizeof c->name, "NVIDIA Fake GPU");
            c->total = 24576ull << 20;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq || !c) continue;
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        if (!strcmp(k, "uuid")) snprintf(c->uuid, sizeof c->uuid, "%s", v);
        else if (!strcmp(k, "name") || !strcmp(k, "model")) snprintf(c->name, sizeof c->name, "%s", v);
        else if (!strcmp(k, "memory_mib")) c->total = strtoull(v, NULL, 10) << 20;
        else if (!strcmp(k, "numa_node")) c->numa_node = atoi(v);
    }
    fclose(f);
}

/* A waiter can sleep on a free lock: a killed process can take a wakeup with it (seen under
 * bench/accounting_storm.py: lock word 0, a waiter asleep). A driver's processes never hang on
 * each other that way, so the wait is in slices and a slice that ends retries the lock. */
#define LOCK_SLICE_MS 50
static int lock(fg_shared *sh)
{
    int r = pthread_mutex_trylock(&sh->mu); /* the common case: no clock read */
    while (r == EBUSY || r == ETIMEDOUT) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += LOCK_SLICE_MS * 1000000L;
        dl.tv_sec += dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        r = pthread_mutex_timedlock(&sh->mu, &dl);
    }
    if (r == EOWNERDEAD) {
        /* The owner died mid-update: recompute card usage from the per-process rows. */
        for (uint32_t c = 0; c < sh->ncards; c++) {
            uint64_t sum = 0;
            for (int p = 0; p < FG_MAX_PROCS; p++)
                if (sh->procs[p].pid) sum += sh->procs[p].used[c];
            sh->cards[c].used = sum;
        }
        pthread_mutex_consistent(&sh->mu);
        r = 0;
    }
    return r;
}

static int pid_dead(pid_t pid) { return kill(pid, 0) == -1 && errno == ESRCH; }

static void reap_locked(fg_shared *sh)
{
    for (int p = 0; p < FG_MAX_PROCS; p++) {
        fg_proc *pr = &sh->procs[p];
        if (!pr->pid || !pid_dead(pr->pid)) continue;
        for (uint32_t c = 0; c < sh->ncards; c++) {
            uint64_t u = pr->used[c];
            sh->cards[c].used = sh->cards[c].used > u ? sh->cards[c].used - u : 0;
        }
        memset(pr, 0, sizeof *pr);
    }
}

static void attach(fg_world *w)
{
    const char *dir = env_or_present("FAKEGPU_STATE_DIR", FG_CONTAINER_STATE, 1);
    snprintf(w->state_dir, sizeof w->state_dir, "%s", dir && *dir ? dir : "/tmp/fakegpu-state");
    mkdir(w->state_dir, 0777);
    char path[600];
    snprintf(path, sizeof path, "%s/state", w->state_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) { fprintf(stderr, "fakegpu: cannot open %s: %s\n", path, strerror(errno)); abort(); }
    flock(fd, LOCK_EX);
    struct stat st;
    fstat(fd, &st);
    if ((size_t)st.st_size < sizeof(fg_shared) && ftruncate(fd, sizeof(fg_shared)) != 0) abort();
    fg_shared *sh = mmap(NULL, sizeof(fg_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (sh == MAP_FAILED) abort();
    if (sh->magic != FG_MAGIC) {
        memset(sh, 0, sizeof *sh);
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&sh->mu, &a);
        sh->magic = FG_MAGIC;
    }
    flock(fd, LOCK_UN);
    close(fd);
    w->sh = sh;
    lock(sh);
    reap_locked(sh);
    for (int i = 0; i < w->ncards; i++) {
        int s = -1;
        for (uint32_t c = 0; c < sh->ncards; c++)
            if (!strcmp(sh->cards[c].uuid, w->card[i].uuid)) s = (int)c;
        if (s < 0 && sh->ncards < FG_MAX_CARDS) {
            s = (int)sh->ncards++;
            snprintf(sh->cards[s].uuid, sizeof sh->cards[s].uuid, "%s", w->card[i].uuid);
        }
        if (s >= 0) sh->cards[s].total = w->card[i].total;
        w->slot[i] = s;
    }
    w->proc_slot = -1;
    pthread_mutex_unlock(&sh->mu);
}

static void init_world(void)
{
    load_config(&g_world);
    attach(&g_world);
}

fg_world *fg_get(void)
{
    pthread_once(&g_once, init_world);
    return &g_world;
}

static fg_proc *my_proc_locked(fg_world *w)
{
    pid_t me = getpid();
    if (w->proc_slot >= 0 && w->pid == me && w->sh->procs[w->proc_slot].pid == me)
        return &w->sh->procs[w->proc_slot];
    for (int p = 0; p < FG_MAX_PROCS; p++)
        if (w->sh->procs[p].pid == me) { w->proc_slot = p; w->pid = me; return &w->sh->procs[p]; }
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < FG_MAX_PROCS; p++)
            if (!w->sh->procs[p].pid) {
                memset(&w->sh->procs[p], 0, sizeof w->sh->procs[p]);
                w->sh->procs[p].pid = me;
                w->proc_slot = p;
                w->pid = me;
                return &w->sh->procs[p];
            }
        reap_locked(w->sh);
    }
    return NULL;
}

int fg_charge(int card, uint64_t bytes)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0) return -1;
    fg_shared *sh = w->sh;
    lock(sh);
    int ok = 0;
    for (int pass = 0; pass < 2 && !ok; pass++) {
        fg_card_state *c = &sh->cards[s];
        if (c->used <= c->total && bytes <= c->total - c->used) ok = 1;
        else if (pass == 0) reap_locked(sh);
    }
    fg_proc *p = ok ? my_proc_locked(w) : NULL;
    if (p) {
        sh->cards[s].used += bytes;
        p->used[s] += bytes;
    }
    pthread_mutex_unlock(&sh->mu);
    return p ? 0 : -1;
}

void fg_uncharge(int card, uint64_t bytes)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0 || !bytes) return;
    fg_shared *sh = w->sh;
    lock(sh);
    fg_proc *p = my_proc_locked(w);
    if (p) p->used[s] = p->used[s] > bytes ? p->used[s] - bytes : 0;
    sh->cards[s].used = sh->cards[s].used > bytes ? sh->cards[s].used - bytes : 0;
    pthread_mutex_unlock(&sh->mu);
}

void fg_reap(void)
{
    fg_world *w = fg_get();
    lock(w->sh);
    reap_locked(w->sh);
    pthread_mutex_unlock(&w->sh->mu);
}

uint64_t fg_card_used(int card)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0) return 0;
    lock(w->sh);
    uint64_t u = w->sh->cards[s].used;
    pthread_mutex_unlock(&w->sh->mu);
    return u;
}

int fg_card_procs(int card, int32_t *pids, uint64_t *bytes, int max)
{
    fg_world *w = fg_get();
    int s = w->slot[card], n = 0;
    if (s < 0) return 0;
    lock(w->sh);
    reap_locked(w->sh);
    for (int p = 0; p < FG_MAX_PROCS; p++) {
        fg_proc *pr = &w->sh->procs[p];
        if (!pr->pid || !pr->used[s]) continue;
        if (n < max) { pids[n] = pr->pid; bytes[n] = pr->used[s]; }
        n++;
    }
    pthread_mutex_unlock(&w->sh->mu);
    return n;
}

int fg_parse_uuid(const char *s, unsigned char out[16])
{
    if (strncmp(s, "GPU-", 4) == 0) s += 4;
    int n = 0;
    while (*s && n < 32) {
        if (*s == '-') { s++; continue; }
        if (!isxdigit((unsigned char)*s)) return -1;
        int v = isdigit((unsigned char)*s) ? *s - '0' : (tolower((unsigned char)*s) - 'a' + 10);
        if (n % 2 == 0) out[n / 2] = (unsigned char)(v << 4);
        else out[n / 2] |= (unsigned char)v;
        n++;
        s++;
    }
    return n == 32 ? 0 : -1;
}
