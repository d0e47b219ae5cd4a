"""Drain of two queues on two PostgreSQL servers against the same two queues on one.

Two queues, `a` and `b`, of N no-op jobs each (loaded with `_common.load_jobs`),
drained by `run_queue_worker --burst`, either two processes (one per queue) or one
process serving both queues:

- `one_server`: both queues in one database of the shared server
  (pgqueue_bench_multidb);
- `two_servers`: `a` there, `b` in a database (pgqueue_bench_multidb2) of a throwaway
  PostgreSQL 15 this script starts (initdb in a temporary directory, a free port,
  removed afterwards), routed with PGQUEUE["QUEUE_DATABASES"] = {"b": "queues2"}. Two
  processes: one per database. One process: a `Worker` per database in that process,
  sharing its handler slots (django_pgqueue/worker/several.py).

Every process has `--concurrency` handler slots, so one process runs half the handlers
two do. The layouts alternate, `--runs` times. Per run: jobs/s of the whole drain (2N
jobs over the database clock from the first attempt's start to the last attempt's
finish, both servers on this machine's clock), of each queue, and the ratio
two_servers / one_server with the same processes in the same run; the medians are kept.
Every drain is checked: each job completed once, by exactly one attempt.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import MANAGE, load_jobs, machine, markdown_table, parser, setup_django, write_json
from scale import PG_BIN, free_port, throwaway_server

DATABASE = "pgqueue_bench_multidb"
SECOND = "pgqueue_bench_multidb2"
ALIAS = "queues2"
QUEUES = ("a", "b")


def truncate(alias: str) -> None:
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute("TRUNCATE queue_jobs, queue_job_state, queue_attempts CASCADE")
        cursor.execute("VACUUM ANALYZE queue_job_state")


def check(alias: str, queue: str, n: int) -> tuple[float, float]:
    """Every job of `queue` on `alias` completed by one attempt; (first start, last end)."""
    from django.db import connections

    with connections[alias].cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT a.job_id), "
            "count(*) FILTER (WHERE a.status = 'succeeded'), "
            "extract(epoch FROM min(a.started_at))::float8, "
            "extract(epoch FROM max(a.finished_at))::float8 "
            "FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id WHERE j.queue = %s",
            [queue],
        )
        attempts, distinct, succeeded, first, last = cursor.fetchone()
        cursor.execute(
            "SELECT count(*) FROM queue_job_state WHERE queue = %s AND status = 'completed'",
            [queue],
        )
        (completed,) = cursor.fetchone()
    if not (attempts == distinct == succeeded == completed == n):
        raise SystemExit(
            f"multidb: drain check failed on {alias}/{queue}: {n} jobs, {completed} completed, "
            f"{attempts} attempts, {distinct} distinct, {succeeded} succeeded"
        )
    return first, last


def drain(layout: str, processes: int, n: int, concurrency: int) -> dict[str, Any]:
    """Load N jobs in each queue where `layout` puts it, drain with `processes` (1: one
    over both queues; 2: one per queue)."""
    where = {"a": "default", "b": ALIAS if layout == "two_servers" else "default"}
    for alias in set(where.values()):
        truncate(alias)
    for queue, alias in where.items():
        load_jobs(n, n, queues=(queue,), spread=False, using=alias)
    env = dict(os.environ)
    if layout == "two_servers":
        env["PGQUEUE_TEST_QUEUE_DATABASES"] = json.dumps({"b": ALIAS})
    else:
        env.pop("PGQUEUE_TEST_QUEUE_DATABASES", None)
    command = [sys.executable, str(MANAGE), "run_queue_worker", "--burst", "-v", "0"]
    options = ["--concurrency", str(concurrency), "--batch-size", str(concurrency)]
    queue_sets = [QUEUES] if processes == 1 else [(queue,) for queue in QUEUES]
    started = time.perf_counter()
    workers = [subprocess.Popen([*command, *qs, *options], env=env) for qs in queue_sets]
    try:
        for worker in workers:
            if worker.wait(3600) != 0:
                raise SystemExit(f"multidb: a worker exited with {worker.returncode}")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
    wall = time.perf_counter() - started
    spans = {queue: check(alias, queue, n) for queue, alias in where.items()}
    first = min(span[0] for span in spans.values())
    last = max(span[1] for span in spans.values())
    return {
        "layout": layout,
        "processes": processes,
        "jobs": 2 * n,
        "wall_s": wall,
        "seconds": last - first,
        "jobs_per_s": 2 * n / (last - first),
        "per_queue_jobs_per_s": {q: n / (end - start) for q, (start, end) in spans.items()},
    }


def migrate(url: str) -> None:
    import psycopg

    server, _, name = url.rpartition("/")
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "--verbosity", "0"],
        check=True,
        env={**os.environ, "DATABASE_URL": url},
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], database=DATABASE)
    p.add_argument("--jobs", type=int, help="no-op jobs per queue (default 10,000; smoke 500)")
    p.add_argument("--concurrency", type=int, default=16, help="handler threads and batch size")
    args = p.parse_args()
    if not (PG_BIN / "initdb").exists():
        raise SystemExit(f"multidb: needs {PG_BIN / 'initdb'} for the second server")
    n = args.jobs or (500 if args.smoke else 10_000)
    runs = 1 if args.smoke else args.runs
    with throwaway_server(free_port()) as second:
        second_url = f"{second}/{SECOND}"
        migrate(second_url)
        # The testproject's settings define `queues2` from this (read at django.setup()).
        os.environ["PGQUEUE_TEST_QUEUES2_URL"] = second_url
        setup_django(args.database_url)
        results: dict[str, Any] = {
            "machine": machine(),
            "smoke": args.smoke,
            "runs": runs,
            "jobs_per_queue": n,
            "concurrency": args.concurrency,
            "load": os.getloadavg(),
            "second_server": "throwaway PostgreSQL 15, default settings (autovacuum on)",
        }
        pairs = []
        for run in range(runs):
            layouts = [(lay, procs) for procs in (2, 1) for lay in ("one_server", "two_servers")]
            if run % 2:
                layouts.reverse()
            drained = {
                f"{lay}_{procs}p": drain(lay, procs, n, args.concurrency) for lay, procs in layouts
            }
            pair: dict[str, Any] = dict(drained)
            for procs in (2, 1):
                pair[f"ratio_{procs}p"] = (
                    drained[f"two_servers_{procs}p"]["jobs_per_s"]
                    / drained[f"one_server_{procs}p"]["jobs_per_s"]
                )
            print(
                f"run {run + 1}: "
                + ", ".join(f"{key} {d['jobs_per_s']:,.0f} jobs/s" for key, d in drained.items())
                + f"; ratios 2p {pair['ratio_2p']:.2f}, 1p {pair['ratio_1p']:.2f}",
                flush=True,
            )
            pairs.append(pair)
        results["pairs"] = pairs
        results["median"] = {
            **{
                f"{key}_jobs_per_s": statistics.median(p[key]["jobs_per_s"] for p in pairs)
                for key in pairs[0]
                if not key.startswith("ratio")
            },
            **{key: statistics.median(p[key] for p in pairs) for key in ("ratio_2p", "ratio_1p")},
        }
        results["load_after"] = os.getloadavg()
    print(table(results))
    print(f"results: {write_json(args.json_out, 'multidb', results)}")


def table(results: dict[str, Any]) -> str:
    m = results["median"]
    if "ratio" in m:  # results of old: two processes only
        m = {
            "one_server_2p_jobs_per_s": m["one_server_jobs_per_s"],
            "two_servers_2p_jobs_per_s": m["two_servers_jobs_per_s"],
            "ratio_2p": m["ratio"],
        }
    rows = []
    for procs, how in ((2, "2 processes, 1 per queue"), (1, "1 process over both queues")):
        if f"ratio_{procs}p" not in m:
            continue
        rows += [
            [
                f"two queues, one server ({how})",
                f"{m[f'one_server_{procs}p_jobs_per_s']:,.0f}",
                "1.00",
            ],
            [
                f"two queues, two servers ({how})",
                f"{m[f'two_servers_{procs}p_jobs_per_s']:,.0f}",
                f"{m[f'ratio_{procs}p']:.2f}",
            ],
        ]
    return markdown_table(["layout", "jobs/s (median)", "ratio"], rows)


if __name__ == "__main__":
    main()
