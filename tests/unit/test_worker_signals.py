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
        deadline = time.monotonic() + 5
        while not worker._switch.stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker._switch.stopping.is_set()
        assert not worker._switch.force.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        worker._signals.close()
        thread.join(5)
        assert not thread.is_alive()
        assert worker._switch.force.is_set()
    finally:
        restore()
