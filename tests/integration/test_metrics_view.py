"""The metrics view answers allowed callers only, and scrapes share one reading."""

from __future__ import annotations

import threading

import pytest
from django.contrib.auth.models import Permission, User

from django_pgqueue import stats
from django_pgqueue.conf import get_settings
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.management.commands.run_queue_worker import Command
from django_pgqueue.metrics import collector

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.integration.metrics_urls")]

TOKEN = "s3cret-token-for-prometheus"


@pytest.fixture(autouse=True)
def fresh_readings():
    collector._readings.clear()
    yield
    collector._readings.clear()


def test_an_anonymous_scrape_is_refused(client, settings):
    response = client.get("/metrics")
    assert response.status_code == 401
    assert b"pgqueue_jobs" not in response.content
    settings.PGQUEUE = {"METRICS_TOKEN": TOKEN}
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_a_scraper_with_the_token_is_served_and_a_wrong_one_is_not(client, settings):
    settings.PGQUEUE = {"METRICS_TOKEN": TOKEN}
    good = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert good.status_code == 200
    assert b"pgqueue_database_up 1.0" in good.content
    wrong = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}x"})
    assert wrong.status_code == 401


def test_a_user_needs_the_view_job_permission(client):
    user = User.objects.create_user("ops", password=None)
    client.force_login(user)
    assert client.get("/metrics").status_code == 403
    user.user_permissions.add(Permission.objects.get(codename="view_job"))
    client.force_login(User.objects.get(pk=user.pk))  # a fresh permission cache
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("token", ["short", 12345678901234567890])
def test_a_weak_or_odd_token_is_refused_without_showing_it(settings, token):
    settings.PGQUEUE = {"METRICS_TOKEN": token}
    with pytest.raises(ConfigurationError, match="METRICS_TOKEN") as raised:
        get_settings()
    assert str(token) not in str(raised.value)


def test_concurrent_scrapes_share_one_reading(settings, monkeypatch):
    settings.PGQUEUE = {"METRICS_CACHE_SECONDS": 60}
    reads = []
    real = stats.collect

    def counted(alias):
        reads.append(threading.get_ident())
        return real(alias)

    monkeypatch.setattr(stats, "collect", counted)
    start = threading.Barrier(8)
    results = []

    def scrape():
        start.wait()
        results.append([f.name for f in collector.QueueCollector(close=True).collect()])

    threads = [threading.Thread(target=scrape) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(results) == 8
    assert all("pgqueue_jobs" in names for names in results)
    assert len(reads) == 1  # one reading for eight scrapes
    settings.PGQUEUE = {"METRICS_CACHE_SECONDS": 0}
    list(collector.QueueCollector().collect())
    assert len(reads) == 2  # 0: every scrape reads


def test_the_workers_metrics_server_listens_on_this_machine_only_by_default():
    options = Command().create_parser("manage.py", "run_queue_worker").parse_args(["q"])
    assert options.metrics_addr == "127.0.0.1"
