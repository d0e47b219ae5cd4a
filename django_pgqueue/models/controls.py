"""The queue control tables: ``queue_controls`` and ``queue_type_controls``.

- `QueueControl` (``queue_controls``): one row per controlled queue, with its pause,
  limits and rate window. A queue without a row claims with the plain job_claim.
- `QueueTypeControl` (``queue_type_controls``): one job type's limits within a
  controlled queue.

Written by the controlled claim (``job_claim_controlled`` in ``sql/control.sql``), by a
worker start syncing ``PGQUEUE["QUEUES"]``, and by the Queues admin page and the
Python API of `django_pgqueue.control`.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q, Value
from django.db.models.functions import Cast, Now

from .constraints import at_least, null_or_at_least, unique_in_queue
from .jobs import queue_name_column, type_name_column


class TimestampArray(models.Field):
    """A timestamptz[] column, without requiring django.contrib.postgres."""

    def db_type(self, connection: object) -> str:
        return "timestamptz[]"


class RateWindow(models.Model):
    """A rate window, a queue's or a job type's: at most `rate_count` starts in any
    `rate_period` seconds (both NULL: no rate), kept exact by the controlled claim."""

    rate_count = models.IntegerField(null=True, blank=True)
    rate_period = models.FloatField(null=True, blank=True)
    # The last rate_count start times, oldest first: the exact sliding window.
    rate_starts = TimestampArray(
        db_default=Cast(Value("{}"), output_field=TimestampArray()), editable=False
    )
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        abstract = True

    @staticmethod
    def valid(name: str) -> models.CheckConstraint:
        """The check that a rate is none or a count of 1 to 10,000 over a positive period."""
        return models.CheckConstraint(
            condition=Q(rate_count__isnull=True, rate_period__isnull=True)
            | Q(rate_count__gte=1, rate_count__lte=10_000, rate_period__gt=0),
            name=name,
        )


class QueueControl(RateWindow):
    """A queue's run-time controls: pause, concurrency limits and a rate limit.

    A queue without a row claims with the plain job_claim. The controlled claim locks
    this row for its transaction (one claimer per queue at a time) and counts running
    rows instead of keeping a counter, so a slot cannot leak or be freed twice.
    `configured` is the PGQUEUE["QUEUES"] entry last written here by a worker start:
    settings overwrite the limits only when they change (see control/store.py).
    """

    queue = queue_name_column(primary_key=True)
    paused = models.BooleanField(db_default=False)
    concurrency_limit = models.IntegerField(null=True, blank=True)
    key_limit = models.IntegerField(db_default=1)
    # The queue has (had) jobs with a concurrency key: its claims must apply key_limit.
    keyed = models.BooleanField(db_default=False)
    configured = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "queue_controls"
        verbose_name = "queue"
        verbose_name_plural = "queues"
        constraints = [
            null_or_at_least("concurrency_limit", 0, name="queue_controls_limit_valid"),
            at_least(1, "key_limit", name="queue_controls_key_valid"),
            RateWindow.valid("queue_controls_rate_valid"),
        ]

    def __str__(self) -> str:
        return self.queue


class QueueTypeControl(RateWindow):
    """One job type's limits within a controlled queue: a key limit and a rate window.

    Read and written by the queue's controlled claim under the queue's lock (the
    `queue_controls` row), so the type's rate window is exact like the queue's. A NULL
    key_limit means the queue's; NULL rate_count means no rate of its own.
    """

    queue = queue_name_column()
    type = type_name_column()
    key_limit = models.IntegerField(null=True, blank=True)

    class Meta:
        db_table = "queue_type_controls"
        verbose_name = "job type limit"
        constraints = [
            unique_in_queue("type", name="queue_type_controls_key"),
            null_or_at_least("key_limit", 1, name="queue_type_controls_key_valid"),
            RateWindow.valid("queue_type_controls_rate_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}: {self.type}"
