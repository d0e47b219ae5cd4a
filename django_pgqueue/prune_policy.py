"""How long finished jobs are kept, and when the built-in schedule prunes them:
``PGQUEUE["PRUNE"]`` read and checked, with no database and no settings module."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import validators
from .durations import parse_duration

# The job type and schedule name of the built-in prune.
PRUNE_TYPE = "pgqueue.prune"
# Statuses in the order they are listed; the same as models.FINISHED_STATUSES.
FINISHED = ("completed", "cancelled", "dead")
DEFAULTS: dict[str, Any] = {
    "every": "1h",
    "cron": None,
    "queue": None,
    "completed": "14d",
    "cancelled": "14d",
    "dead": "90d",
}


@dataclass(frozen=True)
class PrunePolicy:
    """Seconds each finished status is kept (None: for ever), and the schedule's timing."""

    keep: dict[str, float | None]
    every: dt.timedelta | None = None
    cron: str | None = None
    queue: str | None = None  # None: PGQUEUE["DEFAULT_QUEUE"]

    def payload(self) -> dict[str, Any]:
        """The built-in job's payload: each pruned status and its age in whole seconds."""
        ages = {status: int(age) for status, age in self.keep.items() if age is not None}
        return {"older_than_seconds": ages}


def pruning_rounds(older_than: Mapping[str, float]) -> list[tuple[float, list[str]]]:
    """(age, statuses) passes, youngest age first, each with every status kept no longer.

    A job older than its status's age is older than any shorter age too, so each pass
    also takes the statuses of the passes before it: a workflow with a completed step
    (14 days) and a dead one (90 days) goes, whole, in the 90-day pass.
    """
    rounds = []
    for age in sorted(set(older_than.values())):
        rounds.append((age, [s for s in FINISHED if s in older_than and older_than[s] <= age]))
    return rounds


def parse(value: Any, name: str, *, error: type[Exception] = ValueError) -> PrunePolicy | None:
    """Read ``PGQUEUE["PRUNE"]``: None (or False) turns it off; a dict's keys replace the
    defaults'. Ages are durations ('14d', a timedelta or seconds), None to keep a status
    for ever; `every` or `cron` times the schedule; `queue` is the queue it runs in."""
    if value is None or value is False:
        return None
    validators.mapping(value, name, tuple(DEFAULTS), error=error)
    if value.get("every") is not None and value.get("cron") is not None:
        raise error(f"{name}: give 'every' or 'cron', not both.")
    raw = {**DEFAULTS, **({"every": None} if value.get("cron") is not None else {}), **value}
    keep = {status: _age(raw[status], f"{name}[{status!r}]", error) for status in FINISHED}
    if all(age is None for age in keep.values()):
        raise error(f"{name} keeps every status for ever; set it to None to turn the prune off.")
    every = raw["every"]
    if every is not None:
        every = _duration(every, f"{name}['every']", error)
    cron = raw["cron"]
    if every is None and cron is None:
        raise error(f"{name} needs 'every' (such as '1h') or 'cron' (such as '17 3 * * *').")
    if cron is not None and not isinstance(cron, str):
        raise error(f"{name}['cron'] must be a cron expression (a string), got {cron!r}.")
    queue = raw["queue"]
    if queue is not None:
        validators.queue_name(queue, f"{name}['queue']", error=error)
    return PrunePolicy(keep=keep, every=every, cron=cron, queue=queue)


def _age(value: Any, name: str, error: type[Exception]) -> float | None:
    if value is None:
        return None
    return _duration(value, name, error).total_seconds()


def _duration(value: Any, name: str, error: type[Exception]) -> dt.timedelta:
    """A duration: '14d', a timedelta, or seconds; positive."""
    try:
        if isinstance(value, str):
            return parse_duration(value)
        if isinstance(value, dt.timedelta):
            seconds = value.total_seconds()
        elif isinstance(value, int | float) and not isinstance(value, bool):
            seconds = value
        else:
            raise ValueError(f"expected a duration such as '14d', got {value!r}")
        return dt.timedelta(seconds=validators.seconds(seconds, "the duration"))
    except ValueError as exc:
        raise error(f"{name}: {exc}") from None
