"""The recurring-job tables: ``queue_schedules`` and ``queue_schedule_ticks``.

- `Schedule` (``queue_schedules``): one row per schedule, declared in code (synced in
  by every worker at start) or created in the admin. ``next_tick`` is the first tick
  not fired yet; firing a tick moves it forward in the same statement that inserts
  the tick and its job, and only if it still holds the value the worker read, so two
  workers never act on one tick twice.
- `ScheduleTick` (``queue_schedule_ticks``): one row per fired tick, keyed by
  (schedule, tick_at), with the job it made. The key is what makes a tick fire once.
- `ScheduleCode` (``queue_schedule_code``): each set of schedules declared in code
  that a worker ran, by fingerprint, with when it was first seen and when a worker
  running it last said so. Only workers running the newest set still running write the
  code schedules, so during a rolling deploy a worker of the old code that starts after
  one of the new does not put the old ones back.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .constraints import null_or_at_least, one_of
from .jobs import queue_name_column, type_name_column


class CatchUp(models.TextChoices):
    ONCE = "once", "once for the whole gap"
    SKIP = "skip", "skip missed ticks"


class Source(models.TextChoices):
    CODE = "code", "code"
    DB = "db", "database"
    REMOVED = "removed", "removed from code"


class Schedule(models.Model):
    name = models.CharField(max_length=100, primary_key=True)
    type = type_name_column(help_text="The job type each tick enqueues.")
    queue = queue_name_column(default="default")
    # NULL, not '': the CHECK says a schedule has exactly one of cron and every.
    cron = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        help_text="Cron expression (5 fields, 6 with seconds first), or use every.",
    )
    every = models.DurationField(
        null=True, blank=True, help_text="A fixed interval (whole seconds), instead of cron."
    )
    payload = models.JSONField(default=dict, blank=True)
    timezone = models.CharField(
        max_length=63, help_text="IANA zone the cron expression is read in, e.g. Europe/Berlin."
    )
    catch_up = models.CharField(
        max_length=8,
        choices=CatchUp.choices,
        default=CatchUp.ONCE,
        help_text="After missed ticks: one job for the whole gap, or none.",
    )
    priority = models.SmallIntegerField(default=0)
    max_attempts = models.IntegerField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    source = models.CharField(max_length=8, choices=Source.choices, default=Source.DB)
    next_tick = models.DateTimeField(null=True, blank=True)
    last_tick = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_schedules"
        verbose_name = "schedule"
        ordering = ["name"]
        permissions = [("run_schedule", "Can run a schedule now")]
        constraints = [
            models.CheckConstraint(
                condition=Q(cron__isnull=False, every__isnull=True)
                | Q(cron__isnull=True, every__isnull=False),
                name="queue_schedules_cron_or_every",
            ),
            null_or_at_least("every", "1 second", name="queue_schedules_every_positive"),
            one_of("catch_up", CatchUp, name="queue_schedules_catch_up_valid"),
            one_of("source", Source, name="queue_schedules_source_valid"),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100),
                name="queue_schedules_priority_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleTick(models.Model):
    pk = models.CompositePrimaryKey("schedule", "tick_at")
    schedule = models.ForeignKey(
        Schedule,
        on_delete=models.CASCADE,
        db_column="schedule",
        db_index=False,  # the primary key (schedule, tick_at) serves lookups by schedule
        related_name="ticks",
    )
    tick_at = models.DateTimeField()
    # Not a foreign key: pruning finished jobs must not lose the record of their tick.
    job_id = models.BigIntegerField()
    # Ticks before this one that never fired (a catch-up job stands for them all).
    missed = models.IntegerField(default=0)
    fired_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_schedule_ticks"
        verbose_name = "schedule tick"
        ordering = ["schedule", "-tick_at"]

    def __str__(self) -> str:
        return f"{self.schedule_id} at {self.tick_at:%Y-%m-%d %H:%M:%S%z}"


class ScheduleCode(models.Model):
    """A set of code schedules (its fingerprint), when a worker first ran it, and when a
    worker running it last said so."""

    fingerprint = models.CharField(max_length=64, primary_key=True)
    first_seen = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_schedule_code"
        verbose_name = "schedule code version"

    def __str__(self) -> str:
        return self.fingerprint[:12]
