"""Batches: the jobs enqueued in a ``with batch(...)`` block, and callbacks when all end.

Every job that `enqueue`, `enqueue_many` or a Tasks ``.enqueue`` writes inside the
block joins the batch (gathered through `enqueue_scope.enqueue_listener`: outside a block
enqueue pays one ContextVar read). The block is a ``transaction.atomic`` on the
batch's database: its members, the batch and its callbacks commit together with the
caller's transaction, or not at all, and no member can run before the batch exists.

The callbacks are written when the block closes, as the steps of a workflow that
wait for every member, so the fenced statements that end a member settle them in
that member's transaction, under the step rows' lock (``pgqueue_settle``): each
fires once, when the last member finished (completed, dead or cancelled).

- ``on_finish`` (on_failure "run"): always, once every member finished;
- ``on_success`` (on_failure "cancel"): only if every member completed; cancelled,
  saying which member failed, as soon as one ends dead or cancelled;
- ``on_discard`` (on_failure "error"): only if some member ended dead or cancelled,
  once every member finished; skipped (cancelled, saying so) otherwise.

A callback reads the counts with `batch_status` (``batch_status(ctx)``).
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import transaction

from .. import extensions, validation
from ..aenqueue import aatomic, call_sync
from ..conf import get_settings
from ..enqueue_scope import EnqueueListener, enqueue_listener
from ..exceptions import BatchNotFound, EnqueueError, PayloadError
from ..job_refs import carried_database, job_reference
from ..store import batches as store
from ..store import workflows as workflow_store
from .steps import Step, _is_task, step

# Each callback's step name and failure policy (see the module's docstring).
EVENTS = {"on_success": "cancel", "on_finish": "run", "on_discard": "error"}
FINISHED = ("completed", "dead", "cancelled")

# The batch whose block is open in this context (batches do not nest).
_open: ContextVar[BatchRun | None] = ContextVar("pgqueue_open_batch", default=None)


@dataclass
class BatchRun:
    """A batch being filled (inside its block), then closed: its id and members."""

    name: str
    using: str
    id: int | None = None
    jobs: list[int] = field(default_factory=list)
    callbacks: dict[str, int] = field(default_factory=dict)

    def status(self) -> BatchStatus:
        """The batch's counts now (after its block closed)."""
        if self.id is None:
            raise EnqueueError(f"batch {self.name!r} is still open: it has no status yet.")
        return batch_status(self.id, using=self.using)


@dataclass(frozen=True)
class BatchStatus:
    """A batch's members counted by status, and its callbacks' jobs and statuses."""

    id: int
    name: str
    size: int
    created_at: dt.datetime
    counts: dict[str, int]
    callbacks: dict[str, tuple[int, str]]

    def _count(self, status: str) -> int:
        return self.counts.get(status, 0)

    @property
    def completed(self) -> int:
        """Members that completed (a retried one that finally succeeded too)."""
        return self._count("completed")

    @property
    def dead(self) -> int:
        """Members that ended dead."""
        return self._count("dead")

    @property
    def cancelled(self) -> int:
        """Members that ended cancelled."""
        return self._count("cancelled")

    @property
    def unfinished(self) -> int:
        """Members waiting, pending or running."""
        return sum(n for status, n in self.counts.items() if status not in FINISHED)

    @property
    def finished(self) -> bool:
        """Whether every member has finished (an empty batch has)."""
        return self.unfinished == 0

    @property
    def succeeded(self) -> bool:
        """Whether every member completed."""
        return self.finished and self.dead == 0 and self.cancelled == 0

    @property
    def state(self) -> str:
        """ "running", "succeeded", or "discarded" (finished with a dead or cancelled member)."""
        if not self.finished:
            return "running"
        return "succeeded" if self.succeeded else "discarded"

    def as_dict(self) -> dict[str, Any]:
        """The counts as a JSON-ready dict (for a log line or a result)."""
        return {
            "id": self.id,
            "name": self.name,
            "size": self.size,
            "completed": self.completed,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "unfinished": self.unfinished,
            "state": self.state,
        }


def _callback(batch_name: str, event: str, target: Any) -> Step:
    """`target` as the callback step of `event`, its failure policy the event's."""
    if isinstance(target, Step):
        made = target
    elif isinstance(target, tuple) and len(target) == 2 and isinstance(target[0], str):
        made = step(target[0], target[1])
    elif isinstance(target, str) or _is_task(target):
        made = step(target)
    else:
        raise EnqueueError(
            f"batch {batch_name!r}, {event}: a callback is a Step, a job type, a "
            f"(type, payload) pair or a @task, got {type(target).__name__}."
        )
    return replace(made, name=event, on_failure=EVENTS[event])


@contextmanager
def batch(
    *,
    on_success: Any = None,
    on_finish: Any = None,
    on_discard: Any = None,
    name: str = "batch",
    using: str | None = None,
) -> Iterator[BatchRun]:
    """Gather the jobs enqueued in the block into a batch; fire its callbacks once all end.

    Callbacks are validated on entry, before anything is written: a bad one raises
    EnqueueError naming it. The block is atomic with the caller's transaction. A
    job enqueued on another database than the batch's is refused before it is written,
    ``on_commit=True`` or not (it could not commit with the batch). An empty batch is
    finished when its block closes: its ``on_success`` and ``on_finish`` are due at
    once (``on_discard`` is never written).
    """
    run, rows, listener = _opening(on_success, on_finish, on_discard, name, using)
    with transaction.atomic(using=run.using), _gathering(run, listener):
        yield run
    _close(run, rows)


@asynccontextmanager
async def abatch(**options: Any) -> AsyncIterator[BatchRun]:
    """`batch` for async code: ``async with abatch(...) as run:``.

    The jobs `aenqueue`, `aenqueue_many` or a task's ``aenqueue`` write in the block
    join the batch; the block is an `aatomic` block, atomic with the caller's.
    """
    arguments = inspect.signature(batch).bind(**options)
    arguments.apply_defaults()
    run, rows, listener = _opening(**arguments.arguments)
    # Each awaited enqueue runs in a copy of this context: it sees the listener.
    async with aatomic(using=run.using):
        with _gathering(run, listener):
            yield run
        await call_sync(_close, run, rows)


# Its arguments are batch()'s: help() and the docs name them.
abatch.__signature__ = inspect.signature(batch).replace(  # type: ignore[attr-defined]
    return_annotation="AsyncIterator[BatchRun]"
)


@contextmanager
def _gathering(run: BatchRun, listener: EnqueueListener) -> Iterator[None]:
    """Make `run` the open batch and `listener` the enqueue listener of this context."""
    opened, listening = _open.set(run), enqueue_listener.set(listener)
    try:
        yield
    finally:
        enqueue_listener.reset(listening)
        _open.reset(opened)


def _opening(
    on_success: Any, on_finish: Any, on_discard: Any, name: str, using: str | None
) -> tuple[BatchRun, list[tuple[Step, tuple[Any, ...]]], EnqueueListener]:
    """A batch about to open: its run, its callbacks validated (nothing written yet),
    and the listener that gathers the jobs enqueued in its block."""
    if not isinstance(name, str) or not name:
        raise EnqueueError(f"a batch's name must be a non-empty string, got {name!r}.")
    outer = _open.get()
    if outer is not None:
        raise EnqueueError(
            f"batch {name!r} is opened inside batch {outer.name!r}: batches do not nest "
            "(a job joins one batch); close the outer block first."
        )
    conf = get_settings()
    steps = [
        _callback(name, event, target)
        for event, target in (
            ("on_success", on_success),
            ("on_finish", on_finish),
            ("on_discard", on_discard),
        )
        if target is not None
    ]
    rows = []
    for made in steps:
        try:
            options = made.checked_options()
            validation.payloads([made.payload], conf.MAX_PAYLOAD_BYTES)
        except PayloadError as exc:
            raise PayloadError(f"batch {name!r}, {made.name}: {exc}", exc.path) from exc
        except EnqueueError as exc:
            raise EnqueueError(f"batch {name!r}, {made.name}: {exc}") from exc
        rows.append((made, options))
    run = BatchRun(name, using or conf.DATABASE)
    # Enqueue refuses a job of another database before writing it: only this
    # database's jobs, written in the block's transaction, join.
    listener = EnqueueListener(f"batch {name!r}", run.using, run.jobs.extend)
    return run, rows, listener


def _close(run: BatchRun, rows: list[tuple[Step, tuple[Any, ...]]]) -> None:
    """Write the batch, its members and its callbacks (the block's transaction)."""
    run.id, members = store.insert_batch(run.using, run.name, run.jobs)
    run.jobs = members
    # An empty batch has nothing to discard: its on_discard would be skipped at once.
    due = [(made, options) for made, options in rows if members or made.name != "on_discard"]
    if not due:
        return
    steps = [
        workflow_store.StepRow(*options, made.name, made.on_failure, len(members))
        for made, options in due
    ]
    text = validation.payloads([made.payload for made, _ in due], get_settings().MAX_PAYLOAD_BYTES)
    traceparent = extensions.enqueue_columns().get("traceparent")
    workflow_id, job_ids = workflow_store.insert_workflow(
        run.using, run.name, steps, text, [], traceparent
    )
    store.link_batch(run.using, run.id, workflow_id, job_ids, members)
    run.callbacks = {made.name: job_id for (made, _), job_id in zip(due, job_ids, strict=True)}


def batch_status(batch: Any, *, using: str | None = None) -> BatchStatus:
    """A batch's counts, from its id, its `BatchRun`, or the context of one of its jobs.

    A context is a `JobContext` or a Django ``TaskContext`` of a member or a callback
    (``batch_status(ctx)`` in a callback reads the final counts). BatchNotFound when
    there is no such batch, or the job is in none. A `BatchRun` and a context are read
    on their database; a bare batch id on PGQUEUE["DATABASE"], or `using`.
    """
    alias = using or get_settings().DATABASE
    if isinstance(batch, BatchRun):
        batch_id: int | None = batch.id
        alias = carried_database(batch.using, using, f"batch #{batch.id}", "batch_status()")
    elif hasattr(batch, "task_result") or hasattr(batch, "job_id"):
        job = job_reference(batch, using, caller="batch_status()")
        alias = job.database
        batch_id = store.find_batch(alias, job.id)
        if batch_id is None:
            raise BatchNotFound(f"job {job} is in no batch.")
    else:
        batch_id = int(batch)
    row = store.batch_status(alias, batch_id) if batch_id is not None else None
    if row is None:
        raise BatchNotFound(f"no batch {batch_id}.")
    batch_id, name, size, created_at, counts, callbacks = row
    return BatchStatus(
        int(batch_id),
        name,
        int(size),
        created_at,
        {status: int(n) for status, n in counts.items()},
        {event: (int(job_id), status) for event, job_id, status in callbacks},
    )
