"""The workers as operators see them, and the requests operators make to them.

A worker is what one ``run_queue_worker`` command started: its processes are the
registry's rows of one supervisor (``--processes``), or the one row of a worker run
alone. `group` folds the rows into `Worker`s; each process's figures are those of its
last report (one reading each: its running jobs and its count are never from two
moments). `ask` makes a request (stop, drain, resume, concurrency) to live processes,
taken by each one's next beat; a worker gone is refused with a message saying so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..store import observability as store_observability
from .workers import WorkerInfo


class RequestRefused(Exception):
    """No live worker process matches the request: it was not made."""


@dataclass
class Worker:
    """One command's worker: a supervisor and its children, or a process run alone."""

    id: str
    host: str
    database: str
    processes: list[WorkerInfo] = field(default_factory=list)

    @property
    def supervised(self) -> bool:
        return self.processes[0].supervisor is not None

    @property
    def live(self) -> list[WorkerInfo]:
        return [p for p in self.processes if p.alive]

    @property
    def gone(self) -> list[WorkerInfo]:
        return [p for p in self.processes if not p.alive]

    @property
    def alive(self) -> bool:
        return bool(self.live)

    @property
    def queues(self) -> list[str]:
        seen: dict[str, None] = {}
        for process in self.live or self.processes:
            seen.update(dict.fromkeys(process.queues))
        return list(seen)

    def _live_sum(self, key: str) -> int:
        return sum(int((p.report or {}).get(key) or 0) for p in self.live)

    @property
    def running(self) -> int:
        """Jobs its live processes ran at their last beats (each from its own report)."""
        return sum(_running(p) for p in self.live)

    @property
    def concurrency(self) -> int:
        return sum(_concurrency(p) for p in self.live)

    @property
    def claimed(self) -> int:
        return self._live_sum("claimed_count")

    @property
    def processed(self) -> int:
        """Attempts its processes ended (gone ones' last reports too: since its start)."""
        return sum(int((p.report or {}).get("processed") or 0) for p in self.processes)

    @property
    def failed(self) -> int:
        return sum(int((p.report or {}).get("failed") or 0) for p in self.processes)

    @property
    def draining(self) -> bool:
        return any((p.report or {}).get("draining") for p in self.live)

    @property
    def started_at(self) -> dt.datetime:
        return min(p.started_at for p in self.processes)

    @property
    def last_seen_at(self) -> dt.datetime:
        return max(p.last_seen_at for p in self.processes)

    @property
    def seen_ago(self) -> str:
        return min(self.processes, key=lambda p: p.seen_seconds_ago).seen_ago

    @property
    def versions(self) -> list[str]:
        return sorted({p.version for p in self.live or self.processes})

    @property
    def codes(self) -> list[str]:
        return sorted({str((p.report or {}).get("code")) for p in self.live if p.report})

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``inspect_queue_workers --json``."""
        return {
            "id": self.id,
            "host": self.host,
            "database": self.database,
            "supervised": self.supervised,
            "alive": self.alive,
            "queues": self.queues,
            "running": self.running,
            "claimed": self.claimed,
            "concurrency": self.concurrency,
            "processed": self.processed,
            "failed": self.failed,
            "draining": self.draining,
            "started_at": self.started_at.isoformat(),
            "last_seen_at": self.last_seen_at.isoformat(),
            "versions": self.versions,
            "codes": self.codes,
            "processes": [p.as_dict() for p in self.processes],
        }


def _running(process: WorkerInfo) -> int:
    report = process.report
    return int(report["running_count"]) if report else process.running


def _concurrency(process: WorkerInfo) -> int:
    return int((process.report or {}).get("concurrency") or process.concurrency)


def group(processes: Iterable[WorkerInfo]) -> list[Worker]:
    """The processes as workers: a supervisor's children in one, alive workers first,
    each one's live processes first (the order of `processes` otherwise)."""
    workers: dict[tuple[str, str], Worker] = {}
    for process in processes:
        key = (process.database, process.supervisor or process.id)
        worker = workers.get(key)
        if worker is None:
            worker = workers[key] = Worker(key[1], process.host, process.database)
        worker.processes.append(process)
    for worker in workers.values():
        worker.processes.sort(key=lambda p: not p.alive)
    return sorted(workers.values(), key=lambda w: not w.alive)


def ask(
    alias: str,
    action: str,
    *,
    workers: Sequence[str] = (),
    queue: str | None = None,
    concurrency: int | None = None,
    requested_by: str,
    known: Sequence[WorkerInfo] = (),
) -> list[tuple[int, str]]:
    """Ask the live processes of `workers` (ids of processes or supervisors) or those
    serving `queue` for `action`; the requests made, as (request id, process id).

    RequestRefused, saying why, when no live process matches (a worker gone, a name
    unknown, no live worker serving the queue); `known` (the registry's rows) lets it
    say when a named worker was last seen.
    """
    if not workers and queue is None:
        raise ValueError("name the workers to ask, or a queue whose workers to ask")
    made = store_observability.add_requests(
        alias, workers, queue, action, concurrency, requested_by
    )
    if made:
        return made
    raise RequestRefused(_refusal(workers, queue, known))


@dataclass(frozen=True)
class Asked:
    """A request made to a worker process, and what became of it."""

    id: int
    worker_id: str
    action: str
    concurrency: int | None
    requested_by: str
    requested_at: dt.datetime
    taken_at: dt.datetime | None
    answer: str | None

    def describe(self) -> str:
        what = self.action if self.concurrency is None else f"{self.action} {self.concurrency}"
        if self.taken_at is None:
            return f"{self.worker_id}: {what}: not taken yet"
        return f"{self.worker_id}: {what}: {self.answer or 'taken, no answer recorded'}"


def requests(alias: str, ids: Sequence[int] | None = None, limit: int = 50) -> list[Asked]:
    """The requests `ids` (oldest first), or the latest `limit` ones (newest first)."""
    if ids is not None:
        rows = store_observability.read_requests(alias, list(ids))
    else:
        rows = store_observability.recent_requests(alias, limit)
    return [Asked(*row) for row in rows]


def _refusal(workers: Sequence[str], queue: str | None, known: Sequence[WorkerInfo]) -> str:
    parts = []
    for name in workers:
        rows = [p for p in known if name in (p.id, p.supervisor)]
        if not rows:
            parts.append(f"no worker {name!r} is registered")
        else:
            last = max(rows, key=lambda p: p.last_seen_at)
            when = last.gone_at or last.last_seen_at
            parts.append(f"worker {name!r} is gone (last seen {when:%Y-%m-%d %H:%M:%S %Z})")
    if queue is not None:
        parts.append(f"no live worker serves the queue {queue!r}")
    return "; ".join(parts) + ": nothing was asked."
