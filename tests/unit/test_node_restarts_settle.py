"""bench/node_restarts.py's settle rule: once the node serves again, each worker must judge a
pod created after that before the run ends (the pods of the restarts alone may all be
refusals and prove nothing of the node after them)."""

from __future__ import annotations

from bench.node_restarts import OK, REFUSED, Outcome, created_since, workers_without

SERVED_AGAIN = 100.0  # time.monotonic() of the node serving again


def outcome(worker: int, created_at: float, kind: str = OK) -> Outcome:
    return Outcome(f"w{worker}-{created_at}", 1000, kind, created_at=created_at, worker=worker)


def test_a_worker_whose_pods_all_came_before_the_node_served_again_is_still_owed_one() -> None:
    """Bug caught: the run stopped as soon as the last round ended, with a worker whose only
    pods were the restarts' refusals."""
    outcomes = [outcome(0, 90.0, REFUSED), outcome(0, 101.0), outcome(1, 95.0, REFUSED)]
    assert workers_without(outcomes, SERVED_AGAIN, 2) == {1}


def test_a_worker_with_no_pod_at_all_is_owed_one() -> None:
    assert workers_without([outcome(0, 100.0)], SERVED_AGAIN, 3) == {1, 2}


def test_the_settled_pods_are_those_created_at_or_after_the_node_served_again() -> None:
    """Bug caught: a refusal of the restarts counted as a settled pod (it would fail the run
    for what the kubelet does to every device plugin), or a pod created at that very moment
    left out."""
    early, at, late = outcome(0, 99.9, REFUSED), outcome(1, 100.0), outcome(0, 130.0)
    assert created_since([early, at, late], SERVED_AGAIN) == [at, late]
