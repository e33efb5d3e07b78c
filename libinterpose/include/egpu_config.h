/* egpu_config.h: the interposer's configuration. Names mirror egpu/contract.py. */
#ifndef EGPU_CONFIG_H
#define EGPU_CONFIG_H
#include <stddef.h>
#include <stdint.h>
#include "egpu_region.h"

#define EGPU_CONTAINER_CONFIG_PATH "/run/egpu/config.json" /* CONTAINER_CONFIG_PATH */
#define EGPU_RUNTIME_DIR_DEFAULT "/var/run/egpu"            /* RUNTIME_DIR */
#define EGPU_CONTAINERS_SUBDIR "containers"                 /* CONTAINERS_SUBDIR */
#define EGPU_CARDS_SUBDIR "cards"                           /* CARDS_SUBDIR */
#define EGPU_CONTAINER_REGION_FILE "region"                 /* CONTAINER_REGION_FILE */
#define ENV_CONFIG_PATH "EGPU_CONFIG_PATH"                  /* only where /run/egpu/config.json does not exist */
#define ENV_MEMORY_LIMIT_MIB "EGPU_MEMORY_LIMIT_MIB"
#define ENV_MEMORY_PERCENTAGE "EGPU_MEMORY_PERCENTAGE"
#define ENV_CORES "EGPU_CORES"
#define ENV_PRIORITY "EGPU_PRIORITY"
#define ENV_COMPUTE_POLICY "EGPU_COMPUTE_POLICY"
#define ENV_MEMORY_OVERSUBSCRIPTION "EGPU_MEMORY_OVERSUBSCRIPTION"
#define ENV_CONTAINER_REGION "EGPU_CONTAINER_REGION"
#define ENV_RUNTIME_DIR "EGPU_RUNTIME_DIR"
#define ENV_CONTEXT_OVERHEAD_MIB "EGPU_CONTEXT_OVERHEAD_MIB" /* interposer-only tunable */
#define EGPU_CONFIG_VERSION 1
#define EGPU_CONTEXT_OVERHEAD_MIB_DEFAULT 256

enum { EGPU_PRIORITY_HIGH = 0, EGPU_PRIORITY_LOW = 1 };
enum { EGPU_POLICY_STRICT = 0, EGPU_POLICY_ELASTIC = 1 };
enum { EGPU_SRC_FILE = 1, EGPU_SRC_ENV = 2 };

typedef struct {
    char uuid[EGPU_UUID_LEN];
    uint64_t memory_bytes; /* 0: memory_percent of the card instead */
    int memory_percent;    /* 1..100 (a raw container's EGPU_MEMORY_PERCENTAGE), 0: memory_bytes */
    int cores; /* 0 = no compute booked */
    char card_region[256];
} egpu_card_cfg;

typedef struct {
    int source;
    /* 1 when the config is the node's /run/egpu/config.json: then no EGPU_* variable of the
     * container (context overhead, compute tunables, floor) may change the share. */
    int node_file;
    char ns[128], pod[256], pod_uid[128], container[128];
    int priority;
    int compute_policy;
    int oversubscription;
    int low_priority_floor; /* %: a low-priority share's floor beside busy high-priority work;
                             * -1: the file does not say (env only: 0) */
    char container_region[512];
    int ncards;
    egpu_card_cfg cards[EGPU_REGION_MAX_CARDS];
    /* EGPU_SRC_ENV: the same share on every visible card */
    uint64_t env_limit_bytes; /* 0 = use env_percent */
    int env_percent;
    int env_cores;
    uint64_t context_overhead;
} egpu_config;

/* Parse a v1 config document. 0 ok; -1 with the reason in err. */
int egpu_config_parse_json(const char *text, size_t len, egpu_config *c, char *err, size_t errlen);
/* /run/egpu/config.json whenever it exists (EGPU_CONFIG_PATH is honoured only where it does
 * not), else the EGPU_CONFIG_PATH file if it exists, else EGPU_* env.
 * 0 ok; -1 refuse (reason in err): never unlimited by accident. */
int egpu_config_load(egpu_config *c, char *err, size_t errlen);
/* The share's cap on a card of physical size `total`, or 0 when the card is not ours. */
uint64_t egpu_config_limit(const egpu_config *c, const char *uuid, uint64_t total);
#endif
