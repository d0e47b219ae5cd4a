"""The worker registry: who is alive, seen when, running what.

Written by each worker's heartbeat (`record_beat`, `record_stop`, `mark_gone`,
`prune`, on the heartbeat's own connection); read by the admin's Workers page,
``queue_stats`` and the metrics (`list_workers`, `count_workers`). Observation only:
a job belongs to whoever holds its lease, whatever this table says.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from ..durations import format_seconds
from ..store import observability as store_observability
from ..store.session import Session

# Gone workers stay listed this long (seconds) before a heartbeat prunes them.
KEEP_GONE = 24 * 3600.0
# Rollup minutes kept for the charts.
KEEP_MINUTES = 7 * 24 * 60
# Most workers and running jobs a page lists.
LIST_LIMIT = 100
JOBS_PER_WORKER = 10


@dataclass(frozen=True)
class Identity:
    """What a worker says about itself in the registry."""

    id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    lease: float
    version: str
    supervisor: str | None = None  # the supervisor whose child it is, if any


@dataclass(frozen=True)
class Request:
    """An operator's request a worker took at its beat."""

    id: int
    action: str
    concurrency: int | None
    requested_by: str


@dataclass
class RunningJob:
    job_id: int
    queue: str
    type: str
    attempt: int
    max_attempts: int
    lease_version: int
    started_at: dt.datetime | None
    lease_left_seconds: float | None


@dataclass
class WorkerInfo:
    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    lease_seconds: float
    version: str
    running: int
    started_at: dt.datetime
    last_seen_at: dt.datetime
    gone_at: dt.datetime | None
    alive: bool
    seen_seconds_ago: float
    # The supervisor whose child it is, and what it said of itself at its last beat.
    supervisor: str | None = None
    report: dict[str, Any] | None = None
    # The first JOBS_PER_WORKER jobs it holds (oldest job first); `running` counts all.
    jobs: list[RunningJob] = field(default_factory=list)
    # The queue database it registered on (its queues' database).
    database: str = ""

    @property
    def jobs_not_shown(self) -> int:
        """How many more jobs the worker holds than `jobs` lists."""
        return max(0, self.running - len(self.jobs))

    @property
    def seen_ago(self) -> str:
        """How long ago the last heartbeat came, for people ('4m 12s')."""
        return format_seconds(self.seen_seconds_ago)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``queue_stats --json``."""
        data = {key: value for key, value in vars(self).items() if key != "jobs"}
        for key in ("started_at", "last_seen_at", "gone_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        data["jobs"] = [job.job_id for job in self.jobs]
        return data


def record_beat(
    store: Session, me: Identity, running: int, report: dict[str, Any] | None = None
) -> list[Request]:
    """Upsert this worker's row: alive now, running `running` jobs, with its `report`;
    the requests made to it, taken now (one statement)."""
    concurrency = (report or {}).get("concurrency", me.concurrency)
    rows = store_observability.record_beat(
        store,
        {
            "id": me.id,
            "host": me.host,
            "pid": me.pid,
            "queues": json.dumps(list(me.queues)),
            "concurrency": concurrency,
            "lease": me.lease,
            "version": me.version,
            "running": running,
            "supervisor": me.supervisor,
            "report": json.dumps(report) if report is not None else None,
        },
    )
    return [Request(*row) for row in rows]


def answer(store: Session, request: Request, text: str) -> None:
    """Record what this worker did with `request`."""
    store_observability.answer_request(store, request.id, text)


def record_stop(store: Session, worker_id: str) -> list[Request]:
    """Mark this worker gone as it stops; the requests made to it since its last beat,
    taken now."""
    return [Request(*row) for row in store_observability.record_stop(store, worker_id)]


def mark_gone(store: Session) -> list[str]:
    """Mark gone the workers not seen for two of their leases; return their ids."""
    return store_observability.mark_gone(store)


def prune(
    store: Session, keep_seconds: float = KEEP_GONE, keep_minutes: int = KEEP_MINUTES
) -> tuple[int, int]:
    """Delete long-gone workers and old rollup minutes; return how many of each."""
    return store_observability.prune(store, keep_seconds, keep_minutes)


def list_workers(
    alias: str, *, with_jobs: bool = True, database: str | None = None
) -> list[WorkerInfo]:
    """The registered workers, alive first, each with the jobs it holds now.

    Read on `alias`; `database` names the queue database they registered on, when
    `alias` is its replica (default: `alias`).
    """
    # Gone workers too: a job a dead worker held stays running until the sweep.
    rows, jobs = store_observability.list_workers(
        alias, LIST_LIMIT, JOBS_PER_WORKER if with_jobs else None
    )
    workers = [WorkerInfo(*row, database=database or alias) for row in rows]
    for worker in workers:
        if isinstance(worker.queues, str):  # Django's connection leaves jsonb as text
            worker.queues = json.loads(worker.queues)
        if isinstance(worker.report, str):
            worker.report = json.loads(worker.report)
    by_id = {w.id: w for w in workers}
    for locked_by, *job in jobs:
        by_id[locked_by].jobs.append(RunningJob(*job))
    return workers


def count_workers(alias: str) -> tuple[int, int]:
    """(alive, gone) registered workers."""
    return store_observability.count_workers(alias)
