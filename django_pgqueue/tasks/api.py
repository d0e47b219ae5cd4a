"""Django's Tasks API, from ``django.tasks`` (Django 6.0+) or the ``django-tasks`` backport.

Django 5.2 has no ``django.tasks``; the backport (``pip install django-tasks``, which
django-pgqueue pulls in on Python < 3.12) provides the same classes under
``django_tasks``, with two exceptions renamed. Everything in django_pgqueue that
touches the Tasks framework imports it from here, so the rest of the code reads the
same on both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..task_paths import NO_TASKS_FRAMEWORK

try:
    from django.tasks import Task, TaskContext, TaskResult, TaskResultStatus, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import DEFAULT_TASK_QUEUE_NAME, TaskError
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started

    SOURCE = "django.tasks"
except ImportError:  # Django 5.2: the backport
    try:
        from django_tasks import (  # type: ignore[no-redef]
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend  # type: ignore[no-redef]
        from django_tasks.base import Task, TaskError  # type: ignore[no-redef]
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskBackendError as InvalidTaskBackend,
        )
        from django_tasks.exceptions import (  # type: ignore[no-redef]
            InvalidTaskError as InvalidTask,
        )
        from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]
        from django_tasks.signals import (  # type: ignore[no-redef]
            task_enqueued,
            task_finished,
            task_started,
        )

        # The queue_name a Task has when its decorator names none, as in Django.
        DEFAULT_TASK_QUEUE_NAME = "default"  # type: ignore[misc]
        SOURCE = "django_tasks"
    except ImportError as exc:
        raise ImportError(NO_TASKS_FRAMEWORK) from exc

try:  # Django 6.0+: what a task's return value becomes before it is stored
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2
    normalize_json = None  # type: ignore[assignment]
if normalize_json is None:

    def normalize_json(obj: Any) -> Any:  # type: ignore[no-redef]
        """A value as JSON types, by Django 6's rule: mappings and sequences walked
        (tuples become lists), UTF-8 bytes decoded; ValueError for other bytes,
        TypeError ("Unsupported type") for any other type."""
        if isinstance(obj, Mapping):
            return {normalize_json(key): normalize_json(value) for key, value in obj.items()}
        if isinstance(obj, bytes):
            try:
                return obj.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"Unsupported value: {type(obj)}") from None
        if obj is None or isinstance(obj, str | int | float | bool):
            return obj
        if isinstance(obj, Sequence):
            return [normalize_json(item) for item in obj]
        raise TypeError(f"Unsupported type: {type(obj)}")


__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
