"""Unique keys, one enqueue at a time: each hold, each policy, and the old keys beside."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from django_pgqueue import EnqueueError, Unique, UniqueConflict, enqueue
from django_pgqueue.models import Job, JobState
from tests.conftest import sql

pytestmark = pytest.mark.django_db


def set_status(job_id: int, status: str) -> None:
    sql(
        "UPDATE queue_job_state SET status = %s, finished_at = now() WHERE job_id = %s",
        [status, job_id],
    )


def test_a_unique_enqueue_is_one_statement():
    with CaptureQueriesContext(connection) as queries:
        first = enqueue("qa.noop", queue="u1", unique=Unique("k"))
        again = enqueue("qa.noop", queue="u1", unique=Unique("k"))
    assert len(queries) == 2
    assert (first.created, again.created, again.id) == (True, False, first.id)
    state = JobState.objects.get(pk=first.id)
    assert (state.unique_key, state.unique_hold) == ("k", "active")


def test_until_completed_a_dead_job_keeps_its_key_and_a_cancelled_one_frees_it():
    unique = Unique("k", hold="until_completed")
    first = enqueue("qa.noop", queue="u2", unique=unique)
    set_status(first.id, "dead")
    assert enqueue("qa.noop", queue="u2", unique=unique).id == first.id
    set_status(first.id, "cancelled")
    second = enqueue("qa.noop", queue="u2", unique=unique)
    assert second.created
    assert second.id != first.id


def test_keys_are_per_queue_and_apart_from_idempotency_keys():
    a = enqueue("qa.noop", queue="u3a", unique=Unique("k"))
    b = enqueue("qa.noop", queue="u3b", unique=Unique("k"))
    c = enqueue("qa.noop", queue="u3a", idempotency_key="k")
    assert len({a.id, b.id, c.id}) == 3
    assert enqueue("qa.noop", queue="u3a", idempotency_key="k").id == c.id


def test_a_refusal_writes_nothing_and_leaves_the_transaction_usable():
    held = enqueue("qa.noop", queue="u4", unique=Unique("k", on_conflict="refuse"))
    with transaction.atomic():
        with pytest.raises(UniqueConflict, match=f"held by job #{held.id}") as refused:
            enqueue("qa.noop", queue="u4", unique=Unique("k", on_conflict="refuse"))
        assert refused.value.job_id == held.id
        other = enqueue("qa.noop", queue="u4")  # the transaction goes on
    assert Job.objects.filter(queue="u4").count() == 2
    assert other.created


def test_replace_sets_the_payload_and_due_time_of_the_pending_job():
    first = enqueue("qa.noop", {"v": 1}, queue="u5", delay=10, unique=Unique.debounce("k"))
    again = enqueue("qa.noop", {"v": 2}, queue="u5", delay=3600, unique=Unique.debounce("k"))
    assert (again.id, again.created, again.replaced) == (first.id, False, True)
    assert Job.objects.get(pk=first.id).payload == {"v": 2}
    (due_in,) = sql(
        "SELECT extract(epoch FROM run_at - now()) FROM queue_job_state WHERE job_id = %s",
        [first.id],
    )[0]
    assert due_in > 3000


@pytest.mark.django_db(transaction=True)
def test_a_period_holds_the_key_whatever_the_job_became_then_frees_it():
    unique = Unique("k", hold=0.5)
    first = enqueue("qa.noop", queue="u6", unique=unique)
    set_status(first.id, "completed")
    # Until the period ends, the holder comes back; then a new job is written.
    deadline = time.monotonic() + 60  # a hang guard, not a bound
    while (later := enqueue("qa.noop", queue="u6", unique=unique)).id == first.id:
        assert time.monotonic() < deadline, "the period never ended"
        time.sleep(0.05)
    assert later.created
    assert Job.objects.filter(queue="u6").count() == 2


def test_unique_and_idempotency_key_together_are_refused():
    with pytest.raises(EnqueueError, match="idempotency_key or unique"):
        enqueue("qa.noop", idempotency_key="a", unique=Unique("b"))
    with pytest.raises(EnqueueError, match="unique must be a Unique"):
        enqueue("qa.noop", unique="b")


@pytest.mark.django_db(transaction=True)
def test_a_swept_job_goes_back_to_pending_beside_the_newer_holder_of_its_key(stores):
    """A "pending" hold ends at the first claim: the job that lost its lease goes back to
    pending, and the job enqueued while it ran keeps the key."""
    unique = Unique("k", hold="pending")
    first = enqueue("qa.noop", queue="u7", unique=unique)
    store = stores("unique-sweeper")
    (claimed,) = store.claim("u7", 1, "w", 60.0)
    second = enqueue("qa.noop", queue="u7", unique=unique)
    assert second.created
    sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 s' WHERE job_id = %s",
        [first.id],
    )
    assert [row[0] for row in store.sweep()] == [claimed.job_id]
    statuses = dict(sql("SELECT job_id, status FROM queue_job_state WHERE queue = 'u7'"))
    assert statuses == {first.id: "pending", second.id: "pending"}
    # The newer one holds the key still.
    assert enqueue("qa.noop", queue="u7", unique=unique).id == second.id


@pytest.mark.django_db(transaction=True)
def test_an_operator_retry_skips_a_job_whose_key_another_job_holds():
    from django_pgqueue.actions import retry_now

    unique = Unique("k")  # held while active
    first = enqueue("qa.noop", queue="u8", unique=unique)
    sql(
        "UPDATE queue_job_state SET status = 'dead', finished_at = now() WHERE job_id = %s",
        [first.id],
    )
    second = enqueue("qa.noop", queue="u8", unique=unique)
    assert second.created
    assert retry_now([first.id]).changed == []
    assert JobState.objects.get(pk=first.id).status == "dead"  # stays dead, keyless
    set_status(second.id, "completed")
    assert retry_now([first.id]).changed == [first.id]
    assert enqueue("qa.noop", queue="u8", unique=unique).id == first.id


@pytest.mark.parametrize("lease_version", [0, 1])
def test_an_operator_retry_of_a_pending_hold_goes_on_beside_the_newer_holder(lease_version):
    """A "pending" hold ends at the first claim, and a retry is one (its lease version
    grows): the retried job never holds its key again, so it runs beside the holder."""
    from django_pgqueue.actions import retry_now

    unique = Unique("k", hold="pending")
    first = enqueue("qa.noop", queue="u9", unique=unique)
    sql(
        "UPDATE queue_job_state SET status = 'dead', finished_at = now(), lease_version = %s "
        "WHERE job_id = %s",
        [lease_version, first.id],
    )
    second = enqueue("qa.noop", queue="u9", unique=unique)
    assert second.created
    assert retry_now([first.id]).changed == [first.id]
    states = JobState.objects.filter(pk__in=[first.id, second.id]).order_by("pk")
    assert [(s.status, s.lease_version) for s in states] == [
        ("pending", lease_version + 1),
        ("pending", 0),
    ]
    assert enqueue("qa.noop", queue="u9", unique=unique).id == second.id


@pytest.mark.django_db(transaction=True)
def test_a_job_parked_for_an_event_holds_its_active_key_until_it_wakes(run_worker):
    from django_pgqueue import emit_event
    from tests.integration.test_worker import wait_until

    unique = Unique("k")  # held while active: parked in waiting too
    first = enqueue("qa.durable_event", {"key": "u9:paid"}, queue="u9", unique=unique)
    run_worker(["u9"], poll_interval=0.05, sweep_interval=0.2)
    wait_until(lambda: JobState.objects.get(pk=first.id).status == "waiting")
    again = enqueue("qa.durable_event", {"key": "u9:paid"}, queue="u9", unique=unique)
    assert (again.id, again.created) == (first.id, False)
    # Waking the parked job puts it back in pending: the key is still its own.
    with transaction.atomic():
        assert emit_event("u9:paid", {"ok": True}) is True
    wait_until(lambda: JobState.objects.get(pk=first.id).status == "completed")
    assert Job.objects.filter(queue="u9").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_debounce_replaces_only_a_holder_never_claimed(stores):
    """A holder claimed once and back in pending (a lost lease here) keeps its payload:
    with a hold that still covers it, the debounce returns it; a "pending" hold ended at
    the claim, so the debounce writes a new job."""
    store = stores("unique-debounce")
    active = enqueue("qa.noop", {"v": 1}, queue="u10", unique=Unique("a"))
    debounced = enqueue("qa.noop", {"v": 1}, queue="u10", unique=Unique.debounce("p"))
    claimed = store.claim("u10", 2, "w", 60.0)
    assert sorted(job.job_id for job in claimed) == sorted([active.id, debounced.id])
    sql("UPDATE queue_job_state SET locked_until = now() - interval '1 s' WHERE queue = 'u10'")
    assert len(store.sweep()) == 2  # both back in pending, lease_version 1
    again = enqueue("qa.noop", {"v": 2}, queue="u10", unique=Unique.debounce("a"))
    assert (again.id, again.created, again.replaced) == (active.id, False, False)
    assert Job.objects.get(pk=active.id).payload == {"v": 1}
    fresh = enqueue("qa.noop", {"v": 2}, queue="u10", unique=Unique.debounce("p"))
    assert fresh.created
    assert fresh.id not in (active.id, debounced.id)
    assert Job.objects.get(pk=debounced.id).payload == {"v": 1}


def test_a_debounce_of_another_type_is_refused_and_writes_nothing():
    held = enqueue("qa.noop", {"v": 1}, queue="u11", delay=60, unique=Unique.debounce("k"))
    with transaction.atomic():
        with pytest.raises(EnqueueError, match=r"type 'qa\.noop'.*type 'qa\.durable_event'"):
            enqueue("qa.durable_event", {"v": 2}, queue="u11", unique=Unique.debounce("k"))
        other = enqueue("qa.noop", queue="u11")  # the transaction goes on
    assert other.created
    assert Job.objects.get(pk=held.id).payload == {"v": 1}
    assert Job.objects.filter(queue="u11").count() == 2
