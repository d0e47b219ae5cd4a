"""The seams features plug into, and the extensions that use them.

A feature is an `Extension`, named by its dotted path in ``PGQUEUE["EXTENSIONS"]``
(queue control, schedules and observability by default). It may give:

- columns of a job, filled at enqueue from the caller's context (`enqueue_columns`:
  observability stores the enqueuing span's trace);
- job-event observers (`JobObserver`): told what became of the jobs a worker claimed
  (the core's Django signals are one; observability's per-minute rollup another);
- run middleware (`RunMiddleware`): around each attempt's run (observability's span;
  the core's ``job_started`` signal);
- periodic services (`PeriodicService`): work a worker does now and then on a
  connection of the services' own (schedules fire their ticks, observability keeps the
  worker registry, the core keeps the hot indexes small, queue control writes
  ``PGQUEUE["QUEUES"]`` at start).

The claim is no seam: the store owns it, by a strategy per queue (the plain claim, or
the controlled one for a queue with controls or keyed jobs: `store.claims`).

What a part may do: observe, and add work of its own (its own statements on the
session it is given, jobs of its own). What it may not: decide who owns a job (leases
do: every write about a claimed job is one of the core's fenced statements); raise into
the worker (each part guards its own failures: the worker logs what escapes and goes
on); block the dispatcher or a handler on slow work (observers run on the dispatcher
thread between two claims; slow work belongs in a service or a job of its own).

A feature left out of ``PGQUEUE["EXTENSIONS"]`` is not needed for anything else to
work; what would need it (schedules declared, ``PGQUEUE["QUEUES"]`` set) is refused at
start by a system check that says so (`checks.py`).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from django.utils.module_loading import import_string

from .claimed import ClaimedJob
from .conf import get_settings
from .exceptions import ConfigurationError
from .outcomes import Failure, Outcome
from .store.session import Session
from .worker_config import WorkerConfig

# What runs an attempt: the executor's ``run(ctx, handler, policy)``.
Runner = Callable[..., Outcome]
# What runs an async handler's attempt: the executor's ``arun(ctx, handler, policy)``.
AsyncRunner = Callable[..., Awaitable[Outcome]]


@dataclass(frozen=True, slots=True)
class JobEnd:
    """What became of a claimed job once its outcome was written.

    `end` is "completed", "retried", "dead", "cancelled", "snoozed" or "interrupted";
    `result` the stored result's JSON (completed), `failure` what failed (the others),
    `run_at` when a retried job is due again.
    """

    item: ClaimedJob
    end: str
    result: str | None = None
    failure: Failure | None = None
    run_at: Any = None

    @property
    def outcome(self) -> str:
        """The attempt's outcome as the counters and the rollup name it: succeeded,
        retried (an interruption too: due again at once), dead, cancelled, snoozed."""
        return ATTEMPT_OUTCOMES[self.end]


# The attempt's outcome of each end of a job.
ATTEMPT_OUTCOMES = {
    "completed": "succeeded",
    "retried": "retried",
    "interrupted": "retried",
    "dead": "dead",
    "cancelled": "cancelled",
    "snoozed": "snoozed",
}


class JobObserver:
    """Told what became of the jobs a worker claimed; override what it needs.

    Every method is called on the dispatcher thread, in batches where it can: keep them
    short (a counter, a buffer; no statement).
    """

    def jobs_claimed(self, items: Sequence[ClaimedJob]) -> None:
        """`items` were claimed and handed to the handlers."""

    def jobs_released(self, items: Sequence[ClaimedJob]) -> None:
        """`items` were handed back unstarted (their attempts given back)."""

    def jobs_executed(self, items: Sequence[ClaimedJob]) -> None:
        """The handlers of `items` ended (each `runtime` is set)."""

    def jobs_ended(self, ends: Sequence[JobEnd]) -> None:
        """The outcomes of these jobs were written."""

    def lease_lost(self, item: ClaimedJob, detected_by: str) -> None:
        """`item`'s lease was found lost, by a "renewal" or a fenced "write": another
        worker may own the job. Told once per attempt."""


class RunMiddleware:
    """Around each attempt's run: call ``run(item.ctx, item.handler, item.policy)`` once
    and return its outcome (with a span around it, a signal before it)."""

    def run(self, item: ClaimedJob, run: Runner) -> Outcome:
        """The sync handler's attempt, on its handler thread."""
        return run(item.ctx, item.handler, item.policy)

    async def arun(self, item: ClaimedJob, run: AsyncRunner) -> Outcome:
        """The async handler's attempt, on the worker's event loop: never block it."""
        return await run(item.ctx, item.handler, item.policy)


class WorkerView(Protocol):
    """What a service may know of the worker it runs in."""

    config: WorkerConfig
    # The id of the supervisor whose child the worker is (`run_queue_worker
    # --processes`), or None.
    supervisor: str | None

    def running(self) -> int:
        """How many jobs the worker holds now (their leases)."""
        ...

    def inspect(self) -> dict[str, Any]:
        """The worker's account of itself now, as plain JSON data: its jobs, queues,
        handlers, counters, memory and code (`worker.inspection.report`)."""
        ...

    def obey(self, action: str, concurrency: int | None = None) -> str:
        """Do what an operator asked: "stop", "drain", "resume" or "concurrency" (with
        `concurrency`); what was done, in words. ValueError for what it cannot do."""
        ...


class PeriodicService:
    """Work a worker does now and then, on a session of the services' own.

    The worker calls `start` once, then `run` whenever `next_due` (time.monotonic()) has
    come, and `stop` as it shuts down; all on the services' thread, or on a thread and
    session of its own when `runs_long` (a rebuild that takes minutes must not hold the
    others up). A lost connection (`DatabaseUnavailable`) may leave any of them: the
    session reconnects before the next call. Anything else a service raises is logged
    and the service is called again at its next due time.
    """

    name = "service"
    runs_long = False

    def start(self, session: Session) -> None:
        """Before the first pass."""

    def next_due(self) -> float:
        """time.monotonic() at which `run` is due next (inf: never again)."""
        return math.inf

    def run(self, session: Session, now: float) -> None:
        """Do the work that is due at `now`."""

    def stop(self, session: Session) -> None:
        """The worker stops (the session may be out of reach: then nothing is written)."""


# The columns of queue_jobs a feature may fill at enqueue (both enqueue statements
# write them); the others are the core's, validated before anything is written.
ENQUEUE_COLUMNS = frozenset({"traceparent"})


@dataclass(frozen=True)
class WorkerParts:
    """What a feature (or the core) adds to one worker: job-event observers, run
    middleware (the first listed runs outermost) and periodic services."""

    observers: tuple[JobObserver, ...] = ()
    middleware: tuple[RunMiddleware, ...] = ()
    services: tuple[PeriodicService, ...] = ()

    def __add__(self, other: WorkerParts) -> WorkerParts:
        return WorkerParts(
            (*self.observers, *other.observers),
            (*self.middleware, *other.middleware),
            (*self.services, *other.services),
        )


class Extension:
    """A feature: what it adds to enqueue and to each worker."""

    def enqueue_columns(self) -> Mapping[str, Any]:
        """Columns of ``queue_jobs`` this feature fills at enqueue (the caller's thread),
        among `ENQUEUE_COLUMNS`."""
        return {}

    def worker_parts(self, config: WorkerConfig, view: WorkerView) -> WorkerParts:
        """This feature's observers, middleware and services in one worker."""
        return WorkerParts()


def _overrides(obj: object, name: str, base: type) -> bool:
    return getattr(type(obj), name) is not getattr(base, name)


class _Loaded:
    """The extensions of one value of the setting, and those that fill enqueue columns."""

    def __init__(self, paths: tuple[str, ...]) -> None:
        self.paths = paths
        self.extensions = tuple(_load(path) for path in paths)
        self.enqueue = [
            e.enqueue_columns
            for e in self.extensions
            if _overrides(e, "enqueue_columns", Extension)
        ]


_loaded: _Loaded | None = None


def _current() -> _Loaded:
    global _loaded
    paths = get_settings().EXTENSIONS
    if _loaded is None or _loaded.paths is not paths:
        _loaded = _Loaded(paths)
    return _loaded


def installed() -> tuple[Extension, ...]:
    """The extensions PGQUEUE["EXTENSIONS"] names, loaded once per value of the setting."""
    return _current().extensions


def _load(path: str) -> Extension:
    try:
        found = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"PGQUEUE['EXTENSIONS'] names {path!r}, which cannot be imported: {exc}"
        ) from exc
    extension = found() if isinstance(found, type) else found
    if not isinstance(extension, Extension):
        raise ConfigurationError(
            f"PGQUEUE['EXTENSIONS'] names {path!r}, which is not an Extension "
            "(django_pgqueue.extensions.Extension)."
        )
    return extension


def enqueue_columns() -> dict[str, Any]:
    """The job columns the extensions fill for an enqueue made now."""
    columns: dict[str, Any] = {}
    for fill in _current().enqueue:
        columns.update(fill())
    if not columns.keys() <= ENQUEUE_COLUMNS:
        raise ConfigurationError(
            f"An extension fills {sorted(columns.keys() - ENQUEUE_COLUMNS)} at enqueue; "
            f"the columns it may fill are {sorted(ENQUEUE_COLUMNS)}."
        )
    return columns


def worker_parts(
    config: WorkerConfig, view: WorkerView, extensions: Sequence[Extension] | None = None
) -> WorkerParts:
    """The parts the installed extensions (or `extensions`) add to a worker, in order."""
    parts = WorkerParts()
    for extension in installed() if extensions is None else extensions:
        parts += extension.worker_parts(config, view)
    return parts
