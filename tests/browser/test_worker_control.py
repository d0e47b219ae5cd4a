"""A real browser asking a live `--processes 2` worker to drain, resume, change its
concurrency and stop, from the Workers page (see test_admin.py for the setup).

Set PGQUEUE_SCREENSHOTS=1 to refresh docs/images/admin-worker-control.png.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import enqueue
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.conftest import sql
from tests.factories import make_user
from tests.supervised import process_gone

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# A lease of 2 s: each process beats (reports, takes requests) every second.
FAST = (
    "--lease",
    "2",
    "--heartbeat-interval",
    "0.5",
    "--sweep-interval",
    "1",
    "--shutdown-grace",
    "1",
)
HANG_GUARD = 60.0


def reload_until(page: Any, text: str, timeout: float = HANG_GUARD) -> str:
    """Reload the page until its content shows `text` (a hang guard, not a bound)."""
    deadline = time.monotonic() + timeout
    while text not in (seen := page.inner_text("#content-main")):
        assert time.monotonic() < deadline, f"no {text!r} on the page:\n{seen}"
        time.sleep(0.3)
        page.reload()
    return seen


def reload_until_shown(page: Any, selector: str, timeout: float = HANG_GUARD) -> None:
    """Reload the page until it has an element matching `selector` (a hang guard)."""
    deadline = time.monotonic() + timeout
    while page.locator(selector).count() == 0:
        assert time.monotonic() < deadline, f"no {selector!r} on the page"
        time.sleep(0.3)
        page.reload()


def answers(action: str) -> int:
    return sql(
        "SELECT count(*) FROM queue_worker_requests WHERE action = %s AND answer IS NOT NULL",
        [action],
    )[0][0]


def wait_answers(action: str, count: int = 2) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while answers(action) < count:
        assert time.monotonic() < deadline, f"{action}: not answered by both processes"
        time.sleep(0.1)


def test_operator_drains_resumes_resizes_and_stops_a_worker(
    browser: Any,  # noqa: F811
    live_server: Any,
    supervised: Any,
    tmp_path: Path,
) -> None:
    make_user("boss", "view_job", "control_worker", password=PASSWORD)
    workers = supervised("web", "email", "--processes", "2", "--concurrency", "4", *FAST)
    children = workers.wait_children(2)
    running = enqueue(
        "demo.resize_image", {"image": 881, "size": [4032, 3024], "seconds": 120}, queue="web"
    )

    page = login(browser, live_server, "boss", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/workerrecord/")
    text = reload_until(page, "2 live processes")
    assert "1 worker alive (2 processes)" in text
    text = reload_until(page, "1 / 8")  # the long job runs; two processes of 4
    assert f"#{running.id}" in text
    row = page.locator("tr.pgqueue-worker")
    assert row.count() == 1
    assert page.locator("tr.pgqueue-process").count() == 2

    # Drain: both processes stop claiming; a job enqueued now waits.
    row.locator("button[value=drain]").click()
    assert "Asked" in page.inner_text(".messagelist")
    wait_answers("drain")
    # The answers come first; the worker's row says draining (and offers Resume) once
    # its processes' next beats reported it.
    reload_until_shown(page, "tr.pgqueue-worker button[value=resume]")
    assert "draining" in page.inner_text("tr.pgqueue-worker")
    waiting = enqueue("demo.send_email", {"to": "a@example.com"}, queue="email")

    # Concurrency: 3 threads each, shown as the worker's 6.
    row.locator("input[name=concurrency]").fill("3")
    row.locator("button[value=concurrency]").click()
    wait_answers("concurrency")
    reload_until(page, "1 / 6")
    page.click("#toggle-nav-sidebar")  # more room for the table (the browser remembers)
    save_screenshot(page, tmp_path, "admin-worker-control.png")
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [waiting.id]) == [
        ("pending",)
    ]

    # Resume, from the queue form: the waiting job runs.
    page.select_option("#pgqueue-ask-queue select[name=queue]", "email")
    page.click("#pgqueue-ask-queue button[value=resume]")
    wait_answers("resume")
    deadline = time.monotonic() + HANG_GUARD
    while sql("SELECT status FROM queue_job_state WHERE job_id = %s", [waiting.id]) != [
        ("completed",)
    ]:
        assert time.monotonic() < deadline, "the waiting job did not run after resume"
        time.sleep(0.1)

    # The live feed, filtered to one queue: a job run now shows up without a reload.
    feed = page.context.new_page()
    feed.goto(f"{live_server.url}/admin/django_pgqueue/workerrecord/events/?queue=email")
    assert f"#{waiting.id}" in feed.inner_text("#pgqueue-feed")
    later = enqueue("demo.send_email", {"to": "b@example.com"}, queue="email")
    enqueue("demo.resize_image", {"image": 2, "size": [8, 8], "seconds": 0}, queue="web")
    feed.wait_for_selector(f"tr.pgqueue-event-succeeded >> text=#{later.id}")
    assert "demo.resize_image" not in feed.inner_text("#pgqueue-feed")
    save_screenshot(feed, tmp_path, "admin-job-events.png")
    feed.close()

    # Stop: both children stop, none restarts, the supervisor exits 0; the page says gone.
    page.reload()
    page.locator("tr.pgqueue-worker button[value=stop]").click()
    wait_answers("stop")
    code, output = workers.wait(HANG_GUARD)
    assert code == 0, output
    assert all(process_gone(child.pid) for child in children.values())
    reload_until(page, "0 workers alive")
    page.click("text=Show gone workers (1)")
    text = page.inner_text("#content-main")
    assert "gone" in text
    requests = page.inner_text("#pgqueue-requests")
    assert "boss (admin)" in requests
    assert "stopping: no more claims" in requests
    page.context.close()
