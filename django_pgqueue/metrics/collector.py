"""Prometheus collectors: the queues' figures from the database, a worker's own counters."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from django.db import DatabaseError, connections
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from .. import stats
from ..conf import get_settings
from ..models import QueueControl
from ..observability import workers
from .counters import RUNTIME_BOUNDS, WorkerCounters

logger = logging.getLogger(__name__)


class Reading(NamedTuple):
    """The queues' figures and the registry's counts, as read at `at` (monotonic)."""

    at: float
    snapshot: stats.Snapshot
    alive: int
    gone: int


# The latest reading per database alias, shared by every scrape of this process within
# METRICS_CACHE_SECONDS; one scrape at a time reads the database (the others wait for
# its reading): concurrent scrapes cost one reading and one connection, not one each.
_readings: dict[str, Reading] = {}
_reading = threading.Lock()


def read(alias: str, *, close: bool = False) -> Reading:
    """The figures of `alias`, read now or shared from a reading fresh enough."""
    ttl = get_settings().METRICS_CACHE_SECONDS
    cached = _readings.get(alias)
    if cached is not None and time.monotonic() - cached.at < ttl:
        return cached
    with _reading:
        cached = _readings.get(alias)
        if cached is not None and time.monotonic() - cached.at < ttl:
            return cached  # another scrape read it while this one waited
        try:
            snapshot = stats.collect(alias)
            alive, gone = workers.count_workers(alias)
        finally:
            if close:
                connections[alias].close()
        reading = _readings[alias] = Reading(time.monotonic(), snapshot, alive, gone)
        return reading


class QueueCollector(Collector):
    """Per queue: jobs by status, due jobs, parked durable jobs, the oldest due job's age;
    workers alive and gone.

    Reads `stats.collect` (small partial indexes only) and the worker registry, at most
    once per METRICS_CACHE_SECONDS per process (see `read`). Values are the same
    whichever process reports them: aggregate them across scrape targets with max, not
    sum. `close` closes the Django connection after each reading (for a server thread
    outside Django's request cycle).

    `alias` None reads every queue database (PGQUEUE["QUEUE_DATABASES"]), each from
    `read_database(alias)` (READ_DATABASE, a replica, when set); a given `alias` (a
    worker's metrics server) is read itself. Once QUEUE_DATABASES is
    set, every family has a `database` label, and `pgqueue_database_up` has one series
    per database: a database that cannot be read is 0, the others are still reported.
    With one database the families keep their labels of old (no `database`).
    """

    def __init__(self, alias: str | None = None, *, close: bool = False) -> None:
        self.alias = alias
        self.close = close

    def collect(self) -> Iterator[Any]:
        conf = get_settings()
        aliases = [self.alias] if self.alias else list(conf.queue_databases)
        families = _Families(labelled=bool(conf.QUEUE_DATABASES.aliases()))
        for alias in aliases:
            # A worker's own server (an alias given) reads its database, never a replica.
            source = alias if self.alias else conf.read_database(alias)
            try:
                _, snapshot, alive, gone = read(source, close=self.close)
            except DatabaseError as exc:
                logger.warning("metrics: reading the queue figures of %r failed: %s", alias, exc)
                families.add(families.up, alias, [], 0)
                continue
            families.add(families.up, alias, [], 1)
            families.add_snapshot(alias, snapshot, alive, gone)
            families.add_paused(alias, _paused_queues(source, close=self.close))
        yield from families.all()

    def describe(self) -> Iterator[Any]:
        return iter(())  # the families depend on the data: collect on each scrape only


# The queue families of a scrape: (attribute, name, help, labels after the database's).
_GAUGES = [
    ("up", "pgqueue_database_up", "1 if the queue figures could be read from the database.", []),
    (
        "jobs",
        "pgqueue_jobs",
        "Jobs by queue and status (completed ones are not counted).",
        ["queue", "status"],
    ),
    ("due", "pgqueue_jobs_due", "Pending jobs due now.", ["queue"]),
    (
        "parked",
        "pgqueue_jobs_parked",
        "Durable jobs parked, by reason: sleep (pending until its wake-up, among the "
        "pending jobs) or event (waiting for an event, among the waiting jobs).",
        ["queue", "reason"],
    ),
    (
        "oldest",
        "pgqueue_oldest_due_age_seconds",
        "How long the oldest due pending job has waited (0 when none is due).",
        ["queue"],
    ),
    (
        "expired",
        "pgqueue_expired_leases",
        "Running jobs whose lease ran out and that no sweep has requeued yet.",
        ["queue"],
    ),
    ("workers", "pgqueue_workers", "Registered workers, alive or gone.", ["state"]),
    (
        "late",
        "pgqueue_late_schedules",
        "Enabled schedules whose due tick has not been fired within 2 poll intervals.",
        [],
    ),
    (
        "late_seconds",
        "pgqueue_schedule_late_seconds",
        "How long a late schedule's due tick has waited (only late schedules are listed).",
        ["schedule", "queue"],
    ),
    (
        "paused",
        "pgqueue_queue_paused",
        "1 while a queue is paused (its workers claim none of its jobs), 0 while it runs.",
        ["queue"],
    ),
]


class _Families:
    """The queue families of one scrape, filled database by database."""

    up: GaugeMetricFamily
    jobs: GaugeMetricFamily
    due: GaugeMetricFamily
    parked: GaugeMetricFamily
    oldest: GaugeMetricFamily
    expired: GaugeMetricFamily
    workers: GaugeMetricFamily
    late: GaugeMetricFamily
    late_seconds: GaugeMetricFamily
    paused: GaugeMetricFamily

    def __init__(self, *, labelled: bool) -> None:
        # Whether every series names its database (QUEUE_DATABASES is set).
        self.labelled = labelled
        db = ["database"] if labelled else []
        for attribute, name, text, labels in _GAUGES:
            setattr(self, attribute, GaugeMetricFamily(name, text, labels=[*db, *labels]))
        self.read = False  # whether any database was read (else only `up` is reported)
        self.controls_read = False  # whether any database's queue controls were read

    def add(self, family: GaugeMetricFamily, alias: str, labels: list[str], value: float) -> None:
        family.add_metric([alias, *labels] if self.labelled else labels, value)

    def add_snapshot(self, alias: str, snapshot: stats.Snapshot, alive: int, gone: int) -> None:
        self.read = True
        for q in snapshot.queues:
            for status in ("pending", "running", "dead", "cancelled", "waiting"):
                self.add(self.jobs, alias, [q.queue, status], getattr(q, status))
            self.add(self.due, alias, [q.queue], q.due)
            self.add(self.parked, alias, [q.queue, "sleep"], q.sleeping)
            self.add(self.parked, alias, [q.queue, "event"], q.awaiting_event)
            self.add(self.oldest, alias, [q.queue], q.oldest_due_seconds or 0.0)
            self.add(self.expired, alias, [q.queue], q.expired_leases)
        self.add(self.workers, alias, ["alive"], alive)
        self.add(self.workers, alias, ["gone"], gone)
        # The schedules whose due tick was not fired in time (read by `stats.collect`).
        self.add(self.late, alias, [], len(snapshot.late_schedules))
        for schedule in snapshot.late_schedules:
            labels = [schedule.name, schedule.queue]
            self.add(self.late_seconds, alias, labels, schedule.late_seconds)

    def add_paused(self, alias: str, controls: list[tuple[str, bool]] | None) -> None:
        if controls is None:
            return
        self.controls_read = True
        for queue, is_paused in controls:
            self.add(self.paused, alias, [queue], 1 if is_paused else 0)

    def all(self) -> Iterator[Any]:
        yield self.up
        if self.read:
            yield from (self.jobs, self.due, self.parked, self.oldest, self.expired)
            yield self.workers
            yield from (self.late, self.late_seconds)
        if self.controls_read:
            yield self.paused


def _paused_queues(alias: str, *, close: bool) -> list[tuple[str, bool]] | None:
    """(queue, paused) per controlled queue (queue_controls); None when the read failed.

    A queue without a control row has never been paused and has no series. The table
    has one small row per controlled queue; a failed read leaves the family out.
    """
    try:
        return list(
            QueueControl.objects.using(alias).order_by("queue").values_list("queue", "paused")
        )
    except DatabaseError as exc:
        logger.warning("metrics: reading the queue controls failed: %s", exc)
        return None
    finally:
        if close:
            connections[alias].close()


class WorkerCollector(Collector):
    """One worker process's attempts by outcome and handler run times, since it started."""

    def __init__(self, counters: WorkerCounters, worker_id: str) -> None:
        self.counters = counters
        self.worker_id = worker_id

    def collect(self) -> Iterator[Any]:
        attempts = CounterMetricFamily(
            "pgqueue_attempts",
            "Attempts this worker finished, by outcome: succeeded, retried, dead, lease_lost.",
            labels=["queue", "type", "outcome"],
        )
        for (queue, type_, outcome), n in sorted(self.counters.attempts().items()):
            attempts.add_metric([queue, type_, outcome], n)
        runtime = HistogramMetricFamily(
            "pgqueue_attempt_duration_seconds",
            "How long handlers ran, whatever their outcome.",
            labels=["queue", "type"],
        )
        for (queue, type_), value in sorted(self.counters.runtimes().items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*RUNTIME_BOUNDS, float("inf")], value.buckets, strict=True):
                cumulative += n
                buckets.append(
                    ("+Inf" if bound == float("inf") else repr(float(bound)), cumulative)
                )
            runtime.add_metric([queue, type_], buckets, value.total)
        yield attempts
        yield runtime

    def describe(self) -> Iterator[Any]:
        return iter(())


class EventLoopCollector(Collector):
    """A worker's event loop (async handlers): its lag, and the handlers that blocked
    it or swallowed their cancellation."""

    def __init__(self, loop: Any) -> None:
        self.loop = loop  # the worker's AsyncPool

    def collect(self) -> Iterator[Any]:
        loop = self.loop
        yield GaugeMetricFamily(
            "pgqueue_event_loop_lag_seconds",
            "How late the event loop's last probe ran (a blocked loop: how long so far).",
            value=loop.lag,
        )
        yield GaugeMetricFamily(
            "pgqueue_event_loop_lag_max_seconds",
            "The largest lag of the event loop since the worker started.",
            value=loop.lag_max,
        )
        yield CounterMetricFamily(
            "pgqueue_event_loop_blocked",
            "Times an async handler blocked the event loop (a probe late by 0.25 s or more).",
            value=loop.blocked,
        )
        yield CounterMetricFamily(
            "pgqueue_async_cancel_ignored",
            "Async handlers that swallowed their task's cancellation.",
            value=loop.ignored_cancel,
        )
        yield GaugeMetricFamily(
            "pgqueue_async_in_flight",
            "Async handlers in flight on the event loop.",
            value=loop.in_flight,
        )

    def describe(self) -> Iterator[Any]:
        return iter(())
