"""Intake: a claim's rows on their way to the handler pool, or back to the queue.

The dispatcher decides when to claim and from which queue; the intake claims and
takes the rows in, through one pipeline: `take` (what the claim taught the
scheduler; a short resumed claim is topped up by a walk from the start) -> `_admit`
(hand back at once when stopping) -> `_launch` (in-flight job, lease, handler pool).
It also hands back claimed jobs no handler started (`release`), for `_admit` and for
the worker's shutdown. It never calls the dispatcher.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from ..claimed import InFlight
from ..conf import get_settings
from ..extensions import Hooks
from ..registry import Registry
from ..retry import RetryPolicy, default_policy
from ..store import errors
from ..store.worker import ClaimedRow, ClaimKey, Store
from ..worker_config import WorkerConfig
from .aio import AsyncPool
from .inflight import InFlightJobs
from .leases import LeaseBook
from .pool import HandlerPool
from .scheduler import ClaimScheduler
from .slots import Seat

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Intake:
    """Claims and takes in the rows: scheduler told, leases held, handlers started."""

    config: WorkerConfig
    registry: Registry
    store: Store
    claims: ClaimScheduler
    inflight: InFlightJobs
    leases: LeaseBook
    pool: HandlerPool
    stats: Counter[str]
    stopping: threading.Event
    hooks: Hooks  # told of claims and releases
    aio: AsyncPool | None = None  # the event loop of async handlers
    policy: RetryPolicy = field(default_factory=default_policy)
    # Which kinds of handler ("sync", "async") each queue's claims have brought: a
    # claim counts the free capacity of those kinds only.
    kinds: dict[str, set[str]] = field(default_factory=dict)
    # The handler slots shared with the dispatchers of the worker's other databases.
    seat: Seat | None = None

    def free(self, queue: str | None = None) -> int:
        """How many jobs a claim from `queue` may take now (any queue's most: None).

        The handler threads' free slots count for a queue whose claims brought sync
        handlers, the event loop's for one whose claims brought async handlers. A queue
        not claimed from yet is sized to the free threads, as if it had only sync
        handlers (a worker starts with all its threads free): its claims teach which
        kinds it has. A queue that brought one kind only claims one job more while the
        other pool has room and its own pool holds no job waiting, to find out whether
        it has the other kind too. So a worker holds at most one job per queue waiting
        for a full pool, and never more jobs than both pools together.
        """
        running = len(self.inflight)
        if self.aio is None:
            return self.config.concurrency - running
        async_free = self.aio.free
        sync_free = self.config.concurrency - (running - self.aio.in_flight)
        looped = any("async" in kinds for kinds in self.kinds.values())
        if queue is None:  # the loop counts once a queue brought an async handler
            return sync_free + (async_free if looped else 0)
        kinds = self.kinds.get(queue)
        if not kinds:
            return sync_free
        if len(kinds) == 2:
            return sync_free + async_free
        if "sync" in kinds:
            probe = looped and async_free > 0 and sync_free >= 0
            return max(sync_free, 0) + int(probe)
        probe = sync_free > 0 and async_free >= 0
        return max(async_free, 0) + int(probe)

    def grant(self, queue: str, limit: int) -> int:
        """The size of a claim from `queue` of at most `limit`: as many of the handler
        slots shared with the other databases' dispatchers as it gets, held until
        `granted` (all of `limit` without shared slots, or for async handlers only,
        whose event loop is this database's own)."""
        seat = self._seat(queue)
        return limit if seat is None else seat.grant(queue, limit)

    def _seat(self, queue: str) -> Seat | None:
        """The shared slots a claim from `queue` holds, if any (none for a queue whose
        claims brought async handlers only: the event loop is this database's own)."""
        return None if self.kinds.get(queue) == {"async"} else self.seat

    def granted(self) -> None:
        """The claims of a cycle are in (or failed): their shared slots' hold ends."""
        if self.seat is not None:
            self.seat.done()

    def away(self) -> None:
        """The database is out of reach: want no shared slot until it is back."""
        if self.seat is not None:
            self.seat.away()

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
    ) -> None:
        """Take in a claim's rows; a resumed claim that came back short claims the rest
        with a walk from the start, which may find jobs that sort before its key."""
        if after is not None:
            self.stats["claims_resumed"] += 1
        seat = self._seat(queue)  # as the claim was granted, before its rows teach more
        _in_claim_order(rows)
        self.claims.claimed(queue, limit, after, rows, sent)
        self._admit(queue, rows, sent)
        if after is None or len(rows) >= limit or self.stopping.is_set():
            if seat is not None:
                seat.claimed(queue, limit, len(rows))
            return
        rest = limit - len(rows)
        sent = time.monotonic()
        more = _in_claim_order(self.claim(queue, rest))
        self.claims.claimed(queue, rest, None, more, sent)
        self._admit(queue, more, sent)
        if seat is not None:
            seat.claimed(queue, rest, len(more))

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
            InFlight.claimed(
                row,
                self.registry.find(row.type),
                self.policy,
                cfg.job_timeout,
                cfg.worker_id,
                expires,
                database,
            )
            for row in rows
        ]
        self.inflight.add_all(items)
        self.leases.hold([item.lease for item in items])
        self.hooks.claimed(items)  # leases a renewal may find lost
        if self.aio is None:
            self.pool.submit(items)
            return
        on_loop = [item for item in items if item.handler and item.handler.coroutine]
        on_threads = [item for item in items if not (item.handler and item.handler.coroutine)]
        kinds = self.kinds.setdefault(rows[0].queue, set())
        if on_loop:
            kinds.add("async")
            self.aio.submit(on_loop)
        if on_threads:
            kinds.add("sync")
            self.pool.submit(on_threads)

    def release(self, held: list[tuple[int, int, int]]) -> None:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id)."""
        self.hooks.released(held)
        released = self.leases.hand_back(self.store, held)
        if released is not None:
            self.stats["released"] += len(released)


def _in_claim_order(rows: list[ClaimedRow]) -> list[ClaimedRow]:
    """Sort a claim's rows in place into claim order (the statement returns them in
    any order): handlers start in it, and the scheduler resumes after the last."""
    if len(rows) > 1:
        rows.sort(key=ClaimedRow.order)
    return rows
