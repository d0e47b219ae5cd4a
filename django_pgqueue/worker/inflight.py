"""In-flight bookkeeping: the claimed jobs of this worker whose outcome is not known yet."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..context import JobContext, Lease
from ..registry import Handler
from ..retry import RetryPolicy
from ..store.worker import ClaimedRow


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
    ) -> InFlight:
        """The in-flight job of a claimed row, its lease held until `expires`."""
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


class InFlightJobs:
    """The jobs handed to handler threads and not yet resolved, by job id (dispatcher only)."""

    def __init__(self) -> None:
        self._items: dict[int, InFlight] = {}

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(self._items.values())

    def add_all(self, items: list[InFlight]) -> None:
        for item in items:
            self._items[item.ctx.job_id] = item

    def drop(self, item: InFlight) -> None:
        """Forget `item`, and only it.

        After losing its lease, this worker may have claimed the same job again while
        the old handler still ran: that newer claim's entry stays.
        """
        self.drop_all([item])

    def drop_all(self, items: list[InFlight]) -> None:
        """`drop` each of `items`."""
        entries = self._items
        for item in items:
            if entries.get(item.ctx.job_id) is item:
                del entries[item.ctx.job_id]

    def clear(self) -> None:
        self._items.clear()
