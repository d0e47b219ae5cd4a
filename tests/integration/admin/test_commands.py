"""queue_stats, prune_queue_jobs and requeue_dead against the real tables."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_pgqueue import maintenance
from django_pgqueue.durations import parse_duration
from django_pgqueue.store import operator as store
from tests.conftest import sql
from tests.factories import job_exists as exists
from tests.factories import make_job, state
from tests.factories import run_command as run

pytestmark = pytest.mark.django_db


# -- queue_stats -------------------------------------------------------------------------


def test_queue_stats_json_matches_the_database():
    for status, queue, n in [
        ("pending", "mail", 3),
        ("running", "mail", 2),
        ("dead", "mail", 1),
        ("completed", "mail", 4),
        ("cancelled", "billing", 2),
        ("dead", "billing", 2),
        ("completed", "billing", 1),
    ]:
        for _ in range(n):
            make_job(status, queue=queue)
    make_job("pending", queue="mail", attempts=1)  # a retry waiting: pending, due
    sql(
        "UPDATE queue_job_state SET run_at = now() + interval '1 hour' WHERE job_id = %s",
        [make_job("pending", queue="billing")],
    )  # scheduled for later: pending, not due
    expired = make_job("running", queue="billing")
    sql(
        "UPDATE queue_job_state SET locked_until = now() - interval '1 second' WHERE job_id = %s",
        [expired],
    )
    sql(
        "UPDATE queue_job_state SET run_at = now() - interval '90 seconds' WHERE job_id = %s",
        [make_job("pending", queue="mail")],
    )  # the oldest due job of mail has waited 90 s

    data = json.loads(run("queue_stats", "--json", "--exact"))

    truth = {
        (queue, status): count
        for queue, status, count in sql(
            "SELECT queue, status, count(*) FROM queue_job_state GROUP BY 1, 2"
        )
    }
    figures = {row["queue"]: row for row in data["queues"]}
    assert set(figures) == {"mail", "billing"}
    for queue, row in figures.items():
        for status in ("pending", "running", "dead", "cancelled", "completed"):
            assert row[status] == truth.get((queue, status), 0), (queue, status)
    assert figures["mail"]["due"] == 5
    assert figures["billing"]["due"] == 0
    assert figures["billing"]["expired_leases"] == 1
    assert figures["mail"]["expired_leases"] == 0
    assert 90 <= figures["mail"]["oldest_due_seconds"] < 120
    assert figures["billing"]["oldest_due_seconds"] is None
    assert data["totals"]["completed"] == 5
    assert data["jobs"] == sum(truth.values()) == sql("SELECT count(*) FROM queue_jobs")[0][0]
    assert data["completed_exact"] is True


def test_queue_stats_table_lists_every_queue_and_the_totals():
    make_job("pending", queue="mail")
    make_job("dead", queue="billing")
    out = run("queue_stats")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["queue", "pending", "due"]
    assert any(line.startswith("billing ") for line in lines)
    assert any(line.startswith("mail ") for line in lines)
    assert any(line.startswith("all queues") for line in lines)
    assert "--exact counts them" in out


# -- prune_queue_jobs --------------------------------------------------------------------


@pytest.fixture
def aged_jobs() -> dict[str, int]:
    """One job per interesting case; old means finished (or created) ten days ago."""
    jobs = {
        "old_completed": make_job("completed", finished_ago="10 days"),
        "old_dead": make_job("dead", finished_ago="10 days"),
        "old_cancelled": make_job("cancelled", finished_ago="10 days"),
        "new_completed": make_job("completed", finished_ago="1 hour"),
        "new_dead": make_job("dead", finished_ago="6 days 23 hours"),
        "pending": make_job("pending", attempts=1),
        "running": make_job("running"),
    }
    # Unfinished jobs enqueued long ago are still never prunable.
    sql(
        "UPDATE queue_jobs SET created_at = now() - interval '30 days' WHERE id IN (%s, %s)",
        [jobs["pending"], jobs["running"]],
    )
    return jobs


def test_prune_deletes_only_finished_jobs_older_than_the_cutoff(aged_jobs):
    out = run("prune_queue_jobs", "--older-than", "7d")
    assert out.startswith("Deleted 3 jobs that finished before ")
    assert "(completed: 1, dead: 1, cancelled: 1) in 1 batch of at most 1000." in out
    gone = {"old_completed", "old_dead", "old_cancelled"}
    for name, job_id in aged_jobs.items():
        assert exists(job_id) == (name not in gone), name
    # State rows and attempts went with their jobs (ON DELETE CASCADE).
    deleted = [aged_jobs[name] for name in gone]
    assert sql("SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s)", [deleted]) == [(0,)]
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s)", [deleted]) == [(0,)]
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = %s", [aged_jobs["new_dead"]])[0][
        0
    ]


def test_prune_respects_status(aged_jobs):
    run("prune_queue_jobs", "--older-than", "7d", "--status", "completed")
    assert not exists(aged_jobs["old_completed"])
    assert exists(aged_jobs["old_dead"])
    assert exists(aged_jobs["old_cancelled"])
    run("prune_queue_jobs", "--older-than", "7d", "--status", "dead,cancelled")
    assert not exists(aged_jobs["old_dead"])
    assert not exists(aged_jobs["old_cancelled"])
    assert all(exists(aged_jobs[name]) for name in ("new_completed", "new_dead", "pending"))


def test_prune_dry_run_counts_and_deletes_nothing(aged_jobs):
    out = run("prune_queue_jobs", "--older-than", "7d", "--dry-run")
    assert "would delete 3 jobs" in out
    assert "(completed: 1, dead: 1, cancelled: 1). Nothing was deleted." in out
    assert all(exists(job_id) for job_id in aged_jobs.values())


def test_prune_says_how_many_events_it_deletes_with_the_completed_jobs():
    sql(
        "INSERT INTO queue_events (key, emitted_at) VALUES ('old', now() - interval '8 days'), "
        "('new', now())"
    )
    out = run("prune_queue_jobs", "--older-than", "7d", "--dry-run")
    assert "and 1 event emitted before it. Nothing was deleted." in out
    assert "Deleted 1 event emitted before" in run("prune_queue_jobs", "--older-than", "7d")
    assert sql("SELECT key FROM queue_events") == [("new",)]


def test_prune_deletes_in_bounded_batches():
    old = [make_job("completed", finished_ago="8 days") for _ in range(7)]
    keep = make_job("completed", finished_ago="1 day")
    with CaptureQueriesContext(connection) as queries:
        result = maintenance.prune(parse_duration("7d"), batch_size=3)
    deletes = [q["sql"] for q in queries.captured_queries if "name: job_prune_batch" in q["sql"]]
    assert result.batches == [3, 3, 1]  # no DELETE removed more than the batch size
    assert len(deletes) == 3
    assert all("LIMIT 3" in statement for statement in deletes)
    assert result.jobs == {"completed": 7}
    assert not any(exists(job_id) for job_id in old)
    assert exists(keep)


def test_the_prune_statement_itself_never_deletes_unfinished_jobs():
    pending = make_job("pending")
    running = make_job("running")
    cutoff = store.clock_ago("default", -3600)  # an hour in the future: everything is older
    assert store.prune_batch("default", cutoff, ["pending", "running"], 100) == ({}, 0, False)
    assert exists(pending)
    assert exists(running)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "7x"], "--older-than: '7x' is not a duration"),
        (["--older-than", "7d", "--status", "running"], "--status: 'running' is not a finished"),
        (
            ["--older-than", "7d", "--batch-size", "0"],
            "--batch-size must be an integer >= 1, got 0",
        ),
    ],
)
def test_prune_rejects_bad_arguments_by_name(args, message):
    with pytest.raises(CommandError, match=message):
        run("prune_queue_jobs", *args)


def test_prune_requires_an_age():
    with pytest.raises(CommandError, match="--older-than"):
        run("prune_queue_jobs")


# -- requeue_dead ------------------------------------------------------------------------


@pytest.fixture
def dead_jobs() -> dict[str, int]:
    return {
        "mail_fail_new": make_job("dead", queue="mail", type="qa.fail", finished_ago="10 minutes"),
        "mail_noop_old": make_job("dead", queue="mail", type="qa.noop", finished_ago="3 days"),
        "billing_fail_new": make_job(
            "dead", queue="billing", type="qa.fail", finished_ago="30 minutes"
        ),
        "billing_fail_old": make_job(
            "dead", queue="billing", type="qa.fail", finished_ago="2 days"
        ),
        "completed": make_job("completed", queue="mail", type="qa.fail"),
        "cancelled": make_job("cancelled", queue="mail", type="qa.fail"),
    }


def requeued(jobs: dict[str, int]) -> set[str]:
    return {name for name, job_id in jobs.items() if state(job_id)["status"] == "pending"}


def test_requeue_dead_by_queue(dead_jobs):
    out = run("requeue_dead", "--queue", "mail")
    assert requeued(dead_jobs) == {"mail_fail_new", "mail_noop_old"}
    assert out.strip() == "2 dead jobs matched. Requeue dead: 2 changed, 0 skipped."
    job = state(dead_jobs["mail_noop_old"])
    assert job["attempts"] == 0
    assert job["due"]
    assert job["finished_at"] is None


def test_requeue_dead_by_type_and_since(dead_jobs):
    run("requeue_dead", "--type", "qa.fail", "--since", "1h")
    assert requeued(dead_jobs) == {"mail_fail_new", "billing_fail_new"}


def test_requeue_dead_by_all_filters_and_an_iso_date(dead_jobs):
    since = sql("SELECT (now() - interval '2 days 1 hour')::date")[0][0].isoformat()
    run("requeue_dead", "--queue", "billing", "--type", "qa.fail", "--since", since)
    assert requeued(dead_jobs) == {"billing_fail_new", "billing_fail_old"}


def test_requeue_dead_dry_run_changes_nothing(dead_jobs):
    out = run("requeue_dead", "--dry-run")
    assert out.strip() == "Dry run: 4 dead jobs match; nothing was changed."
    assert requeued(dead_jobs) == set()


def test_requeue_dead_pages_through_many_jobs_and_reports_skips():
    jobs = [make_job("dead", queue="bulk") for _ in range(5)]
    held = make_job("dead", queue="bulk", key="charge-1")
    make_job("pending", queue="bulk", key="charge-1")  # the live holder of that key
    out = run("requeue_dead", "--queue", "bulk", "--batch-size", "2")
    assert all(state(job_id)["status"] == "pending" for job_id in jobs)
    assert state(held)["status"] == "dead"
    assert out.strip() == (
        "6 dead jobs matched. Requeue dead: 5 changed, 1 skipped: "
        "1 idempotency key held by another live job."
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "no spaces"], "--queue: 'no spaces' is not a valid queue name"),
        (["--type", "9lives"], "--type: '9lives' is not a valid job type"),
        (["--since", "yesterday"], "--since: 'yesterday' is neither a duration"),
        (["--batch-size", "0"], "--batch-size must be an integer >= 1, got 0"),
    ],
)
def test_requeue_dead_rejects_bad_arguments_by_name(args, message):
    with pytest.raises(CommandError, match=message):
        run("requeue_dead", *args)
