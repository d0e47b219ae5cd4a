"""Routing: which queue a job lands in when enqueue() is told none.

An explicit queue= wins; then PGQUEUE["ROUTES"] (an exact type, then globs in order);
then the queue its @handler declares; then DEFAULT_QUEUE. STRICT_TYPES refuses types
nobody knows, and jobs nobody will run are found by a system check and queue_stats.
"""

from __future__ import annotations

import io
import json
import time

import pytest
from django.core import checks
from django.core.management import call_command

import django_pgqueue
from django_pgqueue import ConfigurationError, EnqueueError, JobSpec, enqueue, enqueue_many
from django_pgqueue.checks import check_settings, check_unknown_types
from django_pgqueue.observability.workers import list_workers
from django_pgqueue.stats import stranded_jobs
from django_pgqueue.tasks.api import InvalidTask
from tests.conftest import sql

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

pytestmark = pytest.mark.django_db


@django_pgqueue.handler("routing.report", queue="reports")
def report(ctx):
    return None


@django_pgqueue.handler("routing.plain")
def plain(ctx):
    return None


@task()
def unrouted_task():
    return None


@task(queue_name="emails")
def emails_task():
    return None


def queues_of(*jobs) -> list[str]:
    """The queues the database holds for these jobs (not what enqueue() said)."""
    return [
        sql("SELECT queue FROM queue_job_state WHERE job_id = %s", [job.id])[0][0] for job in jobs
    ]


def test_a_handler_declares_the_default_queue_of_its_type():
    assert queues_of(enqueue("routing.report"), enqueue("routing.plain")) == ["reports", "default"]
    jobs = enqueue_many([("routing.report", 1), JobSpec("routing.report"), ("routing.plain", 2)])
    assert queues_of(*jobs) == ["reports", "reports", "default"]
    assert [job.queue for job in jobs] == ["reports", "reports", "default"]


def test_an_explicit_queue_always_wins(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": {"routing.*": "routed"}}
    assert queues_of(enqueue("routing.report", queue="urgent")) == ["urgent"]
    jobs = enqueue_many(
        [JobSpec("routing.report", queue="urgent"), ("routing.plain", 1)], queue="bulk"
    )
    assert queues_of(*jobs) == ["urgent", "bulk"]


def test_routes_send_types_by_exact_name_then_by_glob(settings):
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "ROUTES": {"billing.*": "payments", "billing.refund": "refunds", "*.mail": "emails"},
    }
    jobs = [
        enqueue("billing.charge"),
        enqueue("billing.refund"),
        enqueue("shop.mail"),
        enqueue("x"),
    ]
    assert queues_of(*jobs) == ["payments", "refunds", "emails", "default"]
    bulk = enqueue_many([("billing.charge", None), ("shop.mail", None), ("x", None)])
    assert queues_of(*bulk) == ["payments", "emails", "default"]


def test_a_route_overrides_the_queue_a_handler_declares(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": {"routing.report": "nightly"}}
    assert queues_of(enqueue("routing.report")) == ["nightly"]


def test_a_bad_route_table_is_a_system_check_error_naming_the_entry(settings):
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": {"billing.*": "no spaces"}}
    (error,) = check_settings()
    assert error.id == "pgqueue.E002"
    assert "PGQUEUE['ROUTES']['billing.*']" in error.msg
    assert "'no spaces'" in error.msg
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": {"billing[": "payments"}}
    assert "'billing['" in check_settings()[0].msg
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": ["billing.*"]}
    assert "must be a dict" in check_settings()[0].msg


def test_a_handler_with_a_bad_queue_is_refused_at_import():
    with pytest.raises(ConfigurationError, match=r"@handler\('routing.bad'\): queue"):
        django_pgqueue.handler("routing.bad", queue="not a queue")


def test_strict_types_refuse_unknown_types_naming_them(settings):
    before = sql("SELECT count(*) FROM queue_jobs")[0][0]
    enqueue("routing.typo")  # not strict: written
    settings.PGQUEUE = {**settings.PGQUEUE, "STRICT_TYPES": True}
    with pytest.raises(EnqueueError, match=r"'routing\.typo'.*STRICT_TYPES"):
        enqueue("routing.typo")
    with pytest.raises(EnqueueError, match=r"item 1: .*'routing\.typo'"):
        enqueue_many([("routing.plain", 1), ("routing.typo", 2)])
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == before + 1
    # Known types are accepted: a handler's, and a Task's (through the Tasks resolver).
    enqueue("routing.plain")
    unrouted_task.enqueue()
    assert sql("SELECT count(*) FROM queue_jobs")[0][0] == before + 3


def test_tasks_follow_routes_unless_they_name_their_own_queue(settings):
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "ROUTES": {"tests.integration.test_routing.*": "payments"},
    }
    routed, own = unrouted_task.enqueue(), emails_task.enqueue()
    assert [
        sql("SELECT queue FROM queue_jobs WHERE id = %s", [int(r.id)])[0][0] for r in (routed, own)
    ] == [
        "payments",
        "emails",
    ]
    settings.PGQUEUE = {**settings.PGQUEUE, "ROUTES": {"tests.integration.*": "elsewhere"}}
    with pytest.raises(
        InvalidTask, match=r"'elsewhere', which is not in TASKS\['default'\]\['QUEUES'\]"
    ):
        unrouted_task.enqueue()


def test_pending_jobs_of_unknown_types_are_a_database_check_warning():
    assert check_unknown_types(databases=["default"]) == []
    enqueue("routing.plain")
    enqueue("routing.nobody", queue="reports")
    enqueue("routing.nobody", queue="reports")
    assert check_unknown_types() == []  # no database access unless asked for
    (warning,) = check_unknown_types(databases=["default"])
    assert warning.id == "pgqueue.W002"
    assert "2 pending job(s) in queue 'reports'" in warning.msg
    assert "'routing.nobody'" in warning.msg
    ids = [m.id for m in checks.run_checks(databases=["default"]) if m.id.startswith("pgqueue")]
    assert "pgqueue.W002" in ids


def test_queue_stats_names_jobs_no_handler_knows_or_no_worker_serves():
    enqueue("routing.nobody", queue="reports")
    enqueue("routing.plain", queue="default")
    out = io.StringIO()
    call_command("queue_stats", stdout=out)
    text = out.getvalue()
    assert (
        "stranded: 1 pending routing.nobody job(s) in queue reports: no handler or task in "
        "this project knows its type and no live worker serves its queue"
    ) in text
    assert "stranded: 1 pending routing.plain job(s) in queue default: no live worker" in text
    out = io.StringIO()
    call_command("queue_stats", "--json", stdout=out)
    stranded = json.loads(out.getvalue())["stranded"]
    assert {(s["type"], s["unknown_type"], s["unserved_queue"]) for s in stranded} == {
        ("routing.nobody", True, True),
        ("routing.plain", False, True),
    }


def test_stranded_jobs_read_a_bounded_sample_of_each_queue():
    enqueue_many([("routing.nobody", n) for n in range(3)], queue="reports")
    enqueue("routing.nobody", queue="other")
    found = {(s.queue, s.jobs, s.at_least) for s in stranded_jobs(sample=2)}
    assert found == {("reports", 2, True), ("other", 1, False)}
    found = {(s.queue, s.jobs, s.at_least) for s in stranded_jobs(sample=10)}
    assert found == {("reports", 3, False), ("other", 1, False)}


@pytest.mark.django_db(transaction=True)
def test_queue_stats_counts_a_live_workers_queue_as_served(run_worker):
    enqueue("routing.plain", queue="default", delay=3600)  # pending, not due: it stays
    enqueue("routing.plain", queue="reports", delay=3600)
    worker = run_worker(["default"], concurrency=1)
    deadline = time.monotonic() + 60  # a hang guard: the first heartbeat registers it
    while not any(w.alive and "default" in w.queues for w in list_workers("default")):
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.05)
    out = io.StringIO()
    call_command("queue_stats", stdout=out)
    worker.stop()
    lines = [line for line in out.getvalue().splitlines() if line.startswith("stranded:")]
    assert lines == [
        "stranded: 1 pending routing.plain job(s) in queue reports: no live worker serves its queue"
    ]
