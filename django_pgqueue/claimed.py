"""A claimed job in a worker, from its start until its outcome is written.

`InFlight` is what the worker's parts pass between them (and what the worker's hooks
are told of): the handler's `JobContext`, the lease the heartbeat renews, the attempt
row, the handler and its retry policy.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .context import JobContext, Lease
from .registry import Handler
from .retry import RetryPolicy
from .store.worker import ClaimedRow


@dataclass(slots=True, eq=False)
class InFlight:
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
    # Set by its handler thread when the handler starts.
    started: float | None = field(default=None, init=False)
    thread: threading.Thread | None = field(default=None, init=False)
    # Set by its handler thread when the handler returns (see HandlerPool._handoff).
    returned: bool = field(default=False, init=False)
    # Set by the dispatcher: the handler ran past its timeout; the outcome is known.
    timed_out: bool = field(default=False, init=False)
    resolved: bool = field(default=False, init=False)
    # Set by its handler thread just before it hands the outcome over.
    reported: bool = field(default=False, init=False)
    runtime: float | None = field(default=None, init=False)  # seconds the handler ran

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
    ) -> InFlight:
        """The in-flight job of a claimed row, its lease held until `expires`; `database`
        is its queue database's alias, None for PGQUEUE["DATABASE"]."""
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
            lease=lease,
        )
        if handler is None:
            policy, timeout = default_policy, job_timeout
        else:
            policy = handler.retry or default_policy
            timeout = handler.timeout or job_timeout
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
        )
