"""The claim of each queue: the plain claim, the fair one or the controlled one, and
what they teach.

A queue with a row in queue_controls (a pause, a concurrency limit, a key limit or a
rate, or keyed jobs: their first enqueue writes the row) is claimed by the controlled
claim (``transaction_guard``, the completions whose slots it may reuse,
``queue_control_lock``, ``job_claim_controlled``, ``queue_control_state``: one pipeline,
one transaction); every other queue by the plain claim (the completions, then
``job_claim`` or ``job_claim_after``), which leaves keyed jobs to the controlled one.
Which queues are controlled is read every `view_every` seconds (half the worker's poll
interval): a pause or a limit set on a queue holds within it. A worker that could
claim reads it before it waits, ahead of time (`refresh_ahead`): the claim a NOTIFY
wakes it for does not wait for that read.

A fair queue (PGQUEUE["FAIR_QUEUES"], given by the worker) without controls is claimed
by ``job_claim_fair``: its jobs round-robin across their fair keys, from the key after
the one this worker's previous claim of the queue served last (the last key it walked,
when it took fewer jobs than its limit). After a claim that found one key with pending
jobs and took jobs of it, that key's own statement claims (``job_claim_fair_alone``: no
walk), and ``job_claim_fair`` at once if it takes nothing. A fair queue with
controls is claimed by the controlled claim (limits first; no turns).

What each claim teaches the worker's scheduler: a controlled queue's walk always starts
from the start (under its lock), a short controlled claim is worth retrying as soon as
it could succeed (a slot of a limit frees, a rate window opens) rather than after the
poll interval, and a finished job of a controlled queue frees a slot: its outcome is
written at once and the queue claimed again.

The store owns this (`Store.claims`); the worker asks it. Used by the dispatcher thread
only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from ..sql import QUERIES
from . import control
from .rows import ClaimedRow, ClaimRequest, Completion, claim_statement, complete_params
from .session import Session

# How soon a worker tries again a queue whose claim was cut by its concurrency limit:
# a slot frees when another worker's job ends, which no NOTIFY announces. The wait
# doubles while the queue stays full (long jobs), up to the poll interval, so full
# queues are not polled hundreds of times a second; a worker that frees a slot itself
# claims again at once (see `finished`).
FULL_RECHECK = 0.005
FULL_BACKOFF_STEPS = 8
# How many pending jobs a controlled claim may walk past, per job asked for, looking
# for keys under their limit.
SCAN_FACTOR = 8
MAX_SCAN = 1000
# How many pending jobs a controlled claim may read in all, passing over those of keys
# at their limit: beyond this many jobs of saturated keys, the others wait their turn.
MAX_READ = 10_000
# How many keys a fair claim of `limit` jobs may walk (each key with pending jobs is
# one index probe, whether or not one of its jobs is due): enough for a claim to fill
# from keys of one job each, passing over keys whose jobs are not due yet.
FAIR_KEYS_FACTOR = 4
FAIR_KEYS_EXTRA = 8
# How long a fair claim may resume each key after the last job this worker took from
# it (`resume` in job_claim_fair), as the plain claim resumes its walk (RESUME_TTL in
# worker/scheduler.py): a job that comes before that place in its key (a higher
# priority) is seen at the next claim from the front, at most this long after.
FAIR_RESUME_TTL = 0.5
# How long a controlled claim's transaction may wait on its own client (see
# transaction_guard): the longest a frozen worker can stall a queue's claims.
LOCK_IDLE_MS = 1000
# The share of `view_every` by which a waiting worker reads the view ahead of its due
# time (see `refresh_ahead`): a NOTIFY that comes just after the wake-up for it finds
# the view still fresh.
VIEW_AHEAD = 0.25

# What a claim pipeline returns: job_complete's rows (none without completions) and the
# rows claimed.
Claimed = tuple[list[tuple[Any, ...]], list[ClaimedRow]]


@dataclass(frozen=True)
class ControlState:
    """Why a controlled claim may have come back short."""

    paused: bool
    full: bool
    rate_wait: float | None
    # The queue has keyed jobs: a short claim may have passed over keys at their limit,
    # whose slots free when another worker's job of that key ends (no NOTIFY says so).
    keyed: bool = False
    took: int = 0  # how many jobs the claim took

    def recheck_after(self, poll_interval: float, full_streak: int = 0) -> float:
        """Seconds until a claim of this queue could take a job again."""
        if self.paused:
            return poll_interval
        waits = [poll_interval]
        if self.rate_wait is not None:
            waits.append(self.rate_wait)
        if self.full or self.keyed:
            waits.append(FULL_RECHECK * 2 ** min(full_streak, FULL_BACKOFF_STEPS))
        return max(0.0, min(waits))


def scan_size(limit: int) -> int:
    """Pending jobs a controlled claim of `limit` jobs may walk."""
    return min(MAX_SCAN, max(limit, limit * SCAN_FACTOR))


class QueueClaims:
    """Which claim each queue takes, the claims themselves, and what they taught."""

    def __init__(
        self,
        session: Session,
        view_every: float,
        fair_queues: Mapping[str, Mapping[str, int]] | None = None,
    ) -> None:
        self.session = session
        self.view_every = view_every
        # Each fair queue's keys' weights as the claim's JSON parameter, and the key
        # this worker's last claim of it served last (where the next one starts after).
        self._fair = {queue: json.dumps(dict(w)) for queue, w in (fair_queues or {}).items()}
        self._fair_after: dict[str, str] = {}
        # Each fair queue's resume positions (job_claim_fair's JSON) and until when.
        self._fair_resume: dict[str, tuple[str, float]] = {}
        # Each fair queue whose last claim found one key with pending jobs and took jobs
        # of it: that key (its next claim is job_claim_fair_alone).
        self._fair_alone: dict[str, str] = {}
        self._controlled: frozenset[str] = frozenset()
        self._view_due = 0.0
        self.states: dict[str, ControlState] = {}
        self._full_streak: dict[str, int] = {}
        # Controlled queues where a job ended since the scheduler last asked.
        self._freed: set[str] = set()

    # -- which claim ------------------------------------------------------------------

    def controlled(self, queue: str) -> bool:
        """Whether claims of `queue` go through the controlled claim (the view, read again
        when it is `view_every` old)."""
        now = time.monotonic()
        if now >= self._view_due:
            self.refresh_view(now)
        return queue in self._controlled

    def view_ahead(self) -> float:
        """When a waiting worker reads the view again (`refresh_ahead`): before the claim
        path would have to."""
        return self._view_due - self.view_every * VIEW_AHEAD

    def refresh_ahead(self, now: float) -> bool:
        """Before a wait: read the view if it would be due within VIEW_AHEAD of
        `view_every`, so that a claim woken by a NOTIFY finds it fresh. True if a queue
        became controlled: it is worth claiming at once (see `ready`), not after the wait."""
        return now >= self.view_ahead() and bool(self.refresh_view(now))

    def refresh_view(self, now: float) -> frozenset[str]:
        """Read which queues are controlled now; return those that were not before.

        A queue that became controlled counts as one where a slot freed (see `ready`):
        the plain claim took nothing from it if it became keyed, so the scheduler tries
        it again at once, with the controlled claim.
        """
        fresh = control.controlled_queues(self.session)
        became = fresh - self._controlled
        self._controlled = fresh
        self._view_due = now + self.view_every
        self._freed |= became
        return became

    # -- the claims -------------------------------------------------------------------

    def claim(self, done: Sequence[Completion] | None, request: ClaimRequest) -> Claimed:
        """Complete `done` (None: nothing) and claim for `request`, in one pipeline and
        one transaction, by the queue's claim."""
        if self.controlled(request.queue):
            return self._controlled_claim(done, request)
        if request.queue in self._fair:
            return self._fair_claim(done, request)
        return self._plain_claim(done, request)

    def _fair_claim(self, done: Sequence[Completion] | None, request: ClaimRequest) -> Claimed:
        """The fair claim, after the completions; it moves the queue's key cursor and
        its resume positions on. Of a queue whose last claim found one key with pending
        jobs, that key's claim alone (job_claim_fair_alone); if it takes nothing (another
        key came, or the key has nothing due), the whole fair claim at once."""
        queue, limit, worker_id, lease, _ = request
        now = time.monotonic()
        resume, until = self._fair_resume.get(queue, ("{}", 0.0))
        if now >= until:
            resume, until = "{}", now + FAIR_RESUME_TTL  # a claim from every key's front
        params = {
            "queue": queue,
            "limit": limit,
            "worker_id": worker_id,
            "lease": lease,
            "after": self._fair_after.get(queue),
            "keys": limit * FAIR_KEYS_FACTOR + FAIR_KEYS_EXTRA,
            "weights": self._fair[queue],
            "resume": resume,
        }
        key = self._fair_alone.pop(queue, None)
        if key is None:
            return self._fair_statement(done, "job_claim_fair", params, until)
        done_rows, rows = self._fair_statement(
            done, "job_claim_fair_alone", {**params, "key": key}, until
        )
        if rows:
            return done_rows, rows
        more_done, rows = self._fair_statement(None, "job_claim_fair", params, until)
        return done_rows + more_done, rows

    def _fair_statement(
        self,
        done: Sequence[Completion] | None,
        name: str,
        params: dict[str, Any],
        until: float,
    ) -> Claimed:
        """Run the fair claim `name` after the completions; note its cursor: the key the
        next claim starts after, the resume positions (kept until `until`), and the key
        it found alone."""
        queue = params["queue"]
        what = name if done is None else f"job_complete + {name}"
        with self.session.holding(what) as conn:
            done_rows, rows = _pipeline(self.session, conn, done, name, params, "fair_claim_plan")
        # No job taken: the one row carries the cursor alone, its job id NULL.
        claimed = [ClaimedRow._make(row[:-3]) for row in rows if row[0] is not None]
        if rows:
            last_key, alone, positions = rows[0][-3:]
            if last_key is not None:
                self._fair_after[queue] = last_key
            self._fair_resume[queue] = (json.dumps(positions), until)
            if alone is not None and claimed:
                self._fair_alone[queue] = alone
        return done_rows, claimed

    def _controlled_claim(
        self, done: Sequence[Completion] | None, request: ClaimRequest
    ) -> Claimed:
        queue, limit, worker_id, lease, _ = request
        claim = {
            "queue": queue,
            "limit": limit,
            "scan": scan_size(limit),
            "read": MAX_READ,
            "worker_id": worker_id,
            "lease": lease,
        }
        done_rows, rows, state = control.claim_controlled(self.session, done, claim, LOCK_IDLE_MS)
        if state is not None:
            self.states[queue] = ControlState(
                bool(state[0]), bool(state[1]), state[2], bool(state[3]), len(rows)
            )
        return done_rows, rows

    def _plain_claim(self, done: Sequence[Completion] | None, request: ClaimRequest) -> Claimed:
        """The plain claim, after the completions. Prepared, it runs on its generic plan
        (`claim_plan_generic`), planned once, not again at every claim."""
        session = self.session
        name, params = claim_statement(request)
        what = name if done is None else f"job_complete + {name}"
        with session.holding(what) as conn:
            prepared = conn.prepare_threshold is not None
            try:
                done_rows, rows = _pipeline(
                    session, conn, done, name, params, "claim_plan_generic" if prepared else None
                )
                return done_rows, [ClaimedRow._make(row) for row in rows]
            except psycopg.Error:
                if done is not None or not prepared or conn.prepare_threshold is not None:
                    raise  # with completions: the caller writes them apart
        # The server did not know a statement this worker prepared (a transaction-mode
        # pooler; preparation is off from now on): the claim alone once more.
        return [], [ClaimedRow._make(row) for row in session.run(name, params)]

    # -- what they taught -------------------------------------------------------------

    def resumable(self, queue: str) -> bool:
        """Whether the next claim of `queue` may resume after the last row claimed: a
        controlled queue's walk always starts from the start, under its lock; a fair
        queue's from the key after the last it served."""
        return queue not in self._controlled and queue not in self._fair

    def write_at_once(self, queue: str) -> bool:
        """Whether an outcome of `queue` is written at once, not batched: a controlled
        queue's job holds a slot of its limits until its outcome is written."""
        return queue in self._controlled

    def finished(self, queues: Iterable[str]) -> None:
        """Jobs of `queues` ended here: a controlled one has a slot free to claim again."""
        if self._controlled:
            self._freed.update(queue for queue in queues if queue in self._controlled)

    def ready(self) -> set[str]:
        """The controlled queues worth claiming at once (a slot freed, or the queue just
        became controlled) since the last call."""
        freed, self._freed = self._freed, set()
        return freed

    def retry_short(self, queue: str, poll_interval: float) -> float | None:
        """Seconds before a short claim of `queue` is worth trying again (None: after
        the poll interval, as any queue's)."""
        if queue not in self._controlled:
            return None
        state = self.states.pop(queue, None)
        if state is None:
            return poll_interval
        streak = self._full_streak.get(queue, 0)
        # The wait grows while the queue stays full, or while a keyed queue's claims take
        # nothing; a keyed claim that took jobs starts it again from the shortest.
        grows = state.full or (state.keyed and not state.took)
        streak = streak if grows else 0
        self._full_streak[queue] = streak + 1 if grows else 0
        return state.recheck_after(poll_interval, streak)

    def settled(self, queues: Iterable[str]) -> bool:
        """Burst mode: whether `queues` may be called empty. One more look at which
        queues are controlled first: a queue that just became keyed holds jobs the plain
        claim had to leave."""
        became = self.refresh_view(time.monotonic())
        return not any(queue in became for queue in queues)


def _pipeline(
    session: Session,
    conn: psycopg.Connection[Any],
    done: Sequence[Completion] | None,
    name: str,
    params: dict[str, Any],
    plan: str | None,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Complete `done` (None: nothing), then run the claim `name` after the statement
    `plan` that sets how it is planned (None: none), in one pipeline and one
    transaction; the rows of both."""
    what = name if done is None else f"job_complete + {name}"
    with conn.cursor() as done_cur, conn.cursor() as claim_cur:
        with session.pipelined(conn, what):
            if done is not None:
                done_cur.execute(QUERIES["job_complete"], complete_params(done))
            if plan is not None:
                # On the claim's cursor: its rows are the claim's, read after this.
                claim_cur.execute(QUERIES[plan])
            claim_cur.execute(QUERIES[name], params)
        done_rows = done_cur.fetchall() if done is not None else []
        return done_rows, claim_cur.fetchall()
