"""The handler pool's count of jobs handed over and returned, and when a return wakes
the dispatcher.

Handler threads wake the dispatcher only when the count of returned jobs reaches a
mark the dispatcher set (`arm`): the last job in flight, or the first return after a
flush. Waking on every return would cost a thread switch per job.
"""

from __future__ import annotations

import threading


class WakeMark:
    """The jobs handed to the handler threads and returned by them, and the count of
    returns at which the dispatcher is woken."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()
        self._handed = 0
        self._returned = 0
        self._wake_at = 1

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

    def returned(self) -> None:
        """A handler returned (or its thread ended without running it)."""
        with self._lock:
            self._returned += 1
            at_mark = self._returned == self._wake_at  # crossed once (see arm)
        if at_mark:
            self._wake.set()
