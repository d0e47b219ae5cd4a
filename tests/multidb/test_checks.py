"""The system checks of PGQUEUE["QUEUE_DATABASES"]: the aliases exist, are PostgreSQL, are migrated.

Two real servers: the suite's own (`default`) and the throwaway one of conftest.py
(`queues2`). Every test commits for real (transaction=True), as the rules under test
are about which server's transaction holds a job.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connections, transaction

from django_pgqueue.checks import check_queue_databases, check_queue_tables

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "queues2"])


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_checks_of_queue_databases(settings: Any) -> None:
    assert check_queue_databases() == []
    assert check_queue_tables(databases=["default", "queues2"]) == []
    settings.DATABASES = {
        **settings.DATABASES,
        "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    }
    settings.PGQUEUE = {**settings.PGQUEUE, "QUEUE_DATABASES": {"a": "nowhere", "b": "lite"}}
    errors = check_queue_databases()
    assert [e.id for e in errors] == ["pgqueue.E005", "pgqueue.E006"]
    assert "'nowhere'" in errors[0].msg
    assert "sqlite3" in errors[1].msg
    assert check_queue_tables(databases=["default", "queues2"]) == []  # E005/E006 first


def test_the_check_names_an_alias_without_the_tables() -> None:
    assert check_queue_tables(databases=None) == []
    with transaction.atomic(using="queues2"):
        with connections["queues2"].cursor() as cursor:
            cursor.execute("ALTER TABLE queue_jobs RENAME TO queue_jobs_away")
        (warning,) = check_queue_tables(databases=["queues2"])
        assert check_queue_tables(databases=["default"]) == []  # not asked for queues2
        transaction.set_rollback(True, using="queues2")
    assert warning.id == "pgqueue.W003"
    assert "'queues2'" in warning.msg
    assert "migrate --database queues2" in warning.hint
    assert check_queue_tables(databases=["queues2"]) == []
