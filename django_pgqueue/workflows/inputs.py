"""What a step that takes its parents' results receives: their results, or a failure.

Celery hands a chained task its parent's result as its first argument, a chord's
callback the list of its group's results, and an errback the failed task's request,
exception and traceback. A step opts in (``step(task, takes_results=True)``,
``@handler(..., takes_results=True)``) and receives the same, read from the database
when its attempt starts.
"""

from __future__ import annotations

from typing import Any

from ..job_refs import job_reference
from ..store import workflows as store


class StepFailure(dict[str, Any]):
    """The failed step a ``link_error`` step runs for: Celery's errback arguments.

    A dict (a task's arguments are JSON, as Django's Tasks store them) whose keys read
    as attributes too: `job_id` and `step` name the failed job; `status` is "dead" or
    "cancelled"; `error` is its last error as the admin shows it, `error_class` and
    `traceback` those of its last failed attempt (None for a job that never ran).
    """

    job_id = property(lambda self: self["job_id"])
    step = property(lambda self: self["step"])
    status = property(lambda self: self["status"])
    error = property(lambda self: self["error"])
    error_class = property(lambda self: self["error_class"])
    traceback = property(lambda self: self["traceback"])


def results_arguments(job: Any) -> list[Any]:
    """The arguments `job` (a `JobContext`) receives before its own: see
    `JobContext.results_arguments`."""
    ref = job_reference(job, None, caller="results_arguments()")
    found = store.step_input(ref.database, ref.id)
    if found is None:
        return []  # not a workflow step: nothing to receive
    collects, on_failure = found
    if on_failure == "error":
        failures = store.parent_failures(ref.database, ref.id)
        # The dead one first: a cancelled parent was mostly cancelled by its failure.
        failures.sort(key=lambda failed: failed.status != "dead")
        if not failures:
            return [None]
        first = failures[0]
        failure = StepFailure(
            job_id=first.job_id,
            step=first.name,
            status=first.status,
            error=first.error,
            error_class=first.error_class,
            traceback=first.traceback,
        )
        return [failure]
    rows = store.parent_results(ref.database, ref.id)
    results = [result if status == "completed" else None for _, _, status, result in rows]
    if collects or len(results) > 1:
        return [results]
    return results
