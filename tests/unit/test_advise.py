"""egpu.advise: the recommender on series of the shapes right-sizing meets (one sample per 15 s
scrape over a day): steady, spiky, growing, OOM-bound and cap-bound, and too little history.

Each test names the bug it would catch."""

from __future__ import annotations

import math

from egpu.advise import (
    VERDICT_KEEP,
    VERDICT_LOWER,
    VERDICT_NONE,
    VERDICT_RAISE,
    Booked,
    Policy,
    Usage,
    Workload,
    advise,
    counter_increase,
    owner_of,
    summarize,
)

STEP_S = 15.0  # the PodMonitor's interval
DAY = int(24 * 3600 / STEP_S) + 1  # samples in a day


def series(values: list[float]) -> list[tuple[float, float]]:
    return [(i * STEP_S, v) for i, v in enumerate(values)]


def test_a_steady_share_is_lowered_to_its_peak_plus_the_margin() -> None:
    """8000 MiB booked, 2900..3000 MiB used, 40% cores booked, 10..18% used (elastic, low):
    memory = round_up(3000 x 1.15, 256) = 3584, cores = round_up(p95 of use, 5). Bugs: the
    margin left out or applied to the mean, rounding down (a share below its peak)."""
    memory = series([2900 + (i % 101) for i in range(DAY)])
    compute = series([10 + (i % 9) for i in range(DAY)])
    usage = summarize(memory, compute=compute, cores=40)
    advice = advise(usage, Booked(8000, 40, "low", "elastic"))
    assert (advice.memory_mib, advice.cores, advice.verdict) == (3584, 20, VERDICT_LOWER)
    assert usage.peak_mib == 3000 and usage.compute_p95 == 18


def test_a_spike_between_scrapes_counts_through_the_regions_peak() -> None:
    """Samples never above 1000 MiB, but the region's high-water mark says 5000: the advice
    keeps room for 5000 (round_up(5750, 256) = 5888). Bug: advice from the scraped samples
    only (a share sized below a spike the scrape missed: OOM on the next spike)."""
    memory = series([1000.0] * DAY)
    usage = summarize(memory, peaks_mib=[5000.0, 4000.0])
    advice = advise(usage, Booked(8192, 0))
    assert (advice.memory_mib, advice.verdict) == (5888, VERDICT_LOWER)


def test_a_spiky_share_is_sized_for_its_spikes_not_its_p95() -> None:
    """Mostly 1000 MiB with 1% of samples at 6000: p95 says 1000, the advice keeps 6000 + 15%.
    Bug: memory sized from a percentile (the spikes OOM)."""
    memory = series([6000.0 if i % 100 == 0 else 1000.0 for i in range(DAY)])
    usage = summarize(memory)
    assert usage.p95_mib == 1000
    assert advise(usage, Booked(16384, 0)).memory_mib == round_up_check(6000 * 1.15, 256)


def round_up_check(value: float, step: int) -> int:
    return math.ceil(value / step) * step  # written out here, not the module's round_up


def test_a_growing_share_is_sized_for_where_it_got_not_where_it_started() -> None:
    """Use grows from 1000 to 7000 MiB over the day: sized for 7000 (+15% -> 8192, the
    booking: keep). Bug: the first or the mean sample used."""
    memory = series([1000 + 6000 * i / (DAY - 1) for i in range(DAY)])
    advice = advise(summarize(memory), Booked(8192, 0))
    assert (advice.memory_mib, advice.verdict) == (8192, VERDICT_KEEP)


def test_an_oom_bound_share_is_told_to_raise_never_to_lower() -> None:
    """Use sits at its 4096 MiB cap and 3 allocations were refused (a counter that grew
    0 -> 2, then a new container's 0 -> 1): raise to round_up(4096 x 1.5, 256) = 6144. Bugs:
    refusals ignored (the peak is the cap, so the margin would keep a share that fails),
    a counter reset read as a negative increase."""
    memory = series([4096.0] * DAY)
    refused = [[0, 0, 1, 2, 2], [0, 1, 1]]
    usage = summarize(memory, refused=refused)
    assert usage.refused == 3
    advice = advise(usage, Booked(4096, 0))
    assert (advice.memory_mib, advice.verdict) == (6144, VERDICT_RAISE)
    assert "3 allocations refused" in advice.why


def test_a_strict_share_bound_by_its_cap_is_told_to_raise_cores() -> None:
    """A strict 20% share at 19-20% for a third of the day: raise cores to round_up(30, 5).
    Bug: cores lowered to the p95 of a use the cap itself bounded."""
    memory = series([500.0] * DAY)
    compute = series([20.0 if i % 3 == 0 else 8.0 for i in range(DAY)])
    advice = advise(summarize(memory, compute=compute, cores=20), Booked(1024, 20))
    assert (advice.cores, advice.verdict) == (30, VERDICT_RAISE)


def test_an_elastic_share_at_its_booking_is_not_cap_bound() -> None:
    """The same use on an elastic share (it may run past its booking when the card is idle):
    no raise; cores from the p95 (20). Bug: elastic shares read as cap-bound."""
    memory = series([500.0] * DAY)
    compute = series([20.0 if i % 3 == 0 else 8.0 for i in range(DAY)])
    advice = advise(summarize(memory, compute=compute, cores=20),
                    Booked(1024, 20, "low", "elastic"))
    assert advice.verdict != VERDICT_RAISE and advice.cores == 20


def test_a_strict_online_share_keeps_its_p99_not_its_p95() -> None:
    """Online (high, strict) at 10% with 2% of samples at 33%: p95 10, p99 33: cores 35 (a
    cap at 10 would throttle those bursts: the latency the share is for). A low-priority
    share with the same use gets its p95 (10). Bug: one percentile for every share."""
    memory = series([500.0] * DAY)
    compute = series([33.0 if i % 50 == 0 else 10.0 for i in range(DAY)])
    usage = summarize(memory, compute=compute, cores=60)
    assert (usage.compute_p95, usage.compute_p99) == (10, 33)
    assert advise(usage, Booked(1024, 60, "high", "strict")).cores == 35
    assert advise(usage, Booked(1024, 60, "low", "strict")).cores == 10


def test_too_little_history_gives_no_advice_and_says_how_much_is_needed() -> None:
    """An hour of samples with the default policy (a day): no advice. Bug: advice from a
    short window (a nightly batch peak not seen yet)."""
    usage = summarize(series([100.0] * 240))
    advice = advise(usage, Booked(8192, 0))
    assert (advice.memory_mib, advice.cores, advice.verdict) == (None, None, VERDICT_NONE)
    assert "240 samples over 60m (needs 20 over 1.0d)" in advice.why
    short = Policy(min_history_s=1800)
    assert advise(usage, Booked(8192, 0), short).verdict == VERDICT_LOWER


def test_advice_never_raises_without_evidence() -> None:
    """A peak above the booking can only come from a region the agent misread: the advice
    keeps the booking. Bug: a raise advised from noise."""
    usage = Usage(samples=DAY, span_s=86400, peak_mib=9000, p95_mib=9000, p99_mib=9000,
                  compute_p95=None, compute_p99=None, refused=0, at_cap_fraction=0.0)
    assert advise(usage, Booked(8192, 0)).memory_mib == 8192


def test_counter_increase_counts_a_reset_from_zero() -> None:
    assert counter_increase([3, 5, 1, 4]) == 2 + 1 + 3


def test_pods_are_grouped_by_the_workload_that_owns_them() -> None:
    """Bugs: a Deployment's pods split per ReplicaSet (every roll a new workload), a bare pod
    given its namespace's name."""
    def pod(name: str, owner: dict | None, labels: dict | None = None) -> dict:
        meta = {"name": name, "namespace": "ml", "labels": labels or {}}
        if owner:
            meta["ownerReferences"] = [{**owner, "controller": True}]
        return {"metadata": meta}

    rs = {"kind": "ReplicaSet", "name": "serve-7d9f8c6b5"}
    assert owner_of(pod("serve-7d9f8c6b5-x", rs, {"pod-template-hash": "7d9f8c6b5"})) == \
        Workload("ml", "Deployment", "serve")
    assert owner_of(pod("db-0", {"kind": "StatefulSet", "name": "db"})) == \
        Workload("ml", "StatefulSet", "db")
    assert owner_of(pod("solo", None)) == Workload("ml", "Pod", "solo")
    assert owner_of(pod("lone-rs-abc", {"kind": "ReplicaSet", "name": "lone-rs"})) == \
        Workload("ml", "ReplicaSet", "lone-rs")


def test_history_of_deleted_pods_joins_the_workload_that_would_have_named_them() -> None:
    """A pod of an earlier ReplicaSet (deleted by a roll) still counts for its Deployment; a
    StatefulSet's ordinal and a Job's suffix too. Bugs: history lost at every roll (no
    advice for a week after each deploy), ``web`` taking ``web-api``'s pods."""
    from egpu.advise import workload_of_pod_name

    live = [Workload("ml", "Deployment", "web"), Workload("ml", "Deployment", "web-api"),
            Workload("ml", "StatefulSet", "db"), Workload("ml", "Job", "train"),
            Workload("ml", "Pod", "solo")]
    assert workload_of_pod_name("ml", "web-api-5c8d7f9b4-bcdfg", live) == live[1]
    assert workload_of_pod_name("ml", "web-6b7c9d8f5-zzzzz", live) == live[0]
    assert workload_of_pod_name("ml", "db-3", live) == live[2]
    assert workload_of_pod_name("ml", "train-x7k2p", live) == live[3]
    assert workload_of_pod_name("ml", "solo", live) == live[4]
    assert workload_of_pod_name("other", "solo", live) is None
    assert workload_of_pod_name("ml", "db-x", live) is None


def test_a_raise_stops_at_the_card_and_says_when_the_card_is_too_small() -> None:
    """Bugs (found by review): a whole-card share with refusals advised 36096 MiB on a 24000
    MiB card (its pods would fit nowhere); a raise at 100% cores that changes nothing still
    called a raise."""
    usage = summarize(series([24000.0] * DAY), refused=[[0, 2]],
                      compute=series([100.0] * DAY), cores=100)
    whole = advise(usage, Booked(24000, 100, card_mib=24000))
    assert (whole.memory_mib, whole.cores, whole.verdict) == (24000, 100, VERDICT_KEEP)
    assert "it needs a larger card" in whole.why
    part = advise(usage, Booked(20000, 100, card_mib=24000))
    assert (part.memory_mib, part.verdict) == (24000, VERDICT_RAISE)


def test_compute_samples_are_judged_against_the_cap_they_ran_under() -> None:
    """Older pods held at a 30% cap, the template now says 50%: their samples at 29% are at
    their cap (raise), not far under the new one. Bug (found by review): every sample judged
    against today's cap, so the advice set back the cap that was holding them."""
    compute = series([29.0] * DAY)
    caps = {t: 30.0 for t, _ in compute}
    usage = summarize(series([500.0] * DAY), compute=compute, cores=50, caps=caps)
    assert usage.at_cap_fraction == 1.0
    assert advise(usage, Booked(1024, 50)).verdict == VERDICT_RAISE
