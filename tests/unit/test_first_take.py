"""The dispatcher's wait until an idle pool's woken handler thread took its job."""

from __future__ import annotations

import threading

import pytest

from django_pgqueue.worker import pool
from django_pgqueue.worker.pool import FirstTake


def test_a_take_ends_the_wait() -> None:
    lock = threading.Lock()
    first = FirstTake(lock)
    first.asked = True
    taker = threading.Thread(target=first.taken)
    taker.start()
    first.wait()  # returns once taken (or after TAKE_WAIT at worst)
    taker.join(10)
    assert not first.asked
    first.taken()  # nobody asked: nothing is released twice
    first.asked = True
    first.taken()
    first.wait()
    assert not first.asked


def test_a_wait_that_ends_untaken_leaves_nothing_to_release(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool, "TAKE_WAIT", 0.0)
    first = FirstTake(threading.Lock())
    first.asked = True
    first.wait()  # nobody took a job
    assert not first.asked
    first.taken()  # a take after the wait's end releases nothing
    first.asked = True
    first.taken()
    first.wait()  # the next wait still ends at its take


def test_a_take_between_the_timeout_and_the_look_is_taken_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The thread takes its job just after the wait timed out, before the wait looks
    # under the pool's lock: its release is taken back, so the next one cannot fail.
    first = FirstTake(threading.Lock())
    real = first._taken

    class Late:
        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if timeout >= 0:  # the timed wait: ends untaken, then the take comes
                first._taken = real
                first.taken()
                return False
            return real.acquire(blocking)

    first._taken = Late()  # type: ignore[assignment]
    first.asked = True
    first.wait()
    assert real.locked()
    assert not first.asked
    first.asked = True
    first.taken()  # released once, without a RuntimeError
    first.wait()
