"""Whether `run_queue_worker` runs its worker under a supervisor even as one process."""

from __future__ import annotations

from typing import Any

from django_pgqueue.conf import get_settings
from django_pgqueue.registry import registry


def needs_supervisor(options: dict[str, Any]) -> bool:
    """Whether this worker runs under a supervisor even as one process: it recycles its
    process, or a handler (or a task of a PgQueueBackend) has a hard time limit, which
    only ending the process running it enforces (the supervisor writes its jobs and
    starts a fresh one)."""
    if options["max_jobs_per_process"] or options["max_memory_per_process"]:
        return True
    if get_settings().TIME_LIMIT is not None:
        return True
    registry.autodiscover()
    if any(
        (spec := registry.find(type_)) is not None and spec.time_limit is not None
        for type_ in registry.types()
    ):
        return True
    try:
        # Local: Django's Tasks framework is optional (Django 5.2 without the backport).
        from django_pgqueue.tasks.api import task_backends
        from django_pgqueue.tasks.backend import PgQueueBackend
    except ImportError:
        return False
    return any(
        isinstance(backend, PgQueueBackend) and backend.has_time_limits()
        for backend in task_backends.all()
    )
