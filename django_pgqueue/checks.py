"""System checks: the queue needs PostgreSQL and a valid PGQUEUE setting, and its
state table needs autovacuum (checked when the checks may use the database)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.db.utils import load_backend

from . import extensions
from .conf import validate
from .control.extension import QueueControl
from .exceptions import ConfigurationError
from .prune_policy import PRUNE_TYPE
from .schedules.extension import Schedules
from .schedules.spec import code_schedules
from .stats import stranded_jobs
from .store.operator import autovacuum_settings, missing_tables

# The tag of the queue's own checks: run_queue_worker runs only these at its start.
TAG = "pgqueue"


@checks.register(TAG, checks.Tags.database, checks.Tags.compatibility)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E001: the queue's database must be PostgreSQL."""
    try:
        alias = validate(getattr(settings, "PGQUEUE", None)).DATABASE
    except ConfigurationError:
        return []  # reported by check_settings
    databases = settings.DATABASES
    if alias not in databases:
        return [
            checks.Error(
                f"PGQUEUE['DATABASE'] names the database alias {alias!r}, "
                "which is not in settings.DATABASES.",
                hint=f"Use one of: {', '.join(databases)}.",
                id="pgqueue.E003",
            )
        ]
    engine = databases[alias].get("ENGINE", "")
    if _vendor(engine) != "postgresql":
        return [
            checks.Error(
                f"django_pgqueue needs PostgreSQL, but the database {alias!r} uses {engine!r}.",
                hint="Set ENGINE to 'django.db.backends.postgresql' (psycopg 3) for that "
                "alias, or point PGQUEUE['DATABASE'] at a PostgreSQL database.",
                id="pgqueue.E001",
            )
        ]
    return []


def _vendor(engine: str) -> str:
    try:
        return str(load_backend(engine).DatabaseWrapper.vendor)  # imports; does not connect
    except ImproperlyConfigured:
        return "unknown"


def _queue_aliases() -> tuple[str, ...]:
    """The aliases PGQUEUE["QUEUE_DATABASES"] names (none when the settings are invalid)."""
    try:
        return validate(getattr(settings, "PGQUEUE", None)).QUEUE_DATABASES.aliases()
    except ConfigurationError:
        return ()  # reported by check_settings


@checks.register(TAG, checks.Tags.compatibility)
def check_queue_databases(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E005 / E006: every alias QUEUE_DATABASES names is a PostgreSQL database."""
    errors: list[checks.CheckMessage] = []
    for alias in _queue_aliases():
        if alias not in settings.DATABASES:
            errors.append(
                checks.Error(
                    f"PGQUEUE['QUEUE_DATABASES'] puts queues on the database alias "
                    f"{alias!r}, which is not in settings.DATABASES.",
                    hint=f"Use one of: {', '.join(settings.DATABASES)}.",
                    id="pgqueue.E005",
                )
            )
            continue
        engine = settings.DATABASES[alias].get("ENGINE", "")
        if _vendor(engine) != "postgresql":
            errors.append(
                checks.Error(
                    f"PGQUEUE['QUEUE_DATABASES'] puts queues on the database {alias!r}, "
                    f"which uses {engine!r}: django_pgqueue needs PostgreSQL.",
                    hint="Point those queues at a PostgreSQL database "
                    "('django.db.backends.postgresql').",
                    id="pgqueue.E006",
                )
            )
    return errors


@checks.register(TAG, checks.Tags.database)
def check_queue_tables(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """pgqueue.W003: an alias that holds queues (QUEUE_DATABASES) has the queue's tables.

    Runs only when the checks may query databases, for the aliases asked for.
    """
    if not databases or check_queue_databases():
        return []
    warnings: list[checks.CheckMessage] = []
    asked = [alias for alias in _queue_aliases() if alias in databases]
    for alias, migrated in _read_each(asked, has_queue_tables):
        if not migrated:
            warnings.append(
                checks.Warning(
                    f"PGQUEUE['QUEUE_DATABASES'] puts queues on the database {alias!r}, "
                    "but it has no queue tables (queue_jobs, queue_job_state): enqueue "
                    "to those queues fails and their workers cannot start.",
                    hint=f"Run manage.py migrate --database {alias} (this warning shows "
                    "during that migrate too, before it creates them).",
                    id="pgqueue.W003",
                )
            )
    return warnings


@checks.register(TAG, checks.Tags.database)
def check_squashed_migrations(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """pgqueue.E010: a database applied all of the migrations a squashed one replaces,
    or none of them.

    With only some applied, Django swaps the squashed migration for the files it
    replaces, which are gone: it cannot build the app's migrations (a later migration
    depends on a name nothing stands for), and without one, the app would show no
    migrations and `migrate` would apply nothing. Runs for the databases the checks
    may query.
    """
    if not databases:
        return []
    app = __package__
    squashes = [
        migration
        for (label, _), migration in _disk_migrations().items()
        if label == app and migration.replaces
    ]
    errors: list[checks.CheckMessage] = []
    for alias, recorded in _read_each(databases, _applied_migrations):
        applied = {name for label, name in recorded if label == app}
        for squash in squashes:
            replaced = {name for label, name in squash.replaces if label == app}
            done = applied & replaced
            # Django decides by the replaced names alone, whatever the squash's own row
            if not done or done == replaced:
                continue
            errors.append(
                checks.Error(
                    f"The database {alias!r} applied {len(done)} of the {len(replaced)} "
                    f"migrations that {app}'s {squash.name} replaces (the last: "
                    f"{max(done)}), and this version no longer ships them: Django "
                    f"cannot migrate {app} there.",
                    hint=f"Migrate {alias!r} to {max(replaced)} with a version of "
                    "django-pgqueue-jobs that still has those files, then upgrade "
                    "(docs/upgrading.md).",
                    id="pgqueue.E010",
                )
            )
    return errors


def _read_each(aliases: Iterable[str], read: Callable[[str], Any]) -> Iterator[tuple[str, Any]]:
    """(alias, read(alias)) for each of the databases that answers: an unreachable one
    is reported by Django's own checks."""
    for alias in aliases:
        try:
            value = read(alias)
        except DatabaseError:
            continue
        yield alias, value


def _applied_migrations(alias: str) -> Any:
    """The (app, name) of every migration the database `alias` recorded as applied."""
    return MigrationRecorder(connections[alias]).applied_migrations()


def _disk_migrations() -> dict[tuple[str, str], Any]:
    """The migrations in the apps' files, without the database's record."""
    loader = MigrationLoader(None, load=False)
    loader.load_disk()
    return loader.disk_migrations


def has_queue_tables(alias: str) -> bool:
    """Whether the database `alias` has the queue's tables, read from its catalog.

    A check that queries the queue's tables asks this first: the first `migrate` runs
    the checks before it creates them, and a statement on a missing table is an ERROR
    in the server's log even when the check catches it.
    """
    return not missing_tables(alias, ("queue_jobs", "queue_job_state"))


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E002: the PGQUEUE setting must validate."""
    try:
        validate(getattr(settings, "PGQUEUE", None))
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="pgqueue.E002")]
    return []


@checks.register(TAG)
def check_features_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E008, E009: what needs a feature left out of PGQUEUE["EXTENSIONS"]."""
    try:
        conf = validate(getattr(settings, "PGQUEUE", None))
        installed = extensions.installed()
    except ConfigurationError:
        return []  # reported by check_settings
    errors = []
    declared = code_schedules().specs
    if "PRUNE" not in (getattr(settings, "PGQUEUE", None) or {}):
        # The built-in prune is a default, not a declaration: without the schedules
        # feature it is simply off (prune_queue_jobs prunes by hand).
        declared = [spec for spec in declared if spec.name != PRUNE_TYPE]
    if declared and not any(isinstance(e, Schedules) for e in installed):
        names = ", ".join(repr(spec.name) for spec in declared[:3])
        errors.append(
            checks.Error(
                f"Schedules are declared in code ({names}{', ...' if len(declared) > 3 else ''}) "
                "but the schedules feature is not in PGQUEUE['EXTENSIONS']: no worker would "
                "fire their ticks.",
                hint="Add 'django_pgqueue.schedules.extension.Schedules' to "
                "PGQUEUE['EXTENSIONS'], or remove the schedules.",
                id="pgqueue.E008",
            )
        )
    if conf.QUEUES and not any(isinstance(e, QueueControl) for e in installed):
        errors.append(
            checks.Error(
                f"PGQUEUE['QUEUES'] sets limits for {', '.join(map(repr, sorted(conf.QUEUES)))} "
                "but queue control is not in PGQUEUE['EXTENSIONS']: no worker would write "
                "them.",
                hint="Add 'django_pgqueue.control.extension.QueueControl' to "
                "PGQUEUE['EXTENSIONS'], or set the limits at run time (queue_control, "
                "the admin's Queues page).",
                id="pgqueue.E009",
            )
        )
    return errors


def autovacuum_problem(alias: str) -> str | None:
    """Why autovacuum will not clean the queue's state table, or None if it will."""
    row = autovacuum_settings(alias)
    if row is None:
        return None  # not migrated yet
    server_on, table_off = row
    if not server_on:
        return "autovacuum is off on the server (autovacuum = off)"
    if table_off:
        return "autovacuum is off for the table queue_job_state (autovacuum_enabled = false)"
    return None


def _queried_alias(databases: Any) -> str | None:
    """The queue's database alias when these checks may query it now, else None: the
    settings are valid, the check was asked for that database, and it is configured."""
    try:
        alias = validate(getattr(settings, "PGQUEUE", None)).DATABASE
    except ConfigurationError:
        return None
    if not databases or alias not in databases or check_database():
        return None
    return alias


def _queries_the_database(
    check: Callable[[str], list[checks.CheckMessage]],
) -> Callable[..., list[checks.CheckMessage]]:
    """Register `check(alias)` as a check of the queue's database: it runs only when
    the checks may query it (`check --database`, `migrate`), and says nothing of an
    unreachable database (Django's own checks report it)."""

    def run(
        app_configs: Any = None, databases: Any = None, **kwargs: Any
    ) -> list[checks.CheckMessage]:
        alias = _queried_alias(databases)
        if alias is None:
            return []
        try:
            return check(alias)
        except DatabaseError:
            return []

    # Named as `check` (Django lists checks by name), without __wrapped__: Django reads
    # run's own signature to see that it takes **kwargs.
    run.__name__, run.__qualname__, run.__doc__ = check.__name__, check.__qualname__, check.__doc__
    return checks.register(TAG, checks.Tags.database)(run)


@_queries_the_database
def check_autovacuum(alias: str) -> list[checks.CheckMessage]:
    """pgqueue.W001: autovacuum must be able to clean queue_job_state."""
    problem = autovacuum_problem(alias)
    if problem is None:
        return []
    return [
        checks.Warning(
            f"{problem}: every claimed and finished job leaves dead rows and index "
            "entries in queue_job_state that only VACUUM removes, so the table bloats "
            "and claims slow down as they pile up.",
            hint="Turn autovacuum on (the migration sets aggressive per-table "
            "parameters), or run VACUUM queue_job_state regularly, e.g. every minute.",
            id="pgqueue.W001",
        )
    ]


@_queries_the_database
def check_unknown_types(alias: str) -> list[checks.CheckMessage]:
    """pgqueue.W002: pending jobs whose type no handler or task of this project knows."""
    if not has_queue_tables(alias):
        return []  # not migrated yet (the first migrate runs its checks first)
    return [
        checks.Warning(
            f"{item.jobs} pending job(s) in queue {item.queue!r} have the type "
            f"{item.type!r}, which no @handler or Task of this project knows: a worker "
            "fails each one as an unknown job type.",
            hint="Check the type's spelling where it is enqueued, or register a handler "
            "for it (PGQUEUE['STRICT_TYPES'] = True refuses such types at enqueue).",
            id="pgqueue.W002",
        )
        for item in stranded_jobs(alias)
        if item.unknown_type
    ]
