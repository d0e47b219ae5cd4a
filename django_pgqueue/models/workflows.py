"""The workflow tables: ``queue_workflows``, ``queue_workflow_steps`` and ``queue_job_deps``.

- `Workflow` (``queue_workflows``): one row per enqueued canvas (chain, group, chord or
  a `Workflow` builder's DAG), with its name and number of steps.
- `WorkflowStep` (``queue_workflow_steps``): one row per job of a workflow: its step
  name, its failure policy, and two counters kept by the fenced statements that end
  a job: ``waiting_for``, the dependencies not finished yet, and ``failed``, those that
  ended dead or cancelled. A step whose counters say it may run is made pending in
  the transaction of the statement that finished its last dependency
  (``pgqueue_settle``); the step row's lock serializes a fan-in, so
  each finished dependency is counted once.
- `JobDependency` (``queue_job_deps``): which job waits for which, one row per edge.

Like the queue tables, the relations are declared with ``db_constraint=False``: the
migration adds the foreign keys itself, with ``ON DELETE CASCADE`` (pruning a job
removes its step and its edges).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from .constraints import at_least, one_of
from .jobs import job_reference, one_row_per_job


class OnFailure(models.TextChoices):
    CANCEL = "cancel", "cancelled when a dependency fails"
    RUN = "run", "runs anyway once its dependencies finished"
    ERROR = "error", "runs only when a dependency failed (link_error)"


class Workflow(models.Model):
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255)
    steps = models.IntegerField()
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "queue_workflows"
        verbose_name = "workflow"

    def __str__(self) -> str:
        return f"workflow {self.name} #{self.pk}"


class WorkflowStep(models.Model):
    job = one_row_per_job(related_name="workflow_step")
    workflow = models.ForeignKey(
        Workflow,
        on_delete=models.CASCADE,
        db_constraint=False,
        db_index=False,  # the (workflow, name) unique index serves lookups by workflow
        related_name="step_rows",
    )
    name = models.CharField(max_length=255)
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices)
    waiting_for = models.IntegerField()
    failed = models.IntegerField(default=0)
    # The dependency whose failure cancelled this step (NULL: not cancelled by one).
    # An operator retry of that dependency puts the step back to waiting.
    cancelled_by = models.BigIntegerField(null=True, blank=True)
    # Whether the step takes its parents' results as one list whatever their number
    # (a chord's callback, a step after a group).
    collects = models.BooleanField(default=False, db_default=False)
    # Seconds the step waits after its last dependency finished (pgqueue_settle).
    delay = models.FloatField(default=0.0, db_default=0.0)

    class Meta:
        db_table = "queue_workflow_steps"
        verbose_name = "workflow step"
        constraints = [
            models.UniqueConstraint(fields=["workflow", "name"], name="queue_workflow_steps_name"),
            at_least(0, "waiting_for", "failed", name="queue_workflow_steps_counts"),
            one_of("on_failure", OnFailure, name="queue_workflow_steps_on_failure"),
        ]

    def __str__(self) -> str:
        return f"step {self.name} (job #{self.job_id})"


class JobDependency(models.Model):
    id = models.BigAutoField(primary_key=True)
    job = job_reference(related_name="dependencies", db_index=True)
    # The (depends_on, job) unique index serves the settle's lookups.
    depends_on = job_reference(related_name="dependents", db_index=False, db_column="depends_on")

    class Meta:
        db_table = "queue_job_deps"
        verbose_name = "job dependency"
        constraints = [
            models.UniqueConstraint(fields=["depends_on", "job"], name="queue_job_deps_edge"),
            models.CheckConstraint(
                condition=~models.Q(job=models.F("depends_on")), name="queue_job_deps_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"job #{self.job_id} waits for job #{self.depends_on_id}"
