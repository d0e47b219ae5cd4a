"""Workflows on the caller's Django connection: insert one, read its steps and results.

A workflow is inserted in one statement (``workflow_enqueue``), so it exists only if
the caller's transaction commits, whole or not at all. The statements that settle a
step when its dependencies end are the worker's and the operator's own
(``job_complete``, ``job_fail``, ``job_cancel``, ``lease_sweep`` ...): nothing here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from django.db import transaction

from ..sql import QUERIES
from .arrays import int_array, text_array, text_element
from .cursors import django_cursor, fetch_all

# Steps and edges from which a workflow's statement is sent with JIT off: below, the
# planner's estimate stays under jit_above_cost and nothing is compiled.
NO_JIT_ROWS = 1_000


class StepRow(NamedTuple):
    """One validated step to insert: its job's options and its place in the workflow."""

    type: str
    queue: str
    priority: int
    run_at: Any
    delay: float
    max_attempts: int
    name: str
    on_failure: str
    waiting_for: int
    # Takes its parents' results as one list, whatever their number.
    collects: bool = False


def insert_workflow(
    alias: str,
    name: str,
    steps: Sequence[StepRow],
    payloads: str,
    edges: Sequence[tuple[int, int]],
    traceparent: str | None = None,
) -> tuple[int, list[int]]:
    """Insert a workflow's steps and edges; return (workflow id, job ids in step order).

    `payloads` is the JSON array text of the steps' payloads; `edges` are (child,
    parent) positions, 0-based, in `steps`.
    """
    waited_on = {parent for _, parent in edges}
    params = {
        "name": name,
        "types": text_array([s.type for s in steps]),
        "queues": text_array([s.queue for s in steps]),
        "priorities": int_array([s.priority for s in steps]),
        "run_ats": "{"
        + ",".join(
            ["NULL" if s.run_at is None else text_element(s.run_at.isoformat()) for s in steps]
        )
        + "}",
        "delays": "{" + ",".join([repr(float(s.delay)) for s in steps]) + "}",
        "max_attempts": int_array([s.max_attempts for s in steps]),
        "names": text_array([s.name for s in steps]),
        "on_failures": text_array([s.on_failure for s in steps]),
        "waiting_for": int_array([s.waiting_for for s in steps]),
        "collects": "{" + ",".join(["t" if s.collects else "f" for s in steps]) + "}",
        "has_dependents": "{"
        + ",".join(["t" if index in waited_on else "NULL" for index in range(len(steps))])
        + "}",
        "children": int_array([child + 1 for child, _ in edges]),
        "parents": int_array([parent + 1 for _, parent in edges]),
        "payloads": payloads,
        "traceparent": traceparent,
    }
    if len(steps) + len(edges) < NO_JIT_ROWS:
        with django_cursor(alias) as cursor:
            cursor.execute(QUERIES["workflow_enqueue"], params)
            workflow_id, job_ids = cursor.fetchone()
    else:
        # JIT off for this statement only: set for a (sub)transaction of its own, put
        # back after it; an error rolls the setting back with the statement.
        with transaction.atomic(using=alias), django_cursor(alias) as cursor:
            cursor.execute(QUERIES["workflow_no_jit"])
            jit = cursor.fetchone()[0]
            cursor.execute(QUERIES["workflow_enqueue"], params)
            workflow_id, job_ids = cursor.fetchone()
            cursor.execute(QUERIES["workflow_jit_back"], {"jit": jit})
    return int(workflow_id), [int(job_id) for job_id in job_ids]


def parent_results(alias: str, job_id: int) -> list[tuple[str, int, str, Any]]:
    """The jobs `job_id` waits for: [(step name, job id, status, stored result)]."""
    rows = fetch_all(alias, "workflow_parent_results", {"job_id": job_id})
    return [
        (name, int(parent), status, json.loads(result) if isinstance(result, str) else result)
        for name, parent, status, result in rows
    ]


def step_input(alias: str, job_id: int) -> tuple[bool, str] | None:
    """(whether step `job_id` takes its parents' results as one list, its on_failure),
    or None when the job is no workflow step."""
    rows = fetch_all(alias, "workflow_step_input", {"job_id": job_id})
    return (bool(rows[0][0]), rows[0][1]) if rows else None


class FailedParent(NamedTuple):
    """A job a step waits for that ended dead or cancelled, and why."""

    name: str
    job_id: int
    status: str
    error: str | None
    error_class: str | None
    traceback: str | None


def parent_failures(alias: str, job_id: int) -> list[FailedParent]:
    """The jobs `job_id` waits for that ended dead or cancelled, in job id order."""
    rows = fetch_all(alias, "workflow_parent_failures", {"job_id": job_id})
    return [FailedParent(name, int(parent), *rest) for name, parent, *rest in rows]


def workflow_failure(alias: str, workflow_id: int) -> tuple[str, int, str, str | None] | None:
    """(step name, job id, status, last error) of the workflow's first step that failed
    by itself (dead, or cancelled by an operator), or None."""
    rows = fetch_all(alias, "workflow_failure", {"workflow_id": workflow_id})
    return (rows[0][0], int(rows[0][1]), rows[0][2], rows[0][3]) if rows else None


def workflow_jobs(alias: str, workflow_id: int) -> list[tuple[int, str]]:
    """A workflow's jobs with their status: [(job id, status)]."""
    return [(int(j), s) for j, s in fetch_all(alias, "workflow_jobs", {"workflow_id": workflow_id})]


class WorkflowSummary(NamedTuple):
    """A workflow as the admin lists it: its steps counted by status, and its times."""

    id: int
    name: str
    steps: int
    created_at: Any
    waiting: int
    pending: int
    running: int
    completed: int
    dead: int
    cancelled: int
    skipped: int
    started_at: Any
    finished_at: Any
    state: str

    @property
    def done(self) -> int:
        """Steps finished, whatever their outcome."""
        return self.completed + self.dead + self.cancelled + self.skipped

    @property
    def present(self) -> int:
        """Steps still in the tables (prune_queue_jobs deletes a finished workflow's)."""
        return self.done + self.running + self.pending + self.waiting


class StepDetail(NamedTuple):
    """One step as a workflow's admin page shows it."""

    job_id: int
    name: str
    type: str
    queue: str
    status: str
    attempts: int
    max_attempts: int
    on_failure: str
    finished_at: Any
    parents: list[int]


def workflow_page(
    alias: str, before: int | None, limit: int, state: str | None = None, scan: int | None = None
) -> tuple[list[WorkflowSummary], int | None]:
    """Workflows with ids below `before` (None: from the newest), newest first.

    Return (at most `limit` summaries, the id the next page starts below, None at the
    end). With a `state` the page reads at most `scan` workflows, so a rare state
    cannot make one page read the whole table: a short page then goes on from the
    last workflow it read.
    """
    read = limit + 1 if state is None else max(scan or 0, limit + 1)
    rows = fetch_all(
        alias,
        "workflow_page",
        {
            "before": 2**63 - 1 if before is None else before,
            "scan": read,
            "limit": limit + 1,
            "state": state,
        },
    )
    found = [WorkflowSummary(*row[:-2]) for row in rows if row[0] is not None]
    if len(found) > limit:
        return found[:limit], found[limit - 1].id
    scanned_to, scanned = rows[0][-2:] if rows else (None, 0)
    return found, (scanned_to if scanned == read else None)


def workflow_summary(alias: str, workflow_id: int) -> WorkflowSummary | None:
    """One workflow's summary (None if there is no such workflow)."""
    rows = fetch_all(
        alias,
        "workflow_page",
        {"before": workflow_id + 1, "scan": 1, "limit": 1, "state": None},
    )
    found = [WorkflowSummary(*row[:-2]) for row in rows if row[0] == workflow_id]
    return found[0] if found else None


def step_details(alias: str, workflow_id: int, limit: int) -> list[StepDetail]:
    """A workflow's first `limit` steps, parents before children (job id order)."""
    rows = fetch_all(alias, "workflow_step_details", {"workflow_id": workflow_id, "limit": limit})
    return [StepDetail(*row[:-1], [int(p) for p in row[-1]]) for row in rows]


def workflow_of_job(alias: str, job_id: int) -> tuple[int, str, str] | None:
    """(workflow id, workflow name, step name) of the workflow `job_id` is a step of."""
    rows = fetch_all(alias, "workflow_of_job", {"job_id": job_id})
    return (int(rows[0][0]), rows[0][1], rows[0][2]) if rows else None
