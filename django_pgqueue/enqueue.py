"""enqueue() and enqueue_many(): validate everything, then write in one statement.

Both run on the caller's Django connection, so inside ``transaction.atomic()`` a job
exists only if the caller's transaction commits, and idle workers are woken by a
NOTIFY that PostgreSQL delivers only at that commit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, overload

from django.db import transaction

from . import enqueue_scope, extensions, limits, sequences, signals, validation
from .conf import get_settings
from .enqueue_scope import EnqueueListener
from .enqueue_types import EnqueuedJob, JobDefaults, JobOptions, JobSpec, enqueued_job
from .exceptions import EnqueueError, UniqueConflict
from .registry import Handler, registry
from .sequences import OnFailure
from .store import enqueue as store
from .unique import Unique

if TYPE_CHECKING:  # typing.Unpack is Python 3.11's
    from typing_extensions import Unpack

_NO_TYPE = object()  # enqueue_many's last pair's type before any pair of a str type


def _handler(conf: Any, type_: str) -> Handler | None:
    """The handler (or task) of `type_`; with STRICT_TYPES, an error when there is none."""
    registry.autodiscover()
    spec = registry.find(type_)
    if spec is None and conf.STRICT_TYPES:
        raise EnqueueError(
            f"No handler or task is known for the job type {type_!r}, and "
            "PGQUEUE['STRICT_TYPES'] refuses unknown types: check its spelling, or "
            "register it with @handler in an installed app's jobs module."
        )
    return spec


@overload
def enqueue(
    type: str,
    payload: Any = None,
    *,
    on_commit: Literal[False] = False,
    **options: Unpack[JobOptions],
) -> EnqueuedJob: ...


@overload
def enqueue(
    type: str, payload: Any = None, *, on_commit: bool, **options: Unpack[JobOptions]
) -> EnqueuedJob | None: ...


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
    concurrency_key: str | None = None,
    unique: Unique | None = None,
    fairness_key: str | None = None,
    sequence: str | None = None,
    sequence_on_failure: OnFailure = "hold",
    using: str | None = None,
    on_commit: bool = False,
) -> EnqueuedJob | None:
    """Add a job to a queue, in the caller's transaction.

    `payload` is any JSON value (lists and dicts nested at most 500 levels deep).
    `priority` runs from -100 to 100, higher first.
    `run_at` (aware datetime) or `delay` (seconds or timedelta) defer the job. With an
    `idempotency_key`, a second enqueue while a job with that key is pending or running
    in the same queue returns that job (``created=False``) instead of adding one.
    With a `concurrency_key`, at most the queue's key_limit (default 1) jobs with
    that key run at once (see queue control). With `unique` (a `Unique`), at most one
    job of the queue holds its key for as long as its hold says, and an enqueue of a
    held key returns the holder, refuses (`UniqueConflict`) or replaces the payload and
    due time of a holder never claimed, of the same type, as its `on_conflict` says
    (`Unique.cancel_running`: cancels the holder and waits for its code to stop). In a fair queue
    (PGQUEUE["FAIR_QUEUES"]) claims take turns across `fairness_key`s (none: the key "").
    With a `sequence` key, the jobs of the queue with that key run one at a time in
    enqueue order: a job behind an unfinished earlier one waits; one that ends dead
    holds the rest back, or lets them go on with ``sequence_on_failure="continue"``.
    Everything is validated before anything is written.

    The job is written on its queue's database (PGQUEUE["QUEUE_DATABASES"], else
    DATABASE; `using` wins). Inside a transaction on another database only, enqueue
    refuses (EnqueueError), unless `on_commit` is True: then the job is enqueued once
    that transaction commits (after the commit, not atomically) and None is returned.
    """
    conf = get_settings()
    options = _check_options(conf, type, queue, priority, run_at, delay, max_attempts)
    type_, queue_name, priority_value, when, seconds, attempts = options
    key_value = validation.idempotency_key(idempotency_key)
    if unique is not None and not isinstance(unique, Unique):
        raise EnqueueError(f"unique must be a Unique, got {unique!r}.")
    if unique is not None and key_value is not None:
        raise EnqueueError("Pass idempotency_key or unique, not both.")
    params = {
        "queue": queue_name,
        "type": type_,
        "payload": validation.payload(payload, conf.MAX_PAYLOAD_BYTES),
        "priority": priority_value,
        "run_at": when,
        "delay": seconds,
        "max_attempts": attempts,
        "idempotency_key": key_value,
        # Written with the state row, by the same statement.
        "concurrency_key": limits.concurrency_key(concurrency_key),
        "fair_key": _fair_key(conf, queue_name, fairness_key),
        "traceparent": None,
    }
    if unique is not None:
        params.update(unique.params())
    if sequence is not None or sequence_on_failure != "hold":  # else no sequence's columns
        keyed = unique is not None or key_value is not None
        params.update(sequences.params(sequence, sequence_on_failure, keyed=keyed))
    # Columns the installed features fill from the caller's context (the trace).
    params.update(extensions.enqueue_columns())
    if not conf.QUEUE_DATABASES:  # one database: the caller's transaction, if any
        alias = using or conf.DATABASE
        return _write(alias, params, payload, enqueue_scope.listener(alias, queue_name, on_commit))
    alias = using or conf.QUEUE_DATABASES.alias(queue_name, conf.DATABASE)
    listener = enqueue_scope.listener(alias, queue_name, on_commit)
    caller = enqueue_scope.commit_to_wait_for(alias, queue_name, on_commit)
    if caller is None:
        return _write(alias, params, payload, listener)
    # Never inside a listener's block (its transaction is open on `alias`): no listener.
    transaction.on_commit(partial(_write, alias, params, payload), using=caller)
    return None


def _fair_key(conf: Any, queue: str, fairness_key: Any) -> str | None:
    """The job's fair key: its fairness key; in a fair queue without one, the key ""."""
    key = validation.key(fairness_key, "fairness_key")
    if key is None and queue in conf.FAIR_QUEUES:
        return ""
    return key


def _write(
    alias: str, params: dict[str, Any], payload: Any, listener: EnqueueListener | None = None
) -> EnqueuedJob:
    """Insert one validated job on `alias`; job_enqueued when its transaction commits."""
    replaced = False
    if "sequence_key" in params:
        job_id, _head, created_at = store.insert_sequenced_job(alias, params)
        created = True
    elif params.get("on_conflict") == "cancel_running":
        job_id, _head, created_at = store.insert_cancel_running_job(alias, params)
        created = True
    elif "unique_key" in params:
        job_id, outcome, created_at = store.insert_unique_job(alias, params)
        if outcome == "existing" and params["on_conflict"] == "refuse":
            raise UniqueConflict(params["queue"], params["unique_key"], job_id)
        if outcome == "other_type":
            held_type = store.job_type(alias, params["queue"], job_id)
            raise EnqueueError(
                f"The unique key {params['unique_key']!r} on queue {params['queue']!r} is "
                f"held by job #{job_id} of type {held_type!r}: a debounce of type "
                f"{params['type']!r} cannot replace it; nothing was enqueued."
            )
        created, replaced = outcome == "created", outcome == "replaced"
    else:
        job_id, created, created_at = store.insert_job(alias, params)
    if listener is not None and created:
        listener.joined([job_id])
    # job_enqueued, when the caller's transaction commits; no event built for no receiver.
    if created and signals.job_enqueued.receivers:
        event = {"job_id": job_id, "queue": params["queue"], "type": params["type"]}
        event.update(payload=payload, priority=params["priority"])
        signals.send_on_commit(signals.job_enqueued, alias, [event])
    return enqueued_job(
        job_id, params["queue"], params["type"], created, created_at, alias, replaced
    )


@overload
def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]],
    *,
    on_commit: Literal[False] = False,
    **defaults: Unpack[JobDefaults],
) -> list[EnqueuedJob]: ...


@overload
def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]], *, on_commit: bool, **defaults: Unpack[JobDefaults]
) -> list[EnqueuedJob] | None: ...


def enqueue_many(
    jobs: Iterable[JobSpec | tuple[str, Any]],
    *,
    using: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | None = None,
    delay: float | dt.timedelta | None = None,
    max_attempts: int | None = None,
    on_commit: bool = False,
) -> list[EnqueuedJob] | None:
    """Add many jobs in one statement, in the caller's transaction.

    Each item is a `JobSpec` or a ``(type, payload)`` pair; the keyword arguments are
    defaults for items that leave a field unset. Every item is validated before
    anything is written: one bad item refuses the whole call, naming its position.
    Returns one `EnqueuedJob` per item, in order. Thousands of jobs go in one
    statement (very large calls are split into statements of BULK_CHUNK jobs, all
    in the caller's transaction). Items with a `sequence` key go in statements of their
    own: the jobs of a sequence in one call run in list order.

    Jobs go to their queues' databases as enqueue()'s do. Jobs on several databases
    are written outside a transaction only, all-or-nothing per database (refused
    inside one); `on_commit` defers the call to the commit of the caller's
    transaction on another database (then None is returned).
    """
    conf = get_settings()
    batch = store.Batch()
    batch.fair_queues = conf.FAIR_QUEUES
    payloads: list[Any] = []
    defaults = (queue, priority, run_at, delay, max_attempts)
    # The common call, pairs of one type: a pair of the type (the same str object) of
    # the pair before, no keys in the batch yet, takes that pair's group with no lookup.
    last_type: Any = _NO_TYPE
    last_group = 0
    grouped = batch.groups.append
    for position, item in enumerate(jobs):
        if type(item) is tuple and len(item) == 2:
            type_, payload = item
            if type_ is last_type and batch.idempotency_keys is None:
                grouped(last_group)
                payloads.append(payload)
                continue
            options: tuple[Any, ...] = (type_, *defaults)
            key: Any = type_ if type(type_) is str else None
            keys: tuple[Any, ...] | None = None
        elif isinstance(item, JobSpec):
            type_, payload = item.type, item.payload
            # An item's own schedule (run_at or delay) replaces the call's as a whole.
            own = item.run_at is not None or item.delay is not None
            options = (
                type_,
                queue if item.queue is None else item.queue,
                priority if item.priority is None else item.priority,
                item.run_at if own else run_at,
                item.delay if own else delay,
                max_attempts if item.max_attempts is None else item.max_attempts,
            )
            keys = (item.idempotency_key, item.concurrency_key, item.fairness_key)
            keys += (item.sequence, item.sequence_on_failure)
            # Exact types in the key: 1 == 1.0 == True, but only 1 is a valid priority.
            key = (options, *map(type, options)) if type(type_) is str else None
        else:
            raise EnqueueError(
                f"enqueue_many item {position} must be a JobSpec or a (type, payload) pair, "
                f"got {type(item).__name__}."
            )
        try:
            # Items usually share their options: each distinct combination is validated
            # once (an unhashable value is validated, and refused, on its own).
            group = batch.group(key)
            if group is None:
                group = batch.add_group(key, _check_options(conf, *options))
            if keys is None:
                batch.add(group)
            else:
                idempotency = validation.idempotency_key(keys[0])
                sequence = sequences.params(keys[3], keys[4], keyed=idempotency is not None)
                batch.add(
                    group,
                    idempotency,
                    limits.concurrency_key(keys[1]),
                    validation.key(keys[2], "fairness_key"),
                    (sequence["sequence_key"], keys[4]) if sequence else None,
                )
        except EnqueueError as exc:
            raise EnqueueError(f"enqueue_many item {position}: {exc}") from exc
        payloads.append(payload)
        fast = keys is None and key is not None  # a pair of a str type
        last_type, last_group = (type_, group) if fast else (_NO_TYPE, 0)
    if not payloads:
        return []
    texts = _texts(conf, payloads)
    columns = extensions.enqueue_columns()
    if not conf.QUEUE_DATABASES:  # one database: the caller's transaction, if any
        alias = using or conf.DATABASE
        listener = enqueue_scope.listener(alias, batch.options[batch.groups[0]][1], on_commit)
        return _write_many(alias, batch, payloads, texts, columns, listener)
    aliases = [
        using or conf.QUEUE_DATABASES.alias(options[1], conf.DATABASE) for options in batch.options
    ]
    for group in dict.fromkeys(batch.groups):  # each group's first job, in order
        listener = enqueue_scope.listener(aliases[group], batch.options[group][1], on_commit)
    named = list(dict.fromkeys(aliases[group] for group in batch.groups))
    if len(named) == 1:
        queue_name = batch.options[batch.groups[0]][1]
        caller = enqueue_scope.commit_to_wait_for(named[0], queue_name, on_commit)
        write = partial(_write_many, named[0], batch, payloads, texts, columns, listener)
    else:
        caller = enqueue_scope.many_commit_to_wait_for(named, on_commit)
        write = partial(_write_split, conf, named, aliases, batch, payloads, columns)
    if caller is None:
        return write()
    transaction.on_commit(write, using=caller)
    return None


def _texts(conf: Any, payloads: list[Any]) -> list[str]:
    """The payloads' JSON array text per BULK_CHUNK slice, validated (errors name the item)."""
    return [
        validation.payloads(
            payloads[start : start + store.BULK_CHUNK], conf.MAX_PAYLOAD_BYTES, offset=start
        )
        for start in range(0, len(payloads), store.BULK_CHUNK)
    ]


def _write_split(
    conf: Any,
    named: list[str],
    aliases: list[str],
    batch: store.Batch,
    payloads: list[Any],
    columns: dict[str, Any],
) -> list[EnqueuedJob]:
    """Write each alias's share of the jobs in a transaction of its own; results in order."""
    results: list[EnqueuedJob | None] = [None] * len(payloads)
    for alias in named:
        jobs = [n for n, group in enumerate(batch.groups) if aliases[group] == alias]
        share = [payloads[n] for n in jobs]
        with transaction.atomic(using=alias):
            written = _write_many(alias, batch.select(jobs), share, _texts(conf, share), columns)
        for n, job in zip(jobs, written, strict=True):
            results[n] = job
    return [job for job in results if job is not None]


def _write_many(
    alias: str,
    batch: store.Batch,
    payloads: list[Any],
    texts: list[str],
    columns: dict[str, Any],
    listener: EnqueueListener | None = None,
) -> list[EnqueuedJob]:
    """Insert validated jobs on `alias`; job_enqueued when its transaction commits."""
    if batch.sequences is None:
        results = store.insert_jobs(alias, batch, texts, columns.get("traceparent"))
    else:
        conf = get_settings()
        share = lambda jobs: _texts(conf, [payloads[n] for n in jobs])  # noqa: E731
        results = store.insert_with_sequences(alias, batch, share, columns.get("traceparent"))
    rows = [batch.options[group] for group in batch.groups]
    if listener is not None:
        listener.joined([job_id for job_id, created in results if created])
    if signals.job_enqueued.receivers:  # job_enqueued, when the transaction commits
        events = [
            {"job_id": job_id, "queue": row[1], "type": row[0], "payload": p, "priority": row[2]}
            for (job_id, created), row, p in zip(results, rows, payloads, strict=True)
            if created
        ]
        signals.send_on_commit(signals.job_enqueued, alias, events)
    return _enqueued(results, rows, alias)


def _enqueued(
    results: list[tuple[int, bool]], rows: list[tuple[Any, ...]], alias: str
) -> list[EnqueuedJob]:
    """EnqueuedJob(id, queue, type, created, None, alias, False) per result."""
    return [
        enqueued_job(job_id, row[1], row[0], created, None, alias, False)
        for (job_id, created), row in zip(results, rows, strict=True)
    ]


def check_options(
    type_: Any,
    *,
    queue: Any = None,
    priority: Any = None,
    run_at: Any = None,
    delay: Any = None,
    max_attempts: Any = None,
) -> tuple[str, str, int, dt.datetime | None, float, int]:
    """Validate one job's options as enqueue() does and fill in the defaults.

    Returns (type, queue, priority, run_at, delay in seconds, max_attempts); raises
    EnqueueError naming the bad value. For features that write jobs of their own
    statements (workflows).
    """
    return _check_options(get_settings(), type_, queue, priority, run_at, delay, max_attempts)


def _check_options(
    conf: Any,
    type_: Any,
    queue: Any,
    priority: Any,
    run_at: Any,
    delay: Any,
    max_attempts: Any,
) -> tuple[str, str, int, dt.datetime | None, float, int]:
    """A job's options validated, in this order, and with the defaults filled in:
    (type, queue, priority, run_at, delay in seconds, max_attempts). The queue, when
    not given, is PGQUEUE["ROUTES"]'s for the type, else its handler's, else
    DEFAULT_QUEUE."""
    type_ = validation.type_name(type_)
    spec = _handler(conf, type_)
    if queue is None:  # an explicit queue wins; then ROUTES, the handler's, the default
        queue = conf.route(type_) or (spec and spec.queue) or conf.DEFAULT_QUEUE
    queue = validation.queue_name(queue)
    priority = validation.priority(conf.DEFAULT_PRIORITY if priority is None else priority)
    when, seconds = validation.schedule(run_at, delay)
    if max_attempts is None:
        max_attempts = (spec and spec.max_attempts) or conf.MAX_ATTEMPTS
    attempts = validation.max_attempts(max_attempts)
    return type_, queue, priority, when, seconds, attempts
