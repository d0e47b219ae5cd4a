"""Outcome batching and fenced writes, with the read-back of writes left in doubt.

Every write names the lease version it holds (see `job_complete`, `job_fail`): a write
about a job that another worker owns now changes nothing and is counted as stale.
"""

from __future__ import annotations

import enum
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import psycopg

from ..claimed import ClaimedJob
from ..exceptions import DatabaseUnavailable
from ..extensions import JobEnd
from ..outcomes import (
    ERROR_CLASS_LIMIT,
    Committed,
    Failure,
    Interrupted,
    Outcome,
    Retry,
    Snoozed,
    Success,
    as_plain_text,
    storable,
    unstorable_result,
)
from ..store import errors
from ..store.worker import ClaimedRow, ClaimKey, Store
from ..worker_config import WorkerConfig
from .leases import LeaseBook
from .observing import Observers

logger = logging.getLogger(__name__)

# How long a finished job's outcome may wait so that it is written together with
# others (and with the next claim). Short against any job worth queueing.
FLUSH_DELAY = 0.005

# A write refused for a reason other than a lost connection is written again at most
# WRITE_TRIES times, after pauses of WRITE_PAUSE, 4x, 16x ... (the heartbeat keeps the
# lease meanwhile).
WRITE_TRIES = 4
WRITE_PAUSE = 0.02

T = TypeVar("T")


class _Abandoned(enum.Enum):
    ABANDONED = "abandoned"


Abandoned = Literal[_Abandoned.ABANDONED]
ABANDONED: Abandoned = _Abandoned.ABANDONED

Written = tuple[ClaimedJob, Outcome]
# (queue, limit, worker_id, lease seconds, resume key): a claim to send with completions.
Claim = tuple[str, int, str, float, ClaimKey | None]


@dataclass(eq=False, repr=False)
class OutcomeWriter:
    """Holds finished jobs' outcomes until they are written; writes them fenced.

    Used by the dispatcher thread only. Facts for the claim scheduler (retries due
    soon) wait in `take_retries`. The store's claims hear of every outcome added (a
    controlled queue's job frees a slot, and its outcome is written at once:
    `QueueClaims.write_at_once`); the observers, of every outcome written, and of every
    write refused as stale.
    """

    store: Store
    leases: LeaseBook
    stats: Counter[str]
    config: WorkerConfig
    observers: Observers
    _unwritten: list[Written] = field(default_factory=list, init=False)
    _unwritten_since: float = field(default=0.0, init=False)
    # Written when the connection died: did the COMMIT happen? (resolve_uncertain)
    _uncertain: list[Written] = field(default_factory=list, init=False)
    # Completions recorded as failures instead (unstorable, or refused) in this write.
    _failed_instead: set[int] = field(default_factory=set, init=False)
    _retries: list[tuple[str, float]] = field(default_factory=list, init=False)

    # -- the batch ----------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Outcomes wait to be written."""
        return bool(self._unwritten)

    @property
    def in_doubt(self) -> bool:
        """Writes wait for a read-back of whether they landed."""
        return bool(self._uncertain)

    def backlog(self) -> int:
        return len(self._unwritten) + len(self._uncertain)

    def add(self, written: list[Written]) -> None:
        """Hold outcomes until the batch is written (see `flush_due`); its FLUSH_DELAY
        runs from when its first handler returned, not from when they were collected."""
        if not self._unwritten:
            self._unwritten_since = _first_return(written)
        self._unwritten.extend(written)
        self.store.claims.finished([item.ctx.queue for item, _ in written])

    def take(self) -> list[Written]:
        batch, self._unwritten = self._unwritten, []
        return batch

    def flush_due(self, now: float, running: bool) -> bool:
        """Write now: nothing else runs, the batch is full, its first waited FLUSH_DELAY,
        or a feature has an outcome in it written at once."""
        if not self._unwritten:
            return False
        if (
            not running
            or len(self._unwritten) >= self.config.batch_size
            or now - self._unwritten_since >= FLUSH_DELAY
        ):
            return True
        write_now = self.store.claims.write_at_once
        return any(write_now(i.ctx.queue) for i, _ in self._unwritten)

    def flush_deadline(self) -> float | None:
        """When the waiting batch is due to be written, if one waits."""
        return self._unwritten_since + FLUSH_DELAY if self._unwritten else None

    def take_retries(self) -> list[tuple[str, float]]:
        """(queue, monotonic time due) of the retries written since the last call that
        are due within POLL_INTERVAL: no NOTIFY announces them."""
        retries, self._retries = self._retries, []
        return retries

    # -- writing ------------------------------------------------------------------

    def write(self, batch: list[Written], claim: Claim | None) -> list[ClaimedRow] | None:
        """Write a batch of outcomes (all completions in one statement).

        With `claim`, the completions and the claim go in one round trip when the
        batch holds only successes; returns the claimed rows then, else None: the
        claim is the caller's to send.

        Only `DatabaseUnavailable` leaves it (what was being written is then in doubt):
        a write PostgreSQL refuses is written again, as plain text, or given up on (its lease
        let go, for the sweep), and never keeps the rest of the batch from being written.
        """
        successes = [(item, out) for item, out in batch if isinstance(out, Success)]
        failures = [(item, out) for item, out in batch if isinstance(out, Failure)]
        for item, _ in batch:
            item.lease.finishing = True  # a renewal racing this write must not cry "lost"
        remaining: list[Written] = list(batch)  # not known to be written
        self._failed_instead.clear()
        if successes and not failures and claim is not None:
            # The common case: completions and the next claim in one round trip and
            # one commit. Any refusal undoes both; they are then written one by one.
            try:
                completed, claimed = self.store.complete_and_claim(_done(successes), *claim)
            except DatabaseUnavailable:
                self._uncertain.extend(remaining)
                raise
            except psycopg.Error as exc:
                logger.warning(
                    "completing and claiming together was refused (%s); apart now",
                    errors.describe(exc),
                )
            else:
                self._account_completions(successes, completed)
                return claimed
        try:
            completed = self._complete(successes)
            remaining = list(failures)
            self._account_completions(successes, completed)
            while remaining:
                item, outcome = remaining[0]
                assert isinstance(outcome, Failure)
                self._log_failure(item, outcome, self._fail(item, outcome))
                self.leases.forget(item.lease)
                remaining.pop(0)
        except DatabaseUnavailable:
            # The COMMIT of what was being written may or may not have happened.
            self._uncertain.extend(remaining)
            raise
        return None

    def _account_completions(self, successes: list[Written], completed: set[int]) -> None:
        cancelled = self.store.take_cancelled()  # an operator asked while they ran
        ends: list[JobEnd] = []
        for item, outcome in successes:
            if item.ctx.job_id in cancelled:
                self.stats["cancelled"] += 1
                ends.append(JobEnd(item, "cancelled"))
            elif item.ctx.job_id in completed or isinstance(outcome, Committed):
                ends.append(JobEnd(item, "completed", result=outcome.result))  # type: ignore[union-attr]
            elif item.ctx.job_id not in self._failed_instead:
                self._stale(item, "complete")
        self.leases.forget_all([item.lease for item, _ in successes])
        completed = sum(1 for ended in ends if ended.end == "completed")
        if completed:
            self.stats["completed"] += completed
        self.observers.jobs_ended(ends)

    def _complete(self, successes: list[Written]) -> set[int]:
        """Complete the batch's successes; one by one if the batch is refused."""
        if not successes:
            return set()
        done = _done(successes)
        try:
            return with_retries(f"completing {len(done)} job(s)", lambda: self.store.complete(done))
        except psycopg.Error as exc:
            if len(successes) == 1:
                return self._complete_refused(successes[0], exc)
            logger.error(
                "completing %d job(s) was refused (%s); writing them one by one",
                len(done),
                errors.describe(exc),
            )
        completed: set[int] = set()
        for written in successes:
            try:
                completed |= with_retries(
                    f"completing job {written[0].ctx.job_id}",
                    lambda w=written: self.store.complete(_done([w])),
                )
            except psycopg.Error as exc:
                completed |= self._complete_refused(written, exc)
        return completed

    def _complete_refused(self, written: Written, exc: psycopg.Error) -> set[int]:
        """Record a completion PostgreSQL refused as a failure; return the ids completed.

        Only a refused value makes a returned result unstorable (the job ran: dead, so
        it is not re-run); any other refusal fails the attempt retryably, naming the
        error: a successful job is never dead because of a database hiccup.
        """
        item, outcome = written
        assert isinstance(outcome, Success)
        if outcome.result is not None and errors.classify(exc) == errors.VALUE:
            failure = unstorable_result(outcome.result, exc)
        else:
            logger.error(
                "job %d: completing it was refused (%s); recording a retryable failure",
                item.ctx.job_id,
                errors.describe(exc),
                extra=item.facts(),
            )
            failure = Retry(
                storable(errors.class_path(exc), ERROR_CLASS_LIMIT),
                storable(f"recording the job's success failed: {errors.describe(exc)}", 4000),
            )
        self._failed_instead.add(item.ctx.job_id)
        self._log_failure(item, failure, self._fail(item, failure))
        return set()

    def _fail(self, item: ClaimedJob, outcome: Failure) -> tuple[str, Any] | Abandoned | None:
        """Write one failure; if PostgreSQL refuses it, the same as plain text with a
        bounded delay (`as_plain_text`); if that too, give the job up to the sweep."""
        ctx = item.ctx

        def write(failure: Failure) -> tuple[str, Any] | None:
            return self.store.fail(ctx.job_id, ctx.lease_version, item.attempt_id, failure)

        what = f"recording the failure of job {ctx.job_id}"
        try:
            return with_retries(what, lambda: write(outcome), other=False)
        except psycopg.Error as exc:
            logger.error(
                "%s was refused (%s); writing it as plain text", what, errors.describe(exc)
            )
        try:
            return with_retries(what, lambda: write(as_plain_text(outcome)))
        except psycopg.Error as exc:
            logger.error(
                "job %d: %s was refused again (%s); its lease is let go and the sweep will "
                "requeue it once the lease runs out",
                ctx.job_id,
                what,
                errors.describe(exc),
                extra=item.facts(),
            )
            self.stats["writes_abandoned"] += 1
            return ABANDONED

    def _log_failure(
        self, item: ClaimedJob, outcome: Failure, result: tuple[str, Any] | Abandoned | None
    ) -> None:
        ctx = item.ctx
        if result is ABANDONED:
            return
        if result is None:
            self._stale(item, "fail")
            return
        status, run_at = result
        kind = _kind(outcome, status)
        soon = isinstance(outcome, Retry) and outcome.delay <= self.config.poll_interval
        if kind == "retried" and soon:
            self._retries.append((ctx.queue, time.monotonic() + outcome.delay))  # type: ignore[union-attr]
        self.observers.jobs_ended([JobEnd(item, kind, failure=outcome, run_at=run_at)])
        self.stats[kind] += 1
        _log_written(kind, item, outcome)

    def _stale(self, item: ClaimedJob, what: str) -> None:
        self.stats["stale_writes"] += 1
        self.observers.lease_lost(item, "write")
        logger.warning(
            "stale write rejected: %s of job %d with lease_version %d changed nothing; "
            "another worker owns it now",
            what,
            item.ctx.job_id,
            item.ctx.lease_version,
            extra=item.facts(),
        )

    # -- writes in doubt ----------------------------------------------------------

    def resolve_uncertain(self) -> None:
        """After a lost connection: read back whether the writes in doubt landed."""
        if not self._uncertain:
            return
        pending, self._uncertain = self._uncertain, []
        try:
            statuses = self.store.attempt_statuses([item.attempt_id for item, _ in pending])
        except DatabaseUnavailable:
            self._uncertain = pending + self._uncertain
            raise
        except psycopg.Error as exc:  # still in doubt: the next cycle reads them back
            self._uncertain = pending + self._uncertain
            logger.warning("reading back %d write(s) in doubt failed: %s", len(pending), exc)
            return
        for item, outcome in pending:
            status = statuses.get(item.attempt_id)
            # Warnings, like the lost connection that put the write in doubt.
            if status == "running":
                item.lease.finishing = False  # it did not land: renew it and write again
                self.add([(item, outcome)])
                logger.warning(
                    "job %d: the write in doubt had not landed; writing it again",
                    item.ctx.job_id,
                    extra=item.facts(),
                )
            elif status in ("succeeded", "failed"):
                self.stats["completed" if status == "succeeded" else "failed_written"] += 1
                self.leases.forget(item.lease)
                logger.warning(
                    "job %d: the write in doubt had landed (%s)",
                    item.ctx.job_id,
                    status,
                    extra=item.facts(),
                )
            else:
                self.leases.forget(item.lease)
                self._stale(item, "write after reconnect")


def _done(successes: list[Written]) -> list[tuple[int, int, int, str | None]]:
    """The (job_id, lease_version, attempt_id, result) rows of job_complete; the jobs
    their handlers completed in their own transactions (`Committed`) are not written
    again."""
    return [
        (item.ctx.job_id, item.ctx.lease_version, item.attempt_id, out.result)  # type: ignore[union-attr]
        for item, out in successes
        if not isinstance(out, Committed)
    ]


def with_retries(what: str, write: Callable[[], T], *, other: bool = True) -> T:
    """Run `write`, again after a pause while PostgreSQL refuses it for a transient
    reason (or, with `other`, one it cannot classify), at most WRITE_TRIES times.

    A lost connection (DatabaseUnavailable) and a refused value raise at once.
    """
    for attempt in range(1, WRITE_TRIES + 1):
        try:
            return write()
        except psycopg.Error as exc:
            kind = errors.classify(exc)
            if attempt == WRITE_TRIES or not (
                kind == errors.TRANSIENT or (other and kind == errors.OTHER)
            ):
                raise
            pause = WRITE_PAUSE * 4 ** (attempt - 1)
            logger.warning(
                "%s refused (%s: %s); writing it again in %.2fs",
                what,
                kind,
                errors.describe(exc),
                pause,
            )
            time.sleep(pause)
    raise AssertionError("unreachable")


def _kind(outcome: Failure, status: str) -> str:
    """What a written failure ended as. A snooze is pending again, its attempt given back;
    an interruption by the worker's shutdown too, due at once; "cancelled" ends a job an
    operator asked to cancel while it ran; else it is retried or dead."""
    if status in ("dead", "cancelled"):
        return status
    if isinstance(outcome, Snoozed):
        return "snoozed"
    return "interrupted" if isinstance(outcome, Interrupted) else "retried"


def _log_written(kind: str, item: ClaimedJob, outcome: Failure) -> None:
    """The log line of a failure written as `kind` (dead, retried, interrupted, snoozed,
    cancelled): what the job is now, after which attempt, and why."""
    ctx = item.ctx
    level, what = {
        # A dead job logged already with its traceback where it ran (a failed @task):
        # not twice.
        "dead": (logging.INFO if outcome.logged else logging.ERROR, "dead after attempt"),
        "retried": (logging.WARNING, "failed, retried later, at attempt"),
        "interrupted": (logging.WARNING, "interrupted, the attempt given back, at attempt"),
    }.get(kind, (logging.INFO, f"{kind} at attempt"))
    delay = f" (due again in {outcome.delay:.2f}s)" if isinstance(outcome, Retry) else ""
    logger.log(
        level,
        "job %d (%s) %s %d/%d%s: %s",
        ctx.job_id,
        ctx.type,
        what,
        ctx.attempt,
        ctx.max_attempts,
        delay if kind == "retried" else "",
        outcome.last_error,
        extra=item.facts(),
    )


def _first_return(written: list[Written]) -> float:
    """When the first handler of `written` returned (monotonic; now if none says)."""
    ends = [i.started + i.runtime for i, _ in written if i.started and i.runtime is not None]
    return min(ends, default=time.monotonic())
