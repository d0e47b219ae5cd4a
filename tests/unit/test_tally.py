"""The handler pool's count of handed and returned jobs, and the gate of shared slots."""

from __future__ import annotations

import threading

from django_pgqueue.worker.tally import Tally

HANG_GUARD = 30.0  # seconds; a bound on a hang, never on speed


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


def test_the_gate_holds_a_handler_until_a_slot_of_the_process_returns() -> None:
    tally = Tally(threading.Event())
    returned: list[int] = []
    tally.on_return = lambda: returned.append(1)
    tally.gate = threading.BoundedSemaphore(1)
    tally.handed(2)
    tally.enter()  # the first handler runs
    started = threading.Event()

    def second() -> None:
        tally.enter()
        started.set()
        tally.returned()

    thread = threading.Thread(target=second, daemon=True)
    thread.start()
    assert not started.wait(0.2)  # held at the gate while the first runs
    tally.returned()
    assert started.wait(HANG_GUARD)
    thread.join(HANG_GUARD)
    assert returned == [1, 1]
    assert tally.busy() == 0
    assert tally.gate.acquire(blocking=False)  # the permits are back
