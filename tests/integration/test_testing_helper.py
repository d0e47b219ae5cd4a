"""django_pgqueue.testing.run_due_jobs: a project's tests run their jobs in-process."""

from __future__ import annotations

import json

import pytest

from django_pgqueue import enqueue
from django_pgqueue.testing import run_due_jobs
from tests.conftest import sql


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


@pytest.mark.django_db(transaction=True)
def test_runs_every_due_job_of_every_queue_and_leaves_later_ones():
    echo = enqueue("qa.echo", {"n": 1}, queue="mail").id
    noop = enqueue("qa.noop", {}, queue="billing").id
    dead = enqueue("qa.permanent", {}, queue="billing").id
    later = enqueue("qa.noop", {}, queue="mail", delay=3600).id

    counts = run_due_jobs()

    assert counts["completed"] == 2
    assert counts["dead"] == 1
    assert (status(echo), status(noop), status(dead), status(later)) == (
        "completed",
        "completed",
        "dead",
        "pending",
    )
    (result,) = sql("SELECT result FROM queue_attempts WHERE job_id = %s", [echo])[0]
    assert json.loads(result) == {"n": 1}  # Django's connection reads jsonb as text


@pytest.mark.django_db(transaction=True)
def test_only_the_queues_named():
    mail = enqueue("qa.noop", {}, queue="mail").id
    billing = enqueue("qa.noop", {}, queue="billing").id
    assert run_due_jobs(["mail"])["completed"] == 1
    assert (status(mail), status(billing)) == ("completed", "pending")


@pytest.mark.django_db(transaction=True)
def test_nothing_due_returns_at_once():
    assert run_due_jobs() == {}


@pytest.mark.django_db
def test_inside_a_test_transaction_it_refuses_with_the_way_out():
    enqueue("qa.noop", {}, queue="mail")
    with pytest.raises(RuntimeError, match=r"TransactionTestCase.*transaction=True"):
        run_due_jobs()
