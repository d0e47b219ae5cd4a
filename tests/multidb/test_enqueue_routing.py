"""enqueue() and enqueue_many() with PGQUEUE["QUEUE_DATABASES"]: which server, which transaction.

Two real servers: the suite's own (`default`) and the throwaway one of conftest.py
(`queues2`). Every test commits for real (transaction=True), as the rules under test
are about which server's transaction holds a job.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import DatabaseError, connections, transaction

from django_pgqueue import EnqueueError, JobSpec, enqueue, enqueue_many
from tests.multidb.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


def test_queues_go_to_their_alias_by_name_and_by_glob() -> None:
    enqueue("qa.noop", queue="q2-exact")
    enqueue("qa.noop", queue="q2.mail")
    enqueue("qa.noop", queue="plain")
    enqueue("qa.noop", queue="q2-other")  # neither the exact name nor the glob
    assert jobs("queues2") == [("q2-exact", "qa.noop"), ("q2.mail", "qa.noop")]
    assert jobs("default") == [("plain", "qa.noop"), ("q2-other", "qa.noop")]


def test_an_explicit_using_wins() -> None:
    enqueue("qa.noop", queue="q2.mail", using="default")
    assert jobs("default") == [("q2.mail", "qa.noop")]
    assert jobs("queues2") == []


def test_enqueue_is_transactional_on_the_queues_own_alias() -> None:
    with transaction.atomic(using="queues2"):
        enqueue("qa.noop", queue="q2.mail")
        assert jobs("queues2") == [("q2.mail", "qa.noop")]  # visible inside
        transaction.set_rollback(True, using="queues2")
    assert jobs("queues2") == []
    assert jobs("default") == []
    with transaction.atomic(using="queues2"):
        job = enqueue("qa.noop", queue="q2.mail")
    assert job is not None
    assert jobs("queues2") == [("q2.mail", "qa.noop")]


def test_enqueue_in_another_alias_transaction_only_is_refused() -> None:
    with transaction.atomic(using="default"):
        with pytest.raises(EnqueueError) as refused:
            enqueue("qa.noop", queue="q2.mail")
        enqueue("qa.noop", queue="plain")  # the default's own queues still join it
    message = str(refused.value)
    for name in ("'q2.mail'", "'queues2'", "'default'", "on_commit=True"):
        assert name in message
    assert jobs("queues2") == []
    assert jobs("default") == [("plain", "qa.noop")]


def test_both_transactions_open_is_transactional_on_the_queues_alias() -> None:
    with transaction.atomic(using="default"):
        with transaction.atomic(using="queues2"):
            enqueue("qa.noop", queue="q2.mail")
        assert jobs("queues2") == [("q2.mail", "qa.noop")]  # queues2's commit wrote it
        transaction.set_rollback(True, using="default")
    assert jobs("queues2") == [("q2.mail", "qa.noop")]
    assert jobs("default") == []


def test_on_commit_enqueues_only_once_the_callers_transaction_commits() -> None:
    with transaction.atomic(using="default"):
        assert enqueue("qa.noop", queue="q2.mail", on_commit=True) is None
        assert jobs("queues2") == []
    assert jobs("queues2") == [("q2.mail", "qa.noop")]
    with transaction.atomic(using="default"):
        enqueue("qa.noop", queue="q2-exact", on_commit=True)
        transaction.set_rollback(True, using="default")
    assert jobs("queues2") == [("q2.mail", "qa.noop")]  # the rolled-back one never came


def test_on_commit_validates_at_the_call() -> None:
    with transaction.atomic(using="default"), pytest.raises(EnqueueError):
        enqueue("qa.noop", queue="q2.mail", priority=1000, on_commit=True)


def test_on_commit_outside_a_foreign_transaction_writes_now() -> None:
    job = enqueue("qa.noop", queue="q2.mail", on_commit=True)
    assert job is not None
    assert job.queue == "q2.mail"
    assert jobs("queues2") == [("q2.mail", "qa.noop")]


def test_enqueue_many_splits_by_alias_and_keeps_the_order() -> None:
    items = [
        JobSpec("qa.echo", 1, queue="plain"),
        JobSpec("qa.echo", 2, queue="q2.mail"),
        JobSpec("qa.echo", 3, queue="plain"),
        JobSpec("qa.echo", 4, queue="q2-exact", idempotency_key="k4"),
    ]
    results = enqueue_many(items)
    assert results is not None
    assert [job.queue for job in results] == ["plain", "q2.mail", "plain", "q2-exact"]
    with connections["queues2"].cursor() as cursor:
        cursor.execute("SELECT id, payload::text FROM queue_jobs ORDER BY id")
        assert cursor.fetchall() == [(results[1].id, "2"), (results[3].id, "4")]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT id, payload::text FROM queue_jobs ORDER BY id")
        assert cursor.fetchall() == [(results[0].id, "1"), (results[2].id, "3")]


def test_enqueue_many_on_one_other_alias_follows_enqueues_rules() -> None:
    items = [("qa.noop", None)] * 3
    with transaction.atomic(using="default"), pytest.raises(EnqueueError, match="'queues2'"):
        enqueue_many(items, queue="q2.mail")
    with transaction.atomic(using="default"):
        assert enqueue_many(items, queue="q2.mail", on_commit=True) is None
        assert jobs("queues2") == []
    assert len(jobs("queues2")) == 3


def test_enqueue_many_across_aliases_inside_a_transaction_is_refused() -> None:
    items = [JobSpec("qa.noop", queue="plain"), JobSpec("qa.noop", queue="q2.mail")]
    for alias in ("default", "queues2"):
        with transaction.atomic(using=alias), pytest.raises(EnqueueError) as refused:
            enqueue_many(items)
        assert "several databases ('default', 'queues2')" in str(refused.value)
    assert jobs("default") == []
    assert jobs("queues2") == []
    with transaction.atomic(using="default"):
        assert enqueue_many(items, on_commit=True) is None
        assert jobs("default") == []
    assert jobs("default") == [("plain", "qa.noop")]
    assert jobs("queues2") == [("q2.mail", "qa.noop")]


def test_without_queue_databases_enqueue_ignores_other_transactions(settings: Any) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": {}}
    with transaction.atomic(using="queues2"):
        job = enqueue("qa.noop", queue="q2.mail")  # one database: as before, no refusal
        assert enqueue_many([("qa.noop", None)], queue="q2.mail") is not None
        transaction.set_rollback(True, using="queues2")
    assert job.queue == "q2.mail"
    assert jobs("default") == [("q2.mail", "qa.noop")] * 2
    assert jobs("queues2") == []


def test_enqueue_many_across_aliases_is_all_or_nothing_per_alias() -> None:
    # A trigger on queues2 refuses one payload after validation passed: queues2's share
    # is rolled back whole; default's share, written first in its own transaction, stays.
    with connections["queues2"].cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.payload = '\"boom\"'::jsonb THEN RAISE EXCEPTION 'boom refused'; END IF; "
            "RETURN NEW; END $$; "
            "CREATE TRIGGER refuse_boom BEFORE INSERT ON queue_jobs "
            "FOR EACH ROW EXECUTE FUNCTION refuse_boom()"
        )
    items = [
        JobSpec("qa.echo", "fine", queue="plain"),
        JobSpec("qa.echo", "fine", queue="q2.mail"),
        JobSpec("qa.echo", "boom", queue="q2.mail"),
    ]
    try:
        with pytest.raises(DatabaseError, match="boom refused"):
            enqueue_many(items)
    finally:
        with connections["queues2"].cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_boom ON queue_jobs; DROP FUNCTION refuse_boom()")
    assert jobs("default") == [("plain", "qa.echo")]
    assert jobs("queues2") == []
