/* fastclock.h: CLOCK_MONOTONIC nanoseconds for the launch path, cheaper than clock_gettime.
 *
 * clock_gettime goes through the vDSO: ~20-25 ns (a serialising counter read, a seqlock and
 * a conversion). A gated launch reads the clock once; that read was the largest single cost
 * of the launch path. Where the CPU's counter is what the kernel's clock is built on -- an
 * invariant TSC used as the clocksource on x86-64, the architected counter on aarch64 -- the
 * counter is read directly (~8 ns) and scaled to CLOCK_MONOTONIC from a base point that the
 * poller refreshes every tick (egpu_fastclock_rebase), so the result stays within ~1 us of
 * clock_gettime and comparable with other processes' times in the card region. Elsewhere (or
 * before the first rebase) it is clock_gettime. */
#ifndef EGPU_FASTCLOCK_H
#define EGPU_FASTCLOCK_H

#include <stdint.h>

/* Decides whether the counter can be used (once; the poller's thread). */
void egpu_fastclock_init(void);
/* Re-bases the scale on clock_gettime (the poller, every tick). */
void egpu_fastclock_rebase(void);
/* CLOCK_MONOTONIC ns. */
uint64_t egpu_fastclock_ns(void);

#endif
