"""How many jobs per second one machine moves, and how fast an idle worker reacts.

- enqueue rate: single enqueue() calls, one transaction each; and enqueue_many();
- drain rate: N no-op jobs enqueued first, then drained by `run_queue_worker --burst`
  processes (1, 2, 4; several concurrency/batch settings), timed on the database clock
  from the first claim to the last completion, and checked in the database: every job
  completed exactly once (one succeeded attempt, no other attempt);
- pickup latency: an idle worker, jobs enqueued one by one 50 ms apart, from the
  enqueue (created_at) to the handler's first statement (clock_timestamp()), both on
  the database clock.

Run: python benchmarks/throughput.py [--smoke] [--runs 3] [--jobs 20000]
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
    return n / float(seconds)


def pickup_latency(count: int, gap: float) -> dict[str, float]:
    from django_pgqueue import enqueue

    truncate()
    worker = subprocess.Popen(worker_command(None, None), env=os.environ)
    try:
        time.sleep(2.0)  # started and idle, listening
        for _ in range(count):
            enqueue("qa.clock", None, queue="bench")
            time.sleep(gap)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
            if done == count:
                break
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    rows = sql(
        "SELECT extract(epoch FROM (a.result #>> '{}')::timestamptz - j.created_at) * 1000 "
        "FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id WHERE a.status = 'succeeded'"
    )
    latencies = [float(ms) for (ms,) in rows]
    if len(latencies) != count:
        raise SystemExit(f"pickup: only {len(latencies)} of {count} jobs ran")
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies),
    }


def main() -> None:
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
            "pickup latency, idle worker, p50 / p99",
            f"{results['pickup']['p50_ms']:.2f} / {results['pickup']['p99_ms']:.2f} ms",
        ],
    ]
    print(markdown_table(["figure", f"median of {runs}"], rows))
    print(f"results: {write_json(args.json_out, 'throughput', results)}")


if __name__ == "__main__":
    main()
