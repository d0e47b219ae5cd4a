"""A real browser on a fair queue's keys page: backlog and share per key, paginated."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import JobSpec, enqueue_many
from django_pgqueue.store.rows import ClaimRequest
from tests.browser.test_admin import (  # noqa: F401  (fixtures)
    PASSWORD,
    _fast_password_hashing,
    login,
    save_screenshot,
)
from tests.browser.test_admin import browser as browser  # a fixture
from tests.conftest import sql
from tests.factories import VIEWER_PERMISSIONS, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

QUEUES = "/admin/django_pgqueue/queuecontrol/"


def test_a_viewer_reads_the_keys_of_a_fair_queue(
    browser: Any, live_server: Any, tmp_path: Path, settings: Any, stores: Any
) -> None:
    settings.PGQUEUE = {
        **getattr(settings, "PGQUEUE", {}),
        "FAIR_QUEUES": {"imports": {"weights": {"tenant-a": 3}}},
    }
    enqueue_many([JobSpec("qa.noop", fairness_key="tenant-a") for _ in range(300)], queue="imports")
    enqueue_many([JobSpec("qa.noop", fairness_key="tenant-b") for _ in range(5)], queue="imports")
    later = [JobSpec("qa.noop", fairness_key="tenant-c", delay=3600) for _ in range(2)]
    enqueue_many(later, queue="imports")
    # More keys than a page: 60 tenants of one job each, after the three above.
    enqueue_many([JobSpec("qa.noop", fairness_key=f"x{n:02}") for n in range(60)], queue="imports")
    # Two claims of 8 jobs by the fair claim: running jobs, and the queue's recent starts.
    store = stores("fair-keys-page", fair_queues={"imports": {"tenant-a": 3}})
    for _ in range(2):
        store.claims.claim(None, ClaimRequest("imports", 8, "browser-worker", 600.0))
    started = Counter(
        key
        for (key,) in sql(
            "SELECT s.fair_key FROM queue_attempts AS a "
            "JOIN queue_job_state AS s ON s.job_id = a.job_id"
        )
    )
    assert sum(started.values()) == 16
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "viewer", width=1400)

    page.goto(f"{live_server.url}{QUEUES}")
    page.click(".pgqueue-fair-queues a:text-is('imports')")
    table = page.locator("#pgqueue-fair-keys")
    tenant_a = table.locator("tr[data-key='tenant-a']")
    assert tenant_a.locator("td.field-weight").inner_text() == "3"
    assert tenant_a.locator("td.field-running").inner_text() == str(started["tenant-a"])
    due = int(tenant_a.locator("td.field-due").inner_text())
    assert due == 300 - started["tenant-a"]
    assert tenant_a.locator("td.field-starts").inner_text() == str(started["tenant-a"])
    share = 100 * started["tenant-a"] / 16
    assert tenant_a.locator("td.field-share").inner_text().endswith(f"{share:.1f}%")
    tenant_c = table.locator("tr[data-key='tenant-c']")
    assert tenant_c.locator("td.field-due").inner_text() == "0"
    assert tenant_c.locator("td.field-later").inner_text() == "2"
    # The first page: 50 keys in key order; the rest on the next.
    first = table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert len(first) == 50, first
    assert first == sorted(first), first
    save_screenshot(page, tmp_path, "admin-fair-keys.png")
    page.click("a.pgqueue-next")
    # The rows are read once the next page is in: evaluate_all does not wait for them.
    page.wait_for_url("**after=**")
    table.locator("tbody tr").first.wait_for()
    rest = table.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.key)")
    assert rest, rest
    assert rest[0] > first[-1], rest
    assert len(first) + len(rest) <= 63, rest
    assert not page.locator("a.pgqueue-next").count()


def test_the_keys_page_refuses_a_queue_that_is_not_fair(
    browser: Any, live_server: Any, settings: Any
) -> None:
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "viewer", width=1400)
    response = page.goto(f"{live_server.url}{QUEUES}fair-keys/?queue=emails")
    assert response.status == 400
