/* region_check: opens region files the way the interposer does and prints one line per step.
 *   card PATH   egpu_card_region_open        -> "card rc=0|1 errno=E"
 *   acct PATH   egpu_acct_open (container)   -> "acct rc=0|1"
 *   hold PATH   open the card region, take its lock, print "hold rc=0", sleep until killed
 *   lock PATH   open the card region, egpu_card_lock -> "lock rc=E ms=elapsed"
 *   claim PATH  open the card region, claim share "A" for this pid, print
 *               "claim rc=0 slot=S pid=P", sleep until killed
 *   peer PATH   open the card region, claim share "B" (reaping dead processes' slots), print
 *               "peer rc=0 owners=N" (live shares on the card), release
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

int main(int argc, char **argv)
{
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *op = argv[i], *path = argv[i + 1];
        if (!strcmp(op, "card")) {
            egpu_card_region *r = egpu_card_region_open(path, "GPU-test");
            printf("card rc=%d errno=%d\n", r ? 0 : 1, r ? 0 : errno);
            if (r) egpu_card_region_close(r);
        } else if (!strcmp(op, "acct")) {
            egpu_acct a;
            char err[512];
            int rc = egpu_acct_open(&a, path, err, sizeof err);
            printf("acct rc=%d\n", rc ? 1 : 0);
            if (rc) fprintf(stderr, "%s\n", err);
        } else if (!strcmp(op, "claim") || !strcmp(op, "peer")) {
            egpu_card_region *r = egpu_card_region_open(path, "GPU-test");
            if (!r) { printf("%s rc=-1\n", op); continue; }
            int claim = !strcmp(op, "claim");
            int slot = egpu_card_claim(r, egpu_owner_id(claim ? "A" : "B"), (int32_t)getpid(), 0, 0, 50, 0, 1);
            if (claim) {
                printf("claim rc=%d slot=%d pid=%d\n", slot < 0, slot, (int)getpid());
                fflush(stdout);
                for (;;) pause();
            }
            int owners = 0;
            for (int k = 0; k < EGPU_CARD_SLOTS; k++) owners += r->slot[k].owner != 0;
            printf("peer rc=%d owners=%d\n", slot < 0, owners);
            egpu_card_release(r, slot, (int32_t)getpid());
        } else if (!strcmp(op, "hold") || !strcmp(op, "lock")) {
            egpu_card_region *r = egpu_card_region_open(path, "GPU-test");
            if (!r) { printf("%s rc=-1\n", op); continue; }
            if (!strcmp(op, "hold")) {
                pthread_mutex_lock(&r->mu);
                printf("hold rc=0\n");
                fflush(stdout);
                for (;;) pause();
            }
            long long t0 = now_ms();
            int e = egpu_card_lock(r);
            printf("lock rc=%d ms=%lld\n", e, now_ms() - t0);
            if (!e) egpu_card_unlock(r);
        }
        fflush(stdout);
    }
    return 0;
}
