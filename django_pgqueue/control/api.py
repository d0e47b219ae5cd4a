"""Pause, resume and limit queues at run time, from Python.

Each call writes the queue's queue_controls row (creating it) and takes effect within
one poll interval on every worker: workers refresh their view of queue_controls every
half POLL_INTERVAL. Run-time changes stand until the queue's entry in
PGQUEUE["QUEUES"] itself changes (see `control.store.sync_settings`).
"""

from __future__ import annotations

from typing import Any

from ..conf import get_settings
from ..exceptions import ConfigurationError
from ..limits import check_limit, parse_rate, type_name
from ..validators import QUEUE_NAME_RE
from . import store


def _queue(queue: Any) -> str:
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        raise ConfigurationError(
            f"queue must be a queue name matching {QUEUE_NAME_RE.pattern}, got {queue!r}."
        )
    return queue


def pause_queue(queue: str, *, alias: str | None = None) -> dict[str, Any]:
    """Stop every worker claiming jobs of `queue` (running jobs finish; enqueue still works)."""
    return store.update_control(alias or get_settings().DATABASE, _queue(queue), paused=True)


def resume_queue(queue: str, *, alias: str | None = None) -> dict[str, Any]:
    """Let workers claim jobs of a paused `queue` again."""
    return store.update_control(alias or get_settings().DATABASE, _queue(queue), paused=False)


def set_queue_limit(queue: str, limit: int | None, *, alias: str | None = None) -> dict[str, Any]:
    """Allow at most `limit` running jobs of `queue` across all workers (None: no limit)."""
    limit = check_limit(limit, "limit")
    return store.update_control(
        alias or get_settings().DATABASE, _queue(queue), concurrency_limit=limit
    )


def set_key_limit(
    queue: str, limit: int | None, *, type: str | None = None, alias: str | None = None
) -> dict[str, Any]:
    """Allow at most `limit` running jobs of `queue` sharing one concurrency key.

    With `type`, the limit of that job type's keyed jobs in `queue` instead (None: the
    queue's key limit applies to them again).
    """
    checked = check_limit(limit, "key_limit", low=1)
    alias = alias or get_settings().DATABASE
    if type is not None:
        return store.update_type_control(alias, _queue(queue), type_name(type), key_limit=checked)
    if checked is None:
        raise ConfigurationError("key_limit must be an integer >= 1, got None.")
    return store.update_control(alias, _queue(queue), key_limit=checked)


def set_queue_rate(
    queue: str, rate: str | None, *, type: str | None = None, alias: str | None = None
) -> dict[str, Any]:
    """Allow at most N job starts of `queue` per period ("100/s", "5/m"; None: no limit).

    With `type`, at most N starts of that job type's jobs in `queue` per period (besides
    the queue's own rate, if it has one).
    """
    alias = alias or get_settings().DATABASE
    if type is not None:
        return store.update_type_control(
            alias, _queue(queue), type_name(type), rate=parse_rate(rate)
        )
    return store.update_control(alias, _queue(queue), rate=parse_rate(rate))


def queue_controls(*, alias: str | None = None) -> list[dict[str, Any]]:
    """Every controlled queue: paused, limits, rate, running jobs, recent starts and its
    per-type limits (`types`: a list of {type, key_limit, rate_count, rate_period})."""
    return store.show_controls(alias or get_settings().DATABASE)
