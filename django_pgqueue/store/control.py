"""Queue control's statements: the controlled claim on a worker's connection, and the
operator's writes and reads of queue_controls on the caller's Django connection.

The controlled claim is one pipeline and one transaction (``transaction_guard``, the
completions whose slots it may reuse, ``queue_control_lock``, ``job_claim_controlled``,
``queue_control_state``): one round trip, the queue's row locked until it commits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from ..sql import QUERIES
from .cursors import django_cursor
from .rows import ClaimedRow, Completion, complete_params
from .session import Session


def controlled_queues(session: Session) -> frozenset[str]:
    """The queues whose claims go through the controlled claim (``queue_control_list``)."""
    return frozenset(row[0] for row in session.run("queue_control_list", {}))


def claim_controlled(
    session: Session,
    done: Sequence[Completion] | None,
    claim: dict[str, Any],
    idle_ms: int,
) -> tuple[list[tuple[Any, ...]], list[ClaimedRow], tuple[Any, ...] | None]:
    """Complete `done` (None: nothing) and claim from a controlled queue, in one pipeline.

    `claim` holds job_claim_controlled's parameters; `idle_ms` bounds how long the
    transaction may wait on this client (``transaction_guard``). Returns job_complete's
    rows, the rows claimed and ``queue_control_state``'s row: why a claim may have come
    back short.
    """
    queue = claim["queue"]
    with session.holding("job_claim_controlled") as conn:
        # One pipeline, one implicit transaction (no Sync until it ends): the
        # completions (whose slots this claim may reuse), the queue lock, the claim
        # under it, and the state after it. The lock ends with it.
        cursors = [conn.cursor() for _ in range(5)]
        try:
            with session.pipelined(conn, "job_claim_controlled"):
                cursors[4].execute(QUERIES["transaction_guard"], {"idle_ms": idle_ms})
                if done:
                    cursors[0].execute(QUERIES["job_complete"], complete_params(done))
                cursors[1].execute(QUERIES["queue_control_lock"], {"queue": queue})
                cursors[2].execute(QUERIES["job_claim_controlled"], claim)
                cursors[3].execute(QUERIES["queue_control_state"], {"queue": queue})
            done_rows = cursors[0].fetchall() if done else []
            rows = [ClaimedRow._make(row) for row in cursors[2].fetchall()]
            state = cursors[3].fetchone()
        finally:
            for cursor in cursors:
                cursor.close()
    return done_rows, rows, state


# -- the operator's writes and reads, on the caller's Django connection ----------------


def sync_settings(alias: str, entries: Sequence[dict[str, Any]]) -> list[str]:
    """Write PGQUEUE["QUEUES"] entries into queue_controls; return the queues changed.

    Each entry holds queue_control_sync's parameters and `types` (its per-type limits,
    {type: {key_limit, rate_count, rate_period}}). A queue's row is rewritten only when
    its entry differs from the one written last time (`configured`), and then its
    per-type limits with it.
    """
    changed = []
    with transaction.atomic(using=alias), django_cursor(alias) as cursor:
        for entry in entries:
            params = {key: value for key, value in entry.items() if key != "types"}
            cursor.execute(QUERIES["queue_control_sync"], params)
            if not cursor.fetchall():
                continue
            changed.append(entry["queue"])
            types = {"queue": entry["queue"], "types": json.dumps(entry["types"])}
            cursor.execute(QUERIES["queue_type_control_sync"], types)
    return changed


def update_control(alias: str, queue: str, changes: dict[str, Any]) -> dict[str, Any]:
    """Write `changes` (columns of queue_controls) to `queue`'s row; return the row."""
    params = {"queue": queue, "changes": json.dumps(changes)}
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["queue_control_update"], params)
        names = [column.name for column in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def update_type_control(
    alias: str, queue: str, type_: str, changes: dict[str, Any]
) -> dict[str, Any]:
    """Write `changes` to one type's limits within `queue`; return its row.

    In one transaction: the queue's own row first (its claims lock it, which keeps the
    type's rate window exact), then the type's, removed if it is left limiting nothing.
    """
    params = {"queue": queue, "type": type_, "changes": json.dumps(changes)}
    with transaction.atomic(using=alias):
        update_control(alias, queue, {})
        with django_cursor(alias) as cursor:
            cursor.execute(QUERIES["queue_type_control_update"], params)
            names = [column.name for column in cursor.description]
            row = dict(zip(names, cursor.fetchone(), strict=True))
            cursor.execute(QUERIES["queue_type_control_prune"], {"queue": queue, "type": type_})
    return row


def show_controls(alias: str) -> list[dict[str, Any]]:
    """Every controlled queue with its settings, running jobs, recent starts and types."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["queue_control_show"], {})
        names = [column.name for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        row["types"] = json.loads(row["types"])
    return rows
