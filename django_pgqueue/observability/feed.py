"""A live feed of job events, read from the attempts: started, succeeded, retried,
failed (the job dead), and the attempts given back (lost, released, snoozed,
interrupted).

A page follows it by polling: each poll reads the attempts after the last id it read
(a primary-key range, at most `BATCH`) and the ones it still shows running (primary-key
probes, at most `OPEN_MAX`), so its cost is bounded whatever the table's size and
however many jobs run. The filters (queue, type) are applied to what was read: the
range moves on past the attempts they leave out.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..store import observability as store_observability

# Most attempts a poll reads past the last one, and most running ones it looks at again.
BATCH = 200
OPEN_MAX = 200
# Attempts a feed shows when it opens.
START_BACK = 50


@dataclass(frozen=True)
class Event:
    """What became of one attempt, as a feed shows it."""

    attempt_id: int
    job_id: int
    queue: str
    type: str
    attempt: int
    event: str  # started, succeeded, retried, failed, lost, released, snoozed, interrupted
    worker_id: str
    started_at: dt.datetime
    finished_at: dt.datetime | None
    error_class: str | None

    def as_dict(self) -> dict[str, Any]:
        data = dict(vars(self))
        for key in ("started_at", "finished_at"):
            data[key] = data[key].isoformat() if data[key] is not None else None
        return data


@dataclass(frozen=True)
class Poll:
    """One poll's events (oldest first), and what the next poll sends: the last id
    read and the attempts still running."""

    events: list[Event]
    after: int
    open: list[int]


def event_name(status: str, job_dead: bool | None) -> str:
    """The feed's name of an attempt's status: a failed attempt is "retried" unless it
    left its job dead ("failed")."""
    if status == "running":
        return "started"
    if status == "failed":
        return "failed" if job_dead else "retried"
    return status


def start(alias: str, back: int = START_BACK) -> int:
    """The attempt id a new feed reads after: the latest `back` attempts are shown."""
    return store_observability.feed_start(alias, back)


def poll(
    alias: str,
    after: int,
    open_ids: Sequence[int] = (),
    *,
    queue: str | None = None,
    type: str | None = None,
) -> Poll:
    """The events since `after` and of the attempts `open_ids` (a page's last poll)."""
    open_ids = list(open_ids)[-OPEN_MAX:]
    rows = store_observability.read_feed(alias, after, open_ids, BATCH)
    events, still_open, last = [], [], after
    for attempt_id, job_id, q, t, attempt, status, worker, started, finished, error, dead in rows:
        last = max(last, attempt_id)
        if (queue and q != queue) or (type and t != type):
            continue
        name = event_name(status, dead)
        events.append(
            Event(attempt_id, job_id, q, t, attempt, name, worker, started, finished, error)
        )
        if status == "running":
            still_open.append(attempt_id)
    return Poll(events, last, still_open)
