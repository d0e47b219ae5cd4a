"""The at-a-glance figures cost the same whatever the backlog: counts stop at a cap.

Each count of a queue and status stops at stats.COUNT_CAP (shown "at least": "5+"),
while the oldest due job's age stays exact, across priorities. Here the cap is made 5
so that a few jobs cross it.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from django_pgqueue import enqueue, stats
from tests.conftest import sql
from tests.factories import make_job

pytestmark = pytest.mark.django_db

CAP = 5


@pytest.fixture(autouse=True)
def small_cap(monkeypatch):
    monkeypatch.setattr(stats, "COUNT_CAP", CAP)


def backlog() -> int:
    """Eight due jobs in `deep` (the oldest at the lowest priority), two in `shallow`,
    six dead in `deep`; the id of the oldest."""
    for priority in (10, 10, 10, 5, 5, 5, 0):
        enqueue("qa.noop", queue="deep", priority=priority)
    oldest = enqueue("qa.noop", queue="deep", priority=-5).id
    sql(
        "UPDATE queue_job_state SET run_at = now() - interval '1 hour' WHERE job_id = %s",
        [oldest],
    )
    enqueue("qa.noop", queue="shallow")
    enqueue("qa.noop", queue="shallow")
    for _ in range(6):
        make_job("dead", queue="deep")
    return oldest


def test_counts_stop_at_the_cap_and_say_so():
    backlog()
    figures = {f.queue: f for f in stats.collect().queues}
    deep, shallow = figures["deep"], figures["shallow"]
    assert (deep.pending, deep.due, deep.dead) == (CAP, CAP, CAP)
    assert deep.capped == {"pending", "dead"}
    assert (deep.pending_capped, deep.due_capped, deep.dead_capped) == (True, True, True)
    assert not deep.cancelled_capped
    assert (shallow.pending, shallow.due, shallow.capped) == (2, 2, frozenset())
    assert stats.collect().totals.capped == {"pending", "dead"}


def test_the_oldest_due_age_is_exact_beyond_the_cap():
    backlog()
    deep = {f.queue: f for f in stats.collect().queues}["deep"]
    # The oldest job is the last in claim order (lowest priority), past the 5 counted.
    assert 3500 < deep.oldest_due_seconds < 7200


def test_an_exact_reading_counts_everything():
    backlog()
    deep = {f.queue: f for f in stats.collect(exact=True).queues}["deep"]
    assert (deep.pending, deep.due, deep.dead, deep.capped) == (8, 8, 6, frozenset())


def test_queue_stats_marks_a_capped_count_and_explains_the_mark(capsys):
    backlog()
    call_command("queue_stats")
    out = capsys.readouterr().out
    deep = next(line for line in out.splitlines() if line.startswith("deep"))
    assert deep.split()[1:3] == ["5+", "5+"]
    assert "+ at least: counting stops at 5 jobs per queue and status" in out
    call_command("queue_stats", "--json")
    data = json.loads(capsys.readouterr().out)
    by_queue = {q["queue"]: q for q in data["queues"]}
    assert by_queue["deep"]["capped"] == ["dead", "pending"]
    assert by_queue["shallow"]["capped"] == []


def test_the_admin_panel_marks_a_capped_count(admin_client):
    backlog()
    html = admin_client.get("/admin/django_pgqueue/job/").content.decode()
    assert 'state__status__exact=pending">5+</a>' in html
    assert "stopped at 5: there are at least that many" in html


def test_the_queues_page_marks_a_capped_count_of_an_uncontrolled_queue(admin_client):
    backlog()
    html = admin_client.get("/admin/django_pgqueue/queuecontrol/").content.decode()
    deep = html.split('data-queue="deep"', 1)[1].split("</tr>", 1)[0]
    assert "<td>5+</td>" in deep  # pending and dead both stopped at the cap
    shallow = html.split('data-queue="shallow"', 1)[1].split("</tr>", 1)[0]
    assert "<td>2</td>" in shallow
    assert "+" not in shallow
    assert "stopped at 5: there are at least that many" in html
