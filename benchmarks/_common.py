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
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/pgqueue_bench"
RESULTS = ROOT / "benchmarks" / "results"


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one run: for CI")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median is kept")
    p.add_argument(
        "--database-url",
        default=os.environ.get("PGQUEUE_BENCH_DATABASE_URL", DEFAULT_URL),
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
        cursor.execute("TRUNCATE queue_jobs, queue_job_state, queue_attempts, qa_ledger")
        cursor.execute("VACUUM ANALYZE queue_job_state")


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
            "SELECT name, setting FROM pg_settings WHERE name IN ('shared_buffers', "
            "'synchronous_commit', 'autovacuum', 'fsync', 'max_connections', 'work_mem')"
        )
        settings = dict(cursor.fetchall())
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "postgresql": version,
        "pg_settings": settings,
        "commit": commit or "unknown",
    }


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path | None, name: str, data: dict[str, Any]) -> Path:
    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path
