"""The worker's SIGTERM/SIGINT handling, in this process's main thread."""

from __future__ import annotations

import os
import signal
import threading
import time
from types import FrameType

from django_pgqueue.worker import Worker


def test_a_signal_inside_the_dispatchers_wait_does_not_deadlock():
    # The dispatcher sleeps in its wake.wait(), holding that Event's lock for a moment
    # on the way in and out. A signal arriving then runs its handler in the same thread;
    # a handler that called stop() (Event.set, the same lock) would block forever.
    worker = Worker(["signals"])
    restore = worker._signals.install()
    assert restore is not None

    def alarm(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError("the SIGTERM handler blocked on a lock its own thread held")

    previous_alarm = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(5)
    try:
        with worker._wake._cond:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler runs in this thread, here
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_alarm)
    try:
        # The signal thread acts on it: the first signal stops, a second one forces.
        thread = threading.Thread(target=worker._signals.run)
        thread.start()
        deadline = time.monotonic() + 60  # a hang guard, not a bound
        while not worker._switch.stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker._switch.stopping.is_set()
        assert not worker._switch.force.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        worker._signals.close()
        thread.join(60)
        assert not thread.is_alive()
        assert worker._switch.force.is_set()
    finally:
        restore()


def _relay_signals(worker: Worker, *signums: int) -> None:
    """Feed the worker's signal thread these signals, as its handler would, and let it
    act on them."""
    for signum in signums:
        worker._signals._signals.put(signum)
    worker._signals.close()
    worker._signals.run()


def test_a_supervisors_stop_and_the_signal_that_reached_the_child_too_are_one_stop():
    # systemd's KillMode=control-group signals the supervisor and every child at once:
    # the child gets the signal and the supervisor's request, in either order.
    signal_first = Worker(["signals"])
    _relay_signals(signal_first, signal.SIGTERM)
    signal_first.stop_gracefully()
    assert signal_first._switch.stopping.is_set()
    assert not signal_first._switch.force.is_set()

    request_first = Worker(["signals"])
    request_first.stop_gracefully()
    request_first.stop_gracefully()
    _relay_signals(request_first, signal.SIGTERM)
    assert request_first._switch.stopping.is_set()
    assert not request_first._switch.force.is_set()

    # A second signal still stops at once; so does a stop() after a signal.
    twice = Worker(["signals"])
    twice.stop_gracefully()
    _relay_signals(twice, signal.SIGTERM, signal.SIGINT)
    assert twice._switch.force.is_set()
    asked = Worker(["signals"])
    asked.stop()
    asked.stop()
    assert asked._switch.force.is_set()
