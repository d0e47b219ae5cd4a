"""What the operator changes in queue control, in the store's terms, and the settings
written at worker start.

`update_control`, `update_type_control` and `show_controls` are the operator's, for
`api`, the admin and the ``queue_control`` command: arguments left out stay as they
are. `sync_queue_controls` writes PGQUEUE["QUEUES"] into queue_controls at worker
start (through `sync_settings`). The statements are `store.control`'s.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from django.db import DatabaseError, connections

from ..conf import get_settings
from ..limits import QueueLimits
from ..store import control as control_store

logger = logging.getLogger(__name__)


def sync_settings(alias: str, queues: dict[str, QueueLimits]) -> list[str]:
    """Write PGQUEUE["QUEUES"] into queue_controls; return the queues whose row changed.

    A queue's row is rewritten only when its setting differs from the one written
    last time, so run-time edits stand until the setting itself changes.
    """
    entries = [
        {
            "queue": queue,
            "concurrency_limit": limits.limit,
            "key_limit": limits.key_limit,
            "rate_count": limits.rate_count,
            "rate_period": limits.rate_period,
            "configured": json.dumps(limits.as_json(), sort_keys=True),
            "types": {name: t.as_json() for name, t in limits.types.items()},
        }
        for queue, limits in sorted(queues.items())
    ]
    return control_store.sync_settings(alias, entries)


UNSET: Any = object()


def update_control(
    alias: str,
    queue: str,
    *,
    paused: bool | None = None,
    concurrency_limit: int | None = UNSET,
    key_limit: int = UNSET,
    rate: tuple[int, float] | None = UNSET,
) -> dict[str, Any]:
    """Change a queue's controls (arguments left out stay as they are); return its row."""
    changes = _limit_changes(key_limit, rate)
    if paused is not None:
        changes["paused"] = paused
    if concurrency_limit is not UNSET:
        changes["concurrency_limit"] = concurrency_limit
    return control_store.update_control(alias, queue, changes)


def _limit_changes(key_limit: Any, rate: Any) -> dict[str, Any]:
    """The key-limit and rate columns an update writes: only those given (None removes)."""
    changes: dict[str, Any] = {}
    if key_limit is not UNSET:
        changes["key_limit"] = key_limit
    if rate is not UNSET:
        changes["rate_count"], changes["rate_period"] = rate if rate is not None else (None, None)
    return changes


def update_type_control(
    alias: str,
    queue: str,
    type_: str,
    *,
    key_limit: int | None = UNSET,
    rate: tuple[int, float] | None = UNSET,
) -> dict[str, Any]:
    """Change one type's limits within `queue` (arguments left out stay); return its row.

    The queue gets a queue_controls row if it has none: its claims lock that row, which
    is what keeps the type's rate window exact. A type left with no limit is removed.
    """
    return control_store.update_type_control(alias, queue, type_, _limit_changes(key_limit, rate))


def show_controls(alias: str) -> list[dict[str, Any]]:
    """Every controlled queue with its settings, running jobs, recent starts and types."""
    return control_store.show_controls(alias)


def sync_queue_controls(alias: str) -> None:
    """Write PGQUEUE["QUEUES"] at worker start; a database error is logged, not raised.

    A worker that cannot reach the database yet starts anyway (it reconnects with
    backoff); the rows then keep what an earlier start or an operator wrote.
    """
    queues = get_settings().QUEUES
    if not queues:
        return
    try:
        changed = sync_settings(alias, queues)
    except DatabaseError as exc:
        logger.warning("queue control: PGQUEUE['QUEUES'] not written (%s)", exc)
    else:
        if changed:
            logger.info("queue control: settings written for %s", ", ".join(changed))
    finally:
        connections[alias].close()
