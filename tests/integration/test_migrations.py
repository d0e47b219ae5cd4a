"""The squashed migration stands for 0001 to 0022: a database those files migrated (or the
earlier squash of 0001 to 0017, which recorded their names), and a migration written
against them, keep working now that the files are gone."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings

APP = "django_pgqueue"
SQUASHED = (APP, "0001_squashed_0022_many_tenants")
# The names the old files recorded in django_migrations, as the squashed one lists them.
OLD = [name for _, name in MigrationLoader(None).disk_migrations[SQUASHED].replaces]


def test_the_squashed_migration_replaces_every_old_one():
    loader = MigrationLoader(None)
    assert [name[:4] for name in OLD] == [f"{number:04}" for number in range(1, 23)]
    assert (OLD[0], OLD[-1]) == ("0001_initial", "0022_many_tenants")
    assert loader.graph.root_nodes(APP) == [SQUASHED]
    # One line of history after it: the migrations written since depend on it, one leaf.
    (leaf,) = loader.graph.leaf_nodes(APP)
    assert SQUASHED in loader.graph.forwards_plan(leaf)


@pytest.mark.django_db
def test_a_database_the_old_files_migrated_has_nothing_to_apply():
    recorder = MigrationRecorder(connection)
    # As the old files left it: their 22 rows (and the earlier squash's, which nothing
    # reads now), the later migrations' own.
    recorder.migration_qs.filter(app=APP, name=SQUASHED[1]).delete()
    for name in [*OLD, "0001_squashed_0017_claim_function"]:
        recorder.record_applied(APP, name)

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())

    assert [migration.name for migration, _ in plan if migration.app_label == APP] == []
    assert SQUASHED in executor.loader.applied_migrations


@override_settings(MIGRATION_MODULES={APP: "tests.integration.later_migrations"})
def test_a_migration_depending_on_0022_depends_on_the_squashed_one():
    graph = MigrationLoader(None).graph
    later = graph.node_map[(APP, "0023_later")]
    assert [parent.key for parent in later.parents] == [SQUASHED]
    assert graph.forwards_plan((APP, "0023_later")) == [SQUASHED, (APP, "0023_later")]


@override_settings(MIGRATION_MODULES={APP: "tests.integration.later_migrations"})
@pytest.mark.django_db
def test_a_database_at_0022_applies_only_the_later_migration():
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app=APP, name=SQUASHED[1]).delete()
    for name in OLD:
        recorder.record_applied(APP, name)

    executor = MigrationExecutor(connection)
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())

    assert [migration.name for migration, _ in plan if migration.app_label == APP] == ["0023_later"]


def test_the_project_migrations_still_resolve():
    graph = MigrationLoader(None).graph
    for app in ("qa", "shop"):
        leaves = graph.leaf_nodes(app)
        assert leaves, app
        for leaf in leaves:
            assert graph.forwards_plan(leaf)[-1] == leaf
