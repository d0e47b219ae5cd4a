"""The event loop's watchdog: its lag, the job blocking it, the timeouts it cannot fire.

A thread of its own looks at the loop every LAG_PROBE / 2 seconds: the loop's probe
(`AsyncPool._probe`, every LAG_PROBE seconds) late by LAG_WARNING means the loop is held.
The job whose coroutine is on the loop thread's stack at every look meanwhile is the
one blocking it (a sync call); a loop late with a different job at each look is
overloaded instead. Either way, the timeouts that fall due while the loop is held are
decided from here.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Protocol

from ..claimed import ClaimedJob

logger = logging.getLogger("django_pgqueue.worker.aio")

LAG_PROBE = 0.05  # seconds between two probes of the loop's lag
LAG_WARNING = 0.25  # a probe this late: the loop is held


class WatchedLoop(Protocol):
    """What the watchdog reads and decides of the pool whose loop it watches (AsyncPool:
    the watchdog is its part, on a thread of its own)."""

    worker_id: str
    lag: float
    lag_max: float
    blocked: int
    _stop: threading.Event
    _thread: threading.Thread | None
    _probe_seen: float
    _blocked_now: bool

    def live(self) -> list[ClaimedJob]: ...

    def _decide_timeout(self, item: ClaimedJob) -> bool: ...

    def cancel_timed_out_soon(self, item: ClaimedJob) -> None: ...


class Watchdog:
    """Watches one AsyncPool's loop from its own thread (`run`)."""

    def __init__(self, pool: WatchedLoop, run_code: CodeType) -> None:
        self.pool = pool
        self.run_code = run_code  # the code of AsyncPool._run, whose frames name a job

    def run(self) -> None:
        # The job seen on the loop thread at each look while the loop runs late, and
        # since when the same one: a loop late because one job's sync call holds it
        # shows that job at every look; an overloaded loop shows a different one.
        pool = self.pool
        suspect, since, overloaded_at = None, 0.0, -math.inf
        while not pool._stop.wait(LAG_PROBE / 2):
            now = time.monotonic()
            late = now - pool._probe_seen - LAG_PROBE
            if late < LAG_PROBE:
                suspect = None
                continue
            seen = _running_item(_frame(pool._thread), self.run_code)
            if seen is not suspect:
                suspect, since = seen, now
            if late < LAG_WARNING:
                continue
            pool.lag = late
            pool.lag_max = max(pool.lag_max, late)
            if suspect is not None and now - since >= LAG_WARNING and not pool._blocked_now:
                pool._blocked_now = True
                pool.blocked += 1
                logger.warning(
                    "worker %s: the event loop is blocked (%.2fs so far) by job %d (%s): a "
                    "sync call in an async handler (use await, or sync_to_async for "
                    "blocking code)",
                    pool.worker_id,
                    now - since,
                    suspect.ctx.job_id,
                    suspect.ctx.type,
                    extra=suspect.facts(),
                )
            elif suspect is None and late >= 2 * LAG_WARNING and now - overloaded_at > 60:
                overloaded_at = now
                logger.warning(
                    "worker %s: the event loop runs %.2fs late with no one job holding it: "
                    "more work than its share of the CPU (fewer async handlers in flight, "
                    "or more worker processes, would help)",
                    pool.worker_id,
                    late,
                )
            self.time_out_blocked()

    def time_out_blocked(self) -> None:
        """While the loop is blocked, decide the timeouts its timers cannot (the jobs'
        outcomes are reported once their tasks end: the loop must run for that)."""
        now = time.monotonic()
        pool = self.pool
        for item in pool.live():
            if item.timeout is None or item.started is None or item.timed_out:
                continue
            if now < item.started + item.timeout:
                continue
            if pool._decide_timeout(item):
                logger.error(
                    "job %d (%s) exceeded its timeout of %gs while the event loop was "
                    "blocked; its task is cancelled once the loop runs, and the job "
                    "failed once the task ended (its row and slots held until then)",
                    item.ctx.job_id,
                    item.ctx.type,
                    item.timeout,
                    extra=item.facts(),
                )
                pool.cancel_timed_out_soon(item)


def _frame(thread: threading.Thread | None) -> FrameType | None:
    """The frame `thread` runs right now."""
    return sys._current_frames().get(thread.ident) if thread and thread.ident else None


def _running_item(frame: FrameType | None, code: CodeType) -> ClaimedJob | None:
    """The ClaimedJob of the innermost frame of `code` on a thread's stack, if any."""
    while frame is not None:
        if frame.f_code is code:
            found = frame.f_locals.get("item")
            return found if isinstance(found, ClaimedJob) else None
        frame = frame.f_back
    return None
