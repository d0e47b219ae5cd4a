"""The worker registry (``queue_workers``) and the per-minute rollup (``queue_stats_minutely``).

Both are written only by workers, through the statements in ``sql/observability.sql``
(``worker_upsert``, ``worker_mark_gone``, ``worker_prune``, ``stats_minute_add``);
the ORM only reads them. The observability feature (`django_pgqueue.observability`)
writes them; the admin's Workers and Charts pages read them.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.functions import Now

from .jobs import queue_name_column


class IntegerArrayField(models.Field):  # type: ignore[type-arg]
    """An ``integer[]`` column, without needing django.contrib.postgres in INSTALLED_APPS."""

    description = "Array of integers"

    def db_type(self, connection: Any) -> str:
        return "integer[]"


class WorkerRecord(models.Model):
    """One worker process as its heartbeat last reported it. Says nothing about ownership."""

    id = models.CharField(primary_key=True, max_length=255)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField()
    concurrency = models.IntegerField()
    lease_seconds = models.FloatField()
    version = models.CharField(max_length=64)
    running = models.IntegerField(db_default=0)
    started_at = models.DateTimeField(db_default=Now())
    last_seen_at = models.DateTimeField(db_default=Now())
    # Set when the worker stopped, or when no heartbeat came for three of its beats.
    gone_at = models.DateTimeField(null=True, blank=True)
    # The supervisor whose child it is (``run_queue_worker --processes``), if any.
    supervisor = models.CharField(max_length=255, null=True, blank=True)
    # What the worker said of itself at its last beat (`observability.inspect`): its
    # jobs, counters, memory, handlers, code; one reading.
    report = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "queue_workers"
        verbose_name = "worker"
        ordering = ["-last_seen_at"]
        permissions = [("control_worker", "Can stop, drain, resume and resize workers")]

    def __str__(self) -> str:
        return self.id


# What an operator may ask of a worker process (the request's `action`).
WORKER_ACTIONS = ("stop", "drain", "resume", "concurrency")


class WorkerRequest(models.Model):
    """An operator's request to one worker process (stop, drain, resume, concurrency),
    taken by the worker's next beat; the rows are the log of who asked what, when."""

    id = models.BigAutoField(primary_key=True)
    worker_id = models.CharField(max_length=255)
    action = models.CharField(max_length=16)
    concurrency = models.IntegerField(null=True, blank=True)
    requested_by = models.CharField(max_length=255)
    requested_at = models.DateTimeField(db_default=Now())
    # Set by the worker's beat that took it, with what it did.
    taken_at = models.DateTimeField(null=True, blank=True)
    answer = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "queue_worker_requests"
        verbose_name = "worker request"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(action__in=list(WORKER_ACTIONS)),
                name="queue_worker_requests_action_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(action="concurrency", concurrency__gte=1)
                | (~models.Q(action="concurrency") & models.Q(concurrency__isnull=True)),
                name="queue_worker_requests_concurrency_valid",
            ),
        ]
        indexes = [
            # The beat's look for its requests: only the rows not taken yet.
            models.Index(
                fields=["worker_id"],
                name="queue_worker_requests_open_idx",
                condition=models.Q(taken_at__isnull=True),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.worker_id}"


class MinuteStats(models.Model):
    """What the workers of one queue finished in one minute, how long those jobs waited
    and ran, and how many jobs were due and not started.

    wait_buckets counts attempts by wait (claim time minus due time), run_buckets by
    run time, in the buckets of `django_pgqueue.observability.rollup.WAIT_BOUNDS`:
    bucket 0 is below the first bound, bucket i from bound i on.
    """

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()
    queue = queue_name_column()
    completed = models.IntegerField(db_default=0)
    retried = models.IntegerField(db_default=0)
    dead = models.IntegerField(db_default=0)
    wait_seconds_sum = models.FloatField(db_default=0.0)
    wait_buckets = IntegerArrayField()
    # How long the minute's finished attempts ran (finished_at - started_at), counted
    # into the same buckets as the waits; NULL in a minute that finished nothing.
    run_seconds_sum = models.FloatField(db_default=0.0)
    run_buckets = IntegerArrayField(null=True, blank=True)
    # Jobs due and not started (the backlog) as a worker serving the queue last sampled
    # it in the minute, counted up to the at-a-glance cap; NULL when none sampled it.
    backlog = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "queue_stats_minutely"
        verbose_name = "chart"
        verbose_name_plural = "charts"
        constraints = [
            # The upsert's conflict target; the charts read a time range through it too.
            models.UniqueConstraint(fields=["minute", "queue"], name="queue_stats_minutely_key"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} at {self.minute:%Y-%m-%d %H:%M}"
