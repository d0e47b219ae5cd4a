"""What a worker tells the outside world: signals, its counters, the registry, the rollup.

`Observer` is observability's `WorkerHooks`: the worker calls it at each point of a
job's life; each method says which worker thread calls it. Nothing here can fail a job: signal
receivers are guarded (`signals.send`), and the heartbeat's registry and rollup
writes log their errors and go on (the lease renewal that shares the cycle has
already been sent).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import signals
from ..claimed import InFlight
from ..context import Lease
from ..extensions import AsyncRunner, Runner, WorkerHooks
from ..outcomes import Failure, Outcome, Success
from ..store.worker import Store
from ..version import __version__
from ..worker_config import WorkerConfig
from . import tracing, workers
from .counters import WorkerCounters
from .rollup import RollupBuffer

if TYPE_CHECKING:
    from django.dispatch import Signal

logger = logging.getLogger(__name__)

# Seconds between two registry reports (and rollup flushes) of a worker, at most.
BEAT_EVERY = 5.0
# Reports between two passes that mark silent workers gone and prune old rows.
HOUSEKEEPING_EVERY = 6


class Observer(WorkerHooks):
    """Signals, counters, registry and rollup of one worker process."""

    def __init__(self, config: WorkerConfig) -> None:
        self.identity = workers.Identity(
            id=config.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(config.queues),
            concurrency=config.concurrency,
            lease=config.lease,
            version=__version__,
        )
        self.counters = WorkerCounters()
        self.rollup = RollupBuffer()
        # Job id -> the in-flight job holding its lease: a renewal knows leases only.
        self._items: dict[int, InFlight] = {}
        self._lost: set[int] = set()  # attempt ids announced as lost
        self._lock = threading.Lock()
        self.tracing = False  # a tracer provider is set: attempts run in spans
        self._beats = 0
        self._next_beat = 0.0

    # -- dispatcher thread ------------------------------------------------------------

    def claimed(self, items: Sequence[InFlight]) -> None:
        """Remember the launched jobs' leases, for the renewals that may find them lost;
        and whether their attempts run in spans (asked once per claim, not per job)."""
        self.tracing = tracing.recording()
        with self._lock:
            for item in items:
                self._items[item.ctx.job_id] = item

    def released(self, held: Sequence[tuple[int, int, int]]) -> None:
        """Forget claimed jobs handed back unstarted: (job_id, lease_version, attempt_id)."""
        with self._lock:
            for job_id, lease_version, _ in held:
                item = self._items.get(job_id)
                if item is not None and item.ctx.lease_version == lease_version:
                    del self._items[job_id]

    def completed(self, done: Sequence[tuple[InFlight, str | None]]) -> None:
        """The completions of `done`, (item, result) each, were written."""
        self._written([item for item, _ in done], "succeeded")
        if signals.job_succeeded.receivers:
            for item, result in done:
                self._tell(signals.job_succeeded, item, result=result)

    def failed(self, item: InFlight, failure: Failure, status: str, run_at: Any) -> None:
        """The failure of `item` was written: the job is `status` (pending or dead) now."""
        error = failure.last_error
        if status == "dead":
            self._written([item], "dead")
            self._tell(signals.job_failed, item, error=error)
        else:
            self._written([item], "retried")
            self._tell(signals.job_retried, item, delay=failure.delay, run_at=run_at, error=error)

    def cancelled(self, item: InFlight) -> None:
        """`item` ended cancelled (an operator asked while it ran): its write landed."""
        self._written([item], "cancelled")
        self._tell(signals.job_cancelled, item)

    def snoozed(self, item: InFlight) -> None:
        """`item` snoozed: its write landed, the job is pending again."""
        self._written([item], "snoozed")

    def lease_lost(self, item: InFlight, detected_by: str) -> None:
        """`item`'s lease was found lost (by a renewal or a fenced write); announce it once.

        A fenced write ("write") is the attempt's last word: it is forgotten then.
        """
        item.run_at = None  # no longer this worker's attempt to add to the rollup
        with self._lock:
            announced = item.attempt_id in self._lost
            if detected_by == "write":
                self._lost.discard(item.attempt_id)
                self._forget(item)
            else:
                self._lost.add(item.attempt_id)
        if announced:
            return
        self.counters.attempt(item.ctx.queue, item.ctx.type, "lease_lost")
        self._tell(signals.job_lease_lost, item, detected_by=detected_by)

    def _written(self, items: Sequence[InFlight], outcome: str) -> None:
        """Count, and note for the rollup, the attempts of `items`, all ended `outcome`.

        Per batch, not per job: each lock here is shared with other threads.
        """
        self.counters.attempts_ended([(item.ctx.queue, item.ctx.type) for item in items], outcome)
        self.rollup.add(
            [(item.attempt_id, item.ctx.queue, item.run_at) for item in items if item.run_at],
            outcome,
        )
        with self._lock:
            if self._lost:
                self._lost.difference_update([item.attempt_id for item in items])
            for item in items:
                if self._items.get(item.ctx.job_id) is item:
                    del self._items[item.ctx.job_id]

    def _forget(self, item: InFlight) -> None:
        """Drop `item` from the jobs whose leases renewals report (caller holds the lock)."""
        if self._items.get(item.ctx.job_id) is item:
            del self._items[item.ctx.job_id]

    def _tell(self, signal: Signal, item: InFlight, **extra: Any) -> None:
        """Send `signal` about `item`; its event is built only when someone listens."""
        if signal.receivers:
            signals.send(signal, **self._event(item), **extra)

    @staticmethod
    def _event(item: InFlight) -> dict[str, Any]:
        ctx = item.ctx
        return {
            "job_id": ctx.job_id,
            "queue": ctx.queue,
            "type": ctx.type,
            "attempt": ctx.attempt,
            "lease_version": ctx.lease_version,
            "worker_id": ctx.worker_id,
        }

    # -- executor threads -------------------------------------------------------------

    def run_attempt(self, item: InFlight, run: Runner) -> Outcome:
        """Run `item`'s attempt with `run` (the executor), job_started sent first; in an
        OpenTelemetry span linked to its enqueuer's trace when a tracer provider is set."""
        if not self.tracing:
            if signals.job_started.receivers:
                self._started(item)
            return run(item.ctx, item.handler, item.policy)
        with tracing.attempt_span(item.traceparent, self._attributes(item), item.ctx.type) as span:
            self._started(item)
            outcome = run(item.ctx, item.handler, item.policy)
            self.span_outcome(span, outcome)
        return outcome

    async def arun_attempt(self, item: InFlight, run: AsyncRunner) -> Outcome:
        """`run_attempt` for an async handler, on the worker's event loop (the span is
        the task's current span: OpenTelemetry keeps it in a context variable)."""
        if not self.tracing:
            if signals.job_started.receivers:
                self._started(item)
            return await run(item.ctx, item.handler, item.policy)
        with tracing.attempt_span(item.traceparent, self._attributes(item), item.ctx.type) as span:
            self._started(item)
            outcome = await run(item.ctx, item.handler, item.policy)
            self.span_outcome(span, outcome)
        return outcome

    @staticmethod
    def _attributes(item: InFlight) -> dict[str, Any]:
        ctx = item.ctx
        return {
            "pgqueue.job_id": ctx.job_id,
            "pgqueue.type": ctx.type,
            "pgqueue.queue": ctx.queue,
            "pgqueue.attempt": ctx.attempt,
            "pgqueue.lease_version": ctx.lease_version,
            "pgqueue.worker_id": ctx.worker_id,
        }

    def _started(self, item: InFlight) -> None:
        ctx = item.ctx
        self._tell(signals.job_started, item, max_attempts=ctx.max_attempts, context=ctx)

    @staticmethod
    def span_outcome(span: Any, outcome: Success | Failure) -> None:
        """Record a handler's outcome on its attempt's span."""
        if isinstance(outcome, Failure):
            kind = "failed_permanently" if outcome.permanent else "failed"
            tracing.set_outcome(span, kind, outcome.last_error)
        else:
            tracing.set_outcome(span, "succeeded")

    def executed(self, items: Sequence[InFlight]) -> None:
        """The handlers of `items` returned (whatever their outcome), after `runtime`
        seconds each. On the dispatcher thread, per batch (see `_written`)."""
        self.counters.runtimes_ran(
            [
                (item.ctx.queue, item.ctx.type, item.runtime)
                for item in items
                if item.runtime is not None
            ]
        )

    # -- heartbeat thread (and the dispatcher's renewal after a reconnect) --------------

    def renewed(self, held: Sequence[Lease]) -> None:
        """Announce the leases of `held` that the renewal just sent found lost."""
        for lease in held:
            if not lease.lost:
                continue
            with self._lock:
                item = self._items.get(lease.job_id)
            if item is not None and item.lease is lease:
                self.lease_lost(item, "renewal")

    def beat(self, store: Store, running: int) -> None:
        """Report this worker alive and flush the rollup; now and then, tidy the registry.

        At most every BEAT_EVERY seconds (or half a lease, if shorter): the heartbeat
        runs far more often with short leases, and its renewals come first.
        """
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + min(BEAT_EVERY, self.identity.lease / 2)
        try:
            workers.record_beat(store, self.identity, running)
            self.rollup.flush(store)
            if self._beats % HOUSEKEEPING_EVERY == 0:
                gone = workers.mark_gone(store)
                if gone:
                    logger.warning("workers not seen for two leases, marked gone: %s", gone)
                workers.prune(store)
            self._beats += 1
        except Exception as exc:  # the registry is for people: never stop the renewals
            logger.warning("heartbeat: updating the worker registry failed: %s", exc)

    def stopped(self, store: Store) -> None:
        """Flush the rollup and mark this worker gone, as it stops."""
        if not store.connected:
            return  # the database is away: the row goes gone by worker_mark_gone instead
        try:
            self.rollup.flush(store)
            workers.record_stop(store, self.identity.id)
        except Exception as exc:
            logger.warning("shutdown: updating the worker registry failed: %s", exc)
