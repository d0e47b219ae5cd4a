"""Where settings find the Tasks backend: ``django_pgqueue.backends.PgQueueBackend``.

The backend lives in `django_pgqueue.tasks`; these names stay importable from here.
"""

from __future__ import annotations

from .tasks.backend import PgQueueBackend
from .tasks.options import OPTIONS, TASK_OPTIONS, TaskOptions
from .tasks.results import idempotency_key
from .tasks.waiting import await_result, wait_result

__all__ = [
    "OPTIONS",
    "TASK_OPTIONS",
    "PgQueueBackend",
    "TaskOptions",
    "await_result",
    "idempotency_key",
    "wait_result",
]
