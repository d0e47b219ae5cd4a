"""Batches on the caller's Django connection: close one, find a job's, read its counts.

A batch is written when its block closes, in the caller's transaction: its row and
members (``batch_insert``), its callbacks as a workflow (`workflows.insert_workflow`),
then the edges from each callback to every member (``batch_link``). Settling the
callbacks is the fenced finishing statements' own work (``pgqueue_settle``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..sql import QUERIES
from .arrays import int_array
from .cursors import django_cursor, fetch_all


def insert_batch(alias: str, name: str, members: Sequence[int]) -> tuple[int, list[int]]:
    """Insert a batch and its members; return (batch id, the members that exist)."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["batch_insert"], {"name": name, "members": int_array(members)})
        batch_id, live = cursor.fetchone()
    return int(batch_id), [int(job_id) for job_id in live]


def link_batch(
    alias: str, batch_id: int, workflow_id: int, callbacks: Sequence[int], members: Sequence[int]
) -> None:
    """Make the `callbacks` (job ids of the batch's workflow) wait for every member."""
    params = {
        "batch_id": batch_id,
        "workflow_id": workflow_id,
        "callbacks": int_array(callbacks),
        "members": int_array(members),
    }
    fetch_all(alias, "batch_link", params)


def find_batch(alias: str, job_id: int) -> int | None:
    """The batch `job_id` is a member or a callback of, or None."""
    rows = fetch_all(alias, "batch_find", {"job_id": job_id})
    return int(rows[0][0]) if rows and rows[0][0] is not None else None


def batch_status(alias: str, batch_id: int) -> tuple[Any, ...] | None:
    """(id, name, size, created_at, {status: count}, [[callback, job id, status]]), or None."""
    rows = fetch_all(alias, "batch_status", {"batch_id": batch_id})
    if not rows:
        return None
    row = list(rows[0])
    row[4:6] = [json.loads(value) if isinstance(value, str) else value for value in row[4:6]]
    return tuple(row)
