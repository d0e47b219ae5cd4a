"""Sequences, one statement at a time: who is head, what moves a sequence on, and
what holds it (every path that ends a job or brings it back: complete, fail, sweep,
release, cancel, operator retry, prune, the operator's release of a held sequence)."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_pgqueue import EnqueueError, Unique, enqueue, sequences
from django_pgqueue.actions import cancel, retry_now
from django_pgqueue.maintenance import prune
from django_pgqueue.outcomes import Dead, Retry
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "seq-test:1:abc"
BROKEN = Dead("ValueError", "the customer's ledger is locked", "")
FLAKY = Retry("TimeoutError", "the bank did not answer", "", delay=0)


def statuses(*jobs: Any) -> list[str]:
    rows = dict(
        sql(
            "SELECT job_id, status FROM queue_job_state WHERE job_id = ANY(%s)",
            [[job.id for job in jobs]],
        )
    )
    return [rows[job.id] for job in jobs]


def head(queue: str, key: str) -> int | None:
    rows = sql(
        "SELECT head_job_id FROM queue_sequences WHERE queue = %s AND sequence_key = %s",
        [queue, key],
    )
    return rows[0][0] if rows else None


def run_one(store: Any, queue: str, outcome: Any = None) -> int | None:
    """Claim one job of `queue`: complete it, or fail it with `outcome`; its id."""
    claimed = store.claim(queue, 10, WORKER, 300)
    assert len(claimed) <= 1, "a sequence ran two jobs at once"
    if not claimed:
        return None
    row = claimed[0]
    if outcome is None:
        assert store.complete([(row.job_id, row.lease_version, row.attempt_id, json.dumps(1))])
    else:
        assert store.fail(row.job_id, row.lease_version, row.attempt_id, outcome)
    return row.job_id


def test_the_first_job_is_head_and_the_others_wait_in_one_statement_each():
    with CaptureQueriesContext(connection) as queries:
        jobs = [enqueue("qa.noop", {"n": n}, queue="s1", sequence="c-42") for n in range(3)]
    assert len(queries) == 3
    assert statuses(*jobs) == ["pending", "waiting", "waiting"]
    assert head("s1", "c-42") == jobs[0].id
    other = enqueue("qa.noop", queue="s1", sequence="c-43")
    assert statuses(other) == ["pending"]  # another key, another sequence


def test_jobs_run_one_at_a_time_in_enqueue_order(stores):
    store = stores()
    jobs = [enqueue("qa.noop", {"n": n}, queue="s2", sequence="k") for n in range(4)]
    ran = [run_one(store, "s2") for _ in jobs]
    assert ran == [job.id for job in jobs]
    assert run_one(store, "s2") is None
    assert head("s2", "k") is None
    later = enqueue("qa.noop", queue="s2", sequence="k")  # an idle sequence starts again
    assert statuses(later) == ["pending"]


def test_a_retry_keeps_its_place_and_a_dead_head_holds_the_rest(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s3", sequence="k", max_attempts=2)
    second = enqueue("qa.noop", queue="s3", sequence="k")
    assert run_one(store, "s3", FLAKY) == first.id
    assert statuses(first, second) == ["pending", "waiting"]
    assert run_one(store, "s3", FLAKY) == first.id  # attempts spent: dead
    assert statuses(first, second) == ["dead", "waiting"]
    assert run_one(store, "s3") is None
    assert head("s3", "k") == first.id
    third = enqueue("qa.noop", queue="s3", sequence="k")  # behind the held head too
    assert statuses(third) == ["waiting"]


def test_continue_lets_the_rest_go_on_past_a_dead_job(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s4", sequence="k", sequence_on_failure="continue")
    second = enqueue("qa.noop", queue="s4", sequence="k")
    assert run_one(store, "s4", BROKEN) == first.id
    assert statuses(first, second) == ["dead", "pending"]
    assert head("s4", "k") == second.id


def test_an_operator_retry_of_the_held_head_runs_it_first(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s5", sequence="k")
    second = enqueue("qa.noop", queue="s5", sequence="k")
    run_one(store, "s5", BROKEN)
    assert retry_now([first.id]).changed == [first.id]
    assert statuses(first, second) == ["pending", "waiting"]
    assert head("s5", "k") == first.id
    assert [run_one(store, "s5"), run_one(store, "s5")] == [first.id, second.id]


def test_releasing_a_held_sequence_runs_the_next_and_a_later_retry_waits_its_turn(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s6", sequence="k")
    second = enqueue("qa.noop", queue="s6", sequence="k")
    third = enqueue("qa.noop", queue="s6", sequence="k")
    run_one(store, "s6", BROKEN)
    assert sequences.release("s6", "k") == first.id
    assert sequences.release("s6", "k") is None  # not held any more
    assert statuses(first, second, third) == ["dead", "pending", "waiting"]
    # The released job retried: it waits behind the head, and runs before the later third.
    retry_now([first.id])
    assert statuses(first, second, third) == ["waiting", "pending", "waiting"]
    assert [run_one(store, "s6") for _ in range(3)] == [second.id, first.id, third.id]


def test_cancel_of_the_head_or_of_a_waiting_job_keeps_the_order(stores):
    store = stores()
    jobs = [enqueue("qa.noop", queue="s7", sequence="k") for _ in range(4)]
    cancel([jobs[2].id])  # waiting: the head is unchanged
    assert statuses(*jobs) == ["pending", "waiting", "cancelled", "waiting"]
    cancel([jobs[0].id])  # the pending head: the next goes
    assert statuses(*jobs) == ["cancelled", "pending", "cancelled", "waiting"]
    assert [run_one(store, "s7"), run_one(store, "s7")] == [jobs[1].id, jobs[3].id]


def test_a_lease_swept_on_its_last_attempt_holds_and_a_released_job_stays_head(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s8", sequence="k", max_attempts=1)
    second = enqueue("qa.noop", queue="s8", sequence="k")
    (row,) = store.claim("s8", 1, WORKER, 300)
    store.release([(row.job_id, row.lease_version, row.attempt_id)])  # shutdown: given back
    assert statuses(first, second) == ["pending", "waiting"]
    (row,) = store.claim("s8", 1, WORKER, 300)
    sql("UPDATE queue_job_state SET locked_until = now() - interval '1 s' WHERE job_id = %s",
        [first.id])  # fmt: skip
    store.sweep()
    assert statuses(first, second) == ["dead", "waiting"]


def test_prune_keeps_a_held_head_and_prunes_it_once_released(stores):
    store = stores()
    first = enqueue("qa.noop", queue="s9", sequence="k")
    second = enqueue("qa.noop", queue="s9", sequence="k")
    run_one(store, "s9", BROKEN)
    sql("UPDATE queue_job_state SET finished_at = now() - interval '30 days' WHERE job_id = %s",
        [first.id])  # fmt: skip
    prune(dt.timedelta(days=1), statuses=["dead"])
    assert statuses(first, second) == ["dead", "waiting"]
    sequences.release("s9", "k")
    prune(dt.timedelta(days=1), statuses=["dead"])
    assert sql("SELECT count(*) FROM queue_jobs WHERE id = %s", [first.id]) == [(0,)]
    assert statuses(second) == ["pending"]


def test_a_rolled_back_enqueue_leaves_no_head():
    with transaction.atomic():
        enqueue("qa.noop", queue="s10", sequence="k")
        transaction.set_rollback(True)  # the view failed
    job = enqueue("qa.noop", queue="s10", sequence="k")
    assert statuses(job) == ["pending"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sequence": ""}, "sequence must be a non-empty string"),
        ({"sequence": 42}, "sequence must be a non-empty string"),
        ({"sequence": "k", "sequence_on_failure": "skip"}, "sequence_on_failure must be one"),
        ({"sequence_on_failure": "continue"}, "needs a sequence key"),
        ({"sequence": "k", "idempotency_key": "i"}, "takes no idempotency_key or unique"),
        ({"sequence": "k", "unique": Unique("u")}, "takes no idempotency_key or unique"),
    ],
)
def test_bad_sequence_options_are_refused_before_anything_is_written(options, message):
    with pytest.raises(EnqueueError, match=message):
        enqueue("qa.noop", queue="s11", **options)
    assert sql("SELECT count(*) FROM queue_jobs WHERE queue = 's11'") == [(0,)]
