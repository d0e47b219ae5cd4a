"""Inserting jobs, on the caller's Django connection.

A job exists only if the caller's transaction commits; the NOTIFY that wakes the
workers is delivered at that commit too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import PgQueueError
from ..sql import QUERIES
from .arrays import int_array, text_array
from .cursors import django_cursor

_LOOKUP_RETRIES = 5


def insert_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Insert one job on Django's connection `alias`; return (job id, created, created_at)."""
    keyed = params["idempotency_key"] is not None
    with django_cursor(alias) as cursor:
        for _ in range(_LOOKUP_RETRIES if keyed else 1):
            cursor.execute(QUERIES["job_enqueue_keyed" if keyed else "job_enqueue"], params)
            row = cursor.fetchone()
            if row is not None:
                return int(row[0]), bool(row[1]), row[2]
            # A concurrent transaction took the idempotency key after this statement's
            # snapshot and committed; the next statement sees it.
    raise PgQueueError(
        f"Could not enqueue: the idempotency key {params['idempotency_key']!r} on queue "
        f"{params['queue']!r} keeps changing hands; try again."
    )


# Jobs per enqueue_many statement: large enough to amortize a round trip and a plan,
# small enough that the plan's estimated cost stays well below jit_above_cost.
BULK_CHUNK = 20_000

BulkRow = tuple[str, str, int, Any, float, int, "str | None"]


def insert_jobs(
    alias: str,
    rows: Sequence[BulkRow],
    payloads: Sequence[str],
    traceparent: str | None = None,
) -> list[tuple[int, bool]]:
    """Insert validated jobs on Django's connection `alias`; return [(job id, created)].

    `rows` are (type, queue, priority, run_at, delay, max_attempts, idempotency_key);
    `payloads` the JSON array text of each BULK_CHUNK slice of them; `traceparent`
    the trace context every one of them is stored with.
    """
    results: list[tuple[int, bool]] = []
    with django_cursor(alias) as cursor:
        for index, payload_text in enumerate(payloads):
            chunk = rows[index * BULK_CHUNK : (index + 1) * BULK_CHUNK]
            params = {
                "types": text_array(row[0] for row in chunk),
                "queues": text_array(row[1] for row in chunk),
                "priorities": int_array(row[2] for row in chunk),
                "run_ats": text_array(
                    None if row[3] is None else row[3].isoformat() for row in chunk
                ),
                "delays": "{" + ",".join(repr(row[4]) for row in chunk) + "}",
                "max_attempts": int_array(row[5] for row in chunk),
                "payloads": payload_text,
                "traceparent": traceparent,
            }
            if all(row[6] is None for row in chunk):
                cursor.execute(QUERIES["job_enqueue_many"], params)
                results.extend((int(job_id), True) for (job_id,) in cursor.fetchall())
            else:
                results.extend(_insert_keyed(cursor, chunk, params))
    return results


def _insert_keyed(
    cursor: Any, chunk: Sequence[BulkRow], params: dict[str, str | None]
) -> list[tuple[int, bool]]:
    cursor.execute(
        QUERIES["job_enqueue_many_keyed"],
        {**params, "idempotency_keys": text_array(row[6] for row in chunk)},
    )
    created = {position: int(job_id) for position, job_id in cursor.fetchall()}
    found: dict[int, int] = {}
    for _ in range(_LOOKUP_RETRIES):
        missing = [p for p in range(1, len(chunk) + 1) if p not in created and p not in found]
        if not missing:
            break
        # Holders of the keys that were skipped: earlier positions of this call (the
        # statement above is visible to this one) or live jobs inserted before it.
        cursor.execute(
            QUERIES["job_live_by_keys"],
            {
                "queues": text_array(chunk[p - 1][1] for p in missing),
                "idempotency_keys": text_array(chunk[p - 1][6] for p in missing),
            },
        )
        for index, job_id in cursor.fetchall():
            if job_id is not None:
                found[missing[index - 1]] = int(job_id)
    if len(created) + len(found) < len(chunk):
        raise PgQueueError(
            "Could not enqueue: some idempotency keys keep changing hands; try again."
        )
    return [
        (created[p], True) if p in created else (found[p], False) for p in range(1, len(chunk) + 1)
    ]
