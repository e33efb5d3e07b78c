/* fakegpu: state shared by the fake libcuda and the fake libnvidia-ml. */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "egpu_cuda.h"

#define FG_MAX_CARDS 16
#define FG_MAX_PROCS 256
#define FG_MAGIC 0x46414b4547505531ULL /* "FAKEGPU1" */
#define FG_EXPORT __attribute__((visibility("default")))

typedef struct {
    char uuid[64];
    char name[96];
    uint64_t total;
    int numa_node;
} fg_card_cfg;

typedef struct {
    char uuid[64];
    uint64_t total;
    uint64_t used;     /* card-wide, every process */
    uint64_t clock_ns; /* simulated timeline: when the card's queued work ends */
} fg_card_state;

typedef struct {
    int32_t pid;
    int32_t pad;
    uint64_t used[FG_MAX_CARDS];
} fg_proc;

typedef struct {
    uint64_t magic;
    pthread_mutex_t mu;
    uint32_t ncards;
    uint32_t pad;
    fg_card_state cards[FG_MAX_CARDS];
    fg_proc procs[FG_MAX_PROCS];
} fg_shared;

typedef struct {
    int ncards;
    fg_card_cfg card[FG_MAX_CARDS];
    int slot[FG_MAX_CARDS]; /* card index in the shared state */
    fg_shared *sh;
    int proc_slot;
    pid_t pid;
    char state_dir[512];
} fg_world;

fg_world *fg_get(void); /* loads config + state once; never NULL */
int fg_charge(int card, uint64_t bytes);  /* 0 ok, -1 out of memory */
void fg_uncharge(int card, uint64_t bytes);
void fg_reap(void);
uint64_t fg_card_used(int card);
int fg_card_procs(int card, int32_t *pids, uint64_t *bytes, int max);
uint64_t fg_now_ns(void);
int fg_parse_uuid(const char *s, unsigned char out[16]);
#endif
