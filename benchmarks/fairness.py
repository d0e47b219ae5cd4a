"""Fair queues: late tenants behind a big backlog, weights, and the claim at many keys.

- late tenants: tenant A enqueues N no-op jobs (100,000) to a queue; once two workers
  (threads of this process, concurrency 4 each) are draining it, 25 other tenants
  enqueue one job each. On a fair queue (PGQUEUE["FAIR_QUEUES"]) each of the 25 should
  start within two claim cycles of being due (a cycle: each worker's round over the
  keys, in which A gets one turn a worker): reported as A's starts between a late job
  being due and its start, in cycles (p50, p99, max), and its wait in ms. The same run
  on a queue that is not fair is the baseline; A's drain rate (its jobs per second,
  first start to last completion, on the database clock) on the fair queue against
  the baseline's is the cost of the turns (target >= 90%).
- weights: keys "heavy" (weight 3) and "light" (1), each with a backlog, drained for a
  while (60 s; smoke 3 s): the ratio of their completions (target 3.0 within 5%).
- the claim at many keys: 100,000 keys of one pending job each plus A's backlog, the
  fair claim of 10 as a worker sends it (prepared, its generic plan), median of 200 from
  a cursor in the middle of the keys (target <= 5 ms), and its EXPLAIN.

Run: python benchmarks/fairness.py [--smoke] [--jobs 100000] [--keys 100000]
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from typing import Any

from _common import (
    machine,
    markdown_table,
    parser,
    percentile,
    setup_django,
    sql,
    truncate,
    write_json,
)

LATE_TENANTS = 25
WORKERS = 2
CONCURRENCY = 4
FAIR_QUEUE = "bench-fair"
PLAIN_QUEUE = "bench-plain"
WEIGHTED_QUEUE = "bench-weighted"


def declare_fair_queues() -> None:
    from django.conf import settings

    settings.PGQUEUE = {
        **getattr(settings, "PGQUEUE", {}),
        "FAIR_QUEUES": {FAIR_QUEUE: {}, WEIGHTED_QUEUE: {"weights": {"heavy": 3}}},
    }


def start_workers(queue: str, burst: bool) -> list[tuple[Any, threading.Thread]]:
    from django_pgqueue.worker import Worker

    started = []
    for _ in range(WORKERS):
        worker = Worker(
            [queue],
            install_signal_handlers=False,
            concurrency=CONCURRENCY,
            poll_interval=0.05,
            burst=burst,
        )
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
    return started


def stop_workers(started: list[tuple[Any, threading.Thread]]) -> None:
    for worker, _ in started:
        worker.stop()
    for _, thread in started:
        thread.join(120)


def enqueue_backlog(queue: str, key: str, count: int) -> None:
    from django_pgqueue import JobSpec, enqueue_many

    for start in range(0, count, 20_000):
        size = min(20_000, count - start)
        enqueue_many([JobSpec("qa.noop", fairness_key=key) for _ in range(size)], queue=queue)


def wait_for(query: str, params: Any, done: Any, timeout: float = 3600) -> None:
    deadline = time.monotonic() + timeout
    while not done(sql(query, params)[0][0]):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for: {query}")
        time.sleep(0.01)


def late_tenants(queue: str, jobs: int) -> dict[str, Any]:
    """A's backlog, then 25 late tenants, drained by two workers; what each late job saw."""
    from django_pgqueue import JobSpec, enqueue_many

    truncate()
    enqueue_backlog(queue, "a", jobs)
    sql("ANALYZE queue_job_state")
    workers = start_workers(queue, burst=True)
    started = "SELECT count(*) FROM queue_attempts"
    wait_for(started, None, lambda n: n >= min(jobs // 10, 2_000))
    late = enqueue_many(
        [JobSpec("qa.noop", fairness_key=f"t{n:02}") for n in range(LATE_TENANTS)], queue=queue
    )
    (mark,) = sql("SELECT coalesce(max(id), 0) FROM queue_attempts")[0]
    late_ids = [job.id for job in late]
    for _, thread in workers:
        thread.join(3600)
    stop_workers(workers)
    before = dict(
        sql(
            "SELECT late.job_id, count(a.id) FROM queue_attempts AS late "
            "LEFT JOIN queue_attempts AS a ON a.id > %s AND a.id < late.id "
            "AND a.job_id <> ALL(%s) WHERE late.job_id = ANY(%s) GROUP BY late.job_id",
            [mark, late_ids, late_ids],
        )
    )
    waits = [
        ms
        for (ms,) in sql(
            "SELECT extract(epoch FROM a.started_at - j.created_at) * 1000 "
            "FROM queue_attempts AS a JOIN queue_jobs AS j ON j.id = a.job_id "
            "WHERE a.job_id = ANY(%s)",
            [late_ids],
        )
    ]
    (rate,) = sql(
        "SELECT count(*) / extract(epoch FROM max(a.finished_at) - min(a.started_at)) "
        "FROM queue_attempts AS a WHERE a.job_id <> ALL(%s)",
        [late_ids],
    )[0]
    cycles = [before.get(job_id, 0) / WORKERS for job_id in late_ids]
    return {
        "queue": queue,
        "jobs": jobs,
        "a_rate": float(rate),
        "cycles_p50": percentile(cycles, 50),
        "cycles_p99": percentile(cycles, 99),
        "cycles_max": max(cycles),
        "wait_ms_p50": percentile(waits, 50),
        "wait_ms_p99": percentile(waits, 99),
    }


def weighted(seconds: float, backlog: int) -> dict[str, Any]:
    """Two keys of weights 3 and 1 drained for `seconds`: their completions."""
    truncate()
    for key in ("heavy", "light"):
        enqueue_backlog(WEIGHTED_QUEUE, key, backlog)
    sql("ANALYZE queue_job_state")
    workers = start_workers(WEIGHTED_QUEUE, burst=False)
    time.sleep(seconds)
    stop_workers(workers)
    done = dict(
        sql(
            "SELECT s.fair_key, count(*) FROM queue_job_state AS s "
            "WHERE s.queue = %s AND s.status = 'completed' GROUP BY s.fair_key",
            [WEIGHTED_QUEUE],
        )
    )
    heavy, light = done.get("heavy", 0), done.get("light", 0)
    return {"heavy": heavy, "light": light, "ratio": heavy / light if light else None}


def claim_at_many_keys(keys: int, backlog: int, runs: int) -> dict[str, Any]:
    """The fair claim of 10 at `keys` keys of one job each beside A's backlog."""
    import psycopg

    from django_pgqueue.sql import QUERIES
    from django_pgqueue.store.worker import connection_params

    truncate()
    sql(
        """
        WITH ids AS MATERIALIZED (
            SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n
            FROM generate_series(1, %(total)s) AS n
        ), jobs AS (
            INSERT INTO queue_jobs (id, queue, type, payload, created_at)
            SELECT id, %(queue)s, 'qa.noop', '{}', now() FROM ids
        )
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            fair_key, updated_at
        )
        SELECT id, %(queue)s, 'pending', 0, now() - interval '1 s', 0, 5, 0,
               CASE WHEN n <= %(backlog)s THEN 'a' ELSE 't' || lpad(n::text, 7, '0') END, now()
        FROM ids
        """,
        {"total": keys + backlog, "backlog": backlog, "queue": FAIR_QUEUE},
    )
    sql("VACUUM ANALYZE queue_job_state")
    middle = f"t{backlog + keys // 2:07}"
    params = {
        "queue": FAIR_QUEUE,
        "limit": 10,
        "worker_id": "bench",
        "lease": 30.0,
        "after": middle,
        "keys": 48,
        "weights": "{}",
    }
    timings = []
    with psycopg.connect(**connection_params("default", "fairness bench")) as conn:
        conn.prepare_threshold = 0
        for _ in range(runs):
            with conn.transaction(force_rollback=True):
                conn.execute(QUERIES["fair_claim_plan"])
                start = time.perf_counter()
                conn.execute(QUERIES["job_claim_fair"], params).fetchall()
                timings.append((time.perf_counter() - start) * 1000)
        with conn.transaction(force_rollback=True):
            conn.execute(QUERIES["fair_claim_plan"])
            plan = [
                row[0]
                for row in conn.execute(
                    "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "
                    + QUERIES["job_claim_fair"],
                    params,
                )
            ]
    return {
        "keys": keys,
        "backlog": backlog,
        "median_ms": statistics.median(timings),
        "p99_ms": percentile(timings, 99),
        "plan": plan,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0], "pgqueue_bench_fairness")
    p.add_argument("--jobs", type=int, default=100_000, help="tenant A's backlog")
    p.add_argument("--keys", type=int, default=100_000, help="keys for the claim's plan")
    args = p.parse_args()
    setup_django(args.database_url)
    declare_fair_queues()
    jobs = 2_000 if args.smoke else args.jobs
    keys = 2_000 if args.smoke else args.keys
    fair = late_tenants(FAIR_QUEUE, jobs)
    plain = late_tenants(PLAIN_QUEUE, jobs)
    weights = weighted(3.0 if args.smoke else 60.0, 5_000 if args.smoke else 200_000)
    claim = claim_at_many_keys(keys, jobs, 20 if args.smoke else 200)
    results = {
        "smoke": args.smoke,
        "machine": machine(),
        "late_tenants": {"fair": fair, "plain": plain},
        "a_drain_ratio": fair["a_rate"] / plain["a_rate"],
        "weights": weights,
        "claim": claim,
    }
    path = write_json(args.json_out, "fairness", results)
    rows = [
        [
            name,
            f"{run['a_rate']:,.0f}",
            f"{run['cycles_p50']:g} / {run['cycles_p99']:g} / {run['cycles_max']:g}",
            f"{run['wait_ms_p50']:,.0f} / {run['wait_ms_p99']:,.0f}",
        ]
        for name, run in (("fair", fair), ("not fair", plain))
    ]
    print(
        markdown_table(
            [
                "queue",
                "A's jobs/s",
                "late job: A's turns before it, cycles p50/p99/max",
                "late job's wait ms p50/p99",
            ],
            rows,
        )
    )
    print(f"A's drain, fair / not fair: {results['a_drain_ratio']:.2f}")
    print(f"weights 3:1 -> {weights['heavy']}:{weights['light']} = {weights['ratio']}")
    print(f"fair claim of 10 at {keys:,} keys: {claim['median_ms']:.2f} ms median")
    print(json.dumps({"written": str(path)}))


if __name__ == "__main__":
    main()
