"""The event loop's pool reports every job it was handed, however its task ended."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from django_pgqueue.claimed import ClaimedJob
from django_pgqueue.registry import Handler
from django_pgqueue.retry import FixedDelay
from django_pgqueue.store.worker import ClaimedRow
from django_pgqueue.worker.aio import CANCEL, AsyncPool

HANG_GUARD = 60.0  # seconds: a bound on a hang, never a bound the test measures


def claimed(job_id: int, func: Any) -> ClaimedJob:
    row = ClaimedRow(job_id, "q", "t", "{}", 0, 1, 1, 1, job_id, None, None, None)
    return ClaimedJob.claimed(row, Handler("t", func), FixedDelay(1), None, "w", 1e12)


def test_a_task_cancelled_before_its_first_step_reports_its_job():
    """A cancel (an operator's, a lost lease's, the shutdown's) can reach a job's task
    after the task was made and before it first ran: its code never runs, and the job
    must still be reported, or its row and slots stay held while the process lives."""
    pool = AsyncPool(1, threading.Event(), "w")

    async def second(ctx: Any) -> None:
        return None

    later = claimed(2, second)

    async def first(ctx: Any) -> None:
        loop = asyncio.get_running_loop()
        # Two hops: the cancel runs after this task's end has made the next job's task,
        # before that task's first step.
        loop.call_soon(loop.call_soon, pool._cancel, later, CANCEL)

    pool.submit([claimed(1, first), later])
    reported: list[ClaimedJob] = []
    deadline = time.monotonic() + HANG_GUARD
    try:
        while len(reported) < 2 and time.monotonic() < deadline:
            reported += [item for item, _ in pool.finished()]
            time.sleep(0.01)
    finally:
        pool.stop()

    assert sorted(item.ctx.job_id for item in reported) == [1, 2]
    assert later.ended
