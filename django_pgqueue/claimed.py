"""A claimed job in a worker, from its claim until its handler really ended.

`ClaimedJob` is what the worker's parts pass between them (and what the worker's hooks
are told of): the handler's `JobContext`, the lease the heartbeat renews, the attempt
row, the handler and its retry policy.

The hold: an in-flight job keeps its lease, its row and its slots until its handler's
code really returned (or its thread, or its event loop, is gone). Whatever decides the
job's fate before that (a timeout) sets its `verdict`, which is reported in place of
the handler's own outcome once the code ended; nothing is written before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .context import JobContext, Lease
from .outcomes import Outcome
from .registry import Handler
from .retry import RetryPolicy
from .store.worker import ClaimedRow


@dataclass(slots=True, eq=False)
class ClaimedJob:
    """A claimed job from its start until its outcome is written."""

    ctx: JobContext
    lease: Lease
    attempt_id: int
    handler: Handler | None
    payload_text: str
    policy: RetryPolicy
    timeout: float | None
    # When it was due, as claimed (the rollup's wait); None once its lease is lost.
    run_at: Any = None
    traceparent: str | None = None  # the enqueuer's W3C trace context, for its span
    # "async" for a coroutine handler (the event loop runs it), else "sync" (a thread).
    kind: str = "sync"
    # Its soft and hard time limits, in seconds (see `worker.time_limits`).
    soft_time_limit: float | None = None
    time_limit: float | None = None
    # Set when the handler starts: when, and the thread running it (the event loop's
    # thread for an async handler).
    started: float | None = field(default=None, init=False)
    thread: threading.Thread | None = field(default=None, init=False)
    # Set when the handler's code returned (see HandlerPool._handoff).
    returned: bool = field(default=False, init=False)
    # The handler ran past its timeout (time.monotonic() when that was decided); its
    # outcome is its `verdict`, reported once the code really ended.
    timed_out: bool = field(default=False, init=False)
    timed_out_at: float | None = field(default=None, init=False)
    verdict: Outcome | None = field(default=None, init=False)
    # SoftTimeLimitExceeded was raised in it (a sync handler), or its task cancelled.
    soft_limited: bool = field(default=False, init=False)
    # Set by the dispatcher once it took the outcome in, or by the worker's shutdown
    # once it recorded the job itself (an outcome that comes later is dropped).
    resolved: bool = field(default=False, init=False)
    # Set as the outcome is queued, under the pool's hand-over lock: the handler's code
    # has ended.
    reported: bool = field(default=False, init=False)
    runtime: float | None = field(default=None, init=False)  # seconds the handler ran
    # The observers were told its lease was lost (once per attempt).
    lost_told: bool = field(default=False, init=False)

    def decide(self, verdict: Outcome, now: float) -> None:
        """The job's outcome is `verdict` whatever the handler returns (a timeout):
        reported once the code ended. Its lease reads as lost to the handler from now
        (the heartbeat renews it for the worker until the outcome is written)."""
        self.verdict = verdict
        self.timed_out = True
        self.timed_out_at = now
        self.lease.timed_out = True

    def facts(self) -> dict[str, Any]:
        """What identifies this attempt: the job's id, queue and type, the attempt, its
        lease version and the worker running it. The lifecycle signals' arguments, a
        log line's `extra=`, a span's attributes."""
        ctx = self.ctx
        return {
            "job_id": ctx.job_id,
            "queue": ctx.queue,
            "type": ctx.type,
            "attempt": ctx.attempt,
            "lease_version": ctx.lease_version,
            "worker_id": ctx.worker_id,
        }

    @property
    def ended(self) -> bool:
        """The handler's code is not running any more: it returned, or the thread (or
        the event loop's thread) that ran it is gone."""
        thread = self.thread
        return self.reported or (thread is not None and not thread.is_alive())

    @classmethod
    def claimed(
        cls,
        row: ClaimedRow,
        handler: Handler | None,
        default_policy: RetryPolicy,
        job_timeout: float | None,
        worker_id: str,
        expires: float,
        database: str | None = None,
        time_limits: tuple[float | None, float | None] = (None, None),
        hard_limit_ends_process: bool = False,
    ) -> ClaimedJob:
        """The in-flight job of a claimed row, its lease held until `expires`; `database`
        is its queue database's alias, None for PGQUEUE["DATABASE"].

        `time_limits` are the defaults (soft, hard) of a handler that sets none. A hard
        limit ends the process only under a supervisor (`hard_limit_ends_process`);
        without one it acts as a timeout."""
        lease = Lease(row.job_id, row.lease_version, expires)
        ctx = JobContext(
            job_id=row.job_id,
            queue=row.queue,
            type=row.type,
            payload=None,
            attempt=row.attempt,
            max_attempts=row.max_attempts,
            lease_version=row.lease_version,
            priority=row.priority,
            worker_id=worker_id,
            created_at=row.created_at,
            user_key=row.idempotency_key,
            database=database,
            attempt_id=row.attempt_id,
            lease=lease,
        )
        soft, hard = time_limits
        if handler is None:
            policy, timeout = default_policy, job_timeout
        else:
            policy = handler.retry or default_policy
            timeout = handler.timeout or job_timeout
            soft = handler.soft_time_limit or soft
            hard = handler.time_limit or hard
        if hard is not None and not hard_limit_ends_process:
            timeout = hard if timeout is None else min(timeout, hard)
            hard = None
        if soft is not None and hard is not None and soft >= hard:
            soft = None  # a default soft limit past the handler's own hard one
        return cls(
            ctx,
            lease,
            row.attempt_id,
            handler,
            row.payload,
            policy,
            timeout,
            row.run_at,
            row.traceparent,
            "async" if handler is not None and handler.coroutine is not None else "sync",
            soft,
            hard,
        )
