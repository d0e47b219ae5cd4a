"""Inserting jobs, on the caller's Django connection.

A job exists only if the caller's transaction commits; the NOTIFY that wakes the
workers is delivered at that commit too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..exceptions import PgQueueError
from ..sql import QUERIES
from .arrays import text_array, text_element
from .cursors import django_cursor, fetch_one

_LOOKUP_RETRIES = 5


def insert_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Insert one job on Django's connection `alias`; return (job id, created, created_at).

    One statement: ``job_enqueue`` calls the ``pgqueue_enqueue`` function (migration
    0007), whose two INSERTs, key handling and NOTIFY PostgreSQL plans once per session.
    """
    return _insert_one(alias, "job_enqueue", params, "idempotency key", "idempotency_key")


def insert_unique_job(alias: str, params: dict[str, Any]) -> tuple[int, str, Any]:
    """Insert one job with a unique key on Django's connection `alias`, or find its
    holder; return (job id, outcome, created_at), outcome ``created``, ``existing``,
    ``replaced`` or ``other_type`` (a debounce met a holder of another type).

    One statement: ``job_enqueue_unique`` calls ``pgqueue_enqueue_unique``,
    where the unique index or the key's row decides between concurrent enqueues.
    """
    return _insert_one(alias, "job_enqueue_unique", params, "unique key", "unique_key")


def _insert_one(
    alias: str, statement: str, params: dict[str, Any], what: str, key: str
) -> tuple[Any, Any, Any]:
    """Run the enqueue `statement`, whose function gives up (a row of NULLs) after
    five tries when, each time, a concurrent transaction took the key
    `params[key]` after its statement's snapshot, then let it go."""
    row = fetch_one(alias, QUERIES[statement], params)
    if row is None or row[0] is None:
        raise PgQueueError(
            f"Could not enqueue: the {what} {params[key]!r} on queue "
            f"{params['queue']!r} keeps changing hands; try again."
        )
    return row[0], row[1], row[2]


def insert_sequenced_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Insert one job of a sequence on Django's connection `alias`; return (job id, head,
    created_at), head False when it waits behind an unfinished earlier job of its sequence.

    One statement: ``job_enqueue_sequenced`` calls ``pgqueue_enqueue_sequenced`` (migration
    0023), which takes the sequence's row lock before it writes the job.
    """
    row = fetch_one(alias, QUERIES["job_enqueue_sequenced"], params)
    assert row is not None  # the function always writes the job
    return row[0], row[1], row[2]


def insert_cancel_running_job(alias: str, params: dict[str, Any]) -> tuple[int, bool, Any]:
    """Insert one job of a cancel-in-progress key on Django's connection `alias`; return
    (job id, head, created_at), head False when it waits for the key's running job,
    asked to stop, to end.

    One statement: ``job_enqueue_cancel_running`` calls ``pgqueue_enqueue_cancel_running``,
    which takes the key's sequence row lock before it cancels the
    key's other jobs and writes this one.
    """
    row = fetch_one(alias, QUERIES["job_enqueue_cancel_running"], params)
    assert row is not None  # the function always writes the job
    return row[0], row[1], row[2]


def job_type(alias: str, queue: str, job_id: int) -> str | None:
    """The type of job `job_id` of `queue` on Django's connection `alias` (None: none)."""
    row = fetch_one(alias, QUERIES["job_type"], {"queue": queue, "job_id": job_id})
    return None if row is None else row[0]


# Jobs per enqueue_many statement: large enough to amortize a round trip and a plan,
# small enough that the plan's estimated cost stays well below jit_above_cost.
BULK_CHUNK = 20_000

# Validated options of a group of jobs: (type, queue, priority, run_at, delay, max_attempts).
Options = tuple[str, str, int, Any, float, int]


class Batch:
    """The validated jobs of an enqueue_many() call, without their payloads.

    Jobs that share their options share a group: the options are validated and
    turned into array elements once per group, not once per job.
    """

    def __init__(self) -> None:
        self.options: list[Options] = []  # per group
        self.groups: list[int] = []  # per job, in order
        # Per job, only once a job has a key (None until then).
        self.idempotency_keys: list[str | None] | None = None
        self.concurrency_keys: list[str | None] | None = None
        self.fairness_keys: list[str | None] | None = None
        # Per job, once a job has a sequence: (sequence key, on_failure), None for a job
        # of none (the lists above are there too then).
        self.sequences: list[tuple[str, str] | None] | None = None
        # Fair queues: their jobs without a fairness key get the key "".
        self.fair_queues: Collection[str] = ()
        self._known: dict[Any, int] = {}

    def group(self, key: Any) -> int | None:
        """The group of options already validated under `key`, if any (None: no key)."""
        if key is None:
            return None
        try:
            return self._known.get(key)
        except TypeError:  # an unhashable value: validated (and refused) on its own
            return None

    def add_group(self, key: Any, options: Options) -> int:
        self.options.append(options)
        number = len(self.options) - 1
        if key is not None:
            with contextlib.suppress(TypeError):  # unhashable: not remembered
                self._known[key] = number
        return number

    def add(
        self,
        group: int,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        fairness_key: str | None = None,
        sequence: tuple[str, str] | None = None,
    ) -> None:
        keyed = (idempotency_key, concurrency_key, fairness_key, sequence) != (None,) * 4
        if self.idempotency_keys is None and keyed:
            self.idempotency_keys = [None] * len(self.groups)
            self.concurrency_keys = [None] * len(self.groups)
            self.fairness_keys = [None] * len(self.groups)
        if self.idempotency_keys is not None:
            self.idempotency_keys.append(idempotency_key)
            self.concurrency_keys.append(concurrency_key)  # type: ignore[union-attr]
            self.fairness_keys.append(fairness_key)  # type: ignore[union-attr]
        if self.sequences is None and sequence is not None:
            self.sequences = [None] * len(self.groups)
        if self.sequences is not None:
            self.sequences.append(sequence)
        self.groups.append(group)

    def select(self, jobs: Sequence[int]) -> Batch:
        """The jobs at positions `jobs` (in that order), as a batch of their own."""
        part = Batch()
        part.options = self.options  # groups keep their numbers; unused ones cost nothing
        part.groups = [self.groups[n] for n in jobs]
        part.fair_queues = self.fair_queues
        if self.sequences is not None and any(self.sequences[n] is not None for n in jobs):
            part.sequences = [self.sequences[n] for n in jobs]
        keys = self.idempotency_keys, self.concurrency_keys, self.fairness_keys
        # A part whose jobs have no key takes the unkeyed statements, whatever the rest had.
        if keys[0] is not None and any(key[n] is not None for key in keys for n in jobs):  # type: ignore[index]
            part.idempotency_keys = [keys[0][n] for n in jobs]
            part.concurrency_keys = [keys[1][n] for n in jobs]  # type: ignore[index]
            part.fairness_keys = [keys[2][n] for n in jobs]  # type: ignore[index]
        return part

    def _fair_keys(self, start: int, stop: int) -> list[str | None] | None:
        """Each job's fair key (None: no job of start..stop has one)."""
        groups = self.groups[start:stop]
        fair = {n for n, options in enumerate(self.options) if options[1] in self.fair_queues}
        given = (self.fairness_keys or [None] * len(self.groups))[start:stop]
        if not fair and self.fairness_keys is None:
            return None
        keys = [
            key if key is not None or group not in fair else ""
            for key, group in zip(given, groups, strict=True)
        ]
        return keys if any(key is not None for key in keys) else None

    def _option_arrays(self, groups: Sequence[int]) -> dict[str, Any]:
        """The options of the jobs of `groups` as parallel array literals (types, queues,
        priorities, run_ats, delays, max_attempts), each element built once per group."""
        columns = list(zip(*self.options, strict=True))
        elements = [
            [text_element(v) for v in columns[0]],
            [text_element(v) for v in columns[1]],
            [str(v) for v in columns[2]],
            ["NULL" if v is None else text_element(v.isoformat()) for v in columns[3]],
            [repr(v) for v in columns[4]],
            [str(v) for v in columns[5]],
        ]
        names = ("types", "queues", "priorities", "run_ats", "delays", "max_attempts")
        return {
            name: "{" + ",".join([e[g] for g in groups]) + "}"
            for name, e in zip(names, elements, strict=True)
        }

    def _sequenced_params(self, start: int, stop: int) -> dict[str, Any]:
        """job_enqueue_many_sequenced's parameters for jobs start..stop (all sequenced),
        but the payloads."""
        groups = self.groups[start:stop]
        sequences = (self.sequences or [])[start:stop]
        if len(sequences) != len(groups) or any(item is None for item in sequences):
            raise ValueError("a batch's jobs are all sequenced or none is")
        nothing = [None] * len(groups)
        params = self._option_arrays(groups)
        concurrency = self.concurrency_keys
        params["concurrency_keys"] = text_array(
            nothing if concurrency is None else concurrency[start:stop]
        )
        params["fair_keys"] = text_array(self._fair_keys(start, stop) or nothing)
        params["sequence_keys"] = text_array(item[0] for item in sequences)  # type: ignore[index]
        params["sequence_on_failures"] = text_array(item[1] for item in sequences)  # type: ignore[index]
        return params

    def statement(self, start: int, stop: int) -> tuple[str, dict[str, Any]]:
        """The statement for jobs start..stop and its parameters, but the payloads.

        Sequenced jobs (a batch's jobs are all sequenced or none is: see
        `insert_with_sequences`) go through job_enqueue_many_sequenced. Jobs without keys
        that share one group of options (the common bulk call) go through
        job_enqueue_many_alike, which takes the options once rather than as arrays
        (parsing and unnesting six arrays of 20,000 elements was ~40% of building the
        rows); the others through job_enqueue_many(_keyed), each element built once per
        group.
        """
        if self.sequences is not None:
            return "job_enqueue_many_sequenced", self._sequenced_params(start, stop)
        groups = self.groups[start:stop]
        fair_keys = self._fair_keys(start, stop)
        if self.idempotency_keys is None and fair_keys is None and len(set(groups)) == 1:
            type_, queue, priority, run_at, delay, max_attempts = self.options[groups[0]]
            return "job_enqueue_many_alike", {
                "type": type_,
                "queue": queue,
                "priority": priority,
                "run_at": run_at,
                "delay": delay,
                "max_attempts": max_attempts,
            }
        params = self._option_arrays(groups)
        if self.idempotency_keys is None and fair_keys is None:
            return "job_enqueue_many", params
        nothing = [None] * len(groups)
        idempotency = (
            nothing if self.idempotency_keys is None else self.idempotency_keys[start:stop]
        )
        concurrency = (
            nothing if self.concurrency_keys is None else self.concurrency_keys[start:stop]
        )
        params["idempotency_keys"] = text_array(idempotency)
        params["concurrency_keys"] = text_array(concurrency)
        params["fair_keys"] = text_array(nothing if fair_keys is None else fair_keys)
        return "job_enqueue_many_keyed", params


def insert_jobs(
    alias: str,
    batch: Batch,
    payloads: Sequence[str],
    traceparent: str | None = None,
) -> list[tuple[int, bool]]:
    """Insert validated jobs on Django's connection `alias`, in the batch's order; return
    [(job id, created)].

    `payloads` is the JSON array text of each BULK_CHUNK slice of the batch's jobs;
    `traceparent` the trace context every one of them is stored with. Each slice is one
    statement (`Batch.statement`). A batch of sequenced jobs first takes the rows of all
    their sequences in key order, in one statement (as pgqueue_sequence_next does:
    concurrent calls naming the same sequences in other orders never deadlock); then
    job_enqueue_many_sequenced calls pgqueue_enqueue_sequenced per job in list order,
    so a sequence's jobs of one call run in list order.
    """
    results: list[tuple[int, bool]] = []
    with django_cursor(alias) as cursor:
        if batch.sequences is not None:
            queues = [batch.options[group][1] for group in batch.groups]
            keys = [item[0] for item in batch.sequences if item is not None]
            cursor.execute(
                QUERIES["sequence_lock_many"],
                {"queues": text_array(queues), "sequence_keys": text_array(keys)},
            )
        for index, payload_text in enumerate(payloads):
            start = index * BULK_CHUNK
            name, params = batch.statement(start, start + BULK_CHUNK)
            params["payloads"] = payload_text
            params["traceparent"] = traceparent
            if name == "job_enqueue_many_keyed":
                results.extend(_insert_keyed(cursor, params, batch, start))
            elif name == "job_enqueue_many_sequenced":
                cursor.execute(QUERIES[name], params)
                results.extend((int(row[0]), True) for row in cursor.fetchall())
            else:
                cursor.execute(QUERIES[name], params)
                ids = cursor.fetchone()[0]
                results.extend([(job_id, True) for job_id in ids])
    return results


def insert_with_sequences(
    alias: str,
    batch: Batch,
    texts: Callable[[list[int]], list[str]],
    traceparent: str | None = None,
) -> list[tuple[int, bool]]:
    """Insert validated jobs of a batch with sequence keys on Django's connection
    `alias`: those without one, then the sequenced ones, each part by `insert_jobs`;
    [(job id, created)] in the batch's order. `texts` gives the payloads' JSON array
    texts (per BULK_CHUNK slice) of the jobs at the positions it is given."""
    marks = batch.sequences or []
    plain = [n for n, mark in enumerate(marks) if mark is None]
    sequenced = [n for n, mark in enumerate(marks) if mark is not None]
    results: list[tuple[int, bool]] = [(0, False)] * len(marks)
    for jobs in (plain, sequenced):
        if jobs:
            written = insert_jobs(alias, batch.select(jobs), texts(jobs), traceparent)
            for n, result in zip(jobs, written, strict=True):
                results[n] = result
    return results


def _insert_keyed(
    cursor: Any, params: dict[str, Any], batch: Batch, start: int
) -> list[tuple[int, bool]]:
    cursor.execute(QUERIES["job_enqueue_many_keyed"], params)
    created = {position: int(job_id) for position, job_id in cursor.fetchall()}
    groups = batch.groups[start : start + BULK_CHUNK]
    keys = (batch.idempotency_keys or [])[start : start + BULK_CHUNK]
    found: dict[int, int] = {}
    for _ in range(_LOOKUP_RETRIES):
        missing = [p for p in range(1, len(groups) + 1) if p not in created and p not in found]
        if not missing:
            break
        # Holders of the keys that were skipped: earlier positions of this call (the
        # statement above is visible to this one) or live jobs inserted before it.
        cursor.execute(
            QUERIES["job_live_by_keys"],
            {
                "queues": text_array(batch.options[groups[p - 1]][1] for p in missing),
                "idempotency_keys": text_array(keys[p - 1] for p in missing),
            },
        )
        for index, job_id in cursor.fetchall():
            if job_id is not None:
                found[missing[index - 1]] = int(job_id)
    if len(created) + len(found) < len(groups):
        raise PgQueueError(
            "Could not enqueue: some idempotency keys keep changing hands; try again."
        )
    return [
        (created[p], True) if p in created else (found[p], False) for p in range(1, len(groups) + 1)
    ]
