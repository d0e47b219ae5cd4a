"""The admin's Charts page with queues on two databases: each database's rollup charted
on its own (``?database=``, kept in the page's links), read from its replica if it has one."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

CHARTS = reverse("admin:django_pgqueue_minutestats_changelist")


def rollup(alias: str, queue: str, completed: int) -> None:
    """One minute of `queue` finished work in `alias`'s rollup, as a heartbeat writes it."""
    with connections[alias].cursor() as cursor:
        cursor.execute(
            "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
            "wait_seconds_sum, wait_buckets) VALUES (date_trunc('minute', now()), %s, %s, "
            "0, 0, 1, '{1,0,0,0,0,0,0,0,0,0,0,0,0,0}')",
            [queue, completed],
        )


def text(client: Any, params: dict[str, str]) -> str:
    response = client.get(CHARTS, params)
    assert response.status_code == 200, response.content[:300]
    return response.content.decode()


def test_each_database_is_charted_on_its_own(operator_client: Any) -> None:
    rollup("default", "mail", 7)
    rollup("queues2", "q2.work", 11)

    html = text(operator_client, {"hours": "1"})
    assert "mail: jobs per minute" in html
    assert "q2.work" not in html.split('id="pgqueue-database-choice"')[1].split("</p>")[1]
    assert f'href="{CHARTS}?database=queues2"' in html

    html = text(operator_client, {"hours": "1", "database": "queues2"})
    assert "q2.work: jobs per minute" in html
    assert "11 completed" in html
    assert "mail: jobs per minute" not in html
    # The window and queue links keep the database.
    assert 'href="?database=queues2&amp;minutes=15"' in html
    assert 'href="?database=queues2&amp;minutes=60&amp;queue=q2.work"' in html


def test_a_bad_database_is_refused(operator_client: Any) -> None:
    assert operator_client.get(CHARTS, {"database": "nope"}).status_code == 400


def test_a_replica_is_read_and_its_lag_shown(
    operator_client: Any, settings: Any, replica_alias: str
) -> None:
    settings.PGQUEUE = {**settings.PGQUEUE, "READ_DATABASE": replica_alias}
    rollup("default", "mail", 7)
    with (
        CaptureQueriesContext(connections["default"]) as primary,
        CaptureQueriesContext(connections[replica_alias]) as replica,
    ):
        html = text(operator_client, {})
    assert any("queue_stats_minutely" in q["sql"] for q in replica.captured_queries)
    assert not any("queue_stats_minutely" in q["sql"] for q in primary.captured_queries)
    assert "mail: jobs per minute" in html
    assert "read from replica" in html
