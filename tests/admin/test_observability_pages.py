"""The Workers and Charts pages through Django's test client."""

from __future__ import annotations

import pytest
from django.urls import reverse

from django_pgqueue.observability import workers
from django_pgqueue.store import Store
from tests.admin.conftest import make_job, make_user
from tests.conftest import sql

pytestmark = pytest.mark.django_db

WORKERS = reverse("admin:django_pgqueue_workerrecord_changelist")
CHARTS = reverse("admin:django_pgqueue_minutestats_changelist")


def register(worker_id: str, running: int = 0) -> None:
    store = Store("default", "test")
    try:
        me = workers.Identity(worker_id, "web-1", 4242, ("payments", "email"), 8, 30.0, "0.1.0")
        workers.record_beat(store, me, running)
    finally:
        store.close()


def test_workers_page_lists_alive_and_gone_workers_with_their_jobs(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    register("web-1:4242:aa", running=1)
    register("web-2:77:bb")
    sql("UPDATE queue_workers SET gone_at = now() WHERE id = 'web-2:77:bb'")
    job_id = make_job("running", queue="payments", type="qa.noop")
    sql("UPDATE queue_job_state SET locked_by = 'web-1:4242:aa' WHERE job_id = %s", [job_id])
    page = client.get(WORKERS)
    assert page.status_code == 200
    html = page.content.decode()
    assert "1 alive, 1 gone" in html
    assert "web-1:4242:aa" in html
    assert "web-2:77:bb" in html
    assert reverse("admin:django_pgqueue_job_change", args=[job_id]) in html
    assert "payments, email" in html


def test_charts_page_draws_svg_from_the_rollup(client) -> None:
    client.force_login(make_user("viewer", "view_job"))
    sql(
        "INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead, "
        "wait_seconds_sum, wait_buckets) VALUES (date_trunc('minute', now()), 'payments', "
        "120, 3, 1, 10, '{5,10,20,30,40,10,5,3,1,0,0,0,0,0}')"
    )
    page = client.get(CHARTS, {"hours": 1})
    assert page.status_code == 200
    html = page.content.decode()
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="pgqueue-chart"') == 2
    assert "payments: jobs per minute" in html
    assert "120 completed, 4 failed attempts in the last 1 h" in html
    assert "<polyline" in html or "<circle" in html
    assert client.get(CHARTS, {"hours": "x", "queue": "nope"}).status_code == 200


def test_pages_need_a_view_permission(client) -> None:
    client.force_login(make_user("nobody"))
    assert client.get(WORKERS).status_code == 403
    assert client.get(CHARTS).status_code == 403
