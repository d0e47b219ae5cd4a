"""What a handler of a job on the second database (`queues2`) sees: its idempotency key
and its workflow's stored results name that database, not PGQUEUE["DATABASE"]
(`default`), whose jobs have the same ids (each database numbers its own)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connections, transaction

from django_pgqueue import EnqueueError, batch, enqueue, enqueue_many
from django_pgqueue.workflows import chain, chord, group, step

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


def result(alias: str, job_id: int) -> Any:
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT result FROM queue_attempts WHERE job_id = %s AND status = 'succeeded'",
            [job_id],
        )
        (value,) = cursor.fetchone()
    return json.loads(value)  # jsonb comes back as text on Django's connection


def test_the_idempotency_key_of_a_job_on_queues2_names_its_database(run_worker: Any) -> None:
    # Equal ids on the two databases would give equal keys otherwise, and an external
    # service would take the second job for a retry of the first.
    here = enqueue("qa.keys", queue="mail")
    there = enqueue("qa.keys", queue="q2.work")
    run_worker(["mail"], burst=True).join()
    run_worker(["q2.work"], burst=True).join()
    assert result("default", here.id) == {"key": f"pgqueue-{here.id}", "database": None}
    assert result("queues2", there.id) == {
        "key": f"pgqueue-queues2:{there.id}",
        "database": "queues2",
    }


def test_a_chord_on_queues2_reads_its_parents_there(run_worker: Any) -> None:
    # Jobs of other results on default, under the ids the chord takes on queues2.
    enqueue_many([("qa.echo", {"decoy": n}) for n in range(6)], queue="mail")
    run_worker(["mail"], burst=True).join()
    members = [step("qa.parents", n, queue="q2.flow") for n in range(3)]
    run = chord(group(*members), step("qa.parents", "sum", queue="q2.flow")).enqueue()
    run_worker(["q2.flow"], burst=True).join()
    with connections["queues2"].cursor() as cursor:
        cursor.execute("SELECT status, count(*) FROM queue_job_state GROUP BY status")
        assert cursor.fetchall() == [("completed", 4)]
    callback = result("queues2", list(run.jobs.values())[-1])
    assert [parent["payload"] for parent in callback["parents"].values()] == [0, 1, 2]


def test_a_batch_callback_on_queues2_reads_its_batch_there(run_worker: Any) -> None:
    callback = step("qa.batch_counts", "done", queue="q2.flow")
    with batch(on_finish=callback, using="queues2") as run:
        for n in range(2):
            enqueue("qa.echo", {"n": n}, queue="q2.flow")
    run_worker(["q2.flow"], burst=True).join()
    with connections["queues2"].cursor() as cursor:
        cursor.execute("SELECT id FROM queue_jobs WHERE type = 'qa.batch_counts'")
        (fired,) = cursor.fetchone()
    counts = result("queues2", fired)["batch"]
    assert counts["id"] == run.id
    assert counts["size"] == 2
    assert counts["completed"] == 2


def test_a_workflow_across_two_databases_is_refused_naming_them() -> None:
    mixed = chord(
        group(step("qa.parents", 1, queue="q2.flow")), step("qa.parents", "cb", queue="mail")
    )
    with pytest.raises(EnqueueError, match=r"several databases \('q2\.flow' on 'queues2'"):
        mixed.enqueue()
    for alias in ("default", "queues2"):
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM queue_jobs")
            assert cursor.fetchone() == (0,)


def test_a_workflow_inside_a_transaction_on_the_other_database_only_is_refused() -> None:
    refused = pytest.raises(EnqueueError, match="lives on the database 'queues2'")
    with refused, transaction.atomic(using="default"):
        chain(
            step("qa.parents", 1, queue="q2.flow"), step("qa.parents", 2, queue="q2.flow")
        ).enqueue()
