-- Every statement django_pgqueue runs against the queue tables.
--
-- Each block opens with "-- name: <name>" and a line saying what it does;
-- django_pgqueue.sql loads them into QUERIES. Parameters are %(name)s and carry
-- explicit casts, so the statements work with client- and server-side binding alike.
--
-- Rules every block keeps (see DESIGN.md):
-- * Time is the database's now(), never a worker's clock.
-- * A worker's write about a job it claimed is fenced:
--   job_id = .. AND lease_version = .. AND status = 'running'. Zero rows back means the
--   lease was lost and the write did nothing.
-- * lease_version only grows: claim, lease sweep and operator retry each add one.
-- * One queue per claim, by equality: "queue = ANY(...)" turns the ordered walk of the
--   claim index into a bitmap scan plus a sort of every pending row.


-- name: job_enqueue
-- Insert one job and its state row, wake the queue's workers, return (id, created, created_at).
-- The state row is inserted first, with an id drawn from the jobs' sequence, so that
-- ON CONFLICT on the live-key index can skip the whole job; the foreign key to
-- queue_jobs is checked at the end of the statement, when both rows exist. With an
-- idempotency key already held by a pending or running job, nothing is inserted and
-- the holder is returned with created = false. If no row comes back, a concurrent
-- transaction inserted the key after this statement's snapshot: run it again.
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
SELECT job.id, true AS created, job.created_at
FROM job
JOIN state ON state.job_id = job.id
LEFT JOIN LATERAL (
    SELECT pg_notify('pgqueue', %(queue)s::text) WHERE state.run_at <= now()
) AS wake ON true
UNION ALL
SELECT live.job_id, false, held.created_at
FROM queue_job_state AS live
JOIN queue_jobs AS held ON held.id = live.job_id
WHERE %(idempotency_key)s::text IS NOT NULL
  AND NOT EXISTS (SELECT FROM state)
  AND live.queue = %(queue)s::text
  AND live.idempotency_key = %(idempotency_key)s::text
  AND live.status IN ('pending', 'running');


-- name: job_enqueue_many
-- Insert many jobs in one statement, in input order, and wake their queues.
-- Arrays are parallel, one element per job. The result has one row per input
-- position: the new job, or the live job already holding that idempotency key (an
-- earlier position of the same call included). A NULL id means a concurrent
-- transaction holds the key: look it up again with job_live_by_key.
WITH input AS (
    SELECT *
    FROM unnest(
        %(queues)s::text[], %(types)s::text[], %(payloads)s::text[], %(priorities)s::smallint[],
        %(run_ats)s::timestamptz[], %(delays)s::float8[], %(max_attempts)s::integer[],
        %(idempotency_keys)s::text[]
    ) WITH ORDINALITY AS i(queue, type, payload, priority, run_at, delay, max_attempts,
                           idempotency_key, position)
), numbered AS MATERIALIZED (
    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, input.*
    FROM input
    ORDER BY input.position
), state AS (
    INSERT INTO queue_job_state AS s (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, updated_at
    )
    SELECT id, queue, 'pending', priority,
           coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, idempotency_key, now()
    FROM numbered
    ORDER BY position
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
        DO NOTHING
    RETURNING s.job_id, s.queue, s.run_at, s.idempotency_key
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
    SELECT numbered.id, numbered.queue, numbered.type, numbered.payload::jsonb,
           numbered.idempotency_key, now()
    FROM numbered
    JOIN state ON state.job_id = numbered.id
    RETURNING id
), wake AS (
    SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM state WHERE run_at <= now()) AS due
)
SELECT numbered.position,
       coalesce(state.job_id, same_call.job_id, live.job_id) AS id,
       state.job_id IS NOT NULL AS created
FROM numbered
CROSS JOIN wake
LEFT JOIN state ON state.job_id = numbered.id
LEFT JOIN LATERAL (
    SELECT held.job_id FROM state AS held
    WHERE state.job_id IS NULL
      AND held.queue = numbered.queue
      AND held.idempotency_key = numbered.idempotency_key
    LIMIT 1
) AS same_call ON true
LEFT JOIN LATERAL (
    SELECT held.job_id FROM queue_job_state AS held
    WHERE state.job_id IS NULL
      AND held.queue = numbered.queue
      AND held.idempotency_key = numbered.idempotency_key
      AND held.status IN ('pending', 'running')
    LIMIT 1
) AS live ON true
ORDER BY numbered.position;


-- name: job_live_by_key
-- Find the pending or running job holding an idempotency key in a queue.
SELECT job_id
FROM queue_job_state
WHERE queue = %(queue)s::text
  AND idempotency_key = %(idempotency_key)s::text
  AND status IN ('pending', 'running');


-- name: job_claim
-- Claim up to `limit` due jobs of one queue for a worker and open an attempt for each.
-- candidates is MATERIALIZED so it runs exactly once: inlined into a join, a
-- LIMIT ... FOR UPDATE SKIP LOCKED subquery can be re-run and lock more rows than
-- asked. With queue = <one value>, PostgreSQL walks queue_job_state_claim_idx in
-- ORDER BY order and stops after `limit` unlocked rows: no sort, whatever the
-- table size. Row locks last only for this statement; handlers run outside it.
-- Rows come back unordered (ordering here would add a Sort node); sort in the caller.
WITH candidates AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE queue = %(queue)s::text
      AND status = 'pending'
      AND run_at <= now()
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
    FROM candidates
    WHERE state.job_id = candidates.job_id
    RETURNING state.job_id, state.queue, state.priority, state.run_at, state.attempts,
              state.max_attempts, state.lease_version
), opened AS (
    INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status, started_at)
    SELECT job_id, lease_version, attempts, %(worker_id)s::text, 'running', now()
    FROM claimed
)
SELECT claimed.job_id, claimed.queue, job.type, job.payload::text, claimed.priority,
       claimed.attempts, claimed.max_attempts, claimed.lease_version, job.idempotency_key,
       job.created_at, claimed.run_at
FROM claimed
JOIN queue_jobs AS job ON job.id = claimed.job_id;


-- name: job_complete
-- Mark jobs a worker still owns as completed and close their attempts.
-- Fenced per job by (job_id, lease_version, status = 'running'); returns the jobs
-- that were completed. A job missing from the result was not ours any more.
WITH owned AS (
    SELECT *
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[], %(results)s::text[])
        AS o(job_id, lease_version, result)
), done AS (
    UPDATE queue_job_state AS state
    SET status = 'completed',
        locked_by = NULL,
        locked_until = NULL,
        finished_at = now(),
        updated_at = now()
    FROM owned
    WHERE state.job_id = owned.job_id
      AND state.lease_version = owned.lease_version
      AND state.status = 'running'
    RETURNING state.job_id, state.lease_version
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'succeeded', finished_at = now(), result = owned.result::jsonb
    FROM done
    JOIN owned ON owned.job_id = done.job_id
    WHERE attempt.job_id = done.job_id AND attempt.lease_version = done.lease_version
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
    FROM failed
    WHERE attempt.job_id = failed.job_id AND attempt.lease_version = failed.lease_version
)
SELECT status, run_at FROM failed;


-- name: lease_renew
-- Extend the leases a worker still holds, all in one statement.
-- Touches only locked_until, which no index covers, so renewals can be HOT updates.
-- Returns the jobs still owned; the others were lost (swept or finished elsewhere).
UPDATE queue_job_state AS state
SET locked_until = now() + make_interval(secs => %(lease)s::float8)
FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[]) AS held(job_id, lease_version)
WHERE state.job_id = held.job_id
  AND state.lease_version = held.lease_version
  AND state.status = 'running'
RETURNING state.job_id;


-- name: job_release
-- Hand back claimed jobs a worker never started (shutdown).
-- They return to pending at once, the claim's attempt is given back and the attempt
-- row is marked released. Fenced; returns the jobs released.
WITH released AS (
    UPDATE queue_job_state AS state
    SET status = 'pending',
        attempts = state.attempts - 1,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    FROM unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[]) AS held(job_id, lease_version)
    WHERE state.job_id = held.job_id
      AND state.lease_version = held.lease_version
      AND state.status = 'running'
    RETURNING state.job_id, state.queue, state.lease_version
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'released', finished_at = now()
    FROM released
    WHERE attempt.job_id = released.job_id AND attempt.lease_version = released.lease_version
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
        run_at = now(),
        lease_version = state.lease_version + 1,
        last_error = 'lease expired: worker ' || state.locked_by
                     || ' stopped renewing it (crashed, frozen or cut off)',
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    FROM expired
    WHERE state.job_id = expired.job_id
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
-- Read back the attempts of (job_id, lease_version) pairs.
-- Used after a write whose COMMIT outcome is unknown (the connection died): the
-- attempt row says whether that write landed, instead of a guess.
SELECT attempt.job_id, attempt.lease_version, attempt.status
FROM queue_attempts AS attempt
JOIN unnest(%(job_ids)s::bigint[], %(lease_versions)s::bigint[]) AS held(job_id, lease_version)
  ON attempt.job_id = held.job_id AND attempt.lease_version = held.lease_version;


-- name: job_retry_now
-- Operator retry: dead, cancelled or pending jobs become due now with fresh attempts.
-- The attempt history stays; lease_version grows. A running job is never touched, nor a
-- job whose idempotency key another live job holds. Returns the jobs changed.
WITH target AS MATERIALIZED (
    SELECT state.job_id
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
