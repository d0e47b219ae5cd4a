"""Shared plumbing for the benchmark scripts: database, Django, tables, output."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432"
DEFAULT_URL = f"{DEFAULT_SERVER}/pgqueue_bench"
RESULTS = ROOT / "benchmarks" / "results"


def parser(description: str, database: str = "pgqueue_bench") -> argparse.ArgumentParser:
    """The options every script takes; `database` names the script's default database."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one run: for CI")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median is kept")
    p.add_argument(
        "--database-url",
        default=os.environ.get("PGQUEUE_BENCH_DATABASE_URL", f"{DEFAULT_SERVER}/{database}"),
        help="a database the benchmark may truncate (default: %(default)s)",
    )
    p.add_argument("--json-out", type=Path, help="where to write the JSON results")
    return p


def setup_django(database_url: str) -> None:
    """Point Django at the benchmark database, create and migrate it."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    sys.path[:0] = [str(ROOT / "testproject"), str(ROOT)]
    subprocess.run(
        [sys.executable, str(ROOT / "testproject" / "createdb.py")],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "--verbosity", "0"],
        check=True,
        env={**os.environ, "DATABASE_URL": database_url},
    )
    import django

    django.setup()


def truncate() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        tables = (
            "queue_jobs, queue_job_state, queue_attempts, qa_ledger, queue_job_deps, "
            "queue_workflow_steps, queue_workflows, queue_batch_jobs, queue_batches"
        )
        cursor.execute(f"TRUNCATE {tables} CASCADE")
        # TRUNCATE keeps the statistics of the rows it removed: the planner would go on
        # sizing the tables as a previous run left them, and a run's figures would
        # depend on the one before.
        cursor.execute(f"VACUUM ANALYZE {tables}")


def sql(query: str, params: Any = None) -> list[tuple[Any, ...]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def median_of(runs: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    values = [measure() for _ in range(runs)]
    return statistics.median(values), values


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def machine() -> dict[str, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        (version,) = cursor.fetchone()
        cursor.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name IN ('shared_buffers', "
            "'synchronous_commit', 'autovacuum', 'fsync', 'max_connections', 'work_mem')"
        )
        settings = dict(cursor.fetchall())
        # A CPU yardstick, to compare runs taken on different or busy machines.
        timings = []
        for _ in range(3):
            cursor.execute(
                "SELECT clock_timestamp() - statement_timestamp() "
                "FROM (SELECT count(*) FROM generate_series(1, 1000000)) AS s"
            )
            timings.append(cursor.fetchone()[0].total_seconds() * 1000)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": version,
        "pg_settings": settings,
        "calibration_ms": statistics.median(timings),
        "commit": commit or "unknown",
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path | None, name: str, data: dict[str, Any]) -> Path:
    """Write results to `path`, else results/NAME.json (results/smoke/ for smoke runs)."""
    path = path or (RESULTS / "smoke" if data.get("smoke") else RESULTS) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


QUEUES = ("payments", "email", "reports")
LOAD_CHUNK = 1_000_000


def load_jobs(
    total: int,
    pending: int,
    *,
    queues: Sequence[str] = QUEUES,
    first: int = 1,
    analyze: bool = True,
    spread: bool = True,
    using: str = "default",
) -> None:
    """Insert `total` jobs fast: the newest `pending` are due, the older ones completed.

    One INSERT ... SELECT generate_series per million rows into queue_jobs and
    queue_job_state, spread round-robin over `queues`, with priorities -2..2 and run_at
    up to 1,000 s in the past (the shape of tests/integration/test_claim_plan.py).
    Completed rows look claimed once (attempts = lease_version = 1, finished_at set);
    they get no attempt rows, which the claim never reads. The foreign-key triggers are
    skipped (session_replication_role = replica): the rows are consistent by
    construction, and checking them doubles the load time of 10M rows. `first` numbers
    the first row, so a later call can add older or newer rows. With `spread` False,
    every job has priority 0 and run_at grows with the id, like jobs enqueued one after
    another: the claim order is then the insertion order. `using` is the Django alias
    of the database to load.
    """
    from django.db import connections

    connection = connections[using]

    finished_below = first + total - pending
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            for start in range(first, first + total, LOAD_CHUNK):
                stop = min(first + total, start + LOAD_CHUNK) - 1
                cursor.execute(
                    """
                    WITH ids AS MATERIALIZED (
                        SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n,
                               (%(queues)s::text[])[1 + n %% cardinality(%(queues)s::text[])]
                                   AS queue,
                               n < %(finished_below)s AS done
                        FROM generate_series(%(start)s::bigint, %(stop)s::bigint) AS n
                    ), jobs AS (
                        INSERT INTO queue_jobs (id, queue, type, payload, created_at)
                        SELECT id, queue, 'qa.noop', jsonb_build_object('n', n), now()
                        FROM ids
                    )
                    INSERT INTO queue_job_state (
                        job_id, queue, status, priority, run_at, attempts, max_attempts,
                        lease_version, updated_at, finished_at
                    )
                    SELECT id, queue, CASE WHEN done THEN 'completed' ELSE 'pending' END,
                           CASE WHEN %(spread)s THEN (n %% 5) - 2 ELSE 0 END,
                           CASE WHEN %(spread)s THEN now() - make_interval(secs => n %% 1000)
                                ELSE now() - make_interval(secs => (%(last)s - n) / 1000.0)
                           END,
                           done::int, 5, done::int, now(), CASE WHEN done THEN now() END
                    FROM ids
                    """,
                    {
                        "queues": list(queues),
                        "finished_below": finished_below,
                        "start": start,
                        "stop": stop,
                        "spread": spread,
                        "last": first + total,
                    },
                )
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
        if analyze:
            cursor.execute("VACUUM ANALYZE queue_job_state")
            cursor.execute("VACUUM ANALYZE queue_jobs")


def relation_sizes(table: str = "queue_job_state") -> dict[str, int]:
    """Bytes of `table`: heap, indexes, total (with TOAST), and each index."""
    (heap, indexes, total) = sql(
        "SELECT pg_relation_size(%s::regclass), pg_indexes_size(%s::regclass), "
        "pg_total_relation_size(%s::regclass)",
        [table, table, table],
    )[0]
    each = sql(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
        "WHERE indrelid = %s::regclass ORDER BY 1",
        [table],
    )
    return {"heap": heap, "indexes": indexes, "total": total, **dict(each)}


def mb(n: float) -> str:
    return f"{n / 1_048_576:,.1f} MB"
