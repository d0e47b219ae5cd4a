"""Stop requests: `Worker.stop()` from any thread, and SIGTERM/SIGINT.

A signal handler only queues the signal; the signal thread acts on it. The first
request stops claiming and gives running handlers SHUTDOWN_GRACE; a second one (or
`force`) skips the grace.
"""

from __future__ import annotations

import logging
import queue as queue_module
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)


def queue_stop_signals(put: Callable[[int], None]) -> Callable[[], None] | None:
    """Hand SIGTERM and SIGINT to `put` (a reentrant put, like SimpleQueue.put), in the
    main thread only; return what puts the previous handlers back (None elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # A handler runs in the main thread between any two of its bytecodes, even
        # inside the dispatcher's `wake.wait()` while it holds that Event's lock,
        # which a stop request would take again: a deadlock. So it takes no lock
        # (SimpleQueue.put is reentrant) and the thread that reads the queue acts.
        put(signum)

    for sig in previous:
        signal.signal(sig, on_signal)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


class StopSwitch:
    """The stop state every thread of a worker reads."""

    def __init__(self, wake: threading.Event) -> None:
        self.stopping = threading.Event()  # no more claims; shut down
        self.force = threading.Event()  # do not wait for running handlers
        self.wake = wake  # the dispatcher's wake-up
        self.asked = False  # a request was made that a second one escalates

    def request(self, *, force: bool = False) -> None:
        """Ask the worker to stop; a second request, or `force`, skips the grace period."""
        if force or self.asked:
            self.force.set()
        self.asked = True
        self.stopping.set()
        self.wake.set()

    def request_graceful(self) -> None:
        """Stop with the grace period, and leave a later request as if it were the first:
        a supervisor's stop and the signal that reached the process too are one stop."""
        self.stopping.set()
        self.wake.set()


class StopRequests(Protocol):
    """What a signal stops: a worker's `StopSwitch`, or all the workers of a process."""

    @property
    def asked(self) -> bool: ...

    def request(self, *, force: bool = False) -> None: ...


class SignalRelay:
    """Turns SIGTERM/SIGINT into stop requests, from a thread of its own."""

    def __init__(self, switch: StopRequests, shutdown_grace: float) -> None:
        self.switch = switch
        self.shutdown_grace = shutdown_grace
        self._signals: queue_module.SimpleQueue[int | None] = queue_module.SimpleQueue()

    def install(self) -> Callable[[], None] | None:
        """Install the handlers (main thread only); return what puts the old ones back."""
        return queue_stop_signals(self._signals.put)

    def run(self) -> None:
        """Act on the SIGTERM/SIGINT that on_signal queued: stop, or stop now if stopping."""
        while (signum := self._signals.get()) is not None:
            name = signal.Signals(signum).name
            if self.switch.asked:
                logger.warning("second %s: stopping now", name)
                self.switch.request(force=True)
            else:
                logger.warning(
                    "%s: no more claims; running handlers get %gs to finish",
                    name,
                    self.shutdown_grace,
                )
                self.switch.request()

    def close(self) -> None:
        """End the signal thread."""
        self._signals.put(None)
