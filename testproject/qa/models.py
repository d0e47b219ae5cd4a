from django.db import models
from django.db.models.functions import Now


class LedgerEntry(models.Model):
    """One execution of a qa handler, written on the handler's own connection."""

    job_id = models.BigIntegerField(db_index=True)
    lease_version = models.BigIntegerField()
    attempt = models.IntegerField()
    pid = models.IntegerField()
    worker_id = models.TextField()
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True)

    class Meta:
        db_table = "qa_ledger"

    def __str__(self) -> str:
        return f"job {self.job_id} v{self.lease_version} in pid {self.pid}"


class TaskCall(models.Model):
    """One call of a qa task, written by the task itself (the id gives the order)."""

    label = models.TextField()
    attempt = models.IntegerField(default=0)
    called_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "qa_task_call"

    def __str__(self) -> str:
        return f"{self.label} (attempt {self.attempt})"


class DurableCall(models.Model):
    """One call of a durable step's function, committed at once (counts re-executions)."""

    job_id = models.BigIntegerField(db_index=True)
    step = models.TextField()
    lease_version = models.BigIntegerField()
    called_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "qa_durable_call"

    def __str__(self) -> str:
        return f"{self.step} of job {self.job_id} v{self.lease_version}"


class DurableEffect(models.Model):
    """The database effect of an atomic step: at most one per (job, step)."""

    job_id = models.BigIntegerField()
    step = models.TextField()
    lease_version = models.BigIntegerField()

    class Meta:
        db_table = "qa_durable_effect"
        constraints = [
            models.UniqueConstraint(fields=["job_id", "step"], name="qa_durable_effect_once")
        ]

    def __str__(self) -> str:
        return f"{self.step} of job {self.job_id}"
