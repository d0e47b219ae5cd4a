"""Outcome batching and fenced writes, with the read-back of writes left in doubt.

Every write names the lease version it holds (see `job_complete`, `job_fail`): a write
about a job that another worker owns now changes nothing and is counted as stale.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

import psycopg

from ..exceptions import DatabaseUnavailable
from ..observability.hooks import Observer  # issue 15 hook
from ..outcomes import Failure, Outcome, Success, plainer, unstorable_result
from ..store.worker import ClaimedRow, ClaimKey, Store
from .config import WorkerConfig
from .inflight import InFlight
from .leases import LeaseBook

logger = logging.getLogger(__name__)

# How long a finished job's outcome may wait so that it is written together with
# others (and with the next claim). Short against any job worth queueing.
FLUSH_DELAY = 0.005

Written = tuple[InFlight, Outcome]
# (queue, limit, worker_id, lease seconds, resume key): a claim to send with completions.
Claim = tuple[str, int, str, float, ClaimKey | None]


class OutcomeWriter:
    """Holds finished jobs' outcomes until they are written; writes them fenced.

    Used by the dispatcher thread only. Facts for the claim scheduler (retries due
    soon) wait in `take_retries`.
    """

    def __init__(
        self,
        store: Store,
        leases: LeaseBook,
        stats: Counter[str],
        config: WorkerConfig,
        observer: Observer,
    ) -> None:
        self.store = store
        self.leases = leases
        self.stats = stats
        self.config = config
        self.observer = observer  # issue 15: told of every outcome written (or stale)
        self._unwritten: list[Written] = []
        self._unwritten_since = 0.0
        # Written when the connection died: did the COMMIT happen? (resolve_uncertain)
        self._uncertain: list[Written] = []
        self._unstorable: set[int] = set()
        self._retries: list[tuple[str, float]] = []

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

    def add(self, item: InFlight, outcome: Outcome) -> None:
        if not self._unwritten:
            self._unwritten_since = time.monotonic()
        self._unwritten.append((item, outcome))

    def take(self) -> list[Written]:
        batch, self._unwritten = self._unwritten, []
        return batch

    def flush_due(self, now: float, running: bool) -> bool:
        """Write now: nothing else runs, the batch is full, or its first waited FLUSH_DELAY."""
        return bool(self._unwritten) and (
            not running
            or len(self._unwritten) >= self.config.batch_size
            or now - self._unwritten_since >= FLUSH_DELAY
        )

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
        """
        successes = [(item, out) for item, out in batch if isinstance(out, Success)]
        failures = [(item, out) for item, out in batch if isinstance(out, Failure)]
        for item, _ in batch:
            item.lease.finishing = True  # a renewal racing this write must not cry "lost"
        done = [(i.ctx.job_id, i.ctx.lease_version, i.attempt_id, o.result) for i, o in successes]
        remaining: list[Written] = list(batch)  # not known to be written
        self._unstorable.clear()
        if done and not failures and claim is not None:
            # The common case: completions and the next claim in one round trip and
            # one commit. Any refusal undoes both; they are then written one by one.
            try:
                completed, claimed = self.store.complete_and_claim(done, *claim)
            except DatabaseUnavailable:
                self._uncertain.extend(remaining)
                raise
            except psycopg.Error as exc:
                logger.warning("completing and claiming together failed (%s); apart now", exc)
            else:
                self._account_completions(successes, completed)
                return claimed
        try:
            try:
                completed = self.store.complete(done)
            except psycopg.Error as exc:  # a value PostgreSQL refused, not a lost connection
                logger.error(
                    "completing %d job(s) failed (%s); writing them one by one", len(done), exc
                )
                completed = self._complete_one_by_one(successes)
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
        for item, outcome in successes:
            if item.ctx.job_id in completed:
                self.stats["completed"] += 1
                assert isinstance(outcome, Success)
                self.observer.completed(item, outcome.result)  # issue 15 hook
            elif item.ctx.job_id not in self._unstorable:
                self._stale(item, "complete")
            self.leases.forget(item.lease)

    def _fail(self, item: InFlight, outcome: Failure) -> tuple[str, Any] | None:
        """Write one failure; if PostgreSQL refuses its text, write a plainer one."""
        ctx = item.ctx
        try:
            return self.store.fail(ctx.job_id, ctx.lease_version, item.attempt_id, outcome)
        except DatabaseUnavailable:
            raise
        except psycopg.Error as exc:
            logger.error("recording the failure of job %d was refused: %s", ctx.job_id, exc)
            plain = plainer(outcome)
            return self.store.fail(ctx.job_id, ctx.lease_version, item.attempt_id, plain)

    def _complete_one_by_one(self, successes: list[Written]) -> set[int]:
        completed: set[int] = set()
        for item, outcome in successes:
            ctx = item.ctx
            assert isinstance(outcome, Success)
            try:
                completed |= self.store.complete(
                    [(ctx.job_id, ctx.lease_version, item.attempt_id, outcome.result)]
                )
            except DatabaseUnavailable:
                raise
            except psycopg.Error as exc:
                # The job ran; its result cannot be stored: dead, so it is not re-run.
                self._unstorable.add(ctx.job_id)
                failure = unstorable_result(outcome.result, exc)
                self._log_failure(item, failure, self._fail(item, failure))
        return completed

    def _log_failure(
        self, item: InFlight, outcome: Failure, result: tuple[str, Any] | None
    ) -> None:
        ctx = item.ctx
        if result is None:
            self._stale(item, "fail")
            return
        status, run_at = result
        self.observer.failed(item, outcome, status, run_at)  # issue 15 hook
        if status == "dead":
            self.stats["dead"] += 1
            logger.error(
                "job %d (%s) dead after attempt %d/%d: %s",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                outcome.last_error,
            )
        else:
            self.stats["retried"] += 1
            logger.warning(
                "job %d (%s) failed attempt %d/%d, retry in %.2fs: %s",
                ctx.job_id,
                ctx.type,
                ctx.attempt,
                ctx.max_attempts,
                outcome.delay,
                outcome.last_error,
            )
            if outcome.delay <= self.config.poll_interval:
                self._retries.append((ctx.queue, time.monotonic() + outcome.delay))

    def _stale(self, item: InFlight, what: str) -> None:
        self.stats["stale_writes"] += 1
        self.observer.lease_lost(item, "write")  # issue 15 hook
        logger.warning(
            "stale write rejected: %s of job %d with lease_version %d changed nothing; "
            "another worker owns it now",
            what,
            item.ctx.job_id,
            item.ctx.lease_version,
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
        for item, outcome in pending:
            status = statuses.get(item.attempt_id)
            # Warnings, like the lost connection that put the write in doubt.
            if status == "running":
                item.lease.finishing = False  # it did not land: renew it and write again
                self.add(item, outcome)
                logger.warning(
                    "job %d: the write in doubt had not landed; writing it again",
                    item.ctx.job_id,
                )
            elif status in ("succeeded", "failed"):
                self.stats["completed" if status == "succeeded" else "failed_written"] += 1
                self.leases.forget(item.lease)
                logger.warning(
                    "job %d: the write in doubt had landed (%s)", item.ctx.job_id, status
                )
            else:
                self.leases.forget(item.lease)
                self._stale(item, "write after reconnect")
