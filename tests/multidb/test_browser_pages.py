"""A real browser on the Workers and Workflows pages with queues on two databases (see
tests/browser/test_admin.py for the setup): the workers of both in one table, and a
workflow of queues2 found, opened and cancelled there through the database choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from django_pgqueue import Workflow, enqueue, step
from django_pgqueue.models import JobState, Schedule
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.factories import OPERATOR_PERMISSIONS, make_user
from tests.integration.test_worker import wait_until
from tests.multidb.conftest import jobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True, databases=["default", "queues2"]),
]


def order_flow(name: str, queue: str, using: str | None = None) -> Any:
    flow = Workflow(name)
    flow.add("charge-card", step("qa.noop", {"order": name}, queue=queue))
    flow.add("reserve-stock", step("qa.noop", {"order": name}, queue=queue))
    flow.add("ship-order", step("qa.noop", {"order": name}, queue=queue),
             after=["charge-card", "reserve-stock"])  # fmt: skip
    return flow.enqueue(using=using)


def test_the_workers_of_both_databases_in_one_table(
    browser: Any,  # noqa: F811
    live_server: Any,
    run_worker: Any,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    held = enqueue("qa.outcome", {"do": "hang", "seconds": 60}, queue="q2.work")
    run_worker(["q2.work"], worker_id="reports-1:4242:queues2", heartbeat_interval=0.2)
    run_worker(["mail"], worker_id="web-1:4243:default", heartbeat_interval=0.2)
    wait_until(lambda: JobState.objects.using("queues2").get(pk=held.id).status == "running")

    page = login(browser, live_server, "operator", width=1400)
    url = f"{live_server.url}/admin/django_pgqueue/workerrecord/"

    def both_listed() -> bool:
        page.goto(url)
        return (
            page.locator("tr[data-worker]").count() == 2
            and page.locator(f'a[href$="/{held.id}/change/?database=queues2"]').count() == 1
        )

    wait_until(both_listed, timeout=120)
    rows = {
        page.locator("tr[data-worker]").nth(i).get_attribute("data-worker"): page.locator(
            "tr[data-worker]"
        )
        .nth(i)
        .get_attribute("data-database")
        for i in range(2)
    }
    assert rows == {"reports-1:4242:queues2": "queues2", "web-1:4243:default": "default"}
    assert page.locator("#pgqueue-databases").is_visible()
    save_screenshot(page, tmp_path, "workers-two-databases.png")
    # The running job opens on its own database.
    page.click(f'a[href$="/{held.id}/change/?database=queues2"]')
    assert f"#{held.id}" in page.inner_text("#content")
    assert "q2.work" in page.inner_text("#content")


def test_a_workflow_of_queues2_is_found_opened_and_cancelled_there(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    home = order_flow("order-1041", "mail")
    away = order_flow("order-2087", "q2.work", using="queues2")

    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/workflow/")
    assert "order-1041" in page.inner_text("#content")
    assert "order-2087" not in page.inner_text("#content")
    page.click("#pgqueue-database-choice >> text=queues2")
    page.wait_for_url("**/workflow/?database=queues2")
    assert "order-2087" in page.inner_text("#content")
    assert "order-1041" not in page.inner_text("#content")
    save_screenshot(page, tmp_path, "workflows-queues2.png")

    page.click("text=order-2087")
    page.wait_for_url(f"**/workflow/{away.id}/change/?database=queues2")
    assert page.locator("svg.pgqueue-graph, svg").first.is_visible()
    save_screenshot(page, tmp_path, "workflow-queues2.png")

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Cancel workflow")
    page.wait_for_selector(".messagelist")
    assert "Cancelled 3 step(s)" in page.inner_text(".messagelist")
    assert page.url.endswith("?database=queues2")
    ids = list(away.jobs.values())
    cancelled = JobState.objects.using("queues2").filter(pk__in=ids, status="cancelled")
    assert cancelled.count() == 3
    untouched = JobState.objects.filter(pk__in=list(home.jobs.values()), status="cancelled")
    assert untouched.count() == 0

    # A step's job page, and back to its workflow: on queues2 all along.
    page.click(f'a[href$="/{away.jobs["ship-order"]}/change/?database=queues2"] >> nth=0')
    page.click("text=order-2087")
    page.wait_for_url(f"**/workflow/{away.id}/change/?database=queues2")


def test_schedules_and_charts_of_queues2(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, "view_schedule", "change_schedule",
              "run_schedule", password=PASSWORD)  # fmt: skip
    daily = {"type": "qa.noop", "cron": "0 3 * * *", "timezone": "UTC"}
    Schedule.objects.create(name="nightly-report", queue="mail", **daily)
    Schedule.objects.using("queues2").create(name="hourly-export", queue="q2.work", **daily)
    with connections["queues2"].cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
            "wait_seconds_sum, wait_buckets) SELECT date_trunc('minute', now()) - "
            "make_interval(mins => m), 'q2.work', 40 + m % 7, m % 3, 0, 20, "
            "'{30,10,5,0,0,0,0,0,0,0,0,0,0,0}' FROM generate_series(0, 50) AS m"
        )

    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/schedule/")
    assert "nightly-report" in page.inner_text("#result_list")
    page.click("#pgqueue-database-choice >> text=queues2")
    page.wait_for_url("**/schedule/?database=queues2")
    assert "hourly-export" in page.inner_text("#result_list")
    assert "nightly-report" not in page.inner_text("#result_list")
    page.check("input.action-select")
    page.select_option("select[name=action]", "run_now_action")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "enqueued job" in page.inner_text(".messagelist")
    assert jobs("queues2") == [("q2.work", "qa.noop")]
    assert jobs("default") == []
    save_screenshot(page, tmp_path, "schedules-queues2.png")

    page.goto(f"{live_server.url}/admin/django_pgqueue/minutestats/?database=queues2")
    assert "q2.work: jobs per minute" in page.inner_text("#content")
    page.click("text=6 h")
    assert "database=queues2" in page.url
    assert "q2.work: jobs per minute" in page.inner_text("#content")
    save_screenshot(page, tmp_path, "charts-queues2.png")
