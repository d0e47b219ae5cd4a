"""django_pgqueue: a reliable PostgreSQL job queue for Django.

Enqueue in the caller's transaction, claim with FOR UPDATE SKIP LOCKED, hold jobs
with leases renewed by a heartbeat, and finish them with writes fenced by a lease
version, so a stale worker can never overwrite a newer owner's result.
"""

from .aenqueue import aatomic, aenqueue, aenqueue_many
from .context import JobContext, current_job
from .control.api import (
    pause_queue,
    queue_controls,
    resume_queue,
    set_key_limit,
    set_queue_limit,
    set_queue_rate,
)
from .durable import StepMismatch, emit_event
from .enqueue import EnqueuedJob, JobSpec, enqueue, enqueue_many
from .exceptions import (
    AwaitEvent,
    BatchNotFound,
    ConfigurationError,
    EnqueueError,
    EventTimeout,
    JobCancelled,
    JobDead,
    JobFailed,
    JobNotFound,
    JobTimeout,
    LeaseExpired,
    PayloadError,
    PermanentFailure,
    PgQueueError,
    ResultNotStorable,
    RetryLater,
    Snooze,
    SoftTimeLimitExceeded,
    StepNotRecorded,
    TimeLimitExceeded,
    UniqueConflict,
    UnknownJobType,
    WaitTimeout,
    WorkerShutdown,
    WorkflowFailed,
)
from .registry import handler
from .retry import ExponentialBackoff, FixedDelay, RetryPolicy
from .unique import Unique
from .version import __version__ as __version__
from .waiting import await_job, wait
from .workflows import (
    Step,
    StepFailure,
    Workflow,
    abatch,
    batch,
    batch_status,
    chain,
    chord,
    group,
    parent_results,
    step,
)

__all__ = [
    "AwaitEvent",
    "BatchNotFound",
    "ConfigurationError",
    "EnqueueError",
    "EnqueuedJob",
    "EventTimeout",
    "ExponentialBackoff",
    "FixedDelay",
    "JobCancelled",
    "JobContext",
    "JobDead",
    "JobFailed",
    "JobNotFound",
    "JobSpec",
    "JobTimeout",
    "LeaseExpired",
    "PayloadError",
    "PermanentFailure",
    "PgQueueError",
    "ResultNotStorable",
    "RetryLater",
    "RetryPolicy",
    "Snooze",
    "SoftTimeLimitExceeded",
    "Step",
    "StepFailure",
    "StepMismatch",
    "StepNotRecorded",
    "TimeLimitExceeded",
    "Unique",
    "UniqueConflict",
    "UnknownJobType",
    "WaitTimeout",
    "WorkerShutdown",
    "Workflow",
    "WorkflowFailed",
    "aatomic",
    "abatch",
    "aenqueue",
    "aenqueue_many",
    "await_job",
    "batch",
    "batch_status",
    "chain",
    "chord",
    "current_job",
    "emit_event",
    "enqueue",
    "enqueue_many",
    "group",
    "handler",
    "parent_results",
    "pause_queue",
    "queue_controls",
    "resume_queue",
    "set_key_limit",
    "set_queue_limit",
    "set_queue_rate",
    "step",
    "wait",
]
