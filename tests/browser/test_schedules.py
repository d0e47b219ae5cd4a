"""A real browser on the Schedules page: list, disable, run now (twice).

Headless Debian Chromium through Playwright, like test_browser.py (its fixtures are
reused). The code schedule's ticks are fired by a real worker first, so the page shows
real last runs. PGQUEUE_SCREENSHOTS=1 refreshes docs/images/admin-schedules.png.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue.models import Schedule
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.conftest import sql
from tests.factories import make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PERMISSIONS = ("view_schedule", "change_schedule", "add_schedule", "run_schedule", "view_job")


@pytest.fixture
def schedules(settings: Any, run_worker: Any) -> Any:
    """A code schedule a worker has been firing, two database ones, and a late one."""
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "SCHEDULES": {
            "ops.digest": {
                "type": "demo.send_email",
                "every": "2s",
                "queue": "ops",
                "payload": {"to": "ops@example.com"},
            },
            "reports.daily": {
                "type": "demo.send_email",
                "cron": "0 6 * * *",
                "queue": "reports",
                "timezone": "Europe/Berlin",
                "payload": {"to": "sales@example.com"},
            },
        },
    }
    worker = run_worker(["ops"], poll_interval=0.2)
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while time.monotonic() < deadline and not sql("SELECT FROM queue_schedule_ticks"):
        time.sleep(0.1)
    Schedule.objects.create(
        name="invoices.remind", type="demo.send_email", queue="billing",
        cron="30 9 * * 1-5", timezone="America/New_York", payload={"to": "billing@example.com"},
        next_tick=dt.datetime(2026, 12, 1, 14, 30, tzinfo=dt.UTC),
    )  # fmt: skip
    # No worker serves "idle": its tick is 12 minutes overdue.
    overdue = sql("SELECT date_trunc('minute', now()) - interval '12 minutes'")[0][0]
    Schedule.objects.create(
        name="thumbnails.warm", type="demo.resize_image", queue="idle",
        payload={"image": 1, "size": [800, 600]}, every=dt.timedelta(minutes=5),
        timezone="UTC", next_tick=overdue,
    )  # fmt: skip
    return worker  # still firing ops.digest


def test_operator_lists_disables_and_runs_a_schedule_now(
    browser: Any,  # noqa: F811 - the fixture imported above
    live_server: Any,
    schedules: Any,
    tmp_path: Path,
) -> None:
    make_user("planner", *PERMISSIONS, password=PASSWORD)
    # Twice the pixels, and only the list (not the filters): readable at the docs' width.
    page = login(browser, live_server, "planner", width=1400, scale=2)
    page.goto(f"{live_server.url}/admin/django_pgqueue/schedule/")
    page.click("#toggle-nav-sidebar")  # more room for the table
    rows = page.inner_text("#result_list")
    for expected in ("ops.digest", "every 2s", "reports.daily",
                     "At 06:00 every day (Europe/Berlin)", "0 6 * * *", "invoices.remind",
                     "At 09:30 on Monday through Friday (America/New_York)", "database",
                     "code"):  # fmt: skip
        assert expected in rows
    assert page.locator("#result_list tr:has-text('thumbnails.warm') .pgqueue-late").count() == 1
    last_run = page.inner_text("#result_list tr:has-text('ops.digest') td.field-last_run")
    assert last_run.startswith("20")  # a timestamp: the worker fired it
    table = page.locator("#changelist-form").bounding_box()
    clip = {"x": table["x"] - 8, "y": 0, "width": table["width"] + 16}
    save_screenshot(
        page,
        tmp_path,
        "admin-schedules.png",
        clip={**clip, "height": table["y"] + table["height"] + 8},
    )
    schedules.stop()

    # Disable the code schedule from the list.
    page.check("#result_list tr:has-text('ops.digest') input.action-select")
    page.select_option("select[name='action']", "disable")
    page.click("button[name='index']")
    assert "Disabled 1 schedule(s)." in page.inner_text(".messagelist")
    assert Schedule.objects.get(name="ops.digest").enabled is False

    # Run a database schedule now; a second click does not make a second job.
    for answer in ("job", "still waiting or running"):
        page.check("#result_list tr:has-text('invoices.remind') input.action-select")
        page.select_option("select[name='action']", "run_now_action")
        with page.expect_navigation():  # the answer is on the page the action returns
            page.click("button[name='index']")
        assert answer in page.inner_text(".messagelist")
    jobs = sql("SELECT type, queue FROM queue_jobs WHERE idempotency_key LIKE 'schedule:invoices%'")
    assert jobs == [("demo.send_email", "billing")]

    # A code schedule's page is read-only.
    page.click("#result_list a[href$='/reports.daily/change/']")  # the name may break: <wbr>
    assert page.locator("input[name='cron']").count() == 0
    assert "0 6 * * *" in page.inner_text("#content-main")
    page.context.close()
