"""The dispatcher's wake-up: an Event whose wait also ends at a NOTIFY.

The listener lends its connection's socket to the dispatcher's waits (`Lender`): the
dispatcher then waits on that socket and on the Event together, and a NOTIFY wakes it
directly, its queue names read on the dispatcher's own thread, so the claim follows
without a hand-off from the listener's thread. Whoever sets the Event (a handler thread,
a signal, an operator's request) also wakes such a wait, through a socket pair written
only while a wait is on it.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from typing import Protocol


class Lender(Protocol):
    """Who lends a socket to the dispatcher's waits (the listener)."""

    def borrow(self) -> int | None:
        """The socket to wait on, now the borrower's; None if it is not lent now."""
        ...

    def read(self) -> bool:
        """On the borrower's thread: take in what arrived on the socket; True if it is
        a reason to act (a NOTIFY for the worker's queues)."""
        ...

    def give_back(self) -> None: ...


class Wake(threading.Event):
    """The Event the dispatcher waits on, and the lent socket when there is one."""

    def __init__(self) -> None:
        super().__init__()
        self.lender: Lender | None = None
        self._recv, self._send = socket.socketpair()
        self._recv.setblocking(False)
        self._send.setblocking(False)
        self._selecting = False  # a wait is on the socket pair: `set` writes to it
        self._written = False  # `set` wrote to it since the last wait's end

    def set(self) -> None:
        super().set()
        if self._selecting:
            self._written = True
            with contextlib.suppress(OSError):  # full (the wait wakes anyway), or closed
                self._send.send(b"\0")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until set, or a NOTIFY arrived on the lent socket, or `timeout`; the
        NOTIFYs are taken in here (see `Lender.read`). True if set."""
        lender = self.lender
        lent = None if lender is None else lender.borrow()
        if lent is None:
            return super().wait(timeout)
        assert lender is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            # Set before the look at the flag: a `set` after the look writes the pair.
            self._selecting = True
            # Every read of the socket takes in all it holds: what is not read yet is
            # still in the socket, and makes it readable.
            while not self.is_set():
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    ready, _, _ = select.select([lent, self._recv], [], [], left)
                except (OSError, ValueError):  # the socket is gone: the read says so
                    lender.read()
                    break
                if lent not in ready or lender.read():
                    break  # set, the time is up, or a NOTIFY for the worker
        finally:
            self._selecting = False
            lender.give_back()
            if self._written:  # else nothing to read: no system call for it
                self._written = False
                _drain(self._recv)
        return self.is_set()

    def close(self) -> None:
        self._recv.close()
        self._send.close()


def _drain(recv: socket.socket) -> None:
    """Read a socket pair's bytes until none is left."""
    with contextlib.suppress(BlockingIOError, OSError):
        while recv.recv(4096):
            pass
