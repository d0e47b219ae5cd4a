"""What a task job carries (`TaskCall`) and the `TaskResult` read back from its rows."""

from __future__ import annotations

import builtins
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.utils.dateparse import parse_datetime

import django_pgqueue

from ..job_refs import result_id
from .api import (
    InvalidTask,
    InvalidTaskBackend,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
)

# queue_job_state.status -> TaskResultStatus. A job waiting for a retry is READY again
# (its failed attempts are in `errors`); dead and cancelled jobs are FAILED. Plain
# strings, not models.Status: this module is imported when a @task is defined, which
# may be before the app registry is ready.
STATUS_MAP: dict[str, Any] = {
    "waiting": TaskResultStatus.READY,
    "pending": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "completed": TaskResultStatus.SUCCESSFUL,
    "dead": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


@dataclass(frozen=True)
class TaskCall:
    """The payload of a task job: the call's arguments and how it was enqueued."""

    args: list[Any]
    kwargs: dict[str, Any]
    backend: str | None = None
    run_after: dt.datetime | None = None
    # A workflow step's: the results of the steps it waits for come first.
    takes_results: bool = False

    def payload(self) -> dict[str, Any]:
        data: dict[str, Any] = {"args": self.args, "kwargs": self.kwargs}
        if self.takes_results:
            data["takes_results"] = True
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
            payload.get("takes_results") is True,
        )


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
    """Return an importable dotted path for TaskError from a stored error class.

    Builtins are stored as bare names ("ValueError"); so were the queue's own lost
    attempts ("LeaseExpired") before they were stored as "django_pgqueue.LeaseExpired".
    """
    name = error_class or "Exception"
    if "." not in name:
        if isinstance(getattr(builtins, name, None), type):
            return f"builtins.{name}"
        if isinstance(getattr(django_pgqueue, name, None), type):
            return f"django_pgqueue.{name}"
    return name


def build_result(
    task: Task,
    *,
    job_id: int,
    database: str,
    default_database: str,
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
        id=result_id(job_id, database, default_database),
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
    external service so that a retried task does not charge or send twice. A task on a
    database other than DATABASE (QUEUE_DATABASES) has its result id's alias in it
    (``"pgqueue-bulk:42"``): job ids of two databases may be equal.
    """
    return f"pgqueue-{context.task_result.id}"
