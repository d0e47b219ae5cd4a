"""What enqueue() and enqueue_many() take and return: `JobSpec`, their keyword options
(`JobDefaults`, `JobOptions`) and `EnqueuedJob`, the job as enqueue() left it.

`django_pgqueue.enqueue` re-exports them; import them from there or from the package.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from . import waiting
from .sequences import OnFailure
from .unique import Unique


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """A job as enqueue() left it. `created` is False when an idempotency or unique key
    matched (`replaced` True when the holder took the new payload and due time).

    `created_at` is the job's database timestamp (the enqueuing transaction's start);
    enqueue() fills it, enqueue_many() leaves it None. `database`: the alias it was
    written on, where every API given this object reads it (None: its queue's).
    """

    id: int
    queue: str
    type: str
    created: bool = True
    created_at: dt.datetime | None = None
    database: str | None = None
    # A unique key's pending holder took this enqueue's payload and due time.
    replaced: bool = False

    def wait(self, timeout: float | None = None) -> Any:
        """Wait for this job's result on its database: `django_pgqueue.wait`."""
        return waiting.wait(self, timeout)

    async def wait_async(self, timeout: float | None = None) -> Any:
        """Await this job's result on its database: `django_pgqueue.await_job`."""
        return await waiting.await_job(self, timeout)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for enqueue_many(); None fields take the call's (then the settings') defaults.

    `idempotency_key`, `concurrency_key`, `fairness_key`, `sequence` and
    `sequence_on_failure` work as in enqueue() (the call has none); the jobs of one
    sequence in one call run in list order.
    """

    type: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    fairness_key: str | None = None
    sequence: str | None = None
    sequence_on_failure: OnFailure = "hold"


class JobDefaults(TypedDict, total=False):
    """The keyword options enqueue_many() applies to the items that leave them unset."""

    using: str | None
    queue: str | None
    priority: int | None
    run_at: dt.datetime | None
    delay: float | dt.timedelta | None
    max_attempts: int | None


class JobOptions(JobDefaults, total=False):
    """enqueue()'s keyword options, but `on_commit` (which decides what it returns)."""

    idempotency_key: str | None
    concurrency_key: str | None
    unique: Unique | None
    fairness_key: str | None
    sequence: str | None
    sequence_on_failure: OnFailure


_SLOTS = [getattr(EnqueuedJob, field.name).__set__ for field in fields(EnqueuedJob)]


def enqueued_job(
    job_id: int,
    queue: str,
    type_: str,
    created: bool,
    created_at: dt.datetime | None,
    alias: str,
    replaced: bool,
) -> EnqueuedJob:
    """EnqueuedJob(job_id, queue, type_, created, created_at, alias, replaced), set through
    the frozen class's slots: its __init__ goes through object.__setattr__ per field,
    1.5 of enqueue()'s ~8 µs of Python and half the time of a 20,000-job call's results
    (10 of 160 ms)."""
    set_id, set_queue, set_type, set_created, set_created_at, set_database, set_replaced = _SLOTS
    job = EnqueuedJob.__new__(EnqueuedJob)
    set_id(job, job_id)
    set_queue(job, queue)
    set_type(job, type_)
    set_created(job, created)
    set_created_at(job, created_at)
    set_database(job, alias)
    set_replaced(job, replaced)
    return job
