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


def workflow_jobs(alias: str, workflow_id: int) -> list[tuple[int, str]]:
    """A workflow's jobs with their status: [(job id, status)]."""
    return [(int(j), s) for j, s in fetch_all(alias, "workflow_jobs", {"workflow_id": workflow_id})]


def workflow_steps(alias: str, workflow_id: int) -> list[tuple[Any, ...]]:
    """A workflow's steps: (job id, name, type, status, on_failure, waiting_for, failed,
    parents)."""
    return fetch_all(alias, "workflow_steps", {"workflow_id": workflow_id})
