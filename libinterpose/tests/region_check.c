/* region_check: joins card folders the way the interposer does and prints one line per step.
 * Shares are "A" and "B" (owner ids of those strings); raw-node registration (the folder is
 * writable), as egpu run does.
 *   card DIR       attach share A, detach        -> "card rc=0|1 errno=E"
 *   acct PATH      egpu_acct_open (container)   -> "acct rc=0|1"
 *   hold DIR       attach share A, take its lock, print "hold rc=0", sleep until killed
 *   lock DIR       attach share B (a co-tenant), take its own lock -> "lock rc=E ms=elapsed"
 *   lock-same DIR  attach share A, take its lock -> "lock-same rc=E ms=elapsed"
 *   claim DIR      attach share A for this pid, print "claim rc=0 slot=S pid=P", sleep until killed
 *   peer DIR       attach share B (reaping dead raw shares), print "peer rc=0 owners=N"
 *                  (shares on the card), detach
 * Run under a timeout by the tests: a hang is a failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "card_region.h"
#include "egpu_account.h"

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static egpu_card_region *attach(const char *dir, const char *who, int *slot)
{
    egpu_share_terms t = {.owner = egpu_owner_id(who), .cores = 50, .name = who};
    return egpu_card_attach(dir, "GPU-test", &t, (int32_t)getpid(), slot);
}

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *op = argv[i], *path = argv[i + 1];
        int slot = -1;
        if (!strcmp(op, "card")) {
            egpu_card_region *r = attach(path, "A", &slot);
            printf("card rc=%d errno=%d\n", r ? 0 : 1, r ? 0 : errno);
            if (r) egpu_card_detach(r, slot, (int32_t)getpid());
        } else if (!strcmp(op, "acct")) {
            egpu_acct a;
            char err[512];
            int rc = egpu_acct_open(&a, path, err, sizeof err);
            printf("acct rc=%d\n", rc ? 1 : 0);
            if (rc) fprintf(stderr, "%s\n", err);
        } else if (!strcmp(op, "claim") || !strcmp(op, "peer")) {
            int claim = !strcmp(op, "claim");
            egpu_card_region *r = attach(path, claim ? "A" : "B", &slot);
            if (!r) { printf("%s rc=-1\n", op); continue; }
            if (claim) {
                printf("claim rc=0 slot=%d pid=%d\n", slot, (int)getpid());
                fflush(stdout);
                for (;;) pause();
            }
            int owners = 0;
            for (int k = 0; k < EGPU_CARD_SLOTS; k++) owners += r->slot[k].owner != 0;
            printf("peer rc=0 owners=%d\n", owners);
            egpu_card_detach(r, slot, (int32_t)getpid());
        } else if (!strcmp(op, "hold") || !strcmp(op, "lock") || !strcmp(op, "lock-same")) {
            egpu_card_region *r = attach(path, !strcmp(op, "lock") ? "B" : "A", &slot);
            if (!r) { printf("%s rc=-1\n", op); continue; }
            if (!strcmp(op, "hold")) {
                pthread_mutex_lock(&r->slot[slot].mu);
                printf("hold rc=0\n");
                fflush(stdout);
                for (;;) pause();
            }
            long long t0 = now_ms();
            int e = egpu_card_lock(r, slot);
            printf("%s rc=%d ms=%lld\n", op, e, now_ms() - t0);
            if (!e) egpu_card_unlock(r, slot);
        }
        fflush(stdout);
    }
    return 0;
}
