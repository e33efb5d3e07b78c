/* card_region.c: open, initialise and lock the per-card region (card_region.h). Free of
 * CUDA calls so that it runs in CPU unit tests. */
#define _GNU_SOURCE
#include "card_region.h"

#include "egpu_fsutil.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Open regions keep their file open for the pid cells' liveness locks (EGPU_SLOT_PID_OFD). */
static struct { egpu_card_region *r; int fd; } g_fds[64];
static pthread_mutex_t g_fds_mu = PTHREAD_MUTEX_INITIALIZER;

uint64_t egpu_owner_id(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; p && *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h ? h : 1;
}

void egpu_card_region_init(egpu_card_region *r, const char *uuid, uint64_t now_ns)
{
    memset(r, 0, sizeof *r);
    r->version = EGPU_CARD_VERSION;
    r->size = (uint32_t)sizeof *r;
    r->nslots = EGPU_CARD_SLOTS;
    r->slot_size = (uint32_t)sizeof(egpu_card_slot);
    snprintf(r->uuid, sizeof r->uuid, "%s", uuid ? uuid : "");
    r->created_ns = now_ns;
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&r->mu, &a);
    pthread_mutexattr_destroy(&a);
    __atomic_store_n(&r->magic, EGPU_CARD_MAGIC, __ATOMIC_RELEASE); /* last: marks it ready */
}

/* The runtime hook pre-creates the file EMPTY (mode 0666) and bind-mounts just that file into
 * the container, so it is initialised in place: ftruncate + init under an flock on the file
 * itself, never a temporary file renamed over it. Anything but a regular file of size 0 (new)
 * or exactly sizeof(egpu_card_region) is refused (a link, a FIFO, a short or foreign file):
 * never a SIGBUS or a hang. */
egpu_card_region *egpu_card_region_open(const char *path, const char *uuid)
{
    if (!path || !*path) { errno = EINVAL; return NULL; }
    egpu_mkdirs_for(path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) {
        if (errno == ELOOP) fprintf(stderr, "egpu: card region %s is a symbolic link: refused\n", path);
        return NULL;
    }
    struct stat st;
    int locked = 0;
    egpu_card_region *r = MAP_FAILED;
    if (fstat(fd, &st) != 0) goto fail;
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "egpu: card region %s is not a regular file: refused\n", path);
        errno = EINVAL;
        goto fail;
    }
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) goto fail;
    if (egpu_flock_bounded(fd, 5000) != 0) {
        fprintf(stderr, "egpu: card region %s is locked by another process: refused\n", path);
        goto fail;
    }
    locked = 1;
    if (fstat(fd, &st) != 0) goto fail; /* again, under the lock */
    if (st.st_size == 0) {
        if (ftruncate(fd, (off_t)sizeof *r) != 0) goto fail;
    } else if ((size_t)st.st_size != sizeof *r) {
        fprintf(stderr, "egpu: card region %s has size %lld, expected %zu: refused\n", path, (long long)st.st_size,
                sizeof *r);
        errno = EPROTO;
        goto fail;
    }
    (void)fchmod(fd, 0666); /* shares of other containers (other uids) open it too */
    r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) goto fail;
    if (r->magic == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        egpu_card_region_init(r, uuid, (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec);
    } else if (r->magic != EGPU_CARD_MAGIC || r->version != EGPU_CARD_VERSION || r->size != sizeof *r) {
        /* Another egpu version (or something else) owns this card: never reinterpret it. */
        fprintf(stderr, "egpu: card region %s has magic %#llx version %u (size %u), this library speaks %u: refused\n",
                path, (unsigned long long)r->magic, r->version, r->size, EGPU_CARD_VERSION);
        munmap(r, sizeof *r);
        r = MAP_FAILED;
        errno = EPROTO;
        goto fail;
    }
    flock(fd, LOCK_UN);
    pthread_mutex_lock(&g_fds_mu);
    int kept = 0;
    for (int i = 0; i < 64 && !kept; i++)
        if (!g_fds[i].r) { g_fds[i].r = r; g_fds[i].fd = fd; kept = 1; }
    pthread_mutex_unlock(&g_fds_mu);
    if (!kept) close(fd); /* pid cells of this process then fall back to pid liveness */
    return r;
fail:;
    int e = errno;
    if (locked) flock(fd, LOCK_UN);
    close(fd);
    errno = e;
    return NULL;
}

void egpu_card_region_close(egpu_card_region *r)
{
    if (!r) return;
    pthread_mutex_lock(&g_fds_mu);
    for (int i = 0; i < 64; i++)
        if (g_fds[i].r == r) { close(g_fds[i].fd); g_fds[i].r = NULL; }
    pthread_mutex_unlock(&g_fds_mu);
    munmap(r, sizeof *r);
}

static int pid_dead(int32_t pid) { return pid > 0 && kill(pid, 0) == -1 && errno == ESRCH; }


static int region_fd(const egpu_card_region *r)
{
    int fd = -1;
    pthread_mutex_lock(&g_fds_mu);
    for (int i = 0; i < 64; i++)
        if (g_fds[i].r == r) fd = g_fds[i].fd;
    pthread_mutex_unlock(&g_fds_mu);
    return fd;
}

static off_t cell_off(const egpu_card_region *r, const int32_t *cell) { return (off_t)((const char *)cell - (const char *)r); }

static int cell_lock(const egpu_card_region *r, const int32_t *cell, short type)
{
    int fd = region_fd(r);
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = cell_off(r, cell), .l_len = 1};
    return fd >= 0 ? fcntl(fd, F_OFD_SETLK, &fl) : -1;
}

/* 1: another open file description holds the cell's lock; 0: nobody; -1: cannot tell. */
static int cell_held(const egpu_card_region *r, const int32_t *cell)
{
    int fd = region_fd(r);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = cell_off(r, cell), .l_len = 1};
    if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type != F_UNLCK;
}

static int cell_dead(const egpu_card_region *r, const egpu_card_slot *s, int p)
{
    if (EGPU_SLOT_PID_OFD(s) & (1ull << p)) return cell_held(r, &s->pids[p]) == 0;
    return pid_dead(s->pids[p]);
}

static void recount_locked(egpu_card_region *r)
{
    uint32_t lo = 0, hi = 0;
    for (int i = 0; i < EGPU_CARD_SLOTS; i++) {
        if (!r->slot[i].owner) continue;
        if (r->slot[i].priority == EGPU_CARD_PRIO_LOW) lo++;
        else hi++;
    }
    __atomic_store_n(&r->n_low, lo, __ATOMIC_RELAXED);
    __atomic_store_n(&r->n_high, hi, __ATOMIC_RELAXED);
    r->generation++;
}

/* The card lock is held for a few stores at a time. A holder that never lets go (stopped,
 * or hostile: the file is shared by every container on the card) must not hang launches:
 * after EGPU_CARD_LOCK_WAIT_MS the caller gets ETIMEDOUT and treats this launch as not
 * coordinated (logged once per process). */
#define EGPU_CARD_LOCK_WAIT_MS 200
int egpu_card_lock(egpu_card_region *r)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += (long)EGPU_CARD_LOCK_WAIT_MS * 1000000L;
    dl.tv_sec += dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    int e = pthread_mutex_timedlock(&r->mu, &dl);
    if (e == ETIMEDOUT) {
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            fprintf(stderr, "egpu: warning: the card region lock of %s is held by another process for over %d ms: "
                            "compute is not coordinated for such launches\n", r->uuid, EGPU_CARD_LOCK_WAIT_MS);
        return e;
    }
    if (e == EOWNERDEAD) {
        /* A process died holding the lock mid-update. Every update leaves the slot usable;
         * recount the card-wide counters and go on. */
        recount_locked(r);
        pthread_mutex_consistent(&r->mu);
        e = 0;
    }
    return e;
}

void egpu_card_unlock(egpu_card_region *r) { pthread_mutex_unlock(&r->mu); }

/* Frees slots whose processes have all exited (lock held). */
static void reap_locked(egpu_card_region *r, int32_t self)
{
    int changed = 0;
    for (int i = 0; i < EGPU_CARD_SLOTS; i++) {
        egpu_card_slot *s = &r->slot[i];
        if (!s->owner) continue;
        int live = 0;
        for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
            if (!s->pids[p]) continue;
            if (s->pids[p] != self && cell_dead(r, s, p)) {
                s->pids[p] = 0;
                EGPU_SLOT_PID_OFD(s) &= ~(1ull << p);
            } else {
                live++;
            }
        }
        if (!live) { memset(s, 0, sizeof *s); changed = 1; }
    }
    if (changed) recount_locked(r);
}

int egpu_card_claim(egpu_card_region *r, uint64_t owner, int32_t pid, uint32_t priority,
                    uint32_t policy, uint32_t cores, uint32_t floor_pct, uint64_t now_ns)
{
    if (egpu_card_lock(r) != 0) return -1;
    reap_locked(r, pid);
    int idx = -1, free_idx = -1;
    for (int i = 0; i < EGPU_CARD_SLOTS; i++) {
        if (r->slot[i].owner == owner) { idx = i; break; }
        if (!r->slot[i].owner && free_idx < 0) free_idx = i;
    }
    if (idx < 0 && free_idx >= 0) {
        idx = free_idx;
        egpu_card_slot *s = &r->slot[idx];
        memset(s, 0, sizeof *s);
        s->owner = owner;
        s->refill_ns = now_ns;
        s->win_start_ns = now_ns;
    }
    if (idx >= 0) {
        egpu_card_slot *s = &r->slot[idx];
        /* The config of the share is the same for all its processes; the last one wins. */
        s->priority = priority;
        s->policy = policy;
        s->cores = cores;
        s->floor_pct = floor_pct;
        s->flags = (cores > 0 && cores < 100) ? (s->flags | EGPU_SLOT_CAPPED) : (s->flags & ~EGPU_SLOT_CAPPED);
        int have = 0, slot_free = -1;
        for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
            if (s->pids[p] == pid) have = 1;
            if (!s->pids[p] && slot_free < 0) slot_free = p;
        }
        /* More processes than pid cells: the share still works; its slot is then freed
         * only when the tracked ones exit and a later claim reaps it. */
        if (!have && slot_free >= 0) {
            if (cell_lock(r, &s->pids[slot_free], F_WRLCK) == 0) EGPU_SLOT_PID_OFD(s) |= 1ull << slot_free;
            else EGPU_SLOT_PID_OFD(s) &= ~(1ull << slot_free);
            s->pids[slot_free] = pid;
        }
        recount_locked(r);
    }
    egpu_card_unlock(r);
    return idx;
}

void egpu_card_release(egpu_card_region *r, int slot, int32_t pid)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS) return;
    if (egpu_card_lock(r) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    int live = 0;
    for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
        if (s->pids[p] == pid) {
            if (EGPU_SLOT_PID_OFD(s) & (1ull << p)) cell_lock(r, &s->pids[p], F_UNLCK);
            EGPU_SLOT_PID_OFD(s) &= ~(1ull << p);
            s->pids[p] = 0;
        } else if (s->pids[p]) {
            live++;
        }
    }
    if (!live && s->owner) {
        memset(s, 0, sizeof *s);
        recount_locked(r);
    }
    egpu_card_unlock(r);
}
