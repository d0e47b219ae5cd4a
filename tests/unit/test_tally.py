"""The handler pool's count of handed and returned jobs, and when it wakes the dispatcher."""

from __future__ import annotations

import threading

from django_pgqueue.worker.tally import Tally


def test_busy_counts_the_jobs_handed_and_not_returned() -> None:
    tally = Tally(threading.Event())
    tally.handed(3)
    tally.returned()
    assert tally.busy() == 2


def test_the_dispatcher_is_woken_at_the_mark_only() -> None:
    wake = threading.Event()
    tally = Tally(wake)
    tally.handed(3)
    tally.arm(until_last=True)
    tally.returned()
    tally.returned()
    assert not wake.is_set()
    tally.returned()
    assert wake.is_set()
