"""Recurring jobs as an extension: each worker fires the due ticks of its queues."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg

from ..extensions import Extension, WorkerHooks
from ..store.worker import Store
from ..worker_config import WorkerConfig
from .firing import CODE_RECHECK, code_set, code_set_newest, fire_due, sync_code_schedules

logger = logging.getLogger(__name__)

# Seconds a worker waits before trying schedules again after a statement error.
ERROR_PAUSE = 10.0


class DueTicks(WorkerHooks):
    """The worker's side: sync the code schedules while this worker's code is the newest
    running, then fire due ticks when they are due."""

    def __init__(self, store: Store, queues: Iterable[str], poll_interval: float) -> None:
        self._store = store
        self._queues = list(queues)
        self._poll_interval = poll_interval
        self._wrote = False  # this worker's code schedules are the ones written
        self._code_due = 0.0  # when to say again that this worker runs its code
        self.due_at = 0.0  # time.monotonic() of the next pass

    def next_pass(self) -> float:
        return self.due_at

    def periodic(self, now: float) -> None:
        """Fire what is due (syncing first, once); set `due_at` to the next tick or poll.

        A statement error (the schedule tables not migrated yet, say) is logged and
        tried again later: it must never keep the worker from claiming jobs. A lost
        connection propagates, as from any other worker statement.
        """
        try:
            if now >= self._code_due:
                self._code_due = now + CODE_RECHECK
                self._sync_code()
            wait = fire_due(self._store, self._queues)
        except psycopg.Error as exc:
            logger.error("schedules: %s; trying again in %gs", exc, ERROR_PAUSE)
            self.due_at = now + ERROR_PAUSE
            return
        self.due_at = now + min(self._poll_interval, self._poll_interval if wait is None else wait)

    def _sync_code(self) -> None:
        """Write this worker's code schedules once its code is the newest running; after,
        only say that it still runs (a newer deploy's workers take over meanwhile)."""
        if self._wrote:
            self._wrote = code_set_newest(self._store, code_set())
        else:
            self._wrote = sync_code_schedules(self._store) is not None


class Schedules(Extension):
    """Schedules declared in code or in the admin, fired by the workers of their queues."""

    def worker_hooks(self, config: WorkerConfig, store: Store) -> WorkerHooks:
        return DueTicks(store, config.queues, config.poll_interval)
