"""The admin's Workers page with queues on two databases: one table of the workers of
both (each registered on its queues' database), a running job linked on its database,
and a database out of reach named rather than failing the page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.urls import reverse

from django_pgqueue import enqueue
from tests.integration.test_worker import wait_until

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])

WORKERS = reverse("admin:django_pgqueue_workerrecord_changelist")


def worker_rows(html: str) -> dict[str, str]:
    """worker id: database of the page's workers table."""
    return dict(re.findall(r'data-worker="([^"]+)" data-database="([^"]+)"', html))


def test_the_workers_of_both_databases_stand_in_one_table(
    operator_client: Any, run_worker: Any
) -> None:
    held = enqueue("qa.outcome", {"do": "hang", "seconds": 60}, queue="q2.work")
    there = run_worker(["q2.work"], worker_id="on-queues2")
    here = run_worker(["mail"], worker_id="on-default")
    link = reverse("admin:django_pgqueue_job_change", args=[held.id]) + "?database=queues2"

    def page() -> str:
        return operator_client.get(WORKERS).content.decode()

    wait_until(lambda: link in page(), timeout=120)  # the held job, linked on queues2
    html = page()
    assert worker_rows(html) == {"on-queues2": "queues2", "on-default": "default"}
    assert '<tr data-database="queues2">' in html  # the databases table
    assert there.worker.config.database == "queues2"
    assert here.worker.config.database == "default"
    # The link opens the job where it lives.
    assert f"#{held.id}" in operator_client.get(link).content.decode()


def test_a_database_out_of_reach_is_named_and_the_others_listed(
    operator_client: Any, settings: Any, down_alias: str, run_worker: Any
) -> None:
    settings.PGQUEUE = {
        **settings.PGQUEUE,
        "QUEUE_DATABASES": {"q2.*": "queues2", "gone.*": down_alias},
    }
    run_worker(["q2.work"], worker_id="on-queues2")
    wait_until(lambda: "on-queues2" in operator_client.get(WORKERS).content.decode(), timeout=120)
    response = operator_client.get(WORKERS)
    assert response.status_code == 200
    html = response.content.decode()
    down = html[html.index('<tr data-database="down">') :]
    assert "not read:" in down[: down.index("</tr>")]
    assert worker_rows(html) == {"on-queues2": "queues2"}
