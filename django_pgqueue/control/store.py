"""The controlled claim and the control writes: the only code that runs their SQL.

`ControlledStore` is the worker's `Store` with three additions: a claim from a queue
that has a queue_controls row goes through ``queue_control_lock`` +
``job_claim_controlled`` + ``queue_control_state`` (one pipeline, one transaction,
one round trip), chosen from a view of queue_controls refreshed every half poll
interval; a `Failure` that is a snooze is written with ``job_snooze``; and a renewal
reports the jobs an operator asked to cancel. Queues without a row claim with the
plain claim, which leaves keyed jobs to the controlled one. The rest runs on the
caller's Django connection.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import DatabaseError, connections, transaction

from ..conf import get_settings
from ..outcomes import Failure
from ..sql import QUERIES
from ..store.cursors import django_cursor
from ..store.worker import ClaimedRow, ClaimRequest, Store, _complete_params
from .limits import QueueLimits

logger = logging.getLogger(__name__)

# How soon a worker tries again a queue whose claim was cut by its concurrency limit:
# a slot frees when another worker's job ends, which no NOTIFY announces. The wait
# doubles while the queue stays full (long jobs), up to the poll interval, so full
# queues are not polled hundreds of times a second; a worker that frees a slot itself
# claims again at once (see `frees_slots`).
FULL_RECHECK = 0.005
FULL_BACKOFF_STEPS = 8
# How many pending jobs a controlled claim may walk past, per job asked for, looking
# for keys under their limit.
SCAN_FACTOR = 8
MAX_SCAN = 1000
# How long a controlled claim's transaction may wait on its own client (see
# transaction_guard): the longest a frozen worker can stall a queue's claims.
LOCK_IDLE_MS = 1000


@dataclass(frozen=True)
class ControlState:
    """Why a controlled claim may have come back short."""

    paused: bool
    full: bool
    rate_wait: float | None

    def recheck_after(self, poll_interval: float, full_streak: int = 0) -> float:
        """Seconds until a claim of this queue could take a job again."""
        if self.paused:
            return poll_interval
        waits = [poll_interval]
        if self.rate_wait is not None:
            waits.append(self.rate_wait)
        if self.full:
            waits.append(FULL_RECHECK * 2 ** min(full_streak, FULL_BACKOFF_STEPS))
        return max(0.0, min(waits))


def scan_size(limit: int) -> int:
    """Pending jobs a controlled claim of `limit` jobs may walk."""
    return min(MAX_SCAN, max(limit, limit * SCAN_FACTOR))


class ControlledStore(Store):
    """A `Store` whose claims respect queue_controls."""

    def __init__(
        self, alias: str, application_name: str, poll_interval: float | None = None
    ) -> None:
        super().__init__(alias, application_name)
        # The view of queue_controls is refreshed every half poll interval: a pause
        # or a new limit on a queue this worker claims without controls then holds
        # within one interval, the claim sent just before a refresh included (a full
        # interval left that claim's start up to a round trip past it).
        self.poll_interval = poll_interval
        self._controlled: frozenset[str] = frozenset()
        self._controls_due = 0.0
        self.states: dict[str, ControlState] = {}
        self._full_streak: dict[str, int] = {}
        # Job ids the last renewal reported as cancel-requested.
        self.cancel_requested: set[int] = set()
        # Controlled queues where this worker finished a job since the scheduler looked.
        self._freed: set[str] = set()

    # -- the per-poll view ----------------------------------------------------------

    def controlled(self, queue: str) -> bool:
        """Whether claims of `queue` go through the controlled claim (view per poll)."""
        now = time.monotonic()
        if now >= self._controls_due:
            self.refresh_view(now)
        return queue in self._controlled

    def refresh_view(self, now: float) -> frozenset[str]:
        """Read which queues are controlled now; return those that were not before.

        A queue that became controlled counts as one where a slot freed (see
        `take_freed`): the plain claim took nothing from it if it became keyed, so the
        scheduler tries it again at once, with the controlled claim.
        """
        rows = self._run("queue_control_list", {})
        fresh = frozenset(row[0] for row in rows)
        became = fresh - self._controlled
        self._controlled = fresh
        self._controls_due = now + (self.poll_interval or get_settings().POLL_INTERVAL) / 2
        self._freed |= became
        return became

    def recheck_after(self, queue: str, poll_interval: float) -> float:
        """Seconds before a short claim of `queue` is worth retrying (poll_interval if unknown)."""
        state = self.states.pop(queue, None)
        if state is None:
            return poll_interval
        streak = self._full_streak.get(queue, 0)
        self._full_streak[queue] = streak + 1 if state.full else 0
        return state.recheck_after(poll_interval, streak)

    def frees_slots(self, queue: str) -> bool:
        """Whether finishing a job of `queue` frees a slot worth claiming again at once."""
        return queue in self._controlled

    def controls_any(self) -> bool:
        """Whether any queue is controlled (as of the last view)."""
        return bool(self._controlled)

    def slot_freed(self, queue: str) -> None:
        """Note that a job of `queue` finished here (a controlled queue's slot frees)."""
        if queue in self._controlled:
            self._freed.add(queue)

    def take_freed(self) -> set[str]:
        """The controlled queues where a slot freed since the last call."""
        freed, self._freed = self._freed, set()
        return freed

    # -- claims ---------------------------------------------------------------------

    def _claim(
        self, done: Sequence[tuple[int, int, int, str | None]] | None, request: ClaimRequest
    ) -> tuple[set[int], list[ClaimedRow]]:
        """Claim like `Store`; a controlled queue's claim respects its controls."""
        queue, limit, worker_id, lease, _ = request
        if not self.controlled(queue):
            return super()._claim(done, request)
        claim = {
            "queue": queue,
            "limit": limit,
            "scan": scan_size(limit),
            "worker_id": worker_id,
            "lease": lease,
        }
        with self._holding("job_claim_controlled") as conn:
            done_rows, rows, state = self._pipeline(conn, done, queue, claim)
        if state is not None:
            self.states[queue] = ControlState(bool(state[0]), bool(state[1]), state[2])
        return self._completed(done_rows), rows

    def _pipeline(
        self,
        conn: psycopg.Connection[Any],
        done: Sequence[tuple[int, int, int, str | None]] | None,
        queue: str,
        claim: dict[str, Any],
    ) -> tuple[list[tuple[Any, ...]], list[ClaimedRow], tuple[Any, ...] | None]:
        # One pipeline, one implicit transaction (no Sync until it ends): the
        # completions (whose slots this claim may reuse), the queue lock, the claim
        # under it, and the state after it. The lock ends with it.
        cursors = [conn.cursor() for _ in range(5)]
        try:
            with self._pipelined(conn, "job_claim_controlled"):
                cursors[4].execute(QUERIES["transaction_guard"], {"idle_ms": LOCK_IDLE_MS})
                if done:
                    cursors[0].execute(QUERIES["job_complete"], _complete_params(done))
                cursors[1].execute(QUERIES["queue_control_lock"], {"queue": queue})
                cursors[2].execute(QUERIES["job_claim_controlled"], claim)
                cursors[3].execute(QUERIES["queue_control_state"], {"queue": queue})
            done_rows = cursors[0].fetchall() if done else []
            rows = [ClaimedRow._make(row) for row in cursors[2].fetchall()]
            return done_rows, rows, cursors[3].fetchone()
        finally:
            for cursor in cursors:
                cursor.close()

    # -- outcomes -------------------------------------------------------------------

    def _failure(self, failure: Failure) -> tuple[str, dict[str, Any]]:
        """`Store`'s, or a snooze (``job_snooze``) when the failure is one."""
        if not getattr(failure, "snoozed", False):
            return super()._failure(failure)
        return "job_snooze", {"delay": failure.delay, "reason": failure.message}

    def renew(self, held: Sequence[tuple[int, int]], lease: float) -> set[int]:
        """`Store.renew`; also note in `cancel_requested` the jobs an operator cancelled."""
        rows = self._renewed(held, lease)
        self.cancel_requested = {row[0] for row in rows if row[1]}
        return {row[0] for row in rows}


# -- operator writes and reads, on the caller's Django connection ----------------------


def sync_settings(alias: str, queues: dict[str, QueueLimits]) -> list[str]:
    """Write PGQUEUE["QUEUES"] into queue_controls; return the queues whose row changed.

    A queue's row is rewritten only when its setting differs from the one written
    last time, so run-time edits stand until the setting itself changes.
    """
    changed = []
    with transaction.atomic(using=alias), django_cursor(alias) as cursor:
        for queue, limits in sorted(queues.items()):
            cursor.execute(
                QUERIES["queue_control_sync"],
                {
                    "queue": queue,
                    "concurrency_limit": limits.limit,
                    "key_limit": limits.key_limit,
                    "rate_count": limits.rate_count,
                    "rate_period": limits.rate_period,
                    "configured": json.dumps(limits.as_json(), sort_keys=True),
                },
            )
            if not cursor.fetchall():
                continue
            changed.append(queue)
            types = {name: t.as_json() for name, t in limits.types.items()}
            cursor.execute(
                QUERIES["queue_type_control_sync"], {"queue": queue, "types": json.dumps(types)}
            )
    return changed


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
    params = {
        "queue": queue,
        "paused": paused,
        "set_limit": concurrency_limit is not UNSET,
        "concurrency_limit": None if concurrency_limit is UNSET else concurrency_limit,
        **_limit_params(key_limit, rate),
    }
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["queue_control_update"], params)
        names = [column.name for column in cursor.description]
        return dict(zip(names, cursor.fetchone(), strict=True))


def _limit_params(key_limit: Any, rate: Any) -> dict[str, Any]:
    """The key-limit and rate parameters of an update: set_* says whether each changes."""
    return {
        "set_key_limit": key_limit is not UNSET,
        "key_limit": None if key_limit is UNSET else key_limit,
        "set_rate": rate is not UNSET,
        "rate_count": None if rate is UNSET or rate is None else rate[0],
        "rate_period": None if rate is UNSET or rate is None else rate[1],
    }


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
    params = {
        "queue": queue,
        "type": type_,
        **_limit_params(key_limit, rate),
    }
    with transaction.atomic(using=alias):
        update_control(alias, queue)
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


def request_cancel(alias: str, job_ids: Sequence[int]) -> set[int]:
    """Mark running jobs as cancel-requested; return those marked."""
    with django_cursor(alias) as cursor:
        cursor.execute(QUERIES["job_cancel_request"], {"job_ids": list(job_ids)})
        return {row[0] for row in cursor.fetchall()}


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
