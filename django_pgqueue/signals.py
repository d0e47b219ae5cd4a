"""Lifecycle signals of every job, plain handlers and ``@task`` functions alike.

This module only declares them; `send` is how django_pgqueue sends them. Every signal
is sent with ``sender=django_pgqueue.models.Job`` (the class, as Django's model signals
do) and keyword arguments; a receiver should accept ``**kwargs`` so that arguments
added later do not break it. Every one carries ``job_id``, ``queue`` and ``type``.

=================  =========================================  ===========================
signal             when, and in which thread                  further arguments
=================  =========================================  ===========================
job_enqueued       a job was inserted; inside a transaction,   payload, priority
                   when it commits (never if it rolls back)
job_started        a handler is about to run (its thread)      attempt, max_attempts,
                                                               lease_version, worker_id,
                                                               context
job_succeeded      the completion was written (the worker's    attempt, lease_version,
                   dispatcher)                                 worker_id, result
job_retried        a failed attempt was written, the job is    attempt, lease_version,
                   due again after ``delay`` seconds           worker_id, delay, run_at,
                                                               error
job_failed         a failed attempt was written and the job    attempt, lease_version,
                   is dead (permanent, or attempts spent)      worker_id, error
job_lease_lost     the worker found it no longer owns the job  attempt, lease_version,
                   (a renewal or a fenced write changed        worker_id, detected_by
                   nothing)
job_cancelled      an operator cancelled a pending job, once   (none)
                   the cancelling transaction commits; or a
                   running job asked to cancel ended           attempt, lease_version,
                   cancelled (the worker's dispatcher)         worker_id
=================  =========================================  ===========================

A receiver that raises is logged (by Django, on ``django.dispatch``, with its
traceback) and ignored: it never fails, retries or delays the job beyond its own running time. The
worker's receivers run on its threads, so a slow one slows the worker: hand long work
to a job of its own.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.db import transaction
from django.dispatch import Signal

if TYPE_CHECKING:
    from django.db.models import Model

job_enqueued = Signal()
job_started = Signal()
job_succeeded = Signal()
job_retried = Signal()
job_failed = Signal()
job_lease_lost = Signal()
job_cancelled = Signal()


def send(signal: Signal, **kwargs: Any) -> None:
    """Send `signal` for one job; a receiver that raises is logged, never propagated."""
    if signal.receivers:
        # send_robust catches each receiver's Exception and logs it, with its
        # traceback, on the django.dispatch logger.
        signal.send_robust(sender=_job_model(), **kwargs)


@functools.cache
def _job_model() -> type[Model]:
    """`django_pgqueue.models.Job`, the sender of every signal, from the app registry.

    Not imported: ``import django_pgqueue`` imports this module (through enqueue), and
    Django imports that package before its app registry is ready, when no model can
    be defined yet. Looked up at the first signal sent, then kept.
    """
    return apps.get_model("django_pgqueue", "Job")


def send_on_commit(signal: Signal, alias: str, events: list[dict[str, Any]]) -> None:
    """Send `signal` once per event when `alias`'s transaction commits (now, outside one)."""
    if not signal.receivers or not events:
        return

    def deliver() -> None:
        for kwargs in events:
            send(signal, **kwargs)

    transaction.on_commit(deliver, using=alias)
