"""Operator actions (retry, cancel), and the read-only figures and maintenance passes of
the admin, the ops commands and the system checks, on the caller's Django connection."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..sql import QUERIES
from .cursors import django_cursor, fetch_after, fetch_all, fetch_one


def retry_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Make dead, cancelled or pending jobs due now with fresh attempts; return those changed."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_retry_now"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


def cancel_jobs(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Cancel pending jobs; return those changed. Running jobs are left to `request_cancel`."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_cancel"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


def release_sequence(alias: str, queue: str, sequence_key: str) -> int | None:
    """Let a held sequence go on past its dead head; return the head released (None: the
    sequence was not held, its head retried or released meanwhile)."""
    row = fetch_one(
        alias, QUERIES["sequence_release"], {"queue": queue, "sequence_key": sequence_key}
    )
    return None if row is None else row[0]


def request_cancel(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Mark running jobs as cancel-requested; return those marked. The worker running
    one sees it at its next renewal, and its handler through ``ctx.cancel_requested()``."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_cancel_request"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


def live_stats(alias: str, cap: int) -> list[tuple[str, str, int, int, int, float | None]]:
    """Count unfinished and failed jobs, each count up to `cap`:
    (queue, status, jobs, due, expired, oldest due s)."""
    rows = fetch_after(alias, "stats_no_jit", "stats_by_queue", {"cap": cap})
    return [
        (queue, status, int(jobs), int(due), int(expired), oldest)
        for queue, status, jobs, due, expired, oldest in rows
    ]


class FairKey(NamedTuple):
    """One key of a fair queue on the admin's page: its backlog and its recent starts."""

    key: str
    due: int  # pending jobs due now (up to the cap, with `later`)
    later: int  # pending jobs scheduled later
    running: int
    starts: int  # its starts among the queue's recent ones
    all_starts: int  # the queue's keyed starts in that sample


def fair_keys(
    alias: str, queue: str, after: str | None, limit: int, cap: int, sample: int, minutes: int
) -> list[FairKey]:
    """List up to `limit` keys of the fair queue `queue` with pending jobs, after the key
    `after` (None: from the first), each pending count read up to `cap` jobs, and each
    key's starts among the newest `sample` attempts of the last `minutes` minutes."""
    params = {
        "queue": queue,
        "after": after,
        "limit": limit,
        "cap": cap,
        "sample": sample,
        "minutes": minutes,
    }
    rows = fetch_after(alias, "stats_no_jit", "fair_keys_page", params)
    return [FairKey(row[0], *(int(n) for n in row[1:])) for row in rows]


def completed_counts(alias: str) -> dict[str, int]:
    """Count each queue's completed jobs exactly (reads the whole state table)."""
    return {queue: int(jobs) for queue, jobs in fetch_all(alias, "stats_completed_by_queue")}


def pending_types(alias: str, cap: int) -> list[tuple[str, str, int]]:
    """Count pending jobs by queue and type, reading at most `cap` jobs of each queue:
    (queue, type, jobs), sorted."""
    rows = fetch_after(alias, "stats_no_jit", "stats_pending_types", {"cap": cap})
    return [(queue, type_, int(jobs)) for queue, type_, jobs in rows]


def known_names(alias: str, limit: int) -> tuple[list[str], list[str]]:
    """List (job types, queues) known from the jobs' type index, controls, workers,
    schedules and the rollup, sorted; `limit` bounds the types walked. Queues with
    unfinished or failed jobs come from `live_stats`."""
    types: set[str] = set()
    queues: set[str] = set()
    for kind, name in fetch_all(alias, "names_known", {"limit": limit}):
        (types if kind == "type" else queues).add(name)
    return sorted(types), sorted(queues)


def estimate_job_count(alias: str) -> int | None:
    """Estimate the number of jobs from the table's statistics; None if it has none yet."""
    rows = fetch_all(alias, "job_count_estimate")
    return None if not rows or rows[0][0] is None else int(rows[0][0])


def replica_lag(alias: str) -> tuple[bool, float | None]:
    """Read (whether `alias` is a replica, how many seconds its data lags; None: unknown)."""
    replica, lag = fetch_all(alias, "replica_lag")[0]
    return bool(replica), None if lag is None else max(0.0, float(lag))


def missing_tables(alias: str, names: Sequence[str]) -> list[str]:
    """The tables of `names` that the database of `alias` lacks."""
    return [name for (name,) in fetch_all(alias, "queue_tables_missing", {"names": list(names)})]


def autovacuum_settings(alias: str) -> tuple[bool, bool] | None:
    """Read (autovacuum on for the server, off for queue_job_state); None if no row."""
    rows = fetch_all(alias, "autovacuum_settings")
    return (rows[0][0], rows[0][1]) if rows else None


def clock_ago(alias: str, seconds: float) -> Any:
    """Return the database's now() minus `seconds` (an aware datetime)."""
    return fetch_all(alias, "clock_ago", {"seconds": seconds})[0][0]


def count_prunable(alias: str, cutoff: Any, statuses: Sequence[str]) -> dict[str, int]:
    """Count, by status, the jobs a prune would delete now (`job_prune_count`)."""
    rows = fetch_all(alias, "job_prune_count", {"cutoff": cutoff, "statuses": list(statuses)})
    return {status: int(jobs) for status, jobs in rows}


class PruneStep(NamedTuple):
    """What one `job_prune_batch` did: the jobs deleted by status, where the walk goes
    on, and whether there may be more to delete after it."""

    jobs: dict[str, int]
    after_id: int
    more: bool


def prune_batch(
    alias: str, cutoff: Any, statuses: Sequence[str], limit: int, after_id: int = 0
) -> PruneStep:
    """Delete the next finished jobs older than `cutoff` with ids above `after_id`, each
    with its workflow or batch whole, about `limit` jobs at most (a larger unit alone)."""
    ((more, scanned_to, deleted),) = fetch_all(
        alias,
        "job_prune_batch",
        {"cutoff": cutoff, "statuses": list(statuses), "limit": limit, "after_id": after_id},
    )
    # Django's cursor hands jsonb over as text.
    deleted = json.loads(deleted) if isinstance(deleted, str) else deleted
    jobs = {status: int(count) for status, count in deleted.items()}
    return PruneStep(jobs, after_id if scanned_to is None else int(scanned_to), bool(more))


def prune_workflow_batch(alias: str, cutoff: Any, limit: int, after_id: int = 0) -> tuple[int, int]:
    """Delete at most `limit` step-less workflows created before `cutoff`, ids above
    `after_id`: (how many, the highest id deleted, or after_id if none)."""
    rows = fetch_all(
        alias, "workflow_prune_batch", {"cutoff": cutoff, "limit": limit, "after_id": after_id}
    )
    return len(rows), max((row[0] for row in rows), default=after_id)


def prune_batch_rows(alias: str, cutoff: Any, limit: int, after_id: int = 0) -> tuple[int, int]:
    """Delete at most `limit` batches created before `cutoff` whose jobs are all gone,
    ids above `after_id`: (how many, the highest id deleted, or after_id if none)."""
    rows = fetch_all(
        alias, "batch_prune_batch", {"cutoff": cutoff, "limit": limit, "after_id": after_id}
    )
    return len(rows), max((row[0] for row in rows), default=after_id)


def prune_sequence_rows(alias: str, limit: int, after_id: int = 0) -> tuple[int, int]:
    """Delete at most `limit` rows of sequences with nothing left, ids above `after_id`:
    (how many, the highest id deleted, or after_id if none)."""
    rows = fetch_all(alias, "sequence_prune_batch", {"limit": limit, "after_id": after_id})
    return len(rows), max((row[0] for row in rows), default=after_id)


def dead_job_page(
    alias: str,
    *,
    until: Any,
    after: tuple[Any, int] | None,
    limit: int,
    since: Any = None,
    queue: str | None = None,
    type: str | None = None,
) -> list[tuple[int, Any]]:
    """One page of (job id, finished_at) of dead jobs, oldest death first, after `after`."""
    after_finished, after_id = after if after is not None else ("-infinity", 0)
    rows = fetch_all(
        alias,
        "job_dead_page",
        {
            "until": until,
            "since": since,
            "queue": queue,
            "type": type,
            "after_finished": after_finished,
            "after_id": after_id,
            "limit": limit,
        },
    )
    return [(int(job_id), finished_at) for job_id, finished_at in rows]
