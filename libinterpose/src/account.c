/* account.c: per-container memory accounting in the shared region. No CUDA calls.
 *
 * Invariant: cards[c].used_bytes == sum over live proc slots of procs[p].used[c].
 * A process killed at any instant leaves its slot behind; the next locker that notices
 * (attach, a charge that would fail, a capacity query) reclaims it. A process killed while
 * holding the lock makes the next pthread_mutex_lock return EOWNERDEAD: the card sums are
 * then recomputed from the proc slots (each slot update is one aligned 64-bit store).
 * A shared slot (EGPU_PROC_F_SHARED) counts like a process's: it lives while any holder's
 * OFD read lock on it does. */
#define _GNU_SOURCE
#include "egpu_account.h"
#include "egpu_fsutil.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <linux/kcmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t sat_sub(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* Under the lock: add bytes to the card's use and keep its high-water mark. */
static void card_add_locked(egpu_region_card *card, uint64_t bytes)
{
    card->used_bytes = sat_add(card->used_bytes, bytes);
    if (card->used_bytes > card->peak_bytes) card->peak_bytes = card->used_bytes;
}

static uint64_t proc_start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    if (!p) return 0;
    unsigned long long v = 0;
    /* count spaces after comm up to field 22, starttime */
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    if (sscanf(p, "%llu", &v) != 1) return 0;
    return v;
}

/* ---- liveness by OFD lock (see EGPU_PROC_F_OFD) ----------------------------------- */
static off_t slot_off(int p) { return (off_t)offsetof(egpu_region, procs) + (off_t)p * (off_t)sizeof(egpu_region_proc); }

static int ofd_lock(int fd, int p, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = slot_off(p), .l_len = 1};
    return fd >= 0 ? fcntl(fd, F_OFD_SETLK, &fl) : -1;
}

/* 1: another open file description holds slot p's lock (its process is alive); 0: nobody
 * does; -1: cannot tell. */
static int ofd_held(int fd, int p)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = slot_off(p), .l_len = 1};
    if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type != F_UNLCK;
}

static int proc_dead(const egpu_acct *a, int idx)
{
    const egpu_region_proc *p = &a->r->procs[idx];
    if (idx == a->proc && a->pid == getpid()) return 0; /* mine (my own lock never conflicts) */
    if (a->holds && a->holds[idx] && a->pid == getpid()) return 0; /* a shared slot I hold */
    if (p->flags & EGPU_PROC_F_OFD) return ofd_held(a->fd, idx) == 0; /* pid only a hint */
    if (kill(p->pid, 0) == -1 && errno == ESRCH) return 1;
    if (p->start_time) {
        uint64_t st = proc_start_time(p->pid);
        if (st && st != p->start_time) return 1; /* the pid was reused */
    }
    return 0;
}

static void repair_locked(egpu_region *r)
{
    for (uint32_t c = 0; c < EGPU_REGION_MAX_CARDS; c++) {
        uint64_t sum = 0;
        for (int p = 0; p < EGPU_REGION_MAX_PROCS; p++)
            if (r->procs[p].pid) sum = sat_add(sum, r->procs[p].used[c]);
        r->cards[c].used_bytes = sum;
    }
    r->repairs++;
}

/* A waiter can sleep on a free lock: a process killed at the wrong instant can take a
 * wakeup with it (bench/accounting_storm.py met it in the fake driver's lock of the same kind:
 * lock word 0, a waiter asleep for good). So the wait is in slices, and a slice that ends
 * tries again; a holder that is alive keeps the lock as long as it holds it. */
#define LOCK_SLICE_MS 50
static void lock(egpu_region *r)
{
    int e = pthread_mutex_trylock(&r->lock.mutex); /* the common case: no clock read */
    while (e == EBUSY || e == ETIMEDOUT) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += LOCK_SLICE_MS * 1000000L;
        dl.tv_sec += dl.tv_nsec / 1000000000L;
        dl.tv_nsec %= 1000000000L;
        e = pthread_mutex_timedlock(&r->lock.mutex, &dl);
    }
    if (e == EOWNERDEAD) {
        repair_locked(r);
        pthread_mutex_consistent(&r->lock.mutex);
    }
}

static void unlock(egpu_region *r) { pthread_mutex_unlock(&r->lock.mutex); }

static int reap_locked(egpu_acct *a)
{
    egpu_region *r = a->r;
    int n = 0;
    for (int p = 0; p < EGPU_REGION_MAX_PROCS; p++) {
        egpu_region_proc *pr = &r->procs[p];
        if (!pr->pid || !proc_dead(a, p)) continue;
        for (int c = 0; c < EGPU_REGION_MAX_CARDS; c++)
            r->cards[c].used_bytes = sat_sub(r->cards[c].used_bytes, pr->used[c]);
        memset(pr, 0, sizeof *pr);
        n++;
    }
    r->reaped += (uint64_t)n;
    return n;
}

int egpu_acct_open(egpu_acct *a, const char *path, char *err, size_t errlen)
{
    memset(a, 0, sizeof *a);
    a->proc = -1;
    a->fd = -1;
    if (egpu_mkdirs_for(path) != 0) {
        snprintf(err, errlen, "cannot create the folder of region %s: %s", path, strerror(errno));
        return -1;
    }
    /* Never follow a link, never block on a FIFO/device, and only a regular file will do:
     * a region we cannot trust refuses CUDA (never a SIGBUS or a hang later). */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open region %s: %s", path, errno == ELOOP ? "it is a symbolic link" : strerror(errno));
        return -1;
    }
    struct stat st;
    int rc = -1, locked = 0;
    egpu_region *r = MAP_FAILED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "region %s is not a regular file", path);
        goto out;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (egpu_flock_bounded(fd, 5000) != 0) { /* serialises first-time initialisation between processes */
        snprintf(err, errlen, "region %s is locked by another process", path);
        goto out;
    }
    locked = 1;
    if (fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot stat region %s: %s", path, strerror(errno));
        goto out;
    }
    if (st.st_size == 0 && ftruncate(fd, sizeof(egpu_region)) != 0) {
        snprintf(err, errlen, "cannot size region %s: %s", path, strerror(errno));
        goto out;
    }
    if (st.st_size != 0 && (size_t)st.st_size != sizeof(egpu_region)) {
        snprintf(err, errlen, "region %s has size %lld, expected %zu (another layout version?)", path,
                 (long long)st.st_size, sizeof(egpu_region));
        goto out;
    }
    r = mmap(NULL, sizeof(egpu_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) {
        snprintf(err, errlen, "cannot map region %s: %s", path, strerror(errno));
        goto out;
    }
    if (r->magic == 0) {
        memset(r, 0, sizeof *r);
        pthread_mutexattr_t at;
        pthread_mutexattr_init(&at);
        pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
        pthread_mutex_init(&r->lock.mutex, &at);
        pthread_mutexattr_destroy(&at);
        r->version = EGPU_REGION_VERSION;
        r->size = sizeof(egpu_region);
        __atomic_store_n(&r->magic, EGPU_REGION_MAGIC, __ATOMIC_RELEASE);
    }
    if (r->magic != EGPU_REGION_MAGIC || r->version != EGPU_REGION_VERSION || r->size != sizeof(egpu_region)) {
        snprintf(err, errlen, "region %s: bad magic/version (%#llx v%u)", path, (unsigned long long)r->magic, r->version);
        munmap(r, sizeof(egpu_region));
        goto out;
    }
    a->r = r;
    a->fd = fd;
    lock(r);
    reap_locked(a);
    unlock(r);
    rc = 0;
out:
    if (locked) flock(fd, LOCK_UN);
    if (rc != 0) close(fd);
    return rc;
}

int egpu_acct_card(egpu_acct *a, const char *uuid, uint64_t limit)
{
    egpu_region *r = a->r;
    int slot = -1;
    lock(r);
    for (int c = 0; c < EGPU_REGION_MAX_CARDS && slot < 0; c++)
        if (!strncmp(r->cards[c].uuid, uuid, EGPU_UUID_LEN)) slot = c;
    for (int c = 0; c < EGPU_REGION_MAX_CARDS && slot < 0; c++)
        if (!r->cards[c].uuid[0]) {
            snprintf(r->cards[c].uuid, EGPU_UUID_LEN, "%s", uuid);
            if ((uint32_t)c + 1 > r->ncards) r->ncards = (uint32_t)c + 1;
            slot = c;
        }
    if (slot >= 0) r->cards[slot].limit_bytes = limit;
    unlock(r);
    return slot;
}

static egpu_region_proc *my_slot_locked(egpu_acct *a)
{
    egpu_region *r = a->r;
    if (a->proc >= 0) return &r->procs[a->proc];
    pid_t me = getpid();
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < EGPU_REGION_MAX_PROCS; p++)
            if (!r->procs[p].pid) {
                memset(&r->procs[p], 0, sizeof r->procs[p]);
                r->procs[p].start_time = proc_start_time(me);
                /* the liveness lock is taken before the slot is published (under the
                 * region lock), so no peer can see the slot without it */
                if (ofd_lock(a->fd, p, F_WRLCK) == 0) r->procs[p].flags |= EGPU_PROC_F_OFD;
                __atomic_store_n(&r->procs[p].pid, me, __ATOMIC_RELEASE);
                a->proc = p;
                a->pid = me;
                return &r->procs[p];
            }
        reap_locked(a);
    }
    return NULL;
}

int egpu_acct_charge(egpu_acct *a, int card, uint64_t bytes, uint64_t limit)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS) return -1;
    egpu_region *r = a->r;
    lock(r);
    int ok = 0;
    for (int pass = 0; pass < 2 && !ok; pass++) {
        uint64_t used = r->cards[card].used_bytes;
        if (used <= limit && bytes <= limit - used) ok = 1;
        else if (pass == 0 && reap_locked(a) == 0) break;
    }
    egpu_region_proc *me = ok ? my_slot_locked(a) : NULL;
    if (me) {
        me->used[card] = sat_add(me->used[card], bytes);
        card_add_locked(&r->cards[card], bytes);
    }
    unlock(r);
    return me ? 0 : -1;
}

void egpu_acct_force(egpu_acct *a, int card, uint64_t bytes)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS || !bytes) return;
    egpu_region *r = a->r;
    lock(r);
    egpu_region_proc *me = my_slot_locked(a);
    if (me) {
        me->used[card] = sat_add(me->used[card], bytes);
        card_add_locked(&r->cards[card], bytes);
    }
    unlock(r);
}

void egpu_acct_refused(egpu_acct *a, int card)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS) return;
    __atomic_add_fetch(&a->r->cards[card].refused, 1, __ATOMIC_RELAXED);
}

void egpu_acct_uncharge(egpu_acct *a, int card, uint64_t bytes)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS || !bytes || a->proc < 0) return;
    egpu_region *r = a->r;
    lock(r);
    egpu_region_proc *me = &r->procs[a->proc];
    uint64_t give = bytes < me->used[card] ? bytes : me->used[card]; /* never below my own usage */
    me->used[card] -= give;
    r->cards[card].used_bytes = sat_sub(r->cards[card].used_bytes, give);
    unlock(r);
}

uint64_t egpu_acct_used(egpu_acct *a, int card)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS) return 0;
    return __atomic_load_n(&a->r->cards[card].used_bytes, __ATOMIC_ACQUIRE);
}

int egpu_acct_pids(egpu_acct *a, int32_t *pids, int max)
{
    int n = 0;
    if (!a->r) return 0;
    lock(a->r);
    for (int p = 0; p < EGPU_REGION_MAX_PROCS && n < max; p++) {
        const egpu_region_proc *pr = &a->r->procs[p];
        if (pr->pid && !(pr->flags & EGPU_PROC_F_SHARED)) pids[n++] = pr->pid;
    }
    unlock(a->r);
    return n;
}

uint64_t egpu_acct_my_used(egpu_acct *a, int card)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS || a->proc < 0) return 0;
    return __atomic_load_n(&a->r->procs[a->proc].used[card], __ATOMIC_ACQUIRE);
}

/* ---- shared charges (egpu_region.h, EGPU_PROC_F_SHARED) ------------------------------ */
#define SHARED_FD_GONE UINT64_MAX

static int kcmp_same_file(pid_t other, int my_fd, uint64_t other_fd)
{
    if (other_fd > INT32_MAX) return 0;
    return syscall(SYS_kcmp, (pid_t)getpid(), other, KCMP_FILE, my_fd, (int)other_fd) == 0;
}

static uint32_t *holds_of(egpu_acct *a)
{
    if (!a->holds) a->holds = calloc(EGPU_REGION_MAX_PROCS, sizeof *a->holds);
    return a->holds;
}

/* locked: a free slot, taken with my read lock (reaping once if none), or -1 */
static int shared_slot_locked(egpu_acct *a)
{
    egpu_region *r = a->r;
    for (int pass = 0; pass < 2; pass++) {
        for (int p = 0; p < EGPU_REGION_MAX_PROCS; p++)
            if (!r->procs[p].pid) {
                if (ofd_lock(a->fd, p, F_RDLCK) != 0) return -1;
                return p;
            }
        reap_locked(a);
    }
    return -1;
}

int egpu_acct_share_out(egpu_acct *a, int card, uint64_t bytes, int dupfd)
{
    if (card < 0 || card >= EGPU_REGION_MAX_CARDS || a->proc < 0 || a->fd < 0 || dupfd < 0 || !holds_of(a))
        return -1;
    egpu_region *r = a->r;
    lock(r);
    int q = shared_slot_locked(a);
    if (q >= 0) {
        egpu_region_proc *me = &r->procs[a->proc], *sh = &r->procs[q];
        uint64_t move = bytes < me->used[card] ? bytes : me->used[card];
        memset(sh, 0, sizeof *sh);
        sh->flags = EGPU_PROC_F_OFD | EGPU_PROC_F_SHARED;
        sh->start_time = (uint64_t)dupfd;
        sh->used[card] = move;
        me->used[card] -= move; /* the card's sum is unchanged: the bytes move */
        a->holds[q] = 1;
        __atomic_store_n(&sh->pid, (int32_t)getpid(), __ATOMIC_RELEASE); /* published last */
    }
    unlock(r);
    return q;
}

int egpu_acct_share_find(egpu_acct *a, int fd)
{
    if (a->fd < 0 || fd < 0 || !holds_of(a)) return -1;
    egpu_region *r = a->r;
    int found = -1;
    lock(r);
    for (int p = 0; p < EGPU_REGION_MAX_PROCS && found < 0; p++) {
        egpu_region_proc *sh = &r->procs[p];
        if (!sh->pid || !(sh->flags & EGPU_PROC_F_SHARED) || sh->start_time == SHARED_FD_GONE) continue;
        if (!kcmp_same_file(sh->pid, fd, sh->start_time)) continue;
        if (a->holds[p] == 0 && ofd_lock(a->fd, p, F_RDLCK) != 0) continue;
        a->holds[p]++;
        found = p;
    }
    unlock(r);
    return found;
}

int egpu_acct_share_drop(egpu_acct *a, int slot)
{
    if (slot < 0 || slot >= EGPU_REGION_MAX_PROCS || !a->holds || !a->holds[slot]) return -1;
    egpu_region *r = a->r;
    int dupfd = -1;
    lock(r);
    egpu_region_proc *sh = &r->procs[slot];
    if (--a->holds[slot] == 0) {
        if (sh->pid == (int32_t)getpid() && sh->start_time != SHARED_FD_GONE) { /* the exporter lets go */
            dupfd = (int)sh->start_time;
            sh->start_time = SHARED_FD_GONE;
        }
        ofd_lock(a->fd, slot, F_UNLCK);
        if (ofd_held(a->fd, slot) == 0) { /* nobody else holds it: its bytes go back now */
            for (int c = 0; c < EGPU_REGION_MAX_CARDS; c++)
                r->cards[c].used_bytes = sat_sub(r->cards[c].used_bytes, sh->used[c]);
            memset(sh, 0, sizeof *sh);
        }
    }
    unlock(r);
    return dupfd;
}

int egpu_acct_reap(egpu_acct *a)
{
    lock(a->r);
    int n = reap_locked(a);
    unlock(a->r);
    return n;
}

void egpu_acct_detach(egpu_acct *a)
{
    if (!a->r || a->proc < 0 || a->pid != getpid()) return;
    egpu_region *r = a->r;
    lock(r);
    egpu_region_proc *me = &r->procs[a->proc];
    for (int c = 0; c < EGPU_REGION_MAX_CARDS; c++)
        r->cards[c].used_bytes = sat_sub(r->cards[c].used_bytes, me->used[c]);
    memset(me, 0, sizeof *me);
    ofd_lock(a->fd, a->proc, F_UNLCK);
    unlock(r);
    a->proc = -1;
}

void egpu_acct_forget(egpu_acct *a)
{
    /* the parent's private duplicates of its exported fds: not the child's to keep (an open
     * exported fd keeps the driver's memory alive, and the child would hold it uncharged) */
    for (int p = 0; a->r && a->pid && p < EGPU_REGION_MAX_PROCS; p++) {
        const egpu_region_proc *sh = &a->r->procs[p];
        if (sh->pid == (int32_t)a->pid && (sh->flags & EGPU_PROC_F_SHARED) && sh->start_time <= INT32_MAX)
            close((int)sh->start_time);
    }
    a->proc = -1;
    a->pid = 0;
    free(a->holds); /* the parent's read locks are its own description's: the child holds none */
    a->holds = NULL;
    if (a->fd < 0) return;
    /* The inherited descriptor shares the parent's open file description (and so its
     * liveness lock): take a description of our own. Closing ours leaves the parent's lock. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", a->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC); /* the magic link names the same file, no lookup */
    close(a->fd);
    a->fd = fd; /* -1: this process's slot falls back to pid liveness */
}
