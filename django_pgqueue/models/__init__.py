"""The app's tables, one module per group; every model and field is importable from here.

- `jobs`: the three queue tables (``queue_jobs``, ``queue_job_state``,
  ``queue_attempts``), their statuses, and the `DeadJob` proxy.
- `controls`: queue control (``queue_controls``, ``queue_type_controls``).
- `schedules`: recurring jobs (``queue_schedules``, ``queue_schedule_ticks``).
- `observability`: the worker registry (``queue_workers``) and the per-minute rollup
  (``queue_stats_minutely``).
- `waiters`: who waits for a job's outcome (``queue_job_waiters``).
- `workflows`: job dependencies and workflows (``queue_workflows``,
  ``queue_workflow_steps``, ``queue_job_deps``).
- `batches`: batches of jobs and their callbacks (``queue_batches``,
  ``queue_batch_jobs``).
- `durable`: a handler's checkpoints and the events it waits for (``queue_job_steps``,
  ``queue_events``, ``queue_event_waits``).
- `unique`: the unique keys held for a period (``queue_unique_keys``).
- `sequences`: the sequences of jobs run one at a time (``queue_sequences``).
- `constraints`: the checks and partial indexes several tables declare alike.

These modules are the foundation: they import Django and `validators` only, never a
feature of the queue, so any room may import them.
"""

from __future__ import annotations

from .batches import Batch, BatchJob
from .controls import QueueControl, QueueTypeControl, TimestampArray
from .durable import Event, EventWait, JobStep, StepKind
from .jobs import (
    FINISHED_STATUSES,
    Attempt,
    AttemptStatus,
    DeadJob,
    DeadJobManager,
    Job,
    JobState,
    Status,
)
from .observability import IntegerArrayField, MinuteStats, WorkerRecord, WorkerRequest
from .schedules import CatchUp, Schedule, ScheduleCode, ScheduleTick, Source
from .sequences import Sequence
from .unique import UniqueKey
from .waiters import JobWaiter
from .workflows import JobDependency, OnFailure, Workflow, WorkflowStep

__all__ = [
    "FINISHED_STATUSES",
    "Attempt",
    "AttemptStatus",
    "Batch",
    "BatchJob",
    "CatchUp",
    "DeadJob",
    "DeadJobManager",
    "Event",
    "EventWait",
    "IntegerArrayField",
    "Job",
    "JobDependency",
    "JobState",
    "JobStep",
    "JobWaiter",
    "MinuteStats",
    "OnFailure",
    "QueueControl",
    "QueueTypeControl",
    "Schedule",
    "ScheduleCode",
    "ScheduleTick",
    "Sequence",
    "Source",
    "Status",
    "StepKind",
    "TimestampArray",
    "UniqueKey",
    "WorkerRecord",
    "WorkerRequest",
    "Workflow",
    "WorkflowStep",
]
