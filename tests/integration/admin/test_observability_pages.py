"""The Workers and Charts pages through Django's test client."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from django_pgqueue.sql import QUERIES
from tests.conftest import sql
from tests.factories import make_job, make_user

pytestmark = pytest.mark.django_db

WORKERS = reverse("admin:django_pgqueue_workerrecord_changelist")
CHARTS = reverse("admin:django_pgqueue_minutestats_changelist")


def register(worker_id: str, running: int = 0) -> None:
    """Upsert a worker row on the test's connection (rolled back with the test)."""
    sql(
        QUERIES["worker_upsert"],
        {
            "id": worker_id,
            "host": "web-1",
            "pid": 4242,
            "queues": json.dumps(["payments", "email"]),
            "concurrency": 8,
            "lease": 30.0,
            "version": "0.1.0",
            "running": running,
            "supervisor": None,
            "report": None,
        },
    )


def test_workers_page_lists_alive_and_gone_workers_with_their_jobs(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    register("web-1:4242:aa", running=1)
    register("web-2:77:bb")
    sql("UPDATE queue_workers SET gone_at = now() WHERE id = 'web-2:77:bb'")
    job_id = make_job("running", queue="payments", type="qa.noop")
    sql("UPDATE queue_job_state SET locked_by = 'web-1:4242:aa' WHERE job_id = %s", [job_id])
    page = client.get(WORKERS)
    assert page.status_code == 200
    html = page.content.decode()
    assert "1 worker alive (1 process), 1 gone." in html
    assert "web-1:4242:aa" in html
    assert "web-2:77:bb" not in html  # gone workers are folded away
    assert "payments, email" in html
    # The gone one shows on asking, with the job still leased to it.
    html = client.get(WORKERS, {"gone": "1"}).content.decode()
    assert "web-2:77:bb" in html
    sql("UPDATE queue_job_state SET locked_by = 'web-2:77:bb' WHERE job_id = %s", [job_id])
    html = client.get(WORKERS, {"gone": "1"}).content.decode()
    assert reverse("admin:django_pgqueue_job_change", args=[job_id]) in html
    assert "leased to it until the sweep" in html


def test_a_request_to_a_worker_needs_the_control_permission(client) -> None:
    register("web-1:4242:aa")
    client.force_login(make_user("viewer", "view_job"))
    page = client.get(WORKERS)
    assert 'name="action"' not in page.content.decode()  # no buttons without it
    response = client.post(WORKERS, {"worker": "web-1:4242:aa", "action": "drain"})
    assert response.status_code == 403
    assert sql("SELECT count(*) FROM queue_worker_requests") == [(0,)]


def test_the_page_asks_a_live_worker_and_refuses_a_gone_one(client) -> None:
    register("web-1:4242:aa")
    register("web-2:77:bb")
    sql("UPDATE queue_workers SET gone_at = now() WHERE id = 'web-2:77:bb'")
    client.force_login(make_user("boss", "view_job", "control_worker"))
    assert 'value="drain"' in client.get(WORKERS).content.decode()

    page = client.post(
        WORKERS, {"worker": "web-1:4242:aa", "action": "concurrency", "concurrency": "3"},
        follow=True,
    )  # fmt: skip
    assert "Asked web-1:4242:aa to concurrency 3 (1 process(es))" in page.content.decode()
    assert sql(
        "SELECT worker_id, action, concurrency, requested_by FROM queue_worker_requests"
    ) == [("web-1:4242:aa", "concurrency", 3, "boss (admin)")]
    page = client.post(WORKERS, {"worker": "web-2:77:bb", "action": "stop"}, follow=True)
    assert "Refused: worker &#x27;web-2:77:bb&#x27; is gone (last seen" in page.content.decode()
    page = client.post(WORKERS, {"queue": "email", "action": "drain"}, follow=True)
    assert "Asked the workers serving email to drain (1 process(es))" in page.content.decode()
    page = client.post(
        WORKERS, {"worker": "web-1:4242:aa", "action": "concurrency", "concurrency": "0"},
        follow=True,
    )  # fmt: skip
    assert "Concurrency: give a whole number from 1 to" in page.content.decode()
    assert sql("SELECT count(*) FROM queue_worker_requests") == [(2,)]


def test_charts_page_describes_its_charts_from_the_rollup(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    sql(
        "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
        "wait_seconds_sum, wait_buckets) VALUES (date_trunc('minute', now()), 'payments', "
        "120, 3, 1, 10, '{5,10,20,30,40,10,5,3,1,0,0,0,0,0}')"
    )
    page = client.get(CHARTS, {"hours": 1})
    assert page.status_code == 200
    html = page.content.decode()
    # Per queue: jobs per minute, backlog, wait and run time, as JSON for charts.js.
    assert html.count("data-pgqueue-chart=") == 4
    drawn = page.context["charts"]["charts"]
    assert [chart["title"] for chart in drawn] == [
        "payments: jobs per minute",
        "payments: backlog (jobs due, not started)",
        "payments: wait from due to start",
        "payments: run time",
    ]
    assert '<script id="pgqueue-charts" type="application/json">' in html
    assert "vendor/uplot-1.6.32/uPlot.iife.min.js" in html
    assert "120 completed, 4 failed attempts in the last 1 h" in html
    assert drawn[0]["series"][0]["values"][-1] == 120
    assert client.get(CHARTS, {"hours": "x", "queue": "nope"}).status_code == 200


def test_pages_need_a_view_permission(client) -> None:
    client.force_login(make_user("nobody"))
    assert client.get(WORKERS).status_code == 403
    assert client.get(CHARTS).status_code == 403


def test_queue_stats_lists_the_workers() -> None:
    from io import StringIO

    from django.core.management import call_command

    register("web-1:4242:aa", running=1)
    job_id = make_job("running", queue="payments", type="qa.noop")
    sql("UPDATE queue_job_state SET locked_by = 'web-1:4242:aa' WHERE job_id = %s", [job_id])
    out = StringIO()
    call_command("queue_stats", stdout=out)
    text = out.getvalue()
    assert "workers: 1 alive, 0 gone" in text
    assert "web-1:4242:aa  queues=payments,email  running=1/8" in text
    assert f"jobs: #{job_id} qa.noop" in text
    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    (worker,) = json.loads(out.getvalue())["workers"]
    assert worker["id"] == "web-1:4242:aa"
    assert worker["alive"] is True
    assert worker["jobs"] == [job_id]


EVENTS = reverse("admin:django_pgqueue_events")
POLL = reverse("admin:django_pgqueue_events_poll")


def test_the_live_feed_follows_attempts_filtered_by_queue_and_type(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    first = make_job("running", queue="payments", type="qa.noop")
    page = client.get(EVENTS, {"queue": "payments"})
    assert page.status_code == 200
    html = page.content.decode()
    assert "started" in html
    assert f"#{first}" in html
    after = page.context["after"]
    assert (
        page.context["open"]
        == sql("SELECT id::text FROM queue_attempts WHERE job_id = %s", [first])[0][0]
    )

    # Nothing new: the running attempt is read again, still started (the page keeps
    # one row per attempt and event).
    polled = client.get(POLL, {"after": after, "open": page.context["open"]}).json()
    assert [(e["job_id"], e["event"]) for e in polled["events"]] == [(first, "started")]
    # It ends; another queue's job and another type's run meanwhile.
    sql(
        "UPDATE queue_attempts SET status = 'succeeded', finished_at = now() WHERE job_id = %s",
        [first],
    )
    other_queue = make_job("running", queue="email", type="qa.noop")
    other_type = make_job("running", queue="payments", type="qa.echo")
    polled = client.get(
        POLL, {"after": after, "open": page.context["open"], "queue": "payments", "type": "qa.noop"}
    ).json()
    assert [(e["job_id"], e["event"]) for e in polled["events"]] == [(first, "succeeded")]
    assert polled["open"] == []
    # The range moved past what the filters left out.
    newest = sql("SELECT max(id) FROM queue_attempts")[0][0]
    assert polled["after"] == newest
    polled = client.get(POLL, {"after": after}).json()
    assert {e["job_id"] for e in polled["events"]} >= {other_queue, other_type}
    assert client.get(POLL, {"after": "x"}).status_code == 400


def test_a_failed_attempt_is_retried_unless_it_left_its_job_dead(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    retried = make_job("running", queue="payments", type="qa.fail")
    dead = make_job("dead", queue="payments", type="qa.fail")
    sql("UPDATE queue_attempts SET status = 'failed', finished_at = now()")
    sql("UPDATE queue_job_state SET status = 'pending', locked_by = NULL, locked_until = NULL "
        "WHERE job_id = %s", [retried])  # fmt: skip
    polled = client.get(POLL, {"after": 0}).json()
    events = {e["job_id"]: e["event"] for e in polled["events"]}
    assert events == {retried: "retried", dead: "failed"}
