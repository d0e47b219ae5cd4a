"""The listener thread: LISTEN for enqueue notifications and wake the dispatcher.

Polling (POLL_INTERVAL) covers for it while it is down or behind a pooler that drops
LISTEN; after a reconnect it says "look" for every queue, since notifications sent
meanwhile are gone. The children of one supervisor serving the same queues listen one
at a time (`listen_turn.py`), so that a NOTIFY wakes one of them.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable

import psycopg

from ..exceptions import DatabaseUnavailable
from ..store import errors
from ..store.connection import Backoff, wait_for
from ..store.listening import ListeningStore
from ..worker_config import WorkerConfig
from .listen_turn import ListenTurn
from .scheduler import ClaimScheduler

logger = logging.getLogger(__name__)

# How long the listener blocks waiting for a NOTIFY before it checks for shutdown; a
# stopping worker interrupts the wait (Listener.interrupt).
LISTEN_TIMEOUT = 1.0


class Listener:
    """Passes the NOTIFYs about this worker's queues to the claim scheduler."""

    def __init__(
        self,
        config: WorkerConfig,
        claims: ClaimScheduler,
        wake: threading.Event,
        stop: threading.Event,
        turn: ListenTurn | None = None,
        room: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.claims = claims
        self.wake = wake
        self.stop = stop
        # Under a supervisor: the children serving these queues LISTEN one at a time
        # (see listen_turn.py); `room` says whether this process could take a job.
        self.turn = turn
        self.room = room
        # Written to by `interrupt`, waited on with the server's socket: a local signal
        # that ends the wait for a NOTIFY, with no round trip to the database.
        self._interrupt_recv, self._interrupt_send = socket.socketpair()
        self._interrupt_send.setblocking(False)
        self._interrupt_recv.setblocking(False)

    def interrupt(self) -> None:
        """End the current wait for a NOTIFY now (after `stop` is set: a stopping worker's
        listener then stops at once instead of after LISTEN_TIMEOUT)."""
        with contextlib.suppress(OSError):  # already written, or the listener has ended
            self._interrupt_send.send(b"\0")

    def full(self) -> None:
        """The dispatcher has no room for a job: give the turn to a child with room now,
        not at the next NOTIFY (a burst enqueued at once sends one)."""
        if self.turn is not None and self.turn.held:
            self.interrupt()

    def run(self) -> None:
        cfg = self.config
        store = ListeningStore(
            cfg.database, f"pgqueue listener {cfg.worker_id}", prepared=cfg.prepared_statements
        )
        backoff = Backoff(cfg.reconnect_max_delay)
        wanted = set(cfg.queues)
        try:
            while not self.stop.is_set():
                if not store.connected:
                    if not wait_for(store, self.stop, backoff, "listener"):
                        return
                    if self.turn is None:
                        self._start_listening(store, backoff)
                    continue  # a stop may have come meanwhile
                if self.turn is not None and not self.turn.held:
                    # Another child listens for these queues: this one's empty queues
                    # are looked at as rarely as a listening worker's.
                    self.claims.listening = True
                    if not self.turn.take(self.room, self.stop):
                        return
                    self._start_listening(store, backoff)
                    continue
                try:
                    for name in store.notifications(LISTEN_TIMEOUT, self._interrupt_recv):
                        if name in wanted:
                            self.claims.notify((name,))
                            self.wake.set()
                    if self.turn is not None:
                        with contextlib.suppress(BlockingIOError):  # read: the wait is over
                            self._interrupt_recv.recv(64)
                        if not self.room():
                            self._give_turn(store)  # a child with room listens instead
                except DatabaseUnavailable as exc:
                    self._deaf()
                    logger.warning("listener: %s", exc)
                except Exception:  # polling covers while the listener recovers
                    self._deaf()
                    logger.exception("listener failed; reconnecting")
                    store.close()
                    self.stop.wait(backoff.next_delay())
        finally:
            self.claims.listening = False
            store.close()
            if self.turn is not None:
                self.turn.close()
            self._interrupt_recv.close()
            self._interrupt_send.close()

    def _start_listening(self, store: ListeningStore, backoff: Backoff) -> None:
        """LISTEN, then look at every queue: notifications sent before were not heard."""
        try:
            store.listen()
        except DatabaseUnavailable as exc:
            logger.warning("listener: %s", exc)
            self._give_up_turn()
            return
        except psycopg.Error as exc:  # refused (a timeout...): try again later
            logger.warning("listener: LISTEN refused: %s", errors.describe(exc))
            store.close()
            self._give_up_turn()
            self.stop.wait(backoff.next_delay())
            return
        self.claims.notify(self.config.queues)
        self.claims.listening = True
        self.wake.set()

    def _give_turn(self, store: ListeningStore) -> None:
        """Stop listening and give the turn to a child with room; the queues notified
        until the UNLISTEN are looked at by this process when it has room again."""
        assert self.turn is not None
        try:
            notified = store.unlisten()
        except (DatabaseUnavailable, psycopg.Error):
            store.close()  # a closed connection hears nothing either
        else:
            self.claims.notify(name for name in notified if name in self.config.queues)
        self._give_up_turn()

    def _give_up_turn(self) -> None:
        if self.turn is not None:
            self.turn.give()

    def _deaf(self) -> None:
        """No NOTIFY arrives any more: the dispatcher polls every POLL_INTERVAL again,
        starting with a look at every queue (an idle one may wait far longer); the turn
        goes to a child that hears them."""
        self._give_up_turn()
        self.claims.listening = False
        self.claims.notify(self.config.queues)
        self.wake.set()
