/* fakegpu: state shared by the fake libcuda and the fake libnvidia-ml. */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>
#include "egpu_cuda.h"

#define FG_MAX_CARDS 16
#define FG_MAX_PROCS 256
#define FG_MAX_LIMITS 64
#define FG_CGROUP_PATH 256
#define FG_MAGIC 0x46414b4547505533ULL /* "FAKEGPU3": a new layout reinitialises the state */
/* NVML's per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1) came with driver r615. */
#define FG_MEMORY_LIMITS_MIN_DRIVER 615
#define FG_EXPORT __attribute__((visibility("default")))

typedef struct {
    char uuid[64];
    char name[96];
    uint64_t total;
    int numa_node;
    int multicast; /* NVSwitch: multicast objects supported (config "multicast = 1") */
} fg_card_cfg;

typedef struct {
    char uuid[64];
    uint64_t total;
    uint64_t used;     /* card-wide, every process */
    uint64_t clock_ns; /* simulated timeline: when the card's queued work ends */
} fg_card_state;

typedef struct {
    int32_t pid;        /* as the process sees itself (its PID namespace's): for NVML's lists */
    int32_t live_lock;  /* 1: it holds byte <row> of <state dir>/live while it lives */
    uint64_t token;     /* the process's identity: pids repeat across PID namespaces */
    uint64_t used[FG_MAX_CARDS];
    char cgroup[FG_CGROUP_PATH]; /* its cgroup v2 path when it first charged ("0::" line) */
} fg_proc;

/* A memory limit of one cgroup on one card, as the driver's "misc" backend keeps them: flat,
 * a process counts toward the limit of its nearest limited ancestor (limits do not nest). */
typedef struct {
    char cgroup[FG_CGROUP_PATH]; /* path in the cgroup v2 hierarchy; "" = a free entry */
    uint32_t slot;               /* the card's index in the shared state */
    uint32_t pad;
    uint64_t soft, hard; /* bytes; hard UINT64_MAX = the card's capacity */
    uint64_t ino;        /* the directory's inode when set: a group made again is another */
} fg_limit;

typedef struct {
    uint64_t magic;
    pthread_mutex_t mu;
    uint32_t ncards;
    uint32_t pad;
    fg_card_state cards[FG_MAX_CARDS];
    fg_proc procs[FG_MAX_PROCS];
    fg_limit limits[FG_MAX_LIMITS];
} fg_shared;

typedef struct {
    int ncards;
    fg_card_cfg card[FG_MAX_CARDS];
    int slot[FG_MAX_CARDS]; /* card index in the shared state */
    fg_shared *sh;
    int proc_slot;
    pid_t pid;       /* the process these fields are of (a forked child makes its own) */
    uint64_t token;  /* its identity in the shared rows */
    int live_fd;     /* its own open of <state dir>/live (-1: none) */
    char state_dir[512];
    int driver_major; /* of driver_version */
    char driver_version[32];
} fg_world;

fg_world *fg_get(void); /* loads config + state once; never NULL */
int fg_charge(int card, uint64_t bytes);  /* 0 ok, -1 out of memory */
void fg_uncharge(int card, uint64_t bytes);
/* Gives back bytes charged to the process whose identity is token (on its row, if it is still
 * there: a dead process's row is reclaimed with everything on it). */
void fg_uncharge_owner(uint64_t token, int card, uint64_t bytes);
uint64_t fg_card_used(int card);
int fg_card_procs(int card, int32_t *pids, uint64_t *bytes, int max);
uint64_t fg_now_ns(void);
int fg_parse_uuid(const char *s, unsigned char out[16]);
/* Memory limits per cgroup (NVML's nvmlDevice{Set,Get}MemoryLimits_v1; fake_common.c). */
void fg_self_cgroup(char *out, size_t n);
int fg_limit_set(int card, const char *cgroup, const char *mount, uint64_t soft, uint64_t hard);
void fg_limit_get(int card, const char *cgroup, const char *mount, uint64_t *soft, uint64_t *hard, uint64_t *used);
int fg_my_limit(int card, uint64_t *hard, uint64_t *used);
#endif
