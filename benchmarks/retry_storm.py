"""Retry storms: 1,000 jobs fail at once against a flaky dependency; fixed delay vs full jitter.

The real worker (`run_queue_worker` processes) runs the real retry policies. The
handlers (testproject/qa/jobs.py, bench.storm_fixed and bench.storm_jitter) call a
dependency that is down for --down seconds after the jobs are enqueued; every attempt
in that window fails with ConnectionError and is retried by its policy:
`FixedDelay(--fixed)` or `ExponentialBackoff(base=--base)` (full jitter: the first retry
waits uniform(0, base)). The workers are started and idle before the 1,000 jobs arrive
in one enqueue_many(), so the first attempts all run (and fail) within about a second.

A retry is an attempt after a job's first; its time is the attempt's started_at (the
database clock, when the worker claimed it). Reported per policy (median of --runs):
the peak of retries in one second (per whole second from the first attempt, and in any
sliding one-second window), the seconds over which the retries spread (first to last,
and the 5th to 95th percentile), and retries per second over time for the plot.

Run: python benchmarks/retry_storm.py [--smoke] [--runs 3]
"""

from __future__ import annotations

import bisect
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import (
    MANAGE,
    RESULTS,
    machine,
    markdown_table,
    parser,
    percentile,
    setup_django,
    sql,
    truncate,
    write_json,
)

QUEUE = "storm"
POLICIES = {"fixed": "bench.storm_fixed", "jitter": "bench.storm_jitter"}


def start_workers(count: int, concurrency: int, env: dict[str, str], log: Any) -> list[Any]:
    """Start `count` worker processes and wait until each is listening (idle)."""
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                str(MANAGE),
                "run_queue_worker",
                QUEUE,
                "-v",
                "0",
                "--concurrency",
                str(concurrency),
                "--batch-size",
                str(concurrency),
            ],
            env=env,
            stdout=log,
            stderr=log,
        )
        for _ in range(count)
    ]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listening = sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE 'pgqueue listener%%'"
        )[0][0]
        if listening >= count:
            time.sleep(0.5)  # past the first poll: idle
            return workers
        if any(w.poll() is not None for w in workers):
            break
        time.sleep(0.1)
    stop_workers(workers)
    raise SystemExit("retry_storm: the workers did not start (see the worker log)")


def stop_workers(workers: list[Any]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for worker in workers:
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


def storm(
    policy: str, jobs: int, down_s: float, workers: list[Any], timeout: float
) -> dict[str, Any]:
    """Enqueue `jobs` failing jobs at once; wait until all completed; the retry timeline."""
    from django_pgqueue import enqueue_many

    truncate()
    down_until = time.time() + down_s
    enqueue_many([(POLICIES[policy], {"down_until": down_until})] * jobs, queue=QUEUE)
    deadline = time.monotonic() + timeout
    while True:
        done = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
        if done == jobs:
            break
        if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
            raise SystemExit(f"retry_storm: {policy}: only {done} of {jobs} jobs completed")
        time.sleep(0.25)
    rows = sql(
        "SELECT extract(epoch FROM started_at)::float8, attempt_index, status "
        "FROM queue_attempts ORDER BY started_at"
    )
    dead = sql("SELECT count(*) FROM queue_job_state WHERE status <> 'completed'")[0][0]
    succeeded = sum(1 for _, _, status in rows if status == "succeeded")
    if dead or succeeded != jobs:
        raise SystemExit(f"retry_storm: {policy}: {dead} jobs not completed, {succeeded} succeeded")
    return timeline(rows, jobs)


def timeline(rows: list[tuple[float, int, str]], jobs: int) -> dict[str, Any]:
    """Retries per second from the first attempt, peaks and spread."""
    t0 = min(t for t, _, _ in rows)
    firsts = [t - t0 for t, index, _ in rows if index == 1]
    retries = sorted(t - t0 for t, index, _ in rows if index > 1)
    seconds = math.floor(max(t - t0 for t, _, _ in rows)) + 1
    per_second = [0] * seconds
    for t in retries:
        per_second[int(t)] += 1
    # The most retries that started within any one second: for each retry, those
    # that started in the second from it.
    window_peak = max(
        (bisect.bisect_right(retries, t + 1.0) - i for i, t in enumerate(retries)), default=0
    )
    failures_after = sum(1 for _, index, status in rows if index > 1 and status == "failed")
    return {
        "jobs": jobs,
        "attempts": len(rows),
        "retries": len(retries),
        "retries_failed": failures_after,
        "first_wave_s": max(firsts) - min(firsts),
        "peak_per_second": max(per_second, default=0),
        "peak_1s_window": window_peak,
        "spread_s": (retries[-1] - retries[0]) if retries else 0.0,
        "spread_p5_p95_s": percentile(retries, 95) - percentile(retries, 5) if retries else 0.0,
        "seconds_with_retries": sum(1 for n in per_second if n),
        "per_second": per_second,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_storm")
    p.add_argument("--jobs", type=int, default=1_000)
    p.add_argument("--fixed", type=float, default=10.0, help="FixedDelay seconds")
    p.add_argument("--base", type=float, default=60.0, help="full-jitter backoff base seconds")
    p.add_argument("--down", type=float, default=5.0, help="seconds the dependency is down")
    p.add_argument("--processes", type=int, default=2, help="worker processes")
    p.add_argument("--concurrency", type=int, default=50, help="handler threads (and batch)")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    jobs, fixed, base, down = args.jobs, args.fixed, args.base, args.down
    processes = args.processes
    if args.smoke:
        jobs, fixed, base, down, processes = 60, 1.0, 2.0, 0.3, 1
    env = {
        **os.environ,
        "PGQUEUE_BENCH_STORM_FIXED": str(fixed),
        "PGQUEUE_BENCH_STORM_BASE": str(base),
        "PGQUEUE_BENCH_STORM_CAP": "3600",
    }
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "jobs": jobs,
        "fixed_delay_s": fixed,
        "jitter_base_s": base,
        "down_s": down,
        "processes": processes,
        "concurrency": args.concurrency,
        "policies": {},
    }
    log_path = RESULTS / ("smoke" if args.smoke else "") / "retry_storm-workers.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timeout = 60 + 4 * max(fixed, base) + down
    with log_path.open("w") as log:
        truncate()
        workers = start_workers(processes, args.concurrency, env, log)
        try:
            for policy in POLICIES:
                outcomes = []
                for _ in range(runs):
                    outcomes.append(storm(policy, jobs, down, workers, timeout))
                    print(
                        f"{policy}: peak {outcomes[-1]['peak_1s_window']} retries in 1 s, "
                        f"spread {outcomes[-1]['spread_s']:.1f} s",
                        flush=True,
                    )
                results["policies"][policy] = summarize(outcomes)
        finally:
            stop_workers(workers)
            truncate()
    print(table(results))
    print(f"results: {write_json(args.json_out, 'retry_storm', results)}")


def summarize(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("peak_per_second", "peak_1s_window", "spread_s", "spread_p5_p95_s", "retries")
    median_run = sorted(outcomes, key=lambda o: o["peak_1s_window"])[len(outcomes) // 2]
    return {
        **{key: statistics.median(o[key] for o in outcomes) for key in keys},
        **{f"{key}_runs": [o[key] for o in outcomes] for key in keys},
        "first_wave_s": statistics.median(o["first_wave_s"] for o in outcomes),
        "per_second": median_run["per_second"],
        "runs": outcomes,
    }


def table(results: dict[str, Any]) -> str:
    labels = {
        "fixed": f"FixedDelay({results['fixed_delay_s']:g} s)",
        "jitter": f"ExponentialBackoff(base={results['jitter_base_s']:g} s), full jitter",
    }
    rows = []
    for policy, s in results["policies"].items():
        rows.append(
            [
                labels[policy],
                f"{s['retries']:g}",
                f"{s['peak_1s_window']:g}",
                f"{s['peak_per_second']:g}",
                f"{s['spread_s']:.1f}",
                f"{s['spread_p5_p95_s']:.1f}",
                ", ".join(f"{v:g}" for v in s["peak_1s_window_runs"]),
            ]
        )
    headers = [
        f"policy ({results['jobs']:,} jobs, dependency down {results['down_s']:g} s)",
        "retries",
        "peak retries in any 1 s",
        "peak in a whole second",
        "spread s (first to last retry)",
        "spread s (p5-p95)",
        "peak per run",
    ]
    return markdown_table(headers, rows)


if __name__ == "__main__":
    main()
