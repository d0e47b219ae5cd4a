"""Counters a worker process keeps about its own attempts, for its /metrics endpoint.

Plain Python (prometheus_client is optional): attempts by queue, type and outcome,
and handler run times per queue and type as a cumulative histogram. `WorkerCounters`
is a job-event observer the worker's ``--metrics-port`` adds to it (`server.serve`).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..claimed import ClaimedJob
from ..extensions import JobEnd, JobObserver

# Upper bounds (seconds) of the run-time histogram's buckets (+Inf is implied).
RUNTIME_BOUNDS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
)
OUTCOMES = ("succeeded", "retried", "dead", "cancelled", "snoozed", "lease_lost")


@dataclass
class Runtime:
    """Run times of one (queue, type): per-bucket counts (not cumulative), sum and count."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(RUNTIME_BOUNDS) + 1))
    total: float = 0.0
    count: int = 0


class WorkerCounters(JobObserver):
    """Attempts by outcome and handler run times, updated from any worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: Counter[tuple[str, str, str]] = Counter()
        self._runtimes: dict[tuple[str, str], Runtime] = {}

    def attempt(self, queue: str, type_: str, outcome: str) -> None:
        """Count one attempt's outcome (see OUTCOMES)."""
        with self._lock:
            self._attempts[(queue, type_, outcome)] += 1

    def attempts_ended(self, ended: Iterable[tuple[str, str]], outcome: str) -> None:
        """Count the (queue, type) attempts of `ended`, each with `outcome`: one lock."""
        counts = Counter(ended)
        with self._lock:
            for (queue, type_), n in counts.items():
                self._attempts[(queue, type_, outcome)] += n

    def runtimes_ran(self, ran: Iterable[tuple[str, str, float]]) -> None:
        """Record how long handlers ran, (queue, type, seconds) each: one lock."""
        # The bucket of each: the first bound >= its seconds.
        entries = [(q, t, bisect.bisect_left(RUNTIME_BOUNDS, s), s) for q, t, s in ran]
        with self._lock:
            for queue, type_, index, seconds in entries:
                runtime = self._runtimes.get((queue, type_))
                if runtime is None:
                    runtime = self._runtimes[(queue, type_)] = Runtime()
                runtime.buckets[index] += 1
                runtime.total += seconds
                runtime.count += 1

    # -- as a job-event observer ------------------------------------------------------

    def jobs_ended(self, ends: Sequence[JobEnd]) -> None:
        counts = Counter((e.item.ctx.queue, e.item.ctx.type, e.outcome) for e in ends)
        with self._lock:
            self._attempts.update(counts)

    def lease_lost(self, item: ClaimedJob, detected_by: str) -> None:
        self.attempt(item.ctx.queue, item.ctx.type, "lease_lost")

    def jobs_executed(self, items: Sequence[ClaimedJob]) -> None:
        self.runtimes_ran(
            [(i.ctx.queue, i.ctx.type, i.runtime) for i in items if i.runtime is not None]
        )

    def attempts(self) -> dict[tuple[str, str, str], int]:
        """A copy of the attempt counts by (queue, type, outcome)."""
        with self._lock:
            return dict(self._attempts)

    def runtimes(self) -> dict[tuple[str, str], Runtime]:
        """A copy of the run-time histograms by (queue, type)."""
        with self._lock:
            return {
                key: Runtime(list(value.buckets), value.total, value.count)
                for key, value in self._runtimes.items()
            }
