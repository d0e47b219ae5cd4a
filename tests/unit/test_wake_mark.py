"""The handler pool's count of handed and returned jobs, and when it wakes the dispatcher."""

from __future__ import annotations

import threading

from django_pgqueue.worker.wake_mark import WakeMark


def test_busy_counts_the_jobs_handed_and_not_returned() -> None:
    mark = WakeMark(threading.Event())
    mark.handed(3)
    mark.returned()
    assert mark.busy() == 2


def test_the_dispatcher_is_woken_at_the_mark_only() -> None:
    wake = threading.Event()
    mark = WakeMark(wake)
    mark.handed(3)
    mark.arm(until_last=True)
    mark.returned()
    mark.returned()
    assert not wake.is_set()
    mark.returned()
    assert wake.is_set()
