"""The schedules' statements: firing ticks and syncing the code's schedules on a
worker's connection, and the operators' view of late schedules on Django's.

A tick is fired by one statement (``schedule_fire``): it moves the schedule's
next_tick by compare-and-set, inserts the tick row (ON CONFLICT DO NOTHING) and, only
for a tick it inserted, the job and its state row. What to fire is decided in
`schedules.firing`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from .cursors import fetch_all
from .session import Session


def due_schedules(session: Session, queues: Sequence[str]) -> list[tuple[Any, ...]]:
    """The enabled schedules of `queues`, each with its next tick and the database's now()."""
    return session.run("schedule_list_for_queues", {"queues": queues})


def advance(
    session: Session, name: str, next_tick: dt.datetime, expected: dt.datetime | None
) -> bool:
    """Move `name`'s next tick to `next_tick` without firing, if it still is `expected`."""
    params = {"name": name, "next_tick": next_tick, "expected": expected}
    return bool(session.run("schedule_advance", params))


def fire(session: Session, params: dict[str, Any]) -> int | None:
    """Fire one tick (``schedule_fire``'s parameters); its job's id, or None when
    another worker fired it or moved the schedule."""
    rows = session.run("schedule_fire", params)
    return int(rows[0][0]) if rows else None


def code_set_newest(session: Session, fingerprint: str, alive: float) -> bool:
    """Note that this worker runs the code schedules of `fingerprint` now; whether they
    are the newest set still running (seen within `alive` seconds)."""
    params = {"fingerprint": fingerprint, "alive": alive}
    return bool(session.run("schedule_code_newest", params)[0][0])


def sync_schedule(session: Session, params: dict[str, Any]) -> bool:
    """Upsert one schedule declared in code (``schedule_sync``'s parameters); False when
    a schedule of that name is defined in the database (left as it is)."""
    return bool(session.run("schedule_sync", params))


def disable_removed(session: Session, names: Sequence[str]) -> list[str]:
    """Disable the code schedules no longer declared (not in `names`); their names."""
    return [name for (name,) in session.run("schedule_disable_removed", {"names": names})]


def late_schedules(alias: str, seconds: float) -> list[tuple[Any, ...]]:
    """(name, queue, due_at, late seconds) of the enabled schedules whose due tick has
    waited more than `seconds`, on Django's connection `alias`."""
    return fetch_all(alias, "schedule_late", {"seconds": seconds})
