"""What workflows cost: enqueue of one big workflow, chord drains, and waiting rows' weight.

- enqueue: ONE workflow of --steps steps (10,000), in three shapes: a group of 100
  chains of 100 (100 levels, one edge per step), a DAG of 100 levels of 100 where each
  step waits for two of the level before (the `Workflow` builder), and a chain of groups
  (Celery's semantics: each member of a group waits for every member of the one before:
  100 x 100 = 990,000 edges for 10,000 steps). Wall time of `enqueue()` (validation,
  the arrays, the statement), the time spent in the database's statements, and the
  statements sent, counted on the connection (a workflow of 1,000 steps and edges or
  more is sent in a transaction of its own, with JIT off: its BEGIN and COMMIT are not
  counted); the target is one round trip per level or better.
- drain: --jobs (20,000) jobs as chords of 49 members and a callback (400 chords)
  against the same number of plain jobs, drained by one `run_queue_worker` process with
  the same settings, alternating, timed on the database clock from the first claim to
  the last completion and checked there: every job completed once, each callback
  started after the last of its chord's members finished. Target: chords >= 80% of the
  plain drain's jobs/s.
- waiting: the production claim of 20 (EXPLAIN ANALYZE, rolled back, as claim_plan.py)
  from a queue of 100,000 pending jobs, and the drain of 20,000 plain jobs, without
  and then with --waiting (1,000,000) waiting workflow steps in the same queues (chains
  of 100 waiting steps behind one running job: state, step and edge rows). Target: the
  same within noise.
- --explain: the plans of the fenced completion of one chord member and of the chord's
  last member, with --waiting waiting steps in the tables (and with none, for the
  figures), taken by auto_explain (nested statements, ANALYZE, BUFFERS) so the
  statements inside pgqueue_settle show; written to results/workflows-explain.txt (the
  text pasted into docs/concepts/workflows.md).

Run: python benchmarks/workflows.py [--smoke] [--runs 3] [--parts enqueue,drain,waiting]
     python benchmarks/workflows.py --explain [--waiting 1000000]
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

from _common import (
    MANAGE,
    RESULTS,
    load_jobs,
    machine,
    markdown_table,
    median_of,
    parser,
    setup_django,
    sql,
    truncate,
    write_json,
)

QUEUE = "bench"
CHORD_SIZE = 49  # members per chord; with the callback, 50 jobs
CHAIN_LENGTH = 100  # waiting steps per chain of the waiting rows
WAITING_QUEUES = ("payments", "email", "reports", QUEUE)
# (processes, concurrency, batch size); None means the PGQUEUE defaults.
DRAIN_CONFIGS = [(1, None, None), (1, 50, 50)]
PARTS = ("enqueue", "drain", "waiting")


# -- enqueue of one big workflow ---------------------------------------------------------


def shapes(steps: int) -> dict[str, Any]:
    """The three workflows of `steps` steps (a square: sqrt(steps) levels of as many)."""
    from django_pgqueue.workflows import Workflow, chain, group, step

    side = max(2, round(steps**0.5))
    noop = step("qa.noop", queue=QUEUE)
    dag = Workflow("levels")
    for level in range(side):
        for i in range(side):
            after = [f"s{level - 1}-{i}", f"s{level - 1}-{(i + 1) % side}"] if level else []
            dag.add(f"s{level}-{i}", "qa.noop", queue=QUEUE, after=after)
    return {
        f"group of {side} chains of {side}": group(
            *[chain(*[noop] * side) for _ in range(side)]
        ).workflow(),
        f"{side} levels of {side}, each step waiting for 2": dag,
        f"chain of {side} groups of {side}": chain(
            *[group(*[noop] * side) for _ in range(side)]
        ).workflow(),
    }


def enqueue_once(flow: Any) -> dict[str, Any]:
    """Enqueue `flow` (autocommit) and the figures: wall s, statements, their s."""
    from django.db import connection

    truncate()
    statements: list[float] = []

    def timed(execute: Any, sql_text: str, params: Any, many: bool, context: Any) -> Any:
        started = time.perf_counter()
        try:
            return execute(sql_text, params, many, context)
        finally:
            statements.append(time.perf_counter() - started)

    with connection.execute_wrapper(timed):
        started = time.perf_counter()
        run = flow.enqueue()
        wall = time.perf_counter() - started
    (steps, edges, waiting) = sql(
        "SELECT (SELECT count(*) FROM queue_workflow_steps WHERE workflow_id = %s),"
        " (SELECT count(*) FROM queue_job_deps),"
        " (SELECT count(*) FROM queue_job_state WHERE status = 'waiting')",
        [run.id],
    )[0]
    if steps != len(flow) or len(run.jobs) != len(flow):
        raise SystemExit(f"enqueue check failed: {len(flow)} steps, {steps} written")
    return {
        "wall_s": wall,
        "statements": len(statements),
        "database_s": sum(statements),
        "steps": steps,
        "edges": edges,
        "waiting": waiting,
    }


def enqueue_part(steps: int, runs: int) -> list[dict[str, Any]]:
    out = []
    for name, flow in shapes(steps).items():
        samples = [enqueue_once(flow) for _ in range(runs)]
        wall = sorted(s["wall_s"] for s in samples)[len(samples) // 2]
        typical = min(samples, key=lambda s: abs(s["wall_s"] - wall))
        levels = depth(flow)
        out.append(
            {
                "shape": name,
                "levels": levels,
                **typical,
                "wall_s": wall,
                "runs_s": [s["wall_s"] for s in samples],
            }
        )
        print(
            f"enqueue {name}: {typical['steps']:,} steps, {typical['edges']:,} edges, "
            f"{levels} levels: {wall:.3f} s, {typical['statements']} statement(s) "
            f"({typical['database_s']:.3f} s in the database)",
            flush=True,
        )
    truncate()
    return out


def depth(flow: Any) -> int:
    """The number of levels of `flow`: the longest path of steps, counted in steps."""
    level: dict[str, int] = {}
    for name in flow.order():
        parents = flow._steps[name][1]
        level[name] = 1 + max((level[p] for p in parents), default=0)
    return max(level.values())


# -- drains -----------------------------------------------------------------------------


def worker_command(concurrency: int | None, batch: int | None) -> list[str]:
    args = [sys.executable, str(MANAGE), "run_queue_worker", QUEUE, "-v", "0"]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    if batch:
        args += ["--batch-size", str(batch)]
    return args


def enqueue_plain(n: int) -> None:
    from django_pgqueue import enqueue_many

    for start in range(0, n, 20_000):
        enqueue_many([("qa.noop", None)] * min(20_000, n - start), queue=QUEUE)


def a_chord(queue: str) -> Any:
    """A chord of CHORD_SIZE no-op members and a no-op callback, in `queue`."""
    from django_pgqueue.workflows import chord, group, step

    noop = step("qa.noop", queue=queue)
    return chord(group(*[noop] * CHORD_SIZE), noop)


def enqueue_chords(n: int) -> None:
    """`n` jobs as chords (one workflow each), in one transaction."""
    from django.db import transaction

    with transaction.atomic():
        for _ in range(n // (CHORD_SIZE + 1)):
            a_chord(QUEUE).enqueue()


def run_drain(n: int, concurrency: int | None, batch: int | None, *, chords: bool) -> float:
    """Drain `n` jobs of queue bench (plain or chords) with one worker; jobs/s.

    The drained jobs are those numbered after `mark`: the waiting rows loaded earlier in
    the same queue (waiting_part) are neither waited for nor counted.
    """
    clear_queue()
    # The last id handed out; on a fresh sequence (never called) none was, though
    # last_value already reads 1.
    (mark,) = sql(
        "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM queue_jobs_id_seq"
    )[0]
    (enqueue_chords if chords else enqueue_plain)(n)
    sql("VACUUM ANALYZE queue_job_state")
    worker = subprocess.Popen(worker_command(concurrency, batch), env=os.environ)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            (left,) = sql(
                "SELECT count(*) FROM queue_job_state"
                " WHERE job_id > %s AND queue = %s AND status <> 'completed'",
                [mark, QUEUE],
            )[0]
            if not left:
                break
            if worker.poll() is not None:
                raise SystemExit(f"worker exited with {worker.returncode}")
            time.sleep(0.2)
        else:
            raise SystemExit(f"drain: {left} jobs left after 600 s")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    return n / check_drained(n, mark, chords=chords)


def clear_queue() -> None:
    """Remove queue bench's drained jobs (neither waiting nor running: the loaded waiting
    rows and their running heads stay)."""
    sql(
        "WITH gone AS (DELETE FROM queue_job_state WHERE queue = %s"
        " AND status NOT IN ('waiting', 'running') RETURNING job_id),"
        " a AS (DELETE FROM queue_attempts WHERE job_id IN (SELECT job_id FROM gone)),"
        " s AS (DELETE FROM queue_workflow_steps WHERE job_id IN (SELECT job_id FROM gone)),"
        " d AS (DELETE FROM queue_job_deps WHERE job_id IN (SELECT job_id FROM gone))"
        " DELETE FROM queue_jobs WHERE id IN (SELECT job_id FROM gone)",
        [QUEUE],
    )
    sql(
        "DELETE FROM queue_workflows w WHERE name = 'chord' AND NOT EXISTS"
        " (SELECT FROM queue_workflow_steps s WHERE s.workflow_id = w.id)"
    )


def check_drained(n: int, mark: int, *, chords: bool) -> float:
    """Every job numbered after `mark` completed once; each callback ran after its chord."""
    attempts, distinct, succeeded, seconds = sql(
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE status = 'succeeded'),"
        " extract(epoch FROM max(finished_at) - min(started_at)) FROM queue_attempts"
        " WHERE job_id > %s",
        [mark],
    )[0]
    (completed,) = sql(
        "SELECT count(*) FROM queue_job_state WHERE job_id > %s AND status = 'completed'", [mark]
    )[0]
    if not (attempts == distinct == succeeded == completed == n):
        raise SystemExit(
            f"drain check failed: {n} jobs, {completed} completed, {attempts} attempts, "
            f"{distinct} distinct jobs attempted, {succeeded} succeeded"
        )
    if chords:
        (early, callbacks) = sql(
            """
            SELECT count(*) FILTER (WHERE cb.started_at < members.last), count(*)
            FROM queue_workflow_steps AS step
            JOIN queue_attempts AS cb ON cb.job_id = step.job_id
            CROSS JOIN LATERAL (
                SELECT max(a.finished_at) AS last FROM queue_job_deps d
                JOIN queue_attempts a ON a.job_id = d.depends_on WHERE d.job_id = step.job_id
            ) AS members
            WHERE step.job_id > %s
              AND EXISTS (SELECT FROM queue_job_deps d WHERE d.job_id = step.job_id)
            """,
            [mark],
        )[0]
        if early or callbacks != n // (CHORD_SIZE + 1):
            raise SystemExit(f"chord check failed: {callbacks} callbacks, {early} ran early")
    return float(seconds)


def drain_part(n: int, runs: int) -> list[dict[str, Any]]:
    out = []
    for processes, concurrency, batch in DRAIN_CONFIGS:
        plain: list[float] = []
        chords: list[float] = []
        for _ in range(runs):  # alternating, so drift in the machine's load hits both
            plain.append(run_drain(n, concurrency, batch, chords=False))
            chords.append(run_drain(n, concurrency, batch, chords=True))
        plain_rate = sorted(plain)[len(plain) // 2]
        chord_rate = sorted(chords)[len(chords) // 2]
        row = {
            "processes": processes,
            "concurrency": concurrency or "default",
            "batch_size": batch or "default",
            "jobs": n,
            "chords": n // (CHORD_SIZE + 1),
            "plain_jobs_per_s": plain_rate,
            "chord_jobs_per_s": chord_rate,
            "ratio": chord_rate / plain_rate,
            "plain_runs": plain,
            "chord_runs": chords,
        }
        out.append(row)
        print(
            f"drain {n:,} jobs, 1 process, concurrency {row['concurrency']}, batch "
            f"{row['batch_size']}: plain {plain_rate:,.0f} jobs/s, as {row['chords']} chords "
            f"{chord_rate:,.0f} jobs/s ({row['ratio']:.0%})",
            flush=True,
        )
    clear_queue()
    return out


# -- waiting rows ----------------------------------------------------------------------


def load_waiting(total: int) -> None:
    """Add `total` waiting workflow steps: chains of CHAIN_LENGTH waiting steps, each
    behind one running job (leased for a day, so no sweep takes it), over WAITING_QUEUES.

    One INSERT ... SELECT per table, the foreign-key triggers skipped (consistent by
    construction), like _common.load_jobs; then VACUUM ANALYZE.
    """
    from django.db import connection

    chains = max(1, total // CHAIN_LENGTH)
    rows = chains * (CHAIN_LENGTH + 1)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute("SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id'))")
            (first,) = cursor.fetchone()
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), %s)", [first + rows]
            )
            cursor.execute("SELECT nextval(pg_get_serial_sequence('queue_workflows', 'id'))")
            (flow,) = cursor.fetchone()
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('queue_workflows', 'id'), %s)",
                [flow + chains],
            )
            params = {
                "first": first,
                "rows": rows,
                "flow": flow,
                "per": CHAIN_LENGTH + 1,
                "queues": list(WAITING_QUEUES),
                "chains": chains,
            }
            # n = 0 .. rows - 1; chain n / per, position n % per (0: the running head).
            series = (
                "FROM (SELECT n, n / %(per)s AS chain, n %% %(per)s AS pos"
                " FROM generate_series(0, %(rows)s - 1) AS n) AS g"
            )
            queue = "(%(queues)s::text[])[1 + chain %% cardinality(%(queues)s::text[])]"
            cursor.execute(
                "INSERT INTO queue_workflows (id, name, steps, created_at) SELECT %(flow)s + c,"
                " 'waiting-chain', %(per)s, now() FROM generate_series(0, %(chains)s - 1) AS c",
                params,
            )
            cursor.execute(
                "INSERT INTO queue_jobs (id, queue, type, payload, created_at)"
                f" SELECT %(first)s + n, {queue}, 'qa.noop', 'null', now() {series}",
                params,
            )
            cursor.execute(
                "INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts,"
                " max_attempts, lease_version, locked_by, locked_until, updated_at,"
                " has_dependents)"
                f" SELECT %(first)s + n, {queue}, CASE WHEN pos = 0 THEN 'running'"
                " ELSE 'waiting' END, 0, now(), (pos = 0)::int, 5, (pos = 0)::int,"
                " CASE WHEN pos = 0 THEN 'bench-holder' END,"
                " CASE WHEN pos = 0 THEN now() + interval '1 day' END, now(),"
                f" CASE WHEN pos < %(per)s - 1 THEN true END {series}",
                params,
            )
            cursor.execute(
                "INSERT INTO queue_workflow_steps (job_id, workflow_id, name, on_failure,"
                " waiting_for, failed)"
                " SELECT %(first)s + n, %(flow)s + chain, 's' || pos, 'cancel',"
                f" (pos > 0)::int, 0 {series}",
                params,
            )
            cursor.execute(
                "INSERT INTO queue_job_deps (job_id, depends_on)"
                f" SELECT %(first)s + n, %(first)s + n - 1 {series} WHERE pos > 0",
                params,
            )
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
        for table in ("queue_job_state", "queue_jobs", "queue_workflow_steps", "queue_job_deps"):
            cursor.execute(f"VACUUM ANALYZE {table}")


def waiting_part(waiting: int, pending: int, jobs: int, runs: int) -> dict[str, Any]:
    from claim_plan import measure

    truncate()
    load_jobs(pending, pending)
    out: dict[str, Any] = {"waiting": waiting, "pending": pending, "jobs": jobs}
    for label in ("without", "with"):
        if label == "with":
            started = time.perf_counter()
            load_waiting(waiting)
            out["load_s"] = time.perf_counter() - started
        counts = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
        claim = measure("production", max(5, runs * 3))
        rate, values = median_of(runs, lambda: run_drain(jobs, None, None, chords=False))
        out[label] = {
            "counts": counts,
            "claim_ms": claim["execution_ms"],
            "claim_runs_ms": claim["runs_ms"],
            "claim_scan": claim["scan"],
            "claim_index": claim["index"],
            "claim_buffers": claim["shared_hit"] + claim["shared_read"],
            "drain_jobs_per_s": rate,
            "drain_runs": values,
        }
        print(
            f"{label} {counts.get('waiting', 0):,} waiting: claim {claim['execution_ms']:.3f} ms"
            f" ({claim['scan']} on {claim['index']}), drain {rate:,.0f} jobs/s",
            flush=True,
        )
    out["claim_ratio"] = out["with"]["claim_ms"] / out["without"]["claim_ms"]
    out["drain_ratio"] = out["with"]["drain_jobs_per_s"] / out["without"]["drain_jobs_per_s"]
    truncate()
    return out


# -- plans of the settle -----------------------------------------------------------------


class Rollback(Exception):
    """Raised to roll an explained completion back."""


def auto_explained(run: Any) -> list[str]:
    """Run `run()` with auto_explain logging every statement's plan (nested ones too,
    ANALYZE, BUFFERS) to this client as notices; the plans."""
    from django.db import connection

    notices: list[str] = []
    connection.ensure_connection()
    raw = connection.connection

    def keep(diag: Any) -> None:
        if "plan:" in (diag.message_primary or ""):
            notices.append(diag.message_primary)

    raw.add_notice_handler(keep)
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in (
            ("log_min_duration", "0"),
            ("log_analyze", "on"),
            ("log_buffers", "on"),
            ("log_timing", "on"),
            ("log_nested_statements", "on"),
            ("log_level", "notice"),
        ):
            cursor.execute(f"SET auto_explain.{name} = {value}")
    try:
        run()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SET auto_explain.log_min_duration = -1")
        raw.remove_notice_handler(keep)
    return notices


def chord_completions(waiting: int) -> dict[str, Any]:
    """With `waiting` waiting steps in the tables, a chord of CHORD_SIZE members: the
    plans of completing one member, then (the others completed) the last one; and, to
    compare, of completing one plain job."""
    from django.db import connection

    from django_pgqueue import enqueue
    from django_pgqueue.sql import QUERIES
    from django_pgqueue.store.worker import complete_params

    truncate()
    if waiting:
        load_waiting(waiting)
    enqueue("qa.noop", queue="explain_plain")
    enqueued = a_chord("explain").enqueue()

    def claim(queue: str, limit: int) -> list[tuple[Any, ...]]:
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["job_claim"],
                {"queue": queue, "limit": limit, "worker_id": "explain", "lease": 300.0},
            )
            rows = cursor.fetchall()
        if len(rows) != limit:
            raise SystemExit(f"explain: claimed {len(rows)} of {limit} jobs of {queue}")
        return rows

    plain = claim("explain_plain", 1)
    claimed = claim("explain", CHORD_SIZE)

    def complete(rows: list[tuple[Any, ...]]) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                QUERIES["job_complete"],
                complete_params([(row[0], row[7], row[8], None) for row in rows]),
            )
            if len(cursor.fetchall()) != len(rows):
                raise SystemExit("explain: a completion was refused")

    def measured(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        """EXPLAIN (ANALYZE, BUFFERS) of completing `rows`, rolled back, median of 5: the
        statement's own figures (auto_explain's formatting of the nested plans, done
        inside the statement, inflates the time it logs for the outer one)."""
        from django.db import transaction

        samples = []
        for _ in range(5):
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute(
                        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["job_complete"],
                        complete_params([(row[0], row[7], row[8], None) for row in rows]),
                    )
                    samples.append(cursor.fetchone()[0][0])
                    raise Rollback
            except Rollback:
                pass
        samples.sort(key=lambda e: e["Execution Time"])
        typical = samples[len(samples) // 2]
        plan = typical["Plan"]
        return {
            "ms": typical["Execution Time"],
            "buffers": plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0),
        }

    # As on a worker's connection that has run a while: the settle's statements past
    # their first (custom) plans, one member completing at a time.
    for row in claimed[:WARM_UP]:
        complete([row])
    figures = {"plain": measured(plain)}
    alone = auto_explained(lambda: complete(plain))
    figures["one_member"] = measured(claimed[WARM_UP : WARM_UP + 1])
    first = auto_explained(lambda: complete(claimed[WARM_UP : WARM_UP + 1]))
    complete(claimed[WARM_UP + 1 : -1])
    figures["last_member"] = measured(claimed[-1:])
    last = auto_explained(lambda: complete(claimed[-1:]))
    callback = max(enqueued.jobs.values())
    (status,) = sql("SELECT status FROM queue_job_state WHERE job_id = %s", [callback])[0]
    if status != "pending":
        raise SystemExit(f"explain: the callback is {status} after the last member completed")
    counts = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
    truncate()
    return {
        "waiting": waiting,
        "counts": counts,
        "plain": alone,
        "one_member": first,
        "last_member": last,
        "figures": figures,
    }


DURATION = re.compile(r"duration: ([\d.]+) ms")
BUFFERS = re.compile(r"Buffers: shared hit=(\d+)(?: read=(\d+))?")


def plan_figures(plan: str) -> tuple[str, float, int]:
    """(what the statement is, its ms, the buffers of its top node) of one plan notice."""
    text = plan.split("Query Text:", 1)[1].strip()
    first_line = next(
        line.strip()
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("--")
    )
    buffers = BUFFERS.search(plan)
    count = int(buffers.group(1)) + int(buffers.group(2) or 0) if buffers else 0
    return first_line[:60], float(DURATION.search(plan).group(1)), count


WARM_UP = 8  # completions before the explained ones (PostgreSQL plans 5 times, then caches)
EXPLAINED = (
    ("plain", "a plain job (nothing waits for it)"),
    ("one_member", "one member of a chord"),
    ("last_member", "the last member of a chord"),
)


def explain_part(waiting: int, *, smoke: bool) -> None:
    sizes = [0, waiting]
    runs = {size: chord_completions(size) for size in sizes}
    lines = []
    for size in sizes:
        r = runs[size]
        for key, label in EXPLAINED:
            lines.append(
                f"=== {size:,} waiting steps, completing {label} (chords of {CHORD_SIZE}); "
                f"table counts after: {r['counts']} ==="
            )
            lines += [plan.rstrip() + "\n" for plan in r[key]]
    rows = []
    for key, label in EXPLAINED:
        whole = [runs[size]["figures"][key] for size in sizes]
        rows.append(
            [label, "`job_complete`, the whole statement (rolled back, median of 5)"]
            + [f"{f['ms']:.3f} ms / {f['buffers']} buffers" for f in whole]
        )
        # The statements inside pgqueue_settle, as auto_explain logged them (the outer
        # statement, last, is left out: its logged time includes auto_explain's work).
        nested = [[plan_figures(p) for p in runs[size][key][:-1]] for size in sizes]
        for i, (what, _, _) in enumerate(nested[0]):
            cells = [f"{f[i][1]:.3f} ms / {f[i][2]} buffers" if i < len(f) else "-" for f in nested]
            rows.append([label, f"in pgqueue_settle: `{what}`", *cells])
    table = markdown_table(
        ["completing", "statement", *[f"{size:,} waiting" for size in sizes]], rows
    )
    path = (RESULTS / "smoke" if smoke else RESULTS) / "workflows-explain.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n" + table + "\n")
    print(table)
    print(f"plans: {path}")


# -- output ----------------------------------------------------------------------------


def tables(results: dict[str, Any]) -> list[str]:
    """The Markdown tables of a results file (for the output and report.py)."""
    out = []
    if results.get("enqueue"):
        out.append(
            markdown_table(
                [
                    "one workflow",
                    "steps",
                    "edges",
                    "levels",
                    "enqueue s (median)",
                    "in the database s",
                    "statements",
                ],
                [
                    [
                        e["shape"],
                        f"{e['steps']:,}",
                        f"{e['edges']:,}",
                        e["levels"],
                        f"{e['wall_s']:.3f}",
                        f"{e['database_s']:.3f}",
                        e["statements"],
                    ]
                    for e in results["enqueue"]
                ],
            )
        )
    if results.get("drain"):
        out.append(
            markdown_table(
                [
                    "drain, 1 process",
                    "plain jobs/s",
                    "as chords of 49 + callback, jobs/s",
                    "chords / plain",
                ],
                [
                    [
                        f"{d['jobs']:,} jobs, concurrency {d['concurrency']}, batch "
                        f"{d['batch_size']}",
                        f"{d['plain_jobs_per_s']:,.0f}",
                        f"{d['chord_jobs_per_s']:,.0f} ({d['chords']} chords)",
                        f"{d['ratio']:.0%}",
                    ]
                    for d in results["drain"]
                ],
            )
        )
    w = results.get("waiting")
    if w:
        out.append(
            markdown_table(
                [
                    "",
                    "without waiting rows",
                    f"with {w['waiting']:,} waiting steps",
                    "with / without",
                ],
                [
                    [
                        f"claim of 20, {w['pending']:,} pending (median ms)",
                        f"{w['without']['claim_ms']:.3f} ({w['without']['claim_buffers']} buffers)",
                        f"{w['with']['claim_ms']:.3f} ({w['with']['claim_buffers']} buffers)",
                        f"{w['claim_ratio']:.2f}x",
                    ],
                    [
                        f"drain of {w['jobs']:,} plain jobs, 1 process, defaults (jobs/s)",
                        f"{w['without']['drain_jobs_per_s']:,.0f}",
                        f"{w['with']['drain_jobs_per_s']:,.0f}",
                        f"{w['drain_ratio']:.0%}",
                    ],
                ],
            )
        )
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_workflows")
    p.add_argument("--steps", type=int, default=10_000, help="steps of the enqueued workflow")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    p.add_argument("--waiting", type=int, default=1_000_000, help="waiting steps loaded")
    p.add_argument("--parts", default=",".join(PARTS), help="which parts to run")
    p.add_argument("--explain", action="store_true", help="only the settle's plans")
    args = p.parse_args()
    setup_django(args.database_url)
    if args.explain:
        explain_part(2_000 if args.smoke else args.waiting, smoke=args.smoke)
        return
    runs = 1 if args.smoke else args.runs
    steps, jobs, waiting = (
        (400, 500, 5_000) if args.smoke else (args.steps, args.jobs, args.waiting)
    )
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {"machine": machine(), "smoke": args.smoke, "runs": runs}
    if "enqueue" in parts:
        results["enqueue"] = enqueue_part(steps, runs)
    if "drain" in parts:
        results["drain"] = drain_part(jobs, runs)
    if "waiting" in parts:
        results["waiting"] = waiting_part(waiting, 1_000 if args.smoke else 100_000, jobs, runs)
    for table in tables(results):
        print(table + "\n")
    print(f"results: {write_json(args.json_out, 'workflows', results)}")


if __name__ == "__main__":
    main()
