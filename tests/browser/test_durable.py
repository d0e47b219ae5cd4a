"""A real browser on the job page of durable handlers: the steps each recorded, the
sleep or event it waits for (Playwright with Debian's chromium, as test_admin.py).

The jobs are run by a real worker: one parked on an event after an atomic step, a
sleep and a step; one asleep for an hour; one whose event came before it waited.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from django_pgqueue import emit_event, enqueue
from django_pgqueue.models import JobState
from tests.browser.test_admin import (  # noqa: F401 - fixtures
    PASSWORD,
    _fast_password_hashing,
    browser,
    login,
    save_screenshot,
)
from tests.factories import OPERATOR_PERMISSIONS, VIEWER_PERMISSIONS, make_user
from tests.integration.test_worker import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WORKER = {"poll_interval": 0.05, "sweep_interval": 0.2, "concurrency": 4}


def status(job_id: int) -> str:
    return JobState.objects.get(pk=job_id).status


@pytest.fixture
def durable_jobs(run_worker: Any) -> dict[str, int]:
    """A job parked on an event, one asleep for an hour, one that got its event at once."""
    emit_event("order:7302:paid", {"provider": "acme-pay", "amount": "42.00"})
    parked = enqueue(
        "qa.durable_five", {"key": "order:7301:paid", "timeout": 86_400, "nap": 0.2}, queue="dp"
    )
    asleep = enqueue("qa.durable_sleep", {"seconds": 3600}, queue="dp")
    delivered = enqueue("qa.durable_event", {"key": "order:7302:paid"}, queue="dp")
    run_worker(["dp"], **WORKER)
    wait_until(lambda: status(parked.id) == "waiting", timeout=120)
    wait_until(lambda: status(delivered.id) == "completed", timeout=120)
    wait_until(lambda: status(asleep.id) == "pending", timeout=120)
    return {"parked": parked.id, "asleep": asleep.id, "delivered": delivered.id}


def steps_of(page: Any) -> list[list[str]]:
    """The step table's rows as the browser shows them: [step, kind, status, result]."""
    rows = page.locator(".pgqueue-steps-table tbody tr")
    return [
        [rows.nth(n).locator("td").nth(c).inner_text() for c in range(4)]
        for n in range(rows.count())
    ]


def test_the_job_page_shows_a_durable_jobs_steps_and_what_it_waits_for(
    browser: Any,  # noqa: F811
    live_server: Any,
    durable_jobs: dict[str, int],
    tmp_path: Path,
) -> None:
    make_user("viewer", *VIEWER_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "viewer", width=1400)
    shown, attempts = {}, {}
    for name, job_id in durable_jobs.items():
        page.goto(f"{live_server.url}/admin/django_pgqueue/job/{job_id}/change/")
        table = page.locator(".pgqueue-steps-table")
        assert table.is_visible()
        # The table spans its section and stays within the page at 1,400 px.
        box, content = table.bounding_box(), page.locator("#content").bounding_box()
        assert box["x"] + box["width"] <= content["x"] + content["width"] + 1, (box, content)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        shown[name] = steps_of(page)
        attempts[name] = page.locator(".pgqueue-attempt-table").inner_text()
        # Its snoozed attempts say why they were given back, quietly: not as errors.
        if name != "delivered":
            assert page.locator(".pgqueue-attempt-table .pgqueue-given-back").count() >= 1
            assert page.locator(".pgqueue-attempt-table .pgqueue-error").count() == 0
        save_screenshot(page, tmp_path, f"durable-{name}-1400.png")

    parked = shown["parked"]
    assert [row[:3] for row in parked] == [
        ["a1", "atomic", "done"],
        ["nap", "sleep", "woke"],
        ["after-nap", "step", "done"],
        ["event:order:7301:paid", "event", "waiting"],
    ]
    assert parked[0][3].isdigit()  # the atomic step's effect's id
    assert parked[1][3].startswith("until 20")
    assert parked[2][3] == '"after-nap"'
    assert parked[3][3].startswith("for order:7301:paid, until 20")

    # The snooze says when the sleep ends the way the page shows every time.
    assert re.search(
        r"sleeping until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \('nap'\)", attempts["asleep"]
    )
    assert [row[:3] for row in shown["asleep"]] == [
        ["before", "step", "done"],
        ["nap", "sleep", "sleeping"],
    ]
    assert [row[:3] for row in shown["delivered"]] == [
        ["before", "step", "done"],
        ["event:order:7302:paid", "event", "delivered"],
        ["after", "step", "done"],
    ]
    assert json.loads(shown["delivered"][1][3]) == {"provider": "acme-pay", "amount": "42.00"}


def test_an_operator_runs_a_dead_job_again_from_a_step(
    browser: Any,  # noqa: F811
    live_server: Any,
    run_worker: Any,
    tmp_path: Path,
) -> None:
    # Five steps; the fourth raised on the job's only attempt: dead after s1 to s3.
    job = enqueue("qa.durable_fails_at", {"fail_at": 4}, queue="dr")
    run_worker(["dr"], burst=True, **WORKER).join(120)
    assert status(job.id) == "dead"
    make_user("operator", *OPERATOR_PERMISSIONS, password=PASSWORD)
    page = login(browser, live_server, "operator", width=1400)
    page.goto(f"{live_server.url}/admin/django_pgqueue/job/{job.id}/change/")
    links = page.locator(".pgqueue-steps-table a.pgqueue-run-again")
    assert links.count() == 3  # one per checkpoint
    save_screenshot(page, tmp_path, "durable-run-again-job-1400.png")

    page.locator(".pgqueue-steps-table tr", has_text="s2").locator("a.pgqueue-run-again").click()
    page.wait_for_selector(".pgqueue-run-again-steps")
    rows = page.locator(".pgqueue-run-again-steps tbody tr")
    assert [rows.nth(n).locator("td").nth(0).inner_text() for n in range(3)] == ["s1", "s2", "s3"]
    assert page.locator(".pgqueue-run-again-steps tr.pgqueue-dropped").count() == 2
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    save_screenshot(page, tmp_path, "durable-run-again-confirm-1400.png")

    page.click("input[type=submit][value='Yes, run again from s2']")
    page.wait_for_url(f"{live_server.url}/admin/django_pgqueue/job/{job.id}/change/")
    assert "Run again from 's2': 1 changed, 0 skipped." in page.locator(".messagelist").inner_text()
    # Pending again, its first step's checkpoint kept: the worker resumes at s2.
    assert [row[:3] for row in steps_of(page)] == [["s1", "step", "done"]]
    save_screenshot(page, tmp_path, "durable-run-again-done-1400.png")
    run_worker(["dr"], burst=True, **WORKER).join(120)
    assert status(job.id) == "completed"
    page.reload()
    assert [row[0] for row in steps_of(page)] == ["s1", "s2", "s3", "s4", "s5"]
    # A completed job is not offered it.
    assert page.locator("a.pgqueue-run-again").count() == 0
