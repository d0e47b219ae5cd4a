"""Column and option shapes that several of this app's migrations declare alike.

Not a migration: Django's migration loader skips modules whose names start with "_".
Each helper builds a new field or constraint on every call (Django binds a field
to one model) and builds exactly what the migrations spelled out before, so the
operations and the SQL they run are unchanged: `manage.py sqlmigrate` prints the
same text for every migration.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.models.functions import Cast, Now

import django_pgqueue.models


def db_now() -> models.DateTimeField:
    """A timestamp column the database fills with now() when a row is inserted."""
    return models.DateTimeField(db_default=Now())


def table(db_table: str, verbose_name: str, **more: Any) -> dict[str, Any]:
    """A CreateModel's options: the table's name, its verbose name, then `more`."""
    return {"verbose_name": verbose_name, "db_table": db_table, **more}


def add_nullable(
    model_name: str, name: str, field_class: type[models.Field], **options: Any
) -> migrations.AddField:
    """Add a column that stays NULL until written.

    With no default, adding it rewrites no row and takes its lock only briefly,
    whatever the table's size.
    """
    field = field_class(blank=True, null=True, **options)
    return migrations.AddField(model_name=model_name, name=name, field=field)


def rate_window() -> list[tuple[str, models.Field[Any, Any]]]:
    """The rate window's columns, alike on queue_controls and queue_type_controls.

    No rate while rate_count and rate_period are NULL; rate_starts holds the last
    rate_count start times, oldest first.
    """
    return [
        ("rate_count", models.IntegerField(blank=True, null=True)),
        ("rate_period", models.FloatField(blank=True, null=True)),
        (
            "rate_starts",
            django_pgqueue.models.TimestampArray(
                db_default=Cast(
                    models.Value("{}"), output_field=django_pgqueue.models.TimestampArray()
                ),
                editable=False,
            ),
        ),
    ]


def rate_valid(name: str) -> models.CheckConstraint:
    """The CHECK on a rate window: no rate, or 1..10,000 starts in a positive period."""
    return models.CheckConstraint(
        condition=models.Q(
            models.Q(("rate_count__isnull", True), ("rate_period__isnull", True)),
            models.Q(("rate_count__gte", 1), ("rate_count__lte", 10000), ("rate_period__gt", 0)),
            _connector="OR",
        ),
        name=name,
    )
