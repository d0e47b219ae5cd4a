"""A real browser on the Queues page: pause, resume and limit queues (issue 14)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import pause_queue, set_queue_limit, set_queue_rate
from tests.browser.test_admin import (  # noqa: F401  (fixtures)
    PASSWORD,
    _fast_password_hashing,
    login,
    save_screenshot,
)
from tests.browser.test_admin import browser as browser  # a fixture
from tests.conftest import sql
from tests.factories import OPERATOR_PERMISSIONS, VIEWER_PERMISSIONS, make_job, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUEUES = "/admin/django_pgqueue/queuecontrol/"


def controls(queue: str) -> tuple:
    return sql(
        "SELECT paused, concurrency_limit, key_limit, rate_count, rate_period "
        "FROM queue_controls WHERE queue = %s",
        [queue],
    )[0]


def test_operator_pauses_a_queue_and_changes_a_limit(
    browser: Any, live_server: Any, tmp_path: Path
) -> None:
    set_queue_limit("reports", 3)
    set_queue_rate("sms", "50/s")
    pause_queue("emails")
    for _ in range(2):
        make_job("running", queue="reports")
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)

    page.click(f"a[href='{QUEUES}']")
    page.wait_for_url(f"{live_server.url}{QUEUES}")
    rows = page.inner_text("#result_list")
    for queue in ("reports", "sms", "emails"):
        assert queue in rows
    reports = page.locator("#result_list tr", has_text="reports")
    assert reports.locator("td.field-running").inner_text() == "2"
    assert reports.locator("td.field-limit_display").inner_text() == "3"

    # Pause sms, resume emails, with the list's actions.
    page.locator("#result_list tr", has_text="sms").locator("input.action-select").check()
    page.select_option("select[name=action]", "pause_selected")
    page.click("button[name=index]")
    assert "Paused 1 queue(s): sms" in page.inner_text(".messagelist")
    assert controls("sms")[0] is True
    page.locator("#result_list tr", has_text="emails").locator("input.action-select").check()
    page.select_option("select[name=action]", "resume_selected")
    page.click("button[name=index]")
    assert controls("emails")[0] is False

    # Raise the reports limit and give it a rate.
    page.click("#result_list a:text-is('reports')")
    page.fill("#id_concurrency_limit", "5")
    page.fill("#id_rate", "20/s")
    page.click("input[name=_save]")
    assert controls("reports") == (False, 5, 1, 20, 1.0)

    # A bad rate is refused with a message; nothing is written.
    page.click("#result_list a:text-is('reports')")
    page.fill("#id_rate", "fast")
    page.click("input[name=_save]")
    assert "must look like" in page.inner_text(".errorlist")
    assert controls("reports") == (False, 5, 1, 20, 1.0)

    page.goto(f"{live_server.url}{QUEUES}")
    save_screenshot(page, tmp_path, "admin-queues.png")


def test_a_viewer_sees_the_queues_but_cannot_change_them(browser: Any, live_server: Any) -> None:
    set_queue_limit("reports", 3)
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "viewer", width=1400)
    page.goto(f"{live_server.url}{QUEUES}")
    assert "reports" in page.inner_text("#result_list")
    assert page.locator("select[name=action]").count() == 0
    page.click("#result_list a:text-is('reports')")
    assert page.locator("#id_concurrency_limit").count() == 0  # read-only view
    assert controls("reports") == (False, 3, 1, None, None)
