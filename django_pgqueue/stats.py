"""The queue at a glance: counts per queue and status, for the admin and queue_stats.

Pending, running, dead and cancelled jobs are counted exactly from small partial
indexes (`stats_by_queue`), so the cost follows the unfinished and failed jobs, not
the table. Completed jobs, usually most of the table, are estimated from the table's
statistics unless `exact=True` asks for a full count (the command's ``--exact``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .conf import get_settings
from .durations import format_seconds
from .schedules.operations import late_schedules
from .store import operator as store


@dataclass
class QueueFigures:
    """The figures of one queue (or, for `Snapshot.totals`, of all queues)."""

    queue: str
    pending: int = 0
    due: int = 0
    running: int = 0
    expired_leases: int = 0
    dead: int = 0
    cancelled: int = 0
    # Workflow steps waiting for their dependencies (in no claim index).
    waiting: int = 0
    completed: int | None = None
    oldest_due_seconds: float | None = None

    @property
    def live(self) -> int:
        return self.pending + self.running + self.dead + self.cancelled + self.waiting

    @property
    def oldest_due(self) -> str:
        """How long the oldest due pending job has waited, for people ('4m 12s', '—')."""
        return format_seconds(self.oldest_due_seconds)


@dataclass
class Snapshot:
    queues: list[QueueFigures] = field(default_factory=list)
    # Every job, all statuses: an estimate from the statistics unless completed_exact.
    jobs: int | None = None
    completed_exact: bool = False
    # Recurring schedules whose due tick was not fired in time (django_pgqueue.schedules).
    late_schedules: list[Any] = field(default_factory=list)

    @property
    def totals(self) -> QueueFigures:
        total = QueueFigures(queue="all queues")
        for figures in self.queues:
            total.pending += figures.pending
            total.due += figures.due
            total.running += figures.running
            total.expired_leases += figures.expired_leases
            total.dead += figures.dead
            total.cancelled += figures.cancelled
            total.waiting += figures.waiting
            if figures.oldest_due_seconds is not None:
                total.oldest_due_seconds = max(
                    total.oldest_due_seconds or 0.0, figures.oldest_due_seconds
                )
        if self.completed_exact:
            total.completed = sum(figures.completed or 0 for figures in self.queues)
        elif self.jobs is not None:
            total.completed = max(0, self.jobs - total.live)
        return total

    @property
    def queue_names(self) -> list[str]:
        return [figures.queue for figures in self.queues]

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``queue_stats --json``."""
        return {
            "queues": [asdict(figures) for figures in self.queues],
            "totals": asdict(self.totals),
            "jobs": self.jobs,
            "completed_exact": self.completed_exact,
            "late_schedules": [late.as_dict() for late in self.late_schedules],
        }


def collect(alias: str | None = None, *, exact: bool = False) -> Snapshot:
    """Read the figures of every queue that has jobs (two cheap queries; a full scan if exact)."""
    alias = alias or get_settings().DATABASE
    by_queue: dict[str, QueueFigures] = {}
    for queue, status, jobs, due, expired, oldest in store.live_stats(alias):
        figures = by_queue.setdefault(queue, QueueFigures(queue=queue))
        if status == "pending":
            figures.pending, figures.due, figures.oldest_due_seconds = jobs, due, oldest
        elif status == "running":
            figures.running, figures.expired_leases = jobs, expired
        elif status == "dead":
            figures.dead = jobs
        elif status == "cancelled":
            figures.cancelled = jobs
        elif status == "waiting":
            figures.waiting = jobs
    if exact:
        for queue, jobs in store.completed_counts(alias).items():
            by_queue.setdefault(queue, QueueFigures(queue=queue)).completed = jobs
        for figures in by_queue.values():
            figures.completed = figures.completed or 0
        snapshot = Snapshot(queues=sorted(by_queue.values(), key=lambda f: f.queue))
        snapshot.completed_exact = True
        snapshot.jobs = snapshot.totals.live + (snapshot.totals.completed or 0)
    else:
        snapshot = Snapshot(
            queues=sorted(by_queue.values(), key=lambda f: f.queue),
            jobs=store.estimate_job_count(alias),
        )
    snapshot.late_schedules = late_schedules(alias)
    return snapshot
