"""The admin's rough edges, through Django's test client on a real database.

What a job's page says about its attempts (return values, numbering across operator
retries, no stale "last error" once completed), the filters' choices, the Queues
page's other known queues and their Pause button, the Workers page on a gone worker,
the Schedules pages, the Charts page's default window, and the paused-queue metric.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from django_pgqueue import actions, enqueue, pause_queue, resume_queue
from django_pgqueue.models import Schedule, ScheduleTick
from tests.conftest import sql
from tests.factories import VIEWER_PERMISSIONS, make_job, make_user, state

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgqueue_job_changelist")
QUEUES = reverse("admin:django_pgqueue_queuecontrol_changelist")
SET_PAUSED = "/admin/django_pgqueue/queuecontrol/set-paused/"
WORKERS = reverse("admin:django_pgqueue_workerrecord_changelist")
CHARTS = reverse("admin:django_pgqueue_minutestats_changelist")


def job_page(job_id: int) -> str:
    return reverse("admin:django_pgqueue_job_change", args=[job_id])


def text_of(html: str) -> str:
    """The page's text, tags dropped and spaces collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def field(html: str, name: str) -> str:
    """The text of a read-only field's box on a change page (`field-<name>`)."""
    found = re.search(rf'class="form-row[^"]*field-{name}[^"]*">(.*?)</div>\s*</div>', html, re.S)
    assert found, f"no field {name} on the page"
    return text_of(found.group(1)).strip()


# -- a job's page ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_jobs_page_shows_what_each_attempt_returned(
    run_worker: Any, operator_client: Any
) -> None:
    job = enqueue("qa.outcome", {"do": "return"}, queue="edges")
    run_worker(["edges"], burst=True).join()
    assert state(job.id)["status"] == "completed"
    html = operator_client.get(job_page(job.id)).content.decode()
    assert 'class="pgqueue-result"' in html
    assert f"&quot;ok&quot;: {job.id}" in html
    assert "returned {" in text_of(html)


@pytest.mark.django_db(transaction=True)
def test_a_completed_job_shows_no_last_error_but_its_attempts_keep_it(
    run_worker: Any, operator_client: Any
) -> None:
    job = enqueue("qa.flaky", {"failures": 1}, queue="edges")
    worker = run_worker(["edges"], poll_interval=0.05)
    deadline = dt.datetime.now() + dt.timedelta(seconds=60)
    while state(job.id)["status"] != "completed":
        assert dt.datetime.now() < deadline, "the flaky job never completed"
        # Due at once: the retry's backoff is not what this test waits for.
        sql("UPDATE queue_job_state SET run_at = now() WHERE job_id = %s AND status = 'pending'",
            [job.id])  # fmt: skip
        time.sleep(0.05)
    worker.stop()
    # The state row still holds the first attempt's error.
    assert "flaky dependency down" in state(job.id)["last_error"]
    html = operator_client.get(job_page(job.id)).content.decode()
    assert field(html, "last_error_full").endswith("—")
    assert "flaky dependency down" not in field(html, "last_error_full")
    # The history is in the attempt rows below.
    assert "flaky dependency down (attempt 1)" in html
    listing = text_of(operator_client.get(JOBS).content.decode())
    assert "flaky dependency down" not in listing


def test_a_failed_job_still_shows_its_last_error(operator_client: Any) -> None:
    job_id = make_job("pending", attempts=1, error="ValueError: boom again")
    html = operator_client.get(job_page(job_id)).content.decode()
    assert "boom again" in field(html, "last_error_full")


@pytest.mark.django_db(transaction=True)
def test_attempts_are_numbered_across_an_operator_retry(
    run_worker: Any, operator_client: Any
) -> None:
    job = enqueue("qa.permanent", {}, queue="edges", max_attempts=3)
    run_worker(["edges"], burst=True).join()
    assert state(job.id)["status"] == "dead"
    actions.retry_now([job.id])
    run_worker(["edges"], burst=True).join()
    assert state(job.id)["status"] == "dead"
    assert sql("SELECT attempt_index FROM queue_attempts WHERE job_id = %s ORDER BY lease_version",
               [job.id]) == [(1,), (1,)]  # fmt: skip
    html = operator_client.get(job_page(job.id)).content.decode()
    # One wording: "attempt N" across the whole history, each counted as 1 of 3.
    numbers = re.findall(r'<td class="field-number">(.*?)</td>', html, re.S)
    assert numbers == ["attempt 1", "attempt 2"]
    budgets = re.findall(r'<td class="field-budget">(.*?)</td>', html, re.S)
    assert budgets == ["1 of 3", "1 of 3"]
    assert "of the job" not in html
    assert "1/3 counted against max attempts · 2 recorded in all" in text_of(html)


# -- the jobs list's filters -------------------------------------------------------------


def filter_choices(html: str, parameter: str) -> set[str]:
    return set(re.findall(rf'href="\?{parameter}=([^"&]+)"', html))


def test_the_type_filter_offers_task_types_and_the_queue_filter_completed_only_queues(
    operator_client: Any,
) -> None:
    make_job("completed", queue="archive", type="qa.tasks.add")  # a @task job's type
    make_job("pending", queue="ops")
    html = operator_client.get(JOBS).content.decode()
    assert "qa.tasks.add" in filter_choices(html, "type")
    assert "qa.noop" in filter_choices(html, "type")
    assert {"archive", "ops"} <= filter_choices(html, "queue")


def test_the_known_names_walk_the_type_index_not_the_jobs(operator_client: Any) -> None:
    """At any size the type walk is index probes: no Seq Scan of queue_jobs."""
    sql(
        "INSERT INTO queue_jobs (queue, type, payload) SELECT 'bulk', 'qa.bulk_' || (n % 7), "
        "'{}' FROM generate_series(1, 20000) AS n"
    )
    sql("ANALYZE queue_jobs")
    from django_pgqueue.sql import QUERIES

    plan = "\n".join(
        row[0] for row in sql("EXPLAIN " + QUERIES["names_known"].replace("%(limit)s", "500"))
    )
    assert "Seq Scan on queue_jobs" not in plan
    assert "queue_jobs_type_idx" in plan
    from django_pgqueue.store import operator

    types, queues = operator.known_names("default", 500)
    assert types == [f"qa.bulk_{n}" for n in range(7)]
    assert "bulk" in queues


# -- the Queues page ---------------------------------------------------------------------


def test_the_queues_page_lists_every_known_queue_with_a_pause_button(
    operator_client: Any,
) -> None:
    pause_queue("emails")
    make_job("completed", queue="archive")
    Schedule.objects.create(
        name="nightly", type="qa.noop", queue="reports", every=dt.timedelta(hours=1), timezone="UTC"
    )
    sql(
        "INSERT INTO queue_workers (id, host, pid, queues, concurrency, lease_seconds, version) "
        "VALUES ('w-1', 'h', 1, '[\"payments\"]', 4, 30, '1')"
    )
    html = operator_client.get(QUEUES).content.decode()
    others = html[html.index('id="pgqueue-other-queues"') :]
    for queue in ("archive", "reports", "payments"):
        assert f'data-queue="{queue}"' in others
    assert 'data-queue="emails"' not in others  # it has its row in the list above
    assert others.count(">Pause</button>") == 3

    response = operator_client.post(SET_PAUSED, {"queue": "payments", "paused": "1"}, follow=True)
    assert "Paused 1 queue(s): payments" in text_of(response.content.decode())
    assert sql("SELECT paused FROM queue_controls WHERE queue = 'payments'") == [(True,)]
    html = operator_client.get(QUEUES).content.decode()
    assert 'data-queue="payments"' not in html[html.index('id="pgqueue-other-queues"') :]
    operator_client.post(SET_PAUSED, {"queue": "payments", "paused": "0"})
    assert sql("SELECT paused FROM queue_controls WHERE queue = 'payments'") == [(False,)]


def test_pausing_by_name_needs_the_permission_a_post_and_a_valid_name(
    operator_client: Any,
) -> None:
    client = Client()  # operator_client is the test's `client`, logged in as the operator
    client.force_login(make_user("viewer", *VIEWER_PERMISSIONS))
    assert client.post(SET_PAUSED, {"queue": "payments", "paused": "1"}).status_code == 403
    assert "Pause</button>" not in client.get(QUEUES).content.decode()
    assert operator_client.get(SET_PAUSED).status_code == 405
    bad = operator_client.post(SET_PAUSED, {"queue": "bad queue!", "paused": "1"})
    assert bad.status_code == 400
    assert operator_client.post(SET_PAUSED, {"queue": "ok", "paused": "yes"}).status_code == 400
    assert sql("SELECT queue FROM queue_controls") == []


# -- the Workers page --------------------------------------------------------------------


def test_a_gone_worker_claims_no_running_slots(operator_client: Any) -> None:
    sql(
        "INSERT INTO queue_workers (id, host, pid, queues, concurrency, lease_seconds, version, "
        "running, last_seen_at) VALUES ('killed-1', 'h', 7, '[\"ops\"]', 4, 30, '1', 2, "
        "now() - interval '5 minutes')"
    )
    held = make_job("running")
    sql("UPDATE queue_job_state SET locked_by = 'killed-1' WHERE job_id = %s", [held])
    text = text_of(operator_client.get(WORKERS).content.decode())
    assert "0 workers alive (0 processes), 1 gone." in text
    assert "killed-1" not in text  # folded away until asked for
    text = text_of(operator_client.get(WORKERS, {"gone": "1"}).content.decode())
    assert "killed-1" in text
    assert "2 / 4" not in text
    assert "— (gone)" not in text
    assert "(leased to it until the sweep)" in text


# -- the Schedules pages -----------------------------------------------------------------


def test_a_schedules_page_says_when_it_runs_and_how_its_runs_ended(client: Any) -> None:
    client.force_login(make_user("planner", "view_schedule", "change_schedule", "view_job"))
    schedule = Schedule.objects.create(
        name="sales.daily_report", type="qa.noop", queue="reports",
        every=dt.timedelta(minutes=1), timezone="UTC", source="code",
    )  # fmt: skip
    done, dead = make_job("completed", queue="reports"), make_job("dead", queue="reports")
    for minutes, job_id in ((1, done), (2, dead)):
        ScheduleTick.objects.create(
            schedule=schedule, job_id=job_id,
            tick_at=dt.datetime(2026, 12, 1, 6, minutes, tzinfo=dt.UTC),
        )  # fmt: skip
    html = client.get(
        reverse("admin:django_pgqueue_schedule_change", args=[schedule.pk])
    ).content.decode()
    assert field(html, "timing").endswith("every 1m")
    assert "0:01:00" not in html
    runs = field(html, "recent_runs")
    assert f"job #{done} completed" in runs
    assert f"job #{dead} dead" in runs


def test_run_now_names_the_schedule_as_written(client: Any) -> None:
    client.force_login(make_user("runner", "view_schedule", "run_schedule", "view_job"))
    Schedule.objects.create(name="sales.daily_report", type="qa.noop", queue="reports",
                            every=dt.timedelta(minutes=1), timezone="UTC")  # fmt: skip
    response = client.post(
        reverse("admin:django_pgqueue_schedule_changelist"),
        {"action": "run_now_action", "_selected_action": ["sales.daily_report"]},
        follow=True,
    )
    text = text_of(response.content.decode())
    assert "Schedule sales.daily_report: enqueued job #" in text
    assert "Sales.daily_report" not in text


# -- the Charts page ---------------------------------------------------------------------


def rollup_minutes(ago: list[int]) -> None:
    for minutes in ago:
        sql(
            "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
            "wait_seconds_sum, wait_buckets) VALUES (date_trunc('minute', now()) - "
            "make_interval(mins => %s), 'payments', 10, 0, 0, 1, '{1,2,3,0,0,0,0,0,0,0,0,0,0,0}')",
            [minutes],
        )


@pytest.mark.parametrize(
    ("ago", "label"),
    [
        ([0, 3, 5], "15 min"),
        ([0, 40], "1 h"),
        ([0, 150], "6 h"),
        ([0, 359], "6 h"),
        ([0, 360], "24 h"),
        ([0, 900], "24 h"),
        ([], "24 h"),
    ],
)
def test_the_charts_default_to_the_smallest_window_holding_the_data(
    viewer_client: Any, ago: list[int], label: str
) -> None:
    rollup_minutes(ago)
    text = text_of(viewer_client.get(CHARTS).content.decode())
    assert f"<strong>{label}</strong>" in viewer_client.get(CHARTS).content.decode()
    if ago:
        assert f"failed attempts in the last {label}" in text


def test_the_charts_keep_a_window_asked_for(viewer_client: Any) -> None:
    rollup_minutes([0, 3])
    for query, label in (
        ({"hours": 6}, "6 h"),
        ({"minutes": 60}, "1 h"),
        ({"hours": "x"}, "15 min"),
    ):
        html = viewer_client.get(CHARTS, query).content.decode()
        assert f"<strong>{label}</strong>" in html


# -- the paused-queue metric -------------------------------------------------------------


def paused_samples() -> dict[str, float]:
    from django_pgqueue.metrics.collector import QueueCollector

    return {
        sample.labels["queue"]: sample.value
        for family in QueueCollector().collect()
        if family.name == "pgqueue_queue_paused"
        for sample in family.samples
    }


def test_a_metric_says_which_queues_are_paused(settings: Any) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "METRICS_CACHE_SECONDS": 0}
    assert paused_samples() == {}
    pause_queue("payments")
    resume_queue("emails")
    assert paused_samples() == {"emails": 0, "payments": 1}
    resume_queue("payments")
    assert paused_samples() == {"emails": 0, "payments": 0}


def test_every_queue_metric_is_in_the_metrics_reference(settings: Any) -> None:
    from pathlib import Path

    from django_pgqueue.metrics.collector import QueueCollector

    pause_queue("payments")
    make_job("pending")
    page = (Path(__file__).resolve().parents[3] / "docs" / "reference" / "metrics.md").read_text()
    names = {family.name for family in QueueCollector().collect()}
    assert "pgqueue_queue_paused" in names
    for name in names:
        assert f"| `{name}` |" in page, f"{name} is not in docs/reference/metrics.md"
