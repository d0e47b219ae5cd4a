"""Django's Tasks API, from ``django.tasks`` (Django 6.0+) or the ``django-tasks`` backport.

Django 5.2 has no ``django.tasks``; the backport (``pip install django-tasks``, which
django-pgqueue pulls in on Python < 3.12) provides the same classes under
``django_tasks``, with two exceptions renamed. Everything in django_pgqueue that
touches the Tasks framework imports it from here, so the rest of the code reads the
same on both.
"""

from __future__ import annotations

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
        raise ImportError(
            "django_pgqueue's Tasks backend needs Django's Tasks framework: Django 6.0 or "
            "newer, or on Django 5.2 the backport (pip install 'django-pgqueue-jobs[django52]', "
            "which installs django-tasks)."
        ) from exc

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
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
