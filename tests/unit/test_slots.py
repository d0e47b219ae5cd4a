"""The handler slots a worker over several databases shares between its dispatchers."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from django_pgqueue.worker.slots import SharedSlots


class Busy:
    """A dispatcher's running handlers, as its pool counts them."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        return self.n


def two(total: int, a: int = 1, b: int = 1):
    slots = SharedSlots(total, {"a": a, "b": b})
    busy_a, busy_b = Busy(), Busy()
    wake_a, wake_b = threading.Event(), threading.Event()
    return slots, slots.seat("a", busy_a, wake_a), slots.seat("b", busy_b, wake_b), busy_a, busy_b


def test_an_idle_database_leaves_every_slot_to_the_other() -> None:
    _, a, b, busy_a, _ = two(4)
    assert a.grant("qa", 4) == 4
    busy_a.n = 4  # handed to its handlers
    a.done()
    assert b.free() == 0
    assert a.free() == 0


def test_a_grant_holds_its_slots_until_the_rows_are_in() -> None:
    _, a, b, busy_a, _ = two(4)
    assert a.grant("qa", 3) == 3
    assert b.grant("qb", 4) == 1  # the 3 on their way are not free
    b.done()
    a.claimed("qa", 3, 1)  # the claim found one job: two slots come back
    busy_a.n = 1
    a.done()
    assert b.free() == 3


def test_a_database_that_wants_more_keeps_its_share() -> None:
    slots, a, b, busy_a, busy_b = two(4)
    busy_a.n = 4  # a took everything while b was idle
    assert b.grant("qb", 4) == 0  # b now has work and gets nothing yet
    b.done()
    busy_a.n = 2  # two of a's handlers returned
    assert a.free() == 0  # b's share (2) is kept for it while it wants more
    assert b.grant("qb", 4) == 2
    busy_b.n = 2
    b.done()
    b.claimed("qb", 2, 2)  # full: b has more
    busy_a.n = 0
    assert a.free() == 2  # its own share, no more while b wants more
    b.claimed("qb", 4, 1)  # b's queue ran dry
    slots.freed()  # a handler returned: b, refused before, is woken and asks again
    assert a.free() == 2  # b's 2 running handlers still count
    busy_b.n = 0
    assert a.free() == 4
    assert slots.total == 4


def test_shares_follow_the_weights() -> None:
    _, a, b, busy_a, busy_b = two(8, a=3, b=1)
    assert (a.share, b.share) == (6, 2)
    a.claimed("qa", 8, 8)
    b.claimed("qb", 8, 8)  # both want more than there is
    assert a.grant("qa", 8) == 6  # b's 2 kept
    busy_a.n = 6
    a.done()
    assert b.grant("qb", 8) == 2
    busy_b.n = 2
    b.done()
    assert a.free() == b.free() == 0


def test_a_refused_dispatcher_is_woken_when_a_handler_returns() -> None:
    slots, a, b, busy_a, _ = two(2)
    busy_a.n = 2
    assert b.grant("qb", 1) == 0
    b.done()
    assert not b.wake.is_set()
    busy_a.n = 1
    slots.freed()
    assert b.wake.is_set()
    assert not a.wake.is_set()


def test_a_database_out_of_reach_keeps_no_share() -> None:
    _, a, b, _, _ = two(4)
    b.claimed("qb", 2, 2)  # b wanted more, then its server went away
    assert a.free() == 2
    b.away()
    assert a.free() == 4


def test_slots_a_claim_left_unfilled_wake_the_dispatchers_refused_meanwhile() -> None:
    _, a, b, _, _ = two(4)
    assert a.grant("qa", 3) == 3
    assert b.grant("qb", 4) == 1  # short: a's 3 are on their way
    b.done()
    assert not b.wake.is_set()
    a.claimed("qa", 3, 0)  # a's queue was empty after all
    a.done()
    assert b.wake.is_set()
    assert b.free() == 4


def test_fewer_slots_than_databases_never_leave_both_waiting() -> None:
    slots, a, b, busy_a, _ = two(1)
    assert (a.share, b.share) == (0, 0)  # rounded down: the shares never exceed the slots
    assert a.grant("qa", 1) == 1
    assert b.grant("qb", 1) == 0
    b.done()
    a.claimed("qa", 1, 1)  # full: a wants more
    busy_a.n = 1
    a.done()
    busy_a.n = 0  # its handler returned
    slots.freed()
    assert b.wake.is_set()
    assert a.free() == 1
    assert b.free() == 1


@given(
    total=st.integers(1, 64),
    weights=st.lists(st.integers(1, 1000), min_size=2, max_size=5),
    wanting=st.lists(st.booleans(), min_size=5, max_size=5),
    ask=st.integers(0, 4),
)
def test_with_nothing_running_every_seat_gets_at_least_its_share(
    total: int, weights: list[int], wanting: list[bool], ask: int
) -> None:
    names = [f"db{i}" for i in range(len(weights))]
    slots = SharedSlots(total, dict(zip(names, weights, strict=True)))
    seats = [slots.seat(name, Busy(), threading.Event()) for name in names]
    assert sum(seat.share for seat in seats) <= total
    for seat, wants in zip(seats, wanting, strict=False):
        if wants:
            seat.claimed("q", 1, 1)
    me = seats[ask % len(seats)]
    assert me.free() >= max(me.share, 0)
    assert me.free() >= 1 or any(s.free() >= 1 for s in seats if s is not me)


def test_a_woken_dispatcher_keeps_its_share_until_it_asks_again() -> None:
    slots, a, b, busy_a, busy_b = two(2)
    busy_a.n = 2  # a took both slots while b was idle
    assert b.grant("qb", 1) == 0
    b.done()
    busy_a.n = 1
    slots.freed()
    assert b.wake.is_set()
    assert a.free() == 0  # the freed slot waits for b, however fast a asks
    assert b.grant("qb", 1) == 1
    b.claimed("qb", 1, 0)  # b's queue was empty after all: its share is let go
    b.done()
    assert a.free() == 1
    assert busy_b.n == 0


def test_a_refused_dispatcher_is_not_woken_while_nothing_is_free_for_it() -> None:
    slots, _, b, busy_a, _ = two(2)
    busy_a.n = 2
    assert b.grant("qb", 1) == 0
    b.done()
    slots.freed()  # a handler of a returned, but a started another meanwhile
    assert not b.wake.is_set()
