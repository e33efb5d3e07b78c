/* compute_layout.c: prints the layouts of the card's files (name offset size, one per line):
 * the roster and a share file's slot, so that the tests check the Python codecs
 * (egpu/card_roster.py, tests/compute/cardregion.py) against the compiler's. */
#include <stddef.h>
#include <stdio.h>
#include "card_region.h"

#define R(f) printf("roster.%s %zu %zu\n", #f, offsetof(egpu_card_roster, f), sizeof(((egpu_card_roster *)0)->f));
#define E(f) printf("entry.%s %zu %zu\n", #f, offsetof(egpu_roster_entry, f), sizeof(((egpu_roster_entry *)0)->f));
#define S(f) printf("slot.%s %zu %zu\n", #f, offsetof(egpu_card_slot, f), sizeof(((egpu_card_slot *)0)->f));

int main(void)
{
    printf("roster.size 0 %zu\nentry.size 0 %zu\nslot.size 0 %zu\nslot.public 0 %d\n", sizeof(egpu_card_roster),
           sizeof(egpu_roster_entry), sizeof(egpu_card_slot), EGPU_SLOT_PUBLIC_BYTES);
    printf("roster.magic_value 0 %llu\nroster.version_value 0 %u\nshare.magic_value 0 %llu\nshare.version_value 0 %u\n",
           (unsigned long long)EGPU_ROSTER_MAGIC, EGPU_ROSTER_VERSION, (unsigned long long)EGPU_SHARE_MAGIC,
           EGPU_SHARE_VERSION);
    R(magic) R(version) R(nslots) R(entry_size) R(header_size) R(generation) R(uuid) R(entry)
    E(owner) E(priority) E(policy) E(cores) E(floor_pct) E(flags) E(name)
    S(owner) S(pids) S(priority) S(policy) S(cores) S(flags) S(floor_pct) S(rate_ppm) S(level_ns)
    S(refill_ns) S(floor_level_ns) S(pi_integral_ppm) S(est_ns) S(inflight_ns) S(win_start_ns)
    S(win_busy_ns) S(last_win_busy_ns) S(last_win_len_ns) S(busy_total_ns) S(launches_total)
    S(wait_total_ns) S(last_active_ns) S(busy_until_ns) S(use_ppm) S(demand_ppm) S(tick_start_ns)
    S(tick_busy_ns) S(tick_wait_ns) S(inflight_n) S(inflight_since_ns) S(est_graph_ns) S(solo_ns)
    S(overlapped_total) S(last_complete_ns) S(reserved) S(events_total) S(queued_until_ns) S(solo_n)
    S(hi_mark_ns) S(mu) S(share_magic) S(share_version)
    return 0;
}
