"""Fair queues: late tenants behind a big backlog, weights, and the claim at many keys.

- late tenants: tenant A enqueues N no-op jobs (100,000) to a queue; once two workers
  (threads of this process, concurrency 4 each) are draining it, 25 other tenants
  enqueue one job each. On a fair queue (PGQUEUE["FAIR_QUEUES"]) each of the 25 should
  start within two claim cycles of being due (a cycle: each worker's round over the
  keys, in which A gets one turn a worker): reported as A's starts between a late job
  being due and its start, in cycles (p50, p99, max), and its wait in ms. The same run
  on a queue that is not fair is the baseline, run alternately with the fair one
  (fair, not fair, fair, not fair ..., `--runs` pairs) so the machine's drift falls on
  both: A's drain rate (its jobs per second, first start to last completion, on the
  database clock) on the fair queue over the baseline's, per pair and the median of the
  pairs, is the cost of the turns (target >= 90%).
- weights: keys "heavy" (weight 3) and "light" (1), each with a backlog, drained for a
  while (60 s; smoke 3 s): the ratio of their completions (target 3.0 within 5%).
- the claim at many keys: 100,000 keys of one pending job each, (a) due, beside A's
  backlog, and (b) all scheduled later (the claim walks its keys and takes nothing):
  the fair claim of 10 as a worker sends it (prepared, on its generic plan, each claim
  committed), median of 200 from a cursor in the middle of the keys (target <= 5 ms),
  and its `EXPLAIN (ANALYZE, BUFFERS)`.

Run: python benchmarks/fairness.py [--smoke] [--runs 3] [--jobs 100000] [--keys 100000]
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


def enqueue_between_claims(queue: str, specs: list[Any]) -> tuple[list[Any], int]:
    """Enqueue `specs` while no claim runs: the jobs and the last attempt id before them.

    The table lock waits for the claims in flight to commit and holds new ones back
    until the jobs are committed, so every attempt after the mark is of a claim that
    saw the jobs due (a claim in flight when they came could not have taken them, and
    would count as A's starts before them)."""
    from django.db import transaction

    from django_pgqueue import enqueue_many

    with transaction.atomic():
        sql("LOCK TABLE queue_job_state IN EXCLUSIVE MODE")
        (mark,) = sql("SELECT coalesce(max(id), 0) FROM queue_attempts")[0]
        return enqueue_many(specs, queue=queue), mark


def late_tenants(queue: str, jobs: int) -> dict[str, Any]:
    """A's backlog, then 25 late tenants, drained by two workers; what each late job saw."""
    from django_pgqueue import JobSpec

    truncate()
    enqueue_backlog(queue, "a", jobs)
    sql("ANALYZE queue_job_state")
    workers = start_workers(queue, burst=True)
    started = "SELECT count(*) FROM queue_attempts"
    wait_for(started, None, lambda n: n >= min(jobs // 10, 2_000))
    late, mark = enqueue_between_claims(
        queue, [JobSpec("qa.noop", fairness_key=f"t{n:02}") for n in range(LATE_TENANTS)]
    )
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


def load_keys(keys: int, backlog: int, run_at: str) -> None:
    """`keys` keys of one pending job each, due at `run_at` (an interval from now),
    beside A's `backlog` of due jobs."""
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
        SELECT id, %(queue)s, 'pending', 0,
               CASE WHEN n <= %(backlog)s THEN now() - interval '1 s'
                    ELSE now() + %(run_at)s::interval END,
               0, 5, 0,
               CASE WHEN n <= %(backlog)s THEN 'a' ELSE 't' || lpad(n::text, 7, '0') END, now()
        FROM ids
        """,
        {"total": keys + backlog, "backlog": backlog, "queue": FAIR_QUEUE, "run_at": run_at},
    )
    sql("VACUUM ANALYZE queue_job_state")


def claim_at_many_keys(keys: int, backlog: int, runs: int, run_at: str) -> dict[str, Any]:
    """The fair claim of 10 at `keys` keys of one job each (due at `run_at`) beside A's
    backlog, as a worker sends it: prepared, on its generic plan, committed."""
    import psycopg

    from django_pgqueue.sql import QUERIES
    from django_pgqueue.store.worker import connection_params

    load_keys(keys, backlog, run_at)
    params = {
        "queue": FAIR_QUEUE,
        "limit": 10,
        "worker_id": "bench",
        "lease": 30.0,
        "after": f"t{backlog + keys // 2:07}",
        "keys": 48,
        "weights": "{}",
        "resume": "{}",
    }
    timings = []
    taken = 0
    with psycopg.connect(**connection_params("default", "fairness bench")) as conn:
        # Committed, as the worker's claims are: psycopg drops its prepared statements
        # when a transaction rolls back, so a rolled-back claim would be planned anew
        # each time. Each claim takes the next keys' jobs (the cursor stays put).
        conn.prepare_threshold = 0
        for _ in range(runs):
            with conn.transaction():
                conn.execute(QUERIES["fair_claim_plan"])
                start = time.perf_counter()
                rows = conn.execute(QUERIES["job_claim_fair"], params).fetchall()
                timings.append((time.perf_counter() - start) * 1000)
            taken += sum(1 for row in rows if row[0] is not None)
        with conn.transaction(force_rollback=True):
            conn.execute(QUERIES["fair_claim_plan"])
            plan = [
                row[0]
                for row in conn.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, SUMMARY ON) "
                    + QUERIES["job_claim_fair"],
                    params,
                )
            ]
    return {
        "keys": keys,
        "backlog": backlog,
        "run_at": run_at,
        "jobs_taken": taken,
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
    pairs = 1 if args.smoke else args.runs
    runs: list[dict[str, Any]] = []
    for _ in range(pairs):
        fair = late_tenants(FAIR_QUEUE, jobs)
        plain = late_tenants(PLAIN_QUEUE, jobs)
        runs.append({"fair": fair, "plain": plain, "ratio": fair["a_rate"] / plain["a_rate"]})
    weights = weighted(3.0 if args.smoke else 60.0, 5_000 if args.smoke else 200_000)
    claim_runs = 20 if args.smoke else 200
    claims = {
        "due": claim_at_many_keys(keys, jobs, claim_runs, "-1 second"),
        "all_delayed": claim_at_many_keys(keys, 0, claim_runs, "1 hour"),
    }
    ratios = [run["ratio"] for run in runs]
    late_p99 = max(run["fair"]["cycles_p99"] for run in runs)
    results = {
        "smoke": args.smoke,
        "machine": machine(),
        "late_tenants": runs,
        "a_drain_ratio": statistics.median(ratios),
        "a_drain_ratios": ratios,
        "late_cycles_p99": late_p99,
        "weights": weights,
        "claim": claims,
    }
    path = write_json(args.json_out, "fairness", results)
    rows = [
        [
            f"{number} {name}",
            f"{run[name]['a_rate']:,.0f}",
            f"{run[name]['cycles_p50']:g} / {run[name]['cycles_p99']:g} / "
            f"{run[name]['cycles_max']:g}",
            f"{run[name]['wait_ms_p50']:,.0f} / {run[name]['wait_ms_p99']:,.0f}",
            f"{run['ratio']:.2f}" if name == "fair" else "",
        ]
        for number, run in enumerate(runs, 1)
        for name in ("fair", "plain")
    ]
    print(
        markdown_table(
            [
                "pair, queue",
                "A's jobs/s",
                "late job: A's starts before it, cycles p50/p99/max",
                "late job's wait ms p50/p99",
                "A's drain fair / plain",
            ],
            rows,
        )
    )
    print(
        f"A's drain, fair / not fair: median {results['a_drain_ratio']:.2f} of "
        f"{', '.join(f'{r:.2f}' for r in ratios)}; late jobs' p99: {late_p99:g} cycles"
    )
    print(f"weights 3:1 -> {weights['heavy']}:{weights['light']} = {weights['ratio']}")
    for name, claim in claims.items():
        print(
            f"fair claim of 10 at {keys:,} keys, {name.replace('_', ' ')}: "
            f"{claim['median_ms']:.2f} ms median, {claim['p99_ms']:.2f} ms p99 "
            f"({claim['jobs_taken']} jobs taken in {claim_runs} claims)"
        )
    print(json.dumps({"written": str(path)}))


if __name__ == "__main__":
    main()
