"""Events emitted to the second database (`queues2`): an emit is part of the caller's
transaction on that database, and never commits at once under a transaction on another
database only (the rule of enqueue: `enqueue_scope.commit_to_wait_for`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections, transaction

from django_pgqueue import EnqueueError, emit_event

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


def events(alias: str) -> list[tuple[str, Any]]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT key, payload::text FROM queue_events ORDER BY key")
        return list(cursor.fetchall())


class RolledBack(Exception):
    pass


def rolled_back(alias: str, emit: Any) -> Any:
    """What `emit()` returned inside a transaction on `alias` that then rolled back."""
    returned = None
    try:
        with transaction.atomic(using=alias):
            returned = emit()
            raise RolledBack
    except RolledBack:
        return returned


def test_an_emit_joins_the_callers_transaction_on_its_database() -> None:
    assert rolled_back("queues2", lambda: emit_event("paid:1", {"n": 1}, using="queues2"))
    assert events("queues2") == []
    with transaction.atomic(using="queues2"):
        emit_event("paid:1", {"n": 2}, using="queues2")
    assert events("queues2") == [("paid:1", '{"n": 2}')]


def test_an_emit_under_a_transaction_on_another_database_only_is_refused() -> None:
    # It would commit at once on queues2, whatever the caller's transaction does.
    refused = r"database 'queues2'.*transaction on 'default'"
    with transaction.atomic(), pytest.raises(EnqueueError, match=refused):
        emit_event("paid:2", {"n": 1}, using="queues2")
    assert events("queues2") == []
    assert events("default") == []


def test_an_emit_on_commit_waits_for_the_callers_commit() -> None:
    deferred = rolled_back(
        "default", lambda: emit_event("paid:3", {"n": 1}, using="queues2", on_commit=True)
    )
    assert deferred is None
    assert events("queues2") == []
    with transaction.atomic():
        emit_event("paid:3", {"n": 2}, using="queues2", on_commit=True)
        assert events("queues2") == []
    assert events("queues2") == [("paid:3", '{"n": 2}')]


def test_an_emit_outside_any_transaction_commits_at_once() -> None:
    assert emit_event("paid:4", using="queues2") is True
    assert events("queues2") == [("paid:4", "null")]
