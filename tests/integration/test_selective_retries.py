"""autoretry_for and dont_autoretry_for with a real worker: an exception the handler (or
the task) does not retry makes its job dead after one attempt, its error recorded; one
it retries waits for the backoff and runs again."""

from __future__ import annotations

import time

import pytest
from qa.models import TaskCall
from qa.tasks import picky

import django_pgqueue
from django_pgqueue import JobContext, enqueue
from django_pgqueue.models import Attempt, JobState
from django_pgqueue.retry import FixedDelay
from tests.integration.tasks.api import TaskResultStatus, task_finished

pytestmark = pytest.mark.django_db(transaction=True)

QUEUE = "selective"
FINISHED = ("completed", "dead", "cancelled")


class GatewayDown(Exception):
    """Transient: worth a retry."""


class CardDeclined(GatewayDown):
    """A GatewayDown that retrying cannot help (dont_autoretry_for)."""


@django_pgqueue.handler(
    "selective.charge",
    queue=QUEUE,
    max_attempts=4,
    autoretry_for=(GatewayDown,),
    dont_autoretry_for=(CardDeclined,),
    retry_backoff=0.01,
    retry_backoff_max=0.05,
)
def charge(ctx: JobContext) -> dict[str, int]:
    failures = ctx.payload.get("down_for", 0)
    if ctx.attempt <= failures:
        raise GatewayDown(f"gateway down (attempt {ctx.attempt})")
    if ctx.payload.get("declined"):
        raise CardDeclined("card declined")
    if ctx.payload.get("invalid"):
        raise ValueError(f"invalid amount {ctx.payload['invalid']!r}")
    return {"attempt": ctx.attempt}


@django_pgqueue.handler(
    "selective.async_charge",
    queue=QUEUE,
    max_attempts=4,
    retry=FixedDelay(0),
    dont_autoretry_for=KeyError,
)
async def async_charge(ctx: JobContext) -> int:
    if ctx.payload.get("missing"):
        raise KeyError(ctx.payload["missing"])
    if ctx.attempt == 1:
        raise ConnectionError("retried: only KeyError is not")
    return ctx.attempt


def drain(run_worker, queue: str, job_ids: list[int]) -> None:
    """Run burst workers until every job has finished (60 s at most): a burst worker may
    exit just before a retry of a few milliseconds is due."""
    deadline = time.monotonic() + 60
    while JobState.objects.filter(pk__in=job_ids).exclude(status__in=FINISHED).exists():
        assert time.monotonic() < deadline, "the jobs did not finish within 60 s"
        run_worker([queue], burst=True).join()


def attempts_of(job_id: int) -> list[tuple[int, str, str | None]]:
    return list(
        Attempt.objects.filter(job_id=job_id)
        .order_by("attempt_index")
        .values_list("attempt_index", "status", "error_class")
    )


def test_an_exception_not_in_autoretry_for_is_dead_after_one_attempt(run_worker):
    invalid = enqueue("selective.charge", {"invalid": -5})
    declined = enqueue("selective.charge", {"down_for": 1, "declined": True})
    recovered = enqueue("selective.charge", {"down_for": 2})
    drain(run_worker, QUEUE, [invalid.id, declined.id, recovered.id])

    state = JobState.objects.get(pk=invalid.id)
    assert (state.status, state.attempts) == ("dead", 1)
    assert state.last_error == "ValueError: invalid amount -5"
    [attempt] = Attempt.objects.filter(job_id=invalid.id)
    assert (attempt.status, attempt.error_class) == ("failed", "ValueError")
    assert "invalid amount -5" in attempt.traceback
    assert "in charge" in attempt.traceback

    # Retried while the gateway was down, then dead at once on the excluded subclass.
    assert JobState.objects.get(pk=declined.id).status == "dead"
    kinds = [error.rpartition(".")[2] for _, _, error in attempts_of(declined.id)]
    assert kinds == ["GatewayDown", "CardDeclined"]

    assert JobState.objects.get(pk=recovered.id).status == "completed"
    assert [status for _, status, _ in attempts_of(recovered.id)] == [
        "failed",
        "failed",
        "succeeded",
    ]


def test_an_async_handlers_dont_autoretry_for(run_worker):
    missing = enqueue("selective.async_charge", {"missing": "sku"})
    retried = enqueue("selective.async_charge", {})
    drain(run_worker, QUEUE, [missing.id, retried.id])
    assert attempts_of(missing.id) == [(1, "failed", "KeyError")]
    assert JobState.objects.get(pk=missing.id).status == "dead"
    assert [status for _, status, _ in attempts_of(retried.id)] == ["failed", "succeeded"]


def test_a_tasks_autoretry_for_names_an_exception_of_its_own_module(run_worker):
    finished: list[tuple[str, list[str]]] = []

    def on_finished(sender, task_result, **kwargs):
        paths = [error.exception_class_path for error in task_result.errors]
        finished.append((str(task_result.status), paths))

    task_finished.connect(on_finished, weak=False)
    try:
        invalid = picky.enqueue("invalid")
        transient = picky.enqueue("transient")
        fine = picky.enqueue("fine")
        jobs = [int(result.id) for result in (invalid, transient, fine)]
        drain(run_worker, "qa-tasks", jobs)
    finally:
        task_finished.disconnect(on_finished)

    invalid.refresh()
    assert (invalid.status, invalid.attempts) == (TaskResultStatus.FAILED, 1)
    assert [error.exception_class for error in invalid.errors] == [ValueError]
    transient.refresh()
    assert (transient.status, transient.attempts) == (TaskResultStatus.FAILED, 3)
    fine.refresh()
    assert (fine.status, fine.return_value) == (TaskResultStatus.SUCCESSFUL, 1)
    assert sorted(TaskCall.objects.values_list("label", "attempt")) == [
        ("picky:fine", 1),
        ("picky:invalid", 1),
        ("picky:transient", 1),
        ("picky:transient", 2),
        ("picky:transient", 3),
    ]
    # task_finished once per task, when it ends: not for the retried attempts.
    assert sorted(finished) == sorted(
        [
            ("FAILED", ["builtins.ValueError"]),
            ("FAILED", ["qa.tasks.Transient"] * 3),
            ("SUCCESSFUL", []),
        ]
    )
