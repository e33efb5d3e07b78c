/* hostile_tenant: a hostile tenant inside its own container (tests/security, issue 15).
 *
 * It runs as root in the container with the default capabilities (no CAP_SYS_ADMIN: it
 * cannot mount), next to honest shares of the same card, and attacks every egpu file it can
 * reach for SECONDS, then exits (always by its deadline: every call is non-blocking or
 * bounded, and an alarm ends it 5 s later whatever happens). SIGTERM stops it early, with
 * its report.
 *
 * Usage: hostile_tenant ATTACK SECONDS [PATH...]
 *   PATHs (default: /var/run/egpu /run/egpu /etc/ld.so.preload /usr/lib/egpu) are walked
 *   (symlinks are attacked, never followed) at the start of every round, so files that appear
 *   later (a co-tenant's share file) are attacked too.
 *   ATTACK:
 *     truncate      ftruncate every file it can open for writing to 0 (and truncate(2) by path)
 *     random-bytes  overwrite every file it can open for writing with random bytes; its own
 *                   share file also with plausible lies (its owner, high priority, 100% use,
 *                   work queued far into the future, a fresh high-priority mark)
 *     grow          ftruncate every writable file to 1 GiB (and more each round), write a byte
 *                   past its end
 *     replace       rename a new file (random bytes), a symlink and a FIFO over every file;
 *                   unlink and create every file anew; rename a new folder over every folder
 *     delete        unlink every file, rmdir every folder (deepest first), rename folders away
 *     hold-locks    flock (exclusive, else shared), fcntl F_SETLK and F_OFD_SETLK (write lock
 *                   where the file is writable, else read lock) on every file, held to the
 *                   end; a read lock on every pid cell of every share file (retried each
 *                   round: cells free up); takes the robust mutex of every card region / share file it can map
 *                   read-write, and writes a fake locked mutex into its own share file
 *     flood-slots   create files and folders in every folder, share-<random> files in card
 *                   folders, fake entries in every roster (and in every free slot of an old
 *                   one-file card region), fake pids in every share file's pid cells, and forks FLOOD_PROCS processes that each start
 *                   CUDA (dlopen libcuda.so.1 through the interposer, cuInit, cuCtxCreate,
 *                   cuMemAlloc 64 MiB) and hold it to the end
 *     idle          nothing (the control: the same scenario without an attack)
 *
 * Output (stdout), after the deadline:
 *   self owner=<016x> container_region=<path>
 *   attempt attack=A op=OP target=CLASS ok=N fail=M errno=NAME:COUNT,...
 *     (the CUDA steps of flood-slots count CUresults: errno=CUresult2:21 is 21 times
 *     CUDA_ERROR_OUT_OF_MEMORY)
 *   done attack=A rounds=R files=F seconds=S cpu_s=C   (C: CPU time, its processes' too)
 * one "attempt" line per (operation, target class). Target classes, from the path:
 *   roster, own-share, co-share (share-* of another owner), card-region (a file directly in
 *   cards/: the previous one-file layout), card-dir, cards-dir, own-region (containers/...),
 *   config (/run/egpu/config.json), preload (/etc/ld.so.preload), interposer
 *   (files in /usr/lib/egpu), own-rootfs (the folder /usr/lib/egpu), runtime-dir (/run/egpu,
 *   its containers/: folders of the container's own rootfs), planted (its own files), other. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENTRIES 4096
#define PATHN 512             /* longest path it attacks */
#define MAX_DEPTH 8
#define MAX_HELD 900          /* descriptors held by hold-locks */
#define MAX_MAPS 64           /* mappings whose mutex it holds */
#define FLOOD_FILES 16        /* files (and folders) created per folder per round */
#define FLOOD_PROCS 24        /* CUDA processes forked by flood-slots */
#define FLOOD_FILE_CAP 2000   /* files created in all */
#define WRITE_CAP (1 << 20)   /* bytes overwritten per file per round */
#define GIB (1ULL << 30)
#define ROUND_PAUSE_NS 3000000 /* between rounds: the attack, not a CPU hog, is under test */

/* Layout facts (libinterpose/src/card_region.h): the roster, the share file, the card region
 * of the previous layout (one file per card). */
#define ROSTER_MAGIC 0x54534F5255504745ULL
#define ROSTER_HEADER 128
#define ROSTER_ENTRY 64
#define NSLOTS 32
#define SHARE_SIZE 4096
#define SHARE_MUTEX_OFF 512
#define SHARE_MAGIC_OFF 576
#define SHARE_MAGIC 0x4552414855504745ULL
#define OLD_CARD_MAGIC 0x4452414355504745ULL
#define OLD_HEADER 4096
#define OLD_SLOT 512
#define OLD_MUTEX_OFF 128

static const char *g_attack;
static volatile uint64_t g_deadline_ns;
static uint64_t g_own_owner;
static char g_region[600];
static uint64_t g_rng = 0x9E3779B97F4A7C15ULL;
static int g_planted;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int expired(void) { return now_ns() >= g_deadline_ns; }

/* SIGTERM (runc kill): stop now, report what was done */
static void on_term(int sig)
{
    (void)sig;
    g_deadline_ns = 0;
}

static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void fill_random(void *buf, size_t n)
{
    uint8_t *p = buf;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = rnd();
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

/* ---- tallies: (op, target class) -> ok, fail, errno counts ------------------------------ */
#define MAX_TALLY 256
#define MAX_ERRNO 134
typedef struct {
    char op[32];
    char target[16];
    unsigned long ok, fail;
    unsigned long err[MAX_ERRNO];
} tally;
static tally g_tally[MAX_TALLY];
static int g_ntally;

static tally *tally_of(const char *op, const char *target)
{
    for (int i = 0; i < g_ntally; i++)
        if (!strcmp(g_tally[i].op, op) && !strcmp(g_tally[i].target, target)) return &g_tally[i];
    if (g_ntally == MAX_TALLY) return NULL;
    tally *t = &g_tally[g_ntally++];
    snprintf(t->op, sizeof t->op, "%s", op);
    snprintf(t->target, sizeof t->target, "%s", target);
    return t;
}

/* Records one attempt: rc < 0 is a failure with errno `e`. Returns rc. */
static long note(const char *op, const char *target, long rc, int e)
{
    tally *t = tally_of(op, target);
    if (!t) return rc;
    if (rc >= 0) {
        t->ok++;
    } else {
        t->fail++;
        t->err[e > 0 && e < MAX_ERRNO ? e : 0]++;
    }
    return rc;
}
/* the call first, then its errno (a function's arguments are evaluated in any order) */
#define TRY(op, target, call) ({ long rc_ = (long)(call); note((op), (target), rc_, errno); })

static const char *errname(int e)
{
    if (!e) return "OTHER";
    const char *n = strerrorname_np(e);
    return n ? n : "OTHER";
}

static void report(int rounds, int files, double seconds)
{
    printf("self owner=%016llx container_region=%s\n", (unsigned long long)g_own_owner,
           g_region[0] ? g_region : "-");
    for (int i = 0; i < g_ntally; i++) {
        tally *t = &g_tally[i];
        printf("attempt attack=%s op=%s target=%s ok=%lu fail=%lu errno=", g_attack, t->op,
               t->target, t->ok, t->fail);
        int first = 1;
        int cuda = !strcmp(t->target, "cuda-procs") && !strncmp(t->op, "cu", 2);
        for (int e = 0; e < MAX_ERRNO; e++)
            if (t->err[e]) {
                if (cuda) printf("%sCUresult%d:%lu", first ? "" : ",", e, t->err[e]);
                else printf("%s%s:%lu", first ? "" : ",", errname(e), t->err[e]);
                first = 0;
            }
        printf("%s\n", first ? "-" : "");
    }
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    double cpu = (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                          kids.ru_stime.tv_sec) +
                 (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                          kids.ru_stime.tv_usec) / 1e6;
    printf("done attack=%s rounds=%d files=%d seconds=%.2f cpu_s=%.2f\n", g_attack, rounds, files,
           seconds, cpu);
    fflush(stdout);
}

/* ---- who am I: the share key from the node's config (FNV-1a 64, as egpu_owner_id) ------- */
static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 0xCBF29CE484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001B3ULL;
    return h ? h : 1;
}

static void find_self(void)
{
    char buf[65536];
    int fd = open("/run/egpu/config.json", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    char *k = strstr(buf, "\"container_region\"");
    if (!k) return;
    char *q = strchr(k + 18, '"');
    if (!q) return;
    char *e = strchr(q + 1, '"');
    if (!e) return;
    size_t len = (size_t)(e - q - 1);
    if (len >= sizeof g_region) len = sizeof g_region - 1;
    memcpy(g_region, q + 1, len);
    g_region[len] = 0;
    g_own_owner = fnv1a(g_region, len < 511 ? len : 511);
}

/* ---- the walk ---------------------------------------------------------------------------- */
typedef struct {
    char path[PATHN];
    mode_t mode;
    int depth;
    char target[16];
} entry;
static entry *g_ent;
static int g_nent;

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

static int parent_is(const char *path, const char *name)
{
    char tmp[PATHN];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *s = strrchr(tmp, '/');
    if (!s) return 0;
    *s = 0;
    return !strcmp(base_name(tmp), name);
}

static void classify(entry *e)
{
    const char *b = base_name(e->path);
    const char *t = "other";
    char own[40];
    snprintf(own, sizeof own, "share-%016llx", (unsigned long long)g_own_owner);
    if (!strncmp(b, "hostile-", 8) || !strncmp(b, ".hostile-", 9)) t = "planted";
    else if (!strcmp(e->path, "/etc/ld.so.preload")) t = "preload";
    else if (!strncmp(e->path, "/usr/lib/egpu", 13)) t = S_ISDIR(e->mode) ? "own-rootfs" : "interposer";
    else if (!strcmp(b, "config.json") && strstr(e->path, "/run/egpu")) t = "config";
    else if (!strcmp(b, "roster")) t = "roster";
    else if (!strcmp(b, own)) t = "own-share";
    else if (!strncmp(b, "share-", 6)) t = "co-share";
    else if (!strcmp(b, "cards") && S_ISDIR(e->mode)) t = "cards-dir";
    else if (parent_is(e->path, "cards")) t = S_ISDIR(e->mode) ? "card-dir" : "card-region";
    else if (strstr(e->path, "/containers/")) t = "own-region";
    else if (strstr(e->path, "/run/egpu")) t = "runtime-dir";
    snprintf(e->target, sizeof e->target, "%s", t);
}

static void walk(const char *path, int depth)
{
    if (g_nent >= MAX_ENTRIES || depth > MAX_DEPTH) return;
    struct stat st;
    if (lstat(path, &st) != 0) return;
    entry *e = &g_ent[g_nent++];
    snprintf(e->path, sizeof e->path, "%s", path);
    e->mode = st.st_mode;
    e->depth = depth;
    classify(e);
    if (!S_ISDIR(st.st_mode)) return;
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d)) && g_nent < MAX_ENTRIES) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        if (!strncmp(de->d_name, "hostile-", 8) || !strncmp(de->d_name, ".hostile-", 9))
            continue; /* its own litter: not worth a walk each round */
        char child[PATHN];
        if (snprintf(child, sizeof child, "%s/%s", path, de->d_name) >= (int)sizeof child) continue;
        walk(child, depth + 1);
    }
    closedir(d);
}

static char *g_roots[32];
static int g_nroots;

static void walk_all(void)
{
    g_nent = 0;
    for (int i = 0; i < g_nroots; i++) walk(g_roots[i], 0);
}

/* ---- opening ------------------------------------------------------------------------------ */
static int open_w(const entry *e, const char *op)
{
    int fd = open(e->path, O_RDWR | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    note(op, e->target, fd, errno);
    return fd;
}

static void dir_of(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *s = strrchr(out, '/');
    if (s && s != out) *s = 0;
    else snprintf(out, n, "/");
}

static uint8_t g_buf[WRITE_CAP];

/* ---- the attacks on one entry --------------------------------------------------------------- */
static void write_lies(int fd, const entry *e)
{
    /* its own share file: what a co-tenant reads of it (the first 512 bytes) says it is a
     * busy high-priority share with 100% use and work queued 10 s ahead */
    uint8_t s[SHARE_SIZE];
    memset(s, 0, sizeof s);
    uint64_t now = now_ns();
    uint64_t v;
    memcpy(s + 0, &g_own_owner, 8);
    for (int p = 0; p < 16; p++) { int32_t pid = 1 + p; memcpy(s + 8 + 4 * p, &pid, 4); }
    uint32_t prio = 0, policy = 1, cores = 100, flags = 3, floor_pct = 100, rate = 1000000;
    memcpy(s + 72, &prio, 4);
    memcpy(s + 76, &policy, 4);
    memcpy(s + 80, &cores, 4);
    memcpy(s + 84, &flags, 4);
    memcpy(s + 88, &floor_pct, 4);
    memcpy(s + 92, &rate, 4);
    v = now; memcpy(s + 200, &v, 8);                   /* last_active_ns */
    v = now + 10000000000ULL; memcpy(s + 208, &v, 8);  /* busy_until_ns */
    v = 1000000; memcpy(s + 216, &v, 8);               /* use_ppm */
    v = 1000000; memcpy(s + 224, &v, 8);               /* demand_ppm */
    v = 1ULL << 40; memcpy(s + 256, &v, 8);            /* inflight_n */
    v = now; memcpy(s + 264, &v, 8);                   /* inflight_since_ns */
    v = now + 10000000000ULL; memcpy(s + 328, &v, 8);  /* queued_until_ns */
    v = now + 10000000000ULL; memcpy(s + 344, &v, 8);  /* hi_mark_ns */
    v = SHARE_MAGIC; memcpy(s + SHARE_MAGIC_OFF, &v, 8);
    uint32_t ver = 2; memcpy(s + SHARE_MAGIC_OFF + 8, &ver, 4);
    TRY("pwrite-lies", e->target, pwrite(fd, s, sizeof s, 0));
}

static void attack_truncate(const entry *e)
{
    if (!S_ISREG(e->mode)) return;
    int fd = open_w(e, "open-w");
    if (fd >= 0) {
        TRY("ftruncate-0", e->target, ftruncate(fd, 0));
        close(fd);
    }
    TRY("truncate-path", e->target, truncate(e->path, 0));
}

static void attack_random(const entry *e, int round)
{
    if (!S_ISREG(e->mode)) return;
    int fd = open_w(e, "open-w");
    if (fd < 0) return;
    struct stat st;
    size_t n = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size : SHARE_SIZE;
    if (n > WRITE_CAP) n = WRITE_CAP;
    if (!strcmp(e->target, "own-share") && (round & 1)) {
        write_lies(fd, e);
    } else {
        fill_random(g_buf, n);
        TRY("pwrite-random", e->target, pwrite(fd, g_buf, n, 0));
    }
    close(fd);
}

static void attack_grow(const entry *e, int round)
{
    if (!S_ISREG(e->mode)) return;
    int fd = open_w(e, "open-w");
    if (fd < 0) return;
    off_t size = (off_t)(GIB + (uint64_t)round * 4096);
    TRY("ftruncate-1g", e->target, ftruncate(fd, size));
    uint8_t b = 0xA5;
    TRY("pwrite-past-end", e->target, pwrite(fd, &b, 1, size + 4096));
    close(fd);
}

static void plant_name(const entry *e, const char *what, char *out, size_t n)
{
    char dir[PATHN];
    dir_of(e->path, dir, sizeof dir);
    snprintf(out, n, "%s/.hostile-%s-%d-%d", dir, what, (int)getpid(), g_planted++);
}

static void attack_replace(const entry *e)
{
    char tmp[PATHN + 64];
    if (S_ISDIR(e->mode)) {
        if (e->depth == 0) return; /* the roots: renaming over them is the same as for their
                                    * children, and would end the walk */
        plant_name(e, "dir", tmp, sizeof tmp);
        if (TRY("mkdir-temp", e->target, mkdir(tmp, 0777)) == 0 &&
            TRY("rename-dir-over", e->target, rename(tmp, e->path)) != 0)
            rmdir(tmp);
        return;
    }
    /* a regular file of random bytes, the same size */
    plant_name(e, "file", tmp, sizeof tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (TRY("create-temp", e->target, fd) >= 0) {
        size_t n = SHARE_SIZE;
        fill_random(g_buf, n);
        if (write(fd, g_buf, n) < 0) { /* counted by the rename */ }
        close(fd);
        if (TRY("rename-file-over", e->target, rename(tmp, e->path)) != 0) unlink(tmp);
    }
    /* a symlink to somewhere else */
    plant_name(e, "link", tmp, sizeof tmp);
    if (TRY("symlink-temp", e->target, symlink("/proc/self/mem", tmp)) == 0 &&
        TRY("rename-symlink-over", e->target, rename(tmp, e->path)) != 0)
        unlink(tmp);
    /* a FIFO: whoever opens it without O_NONBLOCK blocks */
    plant_name(e, "fifo", tmp, sizeof tmp);
    if (TRY("mkfifo-temp", e->target, mkfifo(tmp, 0666)) == 0 &&
        TRY("rename-fifo-over", e->target, rename(tmp, e->path)) != 0)
        unlink(tmp);
    /* unlink, then create anew (empty, then random bytes) */
    if (TRY("unlink", e->target, unlink(e->path)) == 0) {
        fd = open(e->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (TRY("create-anew", e->target, fd) >= 0) {
            fill_random(g_buf, 512);
            if (write(fd, g_buf, 512) < 0) { /* the file exists: enough */ }
            close(fd);
        }
    }
}

static void attack_delete(const entry *e)
{
    if (S_ISDIR(e->mode)) {
        TRY("rmdir", e->target, rmdir(e->path));
        if (e->depth > 0) {
            char tmp[PATHN + 64];
            plant_name(e, "away", tmp, sizeof tmp);
            if (TRY("rename-dir-away", e->target, rename(e->path, tmp)) == 0)
                (void)rename(tmp, e->path); /* back: the next rounds walk it again */
        }
        return;
    }
    TRY("unlink", e->target, unlink(e->path));
}

/* hold-locks: descriptors and mappings kept to the end */
static int g_held[MAX_HELD];
static int g_nheld;
static char g_held_path[MAX_HELD][PATHN + 8];
static struct { void *p; size_t n; } g_maps[MAX_MAPS];
static int g_nmaps;

static int already_held(const char *path)
{
    for (int i = 0; i < g_nheld; i++)
        if (!strncmp(g_held_path[i], path, sizeof g_held_path[i] - 1)) return 1;
    return 0;
}

static void hold_mutex(int fd, const entry *e, size_t size, off_t off, const char *op)
{
    if (g_nmaps == MAX_MAPS || (size_t)off + 64 > size) return;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (note("mmap-rw", e->target, p == MAP_FAILED ? -1 : 0, errno) < 0) return;
    g_maps[g_nmaps].p = p;
    g_maps[g_nmaps++].n = size;
    pthread_mutex_t *mu = (pthread_mutex_t *)((char *)p + off);
    int rc = pthread_mutex_trylock(mu);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(mu);
        rc = 0;
    }
    note(op, e->target, rc ? -1 : 0, rc);
    if (rc == EBUSY) {
        /* held by someone else: write our own tid over it (the lock word of a glibc mutex is
         * its owner's tid), so that it stays "held" by a live process */
        volatile int *word = (volatile int *)mu;
        *word = (int)getpid();
        note("mutex-steal", e->target, 0, 0);
    }
}

/* A share file's pid cells (liveness: a process holds an OFD write lock on the first byte of
 * its cell; a peer frees a cell nobody holds a lock on): a read lock on every cell byte it
 * can get, retried each round (a cell frees up when its process exits), held to the end. */
#define MAX_CELL_FILES 64
static struct { char path[PATHN]; int fd; uint32_t got; } g_cells[MAX_CELL_FILES];
static int g_ncells;

static void lock_pid_cells(const entry *e)
{
    int i = 0;
    while (i < g_ncells && strcmp(g_cells[i].path, e->path)) i++;
    if (i == g_ncells) {
        if (g_ncells == MAX_CELL_FILES) return;
        int fd = open(e->path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) return;
        snprintf(g_cells[i].path, sizeof g_cells[i].path, "%s", e->path);
        g_cells[i].fd = fd;
        g_cells[i].got = 0;
        g_ncells++;
    }
    for (int p = 0; p < 16; p++) {
        if (g_cells[i].got & (1u << p)) continue;
        struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 8 + 4 * p, .l_len = 1};
        int rc = fcntl(g_cells[i].fd, F_OFD_SETLK, &fl);
        if (rc == 0) g_cells[i].got |= 1u << p;
        note("ofd-pid-cell-r", e->target, rc, errno);
    }
}

static void attack_locks(const entry *e)
{
    if (S_ISREG(e->mode) && (!strcmp(e->target, "co-share") || !strcmp(e->target, "own-share")))
        lock_pid_cells(e);
    if (S_ISLNK(e->mode) || g_nheld >= MAX_HELD || already_held(e->path)) return;
    int writable = 1;
    int fd = open(e->path, (S_ISDIR(e->mode) ? O_RDONLY : O_RDWR) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && !S_ISDIR(e->mode)) {
        note("open-w", e->target, -1, errno);
        writable = 0;
        fd = open(e->path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    }
    if (S_ISDIR(e->mode)) writable = 0;
    if (note("open-lock", e->target, fd, errno) < 0) return;
    snprintf(g_held_path[g_nheld], sizeof g_held_path[g_nheld], "%s", e->path);
    g_held[g_nheld++] = fd;
    if (TRY("flock-ex", e->target, flock(fd, LOCK_EX | LOCK_NB)) != 0)
        TRY("flock-sh", e->target, flock(fd, LOCK_SH | LOCK_NB));
    if (S_ISDIR(e->mode)) return;
    struct flock fl = {.l_type = writable ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET};
    TRY(writable ? "setlk-w" : "setlk-r", e->target, fcntl(fd, F_SETLK, &fl));
    /* an OFD lock needs its own description: open again */
    int fd2 = open(e->path, (writable ? O_RDWR : O_RDONLY) | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd2 >= 0 && g_nheld < MAX_HELD) {
        struct flock ofd = {.l_type = writable ? F_WRLCK : F_RDLCK, .l_whence = SEEK_SET};
        TRY(writable ? "ofd-setlk-w" : "ofd-setlk-r", e->target, fcntl(fd2, F_OFD_SETLK, &ofd));
        snprintf(g_held_path[g_nheld], sizeof g_held_path[g_nheld], "%s#ofd", e->path);
        g_held[g_nheld++] = fd2;
    } else if (fd2 >= 0) {
        close(fd2);
    }
    if (!writable) return;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < 8) return;
    uint64_t magic = 0;
    if (pread(fd, &magic, 8, 0) != 8) return;
    if (magic == OLD_CARD_MAGIC) {
        hold_mutex(fd, e, (size_t)st.st_size, OLD_MUTEX_OFF, "mutex-take-card");
    } else if (!strcmp(e->target, "own-share") || !strncmp(base_name(e->path), "share-", 6)) {
        if ((size_t)st.st_size >= SHARE_SIZE) {
            hold_mutex(fd, e, (size_t)st.st_size, SHARE_MUTEX_OFF, "mutex-take-share");
            /* and a fake locked robust mutex, owner = pid 1 of this container (alive) */
            int word = 1;
            TRY("pwrite-fake-mutex", e->target, pwrite(fd, &word, sizeof word, SHARE_MUTEX_OFF));
        }
    }
}

/* flood-slots */
static int g_flood_files;

static void flood_roster(const entry *e)
{
    int fd = open_w(e, "open-w");
    if (fd < 0) return;
    uint8_t r[ROSTER_HEADER + ROSTER_ENTRY * NSLOTS];
    ssize_t n = pread(fd, r, sizeof r, 0);
    uint64_t magic = 0;
    if (n >= 8) memcpy(&magic, r, 8);
    for (int i = 0; i < NSLOTS; i++) {
        uint8_t *en = r + ROSTER_HEADER + i * ROSTER_ENTRY;
        uint64_t owner = 0;
        if (n == (ssize_t)sizeof r && magic == ROSTER_MAGIC) memcpy(&owner, en, 8);
        if (owner) continue;
        uint8_t fake[ROSTER_ENTRY] = {0};
        uint64_t o = rnd() | 1;
        uint32_t prio = 0, policy = 1, cores = 100, floor_pct = 100;
        memcpy(fake, &o, 8);
        memcpy(fake + 8, &prio, 4);
        memcpy(fake + 12, &policy, 4);
        memcpy(fake + 16, &cores, 4);
        memcpy(fake + 20, &floor_pct, 4);
        snprintf((char *)fake + 32, 32, "hostile-%d", i);
        TRY("roster-entry-write", e->target,
            pwrite(fd, fake, sizeof fake, ROSTER_HEADER + (off_t)i * ROSTER_ENTRY));
    }
    close(fd);
}

static void flood_old_region(const entry *e)
{
    int fd = open_w(e, "open-w");
    if (fd < 0) return;
    uint64_t magic = 0;
    if (pread(fd, &magic, 8, 0) != 8 || magic != OLD_CARD_MAGIC) { close(fd); return; }
    for (int i = 0; i < NSLOTS; i++) {
        off_t off = OLD_HEADER + (off_t)i * OLD_SLOT;
        uint64_t owner = 0;
        if (pread(fd, &owner, 8, off) != 8 || owner) continue;
        uint8_t s[OLD_SLOT] = {0};
        uint64_t o = rnd() | 1, now = now_ns() + 10000000000ULL;
        memcpy(s, &o, 8);
        for (int p = 0; p < 16; p++) { int32_t pid = 1; memcpy(s + 8 + 4 * p, &pid, 4); }
        uint32_t cores = 100;
        memcpy(s + 80, &cores, 4);
        memcpy(s + 200, &now, 8);
        TRY("slot-write", e->target, pwrite(fd, s, sizeof s, off));
    }
    close(fd);
}

static void flood_dir(const entry *e)
{
    for (int i = 0; i < FLOOD_FILES && g_flood_files < FLOOD_FILE_CAP; i++) {
        char p[PATHN + 64];
        snprintf(p, sizeof p, "%s/hostile-%d-%d", e->path, (int)getpid(), g_flood_files++);
        int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
        if (TRY("create-file", e->target, fd) < 0) break;
        close(fd);
    }
    char d[PATHN + 64];
    snprintf(d, sizeof d, "%s/hostile-dir-%d-%d", e->path, (int)getpid(), g_flood_files++);
    TRY("mkdir", e->target, mkdir(d, 0777));
    if (strcmp(e->target, "card-dir") != 0) return;
    /* a card folder: share files of owners the roster never booked, saying they are busy
     * high-priority shares */
    for (int i = 0; i < FLOOD_FILES && g_flood_files < FLOOD_FILE_CAP; i++, g_flood_files++) {
        char p[PATHN + 64];
        uint64_t o = rnd() | 1;
        snprintf(p, sizeof p, "%s/share-%016llx", e->path, (unsigned long long)o);
        int fd = open(p, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0666);
        if (TRY("create-share-file", e->target, fd) < 0) break;
        entry fake = *e;
        uint64_t keep = g_own_owner;
        g_own_owner = o;
        write_lies(fd, &fake);
        g_own_owner = keep;
        close(fd);
    }
}

/* a share file: fill its pid cells (liveness) with pids that live in this container */
static void flood_pid_cells(const entry *e)
{
    int fd = open_w(e, "open-w");
    if (fd < 0) return;
    int32_t pids[16];
    for (int p = 0; p < 16; p++) pids[p] = 1 + p;
    TRY("pid-cells-write", e->target, pwrite(fd, pids, sizeof pids, 8));
    close(fd);
}

static void attack_flood(const entry *e)
{
    if (S_ISDIR(e->mode)) flood_dir(e);
    else if (!strcmp(e->target, "roster")) flood_roster(e);
    else if (!strcmp(e->target, "card-region")) flood_old_region(e);
    else if (!strcmp(e->target, "co-share") || !strcmp(e->target, "own-share")) flood_pid_cells(e);
}

/* CUDA processes: each reports one byte per step on a pipe (step << 4 | ok) */
typedef int (*fn_init)(unsigned);
typedef int (*fn_devget)(int *, int);
typedef int (*fn_ctx)(void **, unsigned, int);
typedef int (*fn_alloc)(unsigned long long *, size_t);

static void cuda_child(int wfd)
{
    uint8_t msg[4] = {0};
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    msg[0] = lib ? 1 : 2;
    int rc_init = -1, rc_ctx = -1, rc_alloc = -1;
    if (lib) {
        fn_init cu_init = (fn_init)dlsym(lib, "cuInit");
        fn_devget cu_dev = (fn_devget)dlsym(lib, "cuDeviceGet");
        fn_ctx cu_ctx = (fn_ctx)dlsym(lib, "cuCtxCreate_v2");
        fn_alloc cu_alloc = (fn_alloc)dlsym(lib, "cuMemAlloc_v2");
        if (cu_init && cu_dev && cu_ctx && cu_alloc) {
            int dev = 0;
            void *ctx = NULL;
            unsigned long long ptr = 0;
            rc_init = cu_init(0);
            if (!rc_init && !cu_dev(&dev, 0)) {
                rc_ctx = cu_ctx(&ctx, 0, dev);
                if (!rc_ctx) rc_alloc = cu_alloc(&ptr, 64ULL << 20);
            }
        }
    }
    msg[1] = (uint8_t)(rc_init < 0 ? 255 : rc_init > 254 ? 254 : rc_init);
    msg[2] = (uint8_t)(rc_ctx < 0 ? 255 : rc_ctx > 254 ? 254 : rc_ctx);
    msg[3] = (uint8_t)(rc_alloc < 0 ? 255 : rc_alloc > 254 ? 254 : rc_alloc);
    if (write(wfd, msg, sizeof msg) < 0) _exit(1);
    close(wfd);
    while (!expired()) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    _exit(0);
}

static pid_t g_kids[FLOOD_PROCS];
static int g_nkids, g_kid_pipe = -1;

static void flood_procs(void)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return;
    for (int i = 0; i < FLOOD_PROCS && !expired(); i++) {
        pid_t k = fork();
        if (note("fork", "cuda-procs", k, errno) < 0) break;
        if (k == 0) {
            close(p[0]);
            alarm(0);
            cuda_child(p[1]);
        }
        g_kids[g_nkids++] = k;
    }
    close(p[1]);
    g_kid_pipe = p[0];
    fcntl(g_kid_pipe, F_SETFL, O_NONBLOCK);
}

/* CUresult codes as results: ok when 0, else "errno" = the CUresult (0 < r < 255) */
static void cuda_note(const char *op, uint8_t r)
{
    if (r == 255) return; /* not reached */
    tally *t = tally_of(op, "cuda-procs");
    if (!t) return;
    if (!r) t->ok++;
    else { t->fail++; t->err[r < MAX_ERRNO ? r : 0]++; }
}

static void collect_kids(void)
{
    uint8_t msg[4];
    while (g_kid_pipe >= 0 && read(g_kid_pipe, msg, sizeof msg) == (ssize_t)sizeof msg) {
        note("dlopen-libcuda", "cuda-procs", msg[0] == 1 ? 0 : -1, ENOENT);
        cuda_note("cuInit", msg[1]);
        cuda_note("cuCtxCreate", msg[2]);
        cuda_note("cuMemAlloc", msg[3]);
    }
    for (int i = 0; i < g_nkids; i++) kill(g_kids[i], SIGTERM); /* an early stop: theirs too */
    uint64_t until = now_ns() + 2000000000ULL;
    for (int i = 0; i < g_nkids; i++) {
        int st;
        while (waitpid(g_kids[i], &st, WNOHANG) == 0) {
            if (now_ns() > until) { kill(g_kids[i], SIGKILL); waitpid(g_kids[i], &st, 0); break; }
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- main ----------------------------------------------------------------------------------- */
static int cmp_depth_desc(const void *a, const void *b)
{
    const entry *x = a, *y = b;
    return y->depth - x->depth;
}

int main(int argc, char **argv)
{
    static const char *attacks[] = {"truncate", "random-bytes", "grow", "replace", "delete",
                                    "hold-locks", "flood-slots", "idle"};
    if (argc < 3) {
        fprintf(stderr, "usage: hostile_tenant ATTACK SECONDS [PATH...] (see the source)\n");
        return 2;
    }
    g_attack = argv[1];
    int known = 0;
    for (size_t i = 0; i < sizeof attacks / sizeof *attacks; i++) known |= !strcmp(g_attack, attacks[i]);
    double seconds = atof(argv[2]);
    if (!known || seconds <= 0 || seconds > 600) {
        fprintf(stderr, "hostile_tenant: unknown attack %s or bad duration %s\n", argv[1], argv[2]);
        return 2;
    }
    alarm((unsigned)seconds + 5); /* the last resort: SIGALRM ends it */
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL); /* pid 1 of its container: no default action */
    uint64_t t0 = now_ns();
    g_deadline_ns = t0 + (uint64_t)(seconds * 1e9);
    g_rng ^= t0 ^ ((uint64_t)getpid() << 32);
    static const char *defaults[] = {"/var/run/egpu", "/run/egpu", "/etc/ld.so.preload", "/usr/lib/egpu"};
    char seen[32][4096];
    int nseen = 0;
    int nargs = argc > 3 ? argc - 3 : (int)(sizeof defaults / sizeof *defaults);
    for (int i = 0; i < nargs && g_nroots < 32; i++) {
        const char *p = argc > 3 ? argv[3 + i] : defaults[i];
        char real[4096]; /* PATH_MAX: realpath(3) */
        if (!realpath(p, real)) snprintf(real, sizeof real, "%s", p);
        int dup = 0;
        for (int j = 0; j < nseen; j++) dup |= !strcmp(seen[j], real);
        if (dup) continue; /* /var/run is a link to /run */
        snprintf(seen[nseen++], sizeof seen[0], "%s", real);
        g_roots[g_nroots++] = strdup(real);
    }
    find_self();
    g_ent = calloc(MAX_ENTRIES, sizeof *g_ent);
    if (!g_ent) return 3;
    if (!strcmp(g_attack, "flood-slots")) flood_procs();
    int rounds = 0, files = 0;
    while (!expired()) {
        walk_all();
        if (g_nent > files) files = g_nent;
        if (!strcmp(g_attack, "delete")) qsort(g_ent, (size_t)g_nent, sizeof *g_ent, cmp_depth_desc);
        for (int i = 0; i < g_nent && !expired(); i++) {
            const entry *e = &g_ent[i];
            if (!strcmp(e->target, "planted") || !strcmp(g_attack, "idle")) continue;
            if (!strcmp(g_attack, "truncate")) attack_truncate(e);
            else if (!strcmp(g_attack, "random-bytes")) attack_random(e, rounds);
            else if (!strcmp(g_attack, "grow")) attack_grow(e, rounds);
            else if (!strcmp(g_attack, "replace")) attack_replace(e);
            else if (!strcmp(g_attack, "delete")) attack_delete(e);
            else if (!strcmp(g_attack, "hold-locks")) attack_locks(e);
            else attack_flood(e);
        }
        rounds++;
        struct timespec ts = {0, ROUND_PAUSE_NS};
        nanosleep(&ts, NULL);
    }
    if (g_nkids) collect_kids();
    report(rounds, files, (double)(now_ns() - t0) / 1e9);
    return 0;
}
