"""Handlers past their timeout: the jobs held until their handler returns, and the
threads retired with them, counted as stuck while their handlers still run."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Iterable
from typing import NamedTuple

from .. import executor
from ..claimed import InFlight
from ..outcomes import Failure

logger = logging.getLogger(__name__)


class Timeouts(NamedTuple):
    """What a timeout check found."""

    failed: list[tuple[InFlight, Failure]]  # jobs past their timeout, and their failure
    over_limit: int  # 1 when more handlers are stuck at once than the pool has threads


class Overdue:
    """The jobs and threads a timeout left behind.

    A job whose handler ran past its timeout stays claimed (its lease renewed, its slot
    in the queue's limits taken) until its handler returns, at most `hold` seconds; its
    failure is written once released. Its thread is retired; it counts as stuck once it
    outlives the timeout by as much again, and leaves the count when it ends.
    """

    def __init__(self, hold: float) -> None:
        self.hold = hold
        self._held: list[tuple[InFlight, Failure, float]] = []  # (item, failure, until)
        self._stuck: list[tuple[threading.Thread, float]] = []  # (thread, stuck from)

    def keep(self, item: InFlight, failure: Failure, now: float) -> bool:
        """Hold `item` (timed out at `now`) with its failure; False when nothing is held."""
        if self.hold <= 0:
            return False
        self._held.append((item, failure, now + self.hold))
        return True

    def next_release(self) -> float | None:
        return min((until for _, _, until in self._held), default=None)

    def release(self, now: float | None = None) -> list[tuple[InFlight, Failure]]:
        """The jobs to fail now: their handler returned (or its thread ended), or they were
        held long enough (all of them when `now` is None: the worker is stopping)."""
        if not self._held:
            return []
        out, keep = [], []
        for item, failure, until in self._held:
            ended = item.thread is not None and not item.thread.is_alive()
            done = now is None or item.returned or ended or now >= until
            (out if done else keep).append((item, failure, until))
        self._held = keep
        return [(item, failure) for item, failure, _ in out]

    def retire(self, thread: threading.Thread | None, stuck_from: float) -> None:
        """`thread`'s job timed out; it counts as stuck from `stuck_from` while it lives."""
        if thread is not None:
            self._stuck.append((thread, stuck_from))

    def too_many_stuck(self, concurrency: int, worker_id: str, now: float) -> bool:
        """More handlers stuck right now than the pool has threads: time to exit."""
        self._stuck = [(t, since) for t, since in self._stuck if t.is_alive()]
        stuck = sum(1 for _, since in self._stuck if now >= since)
        if stuck <= concurrency:
            return False
        logger.critical(
            "worker %s: %d handlers are stuck past their timeout; exiting so a supervisor "
            "can restart the process",
            worker_id,
            stuck,
        )
        return True


def time_out(item: InFlight, handoff: threading.Lock) -> bool:
    """Time out `item`'s handler unless it returned first; True if it was timed out."""
    thread = item.thread
    with handoff:
        if item.returned:
            return False
        item.timed_out = True
        # Its failure is written once it returns (or is held too long), and the job may
        # then run elsewhere: a handler that keeps running must see its lease as lost.
        # The heartbeat renews it meanwhile, so the job stays this worker's.
        item.lease.timed_out = True
        if thread is not None and thread.ident is not None:
            # Raises JobTimeout in the handler at its next bytecode. A handler blocked
            # in C code only notices when that call returns.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(executor.JobTimeout)
            )
    return True


def first_deadline(overdue: Overdue, timed: Iterable[InFlight]) -> float | None:
    """When the first of the `timed` running handlers reaches its timeout, or the first
    held one is let go."""
    deadline = overdue.next_release()
    for item in timed:
        if item.timeout is not None and item.started is not None and not item.timed_out:
            end = item.started + item.timeout
            deadline = end if deadline is None else min(deadline, end)
    return deadline
