"""How the cost grows with the table: claim time, drain rate, and bloat after a big drain.

- claim: the production claim of 20 (EXPLAIN ANALYZE in a rolled-back transaction,
  median of at least 5) with 10K pending jobs among 10K, 1M and 10M total (the rest
  completed; the pending ones are always the newest); built up stage by stage, VACUUM
  ANALYZE after each load.
- drain: 20K and then 1M pending no-op jobs (priority 0, run_at in id order, as if
  enqueued one after another) drained by 2 `run_queue_worker --burst`
  processes with the same settings, timed on the database clock (first claim to last
  completion) and checked exactly-once in the database (one succeeded attempt per job,
  nothing else).
- bloat: queue_job_state and its indexes with 1,000,000 pending jobs, before and after
  the 1M drain, with the HOT-update ratio and dead tuples of pg_stat_user_tables; then
  (the last run) pruned with the prune_queue_jobs command's function, before and after
  a manual VACUUM.
- autovacuum: the shared server runs with autovacuum = off, so nothing but the
  scripts' own VACUUMs reclaims dead rows there. With --autovacuum-server (on by
  default) the drain and bloat figures are measured again on a throwaway
  PostgreSQL with default settings (autovacuum on, the table's shipped autovacuum
  parameters in force), started from initdb in a temporary directory and removed after.

Run: python benchmarks/scale.py [--smoke] [--runs 3] [--parts claim,drain,autovacuum]
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import (
    MANAGE,
    RESULTS,
    load_jobs,
    machine,
    markdown_table,
    mb,
    parser,
    relation_sizes,
    setup_django,
    sql,
    truncate,
    write_json,
)

PG_BIN = Path("/usr/lib/postgresql/15/bin")
PENDING_FOR_CLAIM = 10_000
CLAIM_SIZES = [10_000, 1_000_000, 10_000_000]
DRAIN_SIZES = [20_000, 1_000_000]
PRUNE_BATCH = 10_000


# -- claim time as the table grows -----------------------------------------------------


def claim_growth(sizes: list[int], pending: int, runs: int) -> list[dict[str, Any]]:
    """Grow the table stage by stage; at each, the production claim's figures."""
    from claim_plan import measure

    truncate()
    completed = 0
    next_n = 1
    out = []
    for size in sizes:
        # Keep the pending jobs the newest: drop the previous stage's, add completed
        # rows, then `pending` new ones.
        sql(
            "WITH s AS (DELETE FROM queue_job_state WHERE status = 'pending' RETURNING job_id) "
            "DELETE FROM queue_jobs WHERE id IN (SELECT job_id FROM s)"
        )
        add = size - pending - completed
        started = time.perf_counter()
        load_jobs(add + pending, pending, first=next_n)
        load_s = time.perf_counter() - started
        next_n += add + pending
        completed += add
        counts = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
        assert counts == (
            {"pending": pending, "completed": completed} if completed else {"pending": pending}
        ), counts
        figures = measure("production", runs)
        out.append(
            {
                "total": size,
                "pending": pending,
                "load_s": load_s,
                "sizes": relation_sizes(),
                **figures,
            }
        )
        print(
            f"claim at {size:,} total / {pending:,} pending: {figures['execution_ms']:.3f} ms "
            f"({figures['scan']} on {figures['index']}, sort: {figures['sort']})",
            flush=True,
        )
    truncate()
    return out


# -- drain rate and bloat --------------------------------------------------------------


def table_stats() -> dict[str, Any]:
    row = sql(
        "SELECT n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup, vacuum_count, "
        "autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
        "WHERE relid = 'queue_job_state'::regclass"
    )[0]
    keys = ("updates", "hot_updates", "live_tuples", "dead_tuples", "vacuums", "autovacuums")
    stats = dict(zip((*keys, "autoanalyzes"), row, strict=True))
    stats["hot_ratio"] = stats["hot_updates"] / stats["updates"] if stats["updates"] else None
    return stats


def wait_for_stats(expect_updates: int, timeout: float = 10.0) -> dict[str, Any]:
    """pg_stat_user_tables once the workers' counters have arrived (they flush on exit)."""
    deadline = time.monotonic() + timeout
    while True:
        sql("SELECT pg_stat_clear_snapshot()")
        stats = table_stats()
        if stats["updates"] >= expect_updates or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def drain(n: int, processes: int, concurrency: int, *, bloat: bool) -> dict[str, Any]:
    """Load `n` pending jobs, drain them with worker processes; rate, checks, sizes."""
    truncate()
    load_jobs(n, n, queues=("bench",), spread=False)
    out: dict[str, Any] = {"jobs": n}
    if bloat:
        out["before"] = relation_sizes()
    sql("SELECT pg_stat_reset_single_table_counters('queue_job_state'::regclass)")
    command = [
        sys.executable,
        str(MANAGE),
        "run_queue_worker",
        "bench",
        "--burst",
        "-v",
        "0",
        "--concurrency",
        str(concurrency),
        "--batch-size",
        str(concurrency),
    ]
    started = time.perf_counter()
    workers = [subprocess.Popen(command, env=os.environ) for _ in range(processes)]
    try:
        for worker in workers:
            if worker.wait(3 * 3600) != 0:
                raise SystemExit(f"scale: a worker exited with {worker.returncode}")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
    out["wall_s"] = time.perf_counter() - started
    attempts, distinct, succeeded, seconds = sql(
        "SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE status = 'succeeded'),"
        " extract(epoch FROM max(finished_at) - min(started_at))::float8 FROM queue_attempts"
    )[0]
    completed = sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0]
    if not (attempts == distinct == succeeded == completed == n):
        raise SystemExit(
            f"scale: drain check failed: {n} jobs, {completed} completed, {attempts} attempts, "
            f"{distinct} distinct jobs attempted, {succeeded} succeeded"
        )
    out["seconds"] = seconds
    out["jobs_per_s"] = n / seconds
    out["rate_by_tenth"] = rate_by_tenth()
    if bloat:
        out["after"] = relation_sizes()
        out["stats"] = wait_for_stats(2 * n)
        out["growth"] = out["after"]["total"] / out["before"]["total"]
    return out


def rate_by_tenth() -> list[float]:
    """Jobs per second completed in each tenth of the drain's duration."""
    rows = sql(
        """
        WITH t AS (
            SELECT min(started_at) AS t0,
                   greatest(extract(epoch FROM max(finished_at) - min(started_at)), 1e-9) AS span
            FROM queue_attempts
        )
        SELECT least(9, floor(extract(epoch FROM a.finished_at - t.t0) * 10 / t.span))::int,
               count(*), max(t.span)
        FROM queue_attempts AS a, t
        GROUP BY 1 ORDER BY 1
        """
    )
    by_tenth = dict.fromkeys(range(10), 0.0)
    for tenth, count, span in rows:
        by_tenth[tenth] = count / (float(span) / 10)
    return [by_tenth[i] for i in range(10)]


def prune() -> dict[str, Any]:
    """Prune every finished job with the prune_queue_jobs machinery; sizes after."""
    import datetime as dt

    from django_pgqueue.maintenance import prune as prune_jobs

    before = relation_sizes()
    time.sleep(1.1)  # prune takes jobs that finished longer ago than a positive age
    started = time.perf_counter()
    deleted = prune_jobs(dt.timedelta(seconds=1), batch_size=PRUNE_BATCH).total
    out: dict[str, Any] = {
        "deleted": deleted,
        "seconds": time.perf_counter() - started,
        "before_prune": before,
    }
    out["after_prune"] = relation_sizes()
    sql("VACUUM queue_job_state")
    out["after_vacuum"] = relation_sizes()
    return out


def drains(
    sizes: list[int], processes: int, concurrency: int, runs: int, *, prune_last: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {"processes": processes, "concurrency": concurrency, "batch": concurrency}
    for size in sizes:
        big = size == sizes[-1]
        outcomes = []
        for _ in range(runs):
            outcomes.append(drain(size, processes, concurrency, bloat=big))
            print(f"drain {size:,}: {outcomes[-1]['jobs_per_s']:,.0f} jobs/s", flush=True)
        rates = [o["jobs_per_s"] for o in outcomes]
        entry: dict[str, Any] = {
            "jobs": size,
            "jobs_per_s": statistics.median(rates),
            "runs_jobs_per_s": rates,
            "rate_by_tenth": sorted(outcomes, key=lambda o: o["jobs_per_s"])[len(outcomes) // 2][
                "rate_by_tenth"
            ],
        }
        if big:
            median_run = sorted(outcomes, key=lambda o: o["growth"])[len(outcomes) // 2]
            entry.update(
                before=median_run["before"],
                after=median_run["after"],
                stats=median_run["stats"],
                growth=median_run["growth"],
                growth_runs=[o["growth"] for o in outcomes],
            )
            if prune_last:
                entry["prune"] = prune()
        out[str(size)] = entry
    out["ratio"] = out[str(sizes[-1])]["jobs_per_s"] / out[str(sizes[0])]["jobs_per_s"]
    truncate()
    return out


# -- a throwaway server with autovacuum on ---------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def throwaway_server(port: int) -> Iterator[str]:
    """initdb + pg_ctl start a default-settings PostgreSQL as the postgres OS user."""
    datadir = Path(tempfile.mkdtemp(prefix="pgqueue-bench-", suffix=".pgdata"))
    shutil.chown(datadir, "postgres", "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"]
    log = datadir / "server.log"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    try:
        subprocess.run(
            [
                *as_postgres,
                str(PG_BIN / "initdb"),
                "-D",
                str(datadir / "data"),
                "-U",
                "postgres",
                "--auth=trust",
            ],
            check=True,
            **quiet,
        )
        subprocess.run(
            [
                *as_postgres,
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(datadir / "data"),
                "-l",
                str(log),
                "-o",
                f"-p {port} -k {datadir} -c listen_addresses=127.0.0.1",
                "-w",
                "start",
            ],
            check=True,
            **quiet,
        )
        yield f"postgres://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(
            [
                *as_postgres,
                str(PG_BIN / "pg_ctl"),
                "-D",
                str(datadir / "data"),
                "-m",
                "fast",
                "-w",
                "stop",
            ],
            check=False,
            **quiet,
        )
        shutil.rmtree(datadir, ignore_errors=True)


def autovacuum_run(
    sizes: list[int], processes: int, concurrency: int, runs: int, smoke: bool
) -> dict[str, Any]:
    """The big drain and its bloat again, on a throwaway server with autovacuum on."""
    if not (PG_BIN / "initdb").exists() or shutil.which("runuser") is None:
        return {"skipped": f"no {PG_BIN / 'initdb'} or runuser on this machine"}
    out_path = RESULTS / ("smoke" if smoke else "") / "scale-autovacuum.json"
    with throwaway_server(free_port()) as server:
        command = [
            sys.executable,
            __file__,
            "--parts",
            "drain",
            "--drain-sizes",
            ",".join(map(str, sizes)),
            "--runs",
            str(runs),
            "--processes",
            str(processes),
            "--concurrency",
            str(concurrency),
            "--database-url",
            f"{server}/pgqueue_bench_scale",
            "--json-out",
            str(out_path),
        ]
        subprocess.run(command, check=True, env={**os.environ, "PGQUEUE_BENCH_CHILD": "1"})
    child = json.loads(out_path.read_text())
    return {"machine": child["machine"], **child["drain"]}


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_scale")
    p.set_defaults(runs=3)
    p.add_argument("--parts", default="claim,drain,autovacuum")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=50, help="handler threads and batch size")
    p.add_argument("--drain-sizes", type=lambda s: [int(x) for x in s.split(",")])
    args = p.parse_args()
    setup_django(args.database_url)
    parts = set(args.parts.split(","))
    runs = 1 if args.smoke else args.runs
    claim_sizes = [2_000, 20_000] if args.smoke else CLAIM_SIZES
    pending = 1_000 if args.smoke else PENDING_FOR_CLAIM
    drain_sizes = args.drain_sizes or ([2_000, 20_000] if args.smoke else DRAIN_SIZES)
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "prune": f"django_pgqueue.maintenance.prune (prune_queue_jobs), batches of {PRUNE_BATCH:,}",
    }
    if "claim" in parts:
        results["claim"] = claim_growth(claim_sizes, pending, max(5, runs))
    if "drain" in parts:
        results["drain"] = drains(
            drain_sizes,
            args.processes,
            args.concurrency,
            runs,
            prune_last=not os.environ.get("PGQUEUE_BENCH_CHILD"),
        )
    if "autovacuum" in parts:
        print("autovacuum: a throwaway server with default settings", flush=True)
        results["autovacuum"] = autovacuum_run(
            drain_sizes, args.processes, args.concurrency, runs, args.smoke
        )
    for text in tables(results):
        print(text)
    print(f"results: {write_json(args.json_out, 'scale', results)}")


def tables(results: dict[str, Any]) -> list[str]:
    """Markdown tables of a scale result."""
    out = []
    if results.get("claim"):
        rows = [
            [
                f"{c['total']:,} total / {c['pending']:,} pending",
                f"{c['execution_ms']:.3f}",
                f"{c['min_ms']:.3f}-{c['max_ms']:.3f}",
                f"{c['scan']} on {c['index']}",
                "yes" if c["sort"] else "no",
                f"{c['shared_hit']:,} / {c['shared_read']:,}",
                mb(c["sizes"]["total"]),
            ]
            for c in results["claim"]
        ]
        first = results["claim"][0]["execution_ms"]
        rows.append(
            [
                "largest / smallest",
                f"{results['claim'][-1]['execution_ms'] / first:.2f}x",
                "",
                "",
                "",
                "",
                "",
            ]
        )
        out.append(
            markdown_table(
                [
                    "table",
                    "production claim of 20, ms (median)",
                    "min-max ms",
                    "candidates scan",
                    "Sort",
                    "buffers hit / read",
                    "queue_job_state + indexes",
                ],
                rows,
            )
        )
    for key, label in (
        ("drain", "shared server, autovacuum off"),
        ("autovacuum", "throwaway server, autovacuum on"),
    ):
        d = results.get(key)
        if not d or "skipped" in d:
            continue
        rows = []
        sizes = [k for k in d if k.isdigit()]
        for size in sizes:
            e = d[size]
            rows.append(
                [
                    f"drain {int(size):,} pending ({d['processes']} processes, "
                    f"concurrency/batch {d['concurrency']})",
                    f"{e['jobs_per_s']:,.0f} jobs/s",
                    ", ".join(f"{r:,.0f}" for r in e["runs_jobs_per_s"]),
                ]
            )
        if len(sizes) > 1:
            rows.append(
                [f"drain at {int(sizes[-1]):,} / at {int(sizes[0]):,}", f"{d['ratio']:.0%}", ""]
            )
        rows.append(
            [
                f"jobs/s per tenth of the {int(sizes[-1]):,} drain (median run)",
                " / ".join(f"{r / 1000:.1f}K" for r in d[sizes[-1]]["rate_by_tenth"]),
                "",
            ]
        )
        big = d[sizes[-1]]
        if "before" in big:
            rows += [
                ["queue_job_state + indexes before the drain", mb(big["before"]["total"]), ""],
                [
                    "after the drain",
                    f"{mb(big['after']['total'])} ({big['growth']:.2f}x)",
                    ", ".join(f"{g:.2f}x" for g in big["growth_runs"]),
                ],
                [
                    "  heap / indexes before -> after",
                    f"{mb(big['before']['heap'])} / {mb(big['before']['indexes'])} -> "
                    f"{mb(big['after']['heap'])} / {mb(big['after']['indexes'])}",
                    "",
                ],
                [
                    "  updates, HOT ratio, dead tuples after",
                    f"{big['stats']['updates']:,}, {big['stats']['hot_ratio'] or 0:.0%}, "
                    f"{big['stats']['dead_tuples']:,}",
                    f"autovacuum runs: {big['stats']['autovacuums']}",
                ],
            ]
        if "prune" in big:
            pr = big["prune"]
            rows += [
                ["pruned run: after its drain", mb(pr.get("before_prune", {}).get("total", 0)), ""],
                [
                    f"after pruning {pr['deleted']:,} finished jobs",
                    mb(pr["after_prune"]["total"]),
                    f"{pr['seconds']:.0f} s",
                ],
                ["after pruning and VACUUM", mb(pr["after_vacuum"]["total"]), ""],
            ]
        out.append(f"{label}\n\n" + markdown_table(["figure", "median", "runs"], rows))
    return out


if __name__ == "__main__":
    main()
