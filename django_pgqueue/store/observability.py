"""The worker registry's and the per-minute rollup's statements.

Written from a worker's heartbeat, on its connection (``worker_upsert``, which also
takes the operators' requests, ``worker_request_answer``, ``worker_stopped`` with
``worker_requests_take``,
``worker_mark_gone``, ``worker_prune``, ``stats_minute_add``); read on Django's
connection for the admin's Workers and Charts pages, ``inspect_queue_workers``,
``queue_stats`` and the metrics, where operators' requests are also made
(``worker_request_add``). Observation only: a job belongs to whoever holds its lease, whatever
these tables say.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..sql import QUERIES
from .cursors import django_cursor
from .session import Session


def record_beat(session: Session, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Upsert a worker's row (``worker_upsert``'s parameters): alive now; the requests
    made to it that it takes now, as (id, action, concurrency, requested_by)."""
    return list(session.run("worker_upsert", params))


def answer_request(session: Session, request_id: int, answer: str) -> None:
    """Record what a worker did with a request it took."""
    session.run("worker_request_answer", {"id": request_id, "answer": answer})


def add_requests(
    alias: str,
    workers: Sequence[str],
    queue: str | None,
    action: str,
    concurrency: int | None,
    requested_by: str,
) -> list[tuple[int, str]]:
    """Ask the live workers named (by id or supervisor) or serving `queue` for `action`;
    the requests made, as (request id, worker id)."""
    with django_cursor(alias) as cursor:
        cursor.execute(
            QUERIES["worker_request_add"],
            {
                "workers": list(workers),
                "queue": queue,
                "action": action,
                "concurrency": concurrency,
                "requested_by": requested_by,
            },
        )
        return [(int(row[0]), row[1]) for row in cursor.fetchall()]


def read_requests(alias: str, ids: list[int]) -> list[tuple[Any, ...]]:
    """The requests `ids`, oldest first."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["worker_requests_read"], {"ids": ids})
        return cursor.fetchall()


def recent_requests(alias: str, limit: int) -> list[tuple[Any, ...]]:
    """The latest requests made to workers, newest first."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["worker_requests_recent"], {"limit": limit})
        return cursor.fetchall()


def record_stop(session: Session, worker_id: str) -> list[tuple[Any, ...]]:
    """Mark a worker gone as it stops; the requests made to it that no beat took, taken
    now (after the mark: none can come later), as `record_beat` returns them."""
    session.run("worker_stopped", {"id": worker_id})
    return list(session.run("worker_requests_take", {"id": worker_id}))


def mark_gone(session: Session) -> list[str]:
    """Mark gone the workers not seen for two of their leases; return their ids."""
    return [row[0] for row in session.run("worker_mark_gone", {})]


def prune(session: Session, keep_seconds: float, keep_minutes: int) -> tuple[int, int]:
    """Delete workers gone longer than `keep_seconds` and rollup minutes older than
    `keep_minutes`; return how many of each."""
    rows = session.run("worker_prune", {"keep_seconds": keep_seconds, "keep_minutes": keep_minutes})
    return int(rows[0][0]), int(rows[0][1])


def list_workers(
    alias: str, limit: int, jobs_per_worker: int | None
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Up to `limit` registered workers, alive first, and (unless `jobs_per_worker` is
    None) up to that many of the jobs each holds, as (worker id, job columns ...)."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["worker_list"], {"limit": limit})
        workers = cursor.fetchall()
        if jobs_per_worker is None or not workers:
            return workers, []
        cursor.execute(
            QUERIES["worker_running_jobs"],
            {"worker_ids": [row[0] for row in workers], "per_worker": jobs_per_worker},
        )
        return workers, cursor.fetchall()


def count_workers(alias: str) -> tuple[int, int]:
    """(alive, gone) registered workers."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["worker_counts"])
        alive, gone = cursor.fetchone()
    return int(alive), int(gone)


def add_minutes(session: Session, params: dict[str, Any]) -> None:
    """Add finished attempts to the per-minute rollup (``stats_minute_add``'s parameters)."""
    session.run("stats_minute_add", params)


def sample_backlog(session: Session, params: dict[str, Any]) -> None:
    """Sample the queues' backlogs into the current minute (``stats_minute_backlog``)."""
    session.run("stats_minute_backlog", params)


def read_minutes(alias: str, minutes: int) -> Sequence[tuple[Any, ...]]:
    """The rollup rows of the last `minutes` minutes, oldest first, each with the
    database's current minute first (``stats_minute_range``)."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["stats_minute_range"], {"minutes": minutes})
        return cursor.fetchall()


def read_feed(alias: str, after: int, open_ids: list[int], limit: int) -> list[tuple[Any, ...]]:
    """The attempts after id `after` (at most `limit`) and the attempts `open_ids`,
    each with its job's queue and type (``attempt_feed``)."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["attempt_feed"], {"after": after, "open": open_ids, "limit": limit})
        return cursor.fetchall()


def feed_start(alias: str, back: int) -> int:
    """The attempt id a feed starts after: `back` attempts before the newest."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["attempt_feed_start"], {"back": back})
        return int(cursor.fetchone()[0])
