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
from collections.abc import Mapping, Sequence
from typing import Any

from ..outcomes import Failure
from .arrays import int_array
from .claims import QueueClaims
from .connection import Backoff, connection_params, wait_for
from .rows import (
    ClaimedRow,
    ClaimKey,
    ClaimRequest,
    Completion,
    complete_params,
    failure_statement,
    owned_params,
)
from .session import LOST, Session

__all__ = [
    "LOST",
    "Backoff",
    "ClaimKey",
    "ClaimRequest",
    "ClaimedRow",
    "Completion",
    "Store",
    "complete_params",
    "connection_params",
    "failure_statement",
    "wait_for",
]

logger = logging.getLogger(__name__)

NOTIFY_CHANNEL = "pgqueue"


class Store(Session):
    """Runs the worker's statements on one dedicated connection (see `Session`).

    `claims` is the claim of each queue, plain, fair (`fair_queues`: their keys'
    weights) or controlled (`store.claims`), whose view of the controlled queues is read
    again every `view_every` seconds.
    """

    def __init__(
        self,
        alias: str,
        application_name: str,
        *,
        prepared: bool = True,
        view_every: float = 0.5,
        fair_queues: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        super().__init__(alias, application_name, prepared=prepared)
        self.claims = QueueClaims(self, view_every, fair_queues)
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
        """Complete `done` (None: the claim alone) and claim, by the queue's claim: one
        pipeline, one round trip, one transaction."""
        done_rows, rows = self.claims.claim(done, request)
        return (self.completed(done_rows) if done is not None else set()), rows

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
        rows = self.run("lease_renew", {**owned_params(held), "lease": lease}) if held else []
        self.cancel_requested = {row[0] for row in rows if row[1]}
        return {row[0] for row in rows}

    def release(self, held: Sequence[tuple[int, int, int]]) -> set[int]:
        """Hand back claimed, never-started (job_id, lease_version, attempt_id); return job ids."""
        if not held:
            return set()
        rows = self.run(
            "job_release",
            {
                **owned_params((job_id, version) for job_id, version, _ in held),
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

    def time_out_waits(self, limit: int = 1000) -> list[str]:
        """Wake the jobs whose durable event waits timed out (`event_wait_timeout`), any
        worker's; return the queues they are pending in again."""
        return [row[0] for row in self.run("event_wait_timeout", {"limit": limit})]

    def attempt_statuses(self, attempt_ids: Sequence[int]) -> dict[int, str]:
        """Status of attempts, by attempt id."""
        if not attempt_ids:
            return {}
        rows = self.run("attempt_outcome", {"attempt_ids": int_array(attempt_ids)})
        return {row[0]: row[1] for row in rows}
