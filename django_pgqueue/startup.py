"""What the app wires once Django's app registry is ready: the system checks, and the
resolver that finds the ``@task`` function behind a job type enqueued by PgQueueBackend."""

from __future__ import annotations

from . import checks  # noqa: F401 - registers the system checks
from .registry import registry
from .schedules import checks as schedule_checks  # noqa: F401 - and the schedules'

try:
    from .tasks import api as tasks_api
except ImportError:  # Django 5.2 without the django-tasks backport: handlers only
    tasks_api = None  # type: ignore[assignment]
if tasks_api is not None:
    from .tasks.runner import resolve_task


def connect() -> None:
    """Wire what needs the app registry (called from PgQueueConfig.ready, once)."""
    if tasks_api is not None:
        # Jobs enqueued by PgQueueBackend have a task's module path as their type.
        registry.add_resolver(resolve_task)
