/* card_region.c: a process's view of its card (card_region.h): the roster, its own share file
 * mapped over its slot, co-tenants' slots copied in with bounded preads. Free of CUDA calls so
 * that it runs in CPU unit tests. */
#define _GNU_SOURCE
#include "card_region.h"

#include "egpu_fsutil.h"
#include "fastclock.h"
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PPM 1000000ULL
#define ROSTER_FLOCK_MS 5000                  /* a roster writer (the hook, a raw share) holds it for a few writes */
#define NODE_LOCK_MS 10000                    /* egpu/card_roster.py NODE_LOCK_WAIT_S: another node writer's turn */
#define SHARE_INIT_MARK 0x54494E4955504745ULL /* "EGPUINIT": a process of the share is making its file */
#define SHARE_INIT_WAIT_NS 1000000000ULL      /* ... for at most 1 s, else it died: taken over */
#define QUEUED_AHEAD_MAX_NS 1000000000ULL     /* a co-tenant's predicted queue end: at most 1 s ahead */
#define INFLIGHT_MAX 1000000ULL               /* a co-tenant's launches in flight: at most this many */
#define OTHER_FD_ABSENT (-2)                  /* the share file could not be opened: retried with the roster */
#define RAW_CARD_DIR_MODE 01777               /* raw nodes: every user's processes register themselves */
#define RAW_FILE_MODE 0666

uint64_t egpu_owner_id(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const unsigned char *p = (const unsigned char *)key; p && *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ULL;
    }
    return h ? h : 1;
}

static void mutex_init_shared(pthread_mutex_t *mu)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
}

static void header_init(egpu_card_region *r, const char *uuid)
{
    snprintf(r->uuid, sizeof r->uuid, "%s", uuid ? uuid : "");
    r->self = -1;
    r->dir_fd = -1;
    r->own_fd = -1;
    r->unbooked_ppm = PPM; /* no roster read yet: nothing booked */
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        r->other_fd[j] = -1;
        r->other_seen_ns[j] = EGPU_BUSY_UNSEEN;
    }
    pthread_mutex_init(&r->refresh_mu, NULL);
}

void egpu_card_region_init(egpu_card_region *r, const char *uuid, uint64_t now_ns)
{
    (void)now_ns;
    memset(r, 0, sizeof *r);
    header_init(r, uuid);
    for (int i = 0; i < EGPU_CARD_SLOTS; i++) {
        mutex_init_shared(&r->slot[i].mu);
        r->slot[i].share_magic = EGPU_SHARE_MAGIC;
        r->slot[i].share_version = EGPU_SHARE_VERSION;
    }
}

/* ---- the share's own lock --------------------------------------------------------------- */

/* A slot's lock is held for a few stores at a time. A holder that never lets go (stopped, or
 * the share's own hostile process) must not hang the share's other launches: after
 * EGPU_SLOT_LOCK_WAIT_MS the caller gets ETIMEDOUT and goes on uncoordinated (logged once). */
#define EGPU_SLOT_LOCK_WAIT_MS 200
int egpu_card_lock(egpu_card_region *r, int slot)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += (long)EGPU_SLOT_LOCK_WAIT_MS * 1000000L;
    dl.tv_sec += dl.tv_nsec / 1000000000L;
    dl.tv_nsec %= 1000000000L;
    int e = pthread_mutex_timedlock(&r->slot[slot].mu, &dl);
    if (e == ETIMEDOUT) {
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            fprintf(stderr,
                    "egpu: warning: the share's lock on card %s is held by another of its processes for over %d ms: "
                    "compute is not coordinated for such launches\n",
                    r->uuid, EGPU_SLOT_LOCK_WAIT_MS);
        return e;
    }
    if (e == EOWNERDEAD) { /* a process died mid-update: every update leaves the slot usable */
        pthread_mutex_consistent(&r->slot[slot].mu);
        e = 0;
    }
    return e;
}

void egpu_card_unlock(egpu_card_region *r, int slot) { pthread_mutex_unlock(&r->slot[slot].mu); }

/* ---- liveness of a share's processes ----------------------------------------------------- */

static int pid_dead(int32_t pid) { return pid > 0 && kill(pid, 0) == -1 && errno == ESRCH; }

static off_t cell_off(const egpu_card_slot *s, const int32_t *cell)
{
    return (off_t)((const char *)cell - (const char *)s);
}

static int cell_lock(int fd, const egpu_card_slot *s, const int32_t *cell, short type)
{
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = cell_off(s, cell), .l_len = 1};
    return fd >= 0 ? fcntl(fd, F_OFD_SETLK, &fl) : -1;
}

/* 1: another open file description holds a WRITE lock on the range; 0: nobody; -1: cannot
 * tell. A share's processes hold write locks on their cells; a co-tenant, which sees the file
 * read-only, can take only read locks, which this probe (F_RDLCK conflicts with writes only)
 * does not count: it cannot keep a dead process alive. */
static int range_held(int fd, off_t start, off_t len)
{
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
    if (fd < 0 || fcntl(fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type != F_UNLCK;
}

static int cell_dead(int fd, const egpu_card_slot *s, int p)
{
    if (EGPU_SLOT_PID_OFD(s) & (1ull << p)) return range_held(fd, cell_off(s, &s->pids[p]), 1) == 0;
    return pid_dead(s->pids[p]);
}

/* A fresh controller state for a share whose processes all exited (or a new one). */
static void slot_reset_locked(egpu_card_slot *s, uint64_t owner, uint64_t now_ns)
{
    memset(s, 0, EGPU_SLOT_PUBLIC_BYTES);
    s->owner = owner;
    s->refill_ns = now_ns;
    s->win_start_ns = now_ns;
}

/* Joins process pid to slot s (its lock held): forgets dead processes, resets the state when
 * none is left, records pid (with a liveness lock on its cell when fd >= 0). */
static void join_locked(egpu_card_slot *s, int fd, const egpu_share_terms *t, int32_t pid, uint64_t now_ns)
{
    int live = 0;
    for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
        if (!s->pids[p]) continue;
        if (s->pids[p] != pid && cell_dead(fd, s, p)) {
            s->pids[p] = 0;
            EGPU_SLOT_PID_OFD(s) &= ~(1ull << p);
        } else {
            live++;
        }
    }
    if (!live || s->owner != t->owner) slot_reset_locked(s, t->owner, now_ns);
    /* The config of the share is the same for all its processes; the last one wins. */
    s->priority = t->priority;
    s->policy = t->policy;
    s->cores = t->cores;
    s->floor_pct = t->floor_pct;
    s->flags = (t->cores > 0 && t->cores < 100) ? (s->flags | EGPU_SLOT_CAPPED) : (s->flags & ~EGPU_SLOT_CAPPED);
    int have = 0, cell = -1;
    for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
        if (s->pids[p] == pid) have = 1;
        if (!s->pids[p] && cell < 0) cell = p;
    }
    /* More processes than pid cells: the share still works; its state is then reset only
     * when the tracked ones exit and a later process joins. */
    if (!have && cell >= 0) {
        if (cell_lock(fd, s, &s->pids[cell], F_WRLCK) == 0) EGPU_SLOT_PID_OFD(s) |= 1ull << cell;
        else EGPU_SLOT_PID_OFD(s) &= ~(1ull << cell);
        s->pids[cell] = pid;
    }
}

/* n_low: the low-priority shares among the slots (co-tenants' priorities are the roster's). */
static void count_low(egpu_card_region *r)
{
    uint32_t lo = 0;
    for (int i = 0; i < EGPU_CARD_SLOTS; i++)
        if (r->slot[i].owner && r->slot[i].priority == EGPU_CARD_PRIO_LOW) lo++;
    __atomic_store_n(&r->n_low, lo, __ATOMIC_RELAXED);
}

int egpu_card_claim(egpu_card_region *r, uint64_t owner, int32_t pid, uint32_t priority, uint32_t policy,
                    uint32_t cores, uint32_t floor_pct, uint64_t now_ns)
{
    int idx = -1, free_idx = -1;
    for (int i = 0; i < EGPU_CARD_SLOTS; i++) {
        if (r->slot[i].owner == owner) {
            idx = i;
            break;
        }
        if (!r->slot[i].owner && free_idx < 0) free_idx = i;
    }
    if (idx < 0) idx = free_idx;
    if (idx < 0) return -1;
    egpu_share_terms t = {
        .owner = owner, .priority = priority, .policy = policy, .cores = cores, .floor_pct = floor_pct};
    if (egpu_card_lock(r, idx) != 0) return -1;
    join_locked(&r->slot[idx], -1, &t, pid, now_ns);
    egpu_card_unlock(r, idx);
    count_low(r);
    return idx;
}

/* ---- the roster ---------------------------------------------------------------------------- */

static int roster_valid(const egpu_card_roster *ro)
{
    return ro->magic == EGPU_ROSTER_MAGIC && ro->version == EGPU_ROSTER_VERSION && ro->nslots == EGPU_CARD_SLOTS &&
           ro->entry_size == sizeof(egpu_roster_entry) && ro->header_size == offsetof(egpu_card_roster, entry);
}

static int open_regular_at(int dir_fd, const char *name, int flags, mode_t mode)
{
    int fd = openat(dir_fd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, mode);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}

/* Reads the roster into *ro: 0, or -1 (missing, unreadable, short or foreign: errno). */
static int roster_read_fd(int fd, egpu_card_roster *ro)
{
    ssize_t n = pread(fd, ro, sizeof *ro, 0);
    if (n != (ssize_t)sizeof *ro || !roster_valid(ro)) {
        errno = n == 0 ? ENOENT : EPROTO;
        return -1;
    }
    return 0;
}

static int roster_read(int dir_fd, egpu_card_roster *ro)
{
    int fd = open_regular_at(dir_fd, EGPU_ROSTER_FILE, O_RDONLY, 0);
    if (fd < 0) return -1;
    int rc = roster_read_fd(fd, ro);
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static int roster_find(const egpu_card_roster *ro, uint64_t owner)
{
    for (int i = 0; i < EGPU_CARD_SLOTS; i++)
        if (ro->entry[i].owner == owner) return i;
    return -1;
}

static void share_file_name(uint64_t owner, char *out, size_t n)
{
    snprintf(out, n, "%s%016llx", EGPU_SHARE_FILE_PREFIX, (unsigned long long)owner);
}

/* A raw entry whose share has no live process (no liveness lock on its pid cells). */
static int raw_entry_dead(int dir_fd, const egpu_roster_entry *e)
{
    if (!(e->flags & EGPU_ROSTER_RAW)) return 0;
    char name[64];
    share_file_name(e->owner, name, sizeof name);
    int fd = open_regular_at(dir_fd, name, O_RDONLY, 0);
    if (fd < 0) return 1;
    int held = range_held(fd, offsetof(egpu_card_slot, pids), sizeof(((egpu_card_slot *)0)->pids));
    close(fd);
    return held == 0;
}

/* The roster's write protocol, the same as the node's writers' (egpu/card_roster.py
 * register / unregister; docs/security.md, "Node-side state"), so that a reader without the
 * lock sees a free entry or a whole one: a new entry's terms are written before its owner
 * word, a freed entry's owner word is cleared before its terms, an entry kept by its owner is
 * rewritten in place (terms only), and the generation is bumped after the change. A roster
 * file found empty is first written whole, empty. tests/roster_writes.c records these writes
 * and tests/runtime_hook/test_roster_protocol.py checks them with the Python writer's. */
#define ROSTER_OWNER_BYTES 8
static int roster_put(int fd, int i, const egpu_roster_entry *e, int is_new)
{
    off_t off = (off_t)(offsetof(egpu_card_roster, entry) + (size_t)i * sizeof *e);
    size_t terms = sizeof *e - ROSTER_OWNER_BYTES;
    if (pwrite(fd, (const char *)e + ROSTER_OWNER_BYTES, terms, off + ROSTER_OWNER_BYTES) != (ssize_t)terms) return -1;
    if (is_new && pwrite(fd, &e->owner, ROSTER_OWNER_BYTES, off) != ROSTER_OWNER_BYTES) return -1;
    return 0;
}

static int roster_free(int fd, int i)
{
    static const egpu_roster_entry zero;
    off_t off = (off_t)(offsetof(egpu_card_roster, entry) + (size_t)i * sizeof zero);
    size_t terms = sizeof zero - ROSTER_OWNER_BYTES;
    if (pwrite(fd, &zero.owner, ROSTER_OWNER_BYTES, off) != ROSTER_OWNER_BYTES) return -1;
    if (pwrite(fd, (const char *)&zero + ROSTER_OWNER_BYTES, terms, off + ROSTER_OWNER_BYTES) != (ssize_t)terms) return -1;
    return 0;
}

static int roster_bump(int fd, egpu_card_roster *ro)
{
    ro->generation++;
    off_t off = (off_t)offsetof(egpu_card_roster, generation);
    return pwrite(fd, &ro->generation, sizeof ro->generation, off) == (ssize_t)sizeof ro->generation ? 0 : -1;
}

/* The node writers' lock (egpu/card_roster.py _node_lock): an flock of the card folder's
 * parent, which no container sees, taken before the roster's own. Returns its fd or -1. */
static int node_lock(int dir_fd)
{
    int fd = openat(dir_fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    if (egpu_flock_bounded(fd, NODE_LOCK_MS) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

static void unlock_close(int fd)
{
    if (fd < 0) return;
    flock(fd, LOCK_UN);
    close(fd);
}

/* Raw nodes: adds the share to the roster itself (the folder is writable: no hook made it
 * read-only), as the node's writers do. Returns the roster fd, still flocked, and *node_fd,
 * the node writers' lock, still held (the caller joins the share before it lets go of both,
 * so that no one reaps it in between), or -1. */
static int roster_register(int dir_fd, const char *uuid, const egpu_share_terms *t, egpu_card_roster *ro, int *idx,
                           int *node_fd)
{
    *node_fd = -1;
    int fd = openat(dir_fd, EGPU_ROSTER_FILE, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, RAW_FILE_MODE);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (*node_fd = node_lock(dir_fd)) < 0 ||
        egpu_flock_bounded(fd, ROSTER_FLOCK_MS) != 0) {
        int e = errno ? errno : EINVAL;
        close(fd);
        unlock_close(*node_fd);
        *node_fd = -1;
        errno = e;
        return -1;
    }
    (void)fchmod(fd, RAW_FILE_MODE);
    int e = 0;
    if (roster_read_fd(fd, ro) != 0) {
        if (fstat(fd, &st) != 0 || st.st_size != 0) { /* something else lives here: never overwrite it */
            e = EPROTO;
            goto fail;
        }
        memset(ro, 0, sizeof *ro);
        ro->magic = EGPU_ROSTER_MAGIC;
        ro->version = EGPU_ROSTER_VERSION;
        ro->nslots = EGPU_CARD_SLOTS;
        ro->entry_size = sizeof(egpu_roster_entry);
        ro->header_size = offsetof(egpu_card_roster, entry);
        snprintf(ro->uuid, sizeof ro->uuid, "%s", uuid ? uuid : "");
        if (pwrite(fd, ro, sizeof *ro, 0) != (ssize_t)sizeof *ro) {
            e = EIO;
            goto fail;
        }
    }
    int dirty = 0;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) { /* raw shares whose processes all exited */
        egpu_roster_entry *x = &ro->entry[j];
        if (!x->owner || x->owner == t->owner || !raw_entry_dead(dir_fd, x)) continue;
        if (roster_free(fd, j) != 0) {
            e = EIO;
            goto fail;
        }
        char old[64];
        share_file_name(x->owner, old, sizeof old);
        unlinkat(dir_fd, old, 0);
        memset(x, 0, sizeof *x);
        dirty = 1;
    }
    int i = roster_find(ro, t->owner);
    if (i < 0)
        for (int j = 0; j < EGPU_CARD_SLOTS && i < 0; j++)
            if (!ro->entry[j].owner) i = j;
    if (i < 0) {
        e = ENOSPC;
        goto fail;
    }
    egpu_roster_entry *x = &ro->entry[i];
    if (x->owner != t->owner || (x->flags & EGPU_ROSTER_RAW)) { /* the node's own entries stay as it wrote them */
        egpu_roster_entry n = {.owner = t->owner, .priority = t->priority, .policy = t->policy, .cores = t->cores,
                               .floor_pct = t->floor_pct, .flags = EGPU_ROSTER_RAW};
        snprintf(n.name, sizeof n.name, "%s", t->name ? t->name : "");
        if (memcmp(&n, x, sizeof n) != 0) {
            if (roster_put(fd, i, &n, x->owner != t->owner) != 0) {
                e = EIO;
                goto fail;
            }
            *x = n;
            dirty = 1;
        }
    }
    if (dirty && roster_bump(fd, ro) != 0) {
        e = EIO;
        goto fail;
    }
    *idx = i;
    return fd;
fail:
    unlock_close(fd);
    unlock_close(*node_fd);
    *node_fd = -1;
    errno = e;
    return -1;
}

/* ---- attach / detach --------------------------------------------------------------------- */

static int open_card_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 || errno != ENOENT) return fd;
    /* raw nodes: nobody made the folder; make it (fails where the parent is read-only) */
    char probe[600];
    snprintf(probe, sizeof probe, "%s/x", dir);
    if (egpu_mkdirs_for(probe) != 0) return -1;
    (void)chmod(dir, RAW_CARD_DIR_MODE);
    return open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* The share's own file, opened read-write, sized (it is ours: a wrong size hurts only us). */
static int open_own_file(int dir_fd, uint64_t owner, int create)
{
    char name[64];
    share_file_name(owner, name, sizeof name);
    int fd = open_regular_at(dir_fd, name, O_RDWR | (create ? O_CREAT : 0), RAW_FILE_MODE);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 ||
        (st.st_size != (off_t)sizeof(egpu_card_slot) && ftruncate(fd, sizeof(egpu_card_slot)) != 0)) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (create) (void)fchmod(fd, RAW_FILE_MODE);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The share file's own lock made once, by the first of the share's processes: a compare-and-swap
 * on its magic, never an flock (a co-tenant can flock any file it can open, read-only ones
 * too). A process that died half-way is taken over after SHARE_INIT_WAIT_NS. */
static void share_file_ready(egpu_card_slot *s)
{
    uint64_t deadline = egpu_now_ns() + SHARE_INIT_WAIT_NS;
    for (;;) {
        uint64_t m = __atomic_load_n(&s->share_magic, __ATOMIC_ACQUIRE);
        if (m == EGPU_SHARE_MAGIC && s->share_version == EGPU_SHARE_VERSION) return;
        if (m == SHARE_INIT_MARK && egpu_now_ns() < deadline) {
            usleep(1000);
            continue;
        }
        if (__atomic_compare_exchange_n(&s->share_magic, &m, SHARE_INIT_MARK, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            memset(s, 0, offsetof(egpu_card_slot, share_magic));
            mutex_init_shared(&s->mu);
            s->share_version = EGPU_SHARE_VERSION;
            __atomic_store_n(&s->share_magic, EGPU_SHARE_MAGIC, __ATOMIC_RELEASE);
            return;
        }
    }
}

egpu_card_region *egpu_card_attach(const char *dir, const char *uuid, const egpu_share_terms *t, int32_t pid, int *slot)
{
    *slot = -1;
    if (!dir || !*dir || !t || !t->owner) {
        errno = EINVAL;
        return NULL;
    }
    int dir_fd = open_card_dir(dir), roster_fd = -1, node_fd = -1, own_fd = -1, idx = -1;
    egpu_card_region *r = MAP_FAILED;
    egpu_card_roster ro_buf;
    egpu_card_roster *ro = &ro_buf;
    if (dir_fd < 0) {
        if (errno == ENOTDIR || errno == ELOOP)
            fprintf(stderr, "egpu: card folder %s is not a folder (a link, or an older egpu's region file): refused\n",
                    dir);
        goto fail;
    }
    /* a writable folder is a raw node's: register (or refresh) the share there; a container
     * sees the folder read-only and finds what the hook registered */
    roster_fd = roster_register(dir_fd, uuid, t, ro, &idx, &node_fd);
    if (roster_fd < 0) {
        int e = errno;
        if (roster_read(dir_fd, ro) == 0) idx = roster_find(ro, t->owner);
        if (idx < 0) {
            fprintf(stderr, "egpu: share is not in the roster of card %s and cannot be added (%s)%s\n", dir,
                    strerror(e), e == EROFS || e == EACCES ? ": the runtime hook did not register this container" : "");
            errno = e;
            goto fail;
        }
    }
    own_fd = open_own_file(dir_fd, t->owner, roster_fd >= 0);
    if (own_fd < 0 && errno == ENOENT && roster_fd < 0)
        fprintf(stderr, "egpu: the share's file is missing in %s: the runtime hook did not mount it\n", dir);
    if (own_fd < 0) {
        fprintf(stderr, "egpu: cannot open this share's file in %s (%s)\n", dir, strerror(errno));
        goto fail;
    }
    r = mmap(NULL, sizeof *r, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) goto fail;
    header_init(r, uuid);
    egpu_card_slot *s = &r->slot[idx];
    if (mmap(s, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, own_fd, 0) == MAP_FAILED) goto fail;
    share_file_ready(s);
    int locked = egpu_card_lock(r, idx) == 0;
    join_locked(s, own_fd, t, pid, egpu_now_ns());
    if (locked) egpu_card_unlock(r, idx);
    unlock_close(roster_fd);
    unlock_close(node_fd);
    r->self = idx;
    r->dir_fd = dir_fd;
    r->own_fd = own_fd;
    egpu_card_refresh(r, egpu_now_ns(), 0);
    *slot = idx;
    return r;
fail:;
    int e = errno;
    if (r != MAP_FAILED) munmap(r, sizeof *r);
    if (own_fd >= 0) close(own_fd);
    unlock_close(roster_fd);
    unlock_close(node_fd);
    if (dir_fd >= 0) close(dir_fd);
    errno = e;
    return NULL;
}

void egpu_card_detach(egpu_card_region *r, int slot, int32_t pid)
{
    if (!r || slot < 0 || slot >= EGPU_CARD_SLOTS || egpu_card_lock(r, slot) != 0) return;
    egpu_card_slot *s = &r->slot[slot];
    for (int p = 0; p < EGPU_CARD_SLOT_PIDS; p++) {
        if (s->pids[p] != pid) continue;
        if (EGPU_SLOT_PID_OFD(s) & (1ull << p)) cell_lock(r->own_fd, s, &s->pids[p], F_UNLCK);
        EGPU_SLOT_PID_OFD(s) &= ~(1ull << p);
        s->pids[p] = 0;
    }
    egpu_card_unlock(r, slot);
}

/* ---- co-tenants ---------------------------------------------------------------------------- */

static uint64_t u64min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* A co-tenant's time later than it can be (work that ended, or was last seen, in the future)
 * is a lie or garbage: it counts as none, never as "just now". Clamped to now, the hostile
 * tenant's lies (work ending 10 s ahead) made a co-tenant capped at 50% run at 62-68% in 3 of
 * 10 runs of tests/security's random-bytes attack (0 of 18 since). CLOCK_AHEAD_SLACK_NS: an
 * honest writer's event times, mapped from GPU time by its anchor, may run ahead of the host
 * clock by microseconds. */
#define CLOCK_AHEAD_SLACK_NS 1000000ULL /* 1 ms */
static uint64_t past_or_none(uint64_t t, uint64_t now)
{
    return t > now + CLOCK_AHEAD_SLACK_NS ? 0 : u64min(t, now);
}

/* What a co-tenant's file says, bounded by what the roster booked and by the clock: a lie
 * may cost the liar (its work unseen, its reservation gone), never a co-tenant. A strict
 * share's use and demand are believed up to its booking (card_region.h, egpu_use_bound_ppm):
 * believed up to the card, a strict 10% share that never launched and wrote use = demand =
 * 100% held an elastic 30% neighbour at 30% with the card 70% idle, and made its strict
 * co-tenants' card look booked whole (their PI trim held). An elastic share's, up to the card
 * (it may use idle compute; docs/security.md's known gaps). */
static void sanitise(egpu_card_slot *o, const egpu_roster_entry *e, uint64_t now)
{
    o->owner = e->owner;
    o->priority = e->priority;
    o->policy = e->policy;
    o->cores = e->cores;
    o->floor_pct = e->floor_pct;
    o->use_ppm = u64min(o->use_ppm, egpu_use_bound_ppm(e));
    o->demand_ppm = u64min(o->demand_ppm, egpu_use_bound_ppm(e));
    o->last_active_ns = past_or_none(o->last_active_ns, now);
    o->busy_until_ns = past_or_none(o->busy_until_ns, now);
    o->inflight_since_ns = past_or_none(o->inflight_since_ns, now);
    o->last_complete_ns = past_or_none(o->last_complete_ns, now);
    o->inflight_n = o->inflight_since_ns ? u64min(o->inflight_n, INFLIGHT_MAX) : 0;
    /* in flight and quiet past the owner's own expiry: its last process died with them (the
     * owner would forget them at its next launch, which may never come) */
    if (o->inflight_n && egpu_inflight_stale(o, now)) o->inflight_n = 0;
    o->queued_until_ns = o->queued_until_ns > now + QUEUED_AHEAD_MAX_NS ? 0 : o->queued_until_ns;
    o->hi_mark_ns = e->priority == EGPU_CARD_PRIO_HIGH ? past_or_none(o->hi_mark_ns, now) : 0;
}

/* The part of the card no share on the roster booked, ppm. */
static uint64_t unbooked_ppm(const egpu_roster_entry roster[EGPU_CARD_SLOTS])
{
    uint64_t booked = 0;
    for (int j = 0; j < EGPU_CARD_SLOTS; j++)
        if (roster[j].owner) booked += (uint64_t)u64min(roster[j].cores, 100) * (PPM / 100);
    return booked < PPM ? PPM - booked : 0;
}

/* The roster changes only here: what it leaves unbooked is worked out here, not at each refresh. */
static void reread_roster(egpu_card_region *r, uint64_t now)
{
    egpu_card_roster ro;
    r->roster_read_ns = now;
    if (roster_read(r->dir_fd, &ro) != 0) return; /* keep the last good one */
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        if (r->other_fd[j] == OTHER_FD_ABSENT) r->other_fd[j] = -1; /* try again */
        if (j == r->self || ro.entry[j].owner == r->other_owner[j]) continue;
        if (r->other_fd[j] >= 0) close(r->other_fd[j]);
        r->other_fd[j] = -1;
        r->other_owner[j] = ro.entry[j].owner;
        r->other_seen_ns[j] = EGPU_BUSY_UNSEEN; /* another share: its credit starts anew */
    }
    memcpy(r->roster, ro.entry, sizeof r->roster);
    r->unbooked_ppm = unbooked_ppm(r->roster);
}

/* One co-tenant's public slot into buf (zeroed when it cannot be read or lies about whose it is). */
static void read_other(egpu_card_region *r, int j, unsigned char *buf)
{
    memset(buf, 0, EGPU_SLOT_PUBLIC_BYTES);
    if (r->other_fd[j] == -1) {
        char name[64];
        share_file_name(r->other_owner[j], name, sizeof name);
        int fd = open_regular_at(r->dir_fd, name, O_RDONLY, 0);
        r->other_fd[j] = fd >= 0 ? fd : OTHER_FD_ABSENT;
    }
    if (r->other_fd[j] < 0) return;
    ssize_t n = pread(r->other_fd[j], buf, EGPU_SLOT_PUBLIC_BYTES, 0);
    uint64_t owner;
    memcpy(&owner, buf, sizeof owner);
    if (n != EGPU_SLOT_PUBLIC_BYTES || owner != r->other_owner[j]) memset(buf, 0, EGPU_SLOT_PUBLIC_BYTES);
}

/* A co-tenant's measured work, as far as it is believed (compute_settle.c): the growth of its
 * busy_total_ns since it was last read, at most what its booking could have let out since
 * (other_allow_ns: refilled at its credit bound, holding at most CREDIT_HORIZON_NS of it), is
 * its credit, which explains waits of ours until it is used. A share that says it kept another
 * waiting must have counted that time as its own (the node agent reports it as its use), and
 * no more than its booking lets it. */
#define CREDIT_HORIZON_NS 1000000000ULL /* 1 s of a co-tenant's booking */
static void credit_other(egpu_card_region *r, int j, uint64_t dt, uint64_t unbooked_ppm)
{
    const egpu_card_slot *o = &r->slot[j];
    uint64_t bound = egpu_credit_bound_ppm(&r->roster[j], unbooked_ppm);
    uint64_t seen = r->other_seen_ns[j], busy = o->busy_total_ns;
    uint64_t most = CREDIT_HORIZON_NS / 1000 * bound / 1000;
    r->other_seen_ns[j] = busy;
    if (seen == EGPU_BUSY_UNSEEN || busy < seen) {
        /* first sight (what it did before is not known: its booking's worth may follow at
         * once), or a counter that went back (only the growth from here counts) */
        r->other_allow_ns[j] = most;
        if (seen == EGPU_BUSY_UNSEEN) __atomic_store_n(&r->other_credit_ns[j], 0, __ATOMIC_RELAXED);
        return;
    }
    uint64_t allow = dt >= CREDIT_HORIZON_NS ? most : u64min(r->other_allow_ns[j] + dt / 1000 * bound / 1000, most);
    uint64_t take = u64min(busy - seen, allow);
    r->other_allow_ns[j] = allow - take;
    if (__atomic_load_n(&r->other_credit_ns[j], __ATOMIC_RELAXED) < most)
        __atomic_add_fetch(&r->other_credit_ns[j], take, __ATOMIC_RELAXED);
}

static void refresh_locked(egpu_card_region *r, uint64_t now, uint64_t roster_every_ns)
{
    if (!roster_every_ns || now - r->roster_read_ns >= roster_every_ns) reread_roster(r, now);
    uint64_t hi = 0, last = __atomic_load_n(&r->refreshed_ns, __ATOMIC_RELAXED);
    uint64_t dt = now > last ? now - last : 0;
    _Alignas(8) unsigned char buf[EGPU_SLOT_PUBLIC_BYTES];
    for (int j = 0; j < EGPU_CARD_SLOTS; j++) {
        if (j == r->self) continue;
        egpu_card_slot *o = &r->slot[j];
        if (!r->roster[j].owner) {
            if (o->owner) memset(o, 0, EGPU_SLOT_PUBLIC_BYTES);
            continue;
        }
        read_other(r, j, buf);
        memcpy(o, buf, EGPU_SLOT_PUBLIC_BYTES);
        sanitise(o, &r->roster[j], now);
        credit_other(r, j, dt, r->unbooked_ppm);
        if (o->hi_mark_ns > hi) hi = o->hi_mark_ns;
    }
    count_low(r);
    __atomic_store_n(&r->refreshed_ns, now, __ATOMIC_RELAXED);
    uint64_t old = __atomic_load_n(&r->hi_active_ns, __ATOMIC_RELAXED);
    while (old < hi &&
           !__atomic_compare_exchange_n(&r->hi_active_ns, &old, hi, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {}
}

void egpu_card_refresh(egpu_card_region *r, uint64_t now_ns, uint64_t roster_every_ns)
{
    if (!r || r->dir_fd < 0) return; /* plain memory: every slot is already here */
    pthread_mutex_lock(&r->refresh_mu);
    refresh_locked(r, now_ns, roster_every_ns);
    pthread_mutex_unlock(&r->refresh_mu);
}

void egpu_card_try_refresh(egpu_card_region *r, uint64_t now_ns, uint64_t older_than_ns)
{
    if (!r || r->dir_fd < 0 || now_ns < __atomic_load_n(&r->refreshed_ns, __ATOMIC_RELAXED) + older_than_ns ||
        pthread_mutex_trylock(&r->refresh_mu) != 0)
        return;
    refresh_locked(r, now_ns, UINT64_MAX);
    pthread_mutex_unlock(&r->refresh_mu);
}
