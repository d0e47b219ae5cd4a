"""System checks: the queue needs PostgreSQL and a valid PGQUEUE setting."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import load_backend

from .conf import validate
from .exceptions import ConfigurationError


@checks.register(checks.Tags.database, checks.Tags.compatibility)
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
    try:
        vendor = load_backend(engine).DatabaseWrapper.vendor  # imports; does not connect
    except ImproperlyConfigured:
        vendor = "unknown"
    if vendor != "postgresql":
        return [
            checks.Error(
                f"django_pgqueue needs PostgreSQL, but the database {alias!r} uses {engine!r}.",
                hint="Set ENGINE to 'django.db.backends.postgresql' (psycopg 3) for that "
                "alias, or point PGQUEUE['DATABASE'] at a PostgreSQL database.",
                id="pgqueue.E001",
            )
        ]
    return []


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """pgqueue.E002: the PGQUEUE setting must validate."""
    try:
        validate(getattr(settings, "PGQUEUE", None))
    except ConfigurationError as exc:
        return [checks.Error(str(exc), id="pgqueue.E002")]
    return []
