"""Helpers for a project's tests: run due jobs, build a handler's context, fire a tick.

A worker reads jobs on its own connections, so it sees only committed ones: jobs
enqueued inside a ``TestCase`` (whose test runs in a transaction that is rolled back)
are invisible to it. Tests that run jobs use ``TransactionTestCase`` or, with
pytest-django, ``@pytest.mark.django_db(transaction=True)``, then call
:func:`run_due_jobs`. :func:`make_context` builds the `JobContext` a handler receives,
so a handler can be called directly in any test; :func:`fire_tick` enqueues the job a
schedule's tick would; :func:`run_durable` runs a durable job to its end, its sleeps
due at once and the test's events delivered.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from django.db import connections, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from django_pgqueue import validation
from django_pgqueue.conf import get_settings
from django_pgqueue.context import JobContext, Lease
from django_pgqueue.durable import emit_event
from django_pgqueue.enqueue import EnqueuedJob
from django_pgqueue.models import FINISHED_STATUSES, Attempt, EventWait, JobState, JobStep, Schedule
from django_pgqueue.registry import registry
from django_pgqueue.schedules.firing import tick_key
from django_pgqueue.schedules.operations import enqueue_scheduled
from django_pgqueue.schedules.spec import ScheduleSpec, code_schedules
from django_pgqueue.schedules.ticks import Ticks
from django_pgqueue.store import durable as durable_store
from django_pgqueue.store.operator import clock_ago
from django_pgqueue.worker import Worker
from django_pgqueue.worker_config import queues_by_database


def run_due_jobs(queues: Iterable[str] | None = None, **options: Any) -> Counter[str]:
    """Run every due job of `queues` (default: every queue with a pending job, on every
    queue database) with burst workers, until none is due; return their counts.

    Jobs enqueued by the handlers and due at once run too, in the same call: a
    workflow's next step, a batch's callback, a job a handler enqueues, in the queues
    given, or in any queue when `queues` is None. A job scheduled for later (a retry's
    backoff, a future ``run_at``) is left pending. Each queue database is worked by a
    worker of its own, in turn, and again while the handlers enqueued jobs that are due
    in a queue (or on a database) already worked. `options` are
    those of :class:`~django_pgqueue.worker.Worker` (``concurrency``, ``lease``, ...).
    """
    conf = get_settings()
    aliases = conf.queue_databases
    for alias in aliases:
        if connections[alias].in_atomic_block:
            raise RuntimeError(
                "run_due_jobs() was called inside a transaction (a TestCase, or atomic()): "
                "the worker's own connections cannot see jobs enqueued in it. Use "
                "TransactionTestCase, or @pytest.mark.django_db(transaction=True)."
            )
    given = None if queues is None else list(dict.fromkeys(queues))
    options.setdefault("concurrency", 1)
    options.setdefault("poll_interval", 0.05)
    started = {alias: clock_ago(alias, 0) for alias in aliases}  # each database's now()
    total: Counter[str] = Counter()
    names = given if given is not None else _pending_queues(conf)
    while names:
        claimed = 0
        for mine in queues_by_database(names).values():
            worker = Worker(mine, install_signal_handlers=False, burst=True, **options)
            worker.run()
            total.update(worker.stats)
            claimed += worker.stats["claimed"]
        # Another round only for the jobs the handlers enqueued, or the jobs that ran
        # made due (a workflow's next step, a batch's callback), due now, in a queue or
        # on a database a worker of this round had done with: a retry of a job that ran
        # is left for later, as a burst worker leaves it.
        names = _follow_ups(conf, started, given) if claimed else []
    return total


def _follow_ups(conf: Any, since: dict[str, Any], queues: list[str] | None) -> list[str]:
    """The queues with a job due now, never run, that was enqueued after `since` (its
    database's clock) or waited for other jobs, of `queues` if given."""
    found = []
    for alias in conf.queue_databases:
        due = JobState.objects.using(alias).filter(
            Q(job__created_at__gte=since[alias]) | Q(job__dependencies__isnull=False),
            status="pending",
            run_at__lte=Now(),
            lease_version=0,
        )
        if queues is not None:
            due = due.filter(queue__in=queues)
        found += [
            queue
            for queue in due.order_by("queue").values_list("queue", flat=True).distinct()
            if conf.database_for(queue) == alias
        ]
    return found


def _pending_queues(conf: Any) -> list[str]:
    """Every queue with a pending job, on the queue database it lives on."""
    return [
        queue
        for alias in conf.queue_databases
        for queue in JobState.objects.using(alias)
        .filter(status="pending")
        .order_by("queue")
        .values_list("queue", flat=True)
        .distinct()
        if conf.database_for(queue) == alias
    ]


def _count(value: Any, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


def make_context(
    type: str,
    payload: Any = None,
    *,
    attempt: int = 1,
    max_attempts: int | None = None,
    scheduled_for: dt.datetime | None = None,
    job_id: int = 1,
    queue: str | None = None,
    priority: int = 0,
    idempotency_key: str | None = None,
    lease_lost: bool = False,
    cancel_requested: bool = False,
    parent_results: dict[str, Any] | None = None,
) -> JobContext:
    """The `JobContext` a worker would give the handler of `type`, for calling it directly.

    The payload goes through JSON as a stored job's does (a tuple arrives as a list; a
    value JSON cannot hold raises `PayloadError` naming it). `max_attempts` defaults to
    the handler's, then ``PGQUEUE["MAX_ATTEMPTS"]``; `queue` to
    ``PGQUEUE["DEFAULT_QUEUE"]``. `scheduled_for` (an aware datetime) makes the job a
    schedule's, as ``ctx.scheduled_for`` reads it. `lease_lost` and `cancel_requested`
    make ``ctx.lease_lost()`` and ``ctx.cancel_requested()`` return True.
    `parent_results` is what ``ctx.parent_results`` gives a workflow step: the results
    of the steps it waited for, by step name (each goes through JSON too); none by
    default.
    """
    conf = get_settings()
    type_ = validation.type_name(type)
    stored = json.loads(validation.payload(payload, None))
    attempt = _count(attempt, "attempt", 1)
    if max_attempts is None:
        registry.autodiscover()
        spec = registry.find(type_)
        max_attempts = spec.max_attempts if spec and spec.max_attempts else conf.MAX_ATTEMPTS
    max_attempts = _count(max_attempts, "max_attempts", attempt)
    job_id = _count(job_id, "job_id", 1)
    key = validation.idempotency_key(idempotency_key)
    if scheduled_for is not None:
        if key is not None:
            raise ValueError("give scheduled_for or idempotency_key, not both")
        if not isinstance(scheduled_for, dt.datetime) or timezone.is_naive(scheduled_for):
            raise ValueError(f"scheduled_for must be an aware datetime, got {scheduled_for!r}")
        key = tick_key(type_, scheduled_for)
    if parent_results is not None and not isinstance(parent_results, dict):
        raise ValueError(f"parent_results must be a dict of step names, got {parent_results!r}")
    parents = {} if parent_results is None else json.loads(validation.payload(parent_results, None))
    lease = Lease(job_id, attempt, time.monotonic() + 365 * 86400.0)
    lease.lost = lease_lost
    lease.cancel_requested = cancel_requested
    ctx = JobContext(
        job_id=job_id,
        queue=validation.queue_name(queue or conf.DEFAULT_QUEUE),
        type=type_,
        payload=stored,
        attempt=attempt,
        max_attempts=max_attempts,
        lease_version=attempt,
        priority=validation.priority(priority),
        worker_id="test",
        created_at=timezone.now(),
        user_key=key,
        lease=lease,
    )
    # What ctx.parent_results gives, instead of a read of the (made up) job's parents.
    ctx._parents = parents
    return ctx


# A schedule row's columns that make its spec (its catch_up plays no part in one tick).
_SPEC_COLUMNS = [f.name for f in fields(ScheduleSpec) if f.name not in ("catch_up", "origin")]


def _find_schedule(name: str, alias: str) -> ScheduleSpec:
    declared = code_schedules()
    for spec in declared.specs:
        if spec.name == name:
            return spec
    row = Schedule.objects.using(alias).filter(name=name).first()
    if row is not None:
        return ScheduleSpec(**{column: getattr(row, column) for column in _SPEC_COLUMNS})
    known = sorted({spec.name for spec in declared.specs})
    raise LookupError(f"no schedule named {name!r}; the code declares {known}")


def fire_tick(name: str, at: dt.datetime | None = None, *, using: str | None = None) -> EnqueuedJob:
    """Enqueue the job schedule `name`'s tick at `at` would (default: its latest tick).

    The job is the one a worker fires: the schedule's type, payload, queue, priority
    and max_attempts, keyed by the tick, so its handler's ``ctx.scheduled_for`` is
    `at`. The schedule itself is not moved and no tick is recorded. `at` must be one of
    the schedule's ticks (an aware datetime); firing the same tick again while its job
    is pending or running returns that job (``created=False``). Run it with
    :func:`run_due_jobs`, or wait for it with ``job.wait()``.
    """
    alias = using or get_settings().DATABASE
    spec = _find_schedule(name, alias)
    ticks: Ticks = spec.ticks()
    if at is None:
        at = ticks.at_or_before(timezone.now())
    elif not isinstance(at, dt.datetime) or timezone.is_naive(at):
        raise ValueError(f"at must be an aware datetime, got {at!r}")
    elif ticks.at_or_before(at) != at:
        before, after = ticks.at_or_before(at), ticks.after(at)
        raise ValueError(
            f"{at.isoformat()} is not a tick of schedule {name!r}; the ticks around it are "
            f"{before.isoformat()} and {after.isoformat()}"
        )
    return enqueue_scheduled(spec, tick_key(spec.name, at), alias)


@dataclass(frozen=True)
class DurableStep:
    """One checkpoint of a durable job: its step's name, kind and stored result."""

    name: str
    kind: str
    result: Any


@dataclass(frozen=True)
class DurableOutcome:
    """What `run_durable` ran: the job's status, its result (completed) and its steps
    in the order they were recorded."""

    status: str
    result: Any
    steps: list[DurableStep]

    def step(self, name: str) -> DurableStep:
        """The step called `name` (KeyError if the job has none)."""
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"no step {name!r}; the job's steps are {[s.name for s in self.steps]}")


def run_durable(
    job: EnqueuedJob,
    events: Mapping[str, Any] | None = None,
    *,
    time_out_waits: bool = False,
    max_runs: int = 100,
) -> DurableOutcome:
    """Run a durable job to its end with burst workers, on the real database.

    `events` ({key: payload}) are emitted first, so each wait for one gets it; its
    sleeps come due at once (their recorded wake-up is moved to now(), the database's
    clock is left alone); a wait for an event not given times out when
    `time_out_waits`, else LookupError says which key it waits for. A retry's backoff
    is not moved: a job still pending after `max_runs` runs raises RuntimeError. Needs
    committed jobs, like `run_due_jobs`.
    """
    alias = job.database or get_settings().DATABASE
    if events:
        with transaction.atomic(using=alias):
            for key, payload in events.items():
                emit_event(key, payload, using=alias)
    queue = JobState.objects.using(alias).values_list("queue", flat=True).get(pk=job.id)
    for _ in range(max_runs):
        run_due_jobs([queue])
        state = JobState.objects.using(alias).get(pk=job.id)
        if state.status in FINISHED_STATUSES:
            break
        if state.status == "waiting":
            wait = EventWait.objects.using(alias).filter(job_id=job.id).first()
            if wait is None or not time_out_waits:
                key = None if wait is None else wait.key
                raise LookupError(
                    f"job #{job.id} waits for the event {key!r}, which the test did not "
                    "give (events={...}); or pass time_out_waits=True"
                )
            durable_store.time_out_wait_now(alias, job.id)
        elif state.status == "pending":
            durable_store.sleeps_due_now(alias, job.id)
    else:
        raise RuntimeError(
            f"job #{job.id} did not end within {max_runs} runs (it is {state.status}, due "
            f"at {state.run_at})"
        )
    result = None
    if state.status == "completed":
        attempt = Attempt.objects.using(alias).filter(job_id=job.id, status="succeeded").last()
        result = None if attempt is None else attempt.result
    steps = JobStep.objects.using(alias).filter(job_id=job.id).order_by("recorded_at", "name")
    return DurableOutcome(
        state.status, result, [DurableStep(s.name, s.kind, s.result) for s in steps]
    )
