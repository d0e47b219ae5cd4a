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
    # Set when the worker stopped, or when no heartbeat came for two leases.
    gone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "queue_workers"
        verbose_name = "worker"
        ordering = ["-last_seen_at"]

    def __str__(self) -> str:
        return self.id


class MinuteStats(models.Model):
    """What the workers of one queue finished in one minute, how long those jobs waited
    and ran, and how many jobs were due and not started.

    wait_buckets counts attempts by wait (claim time minus due time), run_buckets by
    run time, in the buckets of `django_pgqueue.observability.rollup.WAIT_BOUNDS`:
    bucket 0 is below the first bound, bucket i from bound i on.
    """

    id = models.BigAutoField(primary_key=True)
    minute = models.DateTimeField()
    queue = models.CharField(max_length=63)
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
