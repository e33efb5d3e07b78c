/* compute_layout.c: prints the card region layout (name offset size, one per line) so that
 * tests/compute checks docs/compute.md's Python description against the compiler's. */
#include <stddef.h>
#include <stdio.h>
#include "card_region.h"

#define H(f) printf("header.%s %zu %zu\n", #f, offsetof(egpu_card_region, f), sizeof(((egpu_card_region *)0)->f));
#define S(f) printf("slot.%s %zu %zu\n", #f, offsetof(egpu_card_slot, f), sizeof(((egpu_card_slot *)0)->f));

int main(void)
{
    printf("region.size %zu %zu\nslot.size 0 %zu\n", sizeof(egpu_card_region), sizeof(egpu_card_region), sizeof(egpu_card_slot));
    printf("magic 0 %llu\nversion 0 %u\n", (unsigned long long)EGPU_CARD_MAGIC, EGPU_CARD_VERSION);
    H(magic) H(version) H(size) H(nslots) H(slot_size) H(uuid) H(created_ns) H(mu) H(hi_active_ns)
    H(hi_launches) H(n_low) H(n_high) H(generation) H(slot)
    S(owner) S(pids) S(priority) S(policy) S(cores) S(flags) S(floor_pct) S(rate_ppm) S(level_ns)
    S(refill_ns) S(floor_level_ns) S(pi_integral_ppm) S(est_ns) S(inflight_ns) S(win_start_ns)
    S(win_busy_ns) S(last_win_busy_ns) S(last_win_len_ns) S(busy_total_ns) S(launches_total)
    S(wait_total_ns) S(last_active_ns) S(busy_until_ns) S(use_ppm) S(demand_ppm) S(tick_start_ns)
    S(tick_busy_ns) S(tick_wait_ns) S(inflight_n) S(inflight_since_ns) S(est_graph_ns) S(solo_ns)
    S(overlapped_total) S(last_complete_ns) S(reserved) S(events_total) S(queued_until_ns) S(solo_n) S(reserved2)
    return 0;
}
