"""The handler pool's count of jobs handed over and returned, and when a return wakes
the dispatcher.

Handler threads wake the dispatcher only when the count of returned jobs reaches a
mark the dispatcher set (`arm`): the last job in flight, or the first return after a
flush. Waking on every return would cost a thread switch per job.

A worker over several databases also passes each return to the slots its databases
share (`slots.py`), and gates each handler's start on them (`gate`): their count of
running handlers is this one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Tally:
    """Jobs handed to the handler threads and returned by them."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._handed = 0
        self._returned = 0
        self._wake_at = 1
        # Set by a worker over several databases: at most that many handlers of the
        # process run at once, and what to tell the shared slots at each return.
        self.gate: threading.Semaphore | None = None
        self.on_return: Callable[[], None] | None = None

    def handed(self, n: int) -> None:
        with self._lock:
            self._handed += n

    def busy(self) -> int:
        """Handlers handed over and not returned yet (waiting, running or hung)."""
        return self._handed - self._returned

    def arm(self, *, until_last: bool) -> None:
        """Wake the dispatcher at the last job in flight's return, or at the next one."""
        with self._lock:
            self._wake_at = self._handed if until_last else self._returned + 1

    def enter(self) -> None:
        """A handler is about to start: wait for a slot of the process, if gated."""
        if self.gate is not None:
            self.gate.acquire()

    def returned(self, *, entered: bool = True) -> None:
        """A handler returned (or its thread ended without running it: `entered` False
        if it never passed `enter`)."""
        with self._lock:
            self._returned += 1
            at_mark = self._returned == self._wake_at  # crossed once (see arm)
        if at_mark:
            self._wake.set()
        if self.gate is not None and entered:
            self.gate.release()
        if self.on_return is not None:
            self.on_return()
