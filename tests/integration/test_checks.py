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


@pytest.mark.django_db(transaction=True)
def test_autovacuum_warning_follows_the_server_and_the_table():
    from django.db import connection

    from django_pgqueue.checks import check_autovacuum

    assert check_autovacuum() == []  # no database access unless asked for
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')::bool")
        server_on = cursor.fetchone()[0]
    ids = [w.id for w in check_autovacuum(databases=["default"])]
    assert ids == ([] if server_on else ["pgqueue.W001"])
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE queue_job_state SET (autovacuum_enabled = false)")
    try:
        (warning,) = check_autovacuum(databases=["default"])
        assert warning.id == "pgqueue.W001"
        assert "queue_job_state" in warning.msg
        assert ("on the server" in warning.msg) is not server_on
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE queue_job_state RESET (autovacuum_enabled)")
    assert [w.id for w in check_autovacuum(databases=["default"])] == (
        [] if server_on else ["pgqueue.W001"]
    )


def test_every_check_of_the_queue_carries_the_tag_a_worker_runs():
    from django.core.checks.registry import registry

    from django_pgqueue.checks import TAG

    ours = [c for c in registry.get_checks() if c.__module__.startswith("django_pgqueue")]
    assert len(ours) >= 5
    assert [c.__name__ for c in ours if TAG not in c.tags] == []


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_the_queues_checks_and_not_the_projects(settings):
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    def project_problem(app_configs=None, **kwargs):
        return [checks.Error("a project check a worker does not need", id="testproject.E001")]

    checks.register(project_problem, "urls")
    try:
        # call_command skips the checks unless told otherwise, as manage.py does not.
        run = {"verbosity": 0, "skip_checks": False}
        call_command("run_queue_worker", "checked", "--burst", **run)
        settings.PGQUEUE = {"LEASE": -1}
        with pytest.raises(SystemCheckError, match=r"pgqueue\.E002"):
            call_command("run_queue_worker", "checked", "--burst", **run)
        with pytest.raises(SystemCheckError, match=r"testproject\.E001"):
            call_command("check")
    finally:
        checks.registry.registry.registered_checks.discard(project_problem)


@pytest.mark.django_db(transaction=True)
def test_a_workers_start_checks_open_no_database_connection():
    from django.core.management import call_command
    from django.db import connections

    from django_pgqueue.management.commands.run_queue_worker import Command

    connections.close_all()
    # The database checks (autovacuum, stranded jobs) would connect and warn here.
    Command().check(tags=Command.requires_system_checks)
    assert [alias for alias in connections if connections[alias].connection is not None] == []
    call_command("check", "--database", "default")  # the full check still reaches it


DEFAULT_FEATURES = {
    "control": "django_pgqueue.control.extension.QueueControl",
    "schedules": "django_pgqueue.schedules.extension.Schedules",
    "observability": "django_pgqueue.observability.extension.Observability",
}


def test_what_needs_a_feature_left_out_is_refused_naming_it(settings):
    from django_pgqueue.checks import check_features_installed

    declared = {"nightly": {"type": "qa.noop", "cron": "0 3 * * *", "queue": "reports"}}
    settings.PGQUEUE = {"SCHEDULES": declared, "QUEUES": {"reports": {"limit": 1}}}
    assert check_features_installed() == []  # every feature installed
    without = [p for name, p in DEFAULT_FEATURES.items() if name != "schedules"]
    settings.PGQUEUE = {"SCHEDULES": declared, "EXTENSIONS": without}
    (error,) = check_features_installed()
    assert error.id == "pgqueue.E008"
    assert "'nightly'" in error.msg
    without = [p for name, p in DEFAULT_FEATURES.items() if name != "control"]
    settings.PGQUEUE = {"QUEUES": {"reports": {"limit": 1}}, "EXTENSIONS": without}
    (error,) = check_features_installed()
    assert error.id == "pgqueue.E009"
    assert "'reports'" in error.msg
    # The built-in prune asked for by name needs the schedules feature too ...
    without = [p for name, p in DEFAULT_FEATURES.items() if name != "schedules"]
    settings.PGQUEUE = {"EXTENSIONS": without, "PRUNE": {"dead": "30d"}}
    (error,) = check_features_installed()
    assert error.id == "pgqueue.E008"
    assert "'pgqueue.prune'" in error.msg
    # ... while left at its default, it is simply off without it.
    settings.PGQUEUE = {"EXTENSIONS": without}
    assert check_features_installed() == []
    # Left out, and nothing needing it: nothing to say.
    settings.PGQUEUE = {"EXTENSIONS": []}
    assert check_features_installed() == []


# Run in a fresh interpreter on a fresh database: migrate as `manage.py migrate` does it
# (its system checks first, with database access), printing each statement the server
# refused. A refused statement is an ERROR line in the server's log, even when the code
# that sent it catches the exception.
MIGRATE_WATCHING_ERRORS = """
import json
import django
django.setup()
from django.core.management import call_command
from django.db import DatabaseError, connections
refused = []
def watch(execute, sql, params, many, context):
    try:
        return execute(sql, params, many, context)
    except DatabaseError as exc:
        refused.append(f"{str(exc).splitlines()[0]} <- {' '.join(str(sql).split())[:300]}")
        raise
with connections["default"].execute_wrapper(watch):
    call_command("migrate", verbosity=0, skip_checks=False)
tables = connections["default"].introspection.table_names()
print(json.dumps({"refused": refused, "migrated": "queue_job_state" in tables}))
"""


@pytest.mark.django_db(transaction=True)
def test_migrate_on_a_fresh_database_sends_no_statement_the_server_refuses():
    import json
    import os
    import subprocess
    import sys
    import uuid

    from django.db import connection

    from tests.conftest import ROOT, database_url

    fresh = f"{connection.settings_dict['NAME']}_fresh_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{fresh}"')
    try:
        env = {
            **os.environ,
            "DATABASE_URL": database_url().rsplit("/", 1)[0] + f"/{fresh}",
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
        }
        done = subprocess.run(
            [sys.executable, "-c", MIGRATE_WATCHING_ERRORS],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        ran = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{fresh}" WITH (FORCE)')
    assert ran == {"refused": [], "migrated": True}
