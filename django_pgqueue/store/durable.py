"""The statements of durable execution (`sql/durable.sql`), on the handler's Django
connection to the job's database: a step's checkpoint joins the transaction the
handler's connection is in (an atomic step's), and an emit the caller's."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.db import connections

from ..sql import QUERIES
from .cursors import django_cursor, fetch_all, fetch_one
from .rows import complete_params


def _json(value: Any) -> Any:
    """A jsonb value as Python: Django's connections load jsonb as text."""
    return json.loads(value) if isinstance(value, str) else value


def load_steps(alias: str, job_id: int) -> tuple[dt.datetime, dict[str, tuple[str, Any]]]:
    """The database's clock and every checkpoint of `job_id`, {name: (kind, result)}:
    one statement, however many steps the job has."""
    row = fetch_one(alias, QUERIES["step_load"], {"job_id": job_id})
    assert row is not None
    steps = _json(row[1]) or {}
    return row[0], {name: (kind, result) for name, (kind, result) in steps.items()}


def record_step(
    alias: str,
    job_id: int,
    lease_version: int,
    name: str,
    kind: str,
    result: str,
    runtime: float | None,
) -> bool:
    """Record a step's checkpoint (`result`: its JSON) under the lease; False if not
    recorded (the lease was lost, or the step has a checkpoint already).

    A plain step's checkpoint written outside a transaction of the handler's commits
    without waiting for the disk (step_record's `flush`): losing it to a server crash
    runs the step again, as a worker killed before the commit would. An atomic step's
    (its writes are in the transaction), and one in a transaction the handler opened,
    wait for the disk as every other commit does."""
    flush = kind != "step" or connections[alias].in_atomic_block
    checkpoint = {"kind": kind, "result": result, "runtime": runtime, "flush": flush}
    return _record(alias, job_id, lease_version, name, checkpoint) is not None


def record_sleep(
    alias: str,
    job_id: int,
    lease_version: int,
    name: str,
    *,
    seconds: float | None = None,
    until: dt.datetime | None = None,
) -> tuple[str, float] | None:
    """Record a sleep's wake-up (after `seconds`, or at `until`) under the lease;
    (wake-up, seconds left by the database's clock), or None when not recorded."""
    checkpoint = {"kind": "sleep", "seconds": seconds, "wake_at": until}
    row = _record(alias, job_id, lease_version, name, checkpoint)
    return None if row is None else (row[0], float(row[1]))


def _record(
    alias: str, job_id: int, lease_version: int, name: str, checkpoint: dict[str, Any]
) -> tuple[Any, ...] | None:
    """Run step_record for the checkpoint `name` (a step's or a sleep's parameters)."""
    params = {
        "job_id": job_id,
        "lease_version": lease_version,
        "name": name,
        "result": None,
        "runtime": None,
        "seconds": None,
        "wake_at": None,
        "flush": True,
        **checkpoint,
    }
    return fetch_one(alias, QUERIES["step_record"], params)


def take_event(alias: str, job_id: int, lease_version: int, name: str, key: str) -> Any | None:
    """The checkpoint of a wait for `key` whose event was emitted already, recorded under
    the lease: {"payload": ...}; None when there is no such event yet (or the lease was
    lost)."""
    row = fetch_one(
        alias,
        QUERIES["event_take"],
        {"job_id": job_id, "lease_version": lease_version, "name": name, "key": key},
    )
    return None if row is None else _json(row[0])


def emit_event(alias: str, key: str, payload: str) -> tuple[bool, int]:
    """Store the event `key` with its JSON `payload` and deliver it to its waits, in the
    transaction of Django's connection `alias`: (whether this emit stored it, waits it
    was delivered to)."""
    row = fetch_one(alias, QUERIES["event_emit"], {"key": key, "payload": payload})
    assert row is not None
    return bool(row[0]), int(row[1])


def complete_job(
    alias: str, job_id: int, lease_version: int, attempt_id: int, result: str | None
) -> bool:
    """Complete a running job in the transaction of Django's connection `alias`, fenced
    by its lease (the worker's own ``job_complete``; a job an operator asked to cancel
    while it ran ends cancelled); False when the lease was lost."""
    params = complete_params([(job_id, lease_version, attempt_id, result)])
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_complete"], params)
        return cursor.fetchone() is not None


def drop_steps_from(alias: str, job_id: int, name: str) -> list[str]:
    """Delete the checkpoint `name` of a job an operator just retried, those recorded
    after it and its event wait, in the transaction of that retry (step_run_again):
    the names deleted, none when the job has no such checkpoint."""
    rows = fetch_all(alias, "step_run_again", {"job_id": job_id, "name": name})
    return [row[0] for row in rows]


def sleeps_due_now(alias: str, job_id: int) -> bool:
    """Testing: bring the pending job's sleeps due now; False if it has none pending."""
    return fetch_one(alias, QUERIES["step_sleep_due_now"], {"job_id": job_id}) is not None


def time_out_wait_now(alias: str, job_id: int) -> bool:
    """Testing: time the parked job's wait out now; False if it has no wait."""
    if fetch_one(alias, QUERIES["event_wait_due_now"], {"job_id": job_id}) is None:
        return False
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["event_wait_timeout"], {"limit": 1000})
    return True


def prune_events(
    alias: str, cutoff: Any, limit: int, after_key: str = ""
) -> tuple[int, str | None]:
    """Delete the events emitted before `cutoff` among the next `limit` keys above
    `after_key`: (how many deleted, the key to go on after, None when none is left)."""
    params = {"cutoff": cutoff, "limit": limit, "after_key": after_key}
    row = fetch_one(alias, QUERIES["event_prune_batch"], params)
    assert row is not None
    last, scanned, deleted = row
    return int(deleted), (last if scanned == limit else None)


def count_prunable_events(alias: str, cutoff: Any) -> int:
    """How many events a prune at `cutoff` would delete."""
    row = fetch_one(alias, QUERIES["event_prune_count"], {"cutoff": cutoff})
    assert row is not None
    return int(row[0])


def parked_counts(
    alias: str, queues: list[str], cap: int
) -> list[tuple[str, int, bool, int, bool]]:
    """Per queue of `queues`: (queue, jobs sleeping, whether that count stopped at
    `cap`, jobs parked for an event, whether that one did)."""
    if not queues:
        return []
    rows = fetch_all(alias, "stats_parked", {"queues": queues, "cap": cap})
    return [
        (queue, int(sleeping), scanned_later >= cap, int(awaiting), scanned_waiting >= cap)
        for queue, sleeping, scanned_later, awaiting, scanned_waiting in rows
    ]
