"""The worker's own connections: the statements of claiming and finishing jobs.

`Store` owns one dedicated psycopg connection in autocommit mode, made from the Django
database settings but outside Django's connection handling, so CONN_MAX_AGE never
closes it between jobs; its statements are prepared unless
PGQUEUE["WORKER_PREPARED_STATEMENTS"] is False. Each method runs one statement from
`sql/core.sql`, or a claim's pipeline of them; a lost connection surfaces as
`DatabaseUnavailable` and the next call reconnects (`store.connection.wait_for`, with
jittered backoff).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import psycopg

from ..outcomes import Failure
from ..sql import QUERIES
from .arrays import int_array
from .connection import Backoff, connection_params, wait_for
from .session import LOST, Session

__all__ = [
    "LOST",
    "Backoff",
    "ClaimKey",
    "ClaimRequest",
    "ClaimedRow",
    "Completion",
    "Store",
    "connection_params",
    "wait_for",
]

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "pgqueue"


class ClaimedRow(NamedTuple):
    """One row of job_claim, in its column order."""

    job_id: int
    queue: str
    type: str
    payload: str
    priority: int
    attempt: int
    max_attempts: int
    lease_version: int
    attempt_id: int
    idempotency_key: str | None
    created_at: Any
    run_at: Any
    traceparent: str | None = None  # the enqueuer's W3C trace context

    def order(self) -> tuple[int, Any, int]:
        """A sort key for claim order: ORDER BY priority DESC, run_at, job_id."""
        return (-self.priority, self.run_at, self.job_id)


# Where a claim resumes: the (priority, run_at, job_id) of a row claimed before.
ClaimKey = tuple[int, Any, int]
# One completion to write: (job_id, lease_version, attempt_id, result JSON or None).
Completion = tuple[int, int, int, str | None]


class ClaimRequest(NamedTuple):
    """One claim: up to `limit` jobs of `queue` for `worker_id`, leased `lease` seconds.

    With `after`, a (priority, run_at, job_id) key, only jobs of that priority after
    it in claim order are taken.
    """

    queue: str
    limit: int
    worker_id: str
    lease: float
    after: ClaimKey | None = None


def _claim_statement(request: ClaimRequest) -> tuple[str, dict[str, Any]]:
    queue, limit, worker_id, lease, after = request
    params = {"queue": queue, "limit": limit, "worker_id": worker_id, "lease": lease}
    if after is None:
        return "job_claim", params
    priority, run_at, job_id = after
    return "job_claim_after", {
        **params,
        "after_priority": priority,
        "after_run_at": run_at,
        "after_job_id": job_id,
    }


def _owned(held: Iterable[tuple[int, int]]) -> dict[str, str]:
    """Parameters naming the (job_id, lease_version) pairs a worker holds."""
    # List comprehensions, not generators: a batch's worth per write, on the hot path.
    held = list(held)
    return {
        "job_ids": int_array([job_id for job_id, _ in held]),
        "owned": "{" + ",".join([f'"{job_id}":{version}' for job_id, version in held]) + "}",
    }


def complete_params(done: Sequence[Completion]) -> dict[str, str]:
    """job_complete's parameters for `done`."""
    results = ",".join([f'"{attempt}":{result}' for _, _, attempt, result in done if result])
    return {
        **_owned([(job_id, version) for job_id, version, _, _ in done]),
        "attempt_ids": int_array([attempt for _, _, attempt, _ in done]),
        "results": "{" + results + "}",
    }


def failure_statement(
    job_id: int, lease_version: int, attempt_id: int, failure: Failure
) -> tuple[str, dict[str, Any]]:
    """The statement that records `failure` of an attempt, with its parameters:
    ``job_give_back`` for a snooze or an interruption by the worker's shutdown,
    ``job_interrupt`` for one whose row the stopping worker holds, else ``job_fail``."""
    attempt = {"job_id": job_id, "lease_version": lease_version, "attempt_id": attempt_id}
    if failure.interrupted and failure.held:
        return "job_interrupt", {
            **attempt,
            "reason": failure.message,
            "error_class": failure.error_class,
        }
    if failure.snoozed or failure.interrupted:
        return "job_give_back", {
            **attempt,
            "delay": failure.delay,
            "reason": failure.message,
            "attempt_status": "snoozed" if failure.snoozed else "interrupted",
            "error_class": failure.error_class,
        }
    return "job_fail", {
        **attempt,
        "permanent": failure.permanent,
        "delay": failure.delay,
        "error_class": failure.error_class,
        "error_message": failure.message,
        "traceback": failure.traceback,
        "last_error": failure.last_error,
    }


# A claim a feature runs instead of the plain one (extensions.WorkerHooks.claim):
# (store, completions or None, request) -> (job ids completed, rows) or None.
Claimer = Callable[["Store", "Sequence[Completion] | None", "ClaimRequest"], Any]


class Store(Session):
    """Runs the worker's statements on one dedicated connection (see `Session`).

    `claimer`: set by the worker when a feature takes over some queues' claims.
    """

    def __init__(self, alias: str, application_name: str, *, prepared: bool = True) -> None:
        super().__init__(alias, application_name, prepared=prepared)
        self.claimer: Claimer | None = None
        # Jobs a completion ended cancelled (an operator asked while they ran), since
        # the last `take_cancelled`.
        self._cancelled: set[int] = set()
        # Job ids the last renewal reported as cancel-requested by an operator.
        self.cancel_requested: set[int] = set()

    # -- worker statements ----------------------------------------------------------

    def claim(
        self,
        queue: str,
        limit: int,
        worker_id: str,
        lease: float,
        after: ClaimKey | None = None,
    ) -> list[ClaimedRow]:
        """Claim up to `limit` due jobs of `queue`, each with a new lease and attempt.

        With `after`, a (priority, run_at, job_id) key, only jobs of that priority
        after it in claim order are taken (`job_claim_after`).
        """
        return self._claim(None, ClaimRequest(queue, limit, worker_id, lease, after))[1]

    def complete(self, done: Sequence[Completion]) -> set[int]:
        """Complete (job_id, lease_version, attempt_id, result_json); return the job ids done."""
        if not done:
            return set()
        return self.completed(self.run("job_complete", complete_params(done)))

    def completed(self, rows: Sequence[tuple[Any, ...]]) -> set[int]:
        """The job ids job_complete returned; those it ended cancelled are noted."""
        self._cancelled.update(row[0] for row in rows if row[1])
        return {row[0] for row in rows}

    def take_cancelled(self) -> set[int]:
        """The jobs completions ended cancelled since the last call (not succeeded)."""
        cancelled, self._cancelled = self._cancelled, set()
        return cancelled

    def complete_and_claim(
        self,
        done: Sequence[Completion],
        queue: str,
        limit: int,
        worker_id: str,
        lease: float,
        after: ClaimKey | None = None,
    ) -> tuple[set[int], list[ClaimedRow]]:
        """`complete` then `claim`, pipelined: one round trip, one transaction, one commit.

        Both statements share the transaction, so an error in either undoes both and
        raises; the caller then writes them one at a time.
        """
        return self._claim(done, ClaimRequest(queue, limit, worker_id, lease, after))

    def _claim(
        self, done: Sequence[Completion] | None, request: ClaimRequest
    ) -> tuple[set[int], list[ClaimedRow]]:
        """Complete `done` (None: the claim alone) and claim, or let `claimer` do it.

        One pipeline: one round trip, one transaction. Prepared, the claim runs on its
        generic plan (`claim_plan_generic`), planned once, not again at every claim.
        """
        if self.claimer is not None:
            taken = self.claimer(self, done, request)
            if taken is not None:
                return taken  # type: ignore[no-any-return]
        claim_name, claim = _claim_statement(request)
        what = claim_name if done is None else f"job_complete + {claim_name}"
        with self.holding(what) as conn:
            prepared = conn.prepare_threshold is not None
            try:
                return self._claim_pipeline(conn, done, (claim_name, claim), what, prepared)
            except psycopg.Error:
                if done is not None or not prepared or conn.prepare_threshold is not None:
                    raise  # with completions: the caller writes them apart
        # The server did not know a statement this worker prepared (a transaction-mode
        # pooler; preparation is off from now on): the claim alone once more.
        return set(), [ClaimedRow._make(row) for row in self.run(claim_name, claim)]

    def _claim_pipeline(
        self,
        conn: psycopg.Connection[Any],
        done: Sequence[Completion] | None,
        statement: tuple[str, dict[str, Any]],
        what: str,
        generic: bool,
    ) -> tuple[set[int], list[ClaimedRow]]:
        claim_name, claim = statement
        with conn.cursor() as done_cur, conn.cursor() as claim_cur:
            with self.pipelined(conn, what):
                if done is not None:
                    done_cur.execute(QUERIES["job_complete"], complete_params(done))
                if generic:
                    conn.execute(QUERIES["claim_plan_generic"])
                claim_cur.execute(QUERIES[claim_name], claim)
            completed = self.completed(done_cur.fetchall()) if done is not None else set()
            return completed, [ClaimedRow._make(row) for row in claim_cur.fetchall()]

    def fail(
        self, job_id: int, lease_version: int, attempt_id: int, failure: Failure
    ) -> tuple[str, Any] | None:
        """Record a failed attempt; return (new status, run_at), or None if the lease was lost."""
        name, params = failure_statement(job_id, lease_version, attempt_id, failure)
        rows = self.run(name, params)
        return (rows[0][0], rows[0][1]) if rows else None

    def renew(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        """Extend the leases of (job_id, lease_version) pairs; return the job ids still held.

        The jobs among them an operator asked to cancel are left in `cancel_requested`.
        """
        rows = self.run("lease_renew", {**_owned(held), "lease": lease}) if held else []
        self.cancel_requested = {row[0] for row in rows if row[1]}
        return {row[0] for row in rows}

    def release(self, held: Sequence[tuple[int, int, int]]) -> set[int]:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id); return job ids."""
        if not held:
            return set()
        rows = self.run(
            "job_release",
            {
                **_owned((job_id, version) for job_id, version, _ in held),
                "attempt_ids": int_array(attempt for _, _, attempt in held),
            },
        )
        return {row[0] for row in rows}

    def locked_by(self, worker_id: str) -> list[tuple[int, int, int]]:
        """The (job_id, lease_version, attempt_id) of running jobs locked by `worker_id`."""
        rows = self.run("job_locked_by", {"worker_id": worker_id})
        return [(row[0], row[1], row[2]) for row in rows]

    def next_due(self, queue: str) -> float | None:
        """Seconds until the next pending job of `queue` is due (<= 0: due), None if none."""
        rows = self.run("queue_next_due", {"queue": queue})
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    def sweep(self, limit: int = 1000) -> list[tuple[int, str, int, str]]:
        """Requeue (or kill) jobs whose lease ran out: [(job_id, queue, lost_version, status)]."""
        return [tuple(row) for row in self.run("lease_sweep", {"limit": limit})]  # type: ignore[misc]

    def attempt_statuses(self, attempt_ids: Sequence[int]) -> dict[int, str]:
        """Status of attempts, by attempt id."""
        if not attempt_ids:
            return {}
        rows = self.run("attempt_outcome", {"attempt_ids": int_array(attempt_ids)})
        return {row[0]: row[1] for row in rows}
