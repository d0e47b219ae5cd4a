"""A real browser on the Batches page (see test_admin.py for the setup).

The members are moved as a worker moves them, by a worker's Store (claim, complete,
fail), so each batch is in a known state: one succeeded (its callbacks ran), one
discarded (a member died), one running. Set PGQUEUE_SCREENSHOTS=1 to refresh
docs/images/admin-batches.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_pgqueue import batch, enqueue_many, step
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.browser.test_workflows import advance
from tests.factories import OPERATOR_PERMISSIONS, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def callbacks(*events: str) -> dict[str, Any]:
    """A callback step for each event, on the "reports" queue."""
    return {
        event: step("demo.send_email", {"to": "ops@example.com", "event": event}, queue="reports")
        for event in events
    }


@pytest.fixture
def batches_in_every_state(stores: Any) -> dict[str, Any]:
    """Three batches, oldest first: succeeded, discarded, running."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), 5300000)")
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_batches', 'id'), 640)")
    store = stores()
    with batch(name="invoice-run-2026-11", **callbacks("on_success", "on_finish")) as invoices:
        enqueue_many([("demo.send_email", {"invoice": n}) for n in range(8)], queue="email")
    advance(store, "email", complete=8)
    advance(store, "reports", complete=2)

    with batch(name="import-suppliers", **callbacks("on_finish", "on_discard")) as imports:
        enqueue_many(
            [("shop.create_warehouse_ticket", {"n": n}) for n in range(5)], queue="imports"
        )
    advance(store, "imports", complete=3, fail=2)
    advance(store, "reports", complete=1)  # on_finish ran; on_discard runs

    with batch(name="thumbnails-spring", **callbacks("on_success", "on_discard")) as thumbs:
        enqueue_many([("demo.resize_image", {"image": n}) for n in range(12)], queue="images")
    advance(store, "images", complete=7, limit=9)  # 7 completed, 2 running, 3 pending
    return {"succeeded": invoices, "discarded": imports, "running": thumbs}


def test_operator_sees_the_batches_and_follows_a_callback(
    browser: Any,  # noqa: F811
    live_server: Any,
    batches_in_every_state: dict[str, Any],
    tmp_path: Path,
) -> None:
    runs = batches_in_every_state
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/batch/")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 3
    states = [rows.nth(n).locator(".field-state .pgqueue-status").inner_text() for n in range(3)]
    assert states == ["running", "discarded", "succeeded"]
    # The state badges are coloured as the Workflows pages colour a workflow's state.
    colours = [
        rows.nth(n)
        .locator(".field-state .pgqueue-status")
        .evaluate("el => getComputedStyle(el).backgroundColor")
        for n in range(3)
    ]
    assert colours == ["rgb(176, 125, 16)", "rgb(179, 38, 30)", "rgb(46, 125, 50)"]
    assert rows.nth(0).locator(".field-progress").inner_text().strip() == "7 / 12"
    assert rows.nth(0).locator(".field-members").inner_text() == "7 completed · 5 unfinished"
    assert rows.nth(1).locator(".field-members").inner_text() == "3 completed · 2 dead"
    assert page.locator(".pgqueue-bar").count() == 3
    callbacks_cell = rows.nth(1).locator(".field-callbacks")
    assert "on_finish completed" in callbacks_cell.inner_text()
    assert "on_discard running" in callbacks_cell.inner_text()
    save_screenshot(page, tmp_path, "admin-batches.png")

    # A callback's link opens its job's page.
    on_discard = runs["discarded"].callbacks["on_discard"]
    callbacks_cell.locator("a", has_text="on_discard").click()
    page.wait_for_url(f"**/job/{on_discard}/change/")
    assert "(step on_discard)" in page.inner_text("#content-main")

    # The callbacks' workflow page, and back to the batch.
    page.go_back()
    rows.nth(1).locator("a.pgqueue-batch-workflow").click()
    page.wait_for_url("**/workflow/*/change/")
    assert page.locator("svg.pgqueue-graph a.pgqueue-node").count() == 2
    page.click("a.pgqueue-workflow-batch")
    page.wait_for_url(f"**/batch/?id={runs['discarded'].id}")
    assert page.locator("#result_list tbody tr").count() == 1
    assert "import-suppliers" in page.inner_text("#result_list")
    page.context.close()
