"""Schedule declarations: what a schedule is, read from code and checked.

Code declares schedules in three places, all collected by `code_schedules()`:
``@django_pgqueue.handler(type, schedule=...)``, ``PGQUEUE["SCHEDULES"]`` and the
``SCHEDULES`` option of a ``PgQueueBackend`` in ``TASKS`` (for ``@task`` functions).
The built-in prune (``PGQUEUE["PRUNE"]``) joins them, unless turned off.
A declaration is a cron expression or an interval, plus optional queue, payload,
timezone, catch_up ('once' or 'skip'), priority and max_attempts. Problems are
reported by the system checks (`django_pgqueue.schedules.checks`), naming the
schedule, before the first tick.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from .. import prune_policy, validation
from ..durations import parse_duration
from ..registry import registry
from ..task_paths import import_task
from ..validators import MAX_PRIORITY, MIN_PRIORITY, QUEUE_NAME_RE
from .ticks import Ticks

CATCH_UP_MODES = ("once", "skip")
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}\Z")
KEYS = ("type", "cron", "every", "queue", "payload", "timezone", "catch_up", "priority",
        "max_attempts")  # fmt: skip
TASK_KEYS = ("task", "cron", "every", "queue", "args", "kwargs", "timezone", "catch_up",
             "priority")  # fmt: skip


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule as declared: its name, the job it makes, and when."""

    name: str
    type: str
    cron: str | None = None
    every: dt.timedelta | None = None
    queue: str | None = None  # None: PGQUEUE["DEFAULT_QUEUE"]
    payload: Any = field(default_factory=dict)
    timezone: str | None = None  # None: settings.TIME_ZONE
    catch_up: str = "once"
    priority: int = 0
    max_attempts: int | None = None
    origin: str = ""  # where it was declared, for messages

    @property
    def zone_name(self) -> str:
        return self.timezone or getattr(settings, "TIME_ZONE", None) or "UTC"

    def ticks(self) -> Ticks:
        """The tick times; ValueError naming the problem if cron, every or zone is bad."""
        return Ticks(cron=self.cron, every=self.every, timezone=self.zone_name)

    def problems(self) -> list[str]:
        """What is wrong with this declaration (empty when nothing is)."""
        found = []
        if not isinstance(self.name, str) or not NAME_RE.match(self.name):
            found.append(f"the name must match {NAME_RE.pattern}")
        try:
            validation.type_name(self.type)
        except (ValueError, TypeError) as exc:
            found.append(str(exc))
        try:
            self.ticks()
        except ValueError as exc:
            found.append(str(exc))
        if self.queue is not None and (
            not isinstance(self.queue, str) or not QUEUE_NAME_RE.match(self.queue)
        ):
            found.append(f"queue {self.queue!r} is not a queue name")
        if self.catch_up not in CATCH_UP_MODES:
            found.append(f"catch_up must be 'once' or 'skip', got {self.catch_up!r}")
        if (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not MIN_PRIORITY <= self.priority <= MAX_PRIORITY
        ):
            found.append(f"priority must be an integer in -100..100, got {self.priority!r}")
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            found.append(f"max_attempts must be an integer >= 1, got {self.max_attempts!r}")
        try:
            json.dumps(self.payload, allow_nan=False)
        except (TypeError, ValueError) as exc:
            found.append(f"the payload is not JSON: {exc}")
        return found


def interval(value: Any) -> dt.timedelta:
    """An ``every`` value: seconds, a timedelta, or a duration such as '30s' or '1h30m'."""
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return dt.timedelta(seconds=value)
    if isinstance(value, str):
        return parse_duration(value)
    raise ValueError(f"every must be seconds, a timedelta or a duration like '5m', got {value!r}")


def from_mapping(name: str, raw: Any, origin: str, *, keys: tuple[str, ...] = KEYS) -> ScheduleSpec:
    """Read one declaration dict; ValueError naming the bad key."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        listed = ", ".join(map(repr, unknown))
        raise ValueError(f"unknown key(s) {listed}; known: {', '.join(keys)}")
    if "type" in keys and "type" not in raw:
        raise ValueError("'type' (the job type to enqueue) is missing")
    every = raw.get("every")
    return ScheduleSpec(
        name=name,
        type=raw.get("type", ""),
        cron=raw.get("cron"),
        every=None if every is None else interval(every),
        queue=raw.get("queue"),
        payload=raw.get("payload", {}),
        timezone=raw.get("timezone"),
        catch_up=raw.get("catch_up", "once"),
        priority=raw.get("priority", 0),
        max_attempts=raw.get("max_attempts"),
        origin=origin,
    )


def from_handler(type_: str, schedule: Any, origin: str) -> ScheduleSpec:
    """The schedule of ``@handler(type_, schedule=...)``: a cron string, an interval, or a dict."""
    if isinstance(schedule, Mapping):
        return from_mapping(type_, {"type": type_, **schedule}, origin)
    if isinstance(schedule, str) and len(schedule.split()) == 1:
        return ScheduleSpec(name=type_, type=type_, every=interval(schedule), origin=origin)
    if isinstance(schedule, str):
        return ScheduleSpec(name=type_, type=type_, cron=schedule, origin=origin)
    return ScheduleSpec(name=type_, type=type_, every=interval(schedule), origin=origin)


def from_task_option(name: str, raw: Any, backend: str, origin: str) -> ScheduleSpec:
    """A schedule of a Tasks backend's OPTIONS["SCHEDULES"]: a @task path and its arguments."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"must be a dict, got {type(raw).__name__}")
    if "task" not in raw:
        raise ValueError("'task' (the @task function's module path) is missing")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list | tuple) or not isinstance(kwargs, Mapping):
        raise ValueError("args must be a list and kwargs a dict")
    rest = {k: v for k, v in raw.items() if k not in ("task", "args", "kwargs")}
    if "queue" not in rest:  # the task's own queue_name, as task.enqueue() would use
        task = import_task(raw["task"]) if isinstance(raw["task"], str) else None
        if task is not None:
            rest["queue"] = task.queue_name
    payload = {"args": list(args), "kwargs": dict(kwargs), "backend": backend}
    return from_mapping(
        name, {**rest, "type": raw["task"], "payload": payload}, origin, keys=(*KEYS, *TASK_KEYS)
    )


@dataclass
class Declarations:
    """Every schedule declared in code, and the declarations that could not be read."""

    specs: list[ScheduleSpec] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def duplicates(self) -> dict[str, list[str]]:
        """Names declared more than once, with where each declaration is."""
        seen: dict[str, list[str]] = {}
        for spec in self.specs:
            seen.setdefault(spec.name, []).append(spec.origin)
        return {name: origins for name, origins in seen.items() if len(origins) > 1}


def builtin_prune(origin: str) -> ScheduleSpec | None:
    """The built-in prune's schedule, as PGQUEUE["PRUNE"] times it (None when off)."""
    raw = (getattr(settings, "PGQUEUE", None) or {}).get("PRUNE", prune_policy.DEFAULTS)
    policy = prune_policy.parse(raw, origin)
    if policy is None:
        return None
    return ScheduleSpec(
        name=prune_policy.PRUNE_TYPE,
        type=prune_policy.PRUNE_TYPE,
        cron=policy.cron,
        every=policy.every,
        queue=policy.queue,
        payload=policy.payload(),
        catch_up="once",
        origin=origin,
    )


def code_schedules() -> Declarations:
    """Collect the schedules declared by handlers, PGQUEUE["SCHEDULES"] and Tasks backends."""
    found = Declarations()

    def add(origin: str, make: Any) -> None:
        try:
            made = make()
        except ValueError as exc:
            found.errors.append(f"{origin}: {exc}")
            return
        if made is not None:
            found.specs.append(made)

    registry.autodiscover()
    for type_ in registry.types():
        spec = registry.find(type_)
        if spec is not None and spec.schedule is not None:
            origin = f"@handler({type_!r}, schedule=...)"
            add(origin, lambda t=type_, s=spec.schedule, o=origin: from_handler(t, s, o))
    raw = (getattr(settings, "PGQUEUE", None) or {}).get("SCHEDULES") or {}
    if isinstance(raw, Mapping):
        for name, entry in raw.items():
            origin = f"PGQUEUE['SCHEDULES'][{name!r}]"
            add(origin, lambda n=name, e=entry, o=origin: from_mapping(n, e, o))
    else:
        found.errors.append(f"PGQUEUE['SCHEDULES'] must be a dict, got {type(raw).__name__}")
    origin = "PGQUEUE['PRUNE']"
    add(origin, lambda: builtin_prune(origin))
    for alias, config in (getattr(settings, "TASKS", None) or {}).items():
        if not str(config.get("BACKEND", "")).startswith("django_pgqueue."):
            continue
        entries = (config.get("OPTIONS") or {}).get("SCHEDULES") or {}
        if not isinstance(entries, Mapping):
            found.errors.append(f"TASKS[{alias!r}]['OPTIONS']['SCHEDULES'] must be a dict")
            continue
        for name, entry in entries.items():
            origin = f"TASKS[{alias!r}]['OPTIONS']['SCHEDULES'][{name!r}]"
            add(origin, lambda n=name, e=entry, a=alias, o=origin: from_task_option(n, e, a, o))
    return found
