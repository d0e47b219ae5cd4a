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
``TaskResult``. The worker runs these jobs through `django_pgqueue.task_runner`.
"""

from __future__ import annotations

import builtins
import datetime as dt
import importlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.core import checks
from django.db import transaction
from django.utils.dateparse import parse_datetime

from . import validation
from .conf import get_settings
from .enqueue import enqueue
from .exceptions import ConfigurationError, EnqueueError
from .retry import ExponentialBackoff, FixedDelay, RetryPolicy
from .tasks_api import (
    BaseTaskBackend,
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)

# Keys of a PgQueueBackend's OPTIONS, and of each entry of OPTIONS["TASKS"]. The
# reference documentation is checked against these.
OPTIONS: dict[str, str] = {
    "MAX_ATTEMPTS": "Attempts each task gets; default PGQUEUE['MAX_ATTEMPTS'].",
    "RETRY": "Retry policy of every task; default full jitter from PGQUEUE's RETRY_BACKOFF_*.",
    "TIMEOUT": "Seconds a task may run before it is failed and retried; default JOB_TIMEOUT.",
    "TASKS": "Per-task overrides: {module path: {max_attempts, retry, timeout}}.",
    "SCHEDULES": "Recurring @task calls: {name: {task, cron or every, args, kwargs, ...}}.",
}
TASK_OPTIONS = ("max_attempts", "retry", "timeout")

# queue_job_state.status -> TaskResultStatus. A job waiting for a retry is READY again
# (its failed attempts are in `errors`); dead and cancelled jobs are FAILED. Plain
# strings, not models.Status: this module is imported when a @task is defined, which
# may be before the app registry is ready.
STATUS_MAP: dict[str, Any] = {
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}

# A task's module path, as Task.module_path spells it for a module-level function.
_TASK_PATH_RE = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$", re.ASCII)


# -- options ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskOptions:
    """How one task is retried; None fields fall back to the PGQUEUE settings."""

    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    timeout: float | None = None

    def over(self, defaults: TaskOptions) -> TaskOptions:
        """These options, with their unset fields taken from `defaults`."""
        return TaskOptions(
            self.max_attempts if self.max_attempts is not None else defaults.max_attempts,
            self.retry if self.retry is not None else defaults.retry,
            self.timeout if self.timeout is not None else defaults.timeout,
        )


def retry_policy(value: Any, where: str) -> RetryPolicy | None:
    """A RetryPolicy from a policy object or a settings-friendly dict."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        spec = dict(value)
        kind = spec.pop("policy", None)
        factory = {"exponential": ExponentialBackoff, "fixed": FixedDelay}.get(kind)  # type: ignore[arg-type]
        if factory is not None:
            try:
                return factory(**spec)
            except (TypeError, ValueError) as exc:
                raise ConfigurationError(f"{where}: {exc}.") from None
    elif isinstance(value, RetryPolicy):
        return value
    raise ConfigurationError(
        f"{where} must be a retry policy (ExponentialBackoff, FixedDelay or any object with "
        "a delay(attempt) method), {'policy': 'exponential', 'base': 1.0, 'cap': 600.0} or "
        f"{{'policy': 'fixed', 'seconds': 10.0}}; got {value!r}."
    )


def _task_options(raw: Mapping[str, Any], keys: Sequence[str], where: str) -> TaskOptions:
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"known keys: {', '.join(keys)}."
        )
    max_key, retry_key, timeout_key = keys[:3]
    max_attempts = raw.get(max_key)
    if max_attempts is not None:
        try:
            validation.max_attempts(max_attempts)
        except EnqueueError as exc:
            raise ConfigurationError(f"{where}[{max_key!r}]: {exc}") from None
    timeout = raw.get(timeout_key)
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigurationError(f"{where}[{timeout_key!r}] must be seconds > 0, got {timeout!r}.")
    return TaskOptions(
        max_attempts=max_attempts,
        retry=retry_policy(raw.get(retry_key), f"{where}[{retry_key!r}]"),
        timeout=None if timeout is None else float(timeout),
    )


def parse_options(raw: Any, where: str) -> tuple[TaskOptions, dict[str, TaskOptions]]:
    """Validate a backend's OPTIONS: (defaults for every task, overrides per task path)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{where} must be a dict, got {type(raw).__name__}.")
    # SCHEDULES is read and checked by django_pgqueue.schedules.
    top = {key: value for key, value in raw.items() if key not in ("TASKS", "SCHEDULES")}
    defaults = _task_options(top, ("MAX_ATTEMPTS", "RETRY", "TIMEOUT"), where)
    per_task_raw = raw.get("TASKS") or {}
    if not isinstance(per_task_raw, Mapping):
        raise ConfigurationError(
            f"{where}['TASKS'] must map task module paths to options, got {per_task_raw!r}."
        )
    per_task: dict[str, TaskOptions] = {}
    for path, options in per_task_raw.items():
        entry = f"{where}['TASKS'][{path!r}]"
        if not isinstance(path, str) or not _TASK_PATH_RE.match(path):
            raise ConfigurationError(
                f"{entry}: keys must be task module paths such as 'shop.tasks.charge'."
            )
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"{entry} must be a dict, got {options!r}.")
        per_task[path] = _task_options(options, TASK_OPTIONS, entry)
    return defaults, per_task


# -- what a task job carries ---------------------------------------------------------------


@dataclass(frozen=True)
class TaskCall:
    """The payload of a task job: the call's arguments and how it was enqueued."""

    args: list[Any]
    kwargs: dict[str, Any]
    backend: str | None = None
    run_after: dt.datetime | None = None

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {"args": self.args, "kwargs": self.kwargs}
        if self.backend is not None:
            data["backend"] = self.backend
        if self.run_after is not None:
            data["run_after"] = self.run_after.isoformat()
        return data

    @classmethod
    def from_payload(cls, payload: Any) -> TaskCall | None:
        """The call a payload describes, or None if it is not a task payload."""
        if not isinstance(payload, dict):
            return None
        args, kwargs = payload.get("args"), payload.get("kwargs")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return None
        backend = payload.get("backend")
        run_after = payload.get("run_after")
        return cls(
            args,
            kwargs,
            backend if isinstance(backend, str) else None,
            parse_datetime(run_after) if isinstance(run_after, str) else None,
        )


def import_task(path: str) -> Task | None:
    """The Task defined at module path `path`, or None if there is none.

    A module that is missing is None; an error raised while importing a module that
    exists (a bug in it) propagates.
    """
    if not _TASK_PATH_RE.match(path):
        return None
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            return None
        raise
    found = getattr(module, attribute, None)
    if isinstance(found, Task) and found.module_path == path:
        return found
    return None


def as_enqueued(
    task: Task, *, queue: str, priority: int, backend: str, run_after: dt.datetime | None
) -> Task:
    """The task with the queue, priority and backend a job was enqueued with."""
    try:
        return task.using(queue_name=queue, priority=priority, backend=backend, run_after=run_after)
    except (InvalidTask, InvalidTaskBackend):
        # The settings changed since (a queue or a backend alias is gone): the result
        # still describes the job, with the task as its module defines it now.
        return task


def error_class_path(error_class: str | None) -> str:
    """A dotted path for TaskError: builtins are stored as bare names ("ValueError")."""
    name = error_class or "Exception"
    if "." not in name and isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return name


def build_result(
    task: Task,
    *,
    job_id: int,
    status: str,
    enqueued_at: dt.datetime | None,
    finished_at: dt.datetime | None,
    call: TaskCall,
    backend: str,
    attempts: Sequence[Any],
) -> TaskResult:
    """A TaskResult from a job's state and its attempts (Attempt rows, oldest first).

    Attempts a worker handed back unstarted (status ``released``) are left out:
    ``worker_ids`` has one entry per attempt that ran, so ``TaskResult.attempts`` and
    ``TaskContext.attempt`` count those.
    """
    ran = [a for a in attempts if a.status != "released"]
    errors = [
        TaskError(
            exception_class_path=error_class_path(a.error_class),
            traceback=a.traceback or f"{a.error_class}: {a.error_message}",
        )
        for a in ran
        if a.status in ("failed", "lost")
    ]
    task_status = STATUS_MAP[status]
    result = TaskResult(
        task=task,
        id=str(job_id),
        status=task_status,
        enqueued_at=enqueued_at,
        started_at=ran[0].started_at if ran else None,
        finished_at=finished_at,
        last_attempted_at=ran[-1].started_at if ran else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=backend,
        errors=errors,
        worker_ids=[a.worker_id for a in ran],
    )
    if task_status == TaskResultStatus.SUCCESSFUL:
        succeeded = [a for a in ran if a.status == "succeeded"]
        if succeeded:
            object.__setattr__(result, "_return_value", succeeded[-1].result)
    return result


def idempotency_key(context: TaskContext) -> str:
    """The idempotency key of the job running a task: stable across its attempts.

    The same key a `JobContext` gives handlers (``"pgqueue-<job id>"``); pass it to an
    external service so that a retried task does not charge or send twice.
    """
    return f"pgqueue-{context.task_result.id}"


# -- the backend ---------------------------------------------------------------------------


class PgQueueBackend(BaseTaskBackend):
    """Run Django Tasks on the PostgreSQL queue: transactional, leased, fenced, retried."""

    supports_defer = True  # run_after becomes the job's run_at
    supports_async_task = True  # coroutine functions run under async_to_sync in the worker
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

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
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
        return []

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
        max_attempts = self.task_options(task.module_path).max_attempts or conf.MAX_ATTEMPTS
        job = enqueue(
            task.module_path,
            call.payload(),
            queue=task.queue_name,
            priority=task.priority,
            run_at=task.run_after,
            max_attempts=max_attempts,  # stored with the job: the worker never guesses it
            using=conf.DATABASE,
        )
        result = TaskResult(
            task=task,
            id=str(job.id),
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
            using=conf.DATABASE,
            robust=True,
        )
        return result

    async def aenqueue(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult:
        """enqueue() from async code, on the thread that owns the caller's connection."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    # -- results -------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """Read a task's result from the queue tables; TaskResultDoesNotExist if none."""
        from .models import Attempt, JobState

        job_id = _job_id(result_id)
        if job_id is None:
            raise TaskResultDoesNotExist(result_id)
        database = get_settings().DATABASE
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


def _job_id(result_id: Any) -> int | None:
    if isinstance(result_id, int) and not isinstance(result_id, bool):
        return result_id if 0 < result_id < 2**63 else None
    if isinstance(result_id, str) and result_id.isascii() and result_id.isdigit():
        value = int(result_id)
        return value if 0 < value < 2**63 else None
    return None
