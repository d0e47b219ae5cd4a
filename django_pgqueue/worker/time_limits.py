"""Handlers' soft and hard time limits (Celery's `soft_time_limit` and `time_limit`).

The soft limit raises `SoftTimeLimitExceeded` in a sync handler at its next bytecode
(its ``except`` and ``finally`` blocks run; what it does then is its outcome) and
cancels an async handler's task. It decides nothing and frees nothing.

The hard limit stops the code for real: a thread cannot be killed, so the process
running it ends. Under a supervisor the dispatcher writes what it can (the outcomes
of the handlers that ended), then hands the supervisor its last words (`LastWords`:
the job past its limit failed with `TimeLimitExceeded`, the others given back, their
attempts not spent) and exits; the supervisor writes them once the process is gone,
so every job keeps its row and slots until its code really stopped (the one hold of
`claimed.ClaimedJob`), and starts a fresh process. Without a supervisor a hard limit
acts as a timeout (`ClaimedJob.claimed`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .. import executor
from ..claimed import ClaimedJob
from ..exceptions import DatabaseUnavailable, SoftTimeLimitExceeded, TimeLimitExceeded
from ..outcomes import Dead, Failure, Interrupted, Retry
from ..store.worker import Store
from .report import TIME_LIMIT, SupervisorReport

logger = logging.getLogger(__name__)

# The exit code of a worker process that ended itself for a hard time limit (its
# supervisor starts a fresh one at once).
EXIT_TIME_LIMIT = 3
LIMIT_ERROR = "django_pgqueue.TimeLimitExceeded"
GIVEN_BACK = (
    "another handler of its worker process ran past its hard time limit and the process "
    "was ended; its attempt is given back"
)


def raise_soft_limit(item: ClaimedJob, handoff: threading.Lock) -> bool:
    """Raise SoftTimeLimitExceeded in `item`'s sync handler unless it returned first;
    True if raised."""
    thread = item.thread
    with handoff:
        if item.returned or item.soft_limited:
            return False
        item.soft_limited = True
        if thread is not None and thread.ident is not None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread.ident), ctypes.py_object(SoftTimeLimitExceeded)
            )
    logger.warning(
        "job %d (%s) ran past its soft time limit of %gs: SoftTimeLimitExceeded raised in it",
        item.ctx.job_id,
        item.ctx.type,
        item.soft_time_limit,
        extra=item.facts(),
    )
    return True


def soft_limit_due(item: ClaimedJob, now: float) -> bool:
    """`item`'s handler runs past its soft time limit and was not told yet."""
    return (
        item.soft_time_limit is not None
        and item.started is not None
        and not item.soft_limited
        and now - item.started >= item.soft_time_limit
    )


def past_hard_limit(items: Iterable[ClaimedJob], now: float) -> list[ClaimedJob]:
    """The running handlers among `items` past their hard time limit."""
    return [
        item
        for item in items
        if item.time_limit is not None
        and item.started is not None
        and not item.ended
        and now - item.started >= item.time_limit
    ]


def first_deadline(items: Iterable[ClaimedJob]) -> float | None:
    """When the first of `items` reaches a soft or a hard time limit not acted on yet."""
    deadline = None
    for item in items:
        if item.started is None:
            continue
        for limit, done in ((item.soft_time_limit, item.soft_limited), (item.time_limit, False)):
            if limit is not None and not done:
                end = item.started + limit
                deadline = end if deadline is None else min(deadline, end)
    return deadline


class HardLimits:
    """Ends this process once a handler runs past its hard time limit, under a
    supervisor (told through `report`; None: none, and a hard limit is a timeout).
    Used by the dispatcher thread only."""

    def __init__(self, report: SupervisorReport | None, database: str) -> None:
        self.report = report
        self.database = database

    def check(
        self,
        running: Iterable[ClaimedJob],
        collect: Callable[[], None],
        write: Callable[[], None],
    ) -> None:
        """End the process if a handler of `running` is past its hard limit: the outcomes
        of the handlers that ended are collected and written first (what cannot be is
        left to the sweep); the supervisor writes the rest once the process is gone
        (`LastWords`)."""
        if self.report is None:
            return
        held = list(running)
        expired = past_hard_limit(held, time.monotonic())
        if not expired:
            return
        for item in expired:
            logger.error(
                "job %d (%s) ran past its hard time limit of %gs; ending this worker "
                "process (its supervisor fails the job and starts a fresh one)",
                item.ctx.job_id,
                item.ctx.type,
                item.time_limit,
                extra=item.facts(),
            )
        collect()
        try:
            write()
        except (DatabaseUnavailable, psycopg.Error) as exc:
            logger.warning("writing the outcomes before the end failed: %s", exc)
        words = LastWords.of(self.database, expired, held)
        self.report.send(TIME_LIMIT, last_words=words.as_json())
        logging.shutdown()
        os._exit(EXIT_TIME_LIMIT)


def limit_failure(item: ClaimedJob) -> Failure:
    """The failure of a job whose handler ran past its hard time limit."""
    assert item.time_limit is not None
    exc = TimeLimitExceeded(
        f"the handler ran longer than its hard time limit of {item.time_limit:g}s; "
        "the worker process running it was ended"
    )
    retry_on = item.handler.retry_on if item.handler is not None else None
    failure = executor.classify(exc, item.ctx, item.policy, retry_on)
    failure.error_class = LIMIT_ERROR  # the queue's own record, by its public name
    return failure


@dataclass
class LastWords:
    """What a worker process ended for a hard time limit leaves its supervisor to write
    once it is gone: each job it held, by its fenced (job_id, lease_version,
    attempt_id)."""

    database: str
    failed: list[tuple[int, int, int, Failure]] = field(default_factory=list)
    given_back: list[tuple[int, int, int]] = field(default_factory=list)
    unstarted: list[tuple[int, int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, database: str, expired: list[ClaimedJob], held: Iterable[ClaimedJob]) -> LastWords:
        """The jobs `expired` failed, the other running ones of `held` given back, those
        not started handed back."""
        words = cls(database)
        ended = set(expired)
        for item in expired:
            words.failed.append((*_fence(item), limit_failure(item)))
        for item in held:
            if item in ended or item.resolved:
                continue
            if item.started is None:
                words.unstarted.append(_fence(item))
            else:
                words.given_back.append(_fence(item))
        return words

    def as_json(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "failed": [
                [job, version, attempt, _failure_json(failure)]
                for job, version, attempt, failure in self.failed
            ],
            "given_back": [list(row) for row in self.given_back],
            "unstarted": [list(row) for row in self.unstarted],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LastWords:
        return cls(
            str(data["database"]),
            [(int(j), int(v), int(a), _failure_of(f)) for j, v, a, f in data["failed"]],
            [(int(j), int(v), int(a)) for j, v, a in data["given_back"]],
            [(int(j), int(v), int(a)) for j, v, a in data["unstarted"]],
        )

    def given_back_failure(self) -> Failure:
        return Interrupted(LIMIT_ERROR, GIVEN_BACK)


def _fence(item: ClaimedJob) -> tuple[int, int, int]:
    return (item.ctx.job_id, item.ctx.lease_version, item.attempt_id)


def _failure_json(failure: Failure) -> dict[str, Any]:
    return {
        "dead": isinstance(failure, Dead),
        "delay": failure.delay if isinstance(failure, Retry) else 0.0,
        "error_class": failure.error_class,
        "message": failure.message,
        "traceback": failure.traceback,
    }


def _failure_of(data: dict[str, Any]) -> Failure:
    text = (str(data["error_class"]), str(data["message"]), str(data["traceback"]))
    return Dead(*text) if data["dead"] else Retry(*text, delay=float(data["delay"]))


def write_last_words(words: LastWords) -> None:
    """Write what a process ended for a hard time limit left (the supervisor's call,
    once the process is gone): fenced like every write, so a job whose lease ran out
    meanwhile (and that the sweep took) is left alone. A write that fails leaves the
    jobs to the sweep, their leases being the process's."""
    store = Store(words.database, "pgqueue supervisor", prepared=False)
    given_back = words.given_back_failure()
    try:
        for job_id, version, attempt, failure in words.failed:
            store.fail(job_id, version, attempt, failure)
        for job_id, version, attempt in words.given_back:
            store.fail(job_id, version, attempt, given_back)
        store.release(words.unstarted)
    except (DatabaseUnavailable, psycopg.Error) as exc:
        logger.warning(
            "writing the jobs of a process ended for its time limit failed (%s); the sweep "
            "takes them back once their leases end",
            exc,
        )
    finally:
        store.close()
