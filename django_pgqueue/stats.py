"""The queue at a glance: counts per queue and status, for the admin and queue_stats.

Pending, running, dead and cancelled jobs are counted from small partial indexes
(`stats_by_queue`), exactly up to COUNT_CAP jobs per queue and status: a count at the
cap means "at least" (shown as "50000+"), so a reading costs the same whatever the
backlog. Completed jobs, usually most of the table, are estimated from the table's
statistics. `exact=True` (the command's ``--exact``) counts everything in full.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .conf import get_settings
from .durations import format_seconds
from .registry import registry
from .schedules.operations import late_schedules
from .store import durable as durable_store
from .store import operator as store

# The most jobs of one queue and status a reading counts (see the module's docstring).
COUNT_CAP = 50_000
# The cap of an exact reading: more jobs than any table holds.
_NO_CAP = 1 << 62


def _capped(status: str) -> property:
    """A figure's mark: whether the count of `status`'s jobs it is read from stopped at the cap."""
    return property(lambda figures: status in figures.capped)


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
    # Jobs in no claim index: workflow steps waiting for their dependencies, and
    # durable jobs parked for an event (`awaiting_event`, counted among them).
    waiting: int = 0
    # Durable jobs parked: pending until a sleep's wake-up (counted among the pending
    # jobs, not due), waiting for an event (among the waiting ones).
    sleeping: int = 0
    awaiting_event: int = 0
    completed: int | None = None
    oldest_due_seconds: float | None = None
    # The statuses whose count stopped at the cap: there are at least that many.
    capped: frozenset[str] = frozenset()
    # The alias holding the queue (set by `overview.collect_all`; "" when not read there).
    database: str = ""

    # Whether a figure's count stopped at the cap: there are at least that many.
    pending_capped = _capped("pending")
    due_capped = _capped("pending")  # due is counted among the pending jobs read
    dead_capped = _capped("dead")
    cancelled_capped = _capped("cancelled")
    waiting_capped = _capped("waiting")
    sleeping_capped = _capped("sleeping")
    awaiting_event_capped = _capped("awaiting_event")

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
            total.capped |= figures.capped  # a sum of "at least" is "at least"
            total.pending += figures.pending
            total.due += figures.due
            total.running += figures.running
            total.expired_leases += figures.expired_leases
            total.dead += figures.dead
            total.cancelled += figures.cancelled
            total.waiting += figures.waiting
            total.sleeping += figures.sleeping
            total.awaiting_event += figures.awaiting_event
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
            "queues": [_plain(figures) for figures in self.queues],
            "totals": _plain(self.totals),
            "jobs": self.jobs,
            "completed_exact": self.completed_exact,
            "late_schedules": [late.as_dict() for late in self.late_schedules],
        }


def _plain(figures: QueueFigures) -> dict[str, Any]:
    return {**asdict(figures), "capped": sorted(figures.capped)}


def collect(alias: str | None = None, *, exact: bool = False) -> Snapshot:
    """Read the figures of every queue that has jobs (three cheap queries: the counts by
    status, the parked durable jobs of the queues with some not due or waiting, the late
    schedules; a full scan if exact)."""
    alias = alias or get_settings().DATABASE
    cap = _NO_CAP if exact else COUNT_CAP
    by_queue: dict[str, QueueFigures] = {}
    for queue, status, jobs, due, expired, oldest in store.live_stats(alias, cap):
        figures = by_queue.setdefault(queue, QueueFigures(queue=queue))
        if jobs >= cap and status != "running":  # running jobs are counted in full
            figures.capped |= {status}
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
    parked = [f.queue for f in by_queue.values() if f.pending > f.due or f.waiting]
    for queue, sleeping, sleeping_capped, awaiting, awaiting_capped in durable_store.parked_counts(
        alias, parked, cap
    ):
        figures = by_queue[queue]
        figures.sleeping, figures.awaiting_event = sleeping, awaiting
        figures.capped |= {"sleeping"} if sleeping_capped else set()
        figures.capped |= {"awaiting_event"} if awaiting_capped else set()
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


# The most pending jobs of one queue stranded_jobs() reads (their types are looked up).
STRANDED_SAMPLE = 10_000


@dataclass(frozen=True)
class Stranded:
    """Pending jobs that will not run as things are: their type has no handler or task
    in this project (`unknown_type`), or no live worker serves their queue. `at_least`:
    the queue has more pending jobs than were read, so `jobs` is a lower bound."""

    queue: str
    type: str
    jobs: int
    unknown_type: bool
    unserved_queue: bool
    at_least: bool = False


def stranded_jobs(
    alias: str | None = None, served: set[str] | None = None, *, sample: int = STRANDED_SAMPLE
) -> list[Stranded]:
    """The pending jobs of unknown types, and (given the live workers' queues, `served`)
    those in queues no live worker serves, by queue and type. At most `sample` pending
    jobs of each queue are read, the next ones to run, so the cost is bounded."""
    alias = alias or get_settings().DATABASE
    registry.autodiscover()
    rows = store.pending_types(alias, sample)
    read: dict[str, int] = {}
    for queue, _, jobs in rows:
        read[queue] = read.get(queue, 0) + jobs
    found = []
    for queue, type_, jobs in rows:
        unknown = registry.find(type_) is None
        unserved = served is not None and queue not in served
        if unknown or unserved:
            found.append(Stranded(queue, type_, jobs, unknown, unserved, read[queue] >= sample))
    return found
