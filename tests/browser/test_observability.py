"""A real browser on the Workers and Charts pages (see test_browser.py for the setup).

Set PGQUEUE_SCREENSHOTS=1 to refresh docs/images/admin-workers.png and
docs/images/admin-charts.png.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import enqueue, enqueue_many
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


def wait_until(predicate: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


# Each chart uPlot drew (charts.js keeps them in window.pgqueueCharts): its title, its
# points and how many of the first line's are known, its y-axis labels, its canvas width.
READ_CHARTS = """() => window.pgqueueCharts.map((u) => ({
    title: u.root.querySelector('.u-title').textContent,
    points: u.data[0].length,
    known: u.data[1].filter((v) => v != null).length,
    ticks: u.axes[1]._values,
    canvas: u.width,
}))"""


def read_charts(page: Any) -> list[dict[str, Any]]:
    """The page's charts, once its scripts drew them."""
    page.wait_for_function("() => window.pgqueueCharts !== undefined")
    return page.evaluate(READ_CHARTS)


def six_hours_of_rollup() -> None:
    """Rollup rows as busy workers leave them: a daily-ish load with a failure spike."""
    sql(
        """
        INSERT INTO queue_stats_minutely
            (minute, queue, completed, retried, dead, wait_seconds_sum, wait_buckets,
             run_buckets, backlog)
        SELECT date_trunc('minute', now()) - make_interval(mins => m), q.name,
               (q.base + q.base * 0.4 * sin(m / 40.0) + (m * 7919 % 23))::int
                   * CASE WHEN m = 0 THEN 0.4 ELSE 1 END,
               CASE WHEN m BETWEEN 95 AND 110 THEN 30 + m % 9 ELSE m % 4 END,
               CASE WHEN m BETWEEN 95 AND 110 THEN 4 ELSE (m % 17 = 0)::int END,
               0,
               CASE WHEN m BETWEEN 120 AND 150
                    THEN ARRAY[0, 0, 5, 20, 40, 60, 80, 90, 40, 10, 3, 0, 0, 0]
                    ELSE ARRAY[q.base / 2, q.base, q.base / 2, 20, 10, 5, 2, 1, 0, 0, 0, 0, 0, 0]
               END,
               CASE WHEN m BETWEEN 95 AND 110
                    THEN ARRAY[0, 0, 0, 0, 0, 5, 10, 30, 40, 20, 5, 0, 0, 0]
                    ELSE ARRAY[0, q.base / 4, q.base, q.base / 2, 10, 4, 1, 0, 0, 0, 0, 0, 0, 0]
               END,
               CASE WHEN m BETWEEN 120 AND 150 THEN 1500 - abs(m - 135) * 90
                    ELSE (m * 31 % 40) + q.base / 10 END
        FROM generate_series(0, 359) AS m
        CROSS JOIN (VALUES ('email', 120), ('payments', 300)) AS q(name, base)
        """
    )


def test_operator_sees_live_workers_and_the_charts(
    browser: Any,  # noqa: F811
    live_server: Any,
    run_worker: Any,
    tmp_path: Path,
) -> None:
    make_user("viewer", "view_job", password=PASSWORD)
    six_hours_of_rollup()
    # The images queue's one sample, three hours back: a point alone in its line, far
    # from the minutes the live worker's rollup may add (by the time the page loads, or
    # not yet).
    sql(
        "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
        "wait_seconds_sum, wait_buckets, run_buckets, backlog) "
        "SELECT date_trunc('minute', now()) - interval '3 hours', 'images', 0, 0, 0, 0, "
        "array_fill(0, ARRAY[14]), array_fill(0, ARRAY[14]), 2"
    )
    # A worker that drained some jobs and now runs two long ones; another that left.
    # The demo app's job types, as a reader of the docs would have them (no qa.*).
    enqueue_many(
        [("demo.send_email", {"to": f"customer{n}@example.com"}) for n in range(20)],
        queue="email",
    )
    slow = [
        enqueue("demo.resize_image", {"image": n, "size": [4032, 3024], "seconds": 60}, queue=q)
        for n, q in ((881, "images"), (882, "images"), (883, "email"))
    ]
    worker = run_worker(["images", "email"], concurrency=4, heartbeat_interval=0.2)
    sql(
        "INSERT INTO queue_workers (id, host, pid, queues, concurrency, lease_seconds, "
        "version, running, started_at, last_seen_at, gone_at) VALUES ('batch-2:8812:9f3c1a', "
        "'batch-2', 8812, '[\"reports\"]', 2, 30, '0.1.0', 0, now() - interval '3 hours', "
        "now() - interval '14 minutes', now() - interval '14 minutes')"
    )
    wait_until(lambda: sql("SELECT running FROM queue_workers WHERE gone_at IS NULL") == [(3,)])

    # Narrow pages at twice the pixels: readable at the docs' text width (~740 px).
    page = login(browser, live_server, "viewer", width=1100, scale=2)
    page.goto(f"{live_server.url}/admin/django_pgqueue/workerrecord/")
    page.click("#toggle-nav-sidebar")  # more room for the table (the browser remembers)
    text = page.inner_text("#content-main")
    assert "1 worker alive (1 process), 1 gone." in text
    assert worker.worker.worker_id in text
    assert "batch-2:8812:9f3c1a" not in text  # folded away until asked for
    assert "3 / 4" in text
    for job in slow:
        assert page.locator(f"a[href$='/job/{job.id}/change/']").count() == 1
    page.click("text=Show gone workers (1)")
    assert "batch-2:8812:9f3c1a" in page.inner_text("#content-main")
    save_screenshot(page, tmp_path, "admin-workers.png")
    page.click(f"a[href$='/job/{slow[0].id}/change/']")
    page.wait_for_url(f"**/job/{slow[0].id}/change/")

    # Six hours asked for: by the time the page loads the data may span a minute more,
    # and the default window would then be 24 h.
    page.goto(f"{live_server.url}/admin/django_pgqueue/minutestats/?hours=6")
    # Per queue: jobs per minute, the backlog, the wait and the run time, each drawn.
    queues = page.locator("section.pgqueue-chart-row").count()
    assert queues >= 2
    drawn = read_charts(page)
    assert len(drawn) == 4 * queues
    by_title = {chart["title"]: chart for chart in drawn}
    for title in (
        "payments: jobs per minute",
        "payments: backlog (jobs due, not started)",
        "payments: wait from due to start",
        "payments: run time",
    ):
        chart = by_title[title]
        assert chart["points"] == 360, chart
        assert chart["known"] > 300, chart
        assert chart["canvas"] > 400, chart  # fills its box, not a sliver
    # Counts have whole-number ticks.
    assert by_title["payments: backlog (jobs due, not started)"]["ticks"] == [
        "0", "500", "1,000", "1,500"
    ]  # fmt: skip
    # A point alone in a long line (the images queue's sample of three hours back) is
    # marked; the live worker's samples at the end may add one more.
    lone = page.evaluate(
        """() => window.pgqueueCharts
            .filter((u) => u.root.querySelector('.u-title').textContent.endsWith('backlog '
                + '(jobs due, not started)'))
            .map((u) => u.series[1].points.filter(u, 1, true, null).length)"""
    )
    assert min(lone) == 0, lone  # the queues' lines of six hours: no point alone
    assert max(lone) in (1, 2), lone
    save_screenshot(page, tmp_path, "admin-charts.png")
    # The values of every series at the cursor, in the admin's one time format.
    chart = page.locator("[data-pgqueue-chart='0'] .u-over")
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    legend = page.inner_text("[data-pgqueue-chart='0'] .u-legend")
    assert " UTC" in legend, legend
    assert "completed" in legend, legend
    assert "failed" in legend, legend
    page.click("text=email")
    assert len(read_charts(page)) == 4
    page.context.close()
