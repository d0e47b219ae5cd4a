"""Workflows: jobs that wait for other jobs (a feature on the core).

- `steps`: `Step` (a job type and payload, or a ``@task`` call) and `step()`;
- `builder`: `Workflow`, a DAG of named steps written in one statement, and
  `cancel_workflow`;
- `canvas`: Celery's `chain`, `group` and `chord` on top of it, and ``|``;
- `inputs`: what a step that takes its parents' results receives (`StepFailure` for
  a link_error step);
- `batches`: `batch`, a block whose enqueued jobs form a batch with callbacks
  (``on_success``, ``on_finish``, ``on_discard``), its async spelling `abatch`, and
  `batch_status`.

The waiting itself is data (``queue_job_deps``, ``queue_workflow_steps``): the core's
statements that end a job settle its dependents in the same statement, so nothing
here runs in the worker. Importing this package lets a handler read its parents'
results through ``ctx.parent_results``.
"""

from __future__ import annotations

from typing import Any

from .. import context
from ..job_refs import job_reference
from ..store import workflows as store
from .batches import BatchRun, BatchStatus, abatch, batch, batch_status
from .builder import Workflow, WorkflowRun, cancel_workflow
from .canvas import Canvas, chain, chord, group
from .inputs import StepFailure, results_arguments
from .steps import ON_FAILURE, Step, step

__all__ = [
    "ON_FAILURE",
    "BatchRun",
    "BatchStatus",
    "Canvas",
    "Step",
    "StepFailure",
    "Workflow",
    "WorkflowRun",
    "abatch",
    "batch",
    "batch_status",
    "cancel_workflow",
    "chain",
    "chord",
    "group",
    "parent_results",
    "step",
]


def parent_results(job: Any, *, using: str | None = None) -> dict[str, Any]:
    """The stored results of the jobs `job` waits for, by step name, in step order.

    `job` is a `JobContext`, a Django ``TaskContext`` (a ``@task`` with
    ``takes_context=True``), or any reference `wait()` takes, read on its database (a
    bare job id on PGQUEUE["DATABASE"], or `using`). Only completed parents are listed:
    one that ended dead or cancelled (a step with on_failure "run" or a link_error
    step) is missing.
    """
    ref = job_reference(job, using, caller="parent_results()")
    return {
        name: result
        for name, _, status, result in store.parent_results(ref.database, ref.id)
        if status == "completed"
    }


context.parent_results_reader = parent_results
context.batch_reader = batch_status
context.results_arguments_reader = results_arguments
