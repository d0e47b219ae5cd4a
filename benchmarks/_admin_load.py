"""The admin benchmark's load: jobs, states, attempts, the worker registry, the rollup.

Each table is written by one INSERT ... SELECT generate_series statement, shaped as the
product writes it: the worker rows as the heartbeat's upsert and mark-gone leave them,
the rollup rows as `stats_minute_add` adds the attempts workers finish.
"""

from __future__ import annotations

import time

# One row per job, with everything the three inserts need. Statuses are spread over
# the id range by a multiplicative hash, so the dead and pending jobs are scattered
# through the table as in a real queue, not packed at one end.
GENERATE = """
CREATE TEMP TABLE bench_jobs AS
SELECT g AS id,
       q.queue,
       CASE q.queue
           WHEN 'payments' THEN
               CASE WHEN g %% 5 = 0 THEN 'payments.refund' ELSE 'payments.charge' END
           WHEN 'email' THEN 'email.send'
           WHEN 'reports' THEN 'reports.daily'
           ELSE 'demo.resize_image'
       END AS type,
       CASE
           WHEN b < 915 THEN 'completed'
           WHEN b < 965 THEN 'pending'
           WHEN b < 985 THEN 'dead'
           WHEN b < 995 THEN 'cancelled'
           ELSE 'running'
       END AS status,
       now() - make_interval(secs => (%(jobs)s - g) * 0.6) AS created_at,
       CASE WHEN g %% 5 = 0 THEN 'order-' || g END AS idempotency_key,
       -- Running jobs belong to the 20 alive workers; those whose lease ran out
       -- (every tenth) to 5 workers that died a few minutes ago.
       CASE WHEN g %% 10 = 0 THEN 20 + g %% 5 ELSE g %% 20 END AS worker
FROM generate_series(1, %(jobs)s) AS g
CROSS JOIN LATERAL (SELECT (g::bigint * 7919) %% 1000 AS b) AS h
CROSS JOIN LATERAL (
    SELECT CASE WHEN g %% 10 < 4 THEN 'payments' WHEN g %% 10 < 7 THEN 'email'
                WHEN g %% 10 < 9 THEN 'default' ELSE 'reports' END AS queue
) AS q
"""

INSERT_JOBS = """
INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
SELECT id, queue, type,
       jsonb_build_object('order_id', id, 'amount_cents', id % 100000, 'currency', 'EUR',
                          'customer', 'cust-' || (id % 5000), 'lines', jsonb_build_array(
                              jsonb_build_object('sku', 'SKU-' || (id % 977), 'qty', 1 + id % 3))),
       idempotency_key, created_at
FROM bench_jobs
"""

INSERT_STATES = """
INSERT INTO queue_job_state (job_id, queue, status, priority, run_at, attempts, max_attempts,
                             lease_version, locked_by, locked_until, last_error,
                             idempotency_key, updated_at, finished_at)
SELECT id, queue, status,
       CASE WHEN id % 13 = 0 THEN 10 ELSE 0 END,
       CASE
           WHEN status = 'pending' AND id % 2 = 0 THEN now() + make_interval(secs => id % 3600)
           WHEN status = 'pending' THEN now() - make_interval(secs => id % 600)
           ELSE created_at + interval '1 second'
       END,
       a.attempts,
       CASE WHEN status = 'dead' THEN 3 ELSE 5 END,
       a.attempts,
       CASE WHEN status = 'running'
            THEN 'bench-' || lpad(worker::text, 2, '0') || ':' || (4100 + worker) || ':5e1f' END,
       CASE WHEN status = 'running' AND id % 10 = 0 THEN now() - interval '5 minutes'
            WHEN status = 'running' THEN now() + interval '30 seconds' END,
       CASE WHEN status = 'dead' THEN 'ValueError: upstream returned 502 for order ' || id
            WHEN status = 'pending' AND a.attempts > 0 THEN 'ConnectionError: timed out' END,
       idempotency_key,
       created_at + interval '2 seconds',
       CASE WHEN status IN ('completed', 'dead', 'cancelled')
            THEN created_at + interval '2 seconds' END
FROM bench_jobs
CROSS JOIN LATERAL (
    SELECT CASE status WHEN 'completed' THEN 1 WHEN 'dead' THEN 3 WHEN 'running' THEN 1
                       WHEN 'pending' THEN (id % 4 = 0)::int ELSE 0 END AS attempts
) AS a
"""

INSERT_ATTEMPTS = """
INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status,
                            started_at, finished_at, error_class, error_message, traceback)
SELECT s.job_id, n, n,
       coalesce(s.locked_by, 'bench-' || lpad((s.job_id % 20)::text, 2, '0') || ':'
                            || (4100 + s.job_id % 20) || ':5e1f'),
       CASE WHEN s.status = 'completed' THEN 'succeeded'
            WHEN s.status = 'running' THEN 'running' ELSE 'failed' END,
       s.updated_at - interval '1.5 seconds' + make_interval(secs => n),
       CASE WHEN s.status <> 'running'
            THEN s.updated_at - interval '1 second' + make_interval(secs => n) END,
       CASE WHEN s.status IN ('dead', 'pending') THEN 'ValueError' END,
       CASE WHEN s.status IN ('dead', 'pending')
            THEN 'upstream returned 502 for order ' || s.job_id END,
       CASE WHEN s.status IN ('dead', 'pending') THEN
            E'Traceback (most recent call last):\\n'
            || E'  File "/srv/app/django_pgqueue/executor.py", line 81, in run\\n'
            || E'    value = handler.func(ctx)\\n'
            || E'  File "/srv/app/payments/jobs.py", line 42, in charge\\n'
            || E'    receipt = gateway.charge(order.total, idempotency_key=ctx.idempotency_key)\\n'
            || E'  File "/srv/app/payments/gateway.py", line 118, in charge\\n'
            || E'    raise ValueError(f"upstream returned {status} for order {order_id}")\\n'
            || 'ValueError: upstream returned 502 for order ' || s.job_id END
FROM queue_job_state AS s
CROSS JOIN LATERAL generate_series(1, s.attempts) AS n
"""

# 20 alive workers, seen within the last seconds and holding the running jobs; 30 gone:
# 5 died a few minutes ago holding the jobs whose lease ran out (the sweep has not
# requeued them yet), 25 stopped during the last day and are kept until pruned.
INSERT_WORKERS = """
INSERT INTO queue_workers (id, host, pid, queues, concurrency, lease_seconds, version,
                           running, started_at, last_seen_at, gone_at)
SELECT 'bench-' || lpad(k::text, 2, '0') || ':' || (4100 + k) || ':5e1f',
       'bench-' || lpad(k::text, 2, '0'), 4100 + k,
       CASE k % 3 WHEN 0 THEN '["payments", "email"]'::jsonb
                  WHEN 1 THEN '["default", "reports"]'::jsonb
                  ELSE '["payments", "email", "default", "reports"]'::jsonb END,
       250, 30.0, '0.1.0', coalesce(held.n, 0),
       seen.at - make_interval(hours => 2 + k % 7), seen.at,
       CASE WHEN k >= 20 THEN seen.at + interval '60 seconds' END
FROM generate_series(0, 49) AS k
CROSS JOIN LATERAL (
    SELECT CASE WHEN k < 20 THEN now() - make_interval(secs => k % 5)
                WHEN k < 25 THEN now() - make_interval(mins => 5 + k % 5)
                ELSE now() - make_interval(mins => 40 * (k - 24)) END AS at
) AS seen
LEFT JOIN (
    SELECT locked_by, count(*) AS n FROM queue_job_state
    WHERE status = 'running' GROUP BY locked_by
) AS held ON held.locked_by = 'bench-' || lpad(k::text, 2, '0') || ':' || (4100 + k) || ':5e1f'
"""

# The last 24 hours of the rollup, one row per queue and minute. Throughput follows a
# daily wave; the wait histogram (the 14 buckets of rollup.WAIT_BOUNDS) decays
# geometrically with a scale that drifts over the day, bucket 0 taking the rounding
# remainder so the buckets sum to the attempts, as the upsert's counts do.
INSERT_STATS = """
INSERT INTO queue_stats_minutely (minute, queue, completed, retried, dead,
                                  wait_seconds_sum, wait_buckets)
SELECT m.minute, q.queue, n.total - n.retried - n.dead, n.retried, n.dead,
       (SELECT coalesce(sum(b.count * (ARRAY[0.025, 0.075, 0.175, 0.375, 0.75, 1.75, 3.75,
                                             7.5, 20, 45, 180, 600, 2250, 5400])[b.k]), 0)
        FROM unnest(h.buckets) WITH ORDINALITY AS b(count, k))::float8,
       h.buckets
FROM generate_series(date_trunc('minute', now()) - interval '1439 minutes',
                     date_trunc('minute', now()), interval '1 minute') AS m(minute)
CROSS JOIN (VALUES ('payments', 40), ('email', 30), ('default', 20), ('reports', 10))
    AS q(queue, rate)
CROSS JOIN LATERAL (SELECT (extract(epoch FROM m.minute) / 60)::bigint AS t) AS t
CROSS JOIN LATERAL (
    SELECT greatest(0, round(q.rate * (1 + 0.5 * sin(2 * pi() * t.t / 1440))
                             + (t.t * 7919 + q.rate) % 7 - 3))::integer AS total
) AS base
CROSS JOIN LATERAL (
    SELECT base.total, base.total / 40 AS retried,
           CASE WHEN t.t % 17 = 0 AND base.total > 1 THEN 1 ELSE 0 END AS dead,
           1.0 + 0.75 * (1 + sin(2 * pi() * t.t / 480)) AS scale
) AS n
CROSS JOIN LATERAL (
    SELECT ARRAY(
        SELECT floor(n.total * exp(-k / n.scale)
                     / (SELECT sum(exp(-j / n.scale)) FROM generate_series(0, 13) AS j))
        FROM generate_series(1, 13) AS k ORDER BY k
    )::integer[] AS tail
) AS w
CROSS JOIN LATERAL (
    SELECT (n.total - (SELECT coalesce(sum(x), 0) FROM unnest(w.tail) AS x))::integer
           || w.tail AS buckets
) AS h
"""

# The alive workers' heartbeats, run again just before the pages are timed: the load
# and VACUUM take longer at 1,000,000 jobs than the two leases that keep a worker alive.
HEARTBEAT = """
UPDATE queue_workers
SET last_seen_at = now() - make_interval(secs => (pid - 4100) % 5)
WHERE gone_at IS NULL
"""


def beat() -> None:
    """Mark the alive workers seen now, as their heartbeats do every few seconds."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(HEARTBEAT)


def load(jobs: int) -> dict[str, float]:
    """Load the tables; return the seconds each statement took."""
    from django.db import connection

    timings: dict[str, float] = {}
    with connection.cursor() as cursor:
        for label, statement in [
            ("generate", GENERATE),
            ("queue_jobs", INSERT_JOBS),
            ("queue_job_state", INSERT_STATES),
            ("queue_attempts", INSERT_ATTEMPTS),
            ("queue_workers", INSERT_WORKERS),
            ("queue_stats_minutely", INSERT_STATS),
        ]:
            started = time.perf_counter()
            # Only GENERATE takes a parameter (its %% signs are doubled); the others
            # run as plain SQL, where % is the modulo operator.
            cursor.execute(statement, {"jobs": jobs} if statement is GENERATE else None)
            timings[label] = time.perf_counter() - started
        cursor.execute("SELECT setval(pg_get_serial_sequence('queue_jobs', 'id'), %s)", [jobs])
        cursor.execute("DROP TABLE bench_jobs")
        started = time.perf_counter()
        # What autovacuum does on a live system (it is off on some servers).
        cursor.execute(
            "VACUUM (ANALYZE) queue_jobs, queue_job_state, queue_attempts, "
            "queue_workers, queue_stats_minutely"
        )
        timings["vacuum_analyze"] = time.perf_counter() - started
    return timings
