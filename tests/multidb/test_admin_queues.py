"""The admin's Queues page with queues on two databases, and with a READ_DATABASE.

The other known queues are those of both servers, each naming its database; pausing a
queue writes its control row on the queue's own database; with a "replica" (an alias
on the primary's very database, conftest.py's `replica_alias`) the page reads from it
and says it is not a replica (its lag is none: it is a primary).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_pgqueue import enqueue

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

QUEUES = reverse("admin:django_pgqueue_queuecontrol_changelist")
SET_PAUSED = reverse("admin:django_pgqueue_queuecontrol_set_paused")


@pytest.fixture(autouse=True)
def routed(settings: Any) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": {"q2.*": "queues2"}}


def controls(alias: str) -> list[tuple[str, bool]]:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT queue, paused FROM queue_controls ORDER BY queue")
        return list(cursor.fetchall())


def other_rows(html: str) -> dict[str, tuple[str, str]]:
    """queue: (database, pending) of the other known queues' table."""
    others = html[html.index('id="pgqueue-other-queues"') :]
    found = re.findall(
        r'<tr data-queue="([^"]+)" data-database="([^"]+)">.*?<td>active</td>\s*<td>(\d+)',
        others,
        re.S,
    )
    return {queue: (database, pending) for queue, database, pending in found}


def test_the_queues_page_lists_both_databases_and_pauses_on_the_queues_own(
    operator_client: Any,
) -> None:
    enqueue("qa.noop", queue="mail")
    for _ in range(2):
        enqueue("qa.noop", queue="q2.bulk")

    html = operator_client.get(QUEUES).content.decode()
    assert other_rows(html) == {"mail": ("default", "1"), "q2.bulk": ("queues2", "2")}
    assert '<tr data-database="queues2">' in html  # the databases table

    operator_client.post(SET_PAUSED, {"queue": "q2.bulk", "paused": "1"})
    assert controls("queues2") == [("q2.bulk", True)]
    assert controls("default") == []
    html = operator_client.get(QUEUES).content.decode()
    assert set(other_rows(html)) == {"mail"}  # q2.bulk is controlled now
    listed = operator_client.get(QUEUES, {"database": "queues2"}).content.decode()
    assert "q2.bulk" in listed[: listed.index('id="pgqueue-other-queues"')]
    # Its edit page, opened from that list, reads the control on queues2.
    (link,) = re.findall(r'<a href="([^"]+/change/[^"]*)">q2\.bulk</a>', listed)
    edit = operator_client.get(link.replace("&amp;", "&"))
    assert edit.status_code == 200  # not the redirect of a control that is not there
    assert "q2.bulk" in edit.content.decode()
    assert operator_client.get(QUEUES, {"database": "nowhere"}).status_code == 400


def test_with_a_read_database_the_page_reads_from_it_and_writes_on_the_primary(
    settings: Any, operator_client: Any, replica_alias: str
) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "READ_DATABASE": replica_alias}
    enqueue("qa.noop", queue="mail")

    with CaptureQueriesContext(connections[replica_alias]) as replica:
        html = operator_client.get(QUEUES).content.decode()
    assert any("queue_job_state" in q["sql"] for q in replica.captured_queries)
    assert other_rows(html)["mail"] == ("default", "1")
    row = html[html.index('<tr data-database="default">') :]
    assert "<td>replica</td>" in row[:200]
    assert 'class="pgqueue-staleness">not a replica<' in row

    with CaptureQueriesContext(connections[replica_alias]) as replica:
        operator_client.post(SET_PAUSED, {"queue": "mail", "paused": "1"})
    assert controls("default") == [("mail", True)]
    assert not [q for q in replica.captured_queries if "queue_controls" in q["sql"]]


JOBS = reverse("admin:django_pgqueue_job_changelist")


def state_of(alias: str, job_id: int) -> str | None:
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])
        row = cursor.fetchone()
    return None if row is None else row[0]


def test_the_jobs_list_shows_one_database_and_cancels_on_it(operator_client: Any) -> None:
    here = enqueue("qa.noop", queue="mail").id
    there = enqueue("qa.noop", queue="q2.bulk").id

    default_list = operator_client.get(JOBS).content.decode()
    listed = operator_client.get(JOBS, {"database": "queues2"}).content.decode()
    assert "q2.bulk" in listed
    assert "q2.bulk" not in default_list  # not even among the queue filter's choices
    assert "?database=queues2" in listed  # the filter's choice, kept in the list's links

    operator_client.post(
        f"{JOBS}?database=queues2",
        {"action": "cancel", "pgqueue_ids": str(there), "post": "yes"},
    )
    assert state_of("queues2", there) == "cancelled"
    assert state_of("default", here) == "pending"
    assert state_of("default", there) != "cancelled"  # that id on the other database, if any

    page = reverse("admin:django_pgqueue_job_change", args=[there])
    assert "q2.bulk" in operator_client.get(page, {"database": "queues2"}).content.decode()
    assert operator_client.get(JOBS, {"database": "nowhere"}).status_code == 400
