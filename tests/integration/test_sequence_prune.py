"""The prune drops the rows of sequences with nothing left, and an enqueue of the same
sequence racing it (real connections, each in its own transaction) is never lost: the
enqueue's row lock keeps the row, a row deleted first is written again."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections, transaction

from django_pgqueue import EnqueuedJob, enqueue
from django_pgqueue.actions import cancel, retry_now
from django_pgqueue.maintenance import PruneResult, prune
from django_pgqueue.outcomes import Dead
from tests.conftest import sql
from tests.integration.test_sequences import head, run_one, statuses
from tests.integration.test_unique_races import HANG_GUARD

pytestmark = pytest.mark.django_db(transaction=True)

BROKEN = Dead("ValueError", "the customer's ledger is locked", "")


def keys(queue: str) -> list[str]:
    return [
        key
        for (key,) in sql(
            "SELECT sequence_key FROM queue_sequences WHERE queue = %s ORDER BY sequence_key",
            [queue],
        )
    ]


def prune_now() -> PruneResult:
    """A prune that deletes no job (none finished a day ago): only the sequences' rows."""
    return prune(dt.timedelta(days=1))


def wait_until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_prune_drops_only_the_rows_of_sequences_with_nothing_left(stores):
    store = stores()
    done = enqueue("qa.noop", queue="sp1", sequence="done")
    assert run_one(store, "sp1") == done.id
    cancelled = enqueue("qa.noop", queue="sp1", sequence="cancelled")
    cancel([cancelled.id])
    held = enqueue("qa.noop", queue="sp1", sequence="held")
    assert run_one(store, "sp1", BROKEN) == held.id  # dead: holds the rest back
    running = enqueue("qa.noop", queue="sp1", sequence="running")
    (row,) = store.claim("sp1", 10, "sp:1:a", 300)
    assert row.job_id == running.id
    behind = enqueue("qa.noop", queue="sp1", sequence="running")  # waits behind it
    pending = enqueue("qa.noop", queue="sp1", sequence="pending")
    assert statuses(running, behind, pending) == ["running", "waiting", "pending"]
    assert keys("sp1") == ["cancelled", "done", "held", "pending", "running"]

    assert prune_now().sequences == 2
    assert keys("sp1") == ["held", "pending", "running"]
    assert prune_now().sequences == 0
    # The sequence goes on as before: its enqueue writes the row again.
    again = enqueue("qa.noop", queue="sp1", sequence="done")
    assert statuses(again) == ["pending"]
    assert head("sp1", "done") == again.id


def test_a_retried_job_of_a_pruned_sequence_runs(stores):
    job = enqueue("qa.noop", queue="sp2", sequence="k")
    cancel([job.id])
    assert prune_now().sequences == 1
    assert keys("sp2") == []
    # Retried, it finds no row: the row is written again and the job heads it.
    assert retry_now([job.id]).changed == [job.id]
    assert statuses(job) == ["pending"]
    assert head("sp2", "k") == job.id
    assert run_one(stores(), "sp2") == job.id


def in_thread(target: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run `target` on a thread of its own (its own connection); [result or error]."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target())
        except BaseException as exc:  # surfaced by the test
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_a_prune_passes_the_row_of_an_enqueue_not_committed_yet():
    idle = enqueue("qa.noop", queue="sp3", sequence="k")
    cancel([idle.id])  # the sequence is idle: its row is prunable
    enqueued, commit = threading.Event(), threading.Event()

    def enqueue_and_wait() -> EnqueuedJob:
        with transaction.atomic():
            job = enqueue("qa.noop", queue="sp3", sequence="k")
            enqueued.set()
            assert commit.wait(HANG_GUARD)
        return job

    thread, out = in_thread(enqueue_and_wait)
    assert enqueued.wait(HANG_GUARD)
    # The enqueue holds the row (its head set): the prune passes it, without waiting.
    assert prune_now().sequences == 0
    commit.set()
    thread.join(HANG_GUARD)
    (job,) = out
    assert isinstance(job, EnqueuedJob), job
    assert statuses(job) == ["pending"]
    assert head("sp3", "k") == job.id


def test_an_enqueue_that_meets_a_row_deleted_by_a_prune_writes_it_again():
    idle = enqueue("qa.noop", queue="sp4", sequence="k")
    cancel([idle.id])
    pruned, commit = threading.Event(), threading.Event()

    def prune_and_wait() -> int:
        with transaction.atomic():
            deleted = prune_now().sequences
            pruned.set()
            assert commit.wait(HANG_GUARD)
        return deleted

    pruner, pruned_out = in_thread(prune_and_wait)
    assert pruned.wait(HANG_GUARD)
    enqueuer, enqueued_out = in_thread(lambda: enqueue("qa.noop", queue="sp4", sequence="k"))
    # The enqueue waits on the row the prune deleted (not committed yet).
    wait_until(
        lambda: (
            sql(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )[0][0]
            == 1
        )
    )
    commit.set()
    pruner.join(HANG_GUARD)
    enqueuer.join(HANG_GUARD)
    assert pruned_out == [1]
    (job,) = enqueued_out
    assert isinstance(job, EnqueuedJob), job
    assert statuses(job) == ["pending"]
    assert head("sp4", "k") == job.id
    assert keys("sp4") == ["k"]


def test_the_prune_command_says_how_many_sequences_went():
    job = enqueue("qa.noop", queue="sp5", sequence="k")
    cancel([job.id])
    out = StringIO()
    call_command("prune_queue_jobs", "--older-than", "7d", stdout=out)
    assert "Deleted 1 sequence with no job left (rows)." in out.getvalue(), out.getvalue()
    assert keys("sp5") == []
