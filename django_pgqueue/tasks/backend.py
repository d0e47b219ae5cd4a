"""The Tasks backend: Django's ``@task`` API on top of the queue.

    TASKS = {
        "default": {
            "BACKEND": "django_pgqueue.backends.PgQueueBackend",
            "QUEUES": ["default", "payments", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 5, "TASKS": {"shop.tasks.charge": {"max_attempts": 8}}},
        }
    }

``task.enqueue(*args, **kwargs)`` becomes a job written by `django_pgqueue.enqueue` on
the caller's connection, with the same validation, transaction semantics and NOTIFY:
the job's type is the task's module path, its queue the task's ``queue_name``, its
priority the task's priority (the same -100..100 scale, higher first), its run_at the
task's ``run_after``, and its payload ``{"args": [...], "kwargs": {...}, "backend":
alias}``. `get_result` reads the job, its state and its attempts back into a
``TaskResult``. The worker runs these jobs through `django_pgqueue.tasks.runner`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import transaction

from .. import validation
from ..aenqueue import call_sync
from ..conf import get_settings
from ..enqueue import enqueue
from ..exceptions import ConfigurationError, EnqueueError
from ..job_refs import parse_result_id, result_id
from ..task_paths import import_task
from .api import (
    DEFAULT_TASK_QUEUE_NAME,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)
from .options import TaskOptions, parse_options
from .results import TaskCall, as_enqueued, build_result


class PgQueueBackend(BaseTaskBackend):
    """Run Django Tasks on the PostgreSQL queue: transactional, leased, fenced, retried."""

    supports_defer = True  # run_after becomes the job's run_at
    supports_async_task = True  # coroutine functions run on the worker's event loop
    supports_get_result = True  # from any process: results live in the queue tables
    supports_priority = True  # the queue's own priority, the same -100..100 scale

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        where = f"TASKS[{alias!r}]"
        for name in sorted(self.queues):
            try:
                validation.queue_name(name, f"{where}['QUEUES'] entry")
            except EnqueueError as exc:
                raise ConfigurationError(str(exc)) from None
        self._defaults, self._per_task = parse_options(self.options, f"{where}['OPTIONS']")

    # -- configuration -------------------------------------------------------------------

    def task_options(self, module_path: str) -> TaskOptions:
        """The retry options of the task at `module_path` (per task, then backend-wide)."""
        own = self._per_task.get(module_path)
        return own.over(self._defaults) if own is not None else self._defaults

    def has_time_limits(self) -> bool:
        """Whether a task of this backend has a hard time limit (its worker then runs
        under a supervisor)."""
        return any(options.time_limit is not None for options in self._per_task.values())

    def validate_task(self, task: Task) -> None:
        """Check a task as Django does, then as the queue will (queue name, schedule)."""
        # Django compares the priority with its bounds without checking its type first:
        # a str priority would surface as a bare TypeError about '<'.
        if isinstance(task.priority, bool) or not isinstance(task.priority, int):
            raise InvalidTask(
                f"priority must be an integer, got {type(task.priority).__name__} "
                f"{task.priority!r}."
            )
        super().validate_task(task)
        try:
            validation.queue_name(task.queue_name, "queue_name")
            validation.type_name(task.module_path)
            if task.run_after is not None:
                validation.schedule(task.run_after, None)
        except EnqueueError as exc:
            raise InvalidTask(str(exc)) from None

    def queue_for(self, task: Task, conf: Any) -> str:
        """The task's queue: its own queue_name, unless it left Django's default
        ("default") and a PGQUEUE["ROUTES"] entry matches its module path."""
        if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
            return task.queue_name
        queue = conf.route(task.module_path)
        if queue is None:
            return task.queue_name
        if self.queues and queue not in self.queues:
            raise InvalidTask(
                f"PGQUEUE['ROUTES'] sends the task {task.module_path!r} to the queue "
                f"{queue!r}, which is not in TASKS[{self.alias!r}]['QUEUES']."
            )
        return queue

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """pgqueue.E004: the app is installed; pgqueue.E007: every exception class a
        task's autoretry_for or dont_autoretry_for names imports."""
        if not apps.is_installed("django_pgqueue"):
            return [
                checks.Error(
                    f"TASKS[{self.alias!r}] uses PgQueueBackend, but 'django_pgqueue' is not "
                    "in INSTALLED_APPS, so its tables and worker are missing.",
                    hint="Add 'django_pgqueue' (and 'rangefilter') to INSTALLED_APPS and "
                    "run migrate.",
                    id="pgqueue.E004",
                )
            ]
        errors: list[checks.CheckMessage] = []
        for options in self._per_task.values():
            try:
                if options.retry_on is not None:
                    options.retry_on.resolve()
            except ConfigurationError as exc:
                errors.append(
                    checks.Error(
                        str(exc),
                        hint="The worker fails every job of that task until it imports.",
                        id="pgqueue.E007",
                    )
                )
        return errors

    # -- enqueue -------------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        """Write the task as a job in the caller's transaction; return its READY result.

        Arguments must be JSON values: anything else raises TypeError naming it, and
        nothing is written. ``task_enqueued`` is sent once the job is committed.
        """
        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        validation.payload(args, None, "args")
        validation.payload(kwargs, None, "kwargs")
        call = TaskCall(args, kwargs, self.alias, task.run_after)
        conf = get_settings()
        options = self.task_options(task.module_path)
        job = enqueue(
            task.module_path,
            call.payload(),
            queue=self.queue_for(task, conf),
            priority=task.priority,
            run_at=task.run_after,
            # stored with the job: the worker never guesses it
            max_attempts=options.max_attempts or conf.MAX_ATTEMPTS,
            concurrency_key=options.key_for(task.func, task.takes_context, args, kwargs),
            sequence=options.key_for(task.func, task.takes_context, args, kwargs, "sequence"),
            sequence_on_failure=options.sequence_on_failure,
        )
        # The queue's database (PGQUEUE["QUEUE_DATABASES"]): the result id names it.
        database = conf.database_for(job.queue)
        result = TaskResult(
            task=task,
            id=result_id(job.id, database, conf.DATABASE),
            status=TaskResultStatus.READY,
            enqueued_at=job.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        # The job exists for other connections only once the caller's transaction
        # commits (at once in autocommit); a rollback removes it and sends nothing.
        transaction.on_commit(
            partial(task_enqueued.send, sender=type(self), task_result=result),
            using=database,
            robust=True,
        )
        return result

    async def aenqueue(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult:
        """enqueue() from async code, on the thread that owns the caller's connection
        (in its `aatomic` block, if any, as `django_pgqueue.aenqueue`)."""
        return await call_sync(self.enqueue, task, args, kwargs)

    # -- results -------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """Read a task's result from the queue tables; TaskResultDoesNotExist if none."""
        # Local: Django's app loading. A @task defined in a module that is imported
        # before the app registry is ready creates this backend, and the models
        # cannot be imported then (AppRegistryNotReady).
        from ..models import Attempt, JobState

        conf = get_settings()
        found = parse_result_id(result_id, conf.DATABASE)
        if found is None or found[1] not in conf.queue_databases:
            raise TaskResultDoesNotExist(result_id)
        job_id, database = found
        state = JobState.objects.using(database).select_related("job").filter(pk=job_id).first()
        if state is None:
            raise TaskResultDoesNotExist(result_id)
        job = state.job
        call = TaskCall.from_payload(job.payload)
        task = import_task(job.type) if call is not None else None
        if call is None or task is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: job {job_id} of type {job.type!r} is not a task "
                "(or its module no longer defines it)."
            )
        attempts = list(
            Attempt.objects.using(database).filter(job_id=job_id).order_by("lease_version")
        )
        alias = call.backend or self.alias
        return build_result(
            as_enqueued(
                task,
                queue=job.queue,
                priority=state.priority,
                backend=alias,
                run_after=call.run_after,
            ),
            job_id=job_id,
            database=database,
            default_database=conf.DATABASE,
            status=state.status,
            enqueued_at=job.created_at,
            finished_at=state.finished_at,
            call=call,
            backend=alias,
            attempts=attempts,
        )

    async def aget_result(self, result_id: str) -> TaskResult:
        """get_result() from async code."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)
