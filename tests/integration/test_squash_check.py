"""A database that applied only some of the migrations the squashed one replaces is
named by a system check, which `migrate` runs: Django cannot build the app's migrations
there (0030 depends on a name nothing stands for), and without a later migration it
would show the app with no migrations and apply nothing, without an error."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

from django_pgqueue.checks import check_squashed_migrations

APP = "django_pgqueue"
SQUASHED = (APP, "0001_squashed_0029_enqueue_statement_work")
OLD = [name for _, name in MigrationLoader(None).disk_migrations[SQUASHED].replaces]


def record_only(names: list[str]) -> None:
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app=APP).delete()
    for name in names:
        recorder.record_applied(APP, name)


@pytest.mark.django_db
def test_a_database_stopped_partway_is_an_error_naming_what_to_do():
    record_only(OLD[: OLD.index("0025_started_steps_stay_run") + 1])

    errors = check_squashed_migrations(databases=["default"])

    assert [error.id for error in errors] == ["pgqueue.E010"]
    assert "'default'" in errors[0].msg
    assert "0025_started_steps_stay_run" in errors[0].msg
    assert "0029_enqueue_statement_work" in errors[0].hint


@pytest.mark.django_db
def test_the_squashed_migrations_own_row_does_not_hide_a_database_stopped_partway():
    # An older version taken back to 0028 leaves the squash's row, which Django does
    # not read: it decides by the replaced names.
    record_only([*OLD[:-1], SQUASHED[1]])

    assert [error.id for error in check_squashed_migrations(databases=["default"])] == [
        "pgqueue.E010"
    ]


@pytest.mark.django_db
def test_migrate_refuses_a_database_stopped_partway():
    record_only(OLD[:3])

    with pytest.raises(SystemCheckError, match=r"pgqueue\.E010"):
        call_command("migrate", APP, verbosity=0, skip_checks=False)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "recorded",
    [
        pytest.param(None, id="migrated-by-the-squash"),
        pytest.param(OLD, id="migrated-by-the-old-files"),
        pytest.param([], id="never-migrated"),
    ],
)
def test_a_database_with_all_or_none_applied_passes(recorded):
    if recorded is not None:
        record_only(recorded)

    assert check_squashed_migrations(databases=["default"]) == []


def test_the_check_reads_no_database_unless_asked():
    assert check_squashed_migrations(databases=None) == []
