"""The batch tables: ``queue_batches`` and ``queue_batch_jobs``.

- `Batch` (``queue_batches``): one row per closed ``batch()`` block: its name, how
  many jobs joined it, and the workflow that holds its callbacks (the steps
  ``on_success``, ``on_finish`` and ``on_discard``, each waiting for every member
  through ``queue_job_deps``, so the statements that end a member settle them).
- `BatchJob` (``queue_batch_jobs``): which batch a job joined (at most one).

The relations are declared with ``db_constraint=False``; the migration adds the
foreign keys with ``ON DELETE CASCADE`` (pruning a job removes its membership).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .constraints import at_least
from .jobs import one_row_per_job


class Batch(models.Model):
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    size = models.IntegerField()
    # The workflow of the callbacks' steps (NULL: the batch has no callbacks).
    workflow = models.OneToOneField(
        "django_pgqueue.Workflow",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        db_constraint=False,
        related_name="batch",
    )
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_batches"
        verbose_name = "batch"
        verbose_name_plural = "batches"
        constraints = [
            at_least(0, "size", name="queue_batches_size"),
        ]

    def __str__(self) -> str:
        return f"batch {self.name} #{self.pk}"


class BatchJob(models.Model):
    job = one_row_per_job(related_name="batch_membership")
    batch = models.ForeignKey(
        Batch, on_delete=models.CASCADE, db_constraint=False, related_name="members"
    )

    class Meta:
        db_table = "queue_batch_jobs"
        verbose_name = "batch member"

    def __str__(self) -> str:
        return f"job #{self.job_id} of batch #{self.batch_id}"
