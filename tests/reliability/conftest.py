"""Shared pieces of the reliability scenarios (docs/reliability.md).

Sizes: every scenario runs in a reduced size in `make test` / `.ci/run`, and at full
size under `make reliability` (PGQUEUE_RELIABILITY=full), which also collects each
scenario's figures (PGQUEUE_RELIABILITY_RESULTS, JSON lines) for the report.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.conftest import sql

FULL = os.environ.get("PGQUEUE_RELIABILITY") == "full"
RESULTS = os.environ.get("PGQUEUE_RELIABILITY_RESULTS")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.reliability)


def size(small: int, full: int) -> int:
    """The reduced size in CI, the full one under `make reliability`."""
    return full if FULL else small


def wait_until(query: str, predicate: Any, timeout: float = 60.0, params: Any = None) -> Any:
    """Poll a one-value query until predicate(value) holds; the value, or AssertionError."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        value = sql(query, params)[0][0]
        if predicate(value):
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting on {query!r}; last value {value!r}")


def kill_not_due(remaining: int, deadline: float, next_kill: float) -> bool:
    """A drain-and-kill loop's turn: fail past `deadline` with `remaining` jobs left;
    True, after a short sleep, while the next kill is not due."""
    assert time.monotonic() < deadline, f"not drained in time: {remaining} left"
    if time.monotonic() < next_kill:
        time.sleep(0.05)
        return True
    return False


def wait_ready(worker_id: str) -> None:
    """Until the worker's listener is connected: it is up and will hear the next NOTIFY."""
    wait_until(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = %s",
        lambda n: n == 1,
        params=[f"pgqueue listener {worker_id}"],
    )


def ledger_counts(
    job_ids_query: str = "SELECT id FROM queue_jobs",
    *,
    run: Callable[[str], list[tuple[Any, ...]]] = sql,
) -> dict[str, int]:
    """What the independent ledger and the queue's tables say about a set of jobs.

    `run` runs the query: the test database's connection unless a scenario has its own
    server (test_database_faults).

    - jobs: how many jobs;
    - lost: jobs not completed (still pending, running, dead, cancelled);
    - completed_twice: jobs with more than one succeeded attempt, or whose handler ran to
      its end more than once *and* each run was recorded as succeeded;
    - executions: handler starts in the ledger; re_executions: starts beyond one per job;
    - finished_runs_twice: jobs whose handler ran to its end more than once (allowed
      only when the process died between the end and the write; counted, not hidden).
    """
    row = run(
        f"""
        WITH j AS ({job_ids_query}),
        s AS (SELECT st.job_id, st.status FROM queue_job_state st JOIN j ON j.id = st.job_id),
        a AS (SELECT at.job_id, count(*) FILTER (WHERE at.status = 'succeeded') AS ok
              FROM queue_attempts at JOIN j ON j.id = at.job_id GROUP BY at.job_id),
        l AS (SELECT le.job_id, count(*) AS runs, count(le.finished_at) AS finished
              FROM qa_ledger le JOIN j ON j.id = le.job_id GROUP BY le.job_id)
        SELECT
          (SELECT count(*) FROM j),
          (SELECT count(*) FROM s WHERE status <> 'completed'),
          (SELECT count(*) FROM a WHERE ok > 1),
          (SELECT coalesce(sum(runs), 0) FROM l),
          (SELECT coalesce(sum(runs - 1), 0) FROM l),
          (SELECT count(*) FROM l WHERE finished > 1),
          (SELECT count(*) FROM s WHERE status = 'completed'
             AND job_id NOT IN (SELECT job_id FROM a WHERE ok = 1))
        """
    )[0]
    keys = (
        "jobs",
        "lost",
        "completed_twice",
        "executions",
        "re_executions",
        "finished_runs_twice",
        "completed_without_success",
    )
    return dict(zip(keys, (int(value) for value in row), strict=True))


def stop_and_count(workers: Any, jobs: int) -> dict[str, int]:
    """SIGTERM every worker process, require exit 0, then require that each of the `jobs`
    jobs ended completed with exactly one succeeded attempt; the ledger counts."""
    for worker in workers:
        worker.signal(signal.SIGTERM)
    for worker in workers:
        code, output = worker.wait(60)
        assert code == 0, output
    counts = ledger_counts()
    assert counts["jobs"] == jobs
    assert counts["lost"] == 0
    assert counts["completed_twice"] == 0
    assert counts["completed_without_success"] == 0
    return counts


def outcome(counts: dict[str, int], *more: str) -> dict[str, int]:
    """The ledger figures of a report row: lost, completed twice, re-executions, `more`."""
    return {key: counts[key] for key in ("lost", "completed_twice", "re_executions", *more)}


def overlapping_runs(table: str) -> int:
    """Pairs of runs of one job in `table` (qa_ledger or queue_attempts) that overlap."""
    return sql(
        f"""
        SELECT count(*) FROM {table} a JOIN {table} b
          ON a.job_id = b.job_id AND a.id < b.id
         AND b.started_at < coalesce(a.finished_at, 'infinity')
         AND a.started_at < coalesce(b.finished_at, 'infinity')
        """
    )[0][0]


class Report:
    """One scenario's row in docs/reliability.md (written only under `make reliability`)."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.started = time.monotonic()
        self.fields: dict[str, Any] = {}

    def __call__(self, **fields: Any) -> None:
        self.fields.update(fields)

    def write(self, passed: bool) -> None:
        if not RESULTS:
            return
        row = {
            "scenario": self.scenario,
            "full": FULL,
            "passed": passed,
            "duration_s": round(time.monotonic() - self.started, 1),
            **self.fields,
        }
        with open(RESULTS, "a", encoding="utf-8") as out:
            out.write(json.dumps(row, default=str) + "\n")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.stash[_PASSED] = report.passed
    return report


_PASSED = pytest.StashKey[bool]()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Report]:
    """Record figures: report(size=..., lost=..., completed_twice=..., re_executions=...,
    recovery_s=..., notes=...). The scenario name is the test's docstring's first line
    unless report(scenario=...) sets it."""
    doc = (request.function.__doc__ or request.node.name).strip().splitlines()[0]
    rep = Report(doc)
    yield rep
    rep.scenario = rep.fields.pop("scenario", rep.scenario)
    rep.write(request.node.stash.get(_PASSED, False))
