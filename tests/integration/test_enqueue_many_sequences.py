"""enqueue_many() with sequence keys: the jobs of a sequence in one call run in list
order, behind the sequence's earlier jobs, and concurrent calls naming the same
sequences in other orders (real connections) neither deadlock nor interleave a call's
jobs out of order."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgqueue import EnqueueError, JobSpec, enqueue, enqueue_many
from tests.conftest import sql
from tests.integration.test_sequences import BROKEN, head, statuses
from tests.integration.test_unique_races import wave

pytestmark = pytest.mark.django_db(transaction=True)


def spec(n: int, sequence: str | None = None, **options: Any) -> JobSpec:
    return JobSpec("qa.noop", {"n": n}, sequence=sequence, **options)


def test_a_sequence_s_jobs_of_one_call_run_in_list_order(stores):
    store = stores()
    jobs = enqueue_many(
        [
            spec(0, "a"),
            spec(1),
            spec(2, "b", sequence_on_failure="continue"),
            spec(3, "a"),
            ("qa.noop", {"n": 4}),
            spec(5, "b", sequence_on_failure="continue"),
            spec(6, "a"),
        ],
        queue="sm1",
    )
    a = [jobs[0], jobs[3], jobs[6]]
    b = [jobs[2], jobs[5]]
    assert [job.type for job in jobs] == ["qa.noop"] * 7
    assert all(job.created for job in jobs)
    assert [job.id for job in a] == sorted(job.id for job in a)
    assert statuses(*a) == ["pending", "waiting", "waiting"]
    assert statuses(*b) == ["pending", "waiting"]
    assert statuses(jobs[1], jobs[4]) == ["pending", "pending"]
    assert (head("sm1", "a"), head("sm1", "b")) == (a[0].id, b[0].id)
    assert sql(
        "SELECT DISTINCT sequence_on_failure FROM queue_job_state WHERE job_id = ANY(%s)",
        [[job.id for job in b]],
    ) == [("continue",)]
    # b's first fails for good and lets the next go; a runs in list order.
    ran = []
    while claimed := store.claim("sm1", 1, "sm:1:a", 300):
        (row,) = claimed
        ran.append(row.job_id)
        assert len(ran) <= 7, ran
        if row.job_id == b[0].id:
            assert store.fail(row.job_id, row.lease_version, row.attempt_id, BROKEN)
        else:
            assert store.complete([(row.job_id, row.lease_version, row.attempt_id, "1")])
    assert sorted(ran) == sorted(job.id for job in jobs)
    assert [job_id for job_id in ran if job_id in {job.id for job in a}] == [j.id for j in a]
    assert statuses(*b) == ["dead", "completed"]


def test_a_call_s_jobs_wait_behind_the_sequence_s_earlier_jobs():
    first = enqueue("qa.noop", queue="sm2", sequence="k")
    jobs = enqueue_many([spec(n, "k") for n in range(3)], queue="sm2")
    assert statuses(first, *jobs) == ["pending", "waiting", "waiting", "waiting"]
    assert head("sm2", "k") == first.id


def test_calls_larger_than_a_statement_keep_the_order(monkeypatch):
    monkeypatch.setattr("django_pgqueue.store.enqueue.BULK_CHUNK", 3)
    jobs = enqueue_many([spec(n, f"k{n % 2}") for n in range(10)], queue="sm3")
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    rows = dict(
        sql(
            "SELECT job.id, job.payload->>'n' FROM queue_jobs AS job WHERE job.queue = 'sm3'",
        )
    )
    assert [int(rows[job.id]) for job in jobs] == list(range(10))
    assert statuses(*jobs) == ["pending", "pending"] + ["waiting"] * 8


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (spec(0, "k", idempotency_key="i"), "item 1: A sequenced job takes no idempotency_key"),
        (spec(0, "k", sequence_on_failure="skip"), "item 1: sequence_on_failure must be one"),
        (spec(0, None, sequence_on_failure="continue"), "item 1: sequence_on_failure needs"),
        (spec(0, ""), "item 1: sequence must be a non-empty string"),
    ],
)
def test_bad_sequence_options_refuse_the_whole_call_naming_the_item(item, message):
    with pytest.raises(EnqueueError, match=message):
        enqueue_many([spec(0, "k"), item], queue="sm4")
    assert sql("SELECT count(*) FROM queue_jobs") == [(0,)]


def test_concurrent_calls_naming_sequences_in_other_orders_neither_deadlock_nor_mix():
    def call(n: int) -> Any:
        keys = ["x", "y", "z"] if n % 4 < 2 else ["z", "y", "x"]
        return enqueue_many([spec(n * 100 + i, key) for i in range(4) for key in keys], queue="sm5")

    # 16 calls at once, each in its own transaction; the odd ones roll back.
    calls = len(wave(16, call).committed)
    assert calls == 8
    for key in ("x", "y", "z"):
        rows = sql(
            "SELECT state.job_id, state.status, (job.payload->>'n')::int FROM queue_job_state "
            "AS state JOIN queue_jobs AS job ON job.id = state.job_id "
            "WHERE state.queue = 'sm5' AND state.sequence_key = %s ORDER BY state.job_id",
            [key],
        )
        assert [status for _, status, _ in rows] == ["pending"] + ["waiting"] * (4 * calls - 1)
        # One call's jobs of a sequence are in its list order, never mixed with another's
        # (its sequences' rows were its own until it committed).
        ns = [n for _, _, n in rows]
        assert [n // 100 for n in ns] == [n // 100 for n in ns[::4] for _ in range(4)]
        assert all(ns[i] < ns[i + 1] for i in range(len(ns)) if i % 4 != 3)
