"""What operators do with schedules: run one now, and see which are late."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..conf import get_settings
from ..durations import format_seconds
from ..enqueue import EnqueuedJob, enqueue
from ..store import schedules as store_schedules
from .firing import RUN_NOW

if TYPE_CHECKING:
    from ..models import Schedule
    from .spec import ScheduleSpec

# A due tick not fired within this many poll intervals makes its schedule late.
LATE_POLL_INTERVALS = 2


@dataclass(frozen=True)
class LateSchedule:
    """An enabled schedule whose due tick has not fired in time."""

    name: str
    queue: str
    due_at: dt.datetime
    late_seconds: float

    @property
    def late(self) -> str:
        """How late, for people ('45s', '3m 2s')."""
        return format_seconds(self.late_seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "queue": self.queue,
            "due_at": self.due_at.isoformat(),
            "late_seconds": round(self.late_seconds, 3),
        }


def late_schedules(alias: str | None = None) -> list[LateSchedule]:
    """Schedules whose due tick waited more than 2 poll intervals: no worker fired it."""
    conf = get_settings()
    seconds = LATE_POLL_INTERVALS * conf.POLL_INTERVAL
    rows = store_schedules.late_schedules(alias or conf.DATABASE, seconds)
    return [LateSchedule(name, queue, due_at, late) for name, queue, due_at, late in rows]


def run_now_key(name: str) -> str:
    """The idempotency key of a schedule's "run now" job: one live at a time."""
    return f"schedule:{name}@{RUN_NOW}"


def run_now(schedule: Schedule, using: str | None = None) -> EnqueuedJob:
    """Enqueue one job of `schedule` now, outside its ticks.

    Keyed by the schedule: while that job is pending or running, asking again
    returns it (``created=False``) instead of adding a second one.
    """
    return enqueue_scheduled(schedule, run_now_key(schedule.name), using)


def enqueue_scheduled(
    schedule: Schedule | ScheduleSpec, key: str, using: str | None
) -> EnqueuedJob:
    """Enqueue a job of `schedule`, keyed by `key`: its type, payload, queue, priority
    and max_attempts, on `using` (None: its queue's database)."""
    return enqueue(
        schedule.type,
        schedule.payload,
        queue=schedule.queue,
        priority=schedule.priority,
        max_attempts=schedule.max_attempts,
        idempotency_key=key,
        using=using,
    )
