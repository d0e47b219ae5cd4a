"""The queue's own job types, found like every app's ``jobs`` module: the built-in prune
that ``PGQUEUE["PRUNE"]`` schedules (every hour by default)."""

from __future__ import annotations

from typing import Any

from .conf import get_settings
from .context import JobContext
from .maintenance import prune_older_than
from .prune_policy import PRUNE_TYPE
from .registry import handler


@handler(PRUNE_TYPE, max_attempts=3)
def prune_finished_jobs(ctx: JobContext) -> dict[str, Any]:
    """Delete the finished jobs older than the payload's ages, on every queue database;
    the result counts what went, by database and status."""
    older_than = {status: float(age) for status, age in ctx.payload["older_than_seconds"].items()}
    return {
        alias: prune_older_than(older_than, alias=alias) for alias in get_settings().queue_databases
    }
