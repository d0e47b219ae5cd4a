"""Who waits for a job's outcome (``queue_job_waiters``): one row per `wait()` in progress.

A waiter inserts its row before it looks at the job and deletes it when it returns;
the statements that finish a job send a NOTIFY on ``pgqueue_finished`` (the job's
queue as payload) only for jobs that have a row here, so jobs nobody waits on cost one
probe of this (usually empty) table per statement and no notification. A waiter that
crashed leaves its row until `expires_at`; the next waiter's registration deletes it.
No foreign key: a job's finishing statements must not pay for one, and a row whose
job was pruned only costs a row until it expires.
"""

from __future__ import annotations

from django.db import models

from .jobs import queue_name_column


class JobWaiter(models.Model):
    id = models.BigAutoField(primary_key=True)
    job_id = models.BigIntegerField()
    queue = queue_name_column()  # the NOTIFY's payload: never job data
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "queue_job_waiters"
        verbose_name = "job waiter"
        indexes = [models.Index(fields=["job_id"], name="queue_job_waiters_job_idx")]

    def __str__(self) -> str:
        return f"waiter for job #{self.job_id}"
