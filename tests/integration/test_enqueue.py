"""enqueue() and enqueue_many() against the real database."""

from __future__ import annotations

import datetime as dt
import threading

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import django_pgqueue
from django_pgqueue import EnqueueError, JobSpec, PayloadError, enqueue, enqueue_many
from django_pgqueue.enqueue import EnqueuedJob
from django_pgqueue.models import Job, JobState
from django_pgqueue.store.worker import connection_params
from tests.conftest import sql

pytestmark = pytest.mark.django_db


def counts() -> tuple[int, int, int]:
    return tuple(
        sql(f"SELECT count(*) FROM {table}")[0][0]
        for table in ("queue_jobs", "queue_job_state", "queue_attempts")
    )


def test_enqueue_writes_job_and_state_in_one_statement():
    with CaptureQueriesContext(connection) as queries:
        job = enqueue("qa.noop", {"order": 7}, queue="payments", priority=5)
    assert len(queries) == 1
    stored = Job.objects.get(pk=job.id)
    state = JobState.objects.get(pk=job.id)
    assert (stored.queue, stored.type, stored.payload) == ("payments", "qa.noop", {"order": 7})
    assert (state.queue, state.status, state.priority, state.attempts) == (
        "payments",
        "pending",
        5,
        0,
    )
    assert state.lease_version == 0
    assert state.run_at <= timezone.now()


def test_max_attempts_comes_from_the_handler_then_the_settings():
    assert JobState.objects.get(pk=enqueue("qa.fail").id).max_attempts == 3  # @handler
    assert JobState.objects.get(pk=enqueue("qa.noop").id).max_attempts == 5  # PGQUEUE
    assert JobState.objects.get(pk=enqueue("qa.noop", max_attempts=9).id).max_attempts == 9


def test_delay_and_run_at_are_computed_by_the_database():
    delayed = enqueue("qa.noop", delay=60)
    at = timezone.now() + dt.timedelta(hours=2)
    scheduled = enqueue("qa.noop", run_at=at)
    (ahead,) = sql(
        "SELECT extract(epoch FROM run_at - now()) FROM queue_job_state WHERE job_id = %s",
        [delayed.id],
    )[0]
    assert 59 <= ahead <= 60
    assert JobState.objects.get(pk=scheduled.id).run_at == at


def test_rolled_back_transaction_leaves_no_job():
    before = counts()

    def view() -> None:
        with transaction.atomic():
            enqueue("qa.noop", {"n": 1})
            enqueue_many([("qa.noop", {"n": i}) for i in range(10)])
            raise RuntimeError("the view failed after enqueueing")

    with pytest.raises(RuntimeError):
        view()
    assert counts() == before


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"payload": {"s": {1}}}, PayloadError, "set"),
        ({"payload": {"s": "nul\x00"}}, PayloadError, "NUL"),
        ({"payload": "x" * 2_000_000}, PayloadError, "over the limit"),
        ({"queue": ""}, EnqueueError, "queue"),
        ({"queue": "x" * 64}, EnqueueError, "queue"),
        ({"queue": "a'; DROP TABLE queue_jobs; --"}, EnqueueError, "queue"),
        ({"priority": 1000}, EnqueueError, "priority"),
        ({"delay": -5}, EnqueueError, "delay"),
        ({"run_at": dt.datetime(2030, 1, 1)}, EnqueueError, "naive"),
        ({"max_attempts": 0}, EnqueueError, "max_attempts"),
        ({"idempotency_key": ""}, EnqueueError, "idempotency_key"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(kwargs, error, message):
    before = counts()
    payload = kwargs.pop("payload", {"ok": True})
    with transaction.atomic():
        with pytest.raises(error, match=message):
            enqueue("qa.noop", payload, **kwargs)
        # The caller's transaction is still usable.
        enqueue("qa.noop", {"after": "error"})
    assert counts() == (before[0] + 1, before[1] + 1, before[2])


def test_bad_type_name_is_refused():
    with pytest.raises(EnqueueError, match="not a valid job type"):
        enqueue("no spaces allowed", {})


def test_enqueue_many_refuses_the_whole_batch_on_one_bad_item():
    before = counts()
    items = [("qa.noop", {"n": i}) for i in range(5)] + [("qa.noop", {"bad": {1, 2}})]
    with pytest.raises(PayloadError, match=r"item 5: payload\['bad'\]"):
        enqueue_many(items)
    assert counts() == before


def test_enqueue_many_is_one_statement_in_order():
    specs = [JobSpec("qa.noop", {"n": i}, priority=i % 3) for i in range(2_000)]
    with CaptureQueriesContext(connection) as queries:
        jobs = enqueue_many(specs, queue="bulk")
    assert len(queries) == 1
    assert [job.id for job in jobs] == sorted(job.id for job in jobs)
    stored = dict(Job.objects.filter(queue="bulk").values_list("id", "payload"))
    assert [stored[job.id]["n"] for job in jobs] == list(range(2_000))
    assert JobState.objects.filter(queue="bulk", status="pending").count() == 2_000


def test_idempotency_key_returns_the_live_job():
    first = enqueue("qa.noop", {"v": 1}, queue="payments", idempotency_key="order-17")
    second = enqueue("qa.noop", {"v": 2}, queue="payments", idempotency_key="order-17")
    other_queue = enqueue("qa.noop", {"v": 3}, queue="email", idempotency_key="order-17")
    assert first.created
    assert not second.created
    assert other_queue.created
    assert second.id == first.id
    assert other_queue.id != first.id
    assert Job.objects.filter(idempotency_key="order-17").count() == 2
    # Once the job has finished, the key is free again.
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() WHERE job_id = %s",
        [first.id],
    )
    third = enqueue("qa.noop", {"v": 4}, queue="payments", idempotency_key="order-17")
    assert third.created
    assert third.id != first.id


def test_idempotency_key_in_enqueue_many():
    held = enqueue("qa.noop", queue="q", idempotency_key="k0")
    jobs = enqueue_many(
        [
            JobSpec("qa.noop", 1, idempotency_key="k0"),
            JobSpec("qa.noop", 2, idempotency_key="k1"),
            JobSpec("qa.noop", 3, idempotency_key="k1"),
            JobSpec("qa.noop", 4),
        ],
        queue="q",
    )
    assert [job.created for job in jobs] == [False, True, False, True]
    assert jobs[0].id == held.id
    assert jobs[1].id == jobs[2].id
    assert JobState.objects.filter(queue="q").count() == 3


@pytest.mark.parametrize(
    ("items", "position"),
    [
        ([(None, 1)], 0),
        ([JobSpec("qa.noop", 0), (None, 1)], 1),
        ([("qa.noop", 0), (5, 1), (None, 2)], 1),
        ([("qa.noop", 0), ("qa.noop", 1), (None, 2)], 2),
    ],
)
def test_enqueue_many_refuses_a_pair_without_a_type_wherever_it_stands(items, position):
    with pytest.raises(EnqueueError, match=f"enqueue_many item {position}: .*type"):
        enqueue_many(items, queue="typed")
    assert not Job.objects.filter(queue="typed").exists()


def test_enqueue_many_mixes_pairs_and_specs_in_order():
    """Pairs of one type, then a spec with a key, then pairs again (of that type and of
    another): each job keeps its own type, queue and place."""
    pairs = [("qa.noop", {"n": n}) for n in range(3)]
    jobs = enqueue_many(
        [
            *pairs,
            JobSpec("qa.noop", {"n": 3}, idempotency_key="mixed", queue="other"),
            *pairs,
            ("qa.flaky", {"n": 7}),
            ("qa.noop", {"n": 8}),
        ],
        queue="mixed",
    )
    assert [(job.type, job.queue) for job in jobs] == [
        *[("qa.noop", "mixed")] * 3,
        ("qa.noop", "other"),
        *[("qa.noop", "mixed")] * 3,
        ("qa.flaky", "mixed"),
        ("qa.noop", "mixed"),
    ]
    stored = dict(Job.objects.values_list("id", "payload"))
    assert [stored[job.id]["n"] for job in jobs] == [0, 1, 2, 3, 0, 1, 2, 7, 8]
    keyed = Job.objects.filter(idempotency_key__isnull=False).values_list("id", flat=True)
    assert list(keyed) == [jobs[3].id]


@pytest.mark.django_db(transaction=True)
def test_concurrent_enqueues_of_one_key_make_one_job():
    """Eight real connections race to enqueue the same key; one job results."""
    params = connection_params("default", "test")
    barrier = threading.Barrier(8)
    ids: list[int] = []
    lock = threading.Lock()

    from django_pgqueue.sql import QUERIES

    def racer(n: int) -> None:
        with psycopg.connect(**params, autocommit=False) as conn:
            barrier.wait()
            for _ in range(5):
                row = conn.execute(
                    QUERIES["job_enqueue"],
                    {
                        "queue": "race",
                        "type": "qa.noop",
                        "payload": f'{{"n": {n}}}',
                        "priority": 0,
                        "run_at": None,
                        "delay": 0.0,
                        "max_attempts": 3,
                        "idempotency_key": "one-and-only",
                        "traceparent": None,
                        "concurrency_key": None,
                        "fair_key": None,
                    },
                ).fetchone()
                if row[0] is not None:
                    break
            conn.commit()
            with lock:
                ids.append(row[0])

    threads = [threading.Thread(target=racer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert JobState.objects.filter(queue="race").count() == 1
    assert Job.objects.filter(queue="race").count() == 1


@pytest.mark.django_db(transaction=True)
def test_enqueue_notifies_on_commit_only():
    params = connection_params("default", "listener")
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN pgqueue")
        with transaction.atomic():
            enqueue("qa.noop", queue="wake-me")
            assert list(listener.notifies(timeout=0.2)) == []  # not before commit
        got = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
        assert got == ["wake-me"]
        enqueue("qa.noop", queue="later", delay=3600)  # not due: no wake-up
        assert list(listener.notifies(timeout=0.2)) == []


def test_public_api():
    for name in ("enqueue", "enqueue_many", "handler", "RetryLater", "PermanentFailure"):
        assert hasattr(django_pgqueue, name)


def test_concurrency_key_is_written_by_the_one_enqueue_statement():
    with CaptureQueriesContext(connection) as queries:
        job = enqueue("qa.noop", queue="keyed-one", concurrency_key="customer:1")
    assert len(queries) == 1
    assert sql("SELECT concurrency_key FROM queue_job_state WHERE job_id = %s", [job.id]) == [
        ("customer:1",)
    ]
    # The queue is marked keyed, so workers claim it through the controlled claim.
    assert sql("SELECT keyed FROM queue_controls WHERE queue = 'keyed-one'") == [(True,)]


def test_enqueue_many_takes_concurrency_keys_in_one_statement():
    specs = [JobSpec("qa.noop", {"n": i}, concurrency_key=f"c:{i % 2}") for i in range(4)]
    specs.append(JobSpec("qa.noop", {"n": 4}, queue="plain"))
    with CaptureQueriesContext(connection) as queries:
        jobs = enqueue_many(specs, queue="keyed-many")
    assert len(queries) == 1
    keys = dict(sql("SELECT job_id, concurrency_key FROM queue_job_state"))
    assert [keys[job.id] for job in jobs] == ["c:0", "c:1", "c:0", "c:1", None]
    assert sql("SELECT queue, keyed FROM queue_controls ORDER BY queue") == [("keyed-many", True)]


def test_enqueue_many_refuses_a_bad_concurrency_key_naming_the_item():
    before = counts()
    with pytest.raises(EnqueueError, match="item 1: concurrency_key"):
        enqueue_many([JobSpec("qa.noop"), JobSpec("qa.noop", concurrency_key="")])
    assert counts() == before


def test_enqueue_refuses_to_write_in_a_broken_transaction():
    from django.db.transaction import TransactionManagementError

    with transaction.atomic():
        transaction.set_rollback(True)  # as after a database error caught inside atomic()
        with pytest.raises(TransactionManagementError):
            enqueue("qa.noop")


def test_enqueue_raises_database_errors_as_djangos():
    from django.db import DatabaseError

    with transaction.atomic():
        sql("SET LOCAL transaction_read_only = on")
        with pytest.raises(DatabaseError, match="read-only transaction") as caught:
            enqueue("qa.noop")
        transaction.set_rollback(True)
    assert type(caught.value).__module__ == "django.db.utils"


def test_enqueue_from_an_event_loop_is_refused_as_django_refuses_it(monkeypatch):
    """The fast path keeps Django's async guard, even on a connection already open."""
    import asyncio

    from django.core.exceptions import SynchronousOnlyOperation
    from django.db import connections

    async def view() -> None:
        monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
        connections["default"].ensure_connection()  # this context's own connection
        monkeypatch.delenv("DJANGO_ALLOW_ASYNC_UNSAFE")
        try:
            enqueue("qa.noop")
        finally:
            monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "1")
            connections["default"].close()

    with pytest.raises(SynchronousOnlyOperation):
        asyncio.run(view())


def test_enqueue_many_results_equal_what_the_constructor_makes():
    """The results are built through EnqueuedJob's slots: every field set, as
    EnqueuedJob(...) sets them (a field added to the class and not there fails here)."""
    [job] = enqueue_many([("qa.noop", {"n": 1})], queue="built")
    made = EnqueuedJob(job.id, "built", "qa.noop", True, None, "default")
    assert job == made
    assert hash(job) == hash(made)
    assert repr(job) == repr(made)


def test_enqueue_on_a_connection_another_thread_made():
    """The fast path keeps Django's thread check (a connection is shared between threads
    only once allowed), and its kept cursor serves only the thread that made it."""
    from django.db import DatabaseError, connections

    db = connections["default"]
    enqueue("qa.noop")
    results: dict[bool, object] = {}

    def other_thread(shared: bool) -> None:
        connections["default"] = db  # as a live server's thread is given it
        try:
            results[shared] = enqueue("qa.noop")
        except DatabaseError as exc:
            results[shared] = exc

    def run(shared: bool) -> None:
        thread = threading.Thread(target=other_thread, args=(shared,))
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive()

    run(False)
    assert "can only be used in that same thread" in str(results[False])
    db.inc_thread_sharing()
    try:
        run(True)
    finally:
        db.dec_thread_sharing()
    assert isinstance(results[True], EnqueuedJob)
    cursor, thread = db.__dict__["_pgqueue_cursor"]
    assert thread != threading.get_ident()  # the other thread's own cursor
    assert enqueue("qa.noop").created
    assert db.__dict__["_pgqueue_cursor"][0] is not cursor
    assert Job.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_enqueue_after_the_connection_died_reconnects_when_health_checks_are_on(monkeypatch):
    """The fast path runs Django's health check (CONN_HEALTH_CHECKS) when it is due."""
    connection.close()
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    try:
        enqueue("qa.noop")
        pid = connection.connection.info.backend_pid
        with psycopg.connect(**connection_params("default", "test"), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        connection.health_check_done = False  # as at the start of a request
        assert enqueue("qa.noop").created
        assert connection.connection.info.backend_pid != pid
    finally:
        connection.close()
    assert Job.objects.count() == 2
