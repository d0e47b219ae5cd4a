"""Retry now and cancel, through the fenced statements: what changes, what is skipped, why."""

from __future__ import annotations

import pytest

from django_pgqueue import actions
from tests.conftest import sql
from tests.factories import make_job, state

pytestmark = pytest.mark.django_db


def test_retry_changes_dead_cancelled_and_pending_and_skips_running_and_completed():
    dead = make_job("dead")
    cancelled = make_job("cancelled")
    pending = make_job("pending", attempts=2)
    running = make_job("running")
    completed = make_job("completed")
    before = {job: state(job) for job in (dead, cancelled, pending, running, completed)}

    report = actions.retry_now([dead, cancelled, pending, running, completed])

    assert report.changed == sorted([dead, cancelled, pending])
    assert report.skipped == {actions.RUNNING: [running], actions.NOT_ALLOWED: [completed]}
    assert report.message() == (
        "Retry now: 3 changed, 2 skipped: 1 running, 1 not in an allowed state (1 completed)."
    )
    for job in (dead, cancelled, pending):
        after = state(job)
        assert after["status"] == "pending"
        assert after["attempts"] == 0  # a fresh attempt budget
        assert after["max_attempts"] == before[job]["max_attempts"]
        assert after["due"] is True
        assert after["finished_at"] is None
        assert after["lease_version"] == before[job]["lease_version"] + 1  # old tokens die
    # The history stays: the dead job's three failed attempts are all still there.
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = %s", [dead])[0][0] == 3
    # The running and the completed job are exactly as they were.
    assert state(running) == before[running]
    assert state(completed) == before[completed]


def test_cancel_cancels_pending_jobs_and_marks_running_ones_without_ending_them():
    pending = make_job("pending")
    running = make_job("running")
    dead = make_job("dead")
    completed = make_job("completed")
    cancelled = make_job("cancelled")
    before = {job: state(job) for job in (running, dead, completed, cancelled)}

    report = actions.cancel([pending, running, dead, completed, cancelled])

    assert report.changed == sorted([pending, running])
    assert report.requested == [running]
    assert state(pending)["status"] == "cancelled"
    assert state(pending)["finished_at"] is not None
    assert sorted(report.skipped[actions.NOT_ALLOWED]) == sorted([dead, completed, cancelled])
    assert report.message() == (
        "Cancel: 2 changed (1 running: cancellation requested), 3 skipped: "
        "3 not in an allowed state (1 cancelled, 1 completed, 1 dead)."
    )
    # The running job keeps its status, owner and lease: only the mark is new.
    assert state(running) == before[running]
    assert sql(
        "SELECT cancel_requested_at IS NOT NULL FROM queue_job_state WHERE job_id = %s", [running]
    ) == [(True,)]
    for job in (dead, completed, cancelled):
        assert state(job) == before[job]
    # Asked again, it is skipped as running (already asked).
    again = actions.cancel([running])
    assert again.changed == []
    assert again.skipped[actions.RUNNING] == [running]


def test_retry_skips_a_job_whose_idempotency_key_another_live_job_holds():
    old = make_job("dead", key="order-7")
    live = make_job("pending", key="order-7")  # enqueued again after the first one died

    report = actions.retry_now([old])

    assert report.changed == []
    assert report.skipped == {actions.KEY_HELD: [old]}
    assert "1 idempotency key held by another live job" in report.message()
    assert state(old)["status"] == "dead"
    assert state(live)["status"] == "pending"


def test_retry_of_two_dead_jobs_sharing_a_key_revives_only_the_newest():
    # job_retry_now alone would make both live in one statement, which the live-key
    # unique index refuses (an IntegrityError); the action keeps the newest.
    first = make_job("dead", key="invoice-1")
    second = make_job("dead", key="invoice-1")

    report = actions.retry_now([first, second])

    assert report.changed == [second]
    assert report.skipped == {actions.KEY_SHARED: [first]}
    assert state(first)["status"] == "dead"
    assert state(second)["status"] == "pending"


def test_jobs_that_no_longer_exist_are_reported_not_ignored():
    dead = make_job("dead")
    report = actions.retry_now([dead, 987654321])
    assert report.changed == [dead]
    assert report.skipped == {actions.MISSING: [987654321]}


def test_an_empty_selection_changes_nothing():
    assert actions.retry_now([]).message() == "Retry now: 0 changed, 0 skipped."
    assert actions.cancel([]).message() == "Cancel: 0 changed, 0 skipped."
