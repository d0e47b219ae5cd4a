"""The listener thread: LISTEN for enqueue notifications and wake the dispatcher.

While it listens, it lends its connection's socket to the dispatcher's waits
(`wake.py`): a NOTIFY then wakes the dispatcher directly, which reads it and claims on
its own thread; this thread reads what arrives while the dispatcher is not waiting
(a long statement, its shutdown), and takes the connection back to give the turn up,
to UNLISTEN or to recover it.

Polling (POLL_INTERVAL) covers for it while it is down or behind a pooler that drops
LISTEN; after a reconnect it says "look" for every queue, since notifications sent
meanwhile are gone. The children of one supervisor serving the same queues listen one
at a time (`listen_turn.py`), so that a NOTIFY wakes one of them.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
from collections.abc import Callable, Iterable

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
        # (see listen_turn.py); `room` says whether this process could take a job (room
        # for one, and neither drained nor stopping).
        self.turn = turn
        self.room = room
        # Written to by `interrupt`, waited on with the server's socket: a local signal
        # that ends the wait for a NOTIFY, with no round trip to the database.
        self._interrupt_recv, self._interrupt_send = socket.socketpair()
        self._interrupt_send.setblocking(False)
        self._interrupt_recv.setblocking(False)
        self._wanted = set(config.queues)
        # The connection lent to the dispatcher's waits: lendable while it listens
        # (`_fd`, its socket); whichever thread holds `_using` may touch it.
        self._using = threading.Lock()
        self._lendable = False
        self._store: ListeningStore | None = None
        self._fd = -1
        self._failed: Exception | None = None  # a read of the dispatcher's that failed

    def interrupt(self) -> None:
        """End the current wait for a NOTIFY now (after `stop` is set: a stopping worker's
        listener then stops at once instead of after LISTEN_TIMEOUT)."""
        with contextlib.suppress(OSError):  # already written, or the listener has ended
            self._interrupt_send.send(b"\0")

    def full(self) -> None:
        """This process cannot take a job (no room, drained, stopping): give the turn to
        a child that can now, not at the next NOTIFY (a burst enqueued at once sends one)."""
        if self.turn is not None and self.turn.held:
            self.interrupt()

    def run(self) -> None:
        cfg = self.config
        store = ListeningStore(
            cfg.database, f"pgqueue listener {cfg.worker_id}", prepared=cfg.prepared_statements
        )
        self._store = store
        backoff = Backoff(cfg.reconnect_max_delay)
        try:
            while not self.stop.is_set():
                if not store.connected:
                    # Lost, maybe by a read of the dispatcher's: it has closed the
                    # connection but may not have recorded its failure yet. Taken back
                    # first, so the failure is never taken for the next connection's.
                    self._take_back()
                    self._lost_while_lent()
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
                    if self._pass_on(self._hear(store)):
                        self.wake.set()
                    if self.turn is not None and not self.room():
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
            self._take_back()
            store.close()
            if self.turn is not None:
                self.turn.close()
            self._interrupt_recv.close()
            self._interrupt_send.close()

    def _start_listening(self, store: ListeningStore, backoff: Backoff) -> None:
        """LISTEN, then look at every queue: notifications sent before were not heard."""
        try:
            store.listen()
            self._fd = store.fileno()
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
        self._lendable = True
        self.wake.set()

    def _lost_while_lent(self) -> None:
        """A read of the dispatcher's lost the connection: as if this thread's had."""
        failed, self._failed = self._failed, None
        if failed is not None:
            self._deaf()
            logger.warning("listener: %s", failed)

    def _hear(self, store: ListeningStore) -> list[str]:
        """The queue names notified within LISTEN_TIMEOUT, or until interrupted; those
        the dispatcher read while the connection was lent are not among them."""
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed  # recovered here, as a failure of this thread's own read
        if self._lendable:
            # The dispatcher's waits read the NOTIFYs; this thread reads those that
            # arrive while it does not wait, at each LISTEN_TIMEOUT.
            select.select([self._interrupt_recv], [], [], LISTEN_TIMEOUT)
            names = []
            if self._using.acquire(blocking=False):  # else the dispatcher waits on it
                try:
                    names = self._read(store)
                finally:
                    self._using.release()
        else:
            with self._using:
                names = list(store.notifications(LISTEN_TIMEOUT, self._interrupt_recv))
            # The connection answered: lent again (it listens, see _start_listening).
            self._lendable = store.connected and self._fd >= 0
        with contextlib.suppress(BlockingIOError):  # read: the wait is over
            self._interrupt_recv.recv(64)
        return names

    def _read(self, store: ListeningStore) -> list[str]:
        """The names notified, read by the thread holding `_using`; a connection that
        fails to be read is lent no more (this thread recovers it)."""
        try:
            return store.notified()
        except BaseException:
            self._lendable = False
            raise

    def _pass_on(self, names: Iterable[str]) -> bool:
        """Tell the scheduler of the queues notified; True if one is this worker's."""
        told = False
        for name in names:
            if name in self._wanted:
                self.claims.notify((name,))
                told = True
        return told

    # -- lent to the dispatcher's waits (see wake.py) -------------------------------

    def borrow(self) -> int | None:
        """On the dispatcher's thread: the listening connection's socket, now lent to
        its wait; None if it is not lendable now."""
        if not self._lendable or not self._using.acquire(blocking=False):
            return None
        if self.turn is not None and not self.room():
            # It gives its turn up (see `full`): the listener's thread takes the
            # connection back at once, without waking this wait to end it.
            self._using.release()
            return None
        if self._lendable:
            return self._fd
        self._using.release()
        return None

    def read(self) -> bool:
        """On the dispatcher's thread, the socket lent: take in the NOTIFYs that arrived;
        True if its wait should end: one is for this worker's queues, or the connection
        failed (the listener's thread recovers it; the socket is not to be waited on)."""
        assert self._store is not None
        try:
            names = self._read(self._store)
        except Exception as exc:  # the listener's thread recovers it
            self._failed = exc
            self.interrupt()
            return True
        return self._pass_on(names)

    def give_back(self) -> None:
        self._using.release()

    def _take_back(self) -> None:
        """Lend the connection no more, and wait until the dispatcher's wait is off it."""
        self._lendable = False
        if not self._using.acquire(blocking=False):
            self.wake.set()  # ends the wait on it
            self._using.acquire()
        self._using.release()

    def _give_turn(self, store: ListeningStore) -> None:
        """Stop listening and give the turn to a child with room; the queues notified
        until the UNLISTEN are looked at by this process when it has room again."""
        assert self.turn is not None
        self._take_back()
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
        self._take_back()
        self._give_up_turn()
        self.claims.listening = False
        self.claims.notify(self.config.queues)
        self.wake.set()
