"""The sequences of jobs (``queue_sequences``): one row per (queue, sequence key).

A sequence's jobs run one at a time, in enqueue order. The row names the sequence's
head, the one job of it that may be pending, running, parked or held (dead): every
later job of the sequence waits (``waiting``) until the head lets go. The row is also
the sequence's lock: an enqueue and the statement that moves the head past a finished
job both take it, so the database decides which job is head, never a read, then a
write. ``head_job_id`` is NULL while the sequence has no unfinished job.
"""

from __future__ import annotations

from django.db import models

from .constraints import set_values_unique, unique_in_queue
from .jobs import queue_name_column


class Sequence(models.Model):
    id = models.BigAutoField(primary_key=True)
    queue = queue_name_column()
    sequence_key = models.CharField(max_length=255)
    # The job whose turn it is (pending, running, parked, or dead and holding the rest
    # back); NULL: none unfinished.
    head_job_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        db_table = "queue_sequences"
        verbose_name = "sequence"
        constraints = [
            unique_in_queue("sequence_key", name="queue_sequences_key"),
            # A job heads at most one sequence; the ending statements find its row by it.
            set_values_unique("head_job_id", name="queue_sequences_head"),
        ]

    def __str__(self) -> str:
        return f"sequence {self.sequence_key} on {self.queue}"
