/* unit_account: CPU unit tests of the accounting (no CUDA) and the config parser. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "egpu_account.h"
#include "egpu_config.h"

static int fails, checks;
#define CHECK(cond) do { checks++; if (!(cond)) { fails++; fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)
#define MIB (1ull << 20)

static void test_account(const char *dir)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/containers/u_c/region", dir);
    egpu_acct a;
    CHECK(egpu_acct_open(&a, path, err, sizeof err) == 0);
    int c = egpu_acct_card(&a, "GPU-a", 100 * MIB);
    CHECK(c >= 0);
    CHECK(egpu_acct_card(&a, "GPU-a", 100 * MIB) == c);
    CHECK(egpu_acct_charge(&a, c, 60 * MIB, 100 * MIB) == 0);
    CHECK(egpu_acct_charge(&a, c, 50 * MIB, 100 * MIB) == -1);
    CHECK(egpu_acct_charge(&a, c, 40 * MIB, 100 * MIB) == 0);
    CHECK(egpu_acct_used(&a, c) == 100 * MIB);
    CHECK(egpu_acct_charge(&a, c, 1, 100 * MIB) == -1);
    CHECK(egpu_acct_charge(&a, c, UINT64_MAX, 100 * MIB) == -1); /* no wrap */
    egpu_acct_uncharge(&a, c, 200 * MIB); /* saturates at my usage */
    CHECK(egpu_acct_used(&a, c) == 0);
    egpu_acct_force(&a, c, UINT64_MAX);
    egpu_acct_force(&a, c, UINT64_MAX);
    CHECK(egpu_acct_used(&a, c) == UINT64_MAX); /* saturating */
    egpu_acct_uncharge(&a, c, UINT64_MAX);
    CHECK(egpu_acct_used(&a, c) == 0);

    /* A child that is SIGKILLed with usage: reclaimed by the next reap. */
    pid_t pid = fork();
    if (pid == 0) {
        egpu_acct_forget(&a);
        egpu_acct_charge(&a, c, 30 * MIB, 100 * MIB);
        raise(SIGKILL);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    CHECK(egpu_acct_used(&a, c) == 30 * MIB);
    CHECK(egpu_acct_reap(&a) == 1);
    CHECK(egpu_acct_used(&a, c) == 0);

    /* A child killed while holding the lock: the next locker repairs (EOWNERDEAD). */
    pid = fork();
    if (pid == 0) {
        egpu_acct_forget(&a);
        egpu_acct_charge(&a, c, 10 * MIB, 100 * MIB);
        pthread_mutex_lock(&a.r->lock.mutex);
        a.r->cards[c].used_bytes = 999; /* half-done update */
        raise(SIGKILL);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    uint64_t repairs = a.r->repairs;
    CHECK(egpu_acct_charge(&a, c, 95 * MIB, 100 * MIB) == 0); /* dead child's 10 MiB reclaimed on the way */
    CHECK(a.r->repairs == repairs + 1);
    CHECK(egpu_acct_used(&a, c) == 95 * MIB);
    egpu_acct_detach(&a);
    CHECK(egpu_acct_used(&a, c) == 0);

    /* A second opener sees the same region; a bad region is refused. */
    egpu_acct b;
    CHECK(egpu_acct_open(&b, path, err, sizeof err) == 0);
    CHECK(egpu_acct_card(&b, "GPU-a", 1) == c);
    snprintf(path, sizeof path, "%s/bad-region", dir);
    FILE *f = fopen(path, "w");
    fputs("garbage", f);
    fclose(f);
    CHECK(egpu_acct_open(&b, path, err, sizeof err) == -1);
}

/* Shared charges (NCCL, issue 25): an exported allocation is charged once, in a shared slot
 * that lives while any holder does (OFD read locks), whoever lets go first or dies. */
static void test_shared(const char *dir)
{
    char path[512], err[256];
    snprintf(path, sizeof path, "%s/shared-region", dir);
    egpu_acct a;
    CHECK(egpu_acct_open(&a, path, err, sizeof err) == 0);
    int c = egpu_acct_card(&a, "GPU-s", 100 * MIB);
    int exported = memfd_create("export", MFD_CLOEXEC), unrelated = memfd_create("other", MFD_CLOEXEC);
    for (int round = 0; round < 2; round++) {
        CHECK(egpu_acct_charge(&a, c, 64 * MIB, 100 * MIB) == 0); /* the exporter's cuMemCreate */
        int q = egpu_acct_share_out(&a, c, 64 * MIB, dup(exported));
        CHECK(q >= 0 && q != a.proc);
        CHECK(egpu_acct_used(&a, c) == 64 * MIB && egpu_acct_my_used(&a, c) == 0); /* moved, once */
        int go[2], ready[2];
        if (pipe(go) || pipe(ready)) return;
        pid_t pid = fork();
        if (pid == 0) { /* a peer process of the container holds it, then waits or dies */
            egpu_acct_forget(&a);
            char ch = egpu_acct_share_find(&a, unrelated) == -1 && egpu_acct_share_find(&a, exported) == q ? 'y' : 'n';
            if (write(ready[1], &ch, 1) != 1) _exit(1);
            if (round == 0) raise(SIGKILL);
            if (read(go[0], &ch, 1) != 1) _exit(1);
            _exit(egpu_acct_share_drop(&a, q) == -1 ? 0 : 1); /* a peer's drop returns no fd */
        }
        char ch = 0;
        CHECK(read(ready[0], &ch, 1) == 1 && ch == 'y');
        CHECK(egpu_acct_used(&a, c) == 64 * MIB); /* the peer's import cost nothing */
        if (round == 0) { /* the peer was killed holding it: the exporter's release frees it */
            waitpid(pid, NULL, 0);
            int fd = egpu_acct_share_drop(&a, q);
            CHECK(fd >= 0);
            close(fd);
            CHECK(egpu_acct_used(&a, c) == 0);
        } else { /* the exporter lets go first: still charged while the peer holds it */
            int fd = egpu_acct_share_drop(&a, q);
            CHECK(fd >= 0);
            close(fd);
            CHECK(egpu_acct_used(&a, c) == 64 * MIB);
            CHECK(egpu_acct_reap(&a) == 0); /* alive: the peer's read lock */
            CHECK(egpu_acct_share_find(&a, exported) == -1); /* the exporter's fd is gone */
            CHECK(write(go[1], "g", 1) == 1);
            int status = -1;
            waitpid(pid, &status, 0);
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
            CHECK(egpu_acct_used(&a, c) == 0); /* the last holder gave it back */
        }
        close(go[0]); close(go[1]); close(ready[0]); close(ready[1]);
    }
    close(exported);
    close(unrelated);
    egpu_acct_detach(&a);
}

static int parse(const char *doc, egpu_config *c)
{
    char err[256];
    int r = egpu_config_parse_json(doc, strlen(doc), c, err, sizeof err);
    if (r) fprintf(stderr, "  (refused: %s)\n", err);
    return r;
}

static void test_config(void)
{
    egpu_config c;
    const char *good =
        "{\"version\":1,\"namespace\":\"ns\",\"pod\":\"p\",\"pod_uid\":\"uid\",\"container\":\"c\",\"priority\":\"low\","
        "\"compute_policy\":\"elastic\",\"memory_oversubscription\":true,\"container_region\":\"/r/region\","
        "\"cards\":[{\"uuid\":\"GPU-1\",\"memory_mib\":4096,\"cores\":50,\"card_region\":\"/var/run/egpu/cards/GPU-1\"}]}";
    CHECK(parse(good, &c) == 0);
    CHECK(c.ncards == 1 && c.cards[0].memory_bytes == 4096 * MIB && c.cards[0].cores == 50);
    CHECK(c.priority == EGPU_PRIORITY_LOW && c.compute_policy == EGPU_POLICY_ELASTIC && c.oversubscription == 1);
    CHECK(!strcmp(c.container_region, "/r/region") && !strcmp(c.pod_uid, "uid"));
    CHECK(egpu_config_limit(&c, "GPU-1", 1ull << 40) == 4096 * MIB);
    CHECK(egpu_config_limit(&c, "GPU-2", 1ull << 40) == 0);
    CHECK(c.low_priority_floor == -1); /* absent: the file does not say */
    CHECK(parse("{\"version\":1,\"container_region\":\"/r\",\"low_priority_floor\":15,"
                "\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}]}", &c) == 0 && c.low_priority_floor == 15);
    /* a raw container's share: a percentage of the card, whole MiB as booked */
    CHECK(parse("{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_percentage\":25}]}", &c) == 0);
    CHECK(egpu_config_limit(&c, "G", 24577 * MIB) == 6144 * MIB && egpu_config_limit(&c, "H", 24576 * MIB) == 0);
    /* whitespace, order, unknown keys, escapes */
    CHECK(parse(" \n{ \"cards\" : [ { \"memory_mib\" : 1 , \"uuid\" : \"GPU-\\u0041\", \"x\": {\"y\": [1, 2.5e3, null]} } ] ,"
                "\t\"container_region\":\"/a\\/b\", \"future\": false, \"version\" : 1 }\n", &c) == 0);
    CHECK(!strcmp(c.cards[0].uuid, "GPU-A") && !strcmp(c.container_region, "/a/b") && c.priority == EGPU_PRIORITY_HIGH);
    /* refused */
    const char *bad[] = {
        "", "{", "[]", "{\"version\":1}", "{\"version\":2,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":0}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_percentage\":0}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_percentage\":101}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_percentage\":5,\"memory_mib\":1}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1.5}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":\"1\"}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1,\"cores\":101}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}],\"priority\":\"mid\"}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}]} x",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1},{\"uuid\":\"G\",\"memory_mib\":1}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":01}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1,}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}],\"memory_oversubscription\":\"yes\"}",
        "{\"version\":1,\"container_region\":\"\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\\q\",\"memory_mib\":1}]}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}],\"low_priority_floor\":101}",
        "{\"version\":1,\"container_region\":\"/r\",\"cards\":[{\"uuid\":\"G\",\"memory_mib\":1}],\"low_priority_floor\":true}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int r = parse(bad[i], &c);
        CHECK(r == -1);
        if (r != -1) fprintf(stderr, "  accepted bad doc #%zu: %s\n", i, bad[i]);
    }
    /* deep nesting is refused, not a stack overflow */
    char deep[200];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    CHECK(parse(deep, &c) == -1);
}

int main(int argc, char **argv)
{
    char dir[] = "/tmp/egpu-unit-XXXXXX";
    if (!mkdtemp(dir)) return 2;
    (void)argc; (void)argv;
    test_account(dir);
    test_shared(dir);
    test_config();
    printf("%d checks, %d failures\n", checks, fails);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
    return fails ? 1 : 0;
}
