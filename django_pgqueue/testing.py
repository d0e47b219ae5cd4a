"""Run the queue's due jobs in a test's own process.

A worker reads jobs on its own connections, so it sees only committed ones: jobs
enqueued inside a ``TestCase`` (whose test runs in a transaction that is rolled back)
are invisible to it. Tests that run jobs use ``TransactionTestCase`` or, with
pytest-django, ``@pytest.mark.django_db(transaction=True)``, then call
:func:`run_due_jobs`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from django.db import connections

from django_pgqueue.conf import get_settings
from django_pgqueue.models import JobState
from django_pgqueue.worker import Worker


def run_due_jobs(queues: Iterable[str] | None = None, **options: Any) -> Counter[str]:
    """Run every due job of `queues` (default: all) with a burst worker; return its counts.

    Jobs enqueued by the handlers and due at once run too; a job scheduled for later (a
    retry's backoff, a future ``run_at``) is left pending. `options` are those of
    :class:`~django_pgqueue.worker.Worker` (``concurrency``, ``lease``, ...).
    """
    alias = get_settings().DATABASE
    if connections[alias].in_atomic_block:
        raise RuntimeError(
            "run_due_jobs() was called inside a transaction (a TestCase, or atomic()): "
            "the worker's own connections cannot see jobs enqueued in it. Use "
            "TransactionTestCase, or @pytest.mark.django_db(transaction=True)."
        )
    if queues is None:
        queues = (
            JobState.objects.using(alias)
            .filter(status="pending")
            .order_by("queue")
            .values_list("queue", flat=True)
            .distinct()
        )
    names = list(queues)
    if not names:
        return Counter()
    options.setdefault("concurrency", 1)
    options.setdefault("poll_interval", 0.05)
    worker = Worker(names, install_signal_handlers=False, burst=True, **options)
    worker.run()
    return worker.stats
