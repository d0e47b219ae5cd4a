"""The three queue tables. Their names and columns are part of the public contract.

- `Job` (``queue_jobs``): what to run. Written once at enqueue, never updated, but for
  a debounce (``Unique(..., on_conflict="replace")``), which replaces the payload of a
  job still pending and never claimed, under its state row's lock.
- `JobState` (``queue_job_state``): the hot row a worker claims, renews and finishes.
  Kept narrow (no payload) so claims, heartbeats and vacuum touch little.
- `Attempt` (``queue_attempts``): one row per claim, with its outcome.
- `DeadJob`: a proxy of `Job` limited to dead jobs, for their own admin page.

Workers never write these through the ORM: every state change is a fenced statement in
`django_pgqueue/sql/core.sql`. The relations are declared with
``db_constraint=False`` because the migrations hold them in the database
themselves, by construction and triggers: every statement that inserts a state row
inserts its job, with the same id and queue, and only the claim inserts attempts, for
the state rows it updated; a job's id and queue and an attempt's job never change;
deleting jobs deletes their state rows, and deleting state rows their attempts (see
the squashed migration and 0031).

The CHECK constraints are created by the migrations too, one per table, each as one
call to a small PL/pgSQL function (``queue_job_state_valid`` ...). PostgreSQL re-reads
every CHECK expression from its stored form for every statement that writes the table,
which for a dozen Django-generated expressions cost a third of a single enqueue; one
function call per table keeps every invariant for a fraction of that, and its error
message names the invariant that was broken.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from .constraints import set_values_index, unique_in_queue


class Status(models.TextChoices):
    WAITING = "waiting", "waiting (for its dependencies)"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


FINISHED_STATUSES = (Status.COMPLETED, Status.DEAD, Status.CANCELLED)


class AttemptStatus(models.TextChoices):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    LOST = "lost", "lost (lease expired)"
    RELEASED = "released", "released (never started)"
    SNOOZED = "snoozed", "snoozed (attempt given back)"
    INTERRUPTED = "interrupted", "interrupted (the worker stopped; attempt given back)"


def one_row_per_job(related_name: str) -> models.OneToOneField:
    """The primary key of a table with one row per job: the job's id, in ``job_id``.

    Declared without a constraint; the migration adds the foreign key, with ``ON
    DELETE CASCADE`` (deleting a job deletes its row).
    """
    return models.OneToOneField(
        "django_pgqueue.Job",
        primary_key=True,
        on_delete=models.CASCADE,
        db_column="job_id",
        db_constraint=False,
        related_name=related_name,
    )


def job_reference(
    related_name: str, *, db_index: bool, db_column: str = "job_id"
) -> models.ForeignKey:
    """A reference to a job, in `db_column`, from a table with any number of rows per job.

    Declared without a constraint, like `one_row_per_job`; the migrations hold it
    (deleting a job deletes its rows): a foreign key with ``ON DELETE CASCADE`` for the
    workflow edges, construction and triggers for the attempts (0031).
    """
    return models.ForeignKey(
        "django_pgqueue.Job",
        on_delete=models.CASCADE,
        db_column=db_column,
        db_constraint=False,
        db_index=db_index,
        related_name=related_name,
    )


def queue_name_column(**options: Any) -> models.CharField:
    """The column that names a queue, in every table that has one: 1 to 63 characters
    (`validators.QUEUE_NAME_RE`)."""
    return models.CharField(max_length=63, **options)


def type_name_column(**options: Any) -> models.CharField:
    """The column that names a job type: 1 to 255 characters (`validators.TYPE_NAME_RE`)."""
    return models.CharField(max_length=255, **options)


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    queue = queue_name_column()
    type = type_name_column()
    payload = models.JSONField()
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    # The W3C traceparent of the span that enqueued the job (OpenTelemetry), if any.
    traceparent = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "queue_jobs"
        verbose_name = "job"
        permissions = [("operate_job", "Can retry and cancel jobs")]
        # Migration 0002 also adds queue_jobs_created_brin, a BRIN index on created_at
        # for the admin's date filter (raw SQL: BrinIndex needs django.contrib.postgres
        # in INSTALLED_APPS).
        indexes = [
            # The admin's type filter and search by type: newest first, whatever the type.
            models.Index(fields=["type", "id"], name="queue_jobs_type_idx"),
            # The admin's search by idempotency key; unkeyed jobs take no space in it.
            set_values_index("idempotency_key", name="queue_jobs_key_idx"),
        ]
        constraints = [
            # CHECK queue_jobs_valid: queue and type names have their documented shape
            # (created by the migration; see the note in the module docstring).
        ]

    def __str__(self) -> str:
        return f"{self.type} #{self.pk} on {self.queue}"


# Which state rows hold their unique key (see JobState.unique_hold); the statements ask
# pgqueue_holds_unique_key, the same rule, which the planner proves
# is this index's predicate. A "pending" hold is
# a job's until it is first claimed (lease_version 0, which only grows): a retried or
# swept job going back to pending never meets a newer holder of its key. An "active" hold
# covers a durable job parked for an event (waiting): its wake-up must find the key free.
UNIQUE_HELD = (
    Q(unique_hold="pending", status="pending", lease_version=0)
    | Q(unique_hold="active", status__in=["waiting", "pending", "running"])
    | Q(unique_hold="until_completed", status__in=["waiting", "pending", "running", "dead"])
)


class JobState(models.Model):
    job = one_row_per_job(related_name="state")
    queue = queue_name_column()
    status = models.CharField(max_length=16, choices=Status.choices, db_default=Status.PENDING)
    priority = models.SmallIntegerField(db_default=0)
    run_at = models.DateTimeField(db_default=Now())
    attempts = models.IntegerField(db_default=0)
    max_attempts = models.IntegerField()
    lease_version = models.BigIntegerField(db_default=0)
    locked_by = models.CharField(max_length=255, null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    # A copy of the job's key: a partial unique index can only see its own table,
    # and "one live job per key" depends on this row's status.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    updated_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    # Queue control: at most the queue's key_limit running jobs share a
    # concurrency key. cancel_requested_at marks a running job an operator cancelled:
    # its status stays running until the fenced write that ends the attempt.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # Workflows: true when other jobs wait for this one (queue_job_deps), set by the
    # statement that inserts them. The statements that end a job settle its dependents
    # only when it is set, so a plain job (NULL: no byte, a bit of the null bitmap)
    # costs them no lookup.
    has_dependents = models.BooleanField(null=True, blank=True)
    # Unique jobs (django_pgqueue.Unique): the key, and how long this job holds it
    # (pending, active, until_completed; period: held by a queue_unique_keys row
    # instead). NULL for a job without one: it never enters the unique index.
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    unique_hold = models.CharField(max_length=16, null=True, blank=True)
    # Fair queues (PGQUEUE["FAIR_QUEUES"]): the key whose turn a claim gives this job;
    # every job of a fair queue has one ('' when enqueue() was given none). NULL in
    # any other queue: the row never enters the fair index.
    fair_key = models.CharField(max_length=255, null=True, blank=True)
    # Sequences (enqueue(sequence=...)): the job's sequence key, and whether the
    # sequence waits behind it when it ends dead ('hold') or goes on ('continue'). NULL
    # for a job of no sequence. A sequenced job has has_dependents set: its end moves its
    # sequence on (pgqueue_sequence_next, called by pgqueue_settle).
    sequence_key = models.CharField(max_length=255, null=True, blank=True)
    sequence_on_failure = models.CharField(max_length=8, null=True, blank=True)

    class Meta:
        db_table = "queue_job_state"
        verbose_name = "job state"
        indexes = [
            # The claim walks this index in order for one queue and stops after LIMIT
            # rows; see the job_claim statement. Its shape is part of the contract.
            models.Index(
                fields=["queue", "-priority", "run_at", "job"],
                name="queue_job_state_claim_idx",
                condition=Q(status="pending"),
            ),
            # Only running rows: what the lease sweep reads. It indexes no column a
            # heartbeat changes (locked_until), so renewals can be HOT updates.
            models.Index(
                fields=["job"],
                name="queue_job_state_running_idx",
                condition=Q(status="running"),
            ),
            # Dead and cancelled rows by status and age: the dead jobs page walks it
            # backwards (newest death first), requeue_dead forwards. Completed jobs,
            # nearly all the rows, stay out of it: an index over every finished job
            # would grow the hot table's indexes by half again once a queue is drained.
            # (The prune command walks the primary key instead.)
            models.Index(
                fields=["status", "finished_at", "job"],
                name="queue_job_state_failed_age_idx",
                condition=Q(status__in=["dead", "cancelled"]),
            ),
            # Dead and cancelled jobs per queue, counted by an index-only scan for the
            # admin's figures. Only rows that failed or were cancelled enter it.
            models.Index(
                fields=["queue", "status"],
                name="queue_job_state_failed_idx",
                condition=Q(status__in=["dead", "cancelled"]),
            ),
            # Waiting jobs (workflow steps whose dependencies have not finished) per
            # queue, for the figures: a plain job never enters it.
            models.Index(
                fields=["queue"],
                name="queue_job_state_waiting_idx",
                condition=Q(status="waiting"),
            ),
            # Running jobs that carry a concurrency key, by key: the per-key count of
            # the controlled claim. Rows without a key (all of an unkeyed queue) never
            # enter it, so unlimited queues pay nothing for it; no heartbeat column.
            models.Index(
                fields=["queue", "concurrency_key"],
                name="queue_job_state_run_key_idx",
                condition=Q(status="running", concurrency_key__isnull=False),
            ),
            # A fair queue's pending jobs by key, each key's in claim order: the fair
            # claim walks the keys (a skip scan) and takes each key's first jobs.
            models.Index(
                fields=["queue", "fair_key", "-priority", "run_at", "job"],
                name="queue_job_state_fair_idx",
                condition=Q(status="pending", fair_key__isnull=False),
            ),
            # A sequence's waiting jobs in enqueue order: the next one is the first.
            models.Index(
                fields=["queue", "sequence_key", "job"],
                name="queue_job_state_sequence_idx",
                condition=Q(status="waiting", sequence_key__isnull=False),
            ),
            # Dead jobs that hold their sequence back, oldest death first: the held
            # sequences page reads these (a sequence's head among them).
            models.Index(
                fields=["finished_at", "job"],
                name="queue_job_state_held_idx",
                condition=Q(status="dead", sequence_on_failure="hold"),
            ),
        ]
        constraints = [
            unique_in_queue(
                "idempotency_key",
                name="queue_job_state_live_key_unique",
                condition=Q(idempotency_key__isnull=False, status__in=["pending", "running"]),
            ),
            # One holder per (queue, unique key), while the holder's own hold says it
            # holds it. The database's pgqueue_holds_unique_key is this predicate, which the
            # enqueue's ON CONFLICT names (the planner inlines it to infer this index).
            unique_in_queue("unique_key", name="queue_job_state_unique_key", condition=UNIQUE_HELD),
            # CHECK queue_job_state_valid: status is known, priority in -100..100,
            # 0 <= attempts <= max_attempts, lease_version >= 0, a row is running
            # exactly when it has an owner and a lease end, finished exactly when it
            # has finished_at, and a sequenced job says what its failure does ('hold'
            # or 'continue') while another says nothing (created by the migrations).
        ]

    def __str__(self) -> str:
        return f"job #{self.pk}: {self.status}"


class Attempt(models.Model):
    id = models.BigAutoField(primary_key=True)
    # The (job_id, lease_version) unique index serves lookups by job.
    job = job_reference(related_name="attempts", db_index=False)
    lease_version = models.BigIntegerField()
    attempt_index = models.IntegerField()
    worker_id = models.CharField(max_length=255)
    status = models.CharField(
        max_length=16, choices=AttemptStatus.choices, db_default=AttemptStatus.RUNNING
    )
    started_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    error_class = models.CharField(max_length=255, null=True, blank=True)
    error_message = models.TextField(null=True, blank=True)
    traceback = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    class Meta:
        db_table = "queue_attempts"
        constraints = [
            models.UniqueConstraint(
                fields=["job", "lease_version"], name="queue_attempts_job_lease_unique"
            ),
            # CHECK queue_attempts_valid: status is known, lease_version and
            # attempt_index >= 1, finished_at set exactly when the attempt is over
            # (created by the migration).
        ]
        verbose_name = "attempt"

    def __str__(self) -> str:
        # The admin numbers attempts across operator retries (number_in_job); the
        # attempt_index starts again at 1 after one.
        number = getattr(self, "number_in_job", self.attempt_index)
        return f"attempt {number} of job #{self.job_id} ({self.status})"


class DeadJobManager(models.Manager["DeadJob"]):
    def get_queryset(self) -> models.QuerySet[DeadJob]:
        # Served by the partial queue_job_state_failed_age_idx: dead jobs newest
        # first without a sort.
        return super().get_queryset().filter(state__status=Status.DEAD)


class DeadJob(Job):
    """A job that died: attempts spent or a permanent failure. Newest death first."""

    objects = DeadJobManager()

    class Meta:
        proxy = True
        verbose_name = "dead job"
        ordering = ["-state__finished_at"]
