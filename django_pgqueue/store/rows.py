"""The rows and parameters of the worker's statements: what a claim returns, what a
completion or a failure writes. No connection here; `Store` and the claims use them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..outcomes import Dead, Failure, Interrupted, InterruptedRunning, Parked, Retry, Snoozed
from .arrays import int_array


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


def claim_statement(request: ClaimRequest) -> tuple[str, dict[str, Any]]:
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


def owned_params(held: Iterable[tuple[int, int]]) -> dict[str, str]:
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
        **owned_params([(job_id, version) for job_id, version, _, _ in done]),
        "attempt_ids": int_array([attempt for _, _, attempt, _ in done]),
        "results": "{" + results + "}",
    }


def failure_statement(
    job_id: int, lease_version: int, attempt_id: int, failure: Failure
) -> tuple[str, dict[str, Any]]:
    """The statement that writes the end `failure` leads the attempt to, with its
    parameters (see `outcomes`): ``job_interrupt`` for an interruption while the
    handler may still run, ``job_park`` for a wait for an event, ``job_fail`` for the
    rest: a retry or a death, or (``give_back``) a snooze or another interruption."""
    attempt = {"job_id": job_id, "lease_version": lease_version, "attempt_id": attempt_id}
    if isinstance(failure, Parked):
        return "job_park", {
            **attempt,
            "key": failure.key,
            "name": failure.name,
            "timeout": failure.timeout,
            "reason": failure.message,
        }
    if isinstance(failure, InterruptedRunning):
        return "job_interrupt", {
            **attempt,
            "end_lease": failure.held,
            "reason": failure.message,
            "error_class": failure.error_class,
        }
    give_back = isinstance(failure, Snoozed | Interrupted)
    return "job_fail", {
        **attempt,
        "give_back": give_back,
        "permanent": isinstance(failure, Dead),
        "delay": failure.delay if isinstance(failure, Retry | Snoozed) else 0.0,
        "attempt_status": (
            "snoozed" if isinstance(failure, Snoozed) else "interrupted" if give_back else "failed"
        ),
        "error_class": failure.error_class,
        "error_message": failure.message,
        "traceback": None if give_back else failure.traceback,
        "last_error": None if give_back else failure.last_error,
    }
