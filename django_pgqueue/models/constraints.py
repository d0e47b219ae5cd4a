"""The checks and partial indexes several tables declare alike, each declared once.

Each returns the same object a model would write inline, so the migrations see no
change; the name stays the caller's (every name is part of the schema).
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


def null_or_at_least(field: str, low: object, *, name: str) -> models.CheckConstraint:
    """The check that `field` is NULL or at least `low` (a number, or an interval's text)."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__isnull": True}) | Q(**{f"{field}__gte": low}), name=name
    )


def at_least(low: object, *fields: str, name: str) -> models.CheckConstraint:
    """The check that each of `fields` is at least `low`, for NOT NULL columns (a CHECK
    lets a NULL pass: an optional column takes `null_or_at_least`)."""
    return models.CheckConstraint(
        condition=Q(**{f"{field}__gte": low for field in fields}), name=name
    )


def one_of(field: str, choices: type[models.Choices], *, name: str) -> models.CheckConstraint:
    """The check that `field` holds one of `choices`' values: the enum is the one list."""
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


def set_values_index(field: str, *, name: str) -> models.Index:
    """An index of `field` over the rows that have a value in it.

    PostgreSQL indexes NULLs too: an optional column that most rows leave NULL would
    fill a plain index with them. Here the rows without a value take no space.
    """
    return models.Index(fields=[field], name=name, condition=Q(**{f"{field}__isnull": False}))


def set_values_unique(field: str, *, name: str) -> models.UniqueConstraint:
    """`field` unique among the rows that have a value in it; the NULLs (never equal to
    each other anyway) stay out of its index, as in `set_values_index`."""
    return models.UniqueConstraint(
        fields=[field], name=name, condition=Q(**{f"{field}__isnull": False})
    )


def unique_in_queue(
    field: str, *, name: str, condition: Q | None = None
) -> models.UniqueConstraint:
    """`field` unique within each queue (where `condition` holds, if given): a key names
    a row of its own queue only, and two queues may use the same one. The index is on
    (queue, field), the target of the upserts' ``ON CONFLICT (queue, field)``."""
    return models.UniqueConstraint(fields=["queue", field], name=name, condition=condition)
