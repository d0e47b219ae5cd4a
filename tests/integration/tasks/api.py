"""Django's public Tasks API, as the tests use it: django.tasks, or the backport on 5.2."""

from __future__ import annotations

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started

__all__ = [
    "InvalidTask",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]


def settle(result, *, until=None, timeout: float = 20.0):  # type: ignore[no-untyped-def]
    """Refresh a TaskResult until it is finished (or `until(result)` holds); return it."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        result.refresh()
        if until(result) if until is not None else result.is_finished:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"task {result.id} still {result.status} after {timeout}s")
        time.sleep(0.05)
