"""Intake: a claim's rows on their way to the handler pool, or back to the queue.

The dispatcher decides when to claim and from which queue; the intake claims and
takes the rows in, through one pipeline: `take` (what the claim taught the
scheduler; a short resumed claim is topped up by a walk from the start) -> `_admit`
(hand back at once when stopping) -> `_launch` (in-flight job, lease, handler pool).
It also hands back claimed jobs no handler started (`release`), for `_admit` and for
the worker's shutdown. Claims are sized by the in-flight jobs (`claim_size`). It never
calls the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from ..claimed import ClaimedJob
from ..conf import get_settings
from ..registry import Registry
from ..retry import RetryPolicy, default_policy
from ..store import errors
from ..store.worker import ClaimedRow, ClaimKey, Store
from ..worker_config import WorkerConfig
from .aio import AsyncPool
from .capacity import Capacity
from .leases import LeaseBook
from .observing import Observers
from .pool import HandlerPool
from .recycling import Recycling
from .scheduler import ClaimScheduler

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Intake:
    """Claims and takes in the rows: scheduler told, leases held, handlers started."""

    config: WorkerConfig
    registry: Registry
    store: Store
    claims: ClaimScheduler
    capacity: Capacity
    leases: LeaseBook
    pool: HandlerPool
    stats: Counter[str]
    stopping: threading.Event
    observers: Observers  # told of the jobs claimed
    aio: AsyncPool  # the event loop of async handlers
    recycling: Recycling  # how many jobs this process has left to claim
    policy: RetryPolicy = field(default_factory=default_policy)

    def claim_size(self, queue: str) -> int:
        """How many jobs a claim from `queue` may take now (see `Capacity`)."""
        return self.recycling.room(self.capacity.claim_size(queue, self.config.batch_size))

    def claim(self, queue: str, limit: int, after: ClaimKey | None = None) -> list[ClaimedRow]:
        """Claim; a refused claim (not a lost connection) is logged and claims nothing:
        nothing was claimed, and the next cycle claims again."""
        try:
            return self.store.claim(queue, limit, self.config.worker_id, self.config.lease, after)
        except psycopg.Error as exc:
            logger.warning(
                "claim from %s refused (%s: %s)", queue, errors.classify(exc), errors.describe(exc)
            )
            return []

    def take(
        self, queue: str, limit: int, after: ClaimKey | None, rows: list[ClaimedRow], sent: float
    ) -> int:
        """Take in a claim's rows; a resumed claim that came back short claims the rest
        with a walk from the start, which may find jobs that sort before its key. How
        many rows were claimed in all."""
        if after is not None:
            self.stats["claims_resumed"] += 1
        _in_claim_order(rows)
        self.claims.claimed(queue, limit, after, rows, sent)
        self._admit(queue, rows, sent)
        if after is None or len(rows) >= limit or self.stopping.is_set():
            return len(rows)
        rest = limit - len(rows)
        sent = time.monotonic()
        more = _in_claim_order(self.claim(queue, rest))
        self.claims.claimed(queue, rest, None, more, sent)
        self._admit(queue, more, sent)
        return len(rows) + len(more)

    def _admit(self, queue: str, rows: list[ClaimedRow], sent: float) -> None:
        """Launch claimed rows, or hand them back if a stop came while the claim ran."""
        if not rows:
            return
        if self.stopping.is_set():
            # The signal came while this claim was on the wire: these jobs have not
            # started, so they go back now rather than run after the signal.
            self.stats["claimed"] += len(rows)
            self.release([(row.job_id, row.lease_version, row.attempt_id) for row in rows])
            return
        logger.info("claimed %d job(s) from %s", len(rows), queue)
        self._launch(rows, sent + self.config.lease)

    def _launch(self, rows: list[ClaimedRow], expires: float) -> None:
        """Start claimed jobs, in claim order: in flight, leases held, handed to the pool."""
        cfg = self.config
        self.stats["claimed"] += len(rows)
        database = None if self.store.alias == get_settings().DATABASE else self.store.alias
        items = [
            ClaimedJob.claimed(
                row,
                self.registry.find(row.type),
                self.policy,
                cfg.job_timeout,
                cfg.worker_id,
                expires,
                database,
                (cfg.soft_time_limit, cfg.time_limit),
                # A hard limit ends the process under a supervisor; else it is a timeout.
                self.recycling.report is not None,
            )
            for row in rows
        ]
        self.recycling.claimed(len(items))
        self.capacity.add_all(items)
        self.leases.hold([item.lease for item in items])
        self.observers.jobs_claimed(items)
        on_loop = [item for item in items if item.kind == "async"]
        if on_loop:
            self.aio.submit(on_loop)
            self.pool.submit([item for item in items if item.kind == "sync"])
        else:
            self.pool.submit(items)

    def release(self, held: list[tuple[int, int, int]]) -> None:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id)."""
        released = self.leases.hand_back(self.store, held)
        if released is not None:
            self.stats["released"] += len(released)


def _in_claim_order(rows: list[ClaimedRow]) -> list[ClaimedRow]:
    """Sort a claim's rows in place into claim order (the statement returns them in
    any order): handlers start in it, and the scheduler resumes after the last."""
    if len(rows) > 1:
        rows.sort(key=ClaimedRow.order)
    return rows
