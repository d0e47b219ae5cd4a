"""The worker's settings: `WorkerConfig`, built from arguments and PGQUEUE, validated."""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import validation, validators
from .conf import get_settings
from .exceptions import ConfigurationError, EnqueueError

MAX_BATCH = validators.MAX_BATCH_SIZE
MAX_JOBS_PER_PROCESS = 2**31 - 1
MAX_MEMORY_MIB = 2**20  # a tebibyte


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to run; `build` fills gaps from PGQUEUE and validates."""

    queues: tuple[str, ...]
    concurrency: int
    batch_size: int
    lease: float
    heartbeat_interval: float
    poll_interval: float
    sweep_interval: float
    shutdown_grace: float
    job_timeout: float | None
    reconnect_max_delay: float
    database: str
    worker_id: str
    burst: bool = False
    weights: Mapping[str, int] = field(default_factory=dict)
    # Prepare the statements on the worker's own connections (WORKER_PREPARED_STATEMENTS).
    prepared_statements: bool = True
    # Async handlers in flight at once on the event loop, apart from the threads.
    async_concurrency: int = 100
    # Handlers' default time limits (PGQUEUE SOFT_TIME_LIMIT, TIME_LIMIT), in seconds.
    soft_time_limit: float | None = None
    time_limit: float | None = None
    # Recycling: the process exits, once what it runs ended, after this many jobs or
    # past this resident memory (MiB), for its supervisor to start a fresh one.
    max_jobs_per_process: int | None = None
    max_memory_per_process: int | None = None
    # The worker's fair queues (PGQUEUE["FAIR_QUEUES"]) and their keys' weights.
    fair_queues: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        queues: Iterable[str],
        *,
        concurrency: int | None = None,
        async_concurrency: int | None = None,
        batch_size: int | None = None,
        lease: float | None = None,
        heartbeat_interval: float | None = None,
        poll_interval: float | None = None,
        sweep_interval: float | None = None,
        shutdown_grace: float | None = None,
        job_timeout: float | None = None,
        weights: Mapping[str, int] | None = None,
        burst: bool = False,
        worker_id: str | None = None,
        database: str | None = None,
        max_jobs_per_process: int | None = None,
        max_memory_per_process: int | None = None,
    ) -> WorkerConfig:
        conf = get_settings()
        names = tuple(queues)
        if not names:
            raise ConfigurationError("A worker needs at least one queue.")
        try:
            for name in names:
                validation.queue_name(name, "queue")
        except EnqueueError as exc:
            raise ConfigurationError(str(exc)) from None
        if len(set(names)) != len(names):
            raise ConfigurationError(f"Queue names repeat in {list(names)}.")
        weights = dict(weights or {})
        for name, weight in weights.items():
            if name not in names:
                raise ConfigurationError(
                    f"Weight given for {name!r}, which is not one of the worker's queues "
                    f"({', '.join(names)})."
                )
            if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 1000:
                raise ConfigurationError(f"Weight of {name!r} must be 1..1000, got {weight!r}.")

        def positive(name: str, value: float | None, default: float) -> float:
            value = default if value is None else value
            return validators.seconds(value, name, error=ConfigurationError)

        def count(name: str, value: int | None, default: int, high: int) -> int:
            value = default if value is None else value
            return validators.count(value, name, 1, high, error=ConfigurationError)

        lease_s = positive("lease", lease, conf.LEASE)
        if heartbeat_interval is None:
            # The configured interval, unless this worker's lease is shorter than the
            # settings' lease: renew at a third of whatever lease is in force.
            heartbeat_interval = min(conf.HEARTBEAT_INTERVAL, lease_s / 3)
        heartbeat = positive("heartbeat_interval", heartbeat_interval, lease_s / 3)
        if heartbeat > lease_s / 2:
            raise ConfigurationError(
                f"heartbeat_interval ({heartbeat:g}s) must be at most half the lease "
                f"({lease_s:g}s), so a lease is renewed well before it ends."
            )
        grace = validators.seconds(
            conf.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace,
            "shutdown_grace",
            allow_zero=True,
            error=ConfigurationError,
        )
        timeout = conf.JOB_TIMEOUT if job_timeout is None else job_timeout
        if timeout is not None:
            timeout = positive("job_timeout", timeout, 1.0)
        ident = worker_id or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        if not isinstance(ident, str) or len(ident) > 200 or "\x00" in ident:
            raise ConfigurationError(
                f"worker_id must be a string of at most 200 characters: {ident!r}"
            )
        threads = count("concurrency", concurrency, conf.CONCURRENCY, validators.MAX_CONCURRENCY)
        batch = conf.BATCH_SIZE if batch_size is None else batch_size
        # Unset: a claim fills every free handler thread (a claim smaller than the free
        # threads leaves the rest to another round trip: 10 then 6 at concurrency 16).
        batch = threads if batch is None else count("batch_size", batch, 1, MAX_BATCH)
        if max_jobs_per_process is not None:
            max_jobs_per_process = validators.count(
                max_jobs_per_process,
                "max_jobs_per_process",
                1,
                MAX_JOBS_PER_PROCESS,
                error=ConfigurationError,
            )
        if max_memory_per_process is not None:
            max_memory_per_process = validators.count(
                max_memory_per_process,
                "max_memory_per_process (MiB)",
                1,
                MAX_MEMORY_MIB,
                error=ConfigurationError,
            )
        return cls(
            queues=names,
            concurrency=threads,
            async_concurrency=count(
                "async_concurrency",
                async_concurrency,
                conf.ASYNC_CONCURRENCY,
                validators.MAX_ASYNC_CONCURRENCY,
            ),
            batch_size=batch,
            lease=lease_s,
            heartbeat_interval=heartbeat,
            poll_interval=positive("poll_interval", poll_interval, conf.POLL_INTERVAL),
            sweep_interval=positive("sweep_interval", sweep_interval, conf.SWEEP_INTERVAL),
            shutdown_grace=float(grace),
            job_timeout=timeout,
            reconnect_max_delay=conf.RECONNECT_MAX_DELAY,
            database=database or _database_of(conf, names),
            worker_id=ident,
            burst=burst,
            weights=weights,
            fair_queues={
                name: conf.FAIR_QUEUES[name] for name in names if name in conf.FAIR_QUEUES
            },
            prepared_statements=conf.WORKER_PREPARED_STATEMENTS,
            soft_time_limit=conf.SOFT_TIME_LIMIT,
            time_limit=conf.TIME_LIMIT,
            max_jobs_per_process=max_jobs_per_process,
            max_memory_per_process=max_memory_per_process,
        )


def queues_by_database(queues: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """`queues` grouped by the alias each lives on (PGQUEUE["QUEUE_DATABASES"]), in the
    order the aliases first appear."""
    conf = get_settings()
    placed: dict[str, list[str]] = {}
    for queue in queues:
        placed.setdefault(conf.database_for(queue), []).append(queue)
    return {alias: tuple(names) for alias, names in placed.items()}


def _database_of(conf: Any, queues: tuple[str, ...]) -> str:
    """The one alias all of `queues` live on (PGQUEUE["QUEUE_DATABASES"]).

    A `Worker` claims, heartbeats and completes on one database: queues on several are
    refused at start rather than served from the wrong one (run_queue_worker serves
    them, a worker process per database).
    """
    if not conf.QUEUE_DATABASES:
        return str(conf.DATABASE)
    placed = queues_by_database(queues)
    if len(placed) == 1:
        return next(iter(placed))
    where = "; ".join(
        f"{', '.join(repr(q) for q in names)} on {alias!r}" for alias, names in placed.items()
    )
    raise ConfigurationError(
        f"The worker's queues live on several databases ({where}; see "
        "PGQUEUE['QUEUE_DATABASES']): a Worker serves one database. Run one Worker per "
        "database, or run_queue_worker, which starts a worker process per database."
    )
