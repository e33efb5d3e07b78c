/* fastclock.h: CLOCK_MONOTONIC nanoseconds for the launch path, cheaper than clock_gettime.
 *
 * clock_gettime goes through the vDSO: ~20-25 ns (a serialising counter read, a seqlock and
 * a conversion). A gated launch reads the clock once; that read was the largest single cost
 * of the launch path. Where the CPU's counter is what the kernel's clock is built on -- an
 * invariant TSC used as the clocksource on x86-64, the architected counter on aarch64 -- the
 * counter is read directly (~8 ns) and scaled to CLOCK_MONOTONIC from a base point that the
 * poller refreshes every tick (egpu_fastclock_rebase), so the result stays within ~1 us of
 * clock_gettime and comparable with other processes' times in the card region. Elsewhere (or
 * before the first rebase) it is clock_gettime.
 *
 * This file and fastclock.c are the interposer's one clock: every time the launch gate, the
 * controller and the card files read, and every sleep of the gate, goes through them. The
 * simulated-clock tests (tests/compute_sim.c) link their own definitions of these functions
 * instead of fastclock.c, so that the shipped gate runs on simulated time (a link-time seam:
 * nothing on the launch path pays for it). */
#ifndef EGPU_FASTCLOCK_H
#define EGPU_FASTCLOCK_H

#include <stdint.h>

/* Decides whether the counter can be used (once; the poller's thread). */
void egpu_fastclock_init(void);
/* Re-bases the scale on clock_gettime (the poller, every tick). */
void egpu_fastclock_rebase(void);
/* CLOCK_MONOTONIC ns. */
uint64_t egpu_fastclock_ns(void);
/* CLOCK_MONOTONIC ns by clock_gettime (~20 ns): where a read is not on the launch path. */
uint64_t egpu_now_ns(void);
/* Sleeps ns nanoseconds (again after a signal): the gate's only way to wait. */
void egpu_sleep_ns(uint64_t ns);
/* Sleeps up to ns nanoseconds while *word is 1, or until egpu_nap_wake(word) (a futex: an
 * idle poller's long sleep that a launch can cut short). Returns early if *word is not 1. */
void egpu_nap_ns(uint32_t *word, uint64_t ns);
/* Wakes the thread napping on word (none: nothing happens). */
void egpu_nap_wake(uint32_t *word);

#endif
