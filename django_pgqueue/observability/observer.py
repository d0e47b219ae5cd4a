"""Observability's part in a worker's job events: each finished attempt noted for the
per-minute rollup (`RollupObserver`), and each attempt run in an OpenTelemetry span
linked to its enqueuer's trace when a tracer provider is set (`AttemptSpans`).

Nothing here can fail a job: the rollup buffer is flushed by the registry service
(`registry.WorkerRegistry`), on its own connection, and a span's failure is the
tracer's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..claimed import ClaimedJob
from ..extensions import AsyncRunner, JobEnd, JobObserver, RunMiddleware, Runner
from ..outcomes import Failure, Outcome, Success
from . import tracing
from .rollup import RollupBuffer


class RollupObserver(JobObserver):
    """Notes each attempt whose outcome was written, for the per-minute rollup."""

    def __init__(self, rollup: RollupBuffer) -> None:
        self.rollup = rollup

    def jobs_ended(self, ends: Sequence[JobEnd]) -> None:
        by_outcome: dict[str, list[tuple[int, str, Any]]] = {}
        for ended in ends:
            item = ended.item
            if item.run_at is not None:  # None: a lost lease's attempt is not this worker's
                attempt = (item.attempt_id, item.ctx.queue, item.run_at)
                by_outcome.setdefault(ended.outcome, []).append(attempt)
        for outcome, attempts in by_outcome.items():
            self.rollup.add(attempts, outcome)

    def lease_lost(self, item: ClaimedJob, detected_by: str) -> None:
        item.run_at = None  # no longer this worker's attempt to add to the rollup


class AttemptSpans(RunMiddleware):
    """Runs each attempt in an OpenTelemetry span when a tracer provider is set."""

    def run(self, item: ClaimedJob, run: Runner) -> Outcome:
        if not tracing.recording():
            return run(item.ctx, item.handler, item.policy)
        with tracing.attempt_span(item.traceparent, attributes(item), item.ctx.type) as span:
            outcome = run(item.ctx, item.handler, item.policy)
            span_outcome(span, outcome)
        return outcome

    async def arun(self, item: ClaimedJob, run: AsyncRunner) -> Outcome:
        """The span is the task's current span: OpenTelemetry keeps it in a context
        variable."""
        if not tracing.recording():
            return await run(item.ctx, item.handler, item.policy)
        with tracing.attempt_span(item.traceparent, attributes(item), item.ctx.type) as span:
            outcome = await run(item.ctx, item.handler, item.policy)
            span_outcome(span, outcome)
        return outcome


def attributes(item: ClaimedJob) -> dict[str, Any]:
    """The span attributes of `item`'s attempt: its facts, named pgqueue.*."""
    return {f"pgqueue.{name}": value for name, value in item.facts().items()}


def span_outcome(span: Any, outcome: Success | Failure) -> None:
    """Record a handler's outcome on its attempt's span."""
    if isinstance(outcome, Failure):
        kind = "failed_permanently" if outcome.permanent else "failed"
        tracing.set_outcome(span, kind, outcome.last_error)
    else:
        tracing.set_outcome(span, "succeeded")
