"""Scenario 10: a steady load for a long time does not bloat the queue or slow its claim.

The soak runs on a throwaway PostgreSQL that this test starts itself (initdb in a
temporary directory, as the postgres OS user, on a free port) with autovacuum ON and
otherwise default settings, so the migration's per-table autovacuum parameters are what
keeps the tables in shape; the shared test server runs with autovacuum off, which no
production server should. An enqueuer process paces enqueue_many() calls, two
run_queue_worker processes (heartbeats on, short lease) run jobs that sleep 20-50 ms,
and the prune_queue_jobs command runs periodically. A probe times the production claim
statement on the generic plan the workers run it on (EXPLAIN ANALYZE EXECUTE in a
rolled-back transaction) every 100 ms.

Pass: claim p99 in the last window within 2x the first window's (at the reduced size the
p95, plus 1.5 ms of scheduling noise: see TAIL); total size (heap, indexes, TOAST) of
each queue table at the end within 2x its size after the first window; 0 jobs lost; the
enqueuer held its rate and the workers kept up.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

from django_pgqueue.sql import QUERIES
from tests.conftest import MANAGE
from tests.plans import execute_args, prepare
from tests.reliability.conftest import FULL, size
from tests.reliability.pgserver import running_server

TABLES = ("queue_jobs", "queue_job_state", "queue_attempts")
RATE = size(100, 300)  # jobs per second
DURATION = size(30, 600)  # seconds of steady load
WINDOW = size(10, 60)  # first and last window compared
PRUNE_EVERY = size(5, 30)  # seconds between prune_queue_jobs runs ...
PRUNE_OLDER_THAN = size(5, 30)  # ... deleting completed jobs older than this
NAPTIME = size(2, 10)  # autovacuum_naptime of the throwaway server
TICK = 0.1  # the enqueuer adds RATE * TICK jobs every TICK seconds
PROBE_EVERY = 0.05 if FULL else 0.02  # >= 500 samples per window: p99 is not one outlier
# The tail compared. A 10 s window at the reduced size holds ~500 samples, so its p99 is
# its 5th-slowest: 100 ms in which the probe's backend waits for a CPU (a prune command
# starting Django, an autovacuum) sets it; CI saw 1.25 -> 5.22 ms that way, with the
# medians at 0.13 -> 0.25 ms. Its p95 needs 500 ms of that. The full size (1,200 samples
# a window, on a run nothing else shares) compares the p99.
TAIL = 0.99 if FULL else 0.95
WORKER_ARGS = (
    "soak",
    "--lease",
    "6",
    "--heartbeat-interval",
    "2",
    "--sweep-interval",
    "1",
    "--concurrency",
    "16",
    "--batch-size",
    "10",
    "--poll-interval",
    "0.5",
    "-v",
    "0",
)


@contextlib.contextmanager
def throwaway_server() -> Iterator[str]:
    """A fresh PostgreSQL with autovacuum on; yields the URL of a migrated database.

    Durability as shipped (fsync and full-page writes on), unlike the fault scenarios'
    server: the soak measures what a production server would go through.
    """
    overrides = {
        "autovacuum": "on",
        "autovacuum_naptime": f"{NAPTIME}s",
        "fsync": "on",
        "full_page_writes": "on",
        "max_connections": "100",
        "shared_buffers": "128MB",
    }
    with running_server(**overrides) as server:
        yield server.url


ENQUEUER = f"""
import os, sys, time
from django_pgqueue import enqueue_many
rate, seconds, tick = float(os.environ["SOAK_RATE"]), float(os.environ["SOAK_SECONDS"]), {TICK}
batch = round(rate * tick)
print("ready", flush=True)
sys.stdin.readline()
start = time.monotonic()
sent = 0
for step in range(round(seconds / tick)):
    pause = start + step * tick - time.monotonic()
    if pause > 0:
        time.sleep(pause)
    enqueue_many(
        [("qa.nap", {{"seconds": 0.02 + (sent + k) % 4 * 0.01}}) for k in range(batch)],
        queue="soak",
    )
    sent += batch
print(sent, round(time.monotonic() - start, 2))
"""


class ClaimProbe(threading.Thread):
    """Times the production claim on its generic plan every PROBE_EVERY s; each sample is
    rolled back."""

    def __init__(self, url: str, started: float) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.started = started
        self.samples: list[tuple[float, float, int]] = []  # (t, ms, buffers)
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        # The plan the workers run: the prepared claim's generic plan (claim_plan_generic).
        params = {"queue": "soak", "limit": 10, "worker_id": "soak-probe", "lease": 6.0}
        try:
            with psycopg.connect(self.url, cursor_factory=psycopg.ClientCursor) as conn:
                names = prepare(conn.cursor(), "probe_claim", QUERIES["job_claim"])
                query = (
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
                    f"EXECUTE probe_claim({execute_args(names)})"
                )
                while not self.stop.wait(PROBE_EVERY):
                    conn.execute(QUERIES["claim_plan_generic"])
                    (plan,) = conn.execute(query, [params[n] for n in names]).fetchone()
                    conn.rollback()
                    top = plan[0]
                    buffers = top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"]
                    t = time.monotonic() - self.started
                    self.samples.append((t, float(top["Execution Time"]), int(buffers)))
        except BaseException as exc:  # surfaced by the test
            self.error = exc

    def window(self, start: float, end: float) -> list[tuple[float, float, int]]:
        return [s for s in self.samples if start <= s[0] < end]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sizes(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        table: conn.execute("SELECT pg_total_relation_size(%s::regclass)", [table]).fetchone()[0]
        for table in TABLES
    }


def prune(url: str) -> int:
    out = subprocess.run(
        [
            sys.executable,
            str(MANAGE),
            "prune_queue_jobs",
            "--older-than",
            f"{PRUNE_OLDER_THAN}s",
            "--status",
            "completed",
        ],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("Deleted "), out
    return int(out.split()[1])


def test_bloat_soak(worker_process, report):
    """10. Bloat soak"""
    with throwaway_server() as url, psycopg.connect(url, autocommit=True) as db:
        env = {"DATABASE_URL": url}
        workers = [worker_process(*WORKER_ARGS, env=env) for _ in range(2)]
        enqueuer = subprocess.Popen(
            [sys.executable, str(MANAGE), "shell", "-v", "0", "-c", ENQUEUER],
            env={**os.environ, **env, "SOAK_RATE": str(RATE), "SOAK_SECONDS": str(DURATION)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # The clock starts once everything is up: the first window measures the steady
        # load, not Django starting in three processes.
        assert enqueuer.stdout is not None
        assert enqueuer.stdin is not None
        for line in enqueuer.stdout:  # Django's shell may print a line of its own first
            if line.strip() == "ready":
                break
        else:
            raise AssertionError(f"the enqueuer did not start: {enqueuer.wait(10)}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            connected = db.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name LIKE 'pgqueue worker %%'"
            ).fetchone()[0]
            if connected == 2:
                break
            time.sleep(0.1)
        assert connected == 2, "the workers did not connect"
        time.sleep(1)
        started = time.monotonic()
        enqueuer.stdin.write("go\n")
        enqueuer.stdin.flush()
        probe = ClaimProbe(url, started)
        probe.start()
        pruned = prune_runs = 0
        backlog_max = 0
        next_prune = PRUNE_EVERY
        first_sizes: dict[str, int] = {}
        try:
            while (now := time.monotonic() - started) < DURATION:
                if not first_sizes and now >= WINDOW:
                    first_sizes = sizes(db)
                if now >= next_prune:
                    pruned += prune(url)
                    prune_runs += 1
                    next_prune += PRUNE_EVERY
                backlog = db.execute(
                    "SELECT count(*) FROM queue_job_state WHERE status = 'pending'"
                ).fetchone()[0]
                backlog_max = max(backlog_max, backlog)
                if enqueuer.poll() is not None:
                    # It stops by its own clock after DURATION; this loop's clock started
                    # a moment later, and a prune under load can take a second or more.
                    elapsed = time.monotonic() - started
                    assert enqueuer.returncode == 0, enqueuer.communicate()[0]
                    assert elapsed >= DURATION - 2, (elapsed, enqueuer.communicate()[0])
                    break
                for worker in workers:
                    assert worker.proc.poll() is None, worker.wait(5)[1]
                time.sleep(0.5)
            end_sizes = sizes(db)
            probe.stop.set()
            probe.join(10)
            output, _ = enqueuer.communicate(timeout=60)
            assert enqueuer.returncode == 0, output
            sent, enqueue_seconds = output.split()[-2:]
            sent = int(sent)
            # Everything enqueued drains: nothing pending, running or dead is left.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                left = db.execute(
                    "SELECT count(*) FROM queue_job_state WHERE status IN ('pending', 'running')"
                ).fetchone()[0]
                if not left:
                    break
                time.sleep(0.2)
            lost = db.execute(
                "SELECT count(*) FROM queue_job_state WHERE status <> 'completed'"
            ).fetchone()[0]
            # Every job written: those pruned and those still stored (a prune that ran late
            # on a loaded machine may have deleted every job, the newest included).
            total = pruned + db.execute("SELECT count(*) FROM queue_jobs").fetchone()[0]
            stats = {
                row[0]: row[1:]
                for row in db.execute(
                    "SELECT relname, n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup, "
                    "autovacuum_count, autoanalyze_count FROM pg_stat_user_tables "
                    "WHERE relname = ANY(%s)",
                    [list(TABLES)],
                )
            }
            for worker in workers:
                worker.signal(signal.SIGTERM)
            for worker in workers:
                code, out = worker.wait(60)
                assert code == 0, out
        finally:
            probe.stop.set()
            if enqueuer.poll() is None:
                enqueuer.kill()
                enqueuer.wait(10)
            for worker in workers:
                worker.kill()
    assert probe.error is None, probe.error
    first = probe.window(0, WINDOW)
    last = probe.window(DURATION - WINDOW, DURATION)
    assert len(first) >= WINDOW / PROBE_EVERY / 3
    assert len(last) >= WINDOW / PROBE_EVERY / 3
    p99_first = percentile([ms for _, ms, _ in first], 0.99)
    p99_last = percentile([ms for _, ms, _ in last], 0.99)
    tail_first = percentile([ms for _, ms, _ in first], TAIL)
    tail_last = percentile([ms for _, ms, _ in last], TAIL)
    buffers_first = percentile([b for _, _, b in first], 0.5)
    buffers_last = percentile([b for _, _, b in last], 0.5)
    autovacuums = stats["queue_job_state"][4]
    growth = {table: end_sizes[table] / first_sizes[table] for table in TABLES}
    report(
        size=f"{DURATION} s at {RATE} jobs/s ({sent:,} jobs)",
        lost=lost,
        jobs=total,
        enqueue_rate=round(sent / float(enqueue_seconds), 1),
        pending_backlog_max=backlog_max,
        claim_p99_first_window_ms=round(p99_first, 3),
        claim_p99_last_window_ms=round(p99_last, 3),
        claim_p95_first_window_ms=round(percentile([ms for _, ms, _ in first], 0.95), 3),
        claim_p95_last_window_ms=round(percentile([ms for _, ms, _ in last], 0.95), 3),
        claim_p50_first_window_ms=round(percentile([ms for _, ms, _ in first], 0.5), 3),
        claim_p50_last_window_ms=round(percentile([ms for _, ms, _ in last], 0.5), 3),
        claim_buffers_p50_first_last=f"{buffers_first} / {buffers_last}",
        claim_samples=len(probe.samples),
        sizes_after_first_window_kb={t: first_sizes[t] // 1024 for t in TABLES},
        sizes_at_end_kb={t: end_sizes[t] // 1024 for t in TABLES},
        size_growth={t: round(g, 2) for t, g in growth.items()},
        hot_update_ratio={
            t: round(stats[t][1] / stats[t][0], 3) if stats[t][0] else None for t in TABLES
        },
        updates_hot_of_all={t: f"{stats[t][1]:,} / {stats[t][0]:,}" for t in TABLES},
        dead_tuples={t: stats[t][3] for t in TABLES},
        live_tuples={t: stats[t][2] for t in TABLES},
        autovacuum_runs={t: stats[t][4] for t in TABLES},
        pruned=pruned,
        prune_runs=prune_runs,
        notes=(
            f"A throwaway PostgreSQL 15 with autovacuum on (naptime {NAPTIME} s, the "
            "migration's per-table parameters) and no VACUUM from the test; 2 workers "
            "(concurrency 16, lease 6 s, heartbeat 2 s), jobs sleep 20-50 ms, "
            f"prune_queue_jobs every {PRUNE_EVERY} s deletes completed jobs older than "
            f"{PRUNE_OLDER_THAN} s; the claim, on its generic plan, is timed by EXPLAIN "
            f"ANALYZE every {PROBE_EVERY * 1000:.0f} ms, first vs last {WINDOW} s. Few "
            "queue_job_state updates are HOT: claim and completion change status, which the "
            "partial indexes' predicates cover; only lease renewals (locked_until, in no "
            "index) can be, and jobs this short are rarely renewed."
            + (
                ""
                if FULL
                else " At this size queue_job_state holds about 1,000 rows; once ANALYZE has "
                "seen them the planner reads the table whole (about 30 pages) for the "
                "claim's update rather than probe its primary key 10 times, which it "
                "costs higher, so the buffers rise without any bloat."
            )
        ),
    )
    print(json.dumps(report.fields, default=str), file=sys.stderr)
    assert lost == 0
    assert total == sent
    assert sent >= 0.9 * RATE * DURATION
    # The workers kept up: the backlog never grew past a few seconds of load.
    assert backlog_max <= RATE * 5, backlog_max
    # At the reduced size the windows are 10 s on a shared 2-core machine, where the tail
    # of a sub-millisecond statement moves by a millisecond on scheduling alone (a CI
    # run saw a p99 of 0.24 ms in the first window, full-size first windows were
    # 0.86-1.70 ms): that much is allowed on top of 2x, on the p95 (TAIL). The full size
    # allows nothing, on the p99.
    noise_ms = 0.0 if FULL else 1.5
    assert tail_last <= 2 * tail_first + noise_ms, (TAIL, tail_first, tail_last)
    for table, ratio in growth.items():
        assert ratio <= 2, (table, first_sizes[table], end_sizes[table])
    # Autovacuum did the cleaning (the test runs no VACUUM of its own).
    assert autovacuums > 0
