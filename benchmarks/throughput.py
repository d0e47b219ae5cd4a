"""How many jobs per second one machine moves, and how fast an idle worker reacts.

- enqueue rate: single enqueue() calls, one transaction each; and enqueue_many();
- drain rate: N no-op jobs enqueued first, then drained by `run_queue_worker --burst`
  processes (1, 2, 4; several concurrency/batch settings), timed on the database clock
  from the first claim to the last completion, and checked in the database: every job
  completed exactly once (one succeeded attempt, no other attempt);
- the ceiling: the same drain by a bare-SQL loop of the article's design, no framework
  (no Django, threads, heartbeats or listener), 2 processes, batch 100: claim with the
  production `job_claim`, then complete with `job_complete`, each its own transaction,
  prepared, on one psycopg connection per process;
- pickup latency: an idle worker (once it has run a probe job: started, not starting),
  jobs enqueued one by one 50 ms apart, from the start
  of the enqueue() call (time.time(), carried in the payload) to the handler's first
  line (time.time(), returned as its result): what a user sees, on one machine's clock;
- the floor of a single enqueue: the bare transaction of one INSERT and one NOTIFY
  (one statement under autocommit) through psycopg, no framework, on a table of the
  same columns; and the seed design's own statements on this project's tables (the
  job row, its state row and the NOTIFY, one statement, through psycopg): what
  enqueue() does, with nothing around it.

Run: python benchmarks/throughput.py [--smoke] [--runs 3] [--jobs 20000]
     python benchmarks/throughput.py --bare-worker BATCH   (one process of the bare loop)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

from _common import (
    MANAGE,
    machine,
    markdown_table,
    median_of,
    parser,
    percentile,
    setup_django,
    sql,
    truncate,
    write_json,
)

# (processes, concurrency, batch size); None means the PGQUEUE defaults.
DRAIN_CONFIGS = [
    (1, None, None),
    (2, None, None),
    (4, None, None),
    (1, 50, 50),
    (2, 50, 50),
    (2, 100, 100),
    (4, 50, 50),
    (2, 200, 200),
]
SMOKE_DRAIN_CONFIGS = [(1, None, None), (2, 20, 20)]


def enqueue_single(n: int) -> float:
    from django_pgqueue import enqueue

    truncate()
    started = time.perf_counter()
    for i in range(n):
        enqueue("qa.noop", {"n": i}, queue="bench")  # autocommit: one transaction each
    return n / (time.perf_counter() - started)


def enqueue_single_prepared(n: int) -> float:
    """enqueue_single with Django's OPTIONS {"prepare_threshold": 1} (see howto/pgbouncer)."""
    from django.db import connection

    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["prepare_threshold"] = 1
    try:
        return enqueue_single(n)
    finally:
        connection.close()
        del options["prepare_threshold"]


BARE_TABLE = (
    "CREATE TABLE IF NOT EXISTS bench_bare_jobs (id bigserial PRIMARY KEY,"
    " queue text NOT NULL, type text NOT NULL, payload jsonb NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now())"
)


def bare_enqueue_single(n: int) -> float:
    """The floor of enqueue_single: per job, one transaction that inserts the row and
    notifies, in one statement under autocommit (one round trip, as ours), through
    psycopg on a connection of its own, no framework."""
    import psycopg
    from django.db import connection
    from psycopg.types.json import Jsonb

    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute(BARE_TABLE)  # logged like queue_jobs: each commit waits for its WAL
        conn.execute("TRUNCATE bench_bare_jobs")
        started = time.perf_counter()
        for i in range(n):
            conn.execute(
                "WITH job AS (INSERT INTO bench_bare_jobs (queue, type, payload)"
                " VALUES (%s, %s, %s) RETURNING queue)"
                " SELECT pg_notify('bench_bare', queue) FROM job",
                ("bench", "qa.noop", Jsonb({"n": i})),
            )
        return n / (time.perf_counter() - started)


# The seed design's enqueue, bare: the job row, its pending state row and the NOTIFY
# that wakes the workers, in one statement (one round trip, one transaction each).
BARE_SEED_ENQUEUE = (
    "WITH job AS (INSERT INTO queue_jobs (queue, type, payload, created_at)"
    " VALUES (%s, %s, %s, now()) RETURNING id, queue),"
    " state AS (INSERT INTO queue_job_state (job_id, queue, status, priority, run_at,"
    " attempts, max_attempts, lease_version, updated_at)"
    " SELECT id, queue, 'pending', 0, now(), 0, 3, 0, now() FROM job RETURNING job_id)"
    " SELECT job.id, pg_notify('pgqueue_bench_bare', job.queue) FROM job, state"
)


def bare_seed_enqueue_single(n: int) -> float:
    """The floor of enqueue_single on its own tables: per job, the seed design's
    statements (the job row, its state row, the NOTIFY) as one statement under
    autocommit, through psycopg with its defaults (prepared from the sixth run) on a
    connection of its own, no framework. Its jobs go to a queue no worker serves."""
    import psycopg
    from django.db import connection
    from psycopg.types.json import Jsonb

    truncate()
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as conn:
        started = time.perf_counter()
        for i in range(n):
            conn.execute(BARE_SEED_ENQUEUE, ("bench_bare", "qa.noop", Jsonb({"n": i})))
        return n / (time.perf_counter() - started)


def enqueue_bulk(n: int) -> float:
    from django_pgqueue import enqueue_many

    truncate()
    jobs = [("qa.noop", {"n": i}) for i in range(n)]
    started = time.perf_counter()
    enqueue_many(jobs, queue="bench")
    return n / (time.perf_counter() - started)


def worker_command(concurrency: int | None, batch: int | None, *extra: str) -> list[str]:
    args = [sys.executable, str(MANAGE), "run_queue_worker", "bench", "-v", "0", *extra]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    if batch:
        args += ["--batch-size", str(batch)]
    return args


def drain(n: int, processes: int, concurrency: int | None, batch: int | None) -> float:
    from django_pgqueue import enqueue_many

    truncate()
    for start in range(0, n, 20_000):
        enqueue_many([("qa.noop", None)] * min(20_000, n - start), queue="bench")
    sql("VACUUM ANALYZE queue_job_state")
    workers = [
        subprocess.Popen(worker_command(concurrency, batch, "--burst"), env=os.environ)
        for _ in range(processes)
    ]
    for worker in workers:
        if worker.wait(600) != 0:
            raise SystemExit(f"worker exited with {worker.returncode}")
    return n / check_drained(n)


def check_drained(n: int) -> float:
    """Check every one of the `n` jobs completed exactly once; return the drain's seconds."""
    attempts, distinct, succeeded, seconds = sql(
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE status = 'succeeded'),"
        " extract(epoch FROM max(finished_at) - min(started_at)) FROM queue_attempts"
    )[0]
    completed = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
    if not (attempts == distinct == succeeded == completed == n):
        raise SystemExit(
            f"drain check failed: {n} jobs, {completed} completed, {attempts} attempts, "
            f"{distinct} distinct jobs attempted, {succeeded} succeeded"
        )
    return float(seconds)


def bare_worker(batch: int) -> None:
    """One process of the bare-SQL loop: claim, "run", complete, until the queue is empty."""
    import psycopg

    from django_pgqueue.sql import QUERIES
    from django_pgqueue.store.worker import complete_params

    worker_id = f"bare-{os.getpid()}"
    claim = {"queue": "bench", "limit": batch, "worker_id": worker_id, "lease": 30.0}
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True, prepare_threshold=0) as conn:
        while rows := conn.execute(QUERIES["job_claim"], claim).fetchall():
            # Columns: job_id, ..., lease_version (7), attempt id (8); a no-op "handler".
            done = [(row[0], row[7], row[8], None) for row in rows]
            completed = conn.execute(QUERIES["job_complete"], complete_params(done)).fetchall()
            if len(completed) != len(rows):
                raise SystemExit(f"bare loop: {len(rows) - len(completed)} completions refused")


def bare_drain(n: int, processes: int, batch: int) -> float:
    from django_pgqueue import enqueue_many

    truncate()
    for start in range(0, n, 20_000):
        enqueue_many([("qa.noop", None)] * min(20_000, n - start), queue="bench")
    sql("VACUUM ANALYZE queue_job_state")
    command = [sys.executable, __file__, "--bare-worker", str(batch)]
    workers = [subprocess.Popen(command, env=os.environ) for _ in range(processes)]
    for worker in workers:
        if worker.wait(600) != 0:
            raise SystemExit(f"bare loop exited with {worker.returncode}")
    return n / check_drained(n)


def worker_ready(timeout: float = 120.0) -> None:
    """Wait until the worker just started has run a probe job, then until it is idle
    again: on a busy machine a worker takes more than the old fixed 2 s to start, and
    the first jobs then measured its start-up, not a pickup."""
    from django_pgqueue import enqueue

    enqueue("qa.noop", None, queue="bench")
    deadline = time.monotonic() + timeout
    while sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0] < 1:
        if time.monotonic() > deadline:
            raise SystemExit(f"pickup: the worker ran no job within {timeout:g} s of its start")
        time.sleep(0.05)
    time.sleep(0.5)  # its outcome written, idle and listening again


def pickup_latency(count: int, gap: float) -> dict[str, float]:
    from django_pgqueue import enqueue

    truncate()
    worker = subprocess.Popen(worker_command(None, None), env=os.environ)
    try:
        worker_ready()
        for _ in range(count):
            enqueue("qa.clock", {"t": time.time()}, queue="bench")
            time.sleep(gap)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
            if done == count + 1:  # and the probe
                break
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    rows = sql(
        "SELECT ((a.result #>> '{}')::float8 - (j.payload ->> 't')::float8) * 1000"
        " FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id"
        " WHERE a.status = 'succeeded' AND j.type = 'qa.clock'"
    )
    latencies = [float(ms) for (ms,) in rows]
    if len(latencies) != count:
        raise SystemExit(f"pickup: only {len(latencies)} of {count} jobs ran")
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


BARE = (2, 100)  # processes, batch: the bare-SQL loop


def main() -> None:
    if sys.argv[1:2] == ["--bare-worker"]:
        bare_worker(int(sys.argv[2]))
        return
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain run")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    jobs = 300 if args.smoke else args.jobs
    singles = 200 if args.smoke else 5_000
    bulk = 1_000 if args.smoke else 20_000
    configs = SMOKE_DRAIN_CONFIGS if args.smoke else DRAIN_CONFIGS
    results: dict[str, Any] = {"machine": machine(), "smoke": args.smoke, "runs": runs}

    rate, values = median_of(runs, lambda: enqueue_single(singles))
    results["enqueue_single"] = {"jobs": singles, "jobs_per_s": rate, "runs": values}
    rate, values = median_of(runs, lambda: enqueue_single_prepared(singles))
    results["enqueue_single_prepared"] = {"jobs": singles, "jobs_per_s": rate, "runs": values}
    rate, values = median_of(runs, lambda: bare_enqueue_single(singles))
    results["bare_enqueue_single"] = {"jobs": singles, "jobs_per_s": rate, "runs": values}
    rate, values = median_of(runs, lambda: bare_seed_enqueue_single(singles))
    results["bare_seed_enqueue_single"] = {"jobs": singles, "jobs_per_s": rate, "runs": values}
    rate, values = median_of(runs, lambda: enqueue_bulk(bulk))
    results["enqueue_many"] = {"jobs": bulk, "jobs_per_s": rate, "runs": values}

    drains = []
    for processes, concurrency, batch in configs:
        rate, values = median_of(
            runs,
            lambda p=processes, c=concurrency, b=batch: drain(jobs, p, c, b),
        )
        drains.append(
            {
                "processes": processes,
                "concurrency": concurrency or "default",
                "batch_size": batch or "default",
                "jobs": jobs,
                "jobs_per_s": rate,
                "runs": values,
            }
        )
        print(f"drain {processes}p c={concurrency} b={batch}: {rate:,.0f} jobs/s", flush=True)
    results["drain"] = drains
    rate, values = median_of(runs, lambda: bare_drain(jobs, *BARE))
    results["bare_loop"] = {
        "processes": BARE[0],
        "batch_size": BARE[1],
        "jobs": jobs,
        "jobs_per_s": rate,
        "runs": values,
    }
    print(f"bare-SQL loop {BARE[0]}p batch {BARE[1]}: {rate:,.0f} jobs/s", flush=True)

    pickups = [pickup_latency(20 if args.smoke else 200, 0.05) for _ in range(runs)]
    results["pickup"] = {
        "jobs": 20 if args.smoke else 200,
        "gap_ms": 50,
        "p50_ms": sorted(r["p50_ms"] for r in pickups)[len(pickups) // 2],
        "p99_ms": sorted(r["p99_ms"] for r in pickups)[len(pickups) // 2],
        "runs": pickups,
    }

    rows = [
        ["enqueue, one transaction each", f"{results['enqueue_single']['jobs_per_s']:,.0f} jobs/s"],
        [
            'the same with OPTIONS {"prepare_threshold": 1}',
            f"{results['enqueue_single_prepared']['jobs_per_s']:,.0f} jobs/s",
        ],
        [
            "the floor: a bare INSERT + NOTIFY transaction through psycopg, one round trip",
            f"{results['bare_enqueue_single']['jobs_per_s']:,.0f} jobs/s",
        ],
        [
            "the seed's statements on these tables (job row, state row, NOTIFY) through psycopg",
            f"{results['bare_seed_enqueue_single']['jobs_per_s']:,.0f} jobs/s",
        ],
        [f"enqueue_many of {bulk:,}", f"{results['enqueue_many']['jobs_per_s']:,.0f} jobs/s"],
        *[
            [
                f"drain {d['jobs']:,} no-op jobs, {d['processes']} process(es), "
                f"concurrency {d['concurrency']}, batch {d['batch_size']}",
                f"{d['jobs_per_s']:,.0f} jobs/s",
            ]
            for d in drains
        ],
        [
            f"bare-SQL loop (the ceiling), {BARE[0]} processes, batch {BARE[1]}",
            f"{results['bare_loop']['jobs_per_s']:,.0f} jobs/s",
        ],
        [
            "pickup latency, idle worker, p50 / p99",
            f"{results['pickup']['p50_ms']:.2f} / {results['pickup']['p99_ms']:.2f} ms",
        ],
    ]
    print(markdown_table(["figure", f"median of {runs}"], rows))
    print(f"results: {write_json(args.json_out, 'throughput', results)}")


if __name__ == "__main__":
    main()
