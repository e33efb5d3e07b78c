/* fakegpu: card config (FAKEGPU_CONFIG, ini; else /etc/fakegpu/cards.ini where present) and the
 * card-wide shared state (FAKEGPU_STATE_DIR/state, else /var/run/fakegpu where present, mmap'd, robust process-shared mutex, usage per process so that a
 * dead process's memory is reclaimed: liveness by an OFD lock of <state dir>/live, see row_alive). */
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
#include <sys/random.h>
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

/* Config: ini sections "[card]" with uuid=, name=, memory_mib=, numa_node=, multicast=. */
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
        if (!eq) continue;
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        if (!c) { /* the driver's keys come before the first [card] */
            if (!strcmp(k, "driver_version")) snprintf(w->driver_version, sizeof w->driver_version, "%s", v);
            continue;
        }
        if (!strcmp(k, "uuid")) snprintf(c->uuid, sizeof c->uuid, "%s", v);
        else if (!strcmp(k, "name") || !strcmp(k, "model")) snprintf(c->name, sizeof c->name, "%s", v);
        else if (!strcmp(k, "memory_mib")) c->total = strtoull(v, NULL, 10) << 20;
        else if (!strcmp(k, "numa_node")) c->numa_node = atoi(v);
        else if (!strcmp(k, "multicast")) c->multicast = atoi(v) != 0;
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

/* Liveness, as the driver knows it: a process's memory is freed when the process is gone.
 * Each process holds an OFD write lock on byte <its row> of <state dir>/live while it lives;
 * the kernel drops the lock when the process's last descriptor of that open file closes (exit
 * or kill), whatever PID namespace the process runs in. A pid alone cannot tell: processes in
 * containers see the pids of their own namespace (every container has a PID 1), and kill(pid,
 * 0) found a killed container's PID 1 alive, its memory charged for ever (bench/
 * node_restarts.py's fake_leaked_mib). */
static void fresh_identity(fg_world *w)
{
    if (w->live_fd >= 0) close(w->live_fd); /* a parent's: its open file and lock stay its own */
    char path[600];
    snprintf(path, sizeof path, "%s/live", w->state_dir);
    w->live_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (w->live_fd >= 0) (void)fchmod(w->live_fd, 0666); /* every container's user locks it */
    if (getrandom(&w->token, sizeof w->token, GRND_NONBLOCK) != (ssize_t)sizeof w->token)
        w->token = ((uint64_t)getpid() << 32) ^ fg_now_ns(); /* no getrandom: unique enough */
    if (!w->token) w->token = 1; /* 0 is a free row's */
    w->pid = getpid();
    w->proc_slot = -1;
}

static void own_identity(fg_world *w)
{
    if (w->pid != getpid()) fresh_identity(w);
}

/* 1: row p's process lives; 0: it is gone. Mine is alive (my own lock never conflicts). */
static int row_alive(const fg_world *w, const fg_proc *pr, int p)
{
    if (p == w->proc_slot) return 1;
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = p, .l_len = 1};
    if (pr->live_lock && w->live_fd >= 0 && fcntl(w->live_fd, F_OFD_GETLK, &fl) == 0)
        return fl.l_type != F_UNLCK;
    return !pid_dead(pr->pid); /* a row without a lock: its pid, as seen from here */
}

static void reap_locked(fg_shared *sh)
{
    fg_world *w = &g_world;
    own_identity(w); /* a forked child probing through its parent's open file sees no locks */
    for (int p = 0; p < FG_MAX_PROCS; p++) {
        fg_proc *pr = &sh->procs[p];
        if (!pr->pid || row_alive(w, pr, p)) continue;
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
    w->live_fd = -1;
    fresh_identity(w);
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

/* The driver version NVML reports: FAKEGPU_DRIVER_VERSION, else the config's driver_version,
 * else 580.00.fake (a driver without per-cgroup memory limits). */
static void driver_version(fg_world *w)
{
    const char *env = getenv("FAKEGPU_DRIVER_VERSION");
    if (env && *env) snprintf(w->driver_version, sizeof w->driver_version, "%s", env);
    if (!w->driver_version[0]) snprintf(w->driver_version, sizeof w->driver_version, "580.00.fake");
    w->driver_major = atoi(w->driver_version);
}

static void init_world(void)
{
    load_config(&g_world);
    driver_version(&g_world);
    attach(&g_world);
}

fg_world *fg_get(void)
{
    pthread_once(&g_once, init_world);
    return &g_world;
}

static fg_proc *my_proc_locked(fg_world *w)
{
    own_identity(w);
    if (w->proc_slot >= 0 && w->sh->procs[w->proc_slot].token == w->token)
        return &w->sh->procs[w->proc_slot];
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < FG_MAX_PROCS; p++) {
            fg_proc *pr = &w->sh->procs[p];
            if (pr->pid) continue;
            struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = p, .l_len = 1};
            int locked = w->live_fd >= 0 && fcntl(w->live_fd, F_OFD_SETLK, &fl) == 0;
            if (w->live_fd >= 0 && !locked) continue; /* a row a live process still locks */
            memset(pr, 0, sizeof *pr);
            pr->pid = getpid();
            pr->token = w->token;
            pr->live_lock = locked;
            fg_self_cgroup(pr->cgroup, sizeof pr->cgroup);
            w->proc_slot = p;
            return pr;
        }
        reap_locked(w->sh);
    }
    return NULL;
}

/* ---- memory limits per cgroup ---------------------------------------------------------
 * As the driver's "misc" backend (docs.nvidia.com, "MPS v3 Memory Partitioning"): a flat map
 * of (cgroup, card) -> soft and hard limit; a process counts toward the limit of its nearest
 * limited ancestor; an allocation that would take that group's use past the hard limit fails
 * with out-of-memory; the soft limit is only reported. The real driver charges the task's
 * cgroup in the kernel; the fake reads the "0::" line of /proc/self/cgroup once, at a
 * process's first charge. */
void fg_self_cgroup(char *out, size_t n)
{
    out[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[FG_CGROUP_PATH + 16];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, n, "%s", line + 3);
            break;
        }
    fclose(f);
}

/* Whether cgroup ``path`` is ``group`` or inside it. */
static int in_group(const char *path, const char *group)
{
    size_t n = strlen(group);
    if (!path[0] || !n) return 0;
    if (!strcmp(group, "/")) return 1;
    return !strncmp(path, group, n) && (path[n] == 0 || path[n] == '/');
}

/* The limit entry of card slot ``s`` nearest above cgroup ``path``, or -1. */
static int nearest_limit_locked(fg_shared *sh, int s, const char *path)
{
    int best = -1;
    size_t best_len = 0;
    for (int i = 0; i < FG_MAX_LIMITS; i++) {
        fg_limit *l = &sh->limits[i];
        if (!l->cgroup[0] || (int)l->slot != s || !in_group(path, l->cgroup)) continue;
        size_t n = strlen(l->cgroup);
        if (best < 0 || n > best_len) { best = i; best_len = n; }
    }
    return best;
}

/* Card slot ``s`` memory of the live processes whose nearest limit is entry ``li``. */
static uint64_t limit_used_locked(fg_shared *sh, int s, int li)
{
    uint64_t sum = 0;
    for (int p = 0; p < FG_MAX_PROCS; p++)
        if (sh->procs[p].pid && nearest_limit_locked(sh, s, sh->procs[p].cgroup) == li) sum += sh->procs[p].used[s];
    return sum;
}

/* Whether the calling process may take ``bytes`` more of card slot ``s`` under its limit. */
static int within_limit_locked(fg_shared *sh, int s, const fg_proc *p, uint64_t bytes)
{
    int li = nearest_limit_locked(sh, s, p->cgroup);
    if (li < 0 || sh->limits[li].hard == UINT64_MAX) return 1;
    uint64_t used = limit_used_locked(sh, s, li), hard = sh->limits[li].hard;
    return used <= hard && bytes <= hard - used;
}

/* The inode of cgroup ``group`` under ``mount``, 0 when it is gone. */
static uint64_t group_ino(const char *mount, const char *group)
{
    char dir[FG_CGROUP_PATH + 4096];
    struct stat st;
    int n = snprintf(dir, sizeof dir, "%s%s", mount, group);
    if (n < 0 || (size_t)n >= sizeof dir || stat(dir, &st) != 0) return 0;
    return (uint64_t)st.st_ino;
}

/* A group that is gone, or was made again, keeps no limit (the driver's map follows the
 * cgroup, not its path). */
static void drop_gone_limits_locked(fg_shared *sh, const char *mount)
{
    for (int i = 0; i < FG_MAX_LIMITS; i++) {
        fg_limit *l = &sh->limits[i];
        if (l->cgroup[0] && group_ino(mount, l->cgroup) != l->ino) memset(l, 0, sizeof *l);
    }
}

int fg_limit_set(int card, const char *cgroup, const char *mount, uint64_t soft, uint64_t hard)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0) return -1;
    fg_shared *sh = w->sh;
    lock(sh);
    drop_gone_limits_locked(sh, mount);
    int at = -1, free_at = -1;
    for (int i = 0; i < FG_MAX_LIMITS; i++) {
        fg_limit *l = &sh->limits[i];
        if (l->cgroup[0] && (int)l->slot == s && !strcmp(l->cgroup, cgroup)) at = i;
        else if (!l->cgroup[0] && free_at < 0) free_at = i;
    }
    int rc = 0;
    if (soft == 0 && hard == UINT64_MAX) { /* cleared: as if never set */
        if (at >= 0) memset(&sh->limits[at], 0, sizeof sh->limits[at]);
    } else if (at < 0 && free_at < 0) {
        rc = -1;
    } else {
        fg_limit *l = &sh->limits[at >= 0 ? at : free_at];
        snprintf(l->cgroup, sizeof l->cgroup, "%s", cgroup);
        l->slot = (uint32_t)s;
        l->soft = soft;
        l->hard = hard;
        l->ino = group_ino(mount, cgroup);
    }
    pthread_mutex_unlock(&sh->mu);
    return rc;
}

void fg_limit_get(int card, const char *cgroup, const char *mount, uint64_t *soft, uint64_t *hard, uint64_t *used)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    *soft = 0;
    *hard = UINT64_MAX;
    *used = 0;
    if (s < 0) return;
    fg_shared *sh = w->sh;
    lock(sh);
    reap_locked(sh);
    drop_gone_limits_locked(sh, mount);
    int li = nearest_limit_locked(sh, s, cgroup);
    if (li >= 0) {
        *soft = sh->limits[li].soft;
        *hard = sh->limits[li].hard;
    }
    for (int p = 0; p < FG_MAX_PROCS; p++)
        if (sh->procs[p].pid && in_group(sh->procs[p].cgroup, cgroup)) *used += sh->procs[p].used[s];
    pthread_mutex_unlock(&sh->mu);
}

int fg_my_limit(int card, uint64_t *hard, uint64_t *used)
{
    char me[FG_CGROUP_PATH];
    fg_self_cgroup(me, sizeof me);
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0 || !me[0]) return 0;
    fg_shared *sh = w->sh;
    lock(sh);
    int li = nearest_limit_locked(sh, s, me);
    int limited = li >= 0 && sh->limits[li].hard != UINT64_MAX;
    if (limited) {
        *hard = sh->limits[li].hard;
        *used = limit_used_locked(sh, s, li);
    }
    pthread_mutex_unlock(&sh->mu);
    return limited;
}

int fg_charge(int card, uint64_t bytes)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0) return -1;
    fg_shared *sh = w->sh;
    lock(sh);
    int ok = 0;
    fg_proc *p = NULL;
    for (int pass = 0; pass < 2 && !ok; pass++) {
        fg_card_state *c = &sh->cards[s];
        p = my_proc_locked(w);
        if (p && c->used <= c->total && bytes <= c->total - c->used && within_limit_locked(sh, s, p, bytes)) ok = 1;
        else if (pass == 0) reap_locked(sh);
    }
    if (!ok) p = NULL;
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

void fg_uncharge_owner(uint64_t token, int card, uint64_t bytes)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0 || !bytes || !token) return;
    fg_shared *sh = w->sh;
    lock(sh);
    for (int i = 0; i < FG_MAX_PROCS; i++) {
        fg_proc *p = &sh->procs[i];
        if (!p->pid || p->token != token) continue;
        uint64_t b = p->used[s] < bytes ? p->used[s] : bytes; /* only what that row holds */
        p->used[s] -= b;
        sh->cards[s].used = sh->cards[s].used > b ? sh->cards[s].used - b : 0;
        break;
    }
    pthread_mutex_unlock(&sh->mu);
}

uint64_t fg_card_used(int card)
{
    fg_world *w = fg_get();
    int s = w->slot[card];
    if (s < 0) return 0;
    lock(w->sh);
    reap_locked(w->sh); /* the driver's figure leaves out what dead processes held */
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
