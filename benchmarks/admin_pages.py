"""Time the admin's pages and the metrics view on a large queue, each against its budget.

Creates its own database (default ``pgqueue_admin_bench``, on the server of
DATABASE_URL), migrates it, loads N jobs with a realistic mix of statuses in a few
INSERT ... SELECT generate_series statements (with 50 registered workers and a day of
the per-minute rollup, see _admin_load.py), vacuums and analyzes the tables as
autovacuum would, then renders each page and scrapes the metrics view with Django's
test client as a logged-in superuser: the median of several runs after a warm-up, and
the SQL queries per page.
Prints a Markdown table (met or missed against each page's budget), writes JSON with
--json-out, and drops the database unless --keep; with --check (or --max-ms) the exit
code is 1 when a required page misses its budget. --smoke loads 5,000 jobs and runs in
seconds (CI runs it).

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
from _admin_load import beat, load  # noqa: E402
from psycopg import sql  # noqa: E402

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue"
BUDGET_MS = 300.0  # issue 5: the jobs list, the dead jobs list, a job's page
# Issue 15: the Workers and Charts pages, and the metrics view (wired in testproject).
PAGE_BUDGET_MS = 150.0
METRICS_BUDGET_MS = 50.0
METRICS_URL = "/internal/metrics"


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


def sequential_scans(client: Any, urls: list[str]) -> list[str]:
    """EXPLAIN every read the pages at `urls` send (each statement of a text sent as
    several); name those that read queue_job_state or queue_jobs by a sequential scan
    (url: the scanned table)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.plans import statements

    found = []
    for url in urls:
        with CaptureQueriesContext(connection) as captured:
            client.get(url)
        for query in captured.captured_queries:
            for text in statements(query["sql"]):
                with connection.cursor() as cursor:
                    cursor.execute("EXPLAIN " + text)
                    plan = "\n".join(row[0] for row in cursor.fetchall())
                for table in ("queue_job_state", "queue_jobs "):
                    if f"Seq Scan on {table}" in plan + " ":
                        found.append(f"{url}: {table.strip()}")
    return found


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
        help=f"budget of the jobs and dead lists and a job's page (default {BUDGET_MS:g}); "
        "implies --check",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 when a required page misses its budget"
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
        budget = BUDGET_MS if args.max_ms is None else args.max_ms
        pages = [
            ("jobs list", "/admin/django_pgqueue/job/", "At a glance", budget),
            ("dead jobs list", "/admin/django_pgqueue/deadjob/", "upstream returned 502", budget),
            (
                "a dead job's page",
                f"/admin/django_pgqueue/job/{dead_id}/change/",
                "Traceback",
                budget,
            ),
            (
                "Workers page",
                "/admin/django_pgqueue/workerrecord/",
                "pgqueue-processes",
                PAGE_BUDGET_MS,
            ),
            # The default window holds the rollup's data: a day of it here, so 24 h.
            (
                "Charts page (default)",
                "/admin/django_pgqueue/minutestats/",
                'class="pgqueue-chart"',
                PAGE_BUDGET_MS,
            ),
            (
                "Charts page, 6 h",
                "/admin/django_pgqueue/minutestats/?hours=6",
                'class="pgqueue-chart"',
                PAGE_BUDGET_MS,
            ),
            (
                "Charts page, 24 h",
                "/admin/django_pgqueue/minutestats/?hours=24",
                'class="pgqueue-chart"',
                PAGE_BUDGET_MS,
            ),
            # Every known queue, with the filters' statement (names_known) behind it.
            (
                "Queues page",
                "/admin/django_pgqueue/queuecontrol/",
                "pgqueue-other-queues",
                PAGE_BUDGET_MS,
            ),
            ("metrics view", METRICS_URL, "pgqueue_database_up 1.0", METRICS_BUDGET_MS),
            # Not in the budget; measured to show where the limits are.
            (
                "jobs list, status=pending",
                "/admin/django_pgqueue/job/?state__status__exact=pending",
                "pending",
                None,
            ),
            (
                "jobs list, search by id",
                f"/admin/django_pgqueue/job/?q={dead_id}",
                str(dead_id),
                None,
            ),
            ("jobs list, page 20", "/admin/django_pgqueue/job/?p=20", "At a glance", None),
            # A type's beginning (read through the type index) and a payload's text
            # (read in the newest PAYLOAD_SEARCH_ROWS jobs only).
            (
                "jobs list, search a type prefix",
                "/admin/django_pgqueue/job/?q=payments.",
                "payments.",
                budget,
            ),
            (
                "jobs list, search a payload text",
                "/admin/django_pgqueue/job/?q=cust-4242",
                "cust-4242",
                budget,
            ),
        ]
        beat()
        results = []
        for label, page_url, expect, page_budget in pages:
            result = {
                "page": label,
                "required": page_budget is not None,
                "budget_ms": page_budget,
                **measure(client, page_url, args.runs, expect),
            }
            result["met"] = None if page_budget is None else result["median_ms"] <= page_budget
            results.append(result)
            print(f"  {label}: {result['median_ms']} ms, {result['queries']} queries", flush=True)
        # The plans behind the jobs list and its searches, the dead jobs list (each with
        # the at-a-glance panel) and the metrics view: none reads queue_job_state (or
        # queue_jobs) by a sequential scan.
        seq_scans = sequential_scans(
            client,
            [
                "/admin/django_pgqueue/job/",
                "/admin/django_pgqueue/job/?q=payments.",
                "/admin/django_pgqueue/job/?q=cust-4242",
                "/admin/django_pgqueue/deadjob/",
                METRICS_URL,
            ],
        )
        print(f"sequential scans of the queue tables: {seq_scans or 'none'}", flush=True)
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
    print("| page | median ms | min ms | max ms | SQL queries | budget ms | |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        mark = "" if r["required"] else " (extra)"
        verdict = {None: "", True: "met", False: "**missed**"}[r["met"]]
        cells = [r["median_ms"], r["min_ms"], r["max_ms"], r["queries"]]
        cells += [f"{r['budget_ms']:g}" if r["required"] else "", verdict]
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
    if seq_scans:
        print(f"sequential scans: {seq_scans}", file=sys.stderr)
        if args.check or args.max_ms is not None:
            return 1
    slow = [r for r in results if r["met"] is False]
    if slow:
        names = ", ".join(f"{r['page']} ({r['median_ms']} > {r['budget_ms']:g} ms)" for r in slow)
        print(f"over budget: {names}", file=sys.stderr)
        if args.check or args.max_ms is not None:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
