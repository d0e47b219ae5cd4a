"""A real browser (headless Chromium, driven by Playwright) operating the admin.

Uses Debian's /usr/bin/chromium, never a browser downloaded by Playwright. The dead job
is made by a real worker running a handler that fails permanently, so the page shows
a real traceback. Set PGQUEUE_SCREENSHOTS=1 to refresh the two screenshots in
docs/images/ (otherwise they are written to the test's temporary directory only).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.registry import registry
from tests.factories import (
    OPERATOR_PERMISSIONS,
    VIEWER_PERMISSIONS,
    make_job,
    make_user,
    state,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium package")
    pytest.skip("chromium not found (apt-get install chromium); CI always runs this test")


@pytest.fixture(scope="module")
def browser(django_db_setup: None) -> Iterator[Any]:
    """One headless Chromium for the module, started after the test database exists."""
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    # Playwright's sync API keeps an asyncio loop in this thread while it runs. The
    # test's ORM calls (and the database flush between tests) are still plain
    # synchronous code, so Django's guard against ORM calls from async code does not
    # apply to them.
    with pytest.MonkeyPatch.context() as patch, sync_playwright() as playwright:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        yield browser
        browser.close()


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Logging in through the browser checks a real password: a fast hasher keeps it quick.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def login(
    browser: Any, live_server: Any, username: str, width: int = 1600, scale: float = 1
) -> Any:
    context = browser.new_context(
        viewport={"width": width, "height": 900}, device_scale_factor=scale
    )
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    return page


def save_screenshot(page: Any, tmp_path: Path, name: str, clip: dict | None = None) -> Path:
    target = tmp_path / name
    page.screenshot(path=str(target), full_page=True, clip=clip)
    assert target.stat().st_size > 10_000
    if os.environ.get("PGQUEUE_SCREENSHOTS"):
        docs = ROOT / "docs" / "images"
        docs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(target, docs / name)
    return target


@pytest.fixture
def queue_with_a_dead_job(run_worker: Any) -> dict[str, int]:
    """A small realistic queue: completed, retrying, scheduled, running and dead jobs.

    Only the demo and shop apps' job types: the screenshots in docs/ are made from it.
    Job ids start at 4,200,001, seven digits as in a queue that has run a while, so the
    list's width is measured with realistic ids.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), 4200000)")
    enqueue_many(
        [
            ("demo.charge_card", {"order": 7300 + n, "amount": f"{n * 7 + 12}.00", "card": "ok"})
            for n in range(5)
        ],
        queue="payments",
    )
    enqueue(
        "demo.charge_card", {"order": 7310, "amount": "89.00", "card": "broken"}, queue="payments"
    )
    dead = enqueue(
        "demo.charge_card",
        {"order": 7311, "amount": "240.00", "card": "declined"},
        queue="payments",
    )
    other_dead = enqueue(
        "demo.charge_card", {"order": 7312, "amount": "35.50", "card": "declined"}, queue="payments"
    )
    enqueue("demo.resize_image", {"image": 991, "size": [4032, 3024]}, queue="images")
    enqueue("demo.send_email", {"to": "ana@example.com", "flaky": 1}, queue="email")
    run_worker(["payments", "images", "email"], burst=True).join()
    enqueue(
        "shop.create_warehouse_ticket",
        {"order_id": 7313},
        queue="warehouse",
        delay=3600,
        priority=10,
    )
    enqueue_many(
        [("demo.send_email", {"to": f"customer{n}@example.com"}) for n in range(3)],
        queue="email",
    )
    make_job(
        "running",
        queue="images",
        type="demo.resize_image",
        payload={"image": 992, "size": [800, 600]},
    )
    assert state(dead.id)["status"] == "dead"
    assert state(other_dead.id)["status"] == "dead"
    return {"dead": dead.id, "other_dead": other_dead.id}


@pytest.fixture
def realistic_types_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offer only the demo and shop apps' job types in the type filter (not qa.* or bench.*)."""
    registry.autodiscover()
    shown = {
        name: handler
        for name, handler in registry._handlers.items()
        if name.startswith(("demo.", "shop."))
    }
    monkeypatch.setattr(registry, "_handlers", shown)


def test_operator_reads_a_dead_job_and_retries_it(
    browser: Any,
    live_server: Any,
    queue_with_a_dead_job: dict[str, int],
    realistic_types_only: None,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    dead = queue_with_a_dead_job["dead"]
    before = state(dead)
    # Narrow pages at twice the pixels: the screenshots stay readable at the width of
    # the documentation's text column (about 740 px).
    page = login(browser, live_server, "operator", width=1100, scale=2)

    # The jobs list, with its figures, as the operator first sees it.
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/")
    page.click("#toggle-nav-sidebar")  # more room for the tables (the browser remembers)
    assert page.locator(".pgqueue-glance").is_visible()
    assert "payments" in page.inner_text(".pgqueue-glance")
    # The figures and the list, without the filters beside them.
    content = page.locator("#content").bounding_box()
    right = max(
        box["x"] + box["width"]
        for box in (
            page.locator(".pgqueue-glance").bounding_box(),
            page.locator("#changelist-form").bounding_box(),
        )
    )
    bottom = page.locator("#changelist-form").bounding_box()
    clip = {
        "x": content["x"] - 8,
        "y": 0,
        "width": right - content["x"] + 16,
        "height": bottom["y"] + bottom["height"] + 8,
    }
    save_screenshot(page, tmp_path, "admin-jobs-list.png", clip=clip)

    # Dead jobs, newest first; open this one and read why it died.
    page.click("text=Dead jobs, newest first")
    page.click(f"#result_list a[href$='/deadjob/{dead}/change/']")
    error = page.inner_text(".field-last_error_full pre")
    assert "PermanentFailure: card declined by the issuer" in error
    # The traceback that killed the job is open at once.
    traceback = page.inner_text(".pgqueue-traceback[open] pre")
    assert "Traceback (most recent call last)" in traceback
    assert "raise PermanentFailure" in traceback
    assert '"order": 7311' in page.inner_text(".field-payload_pretty pre")
    page.set_viewport_size({"width": 1040, "height": 900})
    save_screenshot(page, tmp_path, "admin-dead-job.png")
    page.set_viewport_size({"width": 1100, "height": 900})

    # Retry now, from the job's own page, through the confirmation page.
    page.select_option("select[name='CHANGE_FORM-action']", "retry_now")
    page.click("#content-main .actions button[type=submit]")
    page.wait_for_selector("text=Retry now: are you sure?")
    assert "1 will change, 0 will be skipped" in page.inner_text("#content-main")
    page.click("input[type=submit][value='Yes, retry now']")
    page.wait_for_url(f"**/admin/django_pgqueue/job/{dead}/change/")
    assert page.inner_text(".messagelist") == "Retry now: 1 changed, 0 skipped."

    after = state(dead)
    assert after["status"] == "pending"
    assert after["attempts"] == 0  # a fresh attempt budget
    assert after["max_attempts"] == before["max_attempts"]
    assert after["due"] is True
    assert after["finished_at"] is None
    assert after["lease_version"] == before["lease_version"] + 1
    with connection.cursor() as cursor:  # the failed attempt stays in the history
        cursor.execute("SELECT status FROM queue_attempts WHERE job_id = %s", [dead])
        assert cursor.fetchall() == [("failed",)]
    page.context.close()


# Widths of the list's scrolling box and of each column, as the browser laid them out.
MEASURE_LIST = """() => {
    const box = document.querySelector('#changelist .results');
    const columns = {};
    for (const th of box.querySelectorAll('thead th')) {
        const text = th.querySelector('.text') || th;
        columns[th.className.split(' ').find(c => c.startsWith('column-')) || 'checkbox'] = {
            width: th.getBoundingClientRect().width,
            clipped: text.scrollWidth > text.clientWidth + 1,
        };
    }
    return {
        scroll: box.scrollWidth,
        client: box.clientWidth,
        page: document.documentElement.scrollWidth,
        viewport: document.documentElement.clientWidth,
        columns: columns,
    };
}"""


# Each row's height, and how many lines each cell's text runs to (its text's line boxes).
MEASURE_ROWS = """() => {
    const rows = [];
    for (const tr of document.querySelectorAll('#result_list tbody tr')) {
        const cells = {};
        for (const td of tr.querySelectorAll('td, th')) {
            const name = [...td.classList].find(c => c.startsWith('field-')) || 'checkbox';
            const range = document.createRange();
            range.selectNodeContents(td);
            // A new line starts where a box begins below the middle of the one before.
            const boxes = [...range.getClientRects()].filter(r => r.width && r.height);
            boxes.sort((a, b) => a.top - b.top);
            let lines = boxes.length ? 1 : 0;
            for (let i = 1; i < boxes.length; i++) {
                if (boxes[i].top > boxes[i - 1].top + boxes[i - 1].height / 2) lines++;
            }
            cells[name] = lines;
        }
        rows.push({height: tr.getBoundingClientRect().height, lines: cells});
    }
    return rows;
}"""
# Whether `word` appears whole on one line in the cells of `selector` (not broken inside).
WORD_ON_ONE_LINE = """([selector, word]) => {
    const found = [];
    for (const cell of document.querySelectorAll(selector)) {
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.textContent.indexOf(word);
            if (at < 0) continue;
            const range = document.createRange();
            range.setStart(node, at);
            range.setEnd(node, at + word.length);
            const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
            found.push(tops.size);
        }
    }
    return found;
}"""


@pytest.mark.parametrize("width", [1366, 1400, 1440])
def test_the_lists_fit_a_laptop_screen_with_the_sidebar_open(
    browser: Any,
    live_server: Any,
    queue_with_a_dead_job: dict[str, int],
    width: int,
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=width)
    for model, widest in (("job", "column-last_error_short"), ("deadjob", "column-final_error")):
        page.goto(f"{live_server.url}/admin/django_pgqueue/{model}/")
        assert page.locator("#nav-sidebar").is_visible()  # open, as Django starts it
        page.screenshot(path=str(tmp_path / f"{model}-list-{width}.png"))
        layout = page.evaluate(MEASURE_LIST)
        # Every column is on screen: nothing scrolls sideways, in the list or the page.
        assert layout["scroll"] <= layout["client"], (model, str(layout))
        assert layout["page"] <= layout["viewport"], (model, str(layout))
        clipped = [name for name, column in layout["columns"].items() if column["clipped"]]
        assert clipped == [], (model, str(layout))
        # The error keeps a column of its own (6em and more; its whole text is the
        # tooltip, and the job's page shows it).
        assert layout["columns"][widest]["width"] >= 78, (model, str(layout))
    # The jobs list: one line per job, with the current attempt's start, length, worker.
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/")
    layout = page.evaluate(MEASURE_LIST)
    for name in ("column-started_column", "column-duration_column", "column-worker_column"):
        assert name in layout["columns"], str(layout)
    rows = page.evaluate(MEASURE_ROWS)
    assert len(rows) == 15, rows
    for row in rows:
        assert row["height"] <= 36, row
        assert set(row["lines"].values()) <= {0, 1}, row
    running = page.locator("#result_list tbody tr", has_text="running")
    assert running.locator("td.field-worker_column").inner_text() == "worker-a"
    assert running.locator("td.field-started_column").inner_text().endswith("ago")
    # The dead jobs' final error breaks between words, never inside one.
    page.goto(f"{live_server.url}/admin/django_pgqueue/deadjob/")
    lines = page.evaluate(WORD_ON_ONE_LINE, ["td.field-final_error", "PermanentFailure"])
    assert lines, lines
    assert set(lines) == {1}, lines
    # A dead job's attempts: the error is the class without its module path, between
    # words only, and the table stays inside its panel.
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/{queue_with_a_dead_job['dead']}/change/")
    error = page.inner_text("tr.pgqueue-attempt td.field-error")
    assert error.startswith("PermanentFailure: card declined"), error
    for word in ("PermanentFailure:", "declined", "issuer"):
        lines = page.evaluate(WORD_ON_ONE_LINE, ["tr.pgqueue-attempt td.field-error", word])
        assert lines == [1], (word, lines)
    table = page.locator("table.pgqueue-attempt-table").bounding_box()
    panel = page.locator(".pgqueue-attempts-group fieldset").bounding_box()
    assert table["x"] + table["width"] <= panel["x"] + panel["width"] + 1, (table, panel)
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    page.screenshot(path=str(tmp_path / f"dead-job-attempts-{width}.png"), full_page=True)
    # With the sidebar closed the error gets the room it gave up.
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/")
    page.click("#toggle-nav-sidebar")
    layout = page.evaluate(MEASURE_LIST)
    assert layout["columns"]["column-last_error_short"]["width"] >= 250, str(layout)
    page.click("#toggle-nav-sidebar")  # as it was, for the next test's context
    page.context.close()


def test_user_without_the_permission_cannot_retry(
    browser: Any, live_server: Any, queue_with_a_dead_job: dict[str, int]
) -> None:
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    dead = queue_with_a_dead_job["other_dead"]
    before = state(dead)
    page = login(browser, live_server, "viewer")

    page.goto(f"{live_server.url}/admin/django_pgqueue/deadjob/{dead}/change/")
    assert "PermanentFailure" in page.inner_text(".field-last_error_full pre")
    assert page.locator("select[name='CHANGE_FORM-action']").count() == 0
    page.goto(f"{live_server.url}/admin/django_pgqueue/deadjob/")
    assert page.locator("option[value='retry_now']").count() == 0

    # A POST crafted with a valid session and CSRF token is refused all the same.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(
        f"{live_server.url}/admin/django_pgqueue/deadjob/",
        form={
            "csrfmiddlewaretoken": token,
            "action": "retry_now",
            "_selected_action": str(dead),
            "post": "yes",
        },
    )
    assert response.status == 403
    assert state(dead) == before
    page.context.close()
