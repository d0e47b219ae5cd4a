"""The dispatcher: the loop of the thread that calls `Worker.run`; it orchestrates.

One cycle: collect the outcomes handlers returned, fail the handlers past their
timeout, write outcomes and claim more in as few round trips as it can, then sweep
expired leases and fire recurring jobs when due; sleep until there is a reason to
act. The parts it calls report facts (outcomes, timeouts, retries due, queues
requeued) and never call it back.

A claim's rows go to the intake (`intake.py`), which takes them to the handler pool
or hands them back.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

import psycopg

from ..exceptions import DatabaseUnavailable
from ..extensions import WorkerParts
from ..registry import Registry
from ..store import errors
from ..store.connection import Backoff, wait_for
from ..store.worker import ClaimedRow, Store
from ..worker_config import WorkerConfig
from .aio import AsyncPool
from .capacity import Capacity
from .controls import Controls
from .intake import Intake
from .leases import SWEEP_BATCH, LeaseBook, UnknownClaims, sweep_expired
from .observing import Observers, athrough, through
from .pool import HandlerPool
from .recycling import Recycling
from .report import SupervisorReport
from .scheduler import ClaimScheduler
from .signals import StopSwitch
from .time_limits import HardLimits
from .writer import FLUSH_DELAY, Claim, OutcomeWriter, Written

logger = logging.getLogger(__name__)

# The longest an idle worker whose listener is connected waits before it looks at an
# empty queue again (a NOTIFY wakes it at once; a job already scheduled, when it is
# due). It covers what no NOTIFY announces: a job scheduled meanwhile (enqueued with a
# delay), a retry another worker wrote.
IDLE_POLL = 5.0
# After a refused sweep, the next one comes this soon (or at SWEEP_INTERVAL if sooner).
SWEEP_RETRY = 0.2


class Dispatcher:
    """Claims, hands out, collects and writes, on the worker's own connection.

    What it tells the job-event observers and runs through the middleware comes from
    `parts` (`django_pgqueue.extensions`): the dispatcher names no feature. How each
    queue is claimed is the store's (`Store.claims`).
    """

    def __init__(
        self,
        config: WorkerConfig,
        registry: Registry,
        switch: StopSwitch,
        stats: Counter[str],
        parts: WorkerParts,
        report: SupervisorReport | None = None,
    ) -> None:
        self.config = config
        self.hard_limits = HardLimits(report, config.database)  # None: a timeout
        self.stats = stats
        self.exit_code = 0  # 1 once too many handlers are stuck past their timeout
        # The parts; the Worker starts the heartbeat on `leases` and the listener on
        # `claims`, and shuts the others down.
        self.store = Store(
            config.database,
            f"pgqueue worker {config.worker_id}",
            prepared=config.prepared_statements,
            view_every=config.poll_interval / 2,
            fair_queues=config.fair_queues,
        )
        self.observers = Observers(parts.observers)
        self.claims = ClaimScheduler(
            config.queues, config.weights, config.poll_interval, self.store.claims
        )
        # The one count of the handlers this process runs (see capacity.py).
        self.capacity = Capacity(config.concurrency, config.async_concurrency)
        self.registry = registry
        self.leases = LeaseBook(config.lease)
        self.writer = OutcomeWriter(self.store, self.leases, stats, config, self.observers)
        run, arun = through(parts.middleware), athrough(parts.middleware)
        self.pool = HandlerPool(config.concurrency, switch.wake, config.worker_id, run)
        # Async handlers' event loop, started with the first async job it is given.
        self.aio = AsyncPool(config.async_concurrency, switch.wake, config.worker_id, arun)
        taking = (self.store, self.claims, self.capacity, self.leases, self.pool)
        told = (stats, switch.stopping, self.observers, self.aio)
        self.intake = Intake(config, registry, *taking, *told, Recycling(config, report))
        self._switch = switch
        self._wake = switch.wake
        self._backoff = Backoff(config.reconnect_max_delay)
        self._claimed_since_wait = False  # jobs started since the last wait (see _wait)
        self.unknown_claims = UnknownClaims(self.leases)
        self.controls = Controls(config.concurrency, switch.wake)  # operators' requests
        # Told when this process cannot take a job (a claim left no room, it is drained
        # or on its way out): the Worker's listener gives its listen turn to a sibling
        # process that can.
        self.on_full: Callable[[], None] = _nothing

    def run(self) -> None:
        """Cycle until stopped (or, in burst mode, until idle); survive a lost database."""
        cfg = self.config
        stopping = self._switch.stopping
        next_sweep = 0.0
        # The handlers are registered by now (the worker's autodiscovery).
        self.capacity.async_handlers = self.registry.may_have_async_handlers()
        while not stopping.is_set():
            try:
                if not self.store.connected:
                    self.reconnect()
                    continue
                self._wake.clear()
                if self.writer.in_doubt:  # a read-back that failed for a statement error
                    self.writer.resolve_uncertain()
                if self.unknown_claims:  # a hand-back that was refused
                    self._release_unknown_claims()
                self.collect_outcomes()
                self.check_timeouts()
                self.announce_lost_leases()
                if stopping.is_set():
                    break
                self.controls.apply_resize(self.capacity, self.pool)
                if not self.taking():
                    self.on_full()
                now = time.monotonic()
                # The claim first: a worker woken by a NOTIFY claims before the
                # housekeeping that fell due meanwhile; then a look at what it found.
                busy = self._cycle(now)
                _refresh_plans(self.store, now)  # a look at the tables' size, when due
                if now >= next_sweep:
                    swept = self._sweep()
                    next_sweep = now + (cfg.sweep_interval if swept else SWEEP_RETRY)
                    busy = True
                if busy:
                    continue
                if cfg.burst and self._idle(now):
                    logger.info("worker %s: queues empty, burst done", cfg.worker_id)
                    return
                # An idle worker sleeps until its queues' next job is due; a burst worker
                # never does: it looks again once more, then exits (see ClaimScheduler.idle).
                idle = not self.capacity and not self.writer.pending and not self.writer.in_doubt
                if idle and not cfg.burst:
                    _sleep_long(self.store, self.claims, time.monotonic())
                if self.taking() and _read_view_ahead(self.store, time.monotonic()):
                    continue  # a queue became controlled: claim it at once, not after a wait
                self._wait(next_sweep)
            except DatabaseUnavailable as exc:
                logger.warning("worker %s: %s", cfg.worker_id, exc)
                self.store.close()
            except psycopg.Error as exc:
                # A statement error (a timeout, a refused value): the session is still
                # usable; the fenced statements make a retry of the cycle safe.
                logger.error("worker %s: database error: %s", cfg.worker_id, errors.describe(exc))
                stopping.wait(0.5)

    def reconnect(self, deadline: float | None = None) -> None:
        """Get the connection back, then settle what happened while it was gone.

        Gives up when asked to stop with no handler running (nothing would be lost:
        outcomes not written leave leases to expire), at a second stop request, or at
        `deadline`.
        """
        switch = self._switch
        stop = switch.force if self.capacity else switch.stopping
        if not wait_for(
            self.store, stop, self._backoff, f"worker {self.config.worker_id}", deadline
        ):
            return
        self.pool.reconnected()
        self.claims.reconnected()
        self.writer.resolve_uncertain()
        if self.unknown_claims.find(self.store, self.config.worker_id):
            self._release_unknown_claims()
        # The leases this worker holds may have run out while it was cut off. Before
        # the loop's next sweep could requeue them, write what finished meanwhile and
        # renew what still runs. Another worker's sweep may have been first: the
        # fenced writes tell, and the job runs again.
        self.collect_outcomes()
        self.write_outcomes()
        held = self.leases.held()
        if held:
            try:
                lost = self.leases.renew(self.store, held, time.monotonic())
            except psycopg.Error as exc:  # refused: the heartbeat renews them shortly
                logger.warning("renewing after the reconnect refused: %s", errors.describe(exc))
            else:
                if lost:
                    self.stats["leases_lost"] += lost
                    self.announce_lost_leases()

    def taking(self) -> bool:
        """Whether this process could take a job now: room for one, not drained by an
        operator, not stopping, not done with its share of jobs (recycling)."""
        return (
            self.capacity.room()
            and not self.controls.draining
            and not self._switch.stopping.is_set()
            and not self.intake.recycling.draining
        )

    def _release_unknown_claims(self) -> None:
        released = self.unknown_claims.release(self.store)
        if released:
            self.stats["released"] += released
            for queue in self.config.queues:
                self.claims.requeued(queue)

    def _idle(self, now: float) -> bool:
        """Burst mode's exit test at `now`: nothing running, nothing due, no retry soon."""
        return (
            not self.capacity
            and not self.unknown_claims
            and not self.writer.pending
            and not self.writer.in_doubt
            and self.claims.idle(now)
        )

    def _wait(self, next_sweep: float) -> None:
        """Wait for a reason to act: handlers' outcomes, a NOTIFY, a signal, a deadline.

        With outcomes waiting, the wait lasts until the last handler in flight returns
        (or the batch's FLUSH_DELAY ends). With none waiting, it lasts until the first
        returns, to start the FLUSH_DELAY clock; but right after a claim (jobs likely
        short) it lasts until the last, at most FLUSH_DELAY: the batch's outcomes are
        then collected once, one wake-up instead of two. A wait of that kind that ends
        with nothing returned means longer jobs: the next waits for the first again.
        """
        pending = self.writer.pending
        until_last = pending and bool(self.capacity)
        self.aio.arm(until_last=until_last)
        timeout = self._idle_timeout(next_sweep)
        if pending or not self.capacity or not self._claimed_since_wait:
            self.pool.wait(timeout, until_last=until_last)
            return
        self._claimed_since_wait = False
        self.pool.wait(min(timeout, FLUSH_DELAY), until_last=True)

    def _idle_timeout(self, next_sweep: float) -> float:
        now = time.monotonic()
        # Idle: the empty marks (see _sleep_long) and the sweep say when to look again.
        # Busy: at least every POLL_INTERVAL (a handler that just started has no
        # timeout deadline known yet).
        idle = not self.capacity and not self.writer.pending
        cap = max(self.config.poll_interval, IDLE_POLL) if idle else self.config.poll_interval
        deadline = min(next_sweep, now + cap)
        for due in (
            self.writer.flush_deadline(),
            self.claims.next_look(now),
            self.pool.next_timeout(),
        ):
            if due is not None:
                deadline = min(deadline, due)
        return max(0.0, deadline - now)

    def _cycle(self, now: float) -> bool:
        """Write finished outcomes and claim more, batching both; True if the next cycle
        may find more (outcomes written, a claim full): after a short claim, wait at once.

        Outcomes wait up to FLUSH_DELAY (or until the batch is done) so that one
        transaction completes many jobs and claims the next batch in the same round
        trip; a claim waits for pending outcomes for the same reason.
        """
        stopping = self._switch.stopping
        flush_due = self.writer.flush_due(now, running=bool(self.capacity))
        claim_ok = (
            self.capacity.room()
            and not stopping.is_set()
            and not self.controls.draining
            and (flush_due or not self.writer.pending)
            and self.claims.refresh(now)
        )
        # The queues with room for a claim, in the scheduler's order.
        order = self.claims.order() if claim_ok else []
        order = [name for name in order if self.intake.claim_size(name) > 0]
        if not (flush_due or order):
            return False
        claim = None
        if order:
            limit = self.intake.claim_size(order[0])
            after = self.claims.resume_after(order[0], now)
            claim = (order[0], limit, self.config.worker_id, self.config.lease, after)
        sent = time.monotonic()
        running = len(self.capacity)
        rows = self._write(self.writer.take(), claim) if flush_due else None
        more = flush_due
        if claim is not None:
            queue, limit, _, _, after = claim
            if rows is None:
                rows = self.intake.claim(queue, limit, after)
            more = self.intake.take(queue, limit, after, rows, sent) >= limit or more
            for name in order[1:]:
                if stopping.is_set():
                    break
                more = self._claim_more(name) or more
        if len(self.capacity) > running:  # jobs just started: see _wait
            self._claimed_since_wait = True
            if not self.taking():
                self.on_full()
        return more

    def _claim_more(self, queue: str) -> bool:
        """A cycle's claim from a queue after the first, if it has room; True if full."""
        limit = self.intake.claim_size(queue)
        if limit <= 0:
            return False
        sent = time.monotonic()
        after = self.claims.resume_after(queue, sent)
        rows = self.intake.claim(queue, limit, after)
        return self.intake.take(queue, limit, after, rows, sent) >= limit

    # -- outcomes, timeouts, sweep --------------------------------------------------

    def collect_outcomes(self) -> None:
        """Move the ended handlers' outcomes to the writer's batch; their slots are free."""
        finished = self.pool.finished()
        if self.aio.in_flight:
            finished.extend(_async_outcomes(self.aio))
        if finished:
            self.observers.jobs_executed([item for item, _ in finished])
            self.capacity.drop_all([item for item, _ in finished])
            timed_out = sum(1 for item, _ in finished if item.timed_out)
            if timed_out:
                self.stats["timed_out"] += timed_out
            self.writer.add(finished)
            self.intake.recycling.done(self._switch, busy=bool(self.capacity))

    def announce_lost_leases(self) -> None:
        """Tell the observers of the leases renewals found lost (once per attempt)."""
        lost = self.leases.take_lost()
        if lost:
            ids = {id(lease) for lease in lost}
            for item in self.capacity:
                if id(item.lease) in ids:
                    self.observers.lease_lost(item, "renewal")

    def check_timeouts(self) -> None:
        """Act on handlers past a timeout or a time limit, and on dead handler threads."""
        if self.pool.check_timeouts():
            self.exit_code = 1
            self._switch.request()
        self.hard_limits.check(self.capacity, self.collect_outcomes, self.write_outcomes)
        for item, outcome in self.pool.check_threads():
            self.capacity.drop(item)
            self.stats["threads_died"] += 1
            self.writer.add([(item, outcome)])

    def _write(self, batch: list[Written], claim: Claim | None) -> list[ClaimedRow] | None:
        """Write outcomes (see OutcomeWriter.write); then tell the scheduler of retries."""
        try:
            return self.writer.write(batch, claim)
        finally:
            # No NOTIFY announces a retry: look at its queue again when it is due, and
            # let a burst worker wait for it rather than exit.
            for queue, due in self.writer.take_retries():
                self.claims.retry_scheduled(queue, due)

    def write_outcomes(self) -> None:
        """Write the waiting outcomes now, without a claim."""
        if self.writer.pending:
            self._write(self.writer.take(), None)

    def _sweep(self) -> bool:
        """Sweep expired leases; False if PostgreSQL refused the sweep (try again soon)."""
        return _sweep(self.store, self.claims, self.stats)


def _nothing() -> None:
    pass


def _async_outcomes(aio: AsyncPool) -> list[Written]:
    """The outcomes of the async jobs whose tasks ended, each job's once."""
    returned = aio.finished()
    fresh = []
    for item, outcome in returned:
        if item.resolved:  # recorded already (the worker's shutdown)
            continue
        item.resolved = True
        fresh.append((item, outcome))
    return fresh


def _sweep(store: Store, claims: ClaimScheduler, stats: Counter[str]) -> bool:
    """Sweep expired leases; False if PostgreSQL refused the sweep (try again soon)."""
    try:
        queues = sweep_expired(store)
        # Durable event waits whose timeout passed: their jobs are pending again.
        woken = store.time_out_waits(SWEEP_BATCH)
    except psycopg.Error as exc:
        logger.warning("sweep refused (%s); again shortly", errors.describe(exc))
        return False
    for queue in queues:
        stats["swept"] += 1
        claims.requeued(queue)  # a requeued job keeps its place: walk from the start
    for queue in woken:
        claims.requeued(queue)
    return True


def _refresh_plans(store: Store, now: float) -> None:
    """Plans made while the tables were small are made again as they grow.

    Looked at every cycle, done every PLAN_CHECK: a burst into empty tables grows them
    many times over within seconds, and each claim and write a plan made on empty
    tables runs reads them whole.
    """
    try:
        store.refresh_plans(now)
    except psycopg.Error as exc:  # they stay as they are until the next look
        logger.warning("looking at the tables' size refused: %s", errors.describe(exc))


def _read_view_ahead(store: Store, now: float) -> bool:
    """Before a wait of a worker that could claim: read which queues are controlled if
    that read falls due soon (the wait ends for it, see `ClaimScheduler.next_look`), so
    that the claim a NOTIFY wakes the worker for does not wait for it. True if a queue
    became controlled."""
    try:
        return store.claims.refresh_ahead(now)
    except psycopg.Error as exc:  # the claim reads it when due, as without this
        logger.warning("reading the queue controls refused: %s", errors.describe(exc))
        return False


def _sleep_long(store: Store, claims: ClaimScheduler, now: float) -> None:
    """Idle, and NOTIFYs arrive: look at each empty queue again only when its next
    job is due, or after IDLE_POLL, instead of every POLL_INTERVAL."""
    for queue in claims.long_sleep(now):
        try:
            due = store.next_due(queue)
        except psycopg.Error as exc:  # look at POLL_INTERVAL, as without a listener
            logger.warning("next due job of %s: %s", queue, errors.describe(exc))
            return
        until = IDLE_POLL if due is None else min(max(due, 0.0), IDLE_POLL)
        claims.sleep_until(queue, now + until)
