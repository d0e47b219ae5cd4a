"""The jobs list through Django's test client: its attempt columns, its search, and what
a running job an operator cancelled says.

The attempt columns come from one query per page whatever its rows; the search finds a
type by its beginning through the known types and the type index, and a payload's text
among the newest jobs the filters select only (a bounded read, however large the table).
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import actions, enqueue
from django_pgqueue.admin import jobs as admin_jobs
from tests.conftest import sql
from tests.factories import make_job

pytestmark = pytest.mark.django_db

JOBS = reverse("admin:django_pgqueue_job_changelist")


def listed_ids(response) -> list[int]:
    return [obj.pk for obj in response.context["cl"].result_list]


def cells(html: str, name: str) -> list[str]:
    """The text of each row's cell of the column `name`, tags dropped."""
    found = re.findall(rf'<td class="field-{name}">(.*?)</td>', html, re.S)
    return [re.sub(r"<[^>]+>", "", cell).strip() for cell in found]


def test_the_list_shows_the_last_attempts_start_length_and_worker(operator_client):
    done = make_job("completed", queue="mail")
    running = make_job("running", queue="mail")
    waiting = make_job("pending", queue="mail")
    sql("UPDATE queue_attempts SET worker_id = 'web-7:4242:ab12', started_at = now() - "
        "interval '90 seconds', finished_at = now() - interval '88.5 seconds' WHERE job_id = %s",
        [done])  # fmt: skip
    sql("UPDATE queue_attempts SET worker_id = 'web-8:77:cd34', started_at = now() - "
        "interval '12 seconds' WHERE job_id = %s", [running])  # fmt: skip
    sql("UPDATE queue_job_state SET run_at = now() + interval '59 minutes 30 seconds' "
        "WHERE job_id = %s", [waiting])  # fmt: skip
    html = operator_client.get(JOBS).content.decode()
    # Newest first: the pending job, the running one, the completed one.
    assert cells(html, "worker_column") == ["—", "web-8:77:cd34", "web-7:4242:ab12"]
    due, started, done_started = cells(html, "started_column")
    assert (due, done_started) == ("due in 59m", "1m ago")
    assert re.fullmatch(r"1[2-9]s ago", started), started  # 12 s before the request
    took = cells(html, "duration_column")
    assert took[0] == "—"
    assert re.fullmatch(r"1[2-9]s", took[1]), took  # so far, by the database's clock
    assert took[2] == "1.5s"
    # The start as a point in time, in the one format, is each cell's tooltip.
    assert re.search(r'title="\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC">1[2-9]s ago', html)


def test_the_attempt_columns_cost_one_query_whatever_the_rows(operator_client):
    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert operator_client.get(JOBS).status_code == 200
        return len(queries)

    make_job("completed")
    few = count()
    for _ in range(20):
        make_job("dead", queue="mail")
        make_job("running", queue="billing")
    assert count() == few
    attempts = [q["sql"] for q in queries_of(operator_client) if "queue_attempts" in q["sql"]]
    assert len(attempts) == 1, attempts
    assert "DISTINCT ON" in attempts[0]


def queries_of(client) -> list[dict]:
    with CaptureQueriesContext(connection) as queries:
        client.get(JOBS)
    return queries.captured_queries


def test_a_running_job_an_operator_cancelled_says_cancel_requested(operator_client):
    running = make_job("running", queue="mail")
    other = make_job("running", queue="mail")
    report = actions.cancel([running])
    assert report.requested == [running]
    html = operator_client.get(JOBS).content.decode()
    statuses = dict(zip(listed_ids_of(html), cells(html, "status_column"), strict=True))
    assert statuses[running].startswith("running cancel requested")
    assert "cancel requested" not in statuses[other]
    page = operator_client.get(reverse("admin:django_pgqueue_job_change", args=[running]))
    assert "cancel requested" in page.content.decode()


def listed_ids_of(html: str) -> list[int]:
    return [int(found) for found in re.findall(r'name="_selected_action" value="(\d+)"', html)]


# -- search ------------------------------------------------------------------------------


def search(client, term: str, query: str = "") -> list[int]:
    response = client.get(JOBS + "?q=" + term + query)
    assert response.status_code == 200, term
    return listed_ids(response)


def test_search_finds_a_type_by_its_beginning(operator_client):
    charge = make_job("pending", queue="payments", type="demo.charge_card")
    email = make_job("completed", queue="email", type="demo.send_email")
    other = make_job("pending", queue="ops", type="qa.echo")
    assert search(operator_client, "demo.") == [email, charge]
    assert search(operator_client, "demo.send") == [email]
    assert search(operator_client, "qa.echo") == [other]
    # Exact id, idempotency key and type still work; a prefix of nothing finds nothing.
    assert search(operator_client, str(charge)) == [charge]
    assert search(operator_client, "nothing.here") == []


def test_search_finds_a_payload_value(operator_client):
    ana = make_job("pending", queue="email", type="demo.send_email",
                   payload={"to": "ana@example.com", "order": 7311})  # fmt: skip
    bob = make_job("dead", queue="email", type="demo.send_email",
                   payload={"to": "bob@example.com", "order": 7312})  # fmt: skip
    assert search(operator_client, "ana@example.com") == [ana]
    assert search(operator_client, "ANA@EXAMPLE") == [ana]  # case is ignored
    assert search(operator_client, "7312") == [bob]
    # Several terms: each must match (the payload's and the type's here).
    assert search(operator_client, "demo.send 7311") == [ana]
    # The filters apply first.
    assert search(operator_client, "example.com", "&state__status__exact=dead") == [bob]


def test_a_payload_is_searched_among_the_newest_jobs_only(operator_client, monkeypatch):
    old = make_job("completed", queue="archive", payload={"ticket": "TCK-0001"})
    for _ in range(3):
        make_job("completed", payload={"ticket": "other"})
    monkeypatch.setattr(admin_jobs, "PAYLOAD_SEARCH_ROWS", 3)
    # The old job lies beyond the newest 3: its payload is not read.
    assert search(operator_client, "TCK-0001") == []
    # A filter that selects it brings it within the newest 3 it selects.
    assert search(operator_client, "TCK-0001", "&queue=archive") == [old]
    monkeypatch.setattr(admin_jobs, "PAYLOAD_SEARCH_ROWS", 4)
    assert search(operator_client, "TCK-0001") == [old]
    # Its id, type and key are found at any age (through their indexes).
    monkeypatch.setattr(admin_jobs, "PAYLOAD_SEARCH_ROWS", 1)
    assert search(operator_client, str(old)) == [old]


def test_search_reads_the_payload_of_a_bounded_window(operator_client):
    for n in range(5):
        enqueue("qa.noop", {"n": n}, queue="ops")
    with CaptureQueriesContext(connection) as queries:
        search(operator_client, "needle")
    payload_reads = [q["sql"] for q in queries.captured_queries if "payload" in q["sql"]
                     and "LIKE" in q["sql"].upper()]  # fmt: skip
    assert len(payload_reads) == 1, payload_reads
    # The rows it reads are the newest PAYLOAD_SEARCH_ROWS: a range of ids from the
    # window's oldest, found by a walk of the ids that stops there.
    walks = [q["sql"] for q in queries.captured_queries
             if f"OFFSET {admin_jobs.PAYLOAD_SEARCH_ROWS - 1}" in q["sql"]]  # fmt: skip
    assert len(walks) == 1, walks
