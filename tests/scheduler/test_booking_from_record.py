"""The extender's book of a bound pod comes from the record its Binding wrote: the container
kinds decided at placement, not the pod spec read again (an older extender's record, without
kinds, falls back to the spec)."""

from __future__ import annotations

from egpu.booking import CardBooking
from egpu.config import Config
from egpu.records import Allocation, CardShare, ContainerAllocation
from scheduler.state import booking_from_pod

from .helpers import limits, pod

CARD = "GPU-0"


def _record(kinds: tuple[str | None, str | None]) -> Allocation:
    warm, app = kinds
    policies = ("high", "strict", False) if None not in kinds else (None, None, None)
    return Allocation(
        (ContainerAllocation("init0", True, (CardShare(CARD, 0, 6000, 50),), kind=warm),
         ContainerAllocation("c0", False, (CardShare(CARD, 0, 4000, 30),), kind=app)),
        "n1", *policies)


def _pod_with(record: Allocation) -> dict:
    return pod(containers=[limits(memory=4000, cores=30)],
               inits=[limits(memory=6000, cores=50)], node="n1", allocation=record.encode())


def test_a_complete_record_books_by_the_kinds_it_carries() -> None:
    booking = booking_from_pod(_pod_with(_record(("init", "container"))), Config())
    assert booking is not None
    assert booking.cards[CARD] == CardBooking(6000, 50, 1)  # the init container's peak


def test_the_records_kinds_win_over_the_spec() -> None:
    # the same spec (init0 is an init container), a record that says it runs beside c0
    booking = booking_from_pod(_pod_with(_record(("sidecar", "container"))), Config())
    assert booking is not None
    assert booking.cards[CARD] == CardBooking(10000, 80, 2)


def test_an_older_extenders_record_books_by_the_spec() -> None:
    booking = booking_from_pod(_pod_with(_record((None, None))), Config())
    assert booking is not None
    assert booking.cards[CARD] == CardBooking(6000, 50, 1)
