"""A real browser on the Held sequences page (see test_admin.py for the setup).

Two sequences are held by a dead job each, a third runs; the operator sees the held
ones with what holds them and how much waits, releases one, and its next job is due.
Set PGQUEUE_SCREENSHOTS=1 to refresh docs/images/admin-held-sequences.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import enqueue
from django_pgqueue.outcomes import Dead
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.conftest import sql
from tests.factories import OPERATOR_PERMISSIONS, VIEWER_PERMISSIONS, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = "web-1:4242:5e1f0a"


def hold(store: Any, queue: str, key: str, jobs: int, error: str) -> list[int]:
    """A sequence of `jobs` jobs whose first dies: its id first, then the waiting ones."""
    ids = [
        enqueue("shop.sync_stock", {"customer": key, "n": n}, queue=queue, sequence=key).id
        for n in range(jobs)
    ]
    (row,) = store.claim(queue, 1, WORKER, 300)
    assert store.fail(row.job_id, row.lease_version, row.attempt_id, Dead("LedgerLocked", error))
    return ids


@pytest.fixture
def held(stores: Any) -> dict[str, list[int]]:
    store = stores()
    return {
        "customer-42": hold(store, "billing", "customer-42", 4, "the ledger is locked"),
        "customer-7": hold(store, "billing", "customer-7", 2, "card declined by the issuer"),
        # Running, not held: not listed.
        "customer-9": [enqueue("shop.sync_stock", queue="billing", sequence="customer-9").id],
    }


def test_operator_sees_the_held_sequences_and_releases_one(
    browser: Any,  # noqa: F811
    live_server: Any,
    held: dict[str, list[int]],
    tmp_path: Path,
) -> None:
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/sequence/")
    assert page.locator("h1").inner_text() == "Held sequences"
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    first = rows.nth(0)
    assert first.locator(".field-sequence").inner_text() == "customer-42"
    assert f"#{held['customer-42'][0]}" in first.locator(".field-head").inner_text()
    assert "the ledger is locked" in first.locator(".field-error_message").inner_text()
    assert first.locator(".field-waiting_jobs").inner_text() == "3"
    assert rows.nth(1).locator(".field-waiting_jobs").inner_text() == "1"
    save_screenshot(page, tmp_path, "admin-held-sequences.png")

    first.locator("input.action-select").check()
    page.select_option("select[name=action]", "release")
    page.click("button[name=index]")
    assert "Released 1 sequence(s): customer-42" in page.inner_text(".messagelist")
    assert page.locator("#result_list tbody tr").count() == 1
    dead, following, *rest = held["customer-42"]
    states = dict(sql("SELECT job_id, status FROM queue_job_state"))
    assert (states[dead], states[following]) == ("dead", "pending")
    assert {states[job] for job in rest} == {"waiting"}

    # The head's link opens its job page.
    page.locator("#result_list .field-head a").click()
    page.wait_for_url(f"**/job/{held['customer-7'][0]}/change/")
    page.context.close()


def test_a_viewer_sees_the_page_without_the_release_action(
    browser: Any,  # noqa: F811
    live_server: Any,
    held: dict[str, list[int]],
) -> None:
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "viewer", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/sequence/")
    assert page.locator("#result_list tbody tr").count() == 2
    assert page.locator("select[name=action] option[value=release]").count() == 0
    page.context.close()
