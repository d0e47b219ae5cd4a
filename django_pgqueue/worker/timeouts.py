"""Handlers past their timeout: the verdict decided, the exception raised in a sync
handler, and when so many are stuck that the worker must exit.

A timeout decides the job's outcome (a JobTimeout failure, retried by its policy) but
frees nothing: the job keeps its row, its lease and its slots until the handler's code
really returned (see `claimed.ClaimedJob`). A handler blocked in C code cannot be
reached: once it outlives its timeout by as much again it counts as stuck, and a
worker whose threads are all stuck exits (code 1), so that its supervisor starts a
fresh process and the sweep takes the jobs back once the process is gone.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterable

from .. import executor
from ..claimed import ClaimedJob

logger = logging.getLogger(__name__)


def time_out(item: ClaimedJob, handoff: threading.Lock, now: float) -> bool:
    """Decide the timeout of `item`'s sync handler unless it returned first, and raise
    JobTimeout in it; True if it was timed out."""
    assert item.timeout is not None
    verdict = executor.timed_out(item.ctx, item.timeout, item.policy)
    thread = item.thread
    with handoff:
        if item.returned:
            return False
        item.decide(verdict, now)
        if thread is not None and thread.ident is not None:
            # Raises JobTimeout in the handler at its next bytecode. A handler blocked
            # in C code only notices when that call returns.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(executor.JobTimeout)
            )
    return True


def first_deadline(timed: Iterable[ClaimedJob]) -> float | None:
    """When the first of the `timed` running handlers reaches its timeout."""
    deadline = None
    for item in timed:
        if item.timeout is not None and item.started is not None and not item.timed_out:
            end = item.started + item.timeout
            deadline = end if deadline is None else min(deadline, end)
    return deadline


def stuck(items: Iterable[ClaimedJob], now: float) -> int:
    """How many of `items` outlived their timeout by as much again and still run."""
    return sum(
        1
        for item in items
        if item.timed_out_at is not None
        and item.timeout is not None
        and now >= item.timed_out_at + item.timeout
        and not item.ended
    )


def all_stuck(count: int, slots: int, worker_id: str) -> bool:
    """Every one of the `slots` handler threads is stuck (`count`): time to exit."""
    if count < slots:
        return False
    logger.critical(
        "worker %s: all %d handler threads are stuck past their timeout; exiting so a "
        "supervisor can restart the process",
        worker_id,
        count,
        extra={"worker_id": worker_id},
    )
    return True
