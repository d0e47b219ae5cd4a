"""enqueue() and enqueue_many(): validate everything, then write in one statement.

Both run on the caller's Django connection, so inside ``transaction.atomic()`` a job
exists only if the caller's transaction commits, and idle workers are woken by a
NOTIFY that PostgreSQL delivers only at that commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import store, validation
from .conf import get_settings
from .exceptions import EnqueueError, PayloadError
from .registry import registry


@dataclass(frozen=True, slots=True)
class EnqueuedJob:
    """A job as enqueue() left it. `created` is False when an idempotency key matched.

    `created_at` is the job's database timestamp (the enqueuing transaction's start);
    enqueue() fills it, enqueue_many() leaves it None.
    """

    id: int
    queue: str
    type: str
    created: bool = True
    created_at: dt.datetime | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for enqueue_many(); None fields take the call's (then the settings') defaults."""

    type: str
    payload: Any = None
    queue: str | None = None
    priority: int | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    max_attempts: int | None = None
    idempotency_key: str | None = None


def _default_max_attempts(type_: str) -> int:
    registry.autodiscover()
    spec = registry.find(type_)
    if spec is not None and spec.max_attempts is not None:
        return spec.max_attempts
    return get_settings().MAX_ATTEMPTS


def _prepare(
    type_: Any,
    payload: Any,
    *,
    queue: Any,
    priority: Any,
    run_at: Any,
    delay: Any,
    max_attempts: Any,
    idempotency_key: Any,
) -> dict[str, Any]:
    conf = get_settings()
    type_ = validation.type_name(type_)
    queue = validation.queue_name(conf.DEFAULT_QUEUE if queue is None else queue)
    priority = validation.priority(conf.DEFAULT_PRIORITY if priority is None else priority)
    when, seconds = validation.schedule(run_at, delay)
    attempts = validation.max_attempts(
        _default_max_attempts(type_) if max_attempts is None else max_attempts
    )
    key = validation.idempotency_key(idempotency_key)
    text = validation.payload(payload, conf.MAX_PAYLOAD_BYTES)
    return {
        "queue": queue,
        "type": type_,
        "payload": text,
        "priority": priority,
        "run_at": when,
        "delay": seconds,
        "max_attempts": attempts,
        "idempotency_key": key,
    }


def enqueue(
    type: str,
    payload: Any = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    idempotency_key: str | None = None,
    using: str | None = None,
) -> EnqueuedJob:
    """Add a job to a queue, in the caller's transaction.

    `payload` is any JSON value. `priority` runs from -100 to 100, higher first.
    `run_at` (aware datetime) or `delay` (seconds or timedelta) defer the job. With an
    `idempotency_key`, a second enqueue while a job with that key is pending or running
    in the same queue returns that job (``created=False``) instead of adding one.
    Everything is validated before anything is written.
    """
    params = _prepare(
        type,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
    )
    job_id, created, created_at = store.insert_job(using or get_settings().DATABASE, params)
    return EnqueuedJob(job_id, params["queue"], params["type"], created, created_at)


def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]],
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    using: str | None = None,
) -> list[EnqueuedJob]:
    """Add many jobs in one statement, in the caller's transaction.

    Each item is a `JobSpec` or a ``(type, payload)`` pair; the keyword arguments are
    defaults for items that leave a field unset. Every item is validated before
    anything is written: one bad item refuses the whole call, naming its position.
    Returns one `EnqueuedJob` per item, in order.
    """
    columns: dict[str, list[Any]] = {
        "queues": [],
        "types": [],
        "payloads": [],
        "priorities": [],
        "run_ats": [],
        "delays": [],
        "max_attempts": [],
        "idempotency_keys": [],
    }
    for position, item in enumerate(jobs):
        if isinstance(item, tuple) and len(item) == 2:
            item = JobSpec(item[0], item[1])
        if not isinstance(item, JobSpec):
            raise EnqueueError(
                f"enqueue_many item {position} must be a JobSpec or a (type, payload) pair, "
                f"got {type(item).__name__}."
            )
        # An item's own schedule (run_at or delay) replaces the call's as a whole.
        own_schedule = item.run_at is not None or item.delay is not None
        try:
            params = _prepare(
                item.type,
                item.payload,
                queue=item.queue if item.queue is not None else queue,
                priority=item.priority if item.priority is not None else priority,
                run_at=item.run_at if own_schedule else run_at,
                delay=item.delay if own_schedule else delay,
                max_attempts=item.max_attempts if item.max_attempts is not None else max_attempts,
                idempotency_key=item.idempotency_key,
            )
        except PayloadError as exc:
            raise PayloadError(f"enqueue_many item {position}: {exc}", exc.path) from exc
        except EnqueueError as exc:
            raise EnqueueError(f"enqueue_many item {position}: {exc}") from exc
        for column, key in (
            ("queues", "queue"),
            ("types", "type"),
            ("payloads", "payload"),
            ("priorities", "priority"),
            ("run_ats", "run_at"),
            ("delays", "delay"),
            ("max_attempts", "max_attempts"),
            ("idempotency_keys", "idempotency_key"),
        ):
            columns[column].append(params[key])
    if not columns["types"]:
        return []
    rows = store.insert_jobs(using or get_settings().DATABASE, columns)
    return [
        EnqueuedJob(job_id, queue_, type_, created)
        for (job_id, created), queue_, type_ in zip(
            rows, columns["queues"], columns["types"], strict=True
        )
    ]
