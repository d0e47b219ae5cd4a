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
from ..observability.counters import RUNTIME_BOUNDS, WorkerCounters

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
    """Per queue: jobs by status, due jobs, the oldest due job's age; workers alive and gone.

    Reads `stats.collect` (small partial indexes only) and the worker registry, at most
    once per METRICS_CACHE_SECONDS per process (see `read`). Values are the same
    whichever process reports them: aggregate them across scrape targets with max, not
    sum. `close` closes the Django connection after each reading (for a server thread
    outside Django's request cycle).
    """

    def __init__(self, alias: str | None = None, *, close: bool = False) -> None:
        self.alias = alias
        self.close = close

    def collect(self) -> Iterator[Any]:
        alias = self.alias or get_settings().DATABASE
        up = GaugeMetricFamily(
            "pgqueue_database_up", "1 if the queue figures could be read from the database."
        )
        try:
            _, snapshot, alive, gone = read(alias, close=self.close)
        except DatabaseError as exc:
            logger.warning("metrics: reading the queue figures failed: %s", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "pgqueue_jobs",
            "Jobs by queue and status (completed ones are not counted).",
            labels=["queue", "status"],
        )
        due = GaugeMetricFamily("pgqueue_jobs_due", "Pending jobs due now.", labels=["queue"])
        oldest = GaugeMetricFamily(
            "pgqueue_oldest_due_age_seconds",
            "How long the oldest due pending job has waited (0 when none is due).",
            labels=["queue"],
        )
        expired = GaugeMetricFamily(
            "pgqueue_expired_leases",
            "Running jobs whose lease ran out and that no sweep has requeued yet.",
            labels=["queue"],
        )
        for q in snapshot.queues:
            for status in ("pending", "running", "dead", "cancelled", "waiting"):
                jobs.add_metric([q.queue, status], getattr(q, status))
            due.add_metric([q.queue], q.due)
            oldest.add_metric([q.queue], q.oldest_due_seconds or 0.0)
            expired.add_metric([q.queue], q.expired_leases)
        count = GaugeMetricFamily(
            "pgqueue_workers", "Registered workers, alive or gone.", labels=["state"]
        )
        count.add_metric(["alive"], alive)
        count.add_metric(["gone"], gone)
        yield from (jobs, due, oldest, expired, count, *_late_schedules(snapshot))
        yield from _paused_queues(alias, close=self.close)

    def describe(self) -> Iterator[Any]:
        return iter(())  # the families depend on the data: collect on each scrape only


def _late_schedules(snapshot: stats.Snapshot) -> Iterator[Any]:
    """The schedules whose due tick was not fired in time (read by `stats.collect`)."""
    late = GaugeMetricFamily(
        "pgqueue_late_schedules",
        "Enabled schedules whose due tick has not been fired within 2 poll intervals.",
    )
    late.add_metric([], len(snapshot.late_schedules))
    seconds = GaugeMetricFamily(
        "pgqueue_schedule_late_seconds",
        "How long a late schedule's due tick has waited (only late schedules are listed).",
        labels=["schedule", "queue"],
    )
    for schedule in snapshot.late_schedules:
        seconds.add_metric([schedule.name, schedule.queue], schedule.late_seconds)
    yield late
    yield seconds


def _paused_queues(alias: str, *, close: bool) -> Iterator[Any]:
    """Per controlled queue: 1 while it is paused, 0 while it runs (queue_controls).

    A queue without a control row has never been paused and has no series. The table
    has one small row per controlled queue; a failed read leaves the family out.
    """
    try:
        controls = list(
            QueueControl.objects.using(alias).order_by("queue").values_list("queue", "paused")
        )
    except DatabaseError as exc:
        logger.warning("metrics: reading the queue controls failed: %s", exc)
        return
    finally:
        if close:
            connections[alias].close()
    paused = GaugeMetricFamily(
        "pgqueue_queue_paused",
        "1 while a queue is paused (its workers claim none of its jobs), 0 while it runs.",
        labels=["queue"],
    )
    for queue, is_paused in controls:
        paused.add_metric([queue], 1 if is_paused else 0)
    yield paused


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
