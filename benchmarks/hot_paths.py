"""Where the time of one enqueue and of one idle pickup goes, in microseconds.

- enqueue: one `enqueue()` in autocommit (one transaction), cut into the Python before
  the statement (validation, encoding, settings: timed with the statement replaced by
  a stub), the statement on the server (`EXPLAIN (ANALYZE, BUFFERS)`: planning and
  execution, in a transaction rolled back) and the rest (the round trip and the
  commit's WAL flush); beside it the seed design's bare statements on the same tables
  (throughput.py's floor, psycopg, no framework), each call alternating with one of
  ours so both see the same load;
- pickup: an idle `Worker` in this process (a thread of its own, its listener and
  handler threads as in `run_queue_worker`), once it LISTENs, jobs enqueued one by
  one --gap apart, each job's steps stamped by its id:
  the monotonic clock at the enqueue call, its return (the commit, which sends the
  NOTIFY), the NOTIFY read (on the thread that waits on the listener's socket: the
  dispatcher when it is idle), the claim sent and its rows back, the jobs handed
  to the handler threads and taken by one, the handler's first line and its first
  statement done. Medians over the jobs of each step.

Run: python benchmarks/hot_paths.py [--smoke] [--enqueues 2000] [--pickups 200]
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from _common import (
    machine,
    markdown_table,
    parser,
    percentile,
    setup_django,
    sql,
    truncate,
    write_json,
)

QUEUE = "bench"


def median_us(values: list[float]) -> float:
    return round(statistics.median(values) * 1e6, 1)


def enqueue_profile(n: int) -> dict[str, Any]:
    """The parts of one enqueue() and the bare seed statements', in µs (medians)."""
    import psycopg
    from django.db import connection
    from psycopg.types.json import Jsonb
    from throughput import BARE_SEED_ENQUEUE

    from django_pgqueue import enqueue
    from django_pgqueue.sql import QUERIES
    from django_pgqueue.store import enqueue as store

    truncate()
    for i in range(50):  # the connection, the function's plans, psycopg's preparation
        enqueue("qa.noop", {"n": i}, queue=QUEUE)
    whole, bare = [], []
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        for i in range(50):
            conn.execute(BARE_SEED_ENQUEUE, ("bench_bare", "qa.noop", Jsonb({"n": i})))
        for i in range(n):
            order = (0, 1) if i % 2 else (1, 0)
            for which in order:
                started = time.perf_counter()
                if which:
                    enqueue("qa.noop", {"n": i}, queue=QUEUE)
                    whole.append(time.perf_counter() - started)
                else:
                    conn.execute(BARE_SEED_ENQUEUE, ("bench_bare", "qa.noop", Jsonb({"n": i})))
                    bare.append(time.perf_counter() - started)
        seed_server = server_time(conn, BARE_SEED_ENQUEUE, ("bench_bare", "qa.noop", '{"n": 1}'))

    # The Python before the statement: the same call with the statement stubbed out.
    kept = store.fetch_one
    store.fetch_one = lambda alias, query, params: (1, True, None)  # type: ignore[assignment]
    try:
        python = []
        for i in range(n):
            started = time.perf_counter()
            enqueue("qa.noop", {"n": i}, queue=QUEUE)
            python.append(time.perf_counter() - started)
    finally:
        store.fetch_one = kept  # type: ignore[assignment]

    params = {
        "queue": QUEUE,
        "type": "qa.noop",
        "payload": '{"n": 1}',
        "priority": 0,
        "run_at": None,
        "delay": 0.0,
        "max_attempts": 3,
        "idempotency_key": None,
        "traceparent": None,
        "concurrency_key": None,
        "fair_key": None,
    }
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as conn:
        ours_server = server_time(conn, QUERIES["job_enqueue"], params)
    rest = median_us(whole) - median_us(python) - ours_server["total_us"]
    return {
        "enqueue_us": median_us(whole),
        "python_us": median_us(python),
        "server": ours_server,
        "round_trip_and_commit_us": round(rest, 1),
        "bare_seed_us": median_us(bare),
        "bare_seed_server": seed_server,
        "ratio_to_bare_seed": round(median_us(whole) / median_us(bare), 3),
    }


def server_time(conn: Any, query: str, params: Any, runs: int = 60) -> dict[str, float]:
    """Planning and execution of `query` on the server, µs (medians), rolled back."""
    planning, execution = [], []
    with conn.transaction(force_rollback=True):
        for _ in range(runs):
            lines = [row[0] for row in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + query, params)]
            for line in lines:
                if line.startswith("Planning Time:"):
                    planning.append(float(line.split()[2]) / 1000)
                elif line.startswith("Execution Time:"):
                    execution.append(float(line.split()[2]) / 1000)
    plan, run = median_us(planning[10:]), median_us(execution[10:])
    return {"planning_us": plan, "execution_us": run, "total_us": round(plan + run, 1)}


class Timeline:
    """Monotonic stamps of each job's pickup steps, by job id (a slow pickup may still
    run when the next job is enqueued)."""

    STEPS = (
        "enqueue returned",
        "listener woke",
        "claim sent",
        "claim rows back",
        "handed to the handler threads",
        "a handler thread took it",
        "handler started",
        "handler's first statement done",
    )

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, float]] = {}
        self.wakes: list[float] = []  # the listener's, not yet tied to a job
        self.lock = threading.Lock()

    def stamp(self, job_id: int, step: str, at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        with self.lock:
            self.jobs.setdefault(job_id, {}).setdefault(step, at)

    def woke(self) -> None:
        with self.lock:
            self.wakes.append(time.monotonic())

    def tie_wakes(self) -> None:
        """Give each job the listener's first wake-up after its enqueue call started (a
        NOTIFY can arrive before the caller has the commit's reply)."""
        calls = sorted((job["call"], job_id) for job_id, job in self.jobs.items() if "call" in job)
        for at in self.wakes:
            before = [job_id for started, job_id in calls if started <= at]
            if before:
                self.jobs[before[-1]].setdefault("listener woke", at)


def instrument(timeline: Timeline) -> Callable[[], None]:
    """Stamp the listener's wake-ups and each claimed job's steps; return what undoes it."""
    from django_pgqueue.store.listening import ListeningStore
    from django_pgqueue.worker import pool
    from django_pgqueue.worker.intake import Intake

    notified, take = ListeningStore.notified, Intake.take
    submit, execute = pool.HandlerPool.submit, pool._execute

    # Every read of the NOTIFYs, on whichever thread waits on the socket.
    def stamped_notified(self: Any) -> list[str]:
        names = notified(self)
        if names:
            timeline.woke()
        return names

    def stamped_take(self: Any, queue: str, limit: int, after: Any, rows: Any, sent: float) -> Any:
        for row in rows:
            timeline.stamp(row.job_id, "claim rows back")
            timeline.stamp(row.job_id, "claim sent", sent)
        return take(self, queue, limit, after, rows, sent)

    def stamped_submit(self: Any, items: Any) -> None:
        for item in items:
            timeline.stamp(item.ctx.job_id, "handed to the handler threads")
        submit(self, items)

    def stamped_execute(item: Any, run: Any) -> Any:
        timeline.stamp(item.ctx.job_id, "a handler thread took it")
        return execute(item, run)

    ListeningStore.notified = stamped_notified  # type: ignore[method-assign]
    Intake.take = stamped_take  # type: ignore[method-assign]
    pool.HandlerPool.submit = stamped_submit  # type: ignore[method-assign]
    pool._execute = stamped_execute

    def undo() -> None:
        ListeningStore.notified = notified  # type: ignore[method-assign]
        Intake.take = take  # type: ignore[method-assign]
        pool.HandlerPool.submit = submit  # type: ignore[method-assign]
        pool._execute = execute

    return undo


def pickup_profile(count: int, gap: float) -> dict[str, Any]:
    """The steps of an idle worker's pickup, µs from the enqueue call (medians)."""
    from django.db import connection

    import django_pgqueue
    from django_pgqueue import enqueue
    from django_pgqueue.worker import Worker

    timeline = Timeline()

    @django_pgqueue.handler("bench.pickup_probe")
    def probe(ctx: Any) -> None:
        timeline.stamp(ctx.job_id, "handler started")
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        timeline.stamp(ctx.job_id, "handler's first statement done")

    truncate()
    undo = instrument(timeline)
    worker = Worker([QUEUE], install_signal_handlers=False)
    thread = threading.Thread(target=worker.run, name="worker")
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not worker._dispatcher.claims.listening:  # started, LISTENing
            if time.monotonic() > deadline:
                raise SystemExit("pickup: the worker did not LISTEN within 60 s")
            time.sleep(0.05)
        time.sleep(0.5)  # idle: its first look at the queue done
        for _ in range(count):
            started = time.monotonic()
            job = enqueue("bench.pickup_probe", None, queue=QUEUE)
            timeline.stamp(job.id, "enqueue returned")
            timeline.stamp(job.id, "call", started)
            time.sleep(gap)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
            if done == count:
                break
            time.sleep(0.05)
    finally:
        worker.stop_gracefully()
        thread.join(60)
        undo()
    timeline.tie_wakes()
    complete = [job for job in timeline.jobs.values() if all(s in job for s in Timeline.STEPS)]
    if len(complete) < count * 0.9:
        raise SystemExit(f"pickup: only {len(complete)} of {count} jobs fully stamped")
    steps: dict[str, Any] = {}
    previous = None
    for step in Timeline.STEPS:
        entry = {"from_call_us": median_us([job[step] - job["call"] for job in complete])}
        if previous is not None:
            entry["part_us"] = median_us([job[step] - job[previous] for job in complete])
        steps[step] = entry
        previous = step
    total = [job["handler started"] - job["call"] for job in complete]
    return {
        "jobs": len(complete),
        "steps": steps,
        "to_handler_p50_us": median_us(total),
        "to_handler_p99_us": round(percentile(total, 99) * 1e6, 1),
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_hot_paths")
    p.add_argument("--enqueues", type=int, default=2_000, help="enqueue calls of each kind")
    p.add_argument("--pickups", type=int, default=200, help="jobs the idle worker picks up")
    p.add_argument("--gap", type=float, default=0.05, help="seconds between two pickups")
    args = p.parse_args()
    setup_django(args.database_url)
    enqueues, pickups = (100, 10) if args.smoke else (args.enqueues, args.pickups)
    results: dict[str, Any] = {"machine": machine(), "smoke": args.smoke}
    results["enqueue"] = e = enqueue_profile(enqueues)
    results["pickup"] = pk = pickup_profile(pickups, args.gap)
    rows = [
        ["one enqueue() in autocommit, whole", f"{e['enqueue_us']:,.0f}"],
        ["  Python before the statement (validation, encoding, settings)", f"{e['python_us']:.1f}"],
        [
            "  the statement on the server (planning + execution)",
            f"{e['server']['planning_us']:.0f} + {e['server']['execution_us']:.0f}",
        ],
        ["  the rest: round trip and commit", f"{e['round_trip_and_commit_us']:,.0f}"],
        ["the seed's bare statements through psycopg, whole", f"{e['bare_seed_us']:,.0f}"],
        [
            "  on the server (planning + execution)",
            f"{e['bare_seed_server']['planning_us']:.0f} + "
            f"{e['bare_seed_server']['execution_us']:.0f}",
        ],
        ["enqueue() / the seed's bare statements", f"{e['ratio_to_bare_seed']:.2f}x"],
    ]
    for step, entry in pk["steps"].items():
        part = entry.get("part_us")
        rows.append(
            [
                f"pickup: {step} (from the call; the step's own part)",
                f"{entry['from_call_us']:,.0f}" + ("" if part is None else f" ({part:,.0f})"),
            ]
        )
    rows.append(
        [
            "pickup to the handler's start, p50 / p99",
            f"{pk['to_handler_p50_us']:,.0f} / {pk['to_handler_p99_us']:,.0f}",
        ]
    )
    print(markdown_table(["part", "µs (median)"], rows))
    print(f"results: {write_json(args.json_out, 'hot_paths', results)}")


if __name__ == "__main__":
    main()
