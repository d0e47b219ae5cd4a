"""Time the admin's pages on a large queue: the jobs list, the dead jobs list, a job's page.

Creates its own database (default ``pgqueue_admin_bench``, on the server of
DATABASE_URL), migrates it, loads N jobs with a realistic mix of statuses in a few
INSERT ... SELECT generate_series statements, vacuums and analyzes the tables as
autovacuum would, then renders each page with Django's test client as a logged-in
superuser: the median of several runs after a warm-up, and the SQL queries per page.
Prints a Markdown table, writes JSON with --json-out, and drops the database unless
--keep. --smoke loads 5,000 jobs and runs in seconds (CI runs it).

    python benchmarks/admin_pages.py                 # 1,000,000 jobs
    python benchmarks/admin_pages.py --smoke
    python benchmarks/admin_pages.py --jobs 200000 --runs 9 --json-out results/admin.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue"
BUDGET_MS = 300.0

# One row per job, with everything the three inserts need. Statuses are spread over
# the id range by a multiplicative hash, so the dead and pending jobs are scattered
# through the table as in a real queue, not packed at one end.
GENERATE = """
CREATE TEMP TABLE bench_jobs AS
SELECT g AS id,
       q.queue,
       CASE q.queue
           WHEN 'payments' THEN
               CASE WHEN g %% 5 = 0 THEN 'payments.refund' ELSE 'payments.charge' END
           WHEN 'email' THEN 'email.send'
           WHEN 'reports' THEN 'reports.daily'
           ELSE 'demo.resize_image'
       END AS type,
       CASE
           WHEN b < 915 THEN 'completed'
           WHEN b < 965 THEN 'pending'
           WHEN b < 985 THEN 'dead'
           WHEN b < 995 THEN 'cancelled'
           ELSE 'running'
       END AS status,
       now() - make_interval(secs => (%(jobs)s - g) * 0.6) AS created_at,
       CASE WHEN g %% 5 = 0 THEN 'order-' || g END AS idempotency_key,
       g %% 8 AS spread
FROM generate_series(1, %(jobs)s) AS g
CROSS JOIN LATERAL (SELECT (g::bigint * 7919) %% 1000 AS b) AS h
CROSS JOIN LATERAL (
    SELECT CASE WHEN g %% 10 < 4 THEN 'payments' WHEN g %% 10 < 7 THEN 'email'
                WHEN g %% 10 < 9 THEN 'default' ELSE 'reports' END AS queue
) AS q
"""

INSERT_JOBS = """
INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
SELECT id, queue, type,
       jsonb_build_object('order_id', id, 'amount_cents', id % 100000, 'currency', 'EUR',
                          'customer', 'cust-' || (id % 5000), 'lines', jsonb_build_array(
                              jsonb_build_object('sku', 'SKU-' || (id % 977), 'qty', 1 + id % 3))),
       idempotency_key, created_at
FROM bench_jobs
"""

INSERT_STATES = """
INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts, max_attempts,
                             lease_version, locked_by, locked_until, last_error,
                             idempotency_key, updated_at, finished_at)
SELECT id, queue, status,
       CASE WHEN id % 13 = 0 THEN 10 ELSE 0 END,
       CASE
           WHEN status = 'pending' AND id % 2 = 0 THEN now() + make_interval(secs => id % 3600)
           WHEN status = 'pending' THEN now() - make_interval(secs => id % 600)
           ELSE created_at + interval '1 second'
       END,
       a.attempts,
       CASE WHEN status = 'dead' THEN 3 ELSE 5 END,
       a.attempts,
       CASE WHEN status = 'running' THEN 'bench-worker-' || spread END,
       CASE WHEN status = 'running' AND id % 10 = 0 THEN now() - interval '5 minutes'
            WHEN status = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN status = 'dead' THEN 'ValueError: upstream returned 502 for order ' || id
            WHEN status = 'pending' AND a.attempts > 0 THEN 'ConnectionError: timed out' END,
       idempotency_key,
       created_at + interval '2 seconds',
       CASE WHEN status IN ('completed', 'dead', 'cancelled')
            THEN created_at + interval '2 seconds' END
FROM bench_jobs
CROSS JOIN LATERAL (
    SELECT CASE status WHEN 'completed' THEN 1 WHEN 'dead' THEN 3 WHEN 'running' THEN 1
                       WHEN 'pending' THEN (id % 4 = 0)::int ELSE 0 END AS attempts
) AS a
"""

INSERT_ATTEMPTS = """
INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status,
                            started_at, finished_at, error_class, error_message, traceback)
SELECT s.job_id, n, n, 'bench-worker-' || (s.job_id % 8),
       CASE WHEN s.status = 'completed' THEN 'succeeded'
            WHEN s.status = 'running' THEN 'running' ELSE 'failed' END,
       s.updated_at - interval '1.5 seconds' + make_interval(secs => n),
       CASE WHEN s.status <> 'running'
            THEN s.updated_at - interval '1 second' + make_interval(secs => n) END,
       CASE WHEN s.status IN ('dead', 'pending') THEN 'ValueError' END,
       CASE WHEN s.status IN ('dead', 'pending')
            THEN 'upstream returned 502 for order ' || s.job_id END,
       CASE WHEN s.status IN ('dead', 'pending') THEN
            E'Traceback (most recent call last):\\n'
            || E'  File "/srv/app/django_pgqueue/executor.py", line 81, in run\\n'
            || E'    value = handler.func(ctx)\\n'
            || E'  File "/srv/app/payments/jobs.py", line 42, in charge\\n'
            || E'    receipt = gateway.charge(order.total, idempotency_key=ctx.idempotency_key)\\n'
            || E'  File "/srv/app/payments/gateway.py", line 118, in charge\\n'
            || E'    raise ValueError(f"upstream returned {status} for order {order_id}")\\n'
            || 'ValueError: upstream returned 502 for order ' || s.job_id END
FROM queue_job_state AS s
CROSS JOIN LATERAL generate_series(1, s.attempts) AS n
"""


def admin_url(base_url: str, name: str) -> str:
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def server_params(url: str) -> dict[str, Any]:
    parts = urlsplit(url)
    return {
        "host": parts.hostname or None,
        "port": parts.port or None,
        "user": parts.username or None,
        "password": parts.password or None,
        "dbname": "postgres",
    }


def recreate_database(url: str, name: str, *, drop_only: bool = False) -> None:
    with psycopg.connect(**server_params(url), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def load(jobs: int) -> dict[str, float]:
    from django.db import connection

    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        for label, statement in [
            ("generate", GENERATE),
            ("queue_jobs", INSERT_JOBS),
            ("queue_job_state", INSERT_STATES),
            ("queue_attempts", INSERT_ATTEMPTS),
        ]:
            started = time.perf_counter()
            # Only GENERATE takes a parameter (its %% signs are doubled); the others
            # run as plain SQL, where % is the modulo operator.
            cursor.execute(statement, {"jobs": jobs} if statement is GENERATE else None)
            timings[label] = time.perf_counter() - started
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), %s)", [jobs])
        cursor.execute("DROP TABLE bench_jobs")
        started = time.perf_counter()
        # What autovacuum does on a live system (it is off on some servers).
        cursor.execute("VACUUM (ANALYZE) queue_jobs, queue_job_state, queue_attempts")
        timings["vacuum_analyze"] = time.perf_counter() - started
    return timings


def measure(client: Any, url: str, runs: int, expect: str) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(2):  # warm-up: templates, caches, the first plans
        response = client.get(url)
    if response.status_code != 200 or expect not in response.content.decode():
        raise SystemExit(f"{url}: status {response.status_code}, {expect!r} missing")
    times = []
    queries = 0
    for _ in range(runs):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            response = client.get(url)
            times.append((time.perf_counter() - started) * 1000)
        queries = len(captured)
        assert response.status_code == 200
    return {
        "url": url,
        "median_ms": round(statistics.median(times), 1),
        "min_ms": round(min(times), 1),
        "max_ms": round(max(times), 1),
        "queries": queries,
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs to load")
    parser.add_argument("--smoke", action="store_true", help="5,000 jobs, 3 runs: a quick check")
    parser.add_argument("--runs", type=int, default=7, help="timed renders per page")
    parser.add_argument("--db-name", default="pgqueue_admin_bench", help="database to create")
    parser.add_argument("--json-out", type=Path, help="write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--max-ms",
        type=float,
        help=f"fail when a required page's median exceeds this (the issue's budget: {BUDGET_MS:g})",
    )
    args = parser.parse_args()
    if args.smoke:
        args.jobs, args.runs = 5_000, 3

    base_url = os.environ.get("DATABASE_URL") or DEFAULT_URL
    url = admin_url(base_url, args.db_name)
    print(f"admin_pages: {args.jobs:,} jobs in database {args.db_name}", flush=True)
    recreate_database(base_url, args.db_name)
    try:
        os.environ["DATABASE_URL"] = url
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
        import django

        django.setup()
        from django.contrib.auth.models import User
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client
        from django.test.utils import setup_test_environment

        setup_test_environment()
        call_command("migrate", verbosity=0)
        started = time.perf_counter()
        load_timings = load(args.jobs)
        print(f"loaded in {time.perf_counter() - started:.1f}s {load_timings}", flush=True)

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT status, count(*) FROM queue_job_state GROUP BY status ORDER BY status"
            )
            mix = dict(cursor.fetchall())
            cursor.execute(
                "SELECT job_id FROM queue_job_state WHERE status = 'dead' "
                "ORDER BY finished_at DESC, job_id DESC LIMIT 1"
            )
            dead_id = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM queue_attempts")
            attempts = cursor.fetchone()[0]
        print(f"mix: {mix}, attempts: {attempts:,}", flush=True)

        client = Client()
        client.force_login(User.objects.create_superuser("bench", password=None))
        pages = [
            ("jobs list", "/admin/django_pgqueue/job/", "At a glance", True),
            ("dead jobs list", "/admin/django_pgqueue/deadjob/", "upstream returned 502", True),
            (
                "a dead job's page",
                f"/admin/django_pgqueue/job/{dead_id}/change/",
                "Traceback",
                True,
            ),
            # Not in the budget; measured to show where the limits are.
            (
                "jobs list, status=pending",
                "/admin/django_pgqueue/job/?state__status__exact=pending",
                "pending",
                False,
            ),
            (
                "jobs list, search by id",
                f"/admin/django_pgqueue/job/?q={dead_id}",
                str(dead_id),
                False,
            ),
            ("jobs list, page 20", "/admin/django_pgqueue/job/?p=20", "At a glance", False),
        ]
        results = []
        for label, page_url, expect, required in pages:
            result = {
                "page": label,
                "required": required,
                **measure(client, page_url, args.runs, expect),
            }
            results.append(result)
            print(f"  {label}: {result['median_ms']} ms, {result['queries']} queries", flush=True)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            recreate_database(base_url, args.db_name, drop_only=True)

    print()
    print(
        f"Admin pages with {args.jobs:,} jobs ({attempts:,} attempts), "
        f"median of {args.runs} renders, Django test client, logged-in superuser:"
    )
    print()
    print("| page | median ms | min ms | max ms | SQL queries |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        mark = "" if r["required"] else " (extra)"
        cells = [r["median_ms"], r["min_ms"], r["max_ms"], r["queries"]]
        print(f"| {r['page']}{mark} | " + " | ".join(str(cell) for cell in cells) + " |")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            json.dumps(
                {
                    "jobs": args.jobs,
                    "attempts": attempts,
                    "mix": mix,
                    "runs": args.runs,
                    "load_seconds": load_timings,
                    "pages": results,
                },
                indent=2,
            )
        )
    if args.max_ms is not None:
        slow = [r for r in results if r["required"] and r["median_ms"] > args.max_ms]
        if slow:
            print(f"over {args.max_ms:g} ms: {', '.join(r['page'] for r in slow)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
