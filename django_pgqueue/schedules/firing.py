"""Firing due ticks: no beat process, no leader, exactly one job per tick.

Any worker serving a schedule's queue calls `fire_due` every poll cycle on its own
connection. What to fire is decided in Python (`plan`, pure, from the schedule's
``next_tick`` and the database's ``now()``); each tick is then fired by one
statement, ``schedule_fire``, that moves ``next_tick`` by compare-and-set, inserts the
tick row (primary key (schedule, tick_at), ON CONFLICT DO NOTHING) and, only for a
tick it inserted, the job and its state row. However many workers race, one tick
makes one job; a worker that dies mid-statement leaves both rows or neither.

Missed ticks: while due ticks are at most `BURST_LIMIT` and none is older than
`MISFIRE_GRACE`, each fires (a worker that slept through a poll catches up tick by
tick). Past that, the schedule was not being served (a gap): ``catch_up='once'``
fires one job for the latest due tick, standing for the whole gap (its tick row
counts the missed ones); ``'skip'`` fires nothing for the gap. Either way the
schedule then runs on time again; never a burst.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psycopg

from ..conf import get_settings
from ..registry import registry
from ..store import schedules as store_schedules
from ..store.session import Session
from .checks import schedule_problems
from .spec import code_schedules
from .ticks import Ticks

logger = logging.getLogger(__name__)

MISFIRE_GRACE = dt.timedelta(seconds=60)
BURST_LIMIT = 10
# A catch-up counts the ticks it stands for (the count is informative): exactly for an
# interval, and for a cron up to this many, walked one by one on the dispatcher thread
# (about 30 us a tick: a millisecond-scale pause, not the seconds 100,000 cost).
MISSED_COUNT_CAP = 1_000
# The most an interval's count can say (the column is an integer).
MISSED_COUNT_MAX = 2**31 - 1
RUN_NOW = "run-now"


def tick_key(name: str, tick: dt.datetime) -> str:
    """The idempotency key of the job of `name`'s tick at `tick`: schedule:<name>@<UTC ISO>."""
    return f"schedule:{name}@{tick.astimezone(dt.timezone.utc).isoformat()}"


@dataclass
class Plan:
    """What to do with one schedule now: ticks to fire, or where to move next_tick."""

    fires: list[tuple[dt.datetime, dt.datetime, int]] = field(default_factory=list)
    advance: dt.datetime | None = None  # move next_tick here without firing

    @property
    def next_tick(self) -> dt.datetime | None:
        return self.fires[-1][1] if self.fires else self.advance


def plan(ticks: Ticks, next_tick: dt.datetime | None, now: dt.datetime, catch_up: str) -> Plan:
    """Decide which ticks fire at `now` (each as (tick, next tick, missed before it))."""
    if next_tick is None:
        return Plan(advance=ticks.after(now))
    if next_tick > now:
        return Plan()
    due = ticks.between(next_tick, now, BURST_LIMIT + 1)
    if not due:  # next_tick was not a tick of this timing (changed under it)
        return Plan(advance=ticks.after(now))
    if len(due) <= BURST_LIMIT and now - due[0] <= MISFIRE_GRACE:
        following = [*due[1:], ticks.after(due[-1])]
        return Plan(fires=[(tick, nxt, 0) for tick, nxt in zip(due, following, strict=True)])
    latest = ticks.at_or_before(now)
    if catch_up == "skip":
        return Plan(advance=ticks.after(latest))
    cap = MISSED_COUNT_CAP if ticks.cron is not None else MISSED_COUNT_MAX
    missed = ticks.count(next_tick, latest, cap) - 1
    return Plan(fires=[(latest, ticks.after(latest), max(0, missed))])


@dataclass(frozen=True)
class DueRow:
    """One row of schedule_list_for_queues, in its column order."""

    name: str
    type: str
    queue: str
    cron: str | None
    every_seconds: float | None
    timezone: str
    catch_up: str
    next_tick: dt.datetime | None
    db_now: dt.datetime

    def ticks(self) -> Ticks:
        every = None if self.every_seconds is None else dt.timedelta(seconds=self.every_seconds)
        return Ticks(cron=self.cron, every=every, timezone=self.timezone)


def fire_due(store: Session, queues: Sequence[str]) -> float | None:
    """Fire the due ticks of the schedules of `queues`; return seconds until the next one.

    None when no enabled schedule serves these queues. A statement error on one
    schedule is logged and leaves the others firing; a lost connection propagates
    (DatabaseUnavailable), like any other worker statement.
    """
    rows = [DueRow(*row) for row in store_schedules.due_schedules(store, queues)]
    wait: float | None = None
    for row in rows:
        try:
            upcoming = _fire_schedule(store, row)
        except ValueError as exc:
            logger.error("schedule %s cannot fire: %s", row.name, exc)
            continue
        except psycopg.Error as exc:
            logger.error("schedule %s: firing failed: %s", row.name, exc)
            continue
        seconds = 0.0 if upcoming is None else (upcoming - row.db_now).total_seconds()
        wait = seconds if wait is None else min(wait, seconds)
    return None if wait is None else max(0.0, wait)


def _fire_schedule(store: Session, row: DueRow) -> dt.datetime | None:
    """Carry out the plan of one schedule; its next tick, or None if another worker moved it."""
    decided = plan(row.ticks(), row.next_tick, row.db_now, row.catch_up)
    if decided.advance is not None and not decided.fires:
        moved = store_schedules.advance(store, row.name, decided.advance, row.next_tick)
        return decided.advance if moved else None
    expected = row.next_tick
    max_attempts = get_settings().MAX_ATTEMPTS
    for tick, following, missed in decided.fires:
        job_id = store_schedules.fire(
            store,
            {
                "name": row.name,
                "tick_at": tick,
                "next_tick": following,
                "expected": expected,
                "missed": missed,
                "idempotency_key": tick_key(row.name, tick),
                "default_max_attempts": max_attempts,
            },
        )
        if job_id is None:
            return None  # another worker fired it (or moved the schedule): read again
        logger.info(
            "schedule %s: tick %s fired as job %d%s",
            row.name,
            tick.isoformat(),
            job_id,
            f" (catching up {missed} missed ticks)" if missed else "",
            extra={"job_id": job_id, "queue": row.queue},
        )
        expected = following
    return expected


# -- code schedules into the table ------------------------------------------------------


# How often a worker says it still runs its set of code schedules (and, when that set
# was not the newest, looks again), and how long after that the set counts as running.
CODE_RECHECK = 30.0
CODE_ALIVE = 3 * CODE_RECHECK


class CodeSet(NamedTuple):
    """The schedules declared in this process's code, as they would be written."""

    writes: list[tuple[Any, dict[str, Any]]]  # (spec, schedule_sync's parameters)
    names: list[str]  # every name declared, written or not
    complete: bool  # every declaration could be read
    fingerprint: str
    rejected: list[tuple[str, str]]  # (name, why) of the declarations left out


def code_set() -> CodeSet:
    """Read and check the code's schedules. Declarations the system checks reject (bad
    timing, duplicates, unknown types) are left out."""
    declared = code_schedules()
    duplicates = declared.duplicates()
    conf = get_settings()
    writes, rejected = [], []
    for spec in declared.specs:
        problems = schedule_problems(spec)
        if spec.name in duplicates or problems:
            rejected.append((spec.name, "; ".join(problems) or "declared twice"))
            continue
        writes.append((spec, _sync_params(spec, conf.DEFAULT_QUEUE, registry.find(spec.type))))
    names = [spec.name for spec in declared.specs]
    complete = not declared.errors
    fingerprint = _fingerprint([params for _, params in writes], names, not complete)
    return CodeSet(writes, names, complete, fingerprint, rejected)


def code_set_newest(store: Session, code: CodeSet) -> bool:
    """Note that this worker runs `code` now; whether it is the newest set still running."""
    return store_schedules.code_set_newest(store, code.fingerprint, CODE_ALIVE)


def sync_code_schedules(store: Session) -> list[str] | None:
    """Upsert the schedules declared in code and disable those removed; return the names
    synced, or None when a newer set of code schedules still runs (nothing written).

    Nothing is disabled while any declaration could not be read.
    """
    code = code_set()
    for name, why in code.rejected:
        logger.error("schedule %s not synced: %s", name, why)
    if not code_set_newest(store, code):
        logger.info(
            "schedules: workers of newer code run them; this worker's declarations (%s) "
            "are not written while they do",
            code.fingerprint[:12],
        )
        return None
    synced = []
    conf = get_settings()
    for spec, params in code.writes:
        if conf.QUEUE_DATABASES and conf.database_for(params["queue"]) != store.alias:
            continue  # its queue lives on another database: that database's workers sync it
        try:
            written = store_schedules.sync_schedule(store, params)
        except psycopg.Error as exc:
            logger.error("schedule %s not synced: %s", spec.name, exc)
            continue
        if written:
            synced.append(spec.name)
        else:
            logger.warning(
                "schedule %s is defined in the database; its code declaration (%s) is ignored",
                spec.name,
                spec.origin,
            )
    if code.complete:
        for name in store_schedules.disable_removed(store, code.names):
            logger.warning("schedule %s is no longer declared in code: disabled", name)
    return synced


def _fingerprint(writes: list[dict[str, Any]], names: list[str], errors: bool) -> str:
    """What identifies one set of code schedules: every declaration as it is written,
    the names declared, and whether some could not be read."""
    text = json.dumps([sorted(names), errors, writes], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sync_params(spec: Any, default_queue: str, handler: Any) -> dict[str, Any]:
    max_attempts = spec.max_attempts
    if max_attempts is None and handler is not None:
        max_attempts = handler.max_attempts
    return {
        "name": spec.name,
        "type": spec.type,
        "queue": spec.queue or default_queue,
        "cron": spec.cron,
        "every_seconds": None if spec.every is None else spec.every.total_seconds(),
        "payload": json.dumps(spec.payload),
        "timezone": spec.zone_name,
        "catch_up": spec.catch_up,
        "priority": spec.priority,
        "max_attempts": max_attempts,
    }
