/* roster_writes.c: the writes the interposer's own roster writer (card_region.c, raw nodes)
 * makes, in order, for tests/runtime_hook/test_roster_protocol.py to check against the one
 * protocol it shares with the node's writers (egpu/card_roster.py).
 *
 * Linked with card_region.c and -Wl,--wrap=pwrite: every pwrite of the writer is recorded
 * (and done). Usage: roster_writes CARDS_DIR. In CARDS_DIR/GPU-w (made here, a raw node's
 * folder), in order:
 *   new     share A registers on a card without a roster (then its process detaches);
 *   again   share A attaches again (its RAW entry, unchanged: no write);
 *   second  share B registers beside A;
 *   reap    A's process detached (its entry is dead): share C registers, A's entry is freed.
 * Prints "phase <name>" before each, and one line a write of the roster:
 *   pwrite <offset> <length> <hex of the first 8 bytes written> <owners>
 * (owners: the entries' owner words that are not 0 in a write longer than an owner word). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "card_region.h"

ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    char link[64], path[512];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, path, sizeof path - 1);
    path[k > 0 ? k : 0] = 0;
    if (k > 0 && strstr(path, "/" EGPU_ROSTER_FILE)) {
        uint64_t head = 0, owner;
        memcpy(&head, buf, n < sizeof head ? n : sizeof head);
        int owners = 0; /* entries the write commits whole (an owner word among more) */
        size_t first = offsetof(egpu_card_roster, entry);
        for (size_t e = first; e + sizeof owner <= (size_t)off + n && n > sizeof owner; e += sizeof(egpu_roster_entry)) {
            if (e < (size_t)off) continue;
            memcpy(&owner, (const char *)buf + (e - (size_t)off), sizeof owner);
            owners += owner != 0;
        }
        printf("pwrite %lld %zu %016llx %d\n", (long long)off, n, (unsigned long long)head, owners);
    }
    return __real_pwrite(fd, buf, n, off);
}

static egpu_card_region *attach(const char *dir, const char *key, int *slot)
{
    egpu_share_terms t = {.owner = egpu_owner_id(key), .priority = 0, .policy = 0, .cores = 30, .name = key};
    egpu_card_region *r = egpu_card_attach(dir, "GPU-w", &t, (int32_t)getpid(), slot);
    if (!r) {
        fprintf(stderr, "roster_writes: attach %s failed\n", key);
        _exit(2);
    }
    return r;
}

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/GPU-w", argv[1]);
    mkdir(argv[1], 0755);
    int sa, sb, sc;
    printf("phase new\n");
    egpu_card_region *a = attach(dir, "share-a", &sa);
    egpu_card_detach(a, sa, (int32_t)getpid());
    printf("phase again\n");
    a = attach(dir, "share-a", &sa);
    printf("phase second\n");
    (void)attach(dir, "share-b", &sb);
    /* A's process is gone: its liveness cell is let go, its entry is dead */
    egpu_card_detach(a, sa, (int32_t)getpid());
    printf("phase reap\n");
    (void)attach(dir, "share-c", &sc);
    fflush(stdout);
    return 0;
}
