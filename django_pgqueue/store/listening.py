"""The listener's connection: a `Store` that LISTENs for enqueue notifications."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator
from typing import Any

import psycopg

from ..exceptions import DatabaseUnavailable
from .session import LOST
from .worker import NOTIFY_CHANNEL, Store


class ListeningStore(Store):
    """A worker `Store` that also LISTENs on the queue's channel and waits for NOTIFYs."""

    def listen(self) -> None:
        with self.holding("LISTEN") as conn:
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")

    def unlisten(self) -> list[str]:
        """Stop listening; the queue names notified until then (not yet read)."""
        with self.holding("UNLISTEN") as conn:
            conn.execute(f"UNLISTEN {NOTIFY_CHANNEL}")
            return [notify.payload for notify in conn.notifies(timeout=0.0)]

    def fileno(self) -> int:
        """The server's socket: readable when a NOTIFY arrived (see `notified`)."""
        with self._unavailable("listening", LOST):
            return self._open().pgconn.socket

    def notified(self) -> list[str]:
        """The queue names notified and not read yet, without waiting; never connects
        (a new connection would not LISTEN). DatabaseUnavailable once the connection is
        lost: the server may end it with a message that raises nothing, after which
        libpq has closed the socket (no wait on it may follow)."""
        conn = self._open()
        with self._unavailable("listening", LOST):
            names = [notify.payload for notify in conn.notifies(timeout=0.0)]
        self._open()
        return names

    def _open(self) -> psycopg.Connection[Any]:
        """The connection, open; DatabaseUnavailable (and closed) if it is not."""
        conn = self._conn
        if conn is None or conn.closed:
            self.close()
            raise DatabaseUnavailable(f"listening: {LOST}")
        return conn

    def notifications(self, timeout: float, interrupt: socket.socket) -> Iterator[str]:
        """Yield queue names notified within `timeout` seconds; stop early after one
        burst, or as soon as `interrupt` is readable (the caller has news of its own)."""
        # What already arrived (psycopg's backlog too), without waiting.
        names = self.notified()
        if not names:
            # Wait on the server's socket and the interrupt together: a NOTIFY makes
            # the socket readable.
            server = self.fileno()
            ready, _, _ = select.select([server, interrupt], [], [], timeout)
            if server in ready:
                names = self.notified()
        yield from names
