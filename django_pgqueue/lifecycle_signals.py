"""The core's Django signals of a job's life, sent by every worker.

`LifecycleSignals` is the worker's own observer and middleware (`extensions`): it sends
``job_started`` before a handler runs, and ``job_succeeded``, ``job_retried``,
``job_failed``, ``job_cancelled`` and ``job_lease_lost`` once the worker knows them.
Each event is built only when a receiver listens; a receiver that raises is logged and
never fails the job (`signals.send`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.dispatch import Signal

from . import signals
from .claimed import ClaimedJob
from .extensions import AsyncRunner, JobEnd, JobObserver, RunMiddleware, Runner
from .outcomes import Outcome


def _tell(signal: Signal, item: ClaimedJob, **extra: Any) -> None:
    """Send `signal` with the arguments every lifecycle signal carries about `item`."""
    if signal.receivers:
        signals.send(signal, **item.facts(), **extra)


class LifecycleSignals(JobObserver, RunMiddleware):
    """Sends the job lifecycle signals of one worker."""

    def run(self, item: ClaimedJob, run: Runner) -> Outcome:
        _started(item)
        return run(item.ctx, item.handler, item.policy)

    async def arun(self, item: ClaimedJob, run: AsyncRunner) -> Outcome:
        _started(item)
        return await run(item.ctx, item.handler, item.policy)

    def jobs_ended(self, ends: Sequence[JobEnd]) -> None:
        if not any(signal.receivers for signal in _END_SIGNALS):
            return  # nobody listens: no look at each end
        for ended in ends:
            item, failure = ended.item, ended.failure
            if ended.end == "completed":
                _tell(signals.job_succeeded, item, result=ended.result)
            elif ended.end == "dead" and failure is not None:
                _tell(signals.job_failed, item, error=failure.last_error)
            elif ended.end in ("retried", "interrupted") and failure is not None:
                _tell(
                    signals.job_retried,
                    item,
                    delay=getattr(failure, "delay", 0.0),  # an interruption: due at once
                    run_at=ended.run_at,
                    error=failure.last_error,
                )
            elif ended.end == "cancelled":
                _tell(signals.job_cancelled, item)

    def lease_lost(self, item: ClaimedJob, detected_by: str) -> None:
        _tell(signals.job_lease_lost, item, detected_by=detected_by)


# The signals `jobs_ended` may send.
_END_SIGNALS = (
    signals.job_succeeded,
    signals.job_failed,
    signals.job_retried,
    signals.job_cancelled,
)


def _started(item: ClaimedJob) -> None:
    if signals.job_started.receivers:
        ctx = item.ctx
        signals.send(
            signals.job_started, **item.facts(), max_attempts=ctx.max_attempts, context=ctx
        )
