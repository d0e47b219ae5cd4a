"""The per-minute rollup: what workers finished per queue and minute, how long it waited
and ran, and each queue's backlog.

A worker notes each attempt whose outcome it wrote (`RollupBuffer.add`, on the
dispatcher thread); its heartbeat adds them to ``queue_stats_minutely`` with one
upsert (`stats_minute_add`) per cycle, off the claim and completion path. Waits and
run times are the database's own: the attempt's start minus the run_at it was claimed
at, its finish minus its start. Once a minute the heartbeat also samples the backlog
(jobs due and not started) of the queues the worker serves (`sample_backlog`). The
charts read the rollup only (`read_window`), never ``queue_attempts``.

Known limit: attempts noted but not yet flushed when a worker is killed (SIGKILL)
are missing from the charts; the jobs themselves are unaffected.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..store import observability as store_observability
from ..store.arrays import int_array, repeated_text_array
from ..store.session import Session

logger = logging.getLogger(__name__)

# Upper bounds (seconds) of the wait buckets; one more bucket holds longer waits.
WAIT_BOUNDS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
# Attempts a worker keeps for the rollup while the database is away; older ones are dropped.
BUFFER_LIMIT = 200_000
# Most due jobs a backlog sample counts per queue (the admin's at-a-glance cap): a
# sample costs the same whatever the depth; a deeper backlog reads as this.
BACKLOG_CAP = 50_000


class RollupBuffer:
    """Finished attempts waiting for the heartbeat to add them to the rollup (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[int, str, Any, str]] = []

    def add(self, attempts: Iterable[tuple[int, str, Any]], outcome: str) -> None:
        """Note (attempt id, queue, run_at) attempts whose outcome (succeeded, retried,
        dead ...) was written."""
        items = [(attempt_id, queue, run_at, outcome) for attempt_id, queue, run_at in attempts]
        with self._lock:
            self._items.extend(items)

    def __len__(self) -> int:
        return len(self._items)

    def flush(self, store: Session) -> int:
        """Add the noted attempts to the rollup in one statement; return how many."""
        with self._lock:
            items, self._items = self._items, []
        if not items:
            return 0
        try:
            store_observability.add_minutes(store, _params(items))
        except BaseException:
            with self._lock:
                self._items = (items + self._items)[-BUFFER_LIMIT:]
            raise
        return len(items)


def sample_backlog(store: Session, queues: Sequence[str]) -> None:
    """Sample the backlog of `queues` (jobs due and not started) into the current minute."""
    store_observability.sample_backlog(
        store,
        {
            "queues": list(queues),
            "cap": BACKLOG_CAP,
            "bounds": [float(bound) for bound in WAIT_BOUNDS],
        },
    )


def _params(items: Sequence[tuple[int, str, Any, str]]) -> dict[str, Any]:
    attempt_ids, queues, run_ats, outcomes = zip(*items, strict=True)
    return {
        "attempt_ids": int_array(attempt_ids),
        "queues": repeated_text_array(queues),
        # As text: psycopg's list dumper costs ~20 µs per datetime, on the heartbeat
        # thread, holding the GIL the handlers need. ISO timestamps need no quotes.
        "run_ats": "{" + ",".join(map(dt.datetime.isoformat, run_ats)) + "}",
        "outcomes": repeated_text_array(outcomes),
        "bounds": [float(bound) for bound in WAIT_BOUNDS],
    }


def quantile(buckets: Sequence[int], q: float) -> float | None:
    """Estimate the q-quantile of waits or run times from bucket counts (linear within a
    bucket)."""
    total = sum(buckets)
    if total <= 0:
        return None
    target = q * total
    seen = 0
    for index, count in enumerate(buckets):
        if count and seen + count >= target:
            lower = WAIT_BOUNDS[index - 1] if index > 0 else 0.0
            if index >= len(WAIT_BOUNDS):
                return float(lower)  # the open last bucket: "at least"
            return lower + (WAIT_BOUNDS[index] - lower) * (target - seen) / count
        seen += count
    return float(WAIT_BOUNDS[-1])


@dataclass
class QueueSeries:
    """One queue's figures per minute of a window, oldest first (None: nothing finished)."""

    queue: str
    completed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    dead: list[int] = field(default_factory=list)
    wait_p50: list[float | None] = field(default_factory=list)
    wait_p95: list[float | None] = field(default_factory=list)
    run_p50: list[float | None] = field(default_factory=list)
    run_p95: list[float | None] = field(default_factory=list)
    # Due jobs not started, the last sample in the point (None: no worker sampled it).
    backlog: list[int | None] = field(default_factory=list)


@dataclass
class Window:
    """The rollup of the last `minutes` minutes per queue, in points of `step` minutes.

    `start` is the first point's first minute (None when the rollup has no rows).
    """

    start: dt.datetime | None
    minutes: int
    queues: list[QueueSeries]
    step: int = 1


def read_window(alias: str, minutes: int, step: int = 1) -> Window:
    """Read the rollup of the last `minutes` minutes (one index range walk).

    Each point sums `step` minutes (their wait histograms too, so its percentiles are
    those of all the attempts in it): a day at 5-minute points is 288 points a line.
    """
    if minutes < 1 or step < 1 or minutes % step:
        raise ValueError(f"minutes ({minutes}) must be a positive multiple of step ({step})")
    rows = store_observability.read_minutes(alias, minutes)
    if not rows:
        return Window(None, minutes, [], step)
    points = minutes // step
    start = rows[0][0] - dt.timedelta(minutes=minutes - 1)
    width = len(WAIT_BOUNDS) + 1
    series: dict[str, QueueSeries] = {}
    waits: dict[str, list[list[int]]] = {}
    runs: dict[str, list[list[int]]] = {}
    for _, minute, queue, completed, retried, dead, _wait_sum, buckets, ran, backlog in rows:
        slot = int((minute - start).total_seconds() // 60) // step
        if not 0 <= slot < points:
            continue
        item = series.get(queue)
        if item is None:
            item = series[queue] = QueueSeries(queue, [0] * points, [0] * points, [0] * points)
            item.backlog = [None] * points
            waits[queue] = [[0] * width for _ in range(points)]
            runs[queue] = [[0] * width for _ in range(points)]
        item.completed[slot] += completed
        item.failed[slot] += retried + dead
        item.dead[slot] += dead
        if backlog is not None:  # rows come oldest first: the point keeps its last sample
            item.backlog[slot] = backlog
        for histogram, counts in ((waits[queue][slot], buckets), (runs[queue][slot], ran)):
            for index, count in enumerate((counts or [])[:width]):
                histogram[index] += count
    for queue, item in series.items():
        item.wait_p50 = [quantile(merged, 0.5) for merged in waits[queue]]
        item.wait_p95 = [quantile(merged, 0.95) for merged in waits[queue]]
        item.run_p50 = [quantile(merged, 0.5) for merged in runs[queue]]
        item.run_p95 = [quantile(merged, 0.95) for merged in runs[queue]]
    return Window(start, minutes, sorted(series.values(), key=lambda s: s.queue), step)
