import pytest
from django.core import checks

from django_pgqueue.checks import check_database, check_settings


def test_postgresql_database_passes(settings):
    assert check_database() == []
    assert check_settings() == []


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_non_postgresql_database_is_an_error(settings):
    settings.DATABASES = {
        **settings.DATABASES,
        "other": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    }
    settings.PGQUEUE = {"DATABASE": "other"}
    (error,) = check_database()
    assert error.id == "pgqueue.E001"
    assert "needs PostgreSQL" in error.msg
    assert "sqlite3" in error.msg


def test_unknown_alias_is_an_error(settings):
    settings.PGQUEUE = {"DATABASE": "nope"}
    assert [e.id for e in check_database()] == ["pgqueue.E003"]


def test_invalid_settings_are_reported_by_the_check_framework(settings):
    settings.PGQUEUE = {"LEASE": -1}
    errors = checks.run_checks()
    assert [e.id for e in errors if e.id.startswith("pgqueue")] == ["pgqueue.E002"]
    assert "LEASE" in errors[0].msg


@pytest.mark.parametrize("key", ["LEASE", "CONCURRENCY"])
def test_check_names_the_key(settings, key):
    settings.PGQUEUE = {key: "soon"}
    (error,) = check_settings()
    assert key in error.msg
