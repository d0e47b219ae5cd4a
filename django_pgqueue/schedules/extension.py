"""Recurring jobs as an extension: each worker fires the due ticks of its queues."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg

from ..extensions import Extension, WorkerHooks
from ..store.worker import Store
from ..worker_config import WorkerConfig
from .firing import fire_due, sync_code_schedules

logger = logging.getLogger(__name__)

# Seconds a worker waits before trying schedules again after a statement error.
ERROR_PAUSE = 10.0


class DueTicks(WorkerHooks):
    """The worker's side: sync code schedules once, then fire due ticks when they are due."""

    def __init__(self, store: Store, queues: Iterable[str], poll_interval: float) -> None:
        self._store = store
        self._queues = list(queues)
        self._poll_interval = poll_interval
        self._synced = False
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
            if not self._synced:
                sync_code_schedules(self._store)
                self._synced = True
            wait = fire_due(self._store, self._queues)
        except psycopg.Error as exc:
            logger.error("schedules: %s; trying again in %gs", exc, ERROR_PAUSE)
            self.due_at = now + ERROR_PAUSE
            return
        self.due_at = now + min(self._poll_interval, self._poll_interval if wait is None else wait)


class Schedules(Extension):
    """Schedules declared in code or in the admin, fired by the workers of their queues."""

    def worker_hooks(self, config: WorkerConfig, store: Store) -> WorkerHooks:
        return DueTicks(store, config.queues, config.poll_interval)
