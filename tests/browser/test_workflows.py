"""A real browser on the Workflows pages (see test_admin.py for the setup).

The steps are moved as a worker moves them, by a worker's Store (claim, complete,
fail), so each workflow is in a known state. Set PGQUEUE_SCREENSHOTS=1 to refresh
docs/images/admin-workflows.png and docs/images/admin-workflow.png.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from shop.tasks import charge_order, send_order_confirmation

from django_pgqueue import Workflow, chain, chord, group, step
from django_pgqueue.outcomes import Dead
from django_pgqueue.workflows import cancel_workflow
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.conftest import sql
from tests.factories import OPERATOR_PERMISSIONS, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DECLINED = Dead("PermanentFailure", "card declined by the issuer: do not retry", "")


def advance(store: Any, queue: str, complete: int, fail: int = 0, limit: int = 100) -> None:
    """Claim up to `limit` due jobs of `queue`: complete the first `complete`, fail the
    next `fail` for good, and leave the rest running."""
    for index, row in enumerate(store.claim(queue, limit, "web-1:4242:5e1f0a", 300)):
        if index < complete:
            result = json.dumps({"step_ok": row.job_id})
            assert store.complete([(row.job_id, row.lease_version, row.attempt_id, result)])
        elif index < complete + fail:
            assert store.fail(row.job_id, row.lease_version, row.attempt_id, DECLINED)


def age(workflow_id: int, minutes: int) -> None:
    """Move a workflow, its jobs and their attempts `minutes` into the past."""
    shift = {"id": workflow_id, "minutes": minutes}
    steps = "SELECT job_id FROM queue_workflow_steps WHERE workflow_id = %(id)s"
    past = "- make_interval(mins => %(minutes)s)"
    sql(f"UPDATE queue_workflows SET created_at = created_at {past} WHERE id = %(id)s", shift)
    sql(f"UPDATE queue_jobs SET created_at = created_at {past} WHERE id IN ({steps})", shift)
    sql(
        f"UPDATE queue_attempts SET started_at = started_at {past}, "
        f"finished_at = finished_at {past} WHERE job_id IN ({steps})",
        shift,
    )
    sql(
        f"UPDATE queue_job_state SET finished_at = finished_at {past} WHERE job_id IN ({steps})",
        shift,
    )


def order_workflow(order: int) -> Workflow:
    """An order's fulfilment: charge, reserve and wrap, then ship, then tell everyone."""
    flow = Workflow(f"order-{order}")
    flow.add("charge-card", step(charge_order, kwargs={"order_id": order}))
    flow.add(
        "reserve-stock", "shop.create_warehouse_ticket", {"order_id": order}, queue="warehouse"
    )
    flow.add(
        "gift-wrap-photo",
        "demo.resize_image",
        {"image": order, "size": [1200, 900]},
        queue="photos",
    )
    flow.add(
        "ship-order",
        "shop.create_warehouse_ticket",
        {"order_id": order, "ship": True},
        queue="warehouse",
        after=["charge-card", "reserve-stock", "gift-wrap-photo"],
    )
    flow.add(
        "confirm-order",
        step(send_order_confirmation, kwargs={"order_id": order}),
        after=["ship-order"],
    )
    flow.add(
        "notify-courier",
        "demo.send_email",
        {"to": "courier@example.com", "order": order},
        queue="email",
        after=["ship-order"],
    )
    return flow


@pytest.fixture
def workflows_in_every_state(stores: Any) -> dict[str, int]:
    """Five workflows, oldest first: finished, cancelled, failed, and two running."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), 4200000)")
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_workflows', 'id'), 1800)")
    store = stores()
    report = chain(
        *(
            step("demo.send_email", {"report": part}, name=part, queue="reports")
            for part in ("export", "aggregate", "render", "send")
        )
    ).enqueue(name="nightly-report")
    for _ in range(4):
        advance(store, "reports", complete=1)
    age(report.id, 190)

    catalog = group(
        *(
            step("demo.resize_image", {"image": n, "size": [800, 600]}, queue="imports")
            for n in range(6)
        )
    ).enqueue(name="import-catalog")
    cancel_workflow(catalog.id)
    age(catalog.id, 95)

    refund = order_workflow(7311).enqueue()
    advance(store, "payments", complete=0, fail=1)
    advance(store, "photos", complete=1)
    advance(store, "warehouse", complete=1)
    age(refund.id, 40)

    thumbnails = chord(
        group(
            *(
                step("demo.resize_image", {"image": 900 + n, "size": [4032, 3024]}, queue="images")
                for n in range(16)
            )
        ),
        step("demo.send_email", {"to": "studio@example.com"}, name="zip-and-mail", queue="email"),
    ).enqueue(name="thumbnails-batch-88")
    advance(store, "images", complete=10, limit=13)
    age(thumbnails.id, 6)

    order = order_workflow(7320).enqueue()
    advance(store, "payments", complete=1)
    advance(store, "warehouse", complete=0)  # reserve-stock runs; gift-wrap-photo is due
    age(order.id, 2)
    return {
        "finished": report.id,
        "cancelled": catalog.id,
        "failed": refund.id,
        "thumbnails": thumbnails.id,
        "order": order.id,
    }


def test_operator_sees_the_workflows_and_one_workflows_graph(
    browser: Any,  # noqa: F811
    live_server: Any,
    workflows_in_every_state: dict[str, int],
    tmp_path: Path,
) -> None:
    ids = workflows_in_every_state
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/workflow/")
    # With the sidebar open, the list stays within the page (it ran past the right edge).
    assert page.locator("#nav-sidebar").is_visible()
    table = page.locator(".pgqueue-workflows > table").bounding_box()
    content = page.locator("#content").bounding_box()
    assert table["x"] + table["width"] <= content["x"] + content["width"] + 1, (table, content)
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    page.screenshot(path=str(tmp_path / "workflows-sidebar-1400.png"))
    page.click("#toggle-nav-sidebar")  # more room for the table (the browser remembers)
    rows = page.locator(".pgqueue-workflows tbody tr")
    assert rows.count() == 5
    states = [rows.nth(n).locator(".pgqueue-status").inner_text() for n in range(5)]
    assert states == ["running", "running", "failed", "cancelled", "finished"]
    assert "10 / 17" in rows.nth(1).inner_text()
    assert "1 / 6" in rows.nth(0).inner_text()
    assert "2 completed · 1 dead · 3 cancelled" in rows.nth(2).inner_text()
    assert page.locator(".pgqueue-bar").count() == 5
    save_screenshot(page, tmp_path, "admin-workflows.png")

    page.click(".pgqueue-summary a:text-is('failed')")
    assert page.locator(".pgqueue-workflows tbody tr").count() == 1
    page.click("text=order-7311")
    page.wait_for_url(f"**/workflow/{ids['failed']}/change/")
    assert page.locator("svg.pgqueue-graph .pgqueue-node-dead").count() == 1
    assert page.locator("svg.pgqueue-graph .pgqueue-node-cancelled").count() == 3

    # A layer of 16 wraps into rows of 6 (kept in the test's directory only).
    page.goto(f"{live_server.url}/admin/django_pgqueue/workflow/{ids['thumbnails']}/change/")
    assert page.locator("svg.pgqueue-graph a.pgqueue-node").count() == 17
    page.screenshot(path=str(tmp_path / "wrapped.png"), full_page=True)

    page.goto(f"{live_server.url}/admin/django_pgqueue/workflow/{ids['order']}/change/")
    graph = page.locator("svg.pgqueue-graph")
    assert graph.locator("a.pgqueue-node").count() == 6
    for status, count in (("completed", 1), ("running", 1), ("pending", 1), ("waiting", 3)):
        assert graph.locator(f".pgqueue-node-{status}").count() == count, status
    assert graph.locator("path.pgqueue-edge").count() == 5
    assert page.locator("button", has_text="Cancel workflow").is_visible()
    # Each step's last attempt: how long it ran, what it returned.
    charge = page.locator(".pgqueue-steps tbody tr").first
    cells = charge.locator("td").all_inner_texts()
    assert cells[0] == "charge-card", cells
    assert cells[-2].startswith('{"step_ok": '), cells
    assert cells[-3].endswith(("ms", "s")), cells
    waiting = page.locator(".pgqueue-steps tbody tr").last
    assert waiting.locator("td").all_inner_texts()[-3:-1] == ["—", "—"]
    save_screenshot(page, tmp_path, "admin-workflow.png")

    # A node is a link to its job's page, which links back.
    graph.locator("a.pgqueue-node", has_text="reserve-stock").click()
    page.wait_for_url("**/job/*/change/")
    assert "(step reserve-stock)" in page.inner_text("#content-main")
    page.click(f"a[href$='/workflow/{ids['order']}/change/']")

    page.click("button:has-text('Cancel workflow')")
    page.wait_for_url(f"**/workflow/{ids['order']}/change/")
    assert "Cancelled 4 step(s)" in page.inner_text(".messagelist")
    assert graph.locator(".pgqueue-node-cancelled").count() == 4
    page.context.close()
