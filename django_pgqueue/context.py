"""What a handler receives: the job, its attempt, and whether its lease is still held;
and whether the running coroutine is a worker's async handler."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import InitVar, dataclass, field
from typing import Any

# Reads the stored results of the jobs a job waits for, by step name: set by the
# workflows feature when it is imported (this module knows no database).
parent_results_reader: Callable[[Any], dict[str, Any]] | None = None
# Reads the counts of the batch a job is in (the workflows feature sets it too).
batch_reader: Callable[[Any], Any] | None = None
# Reads what a step that takes its parents' results receives before its own arguments
# (the workflows feature sets it too).
results_arguments_reader: Callable[[Any], list[Any]] | None = None

# The job whose async handler runs in this context (set by the executor around the
# handler's coroutine, in the job's own task), else None. The worker's async handlers
# share one thread for Django's thread-sensitive calls, and so one connection:
# `aatomic` refuses to hold a transaction open across awaits there.
async_handler_job: ContextVar[int | None] = ContextVar("pgqueue_async_handler_job", default=None)


class Lease:
    """The worker's view of one claimed job's lease, shared with the heartbeat thread."""

    __slots__ = (
        "cancel_requested",
        "expires",
        "finishing",
        "job_id",
        "lease_version",
        "lost",
        "timed_out",
    )

    def __init__(self, job_id: int, lease_version: int, expires: float) -> None:
        self.job_id = job_id
        self.lease_version = lease_version
        self.expires = expires  # time.monotonic() by which the database lease surely ends
        self.lost = False
        self.finishing = False  # its outcome is being written: a failed renewal means nothing
        self.cancel_requested = False  # an operator cancelled the job (seen at a renewal)
        # The handler ran past its timeout: lost to the handler, still renewed for the
        # worker until the job's failure is written.
        self.timed_out = False

    def held(self) -> bool:
        """Whether the handler still owns the job (not lost, not timed out, not overdue)."""
        return not self.lost and not self.timed_out and time.monotonic() < self.expires


@dataclass(slots=True, kw_only=True, eq=False, repr=False)
class JobContext:
    """One claimed job, as a handler sees it.

    `attempt` counts from 1. `idempotency_key` is stable across attempts: the key given
    at enqueue, or ``"pgqueue-<job id>"`` (``"pgqueue-<alias>:<job id>"`` for a job on a
    queue database other than PGQUEUE["DATABASE"]: ids of two databases may be equal);
    pass it to external services so a retried job does not charge or send twice.
    `lease_lost()` turns true once another worker may own the job: a long handler should
    check it and stop early. `database` is the alias of the job's queue database when it
    is not PGQUEUE["DATABASE"] (None for that one).
    """

    job_id: int
    queue: str
    type: str
    payload: Any
    attempt: int
    max_attempts: int
    lease_version: int
    priority: int = 0
    worker_id: str = ""
    created_at: dt.datetime | None = None
    user_key: str | None = None
    database: str | None = None
    # The worker's lease on the job (None outside a worker): private, read through
    # lease_lost() and cancel_requested().
    lease: InitVar[Lease | None] = None
    _lease: Lease | None = field(init=False, default=None)
    _parents: dict[str, Any] | None = field(init=False, default=None)

    def __post_init__(self, lease: Lease | None) -> None:
        self._lease = lease

    @property
    def idempotency_key(self) -> str:
        if self.user_key:
            return self.user_key
        where = f"{self.database}:" if self.database else ""
        return f"pgqueue-{where}{self.job_id}"

    @property
    def scheduled_for(self) -> dt.datetime | None:
        """The tick a recurring job was enqueued for (UTC), or None for other jobs.

        Read from the key the schedule gave the job, ``schedule:<name>@<tick>``; a job
        from the admin's "run now" is scheduled for when it was enqueued.
        """
        key = self.user_key
        if not key or not key.startswith("schedule:") or "@" not in key:
            return None
        tick = key.rpartition("@")[2]
        if tick == "run-now":
            return self.created_at
        try:
            return dt.datetime.fromisoformat(tick)
        except ValueError:
            return None

    @property
    def parent_results(self) -> dict[str, Any]:
        """The stored results of the jobs this job waits for, by step name (workflows).

        In the order the steps were enqueued (a chord's callback gets its group's
        results in group order); a parent that ended dead or cancelled (a step that
        runs anyway) is missing. Read once, on first use.
        """
        if self._parents is None:
            reader = parent_results_reader
            self._parents = {} if reader is None else reader(self)
        return self._parents

    def results_arguments(self) -> list[Any]:
        """What this job receives first when it takes its parents' results (workflows).

        ``[result]`` for a step waiting for one step; ``[[result, ...]]`` (in parent
        order) for one waiting for several, or collecting (a chord's callback, a step
        after a group: ``[[]]`` after an empty one); for a ``link_error`` step,
        ``[StepFailure]``, the failed step's job id, error and traceback; ``[]`` for a
        job that waits for nothing. A parent that ended dead or cancelled (a step with
        on_failure "run") gives None. Read on every call.
        """
        if results_arguments_reader is None:
            raise RuntimeError("results_arguments() needs django_pgqueue.workflows (import it).")
        return results_arguments_reader(self)

    @property
    def batch(self) -> Any:
        """The counts of the batch this job is in, read now (`django_pgqueue.batch_status`).

        A callback sees the final counts; BatchNotFound when the job is in no batch.
        """
        if batch_reader is None:
            raise RuntimeError("ctx.batch needs django_pgqueue.workflows (import it).")
        return batch_reader(self)

    @property
    def is_last_attempt(self) -> bool:
        return self.attempt >= self.max_attempts

    def lease_lost(self) -> bool:
        """True once this worker may no longer own the job (renewal failed or overdue)."""
        return self._lease is not None and not self._lease.held()

    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this running job (seen at a lease renewal).

        A handler that sees it should stop: whatever it returns or raises, the job ends
        cancelled and is not retried.
        """
        return self._lease is not None and self._lease.cancel_requested

    def __repr__(self) -> str:
        return (
            f"<JobContext {self.type} #{self.job_id} queue={self.queue} "
            f"attempt={self.attempt}/{self.max_attempts} lease_version={self.lease_version}>"
        )
