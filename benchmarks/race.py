"""The first race of the design article, run for real: 4 workers, 8 jobs, 3 claim strategies.

Each worker is a thread with its own PostgreSQL connection; they start together on a
barrier. The article's three strategies work on a table of this script's own
(`race_jobs`, created and dropped here; it is not the queue's):

- naive: SELECT the first pending job (no lock), run the handler, mark it done;
- for_update: in a claim transaction, SELECT ... ORDER BY id LIMIT 1 FOR UPDATE, spend
  --claim-ms in it (the round trips of a claim), mark the row running, COMMIT; then run
  the handler outside the transaction and mark the job done;
- skip_locked: the same with FOR UPDATE SKIP LOCKED.

Then our production claim (QUERIES["job_claim"], limit 1, through `Store`) on 8 real
queue jobs with the same 4 threads: one statement, so the row lock lives only while it
runs; its time includes its COMMIT (a WAL flush), which the others' SELECT times do
not. Every session runs one statement before the start, as a running worker's would.
The handler sleeps --handler-ms. Reported per strategy (median of --runs):
duplicate executions (executions minus distinct jobs), jobs never run, the time each
worker spent in its claim statement (waiting for a row lock, when it waits), wall time;
and the event trace (t, worker, event, job) of the last run.

Run: python benchmarks/race.py [--smoke] [--runs 3] [--trace]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from _common import RESULTS, machine, markdown_table, parser, setup_django, sql, write_json

WORKERS = "ABCD"
JOBS = 8
STRATEGIES = ("naive", "for_update", "skip_locked", "production")
LABELS = {
    "naive": "naive SELECT",
    "for_update": "SELECT ... FOR UPDATE",
    "skip_locked": "SELECT ... FOR UPDATE SKIP LOCKED",
    "production": "production job_claim (one statement, SKIP LOCKED)",
}
CLAIM_SQL = {
    "naive": "SELECT id FROM race_jobs WHERE status = 'pending' ORDER BY id LIMIT 1",
    "for_update": (
        "SELECT id FROM race_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE"
    ),
    "skip_locked": (
        "SELECT id FROM race_jobs WHERE status = 'pending' ORDER BY id "
        "FOR UPDATE SKIP LOCKED LIMIT 1"
    ),
}


@dataclass
class Run:
    """What one run of one strategy did."""

    strategy: str
    started: float = field(default_factory=time.perf_counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list[tuple[float, str, str, int | None]] = field(default_factory=list)
    executions: list[tuple[str, int]] = field(default_factory=list)
    waited: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WORKERS, 0.0))

    def event(self, worker: str, what: str, job: int | None = None) -> None:
        with self.lock:
            self.events.append(((time.perf_counter() - self.started) * 1000, worker, what, job))

    def claim_time(self, worker: str, seconds: float) -> None:
        with self.lock:
            self.waited[worker] += seconds


def connect() -> Any:
    import psycopg

    from django_pgqueue.store.worker import connection_params

    return psycopg.connect(**connection_params("default", "race bench"), autocommit=True)


def table_worker(
    run: Run, worker: str, barrier: threading.Barrier, claim_s: float, handler_s: float
) -> None:
    """One worker of the article's strategies, on race_jobs."""
    with connect() as conn:
        conn.execute("SELECT count(*) FROM race_jobs")  # a warm session, like a worker's
        barrier.wait()
        while True:
            run.event(worker, "claim: SELECT")
            sent = time.perf_counter()
            if run.strategy == "naive":
                row = conn.execute(CLAIM_SQL["naive"]).fetchone()
                run.claim_time(worker, time.perf_counter() - sent)
                if row is None:
                    run.event(worker, "no pending job: stop")
                    return
                run.event(worker, "read (no lock)", row[0])
            else:
                with conn.transaction():
                    row = conn.execute(CLAIM_SQL[run.strategy]).fetchone()
                    run.claim_time(worker, time.perf_counter() - sent)
                    if row is None:
                        run.event(worker, "no pending job: stop")
                        return
                    run.event(worker, "locked", row[0])
                    time.sleep(claim_s)
                    conn.execute(
                        "UPDATE race_jobs SET status = 'running', claimed_by = %s WHERE id = %s",
                        [worker, row[0]],
                    )
                run.event(worker, "commit: pending -> running, lock released", row[0])
            job = row[0]
            with run.lock:
                run.executions.append((worker, job))
            run.event(worker, "handler start", job)
            time.sleep(handler_s)
            conn.execute("UPDATE race_jobs SET status = 'done' WHERE id = %s", [job])
            run.event(worker, "handler done, marked done", job)


def production_worker(run: Run, worker: str, barrier: threading.Barrier, handler_s: float) -> None:
    """One worker claiming with the production statement, one job at a time."""
    from django_pgqueue.store.worker import Store

    store = Store("default", f"race bench {worker}")
    store.connect()
    try:
        # A warm session, like a running worker's: the first claim on a new connection
        # pays for loading the catalog caches and planning the statement cold.
        store.claim("race-warmup", 1, f"race-{worker}", 30.0)
        barrier.wait()
        while True:
            run.event(worker, "claim: job_claim")
            sent = time.perf_counter()
            rows = store.claim("race", 1, f"race-{worker}", 30.0)
            run.claim_time(worker, time.perf_counter() - sent)
            if not rows:
                run.event(worker, "no pending job: stop")
                return
            row = rows[0]
            run.event(worker, "claimed and committed: pending -> running", row.job_id)
            with run.lock:
                run.executions.append((worker, row.job_id))
            run.event(worker, "handler start", row.job_id)
            time.sleep(handler_s)
            store.complete([(row.job_id, row.lease_version, row.attempt_id, None)])
            run.event(worker, "handler done, completed", row.job_id)
    finally:
        store.close()


def prepare(strategy: str) -> list[int]:
    """A fresh set of 8 pending jobs for `strategy`; their ids."""
    if strategy == "production":
        from django_pgqueue import enqueue_many

        sql(
            "TRUNCATE queue_jobs, queue_job_state, queue_attempts, queue_job_deps, "
            "queue_workflow_steps, queue_workflows, queue_batch_jobs, queue_batches CASCADE"
        )
        return [job.id for job in enqueue_many([("qa.noop", None)] * JOBS, queue="race")]
    sql("DROP TABLE IF EXISTS race_jobs")
    sql(
        "CREATE TABLE race_jobs (id integer PRIMARY KEY, status text NOT NULL DEFAULT "
        "'pending', claimed_by text)"
    )
    sql("INSERT INTO race_jobs (id) SELECT generate_series(1, %s)", [JOBS])
    return list(range(1, JOBS + 1))


def run_once(strategy: str, claim_s: float, handler_s: float) -> dict[str, Any]:
    jobs = prepare(strategy)
    barrier = threading.Barrier(len(WORKERS) + 1)
    run = Run(strategy)
    threads = [
        threading.Thread(
            target=production_worker if strategy == "production" else table_worker,
            args=(run, worker, barrier, handler_s)
            if strategy == "production"
            else (run, worker, barrier, claim_s, handler_s),
        )
        for worker in WORKERS
    ]
    for thread in threads:
        thread.start()
    barrier.wait()
    run.started = time.perf_counter()
    for thread in threads:
        thread.join(60)
    wall = time.perf_counter() - run.started
    per_job = Counter(job for _, job in run.executions)
    if strategy == "production":
        attempts = dict(sql("SELECT job_id, count(*) FROM queue_attempts GROUP BY job_id"))
        assert attempts == dict(per_job), (attempts, per_job)
        done = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
    else:
        done = sql("SELECT count(*) FROM race_jobs WHERE status = 'done'")[0][0]
    return {
        "executions": len(run.executions),
        "duplicates": len(run.executions) - len(per_job),
        "never_run": len(set(jobs) - set(per_job)),
        "done": done,
        "executions_per_job": {str(job): per_job[job] for job in sorted(per_job)},
        "claim_ms": {w: s * 1000 for w, s in run.waited.items()},
        "claim_ms_total": sum(run.waited.values()) * 1000,
        "wall_ms": wall * 1000,
        "trace": sorted(run.events),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    med = statistics.median
    return {
        "duplicates": med(r["duplicates"] for r in runs),
        "duplicates_runs": [r["duplicates"] for r in runs],
        "executions": med(r["executions"] for r in runs),
        "never_run": max(r["never_run"] for r in runs),
        "claim_ms": {w: med(r["claim_ms"][w] for r in runs) for w in WORKERS},
        "claim_ms_total": med(r["claim_ms_total"] for r in runs),
        "claim_ms_total_runs": [r["claim_ms_total"] for r in runs],
        "wall_ms": med(r["wall_ms"] for r in runs),
        "wall_ms_runs": [r["wall_ms"] for r in runs],
        "trace": runs[-1]["trace"],
        "last_run": {k: v for k, v in runs[-1].items() if k != "trace"},
    }


def trace_markdown(strategy: str, trace: list[Any]) -> str:
    rows = [[f"{t:7.1f}", w, what, f"J{job}" if job else ""] for t, w, what, job in trace]
    return f"#### {LABELS[strategy]}\n\n" + markdown_table(
        ["t (ms)", "worker", "event", "job"], rows
    )


def table(results: dict[str, Any]) -> str:
    rows = []
    for strategy in STRATEGIES:
        s = results["strategies"][strategy]
        rows.append(
            [
                LABELS[strategy],
                f"{s['duplicates']:g}",
                f"{s['executions']:g}",
                s["never_run"],
                " / ".join(f"{s['claim_ms'][w]:.0f}" for w in WORKERS),
                f"{s['claim_ms_total']:.0f}",
                f"{s['wall_ms']:.0f}",
            ]
        )
    headers = [
        f"strategy ({len(WORKERS)} workers, {JOBS} jobs)",
        "duplicate executions",
        "executions",
        "jobs never run",
        "ms in claim statements, A / B / C / D",
        "ms in claims, all workers",
        "wall ms",
    ]
    return markdown_table(headers, rows)


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_race")
    p.add_argument(
        "--claim-ms", type=float, default=50.0, help="time a claim transaction stays open"
    )
    p.add_argument("--handler-ms", type=float, default=100.0, help="time a handler runs")
    p.add_argument("--trace", action="store_true", help="print the event traces")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    claim_s, handler_s = args.claim_ms / 1000, args.handler_ms / 1000
    if args.smoke:
        claim_s, handler_s = min(claim_s, 0.01), min(handler_s, 0.02)
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "workers": len(WORKERS),
        "jobs": JOBS,
        "claim_ms": claim_s * 1000,
        "handler_ms": handler_s * 1000,
        "strategies": {},
    }
    try:
        for strategy in STRATEGIES:
            outcomes = [run_once(strategy, claim_s, handler_s) for _ in range(runs)]
            results["strategies"][strategy] = summarize(outcomes)
            print(f"{LABELS[strategy]}: {outcomes[-1]['duplicates']} duplicates", flush=True)
    finally:
        sql("DROP TABLE IF EXISTS race_jobs")
        sql(
            "TRUNCATE queue_jobs, queue_job_state, queue_attempts, queue_job_deps, "
            "queue_workflow_steps, queue_workflows, queue_batch_jobs, queue_batches CASCADE"
        )

    traces = "\n\n".join(trace_markdown(s, results["strategies"][s]["trace"]) for s in STRATEGIES)
    trace_path = RESULTS / ("smoke" if args.smoke else "") / "race_trace.md"
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    trace_path.write_text(traces + "\n")
    print(
        f"claim transaction {claim_s * 1000:g} ms, handler {handler_s * 1000:g} ms, "
        f"median of {runs} run(s)"
    )
    print(table(results))
    if args.trace:
        print(traces)
    print(f"traces: {trace_path}")
    print(f"results: {write_json(args.json_out, 'race', results)}")


if __name__ == "__main__":
    main()
