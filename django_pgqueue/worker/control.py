"""Queue control in the worker (issue 14): the parts' controlled variants.

`ControlledClaims` is the claim scheduler that learns from a controlled claim when to
try its queue again (a claim cut by a limit or a rate is retried as soon as it could
succeed, not after POLL_INTERVAL) and never resumes a controlled queue's walk (the
controlled claim walks from the start under the queue's lock). `ControlledWriter`
writes a finished job of a controlled queue at once (its slot is held until its
outcome is written), tells the scheduler that the slot is free, and logs snoozes and
operator cancellations as what they are. The SQL is in `control.store`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..control.store import ControlledStore
from ..outcomes import Failure
from ..store.worker import ClaimedRow, ClaimKey
from .config import WorkerConfig
from .inflight import InFlight
from .scheduler import ClaimScheduler
from .writer import ABANDONED, Abandoned, OutcomeWriter, Written

logger = logging.getLogger(__name__)


def worker_store(config: WorkerConfig) -> ControlledStore:
    """The dispatcher's connection: claims of controlled queues respect their controls."""
    name = f"pgqueue worker {config.worker_id}"
    return ControlledStore(config.database, name, config.poll_interval)


class ControlledClaims(ClaimScheduler):
    """A `ClaimScheduler` whose empty marks for controlled queues follow their controls."""

    def __init__(self, config: WorkerConfig, store: ControlledStore) -> None:
        super().__init__(config.queues, config.weights, config.poll_interval)
        self.store = store

    def refresh(self, now: float) -> bool:
        """`ClaimScheduler.refresh`; a queue where this worker freed a slot is tried at once."""
        self.notify(self.store.take_freed())
        return super().refresh(now)

    def resume_after(self, queue: str, now: float) -> ClaimKey | None:
        """No resume key for a controlled queue: its claim always walks from the start."""
        if self.store.frees_slots(queue):
            return None
        return super().resume_after(queue, now)

    def idle(self, now: float) -> bool:
        """`ClaimScheduler.idle`, after one more look at which queues are controlled: a
        queue that just became keyed held jobs the plain claim had to leave."""
        if not super().idle(now):
            return False
        became = self.store.refresh_view(time.monotonic())
        return not any(queue in became for queue in self.queues)

    def claimed(
        self, queue: str, limit: int, after: ClaimKey | None, rows: list[ClaimedRow], sent: float
    ) -> None:
        """`ClaimScheduler.claimed`; a short controlled claim is retried when it could succeed."""
        super().claimed(queue, limit, after, rows, sent)
        if len(rows) < limit and after is None and self.store.frees_slots(queue):
            self.mark_empty(queue, sent, sent + self.store.recheck_after(queue, self.poll_interval))


class ControlledWriter(OutcomeWriter):
    """An `OutcomeWriter` that writes controlled queues' outcomes without batching delay."""

    store: ControlledStore

    def add(self, written: list[Written]) -> None:
        """Hold outcomes; one of a controlled queue frees a slot, so it is written now."""
        super().add(written)
        if self.store.controls_any():
            for item, _ in written:
                self.store.slot_freed(item.ctx.queue)

    def flush_due(self, now: float, running: bool) -> bool:
        """`OutcomeWriter.flush_due`, and at once when an outcome holds a controlled slot."""
        if super().flush_due(now, running):
            return True
        return any(self.store.frees_slots(item.ctx.queue) for item, _ in self._unwritten)

    def _log_failure(
        self, item: InFlight, outcome: Failure, result: tuple[str, Any] | Abandoned | None
    ) -> None:
        if result is ABANDONED or result is None:
            super()._log_failure(item, outcome, result)
            return
        status = result[0]
        if not (outcome.snoozed or status == "cancelled"):
            super()._log_failure(item, outcome, result)
            return
        ctx = item.ctx
        if status == "pending":
            self.stats["snoozed"] += 1
            self.observer.snoozed(item)
        else:
            self.stats["cancelled"] += 1
            self.observer.cancelled(item)  # job_cancelled
        logger.info("job %d (%s) %s: %s", ctx.job_id, ctx.type, status, outcome.message)
