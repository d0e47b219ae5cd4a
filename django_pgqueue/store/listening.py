"""The listener's connection: a `Store` that LISTENs for enqueue notifications."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

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

    def notifications(self, timeout: float, interrupt: socket.socket) -> Iterator[str]:
        """Yield queue names notified within `timeout` seconds; stop early after one
        burst, or as soon as `interrupt` is readable (the caller has news of its own)."""
        conn = self.raw
        with self._unavailable("listening", LOST):
            # What already arrived (psycopg's backlog too), without waiting.
            names = [notify.payload for notify in conn.notifies(timeout=0.0)]
            if not names:
                # Wait on the server's socket and the interrupt together: a NOTIFY
                # makes the socket readable.
                ready, _, _ = select.select([conn.pgconn.socket, interrupt], [], [], timeout)
                if conn.pgconn.socket in ready:
                    names = [notify.payload for notify in conn.notifies(timeout=0.0)]
            yield from names
