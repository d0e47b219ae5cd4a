"""The squashed migration stands for 0001 to 0029: a database those files migrated (by the
earlier squash of 0001 to 0022 and 0023 to 0029, or by the files before that squash, whose
names it recorded too), and a migration written against any of them, keep working now that
the files are gone. Such a database applies 0030 and the migrations after it, and ends
with the functions a fresh one has."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.exceptions import NodeNotFoundError
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings

import django_pgqueue.migrations

APP = "django_pgqueue"
SQUASHED = (APP, "0001_squashed_0029_enqueue_statement_work")
# The first migration after the squash, which writes four of its functions again.
FUNCTIONS_0030 = (APP, "0030_holds_unique_key_and_end_event_waits")
# Every migration of the app after the squash, in order (0030 first).
_GRAPH = MigrationLoader(None).graph
AFTER_SQUASH = [
    name
    for app, name in _GRAPH.forwards_plan(_GRAPH.leaf_nodes(APP)[0])
    if app == APP and name > SQUASHED[1]
]
# The names the old files recorded in django_migrations, as the squashed one lists them.
OLD = [name for _, name in MigrationLoader(None).disk_migrations[SQUASHED].replaces]
FIRST_SQUASH = "0001_squashed_0022_many_tenants"
# The later migrations of tests/integration/later_migrations, and what each depends on.
LATER = {
    "0030_later": "0029_enqueue_statement_work",
    "0030_on_0025": "0025_started_steps_stay_run",
    "0030_on_the_first_squash": FIRST_SQUASH,
    "0030_on_0022": "0022_many_tenants",
}


def test_the_squashed_migration_replaces_every_old_one():
    loader = MigrationLoader(None)
    # The 22 files of the first squash, that squash, then the files written after it.
    assert [name[:4] for name in OLD[:22]] == [f"{number:04}" for number in range(1, 23)]
    assert (OLD[0], OLD[21]) == ("0001_initial", "0022_many_tenants")
    assert OLD[22:] == [
        FIRST_SQUASH,
        "0023_sequences",
        "0025_started_steps_stay_run",
        "0027_cancel_in_progress",
        "0028_claim_order",
        "0029_enqueue_statement_work",
    ]
    assert loader.graph.root_nodes(APP) == [SQUASHED]
    # One line of history after it: the migrations written since depend on it, one leaf.
    (leaf,) = loader.graph.leaf_nodes(APP)
    assert SQUASHED in loader.graph.forwards_plan(leaf)


def test_the_squashed_migration_holds_its_sql_whole():
    # Each function in its final text: none is built by editing another's text.
    source = Path(django_pgqueue.migrations.__file__).with_name(f"{SQUASHED[1]}.py").read_text()
    assert ".replace(" not in source
    assert "import_module" not in source


@pytest.mark.django_db
@pytest.mark.parametrize(
    "earlier", [[FIRST_SQUASH], [FIRST_SQUASH, "0001_squashed_0017_claim_function"]]
)
def test_a_database_the_old_files_migrated_applies_only_what_came_after(earlier):
    recorder = MigrationRecorder(connection)
    # As the old files left it at 0029: their rows (the first squash's among them, and
    # the squash before it, which nothing reads now).
    recorder.migration_qs.filter(app=APP, name__in=[SQUASHED[1], *AFTER_SQUASH]).delete()
    for name in {*OLD, *earlier}:
        recorder.record_applied(APP, name)

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())

    assert [migration.name for migration, _ in plan if migration.app_label == APP] == AFTER_SQUASH
    assert SQUASHED in executor.loader.applied_migrations


def _functions() -> dict[str, str]:
    """The definition of each function of the schema, by its signature."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc AS p "
            "WHERE p.pronamespace = current_schema()::regnamespace AND p.prokind = 'f'"
        )
        return dict(cursor.fetchall())


# The functions the old files wrote with both rules inline, which 0030 writes again,
# and the two it creates for them.
WRITTEN_AGAIN = ("pgqueue_emit", "pgqueue_enqueue_unique")
NEW_IN_0030 = ("pgqueue_end_event_waits", "pgqueue_holds_unique_key")


@pytest.mark.django_db
def test_a_database_at_0029_and_a_fresh_one_end_with_the_same_functions():
    migrated = _functions()  # the test database: migrated from nothing
    MigrationExecutor(connection).migrate([FUNCTIONS_0030])
    fresh = _functions()  # as 0030 leaves it
    # Taken back to 0029, a database keeps them: the squashed migration has them too.
    MigrationExecutor(connection).migrate([SQUASHED])
    assert _functions() == fresh
    assert _attempts_foreign_keys() == ["queue_attempts_job_fk"]  # as 0031 found it
    with connection.cursor() as cursor:
        # As the old files left it at 0029: stand-ins of the two functions, whatever
        # their text was (the same signatures, a body of their own), and no new ones.
        cursor.execute(
            "SELECT format('CREATE OR REPLACE FUNCTION %%s(%%s) RETURNS %%s LANGUAGE plpgsql "
            "AS $$BEGIN RAISE ''as the old files left it''; END$$', p.proname, "
            "pg_get_function_arguments(p.oid), pg_get_function_result(p.oid)) "
            "FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace "
            "AND p.proname = ANY(%s)",
            [list(WRITTEN_AGAIN)],
        )
        stand_ins = [row[0] for row in cursor.fetchall()]
        assert len(stand_ins) == len(WRITTEN_AGAIN)
        for statement in stand_ins:
            cursor.execute(statement)
        for name in NEW_IN_0030:
            cursor.execute(f"DROP FUNCTION {name}")
    at_0029 = _functions()
    assert sorted(name.split("(")[0] for name in fresh if at_0029.get(name) != fresh[name]) == [
        *sorted(WRITTEN_AGAIN + NEW_IN_0030)
    ]

    MigrationExecutor(connection).migrate([FUNCTIONS_0030])

    assert _functions() == fresh
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes(APP))
    assert _functions() == migrated
    assert _attempts_foreign_keys() == []


def _attempts_foreign_keys() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT conname FROM pg_constraint "
            "WHERE conrelid = 'queue_attempts'::regclass AND contype = 'f'"
        )
        return [name for (name,) in cursor.fetchall()]


@override_settings(MIGRATION_MODULES={APP: "tests.integration.later_migrations"})
@pytest.mark.parametrize("later", sorted(LATER))
def test_a_migration_depending_on_a_replaced_name_depends_on_the_squashed_one(later):
    graph = MigrationLoader(None).graph
    node = graph.node_map[(APP, later)]
    assert LATER[later] in OLD
    assert [parent.key for parent in node.parents] == [SQUASHED]
    assert graph.forwards_plan((APP, later)) == [SQUASHED, (APP, later)]


@override_settings(MIGRATION_MODULES={APP: "tests.integration.later_migrations"})
@pytest.mark.django_db
def test_a_database_at_0029_applies_only_the_later_migrations():
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app=APP, name=SQUASHED[1]).delete()
    for name in OLD:
        recorder.record_applied(APP, name)

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())

    assert sorted(migration.name for migration, _ in plan if migration.app_label == APP) == sorted(
        LATER
    )


@pytest.mark.django_db
def test_a_database_stopped_before_0029_is_refused_with_a_reason():
    # Only some of the replaced names applied: Django takes the squash away and puts
    # back the files it replaced, which are gone, so 0030 depends on a migration it
    # cannot find and Django says why (docs/upgrading.md says to migrate such a
    # database to 0029 first).
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app=APP).delete()
    for name in OLD[: OLD.index("0025_started_steps_stay_run") + 1]:
        recorder.record_applied(APP, name)

    with pytest.raises(NodeNotFoundError, match="some of the replaced migrations"):
        MigrationLoader(connection)


def test_the_project_migrations_still_resolve():
    graph = MigrationLoader(None).graph
    for app in ("qa", "shop"):
        leaves = graph.leaf_nodes(app)
        assert leaves, app
        for leaf in leaves:
            assert graph.forwards_plan(leaf)[-1] == leaf
