"""Plans that fit every size: a worker's statements after the tables grew, the figures
after a big drain.

- statements: three worker connections run every statement a worker sends about jobs
  (claim, claim after a key, complete, complete + claim pipelined, renew, fail to retry,
  fail to dead, give back, release, sweep, locked-by, next-due, attempt outcome), each
  prepared as in production. Two of them start on a nearly empty database and run each
  statement 8 times (past PostgreSQL's 5 custom plans: the generic plan is then kept);
  the tables then grow to --jobs jobs (5% pending, the rest completed with an attempt
  each), with no ANALYZE. Then each statement is timed (median of --rounds rounds) on
  `refreshed` (made on the empty tables; the worker's plan refresh ran, as a running
  worker's does every second, and prepared its statements again: they ran 8 times more
  before the timing, as `fresh`'s), on `stale` (made on the empty tables, never refreshed: a
  worker before the refresh existed), and on `fresh` (connected after the growth).
  Target: refreshed within 1.5x of fresh for every statement.
- glance: a backlog of --jobs pending jobs, then drained (95% completed, VACUUM): the
  at-a-glance figures (`stats.collect`, the admin's panel and `queue_stats`) and the
  metrics view, median of 9, against their 50 ms budget: before the workers' index
  upkeep pass, after it, and with the whole backlog still pending.

Run: python benchmarks/plans.py [--smoke] [--jobs 1000000] [--rounds 30]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from _common import (
    load_jobs,
    machine,
    markdown_table,
    parser,
    relation_sizes,
    setup_django,
    sql,
    truncate,
    write_json,
)

QUEUE = "payments"
LIMITED = "limited"  # a queue with a limit: its claims go through the controlled claim
WARM = 8
BUDGET_MS = 50.0
TARGET = 1.5


def failure(*, permanent: bool = False, interrupted: bool = False) -> Any:
    from django_pgqueue.outcomes import Dead, Interrupted, Retry

    if interrupted:
        return Interrupted("bench.Error", "m")
    return Dead("bench.Error", "m") if permanent else Retry("bench.Error", "m", delay=3600.0)


def one_round(store: Any) -> dict[str, float]:
    """Each statement once, in a worker's order; seconds per statement."""
    from django_pgqueue.store.worker import ClaimedRow, ClaimRequest

    took: dict[str, float] = {}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        out = call()
        took[name] = time.perf_counter() - started
        return out

    rows = sorted(
        timed("job_claim", lambda: store.claim(QUEUE, 10, "bench", 30)), key=ClaimedRow.order
    )
    if len(rows) < 10:
        raise SystemExit(f"only {len(rows)} due jobs left in {QUEUE}: raise --jobs")
    rows += timed("job_claim_after", lambda: store.claim(QUEUE, 4, "bench", 30, rows[-1].order()))
    held = [(row.job_id, row.lease_version) for row in rows]
    timed("lease_renew", lambda: store.renew(held, 30))
    timed("job_locked_by", lambda: store.locked_by("bench"))
    timed("queue_next_due", lambda: store.next_due(QUEUE))
    done = [(row.job_id, row.lease_version, row.attempt_id, None) for row in rows]
    timed("job_complete", lambda: store.complete(done[:4]))
    _, more = timed(
        "job_complete + job_claim",
        lambda: store.complete_and_claim(done[4:6], QUEUE, 2, "bench", 30),
    )
    rows += more
    _, limited = timed(
        "job_claim_controlled",
        lambda: store.claims.claim(None, ClaimRequest(LIMITED, 2, "bench", 30, None)),
    )
    rows += limited
    fail = [(row.job_id, row.lease_version, row.attempt_id) for row in rows]
    timed("job_fail (retry)", lambda: store.fail(*fail[6], failure()))
    timed("job_fail (dead)", lambda: store.fail(*fail[7], failure(permanent=True)))
    timed("job_fail (give back)", lambda: store.fail(*fail[8], failure(interrupted=True)))
    timed("job_release", lambda: store.release(fail[9:]))
    timed("lease_sweep", lambda: store.sweep())
    timed("attempt_outcome", lambda: store.attempt_statuses([row.attempt_id for row in rows]))
    return took


def medians(store: Any, rounds: int) -> dict[str, float]:
    runs = [one_round(store) for _ in range(rounds)]
    return {name: statistics.median(run[name] for run in runs) * 1000 for name in runs[0]}


def grow(jobs: int) -> None:
    """`jobs` more jobs (ids after the ones there), 5% due, the rest completed with an
    attempt each; no ANALYZE, as on a server whose autovacuum has not come by yet."""
    first = int(sql("SELECT coalesce(max(id), 0) + 1 FROM queue_jobs")[0][0])
    load_jobs(jobs, max(jobs // 20, 4_000), queues=(QUEUE, LIMITED), first=first, analyze=False)
    sql(
        "INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, "
        "started_at, finished_at) SELECT job_id, 1, 1, 'grown', 'succeeded', now(), now() "
        "FROM queue_job_state WHERE status = 'completed' AND job_id >= %s",
        [first],
    )


def statements(jobs: int, rounds: int) -> dict[str, Any]:
    from django_pgqueue import enqueue_many
    from django_pgqueue.control.api import set_queue_limit
    from django_pgqueue.store.worker import Store

    truncate()
    enqueue_many([("bench.noop", None)] * (WARM * 2 * 20), queue=QUEUE)
    enqueue_many([("bench.noop", None)] * (WARM * 2 * 4), queue=LIMITED)
    set_queue_limit(LIMITED, 100_000)
    stale, refreshed = Store("default", "bench stale"), Store("default", "bench refreshed")
    for store in (stale, refreshed):
        store.refresh_plans(0.0)  # the size its plans are made at, as a worker's first look
        medians(store, WARM)
    grow(jobs)
    assert refreshed.refresh_plans(refreshed._plan_check_due), "the tables grew: plans discarded"
    fresh = Store("default", "bench fresh")
    # Both past their first five executions, planned for the call: the refresh prepares
    # the statements again, which then start over as a new connection's do.
    for store in (refreshed, fresh):
        medians(store, WARM)
    connections = (("fresh", fresh), ("refreshed", refreshed), ("stale", stale))
    out: dict[str, dict[str, list[float]]] = {}
    # Round by round, turn about, each round starting with the next connection, so that
    # the machine's drift over the run, other processes' load and what the connection
    # before left behind (rows to sweep, pages to read) fall on the three alike.
    for turn in range(rounds):
        for name, store in connections[turn % 3 :] + connections[: turn % 3]:
            for statement, seconds in one_round(store).items():
                out.setdefault(statement, {}).setdefault(name, []).append(seconds * 1000)
    for store in (stale, refreshed, fresh):
        store.close()
    rows = {
        statement: {name: statistics.median(values) for name, values in by.items()}
        for statement, by in out.items()
    }
    for figures in rows.values():
        figures["refreshed_ratio"] = figures["refreshed"] / figures["fresh"]
        figures["stale_ratio"] = figures["stale"] / figures["fresh"]
    return {"jobs": jobs, "rounds": rounds, "statements": rows}


def glance_ms() -> dict[str, float]:
    from django.test import RequestFactory, override_settings

    from django_pgqueue import stats
    from django_pgqueue.metrics import collector
    from django_pgqueue.metrics.views import metrics

    token = "bench-token-0123456789"
    request = RequestFactory().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")

    def timed(call: Callable[[], Any]) -> float:
        runs = []
        for _ in range(9):
            collector._readings.clear()
            started = time.perf_counter()
            call()
            runs.append((time.perf_counter() - started) * 1000)
        return statistics.median(runs)

    with override_settings(PGQUEUE={"METRICS_TOKEN": token, "METRICS_CACHE_SECONDS": 0}):
        return {
            "at_a_glance": timed(stats.collect),
            "metrics_view": timed(lambda: metrics(request)),
        }


def glance(jobs: int) -> dict[str, Any]:
    from django_pgqueue.index_upkeep import keep_indexes_small
    from django_pgqueue.store.session import Session

    truncate()
    load_jobs(jobs, jobs, queues=(QUEUE, "email"), analyze=True)
    pending = glance_ms()
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now(), attempts = 1, "
        "lease_version = 1 WHERE status = 'pending' AND job_id % 20 <> 0"
    )
    sql("VACUUM ANALYZE queue_job_state")
    sizes_before = relation_sizes()
    drained = glance_ms()
    session = Session("default", "bench upkeep", prepared=False)
    try:
        started = time.perf_counter()
        rebuilt = keep_indexes_small(session)
        upkeep_s = time.perf_counter() - started
    finally:
        session.close()
    after = glance_ms()
    return {
        "jobs": jobs,
        "budget_ms": BUDGET_MS,
        "pending_backlog": pending,
        "drained_before_upkeep": drained,
        "drained_after_upkeep": after,
        "upkeep_seconds": upkeep_s,
        "rebuilt": [
            {"index": r.name, "pages_before": r.pages_before, "pages_after": r.pages_after}
            for r in rebuilt
        ],
        "sizes_before_upkeep": sizes_before,
        "sizes_after_upkeep": relation_sizes(),
    }


def tables(result: dict[str, Any]) -> str:
    rows = [
        [
            name,
            f"{f['fresh']:.2f}",
            f"{f['refreshed']:.2f}",
            f"{f['refreshed_ratio']:.2f}x",
            f"{f['stale']:.2f}",
            f"{f['stale_ratio']:.1f}x",
        ]
        for name, f in result["statements"]["statements"].items()
    ]
    out = markdown_table(
        ["statement", "fresh ms", "refreshed ms", "refreshed / fresh", "stale ms", "stale / fresh"],
        rows,
    )
    g = result["glance"]
    glance_rows = [
        [
            label,
            f"{g[key]['at_a_glance']:.1f}",
            f"{g[key]['metrics_view']:.1f}",
        ]
        for label, key in (
            (f"{g['jobs']:,} pending", "pending_backlog"),
            ("drained to 5%, before upkeep", "drained_before_upkeep"),
            ("drained to 5%, after upkeep", "drained_after_upkeep"),
        )
    ]
    return (
        out + "\n\n" + markdown_table(["table", "at a glance ms", "metrics view ms"], glance_rows)
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_plans")
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args()
    setup_django(args.database_url)
    jobs = 20_000 if args.smoke else args.jobs
    rounds = 2 if args.smoke else args.rounds
    result = {
        "machine": machine(),
        "smoke": args.smoke,
        "statements": statements(jobs, rounds),
        "glance": glance(jobs),
    }
    worst = max(f["refreshed_ratio"] for f in result["statements"]["statements"].values())
    result["worst_refreshed_ratio"] = worst
    path = write_json(None, "plans", result)
    print(tables(result))
    print(f"worst refreshed / fresh: {worst:.2f}x (target <= {TARGET}x); wrote {path}")


if __name__ == "__main__":
    main()
