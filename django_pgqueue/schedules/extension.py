"""Recurring jobs as an extension: each worker fires the due ticks of its queues, in a
periodic service (`DueTicks`) on the services' connection."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psycopg

from ..extensions import Extension, PeriodicService, WorkerParts, WorkerView
from ..store.session import Session
from ..worker_config import WorkerConfig
from .firing import CODE_RECHECK, code_set, code_set_newest, fire_due, sync_code_schedules

logger = logging.getLogger(__name__)

# Seconds a worker waits before trying schedules again after a statement error.
ERROR_PAUSE = 10.0


class DueTicks(PeriodicService):
    """Sync the code schedules while this worker's code is the newest running, then
    fire due ticks when they are due (at least every poll interval)."""

    name = "schedules"

    def __init__(self, queues: Iterable[str], poll_interval: float) -> None:
        self._queues = list(queues)
        self._poll_interval = poll_interval
        self._wrote = False  # this worker's code schedules are the ones written
        self._code_due = 0.0  # when to say again that this worker runs its code
        self._due = 0.0  # time.monotonic() of the next pass

    def next_due(self) -> float:
        return self._due

    def run(self, session: Session, now: float) -> None:
        """Fire what is due (syncing first, once); set the next pass to the next tick or
        poll. A statement error (the schedule tables not migrated yet, say) is logged
        and tried again later; a lost connection propagates."""
        try:
            if now >= self._code_due:
                self._code_due = now + CODE_RECHECK
                self._sync_code(session)
            wait = fire_due(session, self._queues)
        except psycopg.Error as exc:
            logger.error("schedules: %s; trying again in %gs", exc, ERROR_PAUSE)
            self._due = now + ERROR_PAUSE
            return
        self._due = now + min(self._poll_interval, self._poll_interval if wait is None else wait)

    def _sync_code(self, session: Session) -> None:
        """Write this worker's code schedules once its code is the newest running; after,
        only say that it still runs (a newer deploy's workers take over meanwhile)."""
        if self._wrote:
            self._wrote = code_set_newest(session, code_set())
        else:
            self._wrote = sync_code_schedules(session) is not None


class Schedules(Extension):
    """Schedules declared in code or in the admin, fired by the workers of their queues."""

    def worker_parts(self, config: WorkerConfig, view: WorkerView) -> WorkerParts:
        return WorkerParts(services=(DueTicks(config.queues, config.poll_interval),))
