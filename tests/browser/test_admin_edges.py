"""A real browser on the admin's smaller pages at laptop widths (1366 and 1400 px).

Headless Debian Chromium through Playwright, with test_admin.py's fixtures. Each test
measures what an operator would see (a style, a box's edges) and saves a screenshot
to its temporary directory for a look by eye.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import actions
from django_pgqueue.models import Schedule
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    MEASURE_LIST,
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.conftest import sql
from tests.factories import OPERATOR_PERMISSIONS, make_job, make_user, state

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WIDTHS = [1366, 1400]
# Django's breadcrumb bar: what a page's bar must look like to match the admin's own.
BAR_STYLE = """(selector) => {
    const bar = document.querySelector(selector);
    const style = getComputedStyle(bar);
    const link = bar.querySelector('a');
    return {
        background: style.backgroundColor,
        padding: style.paddingLeft,
        color: style.color,
        link: getComputedStyle(link).color,
        height: bar.getBoundingClientRect().height,
    };
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_workers_and_charts_breadcrumbs_look_like_djangos(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/")
    django_bar = page.evaluate(BAR_STYLE, ".breadcrumbs")
    assert django_bar["background"] not in ("rgba(0, 0, 0, 0)", "transparent")
    for model, name in (("workerrecord", "Workers"), ("minutestats", "Charts")):
        page.goto(f"{live_server.url}/admin/django_pgqueue/{model}/")
        assert page.evaluate(BAR_STYLE, ".breadcrumbs") == django_bar, model
        crumbs = page.inner_text(".breadcrumbs").split()
        assert (crumbs[0], crumbs[-1]) == ("Home", name), crumbs
        save_screenshot(page, tmp_path, f"{model}-{width}.png")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_gone_worker_shows_no_running_slots(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    # A worker SIGKILLed while it ran two of its four slots: its row still says 2.
    sql(
        "INSERT INTO queue_workers (id, host, pid, queues, concurrency, lease_seconds, version, "
        "running, started_at, last_seen_at) VALUES ('web-1:4242:ab12cd', 'web-1', 4242, "
        "'[\"payments\"]', 4, 30, '0.1.0', 2, now() - interval '1 hour', "
        "now() - interval '3 minutes')"
    )
    held = make_job("running", queue="payments", type="demo.charge_card")
    sql("UPDATE queue_job_state SET locked_by = 'web-1:4242:ab12cd' WHERE job_id = %s", [held])
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/workerrecord/")
    page.click("text=Show gone workers (1)")
    row = page.locator("tr.pgqueue-worker.pgqueue-gone")
    running = row.locator("td.pgqueue-worker-running").inner_text()
    assert "2 / 4" not in running
    assert running.strip() == "—"
    processes = page.inner_text("tr.pgqueue-processes-row")
    assert f"#{held}" in processes
    assert "leased to it until the sweep" in processes
    save_screenshot(page, tmp_path, f"workers-gone-{width}.png")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_the_schedules_list_shows_its_late_column_whole(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    overdue = sql("SELECT date_trunc('minute', now()) - interval '3 hours 12 minutes'")[0][0]
    for name, queue, minutes in (
        ("thumbnails.warm", "images", 5),
        ("sales.daily_report", "reports", 1440),
        ("invoices.remind_overdue_customers", "billing", 60),
    ):
        Schedule.objects.create(
            name=name, type="demo.send_email", queue=queue, payload={"to": "ops@example.com"},
            every=dt.timedelta(minutes=minutes), timezone="UTC", next_tick=overdue,
            last_tick=overdue - dt.timedelta(minutes=minutes),
        )  # fmt: skip
    make_user("planner", "view_schedule", "view_job", password=PASSWORD)
    page = login(browser, live_server, "planner", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/schedule/")
    assert page.locator("#nav-sidebar").is_visible()
    save_screenshot(page, tmp_path, f"schedules-{width}.png")
    layout = page.evaluate(MEASURE_LIST)
    assert layout["scroll"] <= layout["client"], str(layout)
    assert layout["page"] <= layout["viewport"], str(layout)
    clipped = [name for name, column in layout["columns"].items() if column["clipped"]]
    assert clipped == [], str(layout)
    late = page.locator("td.field-late").first.bounding_box()
    assert late["x"] + late["width"] <= width, late
    assert page.locator("td.field-late .pgqueue-late").count() == 3
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_operator_pauses_a_queue_that_has_no_controls_from_the_queues_page(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    make_job("completed", queue="payments", type="demo.charge_card")
    make_job("pending", queue="email", type="demo.send_email")
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/queuecontrol/")
    assert page.inner_text("#content h1") == "Queues"
    # No empty list of controlled queues first: the known queues open the page.
    assert "0 queues" not in page.inner_text("#content")
    others = page.locator("#pgqueue-other-queues")
    assert others.locator("tr[data-queue='payments']").count() == 1
    assert others.locator("tr[data-queue='email']").count() == 1
    top = others.bounding_box()["y"]
    assert top < page.locator("#content h1").bounding_box()["y"] + 120, top
    assert page.inner_text(".object-tools") == "SET LIMITS ON A QUEUE"
    save_screenshot(page, tmp_path, f"queues-{width}.png")
    with page.expect_navigation():
        others.locator("tr[data-queue='payments'] button").click()
    assert "Paused 1 queue(s): payments" in page.inner_text(".messagelist")
    assert sql("SELECT paused FROM queue_controls WHERE queue = 'payments'") == [(True,)]
    payments = page.locator("#result_list tr", has_text="payments")
    assert payments.locator("td.field-state_display").inner_text() == "paused"
    # Resumed with the list's action, like any controlled queue.
    payments.locator("input.action-select").check()
    page.select_option("select[name=action]", "resume_selected")
    page.click("button[name=index]")
    assert sql("SELECT paused FROM queue_controls WHERE queue = 'payments'") == [(False,)]
    save_screenshot(page, tmp_path, f"queues-paused-{width}.png")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_jobs_page_shows_results_and_numbers_attempts_across_a_retry(
    browser: Any,  # noqa: F811
    live_server: Any,
    run_worker: Any,
    width: int,
    tmp_path: Path,
) -> None:
    # Dead after its one attempt; an operator retry, and the next attempt returns.
    job_id = make_job(
        "dead", queue="edges", type="qa.outcome", payload={"do": "return"}, max_attempts=1,
        error="ConnectionError: the card service is down",
    )  # fmt: skip
    actions.retry_now([job_id])
    run_worker(["edges"], burst=True).join()
    assert state(job_id)["status"] == "completed"
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/{job_id}/change/")
    save_screenshot(page, tmp_path, f"job-{width}.png")
    assert page.inner_text(".field-last_error_full .readonly") == "—"
    # Compact: several fields to a row, the attempts one table; the whole page fits
    # about one and a half screens (it took 2,600 px with a field per row).
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height <= 1400, height
    first_row = page.locator(".form-row").first
    assert first_row.locator(".fieldBox").count() == 3  # id, type, queue
    # One wording for an attempt ("attempt 2"), with what it counted against the budget.
    rows = page.locator("tr.pgqueue-attempt")
    assert rows.locator("td.field-number").all_inner_texts() == ["attempt 1", "attempt 2"]
    assert rows.locator("td.field-budget").all_inner_texts() == ["1 of 1", "1 of 1"]
    assert page.locator(".inline-related h3").count() == 0
    results = page.locator("pre.pgqueue-result").all_inner_texts()
    assert results == [f'{{\n  "ok": {job_id}\n}}']
    assert "the card service is down" in page.inner_text(".inline-group")
    # One mark for no value: never Django's "-".
    values = page.locator(".readonly, tr.pgqueue-attempt td").all_inner_texts()
    assert "—" in values
    assert "-" not in values, values
    page.context.close()


def test_the_charts_of_a_new_install_fill_their_width(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    # Five minutes of work, as a new install has after its first run.
    sql(
        "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
        "wait_seconds_sum, wait_buckets) SELECT date_trunc('minute', now()) - make_interval("
        "mins => m), 'payments', 20 + m * 3, m % 2, 0, 1, '{4,8,2,1,0,0,0,0,0,0,0,0,0,0}' "
        "FROM generate_series(0, 4) AS m"
    )
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/minutestats/")
    assert page.inner_text(".pgqueue-summary strong").startswith("15 min")
    # The first minute with work sits in the chart's left part, not squeezed to the edge.
    page.wait_for_function("() => window.pgqueueCharts !== undefined")
    spread = page.evaluate(
        """() => {
        const u = window.pgqueueCharts[0];
        const worked = u.data[1].findIndex((v) => v > 0);
        return {
            first: u.valToPos(u.data[0][worked], 'x'),
            width: u.bbox.width / devicePixelRatio,
            ticks: u.axes[1]._values,
        };
    }"""
    )
    assert 0 < spread["first"] < spread["width"] * 0.75, spread
    # Whole-number ticks for counts.
    assert spread["ticks"] == ["0", "10", "20", "30", "40"], spread
    save_screenshot(page, tmp_path, "charts-new-install-1400.png")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_schedules_page_says_every_1m_and_how_its_runs_ended(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    schedule = Schedule.objects.create(
        name="sales.daily_report", type="demo.send_email", queue="reports", source="code",
        payload={"to": "sales@example.com"}, every=dt.timedelta(minutes=1), timezone="UTC",
    )  # fmt: skip
    ran = {
        make_job("completed", queue="reports", type="demo.send_email"): 2,
        make_job("dead", queue="reports", type="demo.send_email"): 1,
    }
    for job_id, minutes in ran.items():
        sql(
            "INSERT INTO queue_schedule_ticks (schedule, tick_at, job_id, missed) "
            "VALUES (%s, date_trunc('minute', now()) - make_interval(mins => %s), %s, 0)",
            [schedule.pk, minutes, job_id],
        )
    make_user("planner", "view_schedule", "run_schedule", "view_job", password=PASSWORD)
    page = login(browser, live_server, "planner", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/schedule/")
    assert "every 1m" in page.inner_text("#result_list")
    page.check("#result_list input.action-select")
    page.select_option("select[name='action']", "run_now_action")
    with page.expect_navigation():
        page.click("button[name='index']")
    assert page.inner_text(".messagelist").startswith("Schedule sales.daily_report: enqueued")
    page.click("#result_list th.field-name_column a")  # the only schedule
    assert page.inner_text(".field-timing .readonly") == "every 1m"
    assert "0:01:00" not in page.inner_text("#content-main")
    runs = page.locator(".field-recent_runs li").all_inner_texts()
    # Newest first: the dead run a minute ago, the completed one before it.
    assert [run.split("job #")[1].split(" ", 1)[1] for run in runs] == ["dead", "completed"]
    save_screenshot(page, tmp_path, f"schedule-page-{width}.png")
    page.context.close()


def test_a_running_job_cancelled_from_its_page_says_cancel_requested(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    job_id = make_job("running", queue="images", type="demo.resize_image")
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/{job_id}/change/")
    page.select_option("select[name='CHANGE_FORM-action']", "cancel")
    page.click("#content-main .actions button[type=submit]")
    page.click("input[type=submit][value='Yes, cancel them']")
    page.wait_for_url(f"**/admin/django_pgqueue/job/{job_id}/change/")
    # Still running (its worker ends it), and marked so right away.
    status = page.inner_text(".field-status_badge .readonly")
    assert status.split() == ["running", "cancel", "requested"], status
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/")
    row = page.locator("#result_list tbody tr", has_text=str(job_id))
    assert "cancel requested" in row.locator("td.field-status_column").inner_text()
    box = row.bounding_box()
    assert box["height"] <= 36, box  # the mark keeps the row on one line
    save_screenshot(page, tmp_path, "jobs-cancel-requested-1400.png")
    page.context.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_schedule_reads_its_cron_in_words_and_has_its_buttons(
    browser: Any,  # noqa: F811
    live_server: Any,
    width: int,
    tmp_path: Path,
) -> None:
    Schedule.objects.create(
        name="sales.daily_report", type="demo.send_email", queue="reports", source="code",
        payload={"to": "sales@example.com"}, cron="0 3 * * *", timezone="UTC",
        next_tick=dt.datetime(2026, 12, 6, 3, 0, tzinfo=dt.UTC),
    )  # fmt: skip
    make_user("planner", "view_schedule", "change_schedule", "run_schedule", "view_job",
              password=PASSWORD)  # fmt: skip
    page = login(browser, live_server, "planner", width=width)
    page.goto(f"{live_server.url}/admin/django_pgqueue/schedule/")
    assert page.inner_text("#content h1") == "Schedules"
    timing = page.locator("td.field-timing")
    assert timing.locator(".pgqueue-cron-words").inner_text() == "At 03:00 every day (UTC)"
    # The expression is never broken: one line box.
    cron = timing.locator("code.pgqueue-cron")
    assert cron.inner_text() == "0 3 * * *"
    assert page.evaluate("(el) => el.getClientRects().length", cron.element_handle()) == 1
    listed = page.inner_text("td.field-next_run")
    assert " ".join(listed.split()) == "2026-12-06 03:00:00 UTC"
    save_screenshot(page, tmp_path, f"schedules-cron-{width}.png")

    page.click("#result_list th.field-name_column a")
    # The same point in time in the same format on the schedule's page.
    assert page.inner_text(".field-next_run_at .readonly") == "2026-12-06 03:00:00 UTC"
    buttons = page.locator("#pgqueue-schedule-buttons button").all_inner_texts()
    assert buttons == ["Run now", "Disable"]
    save_screenshot(page, tmp_path, f"schedule-buttons-{width}.png")
    with page.expect_navigation():
        page.click("#pgqueue-schedule-buttons button:text('Run now')")
    assert "enqueued job" in page.inner_text(".messagelist")
    assert sql("SELECT count(*) FROM queue_jobs WHERE queue = 'reports'") == [(1,)]
    with page.expect_navigation():
        page.click("#pgqueue-schedule-buttons button:text('Disable')")
    assert "Disabled 1 schedule(s)." in page.inner_text(".messagelist")
    assert not Schedule.objects.get(pk="sales.daily_report").enabled
    buttons = page.locator("#pgqueue-schedule-buttons button").all_inner_texts()
    assert buttons == ["Run now", "Enable"]
    with page.expect_navigation():
        page.click("#pgqueue-schedule-buttons button:text('Enable')")
    assert Schedule.objects.get(pk="sales.daily_report").enabled
    page.context.close()


def test_limits_are_set_on_a_known_queue_chosen_from_a_list(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    make_job("pending", queue="email", type="demo.send_email")
    make_job("pending", queue="payments", type="demo.charge_card")
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/queuecontrol/")
    page.click("text=Set limits on a queue")
    assert page.inner_text("#content h1") == "Set limits on a queue"
    # The breadcrumb says what the page does, not Django's "Add queue".
    crumbs = " ".join(page.inner_text(".breadcrumbs").replace("\u203a", " ").split())
    assert crumbs == "Home Job queue Queues Set limits on a queue", crumbs
    # A queue without limits has no per-type limits or history to show yet.
    for empty in ("type_limits", "configured", "updated"):
        assert page.locator(f".field-{empty}").count() == 0, empty
    options = page.locator("select#id_queue option").all_inner_texts()
    assert options == ["---------", "email", "payments"]
    # The key limit has its default and is not required.
    assert page.input_value("#id_key_limit") == "1"
    assert "required" not in (page.get_attribute("label[for=id_key_limit]", "class") or "")
    page.select_option("select#id_queue", "payments")
    page.fill("#id_concurrency_limit", "3")
    page.fill("#id_key_limit", "")
    save_screenshot(page, tmp_path, "queue-set-limits-1400.png")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert sql(
        "SELECT concurrency_limit, key_limit FROM queue_controls WHERE queue = 'payments'"
    ) == [(3, 1)]
    row = page.locator("#result_list tr", has_text="payments")
    assert row.locator("td.field-limit_display").inner_text() == "3"
    assert row.locator("td.field-rate_display").inner_text() == "—"
    page.context.close()


def test_the_dead_jobs_range_filter_names_its_time_fields_and_search_reads_prefixes(
    browser: Any,  # noqa: F811
    live_server: Any,
    tmp_path: Path,
) -> None:
    make_job("dead", queue="payments", type="demo.charge_card", payload={"order": 7311},
             error="django_pgqueue.exceptions.PermanentFailure: card declined")  # fmt: skip
    make_job("dead", queue="email", type="shop.send_receipt", payload={"order": 9001})
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/deadjob/")
    # The range filter's time fields say they take a time, in the admin's zone.
    placeholders = page.eval_on_selector_all(
        "#changelist-filter input[placeholder]", "inputs => inputs.map(i => i.placeholder)"
    )
    assert "From time (UTC)" in placeholders, placeholders
    assert "To time (UTC)" in placeholders, placeholders
    assert placeholders.count("From date") == placeholders.count("From time (UTC)")
    # Each time field is wide enough for its placeholder.
    cut = page.eval_on_selector_all(
        "#changelist-filter input.vTimeField",
        """inputs => inputs.filter(input => {
            const probe = document.createElement('span');
            probe.style.font = getComputedStyle(input).font;
            probe.textContent = input.placeholder;
            document.body.appendChild(probe);
            const wide = probe.getBoundingClientRect().width;
            probe.remove();
            return wide > input.clientWidth - 4;
        }).map(input => input.placeholder)""",
    )
    assert cut == [], cut
    save_screenshot(page, tmp_path, "deadjob-filters-1400.png")
    # A type's beginning and a payload value each find their job.
    for words, found in (("demo.", "demo.charge_card"), ("9001", "shop.send_receipt")):
        page.fill("#searchbar", words)
        with page.expect_navigation():
            page.press("#searchbar", "Enter")
        types = page.locator("#result_list td.field-type_column").all_inner_texts()
        assert types == [found], (words, types)
    page.context.close()
