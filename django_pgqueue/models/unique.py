"""The unique keys held for a period (``queue_unique_keys``).

A job enqueued with ``Unique(key, hold=<period>)`` takes its key's row here, or finds
it held: the row says which job took it and until when. The holds that follow a job's
status live on its state row instead (``queue_job_state.unique_key``).
"""

from __future__ import annotations

from django.db import models

from .constraints import unique_in_queue
from .jobs import queue_name_column


class UniqueKey(models.Model):
    id = models.BigAutoField(primary_key=True)
    queue = queue_name_column()
    unique_key = models.CharField(max_length=255)
    # The job that took the key last; it may have been pruned since.
    job_id = models.BigIntegerField()
    held_until = models.DateTimeField()

    class Meta:
        db_table = "queue_unique_keys"
        verbose_name = "unique key"
        constraints = [
            unique_in_queue("unique_key", name="queue_unique_keys_key"),
        ]

    def __str__(self) -> str:
        return f"{self.unique_key} on {self.queue} (job #{self.job_id})"
