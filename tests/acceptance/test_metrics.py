"""Prometheus metrics: scraped from a real worker process while it drains, and the view."""

from __future__ import annotations

import datetime as dt
import signal
import socket
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue import enqueue, enqueue_many
from tests.conftest import sql

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: {(name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def attempts_in_table() -> dict[str, int]:
    """Attempts by outcome as the worker's counters name them, from queue_attempts."""
    rows = sql(
        "SELECT a.status, s.status, count(*) FROM queue_attempts AS a "
        "JOIN queue_job_state AS s ON s.job_id = a.job_id "
        "WHERE a.status IN ('succeeded', 'failed') GROUP BY 1, 2"
    )
    counts = {"succeeded": 0, "retried": 0, "dead": 0}
    for attempt_status, job_status, n in rows:
        if attempt_status == "succeeded":
            counts["succeeded"] += n
        elif job_status == "dead":
            counts["dead"] += n  # each dead job's last attempt ...
        else:
            counts["retried"] += n
    # ... and its earlier failed attempts were retries.
    earlier = sql(
        "SELECT count(*) FROM queue_attempts AS a JOIN queue_job_state AS s "
        "ON s.job_id = a.job_id WHERE s.status = 'dead' AND a.status = 'failed' "
        "AND a.attempt_index < s.attempts"
    )[0][0]
    counts["dead"] -= earlier
    counts["retried"] += earlier
    return counts


def test_scrape_a_draining_worker_and_match_the_tables(worker_process: Any) -> None:
    total = 400
    enqueue_many([("qa.nap", {"seconds": 0.01}) for _ in range(total)], queue="drain")
    dead = enqueue("qa.permanent", queue="drain")
    flaky = enqueue("qa.flaky", {"failures": 1}, queue="drain")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = worker_process(
        "drain",
        "--concurrency",
        "2",
        "--batch-size",
        "5",
        "--metrics-port",
        str(port),
        "--poll-interval",
        "0.1",
    )
    seen_mid_drain = False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            samples = scrape(url)
        except OSError:
            time.sleep(0.05)  # not listening yet
            continue
        pending = value(samples, "pgqueue_jobs", queue="drain", status="pending")
        succeeded = value(
            samples, "pgqueue_attempts_total", queue="drain", type="qa.nap", outcome="succeeded"
        )
        after = attempts_in_table()
        left = sql("SELECT count(*) FROM queue_job_state WHERE status = 'pending'")[0][0]
        # Read after the scrape: the queue only shrinks (but for the flaky job's one
        # retry, which puts it back), and the worker counts a job once its completion
        # is written.
        assert left <= pending + 1
        assert pending <= total + 2
        assert succeeded <= after["succeeded"]
        if succeeded > 0 and pending > 0:
            seen_mid_drain = True
        done = sql("SELECT count(*) FROM queue_job_state WHERE status IN ('completed', 'dead')")
        if done[0][0] == total + 2:
            break
        time.sleep(0.05)
    assert seen_mid_drain, "no scrape landed while the queue was draining"

    time.sleep(0.3)
    samples = scrape(url)
    table = attempts_in_table()
    assert table == {"succeeded": total + 1, "retried": 1, "dead": 1}

    def counted(outcome: str, type_: str) -> float:
        return value(samples, "pgqueue_attempts_total", queue="drain", type=type_, outcome=outcome)

    assert counted("succeeded", "qa.nap") + counted("succeeded", "qa.flaky") == total + 1
    assert counted("retried", "qa.flaky") == table["retried"]
    assert counted("dead", "qa.permanent") == table["dead"]
    assert (
        value(samples, "pgqueue_attempt_duration_seconds_count", queue="drain", type="qa.nap")
        == total
    )
    assert value(samples, "pgqueue_jobs", queue="drain", status="pending") == 0
    assert value(samples, "pgqueue_jobs", queue="drain", status="dead") == 1
    assert value(samples, "pgqueue_jobs", queue="drain", status="running") == 0
    assert value(samples, "pgqueue_workers", state="alive") == 1
    assert value(samples, "pgqueue_database_up") == 1
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [dead.id]) == [("dead",)]
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [flaky.id]) == [
        ("completed",)
    ]
    proc.signal(signal.SIGTERM)
    code, output = proc.wait(30)
    assert code == 0, output


@pytest.mark.urls("tests.integration.metrics_urls")
def test_the_metrics_view_reports_the_queue_figures(admin_client: Any) -> None:
    enqueue_many([("qa.noop", n) for n in range(3)], queue="web")
    enqueue("qa.noop", queue="web", delay=3600)
    sql(
        "UPDATE queue_job_state SET run_at = now() - interval '90 seconds' "
        "WHERE job_id = (SELECT min(job_id) FROM queue_job_state)"
    )
    response = admin_client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }
    assert value(samples, "pgqueue_jobs", queue="web", status="pending") == 4
    assert value(samples, "pgqueue_jobs_due", queue="web") == 3
    assert 90 <= value(samples, "pgqueue_oldest_due_age_seconds", queue="web") < 150


@pytest.mark.urls("tests.integration.metrics_urls")
def test_the_metrics_view_reports_late_schedules(admin_client: Any) -> None:
    from django_pgqueue.models import Schedule

    def samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = admin_client.get("/metrics").content.decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    every = {"type": "qa.noop", "timezone": "UTC", "every": dt.timedelta(minutes=1)}
    Schedule.objects.create(name="on-time", queue="nightly", next_tick=None, **every)
    Schedule.objects.create(name="stuck", queue="nightly", next_tick=None, **every)
    assert value(samples(), "pgqueue_late_schedules") == 0
    # Nobody fired "stuck"'s tick due 10 minutes ago; "on-time" is due in an hour.
    sql("UPDATE queue_schedules SET next_tick = now() + interval '1 hour' WHERE name = 'on-time'")
    sql("UPDATE queue_schedules SET next_tick = now() - interval '10 minutes' WHERE name = 'stuck'")
    found = samples()
    assert value(found, "pgqueue_late_schedules") == 1
    late = value(found, "pgqueue_schedule_late_seconds", schedule="stuck", queue="nightly")
    assert 600 <= late < 700
    assert not [key for key in found if key[0] == "pgqueue_schedule_late_seconds" and
                ("schedule", "on-time") in key[1]]  # fmt: skip


def test_a_bad_metrics_port_is_refused_before_the_worker_starts() -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(
        CommandError, match=r"--metrics-port must be an integer from 0 to 65535, got 70000"
    ):
        call_command("run_queue_worker", "q", "--metrics-port", "70000")


def test_scrape_shows_an_event_loop_a_handler_blocked(worker_process: Any) -> None:
    blocker = enqueue("qa.aoutcome", {"do": "block", "seconds": 1.0}, queue="loop")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = worker_process("loop", "--metrics-port", str(port), "--poll-interval", "0.1")
    deadline = time.monotonic() + 60
    samples: Any = None
    while time.monotonic() < deadline:
        try:
            samples = scrape(url)
        except OSError:
            time.sleep(0.05)  # not listening yet
            continue
        done = sql("SELECT status FROM queue_job_state WHERE job_id = %s", [blocker.id])[0][0]
        # The scrape came before the status read: the gauge of the job in flight may
        # lag its completion by one scrape.
        if (
            done == "completed"
            and value(samples, "pgqueue_event_loop_blocked_total") >= 1
            and value(samples, "pgqueue_async_in_flight") == 0
        ):
            break
        time.sleep(0.1)
    assert samples is not None
    assert value(samples, "pgqueue_event_loop_blocked_total") == 1
    assert value(samples, "pgqueue_event_loop_lag_max_seconds") >= 0.25
    assert value(samples, "pgqueue_async_cancel_ignored_total") == 0
    assert value(samples, "pgqueue_async_in_flight") == 0
    proc.signal(signal.SIGTERM)
    code, output = proc.wait(60)
    assert code == 0, output
    assert "the event loop is blocked" in output
    assert f"job {blocker.id} (qa.aoutcome)" in output
