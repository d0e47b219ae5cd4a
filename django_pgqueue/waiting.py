"""wait() and await_job(): block (or await) until a job finishes, then return its result.

A wait registers in ``queue_job_waiters`` and LISTENs on its own connection; the
statement that finishes the job (completes it, marks it dead, cancels it) sends a
NOTIFY for jobs that have a waiter, and only for those, so a job nobody waits on costs
no notification. The wait wakes on that NOTIFY and reads the outcome: the result of
the job's last successful attempt, or `JobDead` / `JobCancelled`. It also looks again
on its own, 50 ms after it started and then at doubling pauses up to 5 s: that finds a
job whose finishing statement began before the waiter registered (it could not see
the row), and works where LISTEN does not (a transaction-mode pooler).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from .exceptions import JobCancelled, JobDead, JobNotFound, WaitTimeout
from .job_refs import job_reference
from .store.waiting import AsyncWaitSession, Outcome, WaitSession

# The first look again after registering, and the longest pause between two looks.
FIRST_RECHECK = 0.05
MAX_RECHECK = 5.0
# How long a waiter's row outlives its last look: a crashed waiter's row goes then.
HOLD = 60.0


def checked_timeout(timeout: float | None) -> float | None:
    """`timeout` in seconds (None: no limit); TypeError or ValueError for a bad one."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, got {timeout!r}")
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def _read(job_id: int, outcome: Outcome | None) -> Outcome:
    """The outcome a look read; JobNotFound if the job is gone (pruned meanwhile)."""
    if outcome is None:
        raise JobNotFound(job_id)
    return outcome


def _completed(job_id: int, outcome: Outcome) -> bool:
    """True if the job completed; raise if it finished without a result."""
    if outcome.status == "dead":
        raise JobDead(job_id, outcome.last_error, outcome.error_class)
    if outcome.status == "cancelled":
        raise JobCancelled(job_id)
    return outcome.status == "completed"


class _Clock:
    """The wait's deadline and its next pause."""

    def __init__(self, job_id: int, timeout: float | None) -> None:
        self.job_id = job_id
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.pause = FIRST_RECHECK

    def next_pause(self, status: str) -> float:
        """How long to wait for a NOTIFY before looking again; WaitTimeout when over."""
        pause = self.pause
        self.pause = min(self.pause * 2, MAX_RECHECK)
        if self.deadline is None:
            return pause
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            assert self.timeout is not None
            raise WaitTimeout(self.job_id, self.timeout, status)
        return min(pause, remaining)


def wait(job: Any, timeout: float | None = None, *, using: str | None = None) -> Any:
    """Wait until the job finishes; return its result (the handler's return value).

    `job` is what `enqueue()` returned, a result id (``"42"``, ``"queues2:42"``), a
    `JobRef`, a job's context, or a bare job id. The wait reads the job on the
    database its reference names; a bare id is a job of PGQUEUE["DATABASE"], or of
    `using` (``using=`` with a reference of another database is refused: the same id
    there is another job). Raises `WaitTimeout` (a `TimeoutError`) if it has not
    finished within `timeout` seconds (None: no limit; 0: look once), `JobDead` (with
    the job's last error) if it died, `JobCancelled` if it was cancelled, and
    `JobNotFound` if no such job is visible: a job enqueued in a transaction must be
    committed before it can be waited for. Waiting leaves the job as it was. It runs
    on a connection of its own, never in the caller's transaction.
    """
    ref, limit = job_reference(job, using, caller="wait()"), checked_timeout(timeout)
    job_id = ref.id
    clock = _Clock(job_id, limit)
    session = WaitSession(ref.database)
    try:
        added = session.add(job_id, HOLD)
        if added is None:
            raise JobNotFound(job_id)
        waiter_id, _queue = added
        try:
            while True:
                outcome = _read(job_id, session.check(waiter_id, job_id, HOLD))
                if _completed(job_id, outcome):
                    return outcome.result
                # A NOTIFY (a waited-for job finished) ends the pause early.
                session.notified(clock.next_pause(outcome.status))
        finally:
            with contextlib.suppress(Exception):  # the row expires after HOLD anyway
                session.remove(waiter_id)
    finally:
        session.close()


async def await_job(job: Any, timeout: float | None = None, *, using: str | None = None) -> Any:
    """`wait()` for asyncio: awaits the job's result without blocking the event loop.

    The same arguments, database (the one `job` names; a bare id's is
    PGQUEUE["DATABASE"], or `using`), result and exceptions; cancelling the awaiting
    task stops the wait and leaves the job alone.
    """
    ref, limit = job_reference(job, using, caller="await_job()"), checked_timeout(timeout)
    job_id = ref.id
    clock = _Clock(job_id, limit)
    session = AsyncWaitSession(ref.database)
    await session.open()
    try:
        add = asyncio.ensure_future(session.add(job_id, HOLD))
        try:
            added = await asyncio.shield(add)
        except asyncio.CancelledError:
            # The row may be in already (committed, its answer not read yet): let the
            # add finish, then take its row out again.
            with contextlib.suppress(Exception):
                if (late := await add) is not None:
                    await session.remove(late[0])
            raise
        if added is None:
            raise JobNotFound(job_id)
        waiter_id, _queue = added
        try:
            while True:
                outcome = _read(job_id, await session.check(waiter_id, job_id, HOLD))
                if _completed(job_id, outcome):
                    return outcome.result
                await session.notified(clock.next_pause(outcome.status))
        finally:
            with contextlib.suppress(Exception):
                await session.remove(waiter_id)
    finally:
        await session.close()
