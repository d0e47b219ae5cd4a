"""django.tasks Tasks the test suite enqueues through PgQueueBackend.

They live in an installed app so that worker subprocesses import them by module path,
as they would in a real project. `calls` rows are written on the task's own
connection, so executions can be counted apart from what the queue says.
"""

from __future__ import annotations

import asyncio
from typing import Any

from django_pgqueue import PermanentFailure
from django_pgqueue.tasks.api import TaskContext

from .models import TaskCall

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


def _record(label: str, attempt: int = 0) -> None:
    TaskCall.objects.create(label=label, attempt=attempt)


@task(queue_name="qa-tasks")
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="qa-tasks")
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task(queue_name="qa-tasks")
def record(label: str) -> str:
    """Record `label` in qa_task_call: the row ids give the order tasks ran in."""
    _record(label)
    return label


@task(queue_name="qa-tasks")
def explode(message: str) -> None:
    raise ValueError(message)


@task(queue_name="qa-tasks", takes_context=True)
def flaky(context: TaskContext, failures: int) -> dict[str, Any]:
    """Fail the first `failures` attempts, then succeed; record every attempt."""
    _record("flaky", context.attempt)
    if context.attempt <= failures:
        raise ConnectionError(f"flaky dependency down (attempt {context.attempt})")
    return {"attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


class Transient(Exception):
    """The one failure `picky` is retried for: settings.TASKS names it by its path."""


@task(queue_name="qa-tasks", takes_context=True)
def picky(context: TaskContext, kind: str) -> int:
    """Raise Transient ("transient") or ValueError ("invalid"), else return the attempt;
    record every attempt. Its options say autoretry_for=["qa.tasks.Transient"]."""
    _record(f"picky:{kind}", context.attempt)
    if kind == "transient":
        raise Transient(f"the service is down (attempt {context.attempt})")
    if kind == "invalid":
        raise ValueError("an invalid request: retrying cannot help")
    return context.attempt


@task(queue_name="qa-tasks")
def refuse(reason: str) -> None:
    raise PermanentFailure(reason)


@task(queue_name="qa-tasks")
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(queue_name="qa-tasks")
def unstorable() -> object:
    return object()


# What `returns(kind)` returns: values Django normalizes, refuses, or PostgreSQL refuses.
RETURNED = {
    "lambda": lambda: True,  # not JSON, not picklable: Django's own test of this
    "tuple": (1, (2, 3)),
    "utf8_bytes": b"caf\xc3\xa9",
    "latin1_bytes": b"caf\xe9",
    "a_set": {1},
    "nul": "bad \x00 text",
    "nan": float("nan"),
}


@task(queue_name="qa-tasks")
def returns(kind: str) -> Any:
    _record(f"returns:{kind}")
    return RETURNED[kind]


@task(queue_name="qa-tasks", takes_context=True)
def batch_report(context: TaskContext) -> dict[str, Any]:
    """A batch callback as a task: the batch's counts read through its context."""
    import django_pgqueue

    return django_pgqueue.batch_status(context).as_dict()


# -- canvas steps: tasks that take their parents' results (step(..., takes_results=True)) --


@task(queue_name="qa-tasks")
def mul(value: int, factor: int) -> int:
    return value * factor


@task(queue_name="qa-tasks")
def tsum(numbers: list[int], offset: int = 0) -> int:
    return sum(numbers) + offset


@task(queue_name="qa-tasks")
def average(numbers: list[float]) -> float:
    """Its OPTIONS say takes_results: every step of it takes its parents' results."""
    return sum(numbers) / len(numbers)


@task(queue_name="qa-tasks")
def errback(failure: Any, label: str) -> dict[str, Any]:
    """A link_error step: return what it was handed about the failed step."""
    return {
        "label": label,
        "job_id": failure.job_id,
        "step": failure.step,
        "status": failure.status,
        "error": failure.error,
        "error_class": failure.error_class,
        "traceback": failure.traceback,
    }
