"""The listener thread: LISTEN for enqueue notifications and wake the dispatcher.

Polling (POLL_INTERVAL) covers for it while it is down or behind a pooler that drops
LISTEN; after a reconnect it says "look" for every queue, since notifications sent
meanwhile are gone.
"""

from __future__ import annotations

import logging
import threading

import psycopg

from ..exceptions import DatabaseUnavailable
from ..store import errors
from ..store.connection import Backoff, wait_for
from ..store.worker import Store
from .config import WorkerConfig
from .scheduler import ClaimScheduler

logger = logging.getLogger(__name__)

# How long the listener blocks waiting for a NOTIFY before it checks for shutdown; a
# stopping worker wakes it sooner (Store.wake_listeners).
LISTEN_TIMEOUT = 1.0


class Listener:
    """Passes the NOTIFYs about this worker's queues to the claim scheduler."""

    def __init__(
        self,
        config: WorkerConfig,
        claims: ClaimScheduler,
        wake: threading.Event,
        stop: threading.Event,
    ) -> None:
        self.config = config
        self.claims = claims
        self.wake = wake
        self.stop = stop

    def run(self) -> None:
        cfg = self.config
        store = Store(cfg.database, f"pgqueue listener {cfg.worker_id}")
        backoff = Backoff(cfg.reconnect_max_delay)
        wanted = set(cfg.queues)
        try:
            while not self.stop.is_set():
                if not store.connected:
                    if not wait_for(store, self.stop, backoff, "listener"):
                        return
                    try:
                        store.listen()
                    except DatabaseUnavailable as exc:
                        logger.warning("listener: %s", exc)
                        continue
                    except psycopg.Error as exc:  # refused (a timeout...): try again later
                        logger.warning("listener: LISTEN refused: %s", errors.describe(exc))
                        store.close()
                        self.stop.wait(backoff.next_delay())
                        continue
                    # Notifications sent while we were not listening are gone: look.
                    self.claims.notify(wanted)
                    self.claims.listening = True
                    self.wake.set()
                    # A stop that came meanwhile: its wake-up NOTIFY may have gone
                    # before the LISTEN; one that comes later arrives after it.
                    continue
                try:
                    for name in store.notifications(timeout=LISTEN_TIMEOUT):
                        if name in wanted:
                            self.claims.notify((name,))
                            self.wake.set()
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

    def _deaf(self) -> None:
        """No NOTIFY arrives any more: the dispatcher polls every POLL_INTERVAL again,
        starting with a look at every queue (an idle one may wait far longer)."""
        self.claims.listening = False
        self.claims.notify(self.config.queues)
        self.wake.set()
