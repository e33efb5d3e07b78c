/* egpu_account.h: per-container memory accounting over the shared region. No CUDA here. */
#ifndef EGPU_ACCOUNT_H
#define EGPU_ACCOUNT_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "egpu_region.h"

/* a + b, held at UINT64_MAX: byte counts never wrap. */
static inline uint64_t sat_add(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

typedef struct {
    egpu_region *r;
    int proc;     /* my slot in r->procs, -1 until the first charge */
    pid_t pid;
    int fd;       /* the region file, kept open: holds my slot's liveness lock; -1 none */
    uint32_t *holds; /* per procs[] slot: how many of my handles hold that shared slot
                      * (EGPU_PROC_F_SHARED); NULL until the first */
} egpu_acct;

/* Open (creating if needed) the region file. 0 ok; -1 with a reason in err. */
int egpu_acct_open(egpu_acct *a, const char *path, char *err, size_t errlen);
/* Region card slot of a UUID (created on first use), or -1 when the region is full. */
int egpu_acct_card(egpu_acct *a, const char *uuid, uint64_t limit);
/* Charge bytes if the card's container usage stays <= limit: 0 ok, -1 over the cap. */
int egpu_acct_charge(egpu_acct *a, int card, uint64_t bytes, uint64_t limit);
/* Count one allocation refused because the share was full (egpu_region_card.refused). */
void egpu_acct_refused(egpu_acct *a, int card);
/* Give bytes back (saturating at zero). */
void egpu_acct_uncharge(egpu_acct *a, int card, uint64_t bytes);
/* Add bytes that are already held (no cap check; saturating). */
void egpu_acct_force(egpu_acct *a, int card, uint64_t bytes);
uint64_t egpu_acct_used(egpu_acct *a, int card);
uint64_t egpu_acct_my_used(egpu_acct *a, int card);
/* The pids (as their processes see them) of the container's processes that hold a slot, at
 * most max of them; shared slots (EGPU_PROC_F_SHARED) are no processes and are left out. */
int egpu_acct_pids(egpu_acct *a, int32_t *pids, int max);
/* Shared charges (NCCL's exported allocations; egpu_region.h, EGPU_PROC_F_SHARED).
 * share_out: move `bytes` of my usage on `card` into a new shared slot, held by me, for the
 *   allocation exported as the fd `dupfd` (my private duplicate). The slot, or -1 (region
 *   full, no liveness lock: the bytes stay mine).
 * share_find: the shared slot whose exported fd is the same open file as `fd` (kcmp), now held
 *   once more by me; -1 when none is (exported by another container, or its exporter let go).
 * share_drop: one of my holds of `slot` ends; the slot is freed (its bytes given back) when no
 *   process holds it any more. Returns the exporter's duplicate fd for the exporter to close
 *   (its hold ended), else -1. */
int egpu_acct_share_out(egpu_acct *a, int card, uint64_t bytes, int dupfd);
int egpu_acct_share_find(egpu_acct *a, int fd);
int egpu_acct_share_drop(egpu_acct *a, int slot);
/* Reclaim the usage of dead processes. Returns how many were reclaimed. */
int egpu_acct_reap(egpu_acct *a);
/* This process is going away: drop its slot and usage. */
void egpu_acct_detach(egpu_acct *a);
/* After fork: the child starts with no slot (and its own open file description for its
 * liveness lock). */
void egpu_acct_forget(egpu_acct *a);
#endif
