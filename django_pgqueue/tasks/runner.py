"""Run ``django.tasks`` Tasks in the worker, as handlers of their module path.

A job enqueued through `PgQueueBackend` has the task's module path as its type and no
``@handler``. The registry asks `resolve_task` about such a type once per process: it
imports the Task, checks that it is one, and wraps it in a `Handler` carrying the
task's retry options from its backend. From there the worker treats it like any other
handler: same claim, lease, heartbeat, fencing, retries and dead jobs.

Running a task: the payload's ``args`` and ``kwargs`` are passed to the function (after
a ``TaskContext`` when the task takes one, and after its parents' results for a
workflow step enqueued with ``takes_results=True``); coroutine functions run on the worker's
event loop; ``task_started`` is sent before and ``task_finished`` after the
attempt that ends the task (success, permanent failure, or the last attempt failing).
A failure that will be retried sends no ``task_finished``: the task is READY again.
The return value is normalized as Django's own backends do (``normalize_json``); one
Django refuses fails the task with Django's error (a TypeError), for good.

The app's ``ready()`` imports this module, once the models are loaded; unlike
`backend`, which a ``@task`` definition may import earlier, it imports them at the top.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from asgiref.sync import sync_to_async
from django.core.signals import setting_changed
from django.dispatch import Signal
from django.utils import timezone

from ..conf import get_settings
from ..context import JobContext
from ..exceptions import ConfigurationError, PermanentFailure, UnknownJobType
from ..executor import Failure, describe, ends_job, mark_logged, mark_permanent, success
from ..models import Attempt
from ..registry import Handler, RunOptions, registry
from ..retry import RetryOn
from ..task_paths import import_task
from .api import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from .backend import PgQueueBackend
from .options import TaskOptions
from .results import TaskCall, as_enqueued, build_result, error_class_path

logger = logging.getLogger(__name__)


def resolve_task(type_: str) -> Handler | None:
    """A Handler running the Task whose module path is `type_`, or None if there is none.

    Registered with the registry by the app config. Never raises: a task module that
    fails to import gives a Handler that fails each job with the import error, since
    the code will not change until the worker restarts.
    """
    try:
        task = import_task(type_)
    except Exception as exc:
        logger.exception("task %s cannot be imported", type_)
        message = f"the task {type_!r} cannot be imported: {type(exc).__name__}: {exc}"
        return Handler(type_, _always_raise(UnknownJobType(message)))
    if task is None:
        return None
    options = _options(task)
    try:
        retry_on = options.retry_on.resolve() if options.retry_on is not None else None
    except ConfigurationError as exc:  # an autoretry_for path that does not import
        logger.exception("task %s: its retry options are invalid", type_)
        return Handler(type_, _always_raise(UnknownJobType(f"task {type_!r}: {exc}")))
    run = {option.name: getattr(options, option.name) for option in fields(RunOptions)}
    # The runner passes the parents' results to the task itself: the handler takes none.
    run["takes_results"] = False
    runner = TaskRunner(task, retry_on, takes_results=options.takes_results)
    return Handler(type_, runner, retry_on=retry_on, **run)


def _options(task: Task) -> TaskOptions:
    """The task's options from the backend it names, when that is a PgQueueBackend."""
    try:
        backend = task_backends[task.backend]
    except Exception:
        return TaskOptions()
    if isinstance(backend, PgQueueBackend):
        return backend.task_options(task.module_path)
    return TaskOptions()


def _always_raise(exc: Exception) -> Callable[[JobContext], Any]:
    def fail(ctx: JobContext) -> Any:
        raise exc

    return fail


class TaskRunner:
    """The handler of one task's jobs: call the task as Django's ImmediateBackend would."""

    def __init__(
        self, task: Task, retry_on: RetryOn | None = None, *, takes_results: bool = False
    ) -> None:
        self.task = task
        # The exceptions its jobs are retried for: a failure with another ends the task.
        self.retry_on = retry_on
        # Every job of the task takes its parents' results first (its OPTIONS say so),
        # not only the steps enqueued with takes_results=True.
        self.takes_results = takes_results
        # Task.using() validates on every call: keep the few variants jobs ask for.
        self._variants: dict[tuple[Any, ...], Task] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<TaskRunner {self.task.module_path}>"

    def __call__(self, ctx: JobContext) -> Any:
        call, result = self._begin(ctx)
        try:
            if self.task.takes_context:
                value = self.task.call(TaskContext(task_result=result), *call.args, **call.kwargs)
            else:
                value = self.task.call(*call.args, **call.kwargs)
            value = _returned(value)
        except BaseException as exc:
            # Sent from inside the except block, so receivers (Django's logger among
            # them) see the exception in sys.exc_info().
            self._failed(ctx, result, exc)
            raise
        self._succeeded(result, value)
        return value

    @property
    def async_handler(self) -> Callable[[JobContext], Any] | None:
        """The coroutine function the worker's event loop awaits, for an async task."""
        return self._acall if inspect.iscoroutinefunction(self.task.func) else None

    async def _acall(self, ctx: JobContext) -> Any:
        """Run an async task on the worker's event loop.

        The parts that may touch the database (the attempts read for a retried job,
        the signals' receivers) run through `sync_to_async`, on the one thread Django
        gives thread-sensitive calls, never on the loop.
        """
        call, result = await sync_to_async(self._begin)(ctx)
        try:
            if self.task.takes_context:
                value = await self.task.func(
                    TaskContext(task_result=result), *call.args, **call.kwargs
                )
            else:
                value = await self.task.func(*call.args, **call.kwargs)
            value = _returned(value)
        except asyncio.CancelledError:
            raise  # the worker cancelled it, and records why
        except BaseException as exc:
            await sync_to_async(self._failed_async)(ctx, result, exc)
            raise
        await sync_to_async(self._succeeded)(result, value)
        return value

    def _begin(self, ctx: JobContext) -> tuple[TaskCall, TaskResult]:
        """The task's call (its parents' results first when it takes them) and running
        result; task_started sent."""
        call = TaskCall.from_payload(ctx.payload)
        if call is None:
            raise PermanentFailure(
                f"job {ctx.job_id} of the task {ctx.type!r} has no task arguments; a task "
                "job's payload is {'args': [...], 'kwargs': {...}}."
            )
        if call.takes_results or self.takes_results:
            call = replace(call, args=[*ctx.results_arguments(), *call.args])
        alias = call.backend or self.task.backend
        result = self._running_result(ctx, call, alias)
        _send(task_started, result)
        return call, result

    def _failed_async(self, ctx: JobContext, result: TaskResult, exc: BaseException) -> None:
        # On another thread than the one that caught it: raise it here again, so
        # receivers see it in sys.exc_info() as on the sync path.
        try:
            raise exc
        except BaseException:
            self._failed(ctx, result, exc)

    def _failed(self, ctx: JobContext, result: TaskResult, exc: BaseException) -> None:
        """An attempt raised `exc`: task_finished if the task ends with it."""
        if ends_job(exc, ctx, self.retry_on):
            error_class, _message, trace = describe(exc)
            result.errors.append(
                TaskError(exception_class_path=error_class_path(error_class), traceback=trace)
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
            object.__setattr__(result, "finished_at", timezone.now())
            _send(task_finished, result)
            # Django's task_finished receiver logs a failed task with its traceback:
            # the worker's own line for the dead job need not say it again.
            mark_logged(exc)

    def _succeeded(self, result: TaskResult, value: Any) -> None:
        """An attempt returned `value`: task_finished with what the result will say."""
        outcome = success(value)
        if isinstance(outcome, Failure):
            # The worker will record this failure (the value does not encode): the
            # signal says what the result will say.
            result.errors.append(
                TaskError(
                    exception_class_path=error_class_path(outcome.error_class),
                    traceback=f"{outcome.error_class}: {outcome.message}",
                )
            )
            object.__setattr__(result, "status", TaskResultStatus.FAILED)
        else:
            object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
            object.__setattr__(result, "_return_value", value)
        object.__setattr__(result, "finished_at", timezone.now())
        _send(task_finished, result)

    def _variant(self, ctx: JobContext, call: TaskCall, alias: str) -> Task:
        key = (ctx.queue, ctx.priority, alias, call.run_after)
        task = self._variants.get(key)
        if task is None:
            task = as_enqueued(
                self.task,
                queue=ctx.queue,
                priority=ctx.priority,
                backend=alias,
                run_after=call.run_after,
            )
            with self._lock:
                if len(self._variants) < 1000:
                    self._variants[key] = task
        return task

    def _running_result(self, ctx: JobContext, call: TaskCall, alias: str) -> TaskResult:
        """The TaskResult the task and the signals see while this attempt runs."""
        conf = get_settings()
        database = conf.database_for(ctx.queue)
        if ctx.lease_version == 1:
            # The job's first claim (every claim, sweep and retry adds one to the lease
            # version): this attempt is its whole history, no need to read it.
            attempts = [
                Attempt(worker_id=ctx.worker_id, status="running", started_at=timezone.now())
            ]
        else:
            attempts = list(
                Attempt.objects.using(database).filter(job_id=ctx.job_id).order_by("lease_version")
            )
        return build_result(
            self._variant(ctx, call, alias),
            job_id=ctx.job_id,
            database=database,
            default_database=conf.DATABASE,
            status="running",
            enqueued_at=ctx.created_at,
            finished_at=None,
            call=call,
            backend=alias,
            attempts=attempts,
        )


def _returned(value: Any) -> Any:
    """A task's return value as Django stores one (`normalize_json`: tuples as lists,
    UTF-8 bytes as text). A value Django refuses raises Django's error (TypeError
    "Unsupported type", or ValueError for bytes that are not UTF-8), and the task fails
    with it, as with Django's own backends; the failure is permanent, since the task
    ran and a retry would run it again."""
    try:
        return normalize_json(value)
    except Exception as exc:  # a RecursionError of a value that contains itself too
        mark_permanent(exc)
        raise


def _send(signal: Signal, result: TaskResult) -> None:
    """Send a task signal; a failing receiver is logged and never changes the outcome."""
    responses = signal.send_robust(sender=PgQueueBackend, task_result=result)
    for receiver, response in responses:
        if isinstance(response, Exception):
            logger.error(
                "a receiver of a task signal failed: %r: %s",
                receiver,
                response,
                exc_info=(type(response), response, response.__traceback__),
            )


def _forget_resolved(*, setting: str, **kwargs: Any) -> None:
    # Resolved handlers carry options read from TASKS and PGQUEUE.
    if setting in ("TASKS", "PGQUEUE"):
        registry.clear_resolved()


setting_changed.connect(_forget_resolved)
