/* fastclock.c: CLOCK_MONOTONIC from the CPU's counter (fastclock.h). */
#define _GNU_SOURCE
#include "fastclock.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A base older than this is not trusted (the poller stopped): clock_gettime instead. */
#define FASTCLOCK_STALE_NS 1000000000ULL
/* The scale is measured over at least this long before the counter is used (the jitter of
 * one clock_gettime, ~50 ns, is then 10 ppm of it) ... */
#define FASTCLOCK_CALIBRATE_NS 5000000ULL
/* ... and over at most about this long, so that it follows the kernel's (NTP) adjustments. */
#define FASTCLOCK_WINDOW_NS 10000000000ULL

uint64_t egpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void egpu_sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

void egpu_nap_ns(uint32_t *word, uint64_t ns)
{
    /* one wait: a signal or a spurious wake-up ends the nap early, which costs one more pass */
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, 1, &ts, NULL, 0);
}

void egpu_nap_wake(uint32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#if defined(__x86_64__)
static inline uint64_t counter(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
}
#elif defined(__aarch64__)
static inline uint64_t counter(void)
{
    uint64_t v;
    __asm__ __volatile__("mrs %0, cntvct_el0" : "=r"(v));
    return v;
}
#else
static inline uint64_t counter(void) { return 0; }
#endif

/* The base: ns = ns0 + (counter - c0) * mult / 2^32. Written by one thread (the poller) under
 * a sequence number (odd while it writes), read by any. */
static struct {
    uint64_t seq;
    uint64_t c0, ns0, mult;
    uint64_t first_c, first_ns; /* the calibration's start: the scale is measured from here */
    int usable;
} g_fc;

/* A (counter, CLOCK_MONOTONIC) pair: the tightest of a few brackets of clock_gettime by two
 * counter reads (a cold or interrupted one can take microseconds). */
static void pair(uint64_t *c, uint64_t *ns)
{
    uint64_t best = UINT64_MAX;
    *c = *ns = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t a = counter(), t = egpu_now_ns(), b = counter();
        if (b - a < best) {
            best = b - a;
            *c = a + (b - a) / 2;
            *ns = t;
        }
    }
}

static int file_has(const char *path, const char *word)
{
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, word) != NULL;
    fclose(f);
    return found;
}

void egpu_fastclock_init(void)
{
#if defined(__x86_64__)
    /* the TSC ticks at one rate in every state and the kernel's own clock is built on it */
    g_fc.usable = file_has("/proc/cpuinfo", " constant_tsc") && file_has("/proc/cpuinfo", " nonstop_tsc") &&
                  file_has("/sys/devices/system/clocksource/clocksource0/current_clocksource", "tsc");
#elif defined(__aarch64__)
    g_fc.usable = 1; /* the architected counter runs at a fixed frequency */
#else
    g_fc.usable = 0;
#endif
    pair(&g_fc.first_c, &g_fc.first_ns);
}

void egpu_fastclock_rebase(void)
{
    if (!g_fc.usable) return;
    uint64_t c = 0, ns = 0;
    pair(&c, &ns);
    if (ns - g_fc.first_ns < FASTCLOCK_CALIBRATE_NS || c <= g_fc.first_c) return; /* keep the last scale */
    uint64_t mult = (uint64_t)(((unsigned __int128)(ns - g_fc.first_ns) << 32) / (c - g_fc.first_c));
    __atomic_store_n(&g_fc.seq, g_fc.seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&g_fc.c0, c, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fc.ns0, ns, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fc.mult, mult, __ATOMIC_RELAXED);
    __atomic_store_n(&g_fc.seq, g_fc.seq + 1, __ATOMIC_RELEASE);
    if (ns - g_fc.first_ns > FASTCLOCK_WINDOW_NS) {
        g_fc.first_c = c; /* the next scale is measured from here (this one serves meanwhile) */
        g_fc.first_ns = ns;
    }
}

uint64_t egpu_fastclock_ns(void)
{
    uint64_t s = __atomic_load_n(&g_fc.seq, __ATOMIC_ACQUIRE);
    if (s & 1 || !s) return egpu_now_ns(); /* being written, or never based */
    uint64_t c0 = __atomic_load_n(&g_fc.c0, __ATOMIC_RELAXED), ns0 = __atomic_load_n(&g_fc.ns0, __ATOMIC_RELAXED);
    uint64_t mult = __atomic_load_n(&g_fc.mult, __ATOMIC_RELAXED);
    uint64_t c = counter();
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&g_fc.seq, __ATOMIC_RELAXED) != s || c < c0) return egpu_now_ns();
    uint64_t d = (uint64_t)(((unsigned __int128)(c - c0) * mult) >> 32);
    return d < FASTCLOCK_STALE_NS ? ns0 + d : egpu_now_ns();
}
