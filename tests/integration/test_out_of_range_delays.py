"""Delays a handler or its retry policy computes out of PostgreSQL's range still end the job.

Before the shared validators, `RetryLater(float("inf"))` or a policy returning 1e13
made the fenced failure write fail ("interval out of range"): the job stayed running
with its lease renewed, and a burst worker never finished.
"""

from __future__ import annotations

import math
import time

import pytest

import django_pgqueue
from django_pgqueue import enqueue
from django_pgqueue.exceptions import RetryLater
from django_pgqueue.validators import MAX_SECONDS
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)


@django_pgqueue.handler("validators.retry_later")
def retry_later(ctx):
    raise RetryLater(ctx.payload["delay"])


class Returns:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def delay(self, attempt: int) -> float:
        return self.seconds


@django_pgqueue.handler("validators.policy_inf", retry=Returns(math.inf))
def policy_inf(ctx):
    raise ValueError("fails, and its policy says retry in infinity")


@django_pgqueue.handler("validators.policy_huge", retry=Returns(1e13))
def policy_huge(ctx):
    raise ValueError("fails, and its policy says retry in 1e13 s")


def retry_in(job_id: int) -> tuple[str, float, list[str]]:
    (status, seconds), *_ = sql(
        "SELECT s.status, extract(epoch FROM s.run_at - a.finished_at) FROM queue_job_state s "
        "JOIN queue_attempts a ON a.job_id = s.job_id WHERE s.job_id = %s",
        [job_id],
    )
    attempts = [
        row[0] for row in sql("SELECT status FROM queue_attempts WHERE job_id = %s", [job_id])
    ]
    return status, float(seconds), attempts


@pytest.mark.parametrize(
    ("type_", "payload"),
    [
        ("validators.retry_later", {"delay": 1e13}),
        ("validators.policy_inf", None),
        ("validators.policy_huge", None),
    ],
)
def test_an_out_of_range_delay_is_clamped_and_the_retry_written(run_worker, type_, payload):
    job = enqueue(type_, payload, queue="clamp", max_attempts=3)
    worker = run_worker(["clamp"], burst=True, concurrency=1)
    worker.join(30)
    status, seconds, attempts = retry_in(job.id)
    assert (status, attempts) == ("pending", ["failed"])
    assert seconds == pytest.approx(MAX_SECONDS, abs=5)
    assert worker.worker.stats["retried"] == 1


def test_a_worker_at_the_longest_intervals_idles_and_stops(run_worker):
    """The largest values the validators accept do not overflow a wait once idle."""
    worker = run_worker(
        ["idle"],
        poll_interval=MAX_SECONDS,
        sweep_interval=MAX_SECONDS,
        lease=MAX_SECONDS,
        job_timeout=MAX_SECONDS,
        shutdown_grace=MAX_SECONDS,
    )
    job = enqueue("qa.noop", None, queue="idle")  # woken by NOTIFY, not by the poll

    def status() -> str:
        return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job.id])[0][0]

    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while status() != "completed" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status() == "completed"
    time.sleep(1.5)  # idle, in waits computed from MAX_SECONDS
    assert worker.thread.is_alive()
    assert worker.error is None
    worker.stop(timeout=20)
