-- The worker registry and the per-minute rollup (django_pgqueue.observability).
-- Observation only: nothing here decides who owns a job (leases do).


-- name: worker_upsert
-- Record that a worker is alive (its beat runs this every cycle) with its report, and take the requests made to it.
-- One statement on the services' own connection; last_seen_at is the database's
-- clock. A worker marked gone that reports again (a partition healed) is alive again.
-- The requests operators made to this worker and no beat took yet (through
-- queue_worker_requests_open_idx) are marked taken and returned, oldest first.
WITH beat AS (
    INSERT INTO queue_workers AS w (
        id, host, pid, queues, concurrency, lease_seconds, version, running,
        started_at, last_seen_at, gone_at, supervisor, report
    )
    VALUES (
        %(id)s::text, %(host)s::text, %(pid)s::integer, %(queues)s::jsonb,
        %(concurrency)s::integer, %(lease)s::float8, %(version)s::text, %(running)s::integer,
        now(), now(), NULL, %(supervisor)s::text, %(report)s::jsonb
    )
    ON CONFLICT (id) DO UPDATE
    SET last_seen_at = now(), running = excluded.running, gone_at = NULL,
        concurrency = excluded.concurrency, report = excluded.report
    RETURNING w.id
), taken AS (
    UPDATE queue_worker_requests AS r
    SET taken_at = now()
    WHERE r.worker_id = %(id)s::text AND r.taken_at IS NULL
    RETURNING r.id, r.action, r.concurrency, r.requested_by
)
SELECT id, action, concurrency, requested_by FROM taken ORDER BY id;


-- name: worker_request_answer
-- Record what a worker did with a request it took (its log line, for the operator).
UPDATE queue_worker_requests
SET answer = %(answer)s::text
WHERE id = %(id)s::bigint;


-- name: worker_request_add
-- Ask live workers for an action: those named (by their id, or their supervisor's), or
-- those serving a queue. Only a worker alive now gets a request (pgqueue_worker_alive);
-- the rows made are returned, one per worker asked. The worker rows are share-locked:
-- a worker marking itself gone as it stops (worker_stopped) waits for this insert to
-- commit, so its last take (worker_requests_take) sees the request, or this statement
-- sees it gone and asks it nothing.
INSERT INTO queue_worker_requests (worker_id, action, concurrency, requested_by)
SELECT w.id, %(action)s::text, %(concurrency)s::integer, %(requested_by)s::text
FROM queue_workers AS w
WHERE (w.id = ANY (%(workers)s::text[])
       OR w.supervisor = ANY (%(workers)s::text[])
       OR w.queues ? %(queue)s::text)
  AND pgqueue_worker_alive(w.gone_at, w.last_seen_at, w.lease_seconds, w.report)
ORDER BY w.id
FOR SHARE OF w
RETURNING id, worker_id;


-- name: worker_requests_take
-- The requests made to a worker that no beat took yet, marked taken, oldest first: its
-- last take as it stops, once worker_stopped marked it gone (no request comes after).
WITH taken AS (
    UPDATE queue_worker_requests AS r
    SET taken_at = now()
    WHERE r.worker_id = %(id)s::text AND r.taken_at IS NULL
    RETURNING r.id, r.action, r.concurrency, r.requested_by
)
SELECT id, action, concurrency, requested_by FROM taken ORDER BY id;


-- name: worker_requests_read
-- Read the given requests, oldest first (whether their workers took them, and their answers).
SELECT r.id, r.worker_id, r.action, r.concurrency, r.requested_by, r.requested_at,
       r.taken_at, r.answer
FROM queue_worker_requests AS r
WHERE r.id = ANY (%(ids)s::bigint[])
ORDER BY r.id;


-- name: worker_requests_recent
-- The latest requests made to workers, newest first (the log the admin and the command show).
SELECT r.id, r.worker_id, r.action, r.concurrency, r.requested_by, r.requested_at,
       r.taken_at, r.answer
FROM queue_worker_requests AS r
ORDER BY r.id DESC
LIMIT %(limit)s::integer;


-- name: worker_stopped
-- Mark a worker gone as it stops (its own shutdown); its row stays until worker_prune.
UPDATE queue_workers
SET gone_at = now(), last_seen_at = now(), running = 0
WHERE id = %(id)s::text;


-- name: worker_mark_gone
-- Mark gone the workers not seen for three of their beats (two leases, if shorter).
-- Any worker's heartbeat may run it; the table holds one row per worker process, so
-- reading it whole is cheap. Returns the ids marked.
UPDATE queue_workers
SET gone_at = now()
WHERE gone_at IS NULL
  AND NOT pgqueue_worker_alive(gone_at, last_seen_at, lease_seconds, report)
RETURNING id;


-- name: worker_prune
-- Delete workers gone for longer than keep_seconds (and requests as old), and rollup minutes older than keep_minutes.
WITH workers AS (
    DELETE FROM queue_workers
    WHERE gone_at < now() - make_interval(secs => %(keep_seconds)s::float8)
    RETURNING id
), requests AS (
    DELETE FROM queue_worker_requests
    WHERE requested_at < now() - make_interval(secs => %(keep_seconds)s::float8)
), minutes AS (
    DELETE FROM queue_stats_minutely
    WHERE minute < now() - make_interval(mins => %(keep_minutes)s::integer)
    RETURNING id
)
SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM minutes);


-- name: worker_list
-- List the registered workers, live ones first, with whether each is alive now.
-- Alive (pgqueue_worker_alive) means not marked gone and seen within
-- three of its beats, or two of its leases if shorter (a worker that died without a
-- word counts as gone before any heartbeat has marked it).
SELECT id, host, pid, queues, concurrency, lease_seconds, version, running,
       started_at, last_seen_at, gone_at,
       pgqueue_worker_alive(gone_at, last_seen_at, lease_seconds, report) AS alive,
       extract(epoch FROM now() - last_seen_at)::float8 AS seen_seconds_ago,
       supervisor, report
FROM queue_workers
ORDER BY alive DESC, last_seen_at DESC, id
LIMIT %(limit)s::integer;


-- name: worker_running_jobs
-- The jobs the given workers hold, at most per_worker of each (oldest job first).
-- Reads queue_job_state_running_idx (only running rows: bounded by the workers'
-- concurrency, whatever the table size) and picks each worker's first rows before
-- anything else: the job's type (a primary-key probe) and the attempt's start (a
-- unique-index probe) are read for the rows shown only.
WITH held AS (
    SELECT state.locked_by, state.job_id, state.queue, state.attempts, state.max_attempts,
           state.lease_version, state.locked_until,
           row_number() OVER (PARTITION BY state.locked_by ORDER BY state.job_id) AS n
    FROM queue_job_state AS state
    WHERE state.status = 'running'
      AND state.locked_by = ANY (%(worker_ids)s::text[])
)
SELECT held.locked_by, held.job_id, held.queue, job.type, held.attempts,
       held.max_attempts, held.lease_version, attempt.started_at,
       extract(epoch FROM held.locked_until - now())::float8 AS lease_left_seconds
FROM held
CROSS JOIN LATERAL (
    SELECT j.type FROM queue_jobs AS j WHERE j.id = held.job_id LIMIT 1
) AS job
LEFT JOIN LATERAL (
    SELECT a.started_at FROM queue_attempts AS a
    WHERE a.job_id = held.job_id AND a.lease_version = held.lease_version
    LIMIT 1
) AS attempt ON true
WHERE held.n <= %(per_worker)s::integer
ORDER BY held.locked_by, held.job_id;


-- name: worker_counts
-- Count the registered workers alive and gone, for the metrics.
SELECT count(*) FILTER (WHERE alive) AS alive, count(*) FILTER (WHERE NOT alive) AS gone
FROM (
    SELECT pgqueue_worker_alive(gone_at, last_seen_at, lease_seconds, report) AS alive
    FROM queue_workers
) AS w;


-- name: stats_minute_add
-- Add the attempts a worker finished to their minute's rollup rows, one upsert for a batch.
-- The arrays are parallel, one element per attempt whose outcome was written: its id,
-- queue, run_at as claimed, and outcome (succeeded, retried or dead). The wait is the
-- attempt's start (the database's clock at the claim) minus the run_at it was claimed
-- at, its run time its finish minus its start, each counted into the buckets of
-- `bounds` (width_bucket: 0 below the first bound).
-- Each attempt is read by primary key. Two workers adding to one minute serialize on
-- its row for the length of this statement only.
WITH finished AS (
    SELECT date_trunc('minute', a.finished_at) AS minute, i.queue, i.outcome,
           greatest(extract(epoch FROM a.started_at - i.run_at)::float8, 0) AS wait,
           greatest(extract(epoch FROM a.finished_at - a.started_at)::float8, 0) AS ran
    FROM unnest(
        %(attempt_ids)s::bigint[], %(queues)s::text[], %(run_ats)s::timestamptz[],
        %(outcomes)s::text[]
    ) AS i(attempt_id, queue, run_at, outcome)
    JOIN queue_attempts AS a ON a.id = i.attempt_id
    WHERE a.finished_at IS NOT NULL
), per_bucket AS (
    SELECT minute, queue, 'wait' AS kind, width_bucket(wait, %(bounds)s::float8[]) AS bucket,
           count(*)::integer AS attempts
    FROM finished
    GROUP BY 1, 2, 3, 4
    UNION ALL
    SELECT minute, queue, 'run', width_bucket(ran, %(bounds)s::float8[]), count(*)::integer
    FROM finished
    GROUP BY 1, 2, 3, 4
), totals AS (
    SELECT minute, queue,
           count(*) FILTER (WHERE outcome = 'succeeded')::integer AS completed,
           count(*) FILTER (WHERE outcome = 'retried')::integer AS retried,
           count(*) FILTER (WHERE outcome = 'dead')::integer AS dead,
           sum(wait)::float8 AS wait_sum,
           sum(ran)::float8 AS run_sum
    FROM finished
    GROUP BY minute, queue
), per_minute AS (
    SELECT t.minute, t.queue, t.completed, t.retried, t.dead, t.wait_sum, t.run_sum,
           array_agg(coalesce(w.attempts, 0) ORDER BY b.bucket) AS wait_buckets,
           array_agg(coalesce(r.attempts, 0) ORDER BY b.bucket) AS run_buckets
    FROM totals AS t
    CROSS JOIN generate_series(0, cardinality(%(bounds)s::float8[])) AS b(bucket)
    LEFT JOIN per_bucket AS w
        ON w.minute = t.minute AND w.queue = t.queue AND w.kind = 'wait' AND w.bucket = b.bucket
    LEFT JOIN per_bucket AS r
        ON r.minute = t.minute AND r.queue = t.queue AND r.kind = 'run' AND r.bucket = b.bucket
    GROUP BY t.minute, t.queue, t.completed, t.retried, t.dead, t.wait_sum, t.run_sum
)
INSERT INTO queue_stats_minutely AS r (
    minute, queue, completed, retried, dead, wait_seconds_sum, wait_buckets,
    run_seconds_sum, run_buckets
)
SELECT minute, queue, completed, retried, dead, wait_sum, wait_buckets, run_sum, run_buckets
FROM per_minute
ORDER BY minute, queue
ON CONFLICT (minute, queue) DO UPDATE
SET completed = r.completed + excluded.completed,
    retried = r.retried + excluded.retried,
    dead = r.dead + excluded.dead,
    wait_seconds_sum = r.wait_seconds_sum + excluded.wait_seconds_sum,
    -- A row a backlog sample made has zeros (or no run buckets): the sums start there.
    wait_buckets = ARRAY(
        SELECT coalesce(old, 0) + coalesce(new, 0)
        FROM unnest(r.wait_buckets, excluded.wait_buckets) WITH ORDINALITY AS u(old, new, n)
        ORDER BY n
    ),
    run_seconds_sum = r.run_seconds_sum + excluded.run_seconds_sum,
    run_buckets = ARRAY(
        SELECT coalesce(old, 0) + coalesce(new, 0)
        FROM unnest(coalesce(r.run_buckets, '{}'), excluded.run_buckets)
             WITH ORDINALITY AS u(old, new, n)
        ORDER BY n
    );


-- name: stats_minute_backlog
-- Sample the backlog of each of `queues` (pending jobs due now) into the current minute's
-- rollup row, the latest sample of the minute kept. Each count walks the claim index
-- (index-only) and stops at %(cap)s jobs, as the at-a-glance figures do. An idle queue
-- (nothing due, nothing finished this minute) gets no row: the rollup does not grow by
-- a row per queue and minute for queues with nothing to show.
INSERT INTO queue_stats_minutely AS r (minute, queue, wait_buckets, backlog)
SELECT date_trunc('minute', now()), q.queue,
       array_fill(0, ARRAY[cardinality(%(bounds)s::float8[]) + 1]), c.due
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*)::integer AS due
    FROM (SELECT 1 FROM queue_job_state
          WHERE status = 'pending' AND queue = q.queue AND run_at <= now()
          LIMIT %(cap)s::int8) s
) c
WHERE c.due > 0
   OR EXISTS (SELECT 1 FROM queue_stats_minutely AS m
              WHERE m.minute = date_trunc('minute', now()) AND m.queue = q.queue)
ORDER BY q.queue
ON CONFLICT (minute, queue) DO UPDATE SET backlog = excluded.backlog;


-- name: stats_minute_range
-- Read the rollup rows of the last `minutes` minutes, oldest first, with the current minute.
-- A range walk of queue_stats_minutely_key (minute, queue), in its order: no sort,
-- never a read of queue_attempts.
SELECT date_trunc('minute', now()) AS now_minute, r.minute, r.queue, r.completed, r.retried,
       r.dead, r.wait_seconds_sum, r.wait_buckets, r.run_buckets, r.backlog
FROM queue_stats_minutely AS r
WHERE r.minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s::integer)
ORDER BY r.minute, r.queue;


-- name: attempt_feed
-- Read the attempts a live feed has not shown yet, and those it shows as running, with their jobs.
-- Two primary-key reads of queue_attempts: the range after the last id the page read
-- (at most `limit` rows, in id order) and the ids it still shows running; each row's
-- job (queue, type) and state (was a failed attempt the job's last?) by primary key.
-- Bounded by `limit` and the open ids, whatever the table's size.
WITH picked AS (
    (SELECT a.id FROM queue_attempts AS a
     WHERE a.id > %(after)s::bigint
     ORDER BY a.id
     LIMIT %(limit)s::integer)
    UNION
    (SELECT a.id FROM queue_attempts AS a WHERE a.id = ANY (%(open)s::bigint[]))
)
SELECT a.id, a.job_id, job.queue, job.type, a.attempt_index, a.status, a.worker_id,
       a.started_at, a.finished_at, a.error_class,
       (state.status = 'dead' AND state.lease_version = a.lease_version) AS job_dead
FROM picked
JOIN queue_attempts AS a ON a.id = picked.id
CROSS JOIN LATERAL (
    SELECT j.queue, j.type FROM queue_jobs AS j WHERE j.id = a.job_id LIMIT 1
) AS job
LEFT JOIN queue_job_state AS state ON state.job_id = a.job_id
ORDER BY a.id;


-- name: attempt_feed_start
-- The attempt id a live feed starts after: `back` attempts before the newest (a backward primary-key read).
SELECT coalesce(min(id) - 1, 0)
FROM (SELECT a.id FROM queue_attempts AS a ORDER BY a.id DESC LIMIT %(back)s::integer) AS latest;
