"""Durable execution inside a handler: its checkpoints and the events it waits for.

- ``queue_job_steps``: one row per (job, step name), the step's JSON result, written
  fenced by the job's lease (or, for an event wait, by the statement that took the
  wait's row): a step with a row never runs again for its job.
- ``queue_events``: one row per event key, its payload; the first emit wins.
- ``queue_event_waits``: the jobs parked until an event comes or their wait times out;
  whoever deletes a wait's row (an emit or the timeout) decides the wait, once.

Foreign keys to ``queue_jobs`` with ``ON DELETE CASCADE``: pruning a
job removes its steps and its wait.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from ..validators import MAX_DURABLE_NAME
from .constraints import set_values_index


def bounded_name(field: str) -> models.Q:
    """The condition that `field` holds 1 to MAX_DURABLE_NAME characters (`durable.run`
    refuses a longer name before it reaches the table)."""
    return models.Q(**{f"{field}__regex": rf"^.{{1,{MAX_DURABLE_NAME}}}$"})


class StepKind(models.TextChoices):
    STEP = "step"
    ATOMIC = "atomic"
    SLEEP = "sleep"
    EVENT = "event"


class JobStep(models.Model):
    pk = models.CompositePrimaryKey("job_id", "name")
    job_id = models.BigIntegerField()
    name = models.TextField()
    kind = models.CharField(max_length=16, choices=StepKind.choices)
    result = models.JSONField(null=True)
    # The lease under which the handler recorded it; None when an emit or a timeout did.
    lease_version = models.BigIntegerField(null=True)
    runtime = models.FloatField(null=True)  # seconds the step's function ran
    recorded_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_job_steps"
        verbose_name = "job step"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=StepKind.values)
                & bounded_name("name")
                & (models.Q(runtime__isnull=True) | models.Q(runtime__gte=0)),
                name="queue_job_steps_valid",
            )
        ]

    def __str__(self) -> str:
        return f"step {self.name!r} of job #{self.job_id}"


class Event(models.Model):
    key = models.TextField(primary_key=True)
    payload = models.JSONField(null=True)
    emitted_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_events"
        verbose_name = "event"
        constraints = [
            models.CheckConstraint(condition=bounded_name("key"), name="queue_events_valid")
        ]

    def __str__(self) -> str:
        return f"event {self.key!r}"


class EventWait(models.Model):
    job_id = models.BigIntegerField(primary_key=True)
    key = models.TextField()
    name = models.TextField()  # the wait's step: its checkpoint gets the payload
    timeout_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_event_waits"
        verbose_name = "event wait"
        indexes = [
            models.Index(fields=["key"], name="queue_event_waits_key_idx"),
            set_values_index("timeout_at", name="queue_event_waits_timeout_idx"),
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} waits for {self.key!r}"
