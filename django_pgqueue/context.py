"""What a handler receives: the job, its attempt, and whether its lease is still held;
and whether the running coroutine is a worker's async handler."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import InitVar, dataclass, field
from typing import Any

from asgiref.sync import sync_to_async

# Reads the stored results of the jobs a job waits for, by step name: set by the
# workflows feature when it is imported (this module knows no database).
parent_results_reader: Callable[[Any], dict[str, Any]] | None = None
# Reads the counts of the batch a job is in (the workflows feature sets it too).
batch_reader: Callable[[Any], Any] | None = None
# Reads what a step that takes its parents' results receives before its own arguments
# (the workflows feature sets it too).
results_arguments_reader: Callable[[Any], list[Any]] | None = None
# Makes the durable run of a job (its steps, sleeps and event waits): set by
# django_pgqueue.durable when imported (the package's __init__ imports it).
durable_run_factory: Callable[[Any], Any] | None = None

# The job whose async handler runs in this context (set by the executor around the
# handler's coroutine, in the job's own task), else None. The worker's async handlers
# share one thread for Django's thread-sensitive calls, and so one connection:
# `aatomic` refuses to hold a transaction open across awaits there.
async_handler_job: ContextVar[int | None] = ContextVar("pgqueue_async_handler_job", default=None)

# The job whose handler runs in this context (set by the executor around each call).
running_job: ContextVar[JobContext | None] = ContextVar("pgqueuerunning_job", default=None)


def current_job() -> JobContext:
    """The `JobContext` of the job whose handler is running here: for code that is not
    handed one, like a Django ``@task`` (``current_job().step(...)``).

    RuntimeError outside a worker's handler.
    """
    ctx = running_job.get()
    if ctx is None:
        raise RuntimeError("current_job() is only known inside a worker's handler")
    return ctx


async def _in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a durable call's database work on Django's thread for sync calls."""
    return await sync_to_async(func)(*args, **kwargs)


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
    # The attempt's row (queue_attempts.id); None outside a worker.
    attempt_id: int | None = None
    # The worker's lease on the job (None outside a worker): private, read through
    # lease_lost() and cancel_requested().
    lease: InitVar[Lease | None] = None
    _lease: Lease | None = field(init=False, default=None)
    _parents: dict[str, Any] | None = field(init=False, default=None)
    _durable: Any = field(init=False, default=None)
    # The outcome the handler wrote itself, in its own transaction (complete_atomically):
    # the worker has nothing left to write.
    committed: Any = field(init=False, default=None, repr=False)

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

    # -- durable execution (django_pgqueue.durable) ----------------------------------

    def _durable_run(self) -> Any:
        if self._durable is None:
            if durable_run_factory is None:
                raise RuntimeError("durable steps need django_pgqueue.durable (import it).")
            self._durable = durable_run_factory(self)
        return self._durable

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job and return its result as JSON.

        The result is stored as the step's checkpoint under the job's lease; a later run
        of the handler (a retry, a resumption after a crash, a sleep or an event) gets
        the stored result back without calling `fn`. A step that raised runs again.
        """
        return self._durable_run().step(name, fn, *args, **kwargs)

    def atomic_step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step`, with `fn` run inside ``transaction.atomic()`` on the job's database and
        its checkpoint inserted in that transaction under the lease: its database writes
        and its checkpoint commit together, once, or not at all."""
        return self._durable_run().atomic_step(name, fn, *args, **kwargs)

    def sleep(self, name: str, duration: dt.timedelta | float) -> None:
        """Sleep durably: give the job back until `duration` after the first time this
        step ran, holding no thread, slot or lease, then run the handler again."""
        self._durable_run().sleep(name, duration)

    def sleep_until(self, name: str, when: dt.datetime) -> None:
        """Sleep durably until `when` (an aware datetime), like `sleep`."""
        self._durable_run().sleep_until(name, when)

    def wait_for_event(
        self, key: str, *, timeout: dt.timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """The payload of the event `key` (`django_pgqueue.emit_event`), waiting durably
        for it: the job waits, in no claim index, until it is emitted or `timeout`
        passes (`EventTimeout`). The step is `name`, ``"event:<key>"`` by default."""
        return self._durable_run().wait_for_event(key, timeout=timeout, name=name)

    async def astep(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`step` in an async handler: `fn` may be a coroutine function."""
        return await self._durable_run().astep(name, fn, *args, **kwargs)

    async def aatomic_step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """`atomic_step` in an async handler: `fn` (sync) and its transaction run whole in
        a thread (a transaction is never held across an await)."""
        return await _in_thread(self._durable_run().atomic_step, name, fn, *args, **kwargs)

    async def asleep(self, name: str, duration: dt.timedelta | float) -> None:
        """`sleep` in an async handler."""
        await _in_thread(self._durable_run().sleep, name, duration)

    async def await_event(
        self, key: str, *, timeout: dt.timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """`wait_for_event` in an async handler."""
        run = self._durable_run()
        return await _in_thread(run.wait_for_event, key, timeout=timeout, name=name)

    def patched(self, name: str) -> bool:
        """Whether this run takes the new path of a change named `name` (versioning).

        True for a run that reaches this point for the first time at the end of its
        history (a new run, or one whose earlier runs stopped before here); False for a
        run replaying checkpoints that code without the change wrote past this point.
        Recorded as the step ``"patch:<name>"``: every later run of the job decides the
        same. Once no run that started before the change is left, drop the old path.
        """
        return self._durable_run().patched(name)

    def complete_atomically(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` inside ``transaction.atomic()`` on the job's database
        and complete the job in that same transaction, fenced by its lease, with `fn`'s
        result: its writes and the job's completion commit together, once. Call it last
        (and return what it returns): the job is completed when it returns."""
        return self._durable_run().complete_atomically(fn, *args, **kwargs)

    async def acomplete_atomically(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """`complete_atomically` in an async handler: `fn` (sync) and the transaction run
        whole in a thread."""
        return await _in_thread(self._durable_run().complete_atomically, fn, *args, **kwargs)

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
