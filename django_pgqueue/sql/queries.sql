-- Every statement django_pgqueue runs against the queue tables.
--
-- Each block opens with "-- name: <name>" and a line saying what it does;
-- django_pgqueue.sql loads them into QUERIES. Parameters are %(name)s and carry
-- explicit casts, so the statements work with client- and server-side binding alike.
--
-- Rules every block keeps (docs/concepts/ explains them: leases.md, fencing.md,
-- claim-index.md):
-- * Time is the database's now(), never a worker's clock.
-- * A worker's write about a job it claimed is fenced:
--   job_id = .. AND lease_version = .. AND status = 'running'. Zero rows back means the
--   lease was lost and the write did nothing.
-- * lease_version only grows: claim, lease sweep and operator retry each add one.
-- * One queue per claim, by equality: "queue = ANY(...)" turns the ordered walk of the
--   claim index into a bitmap scan plus a sort of every pending row.


-- name: job_enqueue
-- Insert one job and its state row, wake the queue's workers if it is due, and return
-- (id, created, created_at); created_at is now(), the value the job row got.
-- The common case: no idempotency key (job_enqueue_keyed handles keys). NOTIFY is
-- delivered by PostgreSQL only when the caller's transaction commits.
WITH job AS (
    INSERT INTO queue_jobs (queue, type, payload, idempotency_key, created_at)
    VALUES (%(queue)s::text, %(type)s::text, %(payload)s::jsonb, NULL, now())
    RETURNING id
)
INSERT INTO queue_job_state AS state (
    job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version, updated_at
)
SELECT job.id, %(queue)s::text, 'pending', %(priority)s::smallint,
       coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
       0, %(max_attempts)s::integer, 0, now()
FROM job
RETURNING state.job_id, true AS created, now() AS created_at,
          (SELECT pg_notify('pgqueue', state.queue) WHERE state.run_at <= now()) IS NULL;


-- name: job_enqueue_keyed
-- Insert one job with an idempotency key, unless a pending or running job of the same
-- queue holds that key: then return the holder with created = false. Returns
-- (id, created, created_at).
-- The state row is inserted first, with an id drawn from the jobs' sequence, so that
-- ON CONFLICT on the live-key index can skip the whole job; the foreign key to
-- queue_jobs is checked at the end of the statement, when both rows exist. If no row
-- comes back, a concurrent transaction took the key after this statement's snapshot
-- and committed: run it again.
WITH new_job AS (
    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
), state AS (
    INSERT INTO queue_job_state AS s (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, updated_at
    )
    SELECT new_job.id, %(queue)s::text, 'pending', %(priority)s::smallint,
           coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
           0, %(max_attempts)s::integer, 0, %(idempotency_key)s::text, now()
    FROM new_job
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
        DO NOTHING
    RETURNING s.job_id, s.run_at
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
    SELECT state.job_id, %(queue)s::text, %(type)s::text, %(payload)s::jsonb,
           %(idempotency_key)s::text, now()
    FROM state
    RETURNING id, created_at
)
SELECT job.id, true AS created, job.created_at,
       (SELECT pg_notify('pgqueue', %(queue)s::text) WHERE state.run_at <= now()) IS NULL
FROM job
JOIN state ON state.job_id = job.id
UNION ALL
SELECT live.job_id, false, held.created_at, true
FROM queue_job_state AS live
JOIN queue_jobs AS held ON held.id = live.job_id
WHERE NOT EXISTS (SELECT FROM state)
  AND live.queue = %(queue)s::text
  AND live.idempotency_key = %(idempotency_key)s::text
  AND live.status IN ('pending', 'running');


-- name: job_enqueue_many
-- Insert many jobs without idempotency keys in one statement and wake their queues.
-- Arrays are parallel, one element per job, and payloads is one JSON array; ids come
-- back in input order. Ids are
-- drawn from the jobs' sequence first so both tables can be filled from the same
-- rows (the sequence is looked up once, not per row). Kept simple on purpose: its
-- estimated cost must stay far below jit_above_cost, or PostgreSQL spends longer
-- compiling it than running it.
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*,
           p.payload
    FROM unnest(
        %(queues)s::text[], %(types)s::text[], %(priorities)s::smallint[],
        %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::integer[]
    ) WITH ORDINALITY AS i(queue, type, priority, run_at, delay, max_attempts, position)
    JOIN jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, position)
        USING (position)
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, created_at)
    SELECT id, queue, type, payload, now()
    FROM numbered
), state AS (
    INSERT INTO queue_job_state (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version, updated_at
    )
    SELECT id, queue, 'pending', priority, coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, now()
    FROM numbered
    RETURNING queue, run_at
), wake AS (
    SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM state WHERE run_at <= now()) AS due
)
SELECT numbered.id
FROM numbered
CROSS JOIN wake
ORDER BY numbered.position;


-- name: job_enqueue_many_keyed
-- Insert many jobs, some with idempotency keys, skipping those whose key a live job
-- holds. Returns (position, id) for the jobs inserted; job_live_by_keys then finds
-- the holder for every other position, including keys repeated within the call.
-- The state row goes first so ON CONFLICT can skip the whole job (see job_enqueue_keyed).
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*,
           p.payload
    FROM unnest(
        %(queues)s::text[], %(types)s::text[], %(priorities)s::smallint[],
        %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::integer[],
        %(idempotency_keys)s::text[]
    ) WITH ORDINALITY AS i(queue, type, priority, run_at, delay, max_attempts,
                           idempotency_key, position)
    JOIN jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, position)
        USING (position)
), state AS (
    INSERT INTO queue_job_state AS s (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, updated_at
    )
    SELECT id, queue, 'pending', priority, coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, idempotency_key, now()
    FROM numbered
    ORDER BY position
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
        DO NOTHING
    RETURNING s.job_id, s.queue, s.run_at
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
    SELECT numbered.id, numbered.queue, numbered.type, numbered.payload,
           numbered.idempotency_key, now()
    FROM numbered
    JOIN state ON state.job_id = numbered.id
    RETURNING id
), wake AS (
    SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM state WHERE run_at <= now()) AS due
)
SELECT numbered.position, numbered.id
FROM numbered
JOIN job ON job.id = numbered.id
CROSS JOIN wake;


-- name: job_live_by_keys
-- Find the pending or running job holding each (queue, idempotency key) pair.
SELECT pair.position, live.job_id
FROM unnest(%(queues)s::text[], %(idempotency_keys)s::text[]) WITH ORDINALITY
    AS pair(queue, idempotency_key, position)
LEFT JOIN queue_job_state AS live
    ON live.queue = pair.queue
   AND live.idempotency_key = pair.idempotency_key
   AND live.status IN ('pending', 'running');


-- name: job_claim
-- Claim up to `limit` due jobs of one queue for a worker and open an attempt for each.
-- candidates is MATERIALIZED so it runs exactly once: inlined into a join, a
-- LIMIT ... FOR UPDATE SKIP LOCKED subquery can be re-run and lock more rows than
-- asked. With queue = <one value>, PostgreSQL walks queue_job_state_claim_idx in
-- ORDER BY order and stops after `limit` unlocked rows: no sort, whatever the
-- table size. Row locks last only for this statement; handlers run outside it.
-- Rows come back unordered (ordering here would add a Sort node); sort in the caller.
-- Each row carries its attempt's id: later writes address the attempt by primary key.
-- job_claim_after (built from this statement in sql/__init__.py) starts the walk
-- after a key the worker claimed before: see RESUME_TTL in worker/scheduler.py.
WITH candidates AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE queue = %(queue)s::text
      AND status = 'pending'
      AND run_at <= now()
      -- job_claim_after: resume after a key
    ORDER BY priority DESC, run_at, job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE queue_job_state AS state
    SET status = 'running',
        attempts = state.attempts + 1,
        lease_version = state.lease_version + 1,
        locked_by = %(worker_id)s::text,
        locked_until = now() + make_interval(secs => %(lease)s::float8),
        updated_at = now()
    -- An array of ids, not a join: the rows are fetched by primary key whatever the
    -- statistics say (a join can turn into a sequential scan of the whole table
    -- when they are stale, and autovacuum may be off).
    WHERE state.job_id = ANY (ARRAY(SELECT job_id FROM candidates))
    RETURNING state.job_id, state.queue, state.priority, state.run_at, state.attempts,
              state.max_attempts, state.lease_version
), opened AS (
    -- started_at is the clock when the row is claimed, not now(): now() is the
    -- transaction's start, before this statement took its snapshot, so a job that a
    -- sweep requeued in between would show its new attempt starting before the lost
    -- one ended (seen in the claims-racing-sweeps scenario).
    INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, started_at)
    SELECT job_id, lease_version, attempts, %(worker_id)s::text, 'running', clock_timestamp()
    FROM claimed
    RETURNING id, job_id
)
SELECT claimed.job_id, claimed.queue, job.type, job.payload, claimed.priority,
       claimed.attempts, claimed.max_attempts, claimed.lease_version, opened.id,
       job.idempotency_key, job.created_at, claimed.run_at
FROM claimed
JOIN opened ON opened.job_id = claimed.job_id
-- LIMIT 1 keeps this subquery from being flattened into a join: one primary-key probe
-- per claimed row, instead of a hash join that reads all of queue_jobs when the
-- planner underestimates how cheap the probes are.
CROSS JOIN LATERAL (
    SELECT j.type, j.payload::text AS payload, j.idempotency_key, j.created_at
    FROM queue_jobs AS j
    WHERE j.id = claimed.job_id
    LIMIT 1
) AS job;


-- name: job_complete
-- Mark jobs a worker still owns as completed and close their attempts with their results.
-- owned maps each job id (as text) to the lease version the worker holds; job_ids
-- and attempt_ids list the jobs and their attempts; results maps attempt ids to the
-- handlers' return values, for those that returned something. Fenced per job by
-- (job_id, lease_version, status = 'running'); returns the jobs that were completed.
-- A job missing from the result was not this worker's any more.
-- Rows are found by key (= ANY of an array) and the lease version is looked up per
-- row: no join for the planner to get wrong on stale statistics, and no FROM list,
-- which would make PostgreSQL copy every joined row whole for concurrent-update
-- rechecks.
WITH done AS (
    UPDATE queue_job_state AS state
    SET status = 'completed',
        locked_by = NULL,
        locked_until = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE state.job_id = ANY (%(job_ids)s::bigint[])
      AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
      AND state.status = 'running'
    RETURNING state.job_id
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'succeeded',
        finished_at = now(),
        result = %(results)s::jsonb -> attempt.id::text
    WHERE attempt.id = ANY (%(attempt_ids)s::bigint[])
      AND attempt.job_id IN (SELECT job_id FROM done)
)
SELECT job_id FROM done;


-- name: job_fail
-- Record a failed attempt of a job a worker still owns.
-- The job goes back to pending at now() + delay, or to dead when the failure is
-- permanent or its attempts are spent. Fenced; returns the new status and run_at, or
-- no row when the lease was lost.
WITH failed AS (
    UPDATE queue_job_state AS state
    SET status = CASE
            WHEN %(permanent)s::boolean OR state.attempts >= state.max_attempts THEN 'dead'
            ELSE 'pending'
        END,
        run_at = CASE
            WHEN %(permanent)s::boolean OR state.attempts >= state.max_attempts THEN state.run_at
            ELSE now() + make_interval(secs => %(delay)s::float8)
        END,
        finished_at = CASE
            WHEN %(permanent)s::boolean OR state.attempts >= state.max_attempts THEN now()
        END,
        locked_by = NULL,
        locked_until = NULL,
        last_error = %(last_error)s::text,
        updated_at = now()
    WHERE state.job_id = %(job_id)s::bigint
      AND state.lease_version = %(lease_version)s::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.lease_version, state.status, state.run_at
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'failed',
        finished_at = now(),
        error_class = %(error_class)s::text,
        error_message = %(error_message)s::text,
        traceback = %(traceback)s::text
    WHERE attempt.id = %(attempt_id)s::bigint
      AND EXISTS (SELECT FROM failed)
)
SELECT status, run_at FROM failed;


-- name: lease_renew
-- Extend the leases a worker still holds, all in one statement.
-- owned maps job ids (as text) to the lease versions held. Touches only
-- locked_until, which no index covers, so renewals can be HOT updates. Returns the
-- jobs still owned; the others were lost (swept, or finished by someone else).
UPDATE queue_job_state AS state
SET locked_until = now() + make_interval(secs => %(lease)s::float8)
WHERE state.job_id = ANY (%(job_ids)s::bigint[])
  AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
  AND state.status = 'running'
RETURNING state.job_id;


-- name: job_release
-- Hand back claimed jobs a worker never started (shutdown).
-- They return to pending at once, the claim's attempt is given back and the attempt
-- row is marked released. Fenced like job_complete; returns the jobs released.
WITH released AS (
    UPDATE queue_job_state AS state
    SET status = 'pending',
        attempts = state.attempts - 1,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = ANY (%(job_ids)s::bigint[])
      AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.queue
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'released', finished_at = now()
    WHERE attempt.id = ANY (%(attempt_ids)s::bigint[])
      AND attempt.job_id IN (SELECT job_id FROM released)
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT released.job_id FROM released, wake;


-- name: lease_sweep
-- Requeue running jobs whose lease ran out, or mark them dead when their attempts are spent.
-- Any worker may run it, several at once: expired rows are locked with SKIP LOCKED,
-- and the UPDATE re-checks status and locked_until on the row it changes, so a
-- completion or a renewal that landed after the sweep looked is never undone. The
-- lost attempt is closed as 'lost'. lease_version grows so the old token is dead.
-- run_at stays as it was: the job was due already and keeps its place in line, so
-- it runs again as soon as a worker is free, not after the whole backlog behind it.
WITH expired AS MATERIALIZED (
    SELECT job_id, lease_version
    FROM queue_job_state
    WHERE status = 'running' AND locked_until < now()
    ORDER BY job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
), swept AS (
    UPDATE queue_job_state AS state
    SET status = CASE WHEN state.attempts >= state.max_attempts THEN 'dead' ELSE 'pending' END,
        finished_at = CASE WHEN state.attempts >= state.max_attempts THEN now() END,
        lease_version = state.lease_version + 1,
        last_error = 'lease expired: worker ' || state.locked_by
                     || ' stopped renewing it (crashed, frozen or cut off)',
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    FROM expired
    WHERE state.job_id = ANY (ARRAY(SELECT job_id FROM expired))
      AND state.job_id = expired.job_id
      AND state.lease_version = expired.lease_version
      AND state.status = 'running'
      AND state.locked_until < now()
    RETURNING state.job_id, state.queue, expired.lease_version AS lost_version, state.status
), lost AS (
    UPDATE queue_attempts AS attempt
    SET status = 'lost',
        finished_at = now(),
        error_class = 'LeaseExpired',
        error_message = 'the lease ran out before the worker finished; the job was requeued'
    FROM swept
    WHERE attempt.job_id = swept.job_id
      AND attempt.lease_version = swept.lost_version
      AND attempt.status = 'running'
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM swept WHERE status = 'pending') AS q
)
SELECT swept.job_id, swept.queue, swept.lost_version, swept.status FROM swept, wake;


-- name: attempt_outcome
-- Read back the status of attempts by id.
-- Used after a write whose COMMIT outcome is unknown (the connection died): the
-- attempt row says whether that write landed, instead of a guess.
SELECT id, status
FROM queue_attempts
WHERE id = ANY (%(attempt_ids)s::bigint[]);


-- name: job_retry_now
-- Operator retry: dead, cancelled or pending jobs become due now with fresh attempts.
-- The attempt history stays; lease_version grows. A running job is never touched, nor a
-- job whose idempotency key another live job holds; of several selected jobs sharing
-- a key, only the newest is retried (two live jobs cannot hold one key). Returns the
-- jobs changed.
WITH candidate AS MATERIALIZED (
    SELECT state.job_id, state.queue, state.idempotency_key
    FROM queue_job_state AS state
    WHERE state.job_id = ANY(%(job_ids)s::bigint[])
      AND state.status IN ('dead', 'cancelled', 'pending')
      AND NOT EXISTS (
          SELECT FROM queue_job_state AS other
          WHERE state.idempotency_key IS NOT NULL
            AND other.queue = state.queue
            AND other.idempotency_key = state.idempotency_key
            AND other.status IN ('pending', 'running')
            AND other.job_id <> state.job_id
      )
    ORDER BY state.job_id
    FOR UPDATE
), target AS (
    SELECT job_id FROM candidate WHERE idempotency_key IS NULL
    UNION ALL
    SELECT max(job_id) FROM candidate
    WHERE idempotency_key IS NOT NULL
    GROUP BY queue, idempotency_key
), retried AS (
    UPDATE queue_job_state AS state
    SET status = 'pending',
        run_at = now(),
        attempts = 0,
        lease_version = state.lease_version + 1,
        finished_at = NULL,
        updated_at = now()
    FROM target
    WHERE state.job_id = target.job_id
      AND state.status IN ('dead', 'cancelled', 'pending')
    RETURNING state.job_id, state.queue
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM retried) AS q
)
SELECT retried.job_id FROM retried, wake;


-- name: job_cancel
-- Operator cancel: pending jobs become cancelled. Running jobs are never touched.
UPDATE queue_job_state
SET status = 'cancelled', finished_at = now(), updated_at = now()
WHERE job_id = ANY(%(job_ids)s::bigint[])
  AND status = 'pending'
RETURNING job_id;


-- name: stats_by_queue
-- Count each queue's pending, running, dead and cancelled jobs, for the admin and queue_stats.
-- Completed jobs, most of the table, are not read: each branch walks one small partial
-- index, so the cost follows the number of unfinished and failed jobs, not the table
-- size. Pending comes from the claim index alone (index-only), running from the
-- running index (plus the heap, for locked_until), dead and cancelled from
-- queue_job_state_failed_idx (index-only). oldest_due_seconds is how long the
-- longest-waiting due pending job has been due; expired counts running jobs whose
-- lease has run out and that no sweep has requeued yet.
SELECT queue, 'pending' AS status, count(*) AS jobs,
       count(*) FILTER (WHERE run_at <= now()) AS due,
       0 AS expired,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now()))::float8
           AS oldest_due_seconds
FROM queue_job_state
WHERE status = 'pending'
GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*), 0, count(*) FILTER (WHERE locked_until < now()), NULL
FROM queue_job_state
WHERE status = 'running'
GROUP BY queue
UNION ALL
SELECT queue, status, count(*), 0, 0, NULL
FROM queue_job_state
WHERE status IN ('dead', 'cancelled')
GROUP BY queue, status;


-- name: stats_completed_by_queue
-- Count each queue's completed jobs exactly. Reads the whole table: for queue_stats --exact,
-- never for a page load.
SELECT queue, count(*) AS jobs
FROM queue_job_state
WHERE status = 'completed'
GROUP BY queue;


-- name: job_count_estimate
-- Estimate the number of jobs without counting them, the way the planner does.
-- Rows per page as of the last VACUUM or ANALYZE, times the table's current size in
-- pages, so the figure follows growth between vacuums. NULL when the table has never
-- been analyzed: the caller counts instead.
SELECT CASE
           WHEN c.reltuples < 0 OR c.relpages = 0 THEN NULL
           ELSE (c.reltuples / c.relpages
                 * (pg_relation_size(c.oid) / current_setting('block_size')::float8))::bigint
       END AS estimate
FROM pg_class AS c
WHERE c.oid = 'queue_jobs'::regclass;


-- name: autovacuum_settings
-- Read whether autovacuum may clean queue_job_state, for the system check pgqueue.W001:
-- whether it is on for the server, and whether the table's reloptions turn it off.
SELECT current_setting('autovacuum')::bool AS server_on,
       coalesce(bool_or(option = 'autovacuum_enabled=false'), false) AS table_off
FROM pg_class AS c
LEFT JOIN LATERAL unnest(c.reloptions) AS option ON true
WHERE c.oid = to_regclass('queue_job_state');


-- name: clock_ago
-- Read the database's now() minus some seconds: one clock for a whole command run.
SELECT now() - make_interval(secs => %(seconds)s::float8) AS at;


-- name: job_prune_count
-- Count, by status, the finished jobs that finished before the cutoff (a prune's dry run).
-- The IN list repeats the rule of job_prune_batch: only finished jobs ever qualify.
SELECT status, count(*) AS jobs
FROM queue_job_state
WHERE status = ANY(%(statuses)s::text[])
  AND status IN ('completed', 'dead', 'cancelled')
  AND finished_at < %(cutoff)s::timestamptz
GROUP BY status;


-- name: job_prune_batch
-- Delete at most `limit` jobs that finished before the cutoff, with their state and attempts.
-- The state row and the attempts go with the job through the ON DELETE CASCADE foreign
-- keys. Only completed, dead and cancelled jobs qualify, whatever statuses the caller
-- passes: a pending or running job is never deleted. The state rows are locked with
-- SKIP LOCKED, so a job an operator is retrying at this moment is left for a later
-- run, and a row that changed status before the lock was taken is re-checked against
-- the WHERE clause and dropped. Each batch is one short statement in its own
-- transaction: no lock outlives it. Batches walk the primary key upwards from
-- after_id (the last job the previous batch deleted), so a whole prune reads the table
-- once; no index over every finished job is needed, which would weigh on the hot table.
WITH doomed AS MATERIALIZED (
    SELECT job_id, status
    FROM queue_job_state
    WHERE job_id > %(after_id)s::bigint
      AND status = ANY(%(statuses)s::text[])
      AND status IN ('completed', 'dead', 'cancelled')
      AND finished_at < %(cutoff)s::timestamptz
    ORDER BY job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
DELETE FROM queue_jobs AS job
USING doomed
WHERE job.id = doomed.job_id
RETURNING doomed.job_id, doomed.status;


-- name: job_dead_page
-- List dead jobs for requeue_dead, oldest death first, one keyset page at a time.
-- queue, type and since are optional filters (NULL: any). `until` is the database's
-- now() when the run started: a job that dies again after this run requeued it is
-- not requeued a second time. Pages follow (finished_at, job_id) on
-- queue_job_state_failed_age_idx; jobs a page skips stay dead and are not seen again.
SELECT state.job_id, state.finished_at
FROM queue_job_state AS state
JOIN queue_jobs AS job ON job.id = state.job_id
WHERE state.status = 'dead'
  AND state.finished_at <= %(until)s::timestamptz
  AND (%(since)s::timestamptz IS NULL OR state.finished_at >= %(since)s::timestamptz)
  AND (%(queue)s::text IS NULL OR state.queue = %(queue)s::text)
  AND (%(type)s::text IS NULL OR job.type = %(type)s::text)
  AND (state.finished_at, state.job_id)
      > (%(after_finished)s::timestamptz, %(after_id)s::bigint)
ORDER BY state.finished_at, state.job_id
LIMIT %(limit)s::integer;


-- name: job_locked_by
-- List the running jobs a worker holds according to the database, with their attempts.
-- After a reconnect the worker compares them with the leases it knows: a claim whose
-- COMMIT landed but whose answer was lost leaves jobs it does not know it holds, which
-- it hands back (job_release). Walks queue_job_state_running_idx (running rows only).
SELECT state.job_id, state.lease_version, attempt.id
FROM queue_job_state AS state
JOIN queue_attempts AS attempt
  ON attempt.job_id = state.job_id AND attempt.lease_version = state.lease_version
WHERE state.status = 'running'
  AND state.locked_by = %(worker_id)s::text;


-- name: queue_next_due
-- Seconds until the next pending job of a queue comes due (NULL: none pending).
-- An idle worker whose listener is connected sleeps until then (or its idle poll)
-- instead of polling every POLL_INTERVAL: a NOTIFY announces new jobs, but not a
-- scheduled job coming due. Reads the queue's entries of queue_job_state_claim_idx.
SELECT extract(epoch FROM min(run_at) - now())::float8
FROM queue_job_state
WHERE queue = %(queue)s::text AND status = 'pending';
