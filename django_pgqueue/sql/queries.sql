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
-- (id, created, created_at). The work is the PL/pgSQL function pgqueue_enqueue
-- (migration 0007): PostgreSQL plans its statements once per session and reuses the
-- plans, which a prepared statement would do too but a transaction-mode pooler may
-- not allow. Without an idempotency key: the job row, then its state row (with the
-- concurrency key, if any). With one: the state row first, its id drawn from the
-- jobs' sequence, so ON CONFLICT on the live-key index can skip the whole job; then
-- the holder is returned with created = false, and a key that changed hands after
-- the statement's snapshot is tried again (up to 5 times; then the row is all NULL).
-- A concurrency key marks the queue keyed in queue_controls (the first time only), so
-- workers claim it through job_claim_controlled. NOTIFY is delivered by PostgreSQL
-- only when the caller's transaction commits; created_at is now(), the job row's.
SELECT job_id, created, created_at
FROM pgqueue_enqueue(
    %(queue)s::text, %(type)s::text, %(payload)s::jsonb, %(priority)s::smallint,
    %(run_at)s::timestamptz, %(delay)s::float8, %(max_attempts)s::integer,
    %(idempotency_key)s::text, %(traceparent)s::text, %(concurrency_key)s::text
);


-- name: job_enqueue_many
-- Insert many jobs without keys in one statement and wake their queues; return their
-- ids as one array, in input order.
-- Arrays are parallel, one element per job, and payloads is one JSON array, zipped by
-- ROWS FROM (no join). Ids are drawn from the jobs' sequence first so both tables can
-- be filled from the same rows (the sequence is looked up once, not per row). Kept
-- simple on purpose: its estimated cost must stay far below jit_above_cost, or
-- PostgreSQL spends longer compiling it than running it. job_enqueue_many_keyed
-- numbers its rows with this same text, plus the keys.
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*
    FROM ROWS FROM (
        unnest(%(queues)s::text[]), unnest(%(types)s::text[]),
        unnest(%(priorities)s::smallint[]), unnest(%(run_ats)s::timestamptz[]),
        unnest(%(delays)s::float8[]), unnest(%(max_attempts)s::integer[]),
        jsonb_array_elements(%(payloads)s::jsonb)
    ) WITH ORDINALITY
        AS i(queue, type, priority, run_at, delay, max_attempts, payload, position)
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
    SELECT id, queue, type, payload, now(), %(traceparent)s::text
    FROM numbered
), state AS (
    INSERT INTO queue_job_state (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version, updated_at
    )
    SELECT id, queue, 'pending', priority, coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, now()
    FROM numbered
), wake AS (
    -- From the input rather than the inserted rows (RETURNING would keep them all);
    -- every row is inserted, and the NOTIFY is delivered at commit either way.
    SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
    FROM (
        SELECT DISTINCT queue FROM numbered
        WHERE coalesce(run_at, now() + make_interval(secs => delay)) <= now()
    ) AS due
)
SELECT array_agg(numbered.id ORDER BY numbered.position)
FROM numbered
CROSS JOIN wake;


-- name: job_enqueue_many_alike
-- job_enqueue_many for jobs without keys that share their options (type, queue,
-- priority, schedule, max_attempts), given once: only the payloads are per job. The
-- common bulk call; the rows are built ~2.5x faster than from parallel arrays. Returns
-- the ids as one array, in input order.
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id,
           p.payload, p.position
    FROM jsonb_array_elements(%(payloads)s::jsonb) WITH ORDINALITY AS p(payload, position)
), due AS MATERIALIZED (
    SELECT coalesce(%(run_at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8))
        AS run_at
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
    SELECT id, %(queue)s::text, %(type)s::text, payload, now(), %(traceparent)s::text
    FROM numbered
), state AS (
    INSERT INTO queue_job_state (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version, updated_at
    )
    SELECT numbered.id, %(queue)s::text, 'pending', %(priority)s::smallint, due.run_at, 0,
           %(max_attempts)s::integer, 0, now()
    FROM numbered
    CROSS JOIN due
)
SELECT array_agg(numbered.id ORDER BY numbered.position),
       (SELECT pg_notify('pgqueue', %(queue)s::text) FROM due WHERE due.run_at <= now()) IS NULL
FROM numbered;


-- name: job_enqueue_many_keyed
-- Insert many jobs, some with idempotency or concurrency keys, skipping those whose
-- idempotency key a live job holds. Returns (position, id) for the jobs inserted;
-- job_live_by_keys then finds the holder for every other position, including keys
-- repeated within the call. The state row goes first so ON CONFLICT can skip the
-- whole job (see pgqueue_enqueue). A queue that receives a job with a concurrency key
-- is marked keyed in queue_controls (the first time only), as job_enqueue does.
-- Its rows are job_enqueue_many's, with the two key arrays zipped in before the
-- payloads (sql/__init__.py puts them at the mark).
WITH numbered AS MATERIALIZED (
    -- job_enqueue_many_keyed: job_enqueue_many's numbered rows, with the keys
), state AS (
    INSERT INTO queue_job_state AS s (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, concurrency_key, updated_at
    )
    SELECT id, queue, 'pending', priority, coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, idempotency_key, concurrency_key, now()
    FROM numbered
    ORDER BY position
    ON CONFLICT (queue, idempotency_key)
        WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
        DO NOTHING
    RETURNING s.job_id, s.queue, s.run_at, s.concurrency_key
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at, traceparent)
    SELECT numbered.id, numbered.queue, numbered.type, numbered.payload,
           numbered.idempotency_key, now(), %(traceparent)s::text
    FROM numbered
    JOIN state ON state.job_id = numbered.id
    RETURNING id
), marked AS (
    INSERT INTO queue_controls AS c (queue, paused, key_limit, rate_starts, keyed, updated_at)
    SELECT DISTINCT state.queue, false, 1, '{}'::timestamptz[], true, now()
    FROM state
    WHERE state.concurrency_key IS NOT NULL
      AND NOT EXISTS (
          SELECT FROM queue_controls AS known WHERE known.queue = state.queue AND known.keyed
      )
    ON CONFLICT (queue) DO UPDATE SET keyed = true, updated_at = now()
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


-- name: claim_plan_generic
-- Sent just before job_claim (or job_claim_after) in the same transaction, when the
-- worker prepares its statements: the claim then runs on the generic plan PostgreSQL
-- built once for the session instead of planning it again at every claim. Left to
-- plan_cache_mode = auto, the server plans the claim anew each time (a generic plan
-- must guess LIMIT $n as a tenth of the candidates, which it costs above the custom
-- plans), about 0.25 ms of server time per claim, a quarter of a claim of 10.
-- A generic plan is built once and kept until the table's statistics change (ANALYZE,
-- VACUUM), so it must not depend on the table's size when it is built: on an empty
-- table PostgreSQL's cheapest generic plan is a Seq Scan and a Sort, which a worker
-- would keep while the table grew (with autovacuum off, for ever). With sequential
-- scans and sorts off for the transaction, the only plan left is the one the contract
-- asks for at every size: the ordered walk of queue_job_state_claim_idx and
-- primary-key probes (test_claim_plan builds it on an empty table and at 50,000 rows).
-- Local to the transaction, so nothing outlives it on a pooled connection.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('enable_seqscan', 'off', true),
       set_config('enable_sort', 'off', true);


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
-- job_claim_controlled takes its steps from claimed on and its rows.
WITH candidates AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE queue = %(queue)s::text
      AND status = 'pending'
      AND run_at <= now()
      -- A job with a concurrency key is left to job_claim_controlled: its enqueue
      -- marked the queue keyed, but a worker learns that only at its next view of the
      -- queue's controls, and meanwhile must not run two jobs of one key. The walk
      -- stays ordered when most rows have a key (see test_claim_plan).
      AND concurrency_key IS NULL
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
    -- An array of ids, not a join: a join can turn into a sequential scan of the whole
    -- table when the statistics are stale (and autovacuum may be off). The rows are
    -- fetched by primary key, except from a table of a few dozen pages, which the
    -- planner reads whole as cheaper than the probes (the soak at 1,000 rows: 30
    -- pages, 0.2 ms). The queue is not repeated here: a filter on it lowers the
    -- planner's estimate of the rows updated, which changes the joins below.
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
       job.idempotency_key, job.created_at, claimed.run_at, job.traceparent
FROM claimed
JOIN opened ON opened.job_id = claimed.job_id
-- LIMIT 1 keeps this subquery from being flattened into a join: one primary-key probe
-- per claimed row, instead of a hash join that reads all of queue_jobs when the
-- planner underestimates how cheap the probes are.
CROSS JOIN LATERAL (
    SELECT j.type, j.payload::text AS payload, j.idempotency_key, j.created_at, j.traceparent
    FROM queue_jobs AS j
    WHERE j.id = claimed.job_id
      -- The queue names the shard where the tables are distributed by it (Citus, see
      -- docs/howto/scaling-out.md); here it only checks the row the key found.
      AND j.queue = %(queue)s::text
    LIMIT 1
) AS job;


-- name: job_complete
-- Mark jobs a worker still owns as completed and close their attempts with their results.
-- owned maps each job id (as text) to the lease version the worker holds; job_ids
-- and attempt_ids list the jobs and their attempts; results maps attempt ids to the
-- handlers' return values, for those that returned something. Fenced per job by
-- (job_id, lease_version, status = 'running'); returns the jobs that were completed,
-- each with whether it ended cancelled instead: a job an operator asked to cancel
-- while it ran ends cancelled (its result is still recorded). A job missing from the
-- result was not this worker's any more.
-- Rows are found by key (= ANY of an array) and the lease version is looked up per
-- row: no join for the planner to get wrong on stale statistics, and no FROM list,
-- which would make PostgreSQL copy every joined row whole for concurrent-update
-- rechecks.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH done AS (
    UPDATE queue_job_state AS state
    SET status = CASE WHEN state.cancel_requested_at IS NULL THEN 'completed' ELSE 'cancelled' END,
        locked_by = NULL,
        locked_until = NULL,
        finished_at = now(),
        updated_at = now()
    WHERE state.job_id = ANY (%(job_ids)s::bigint[])
      AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.status = 'cancelled' AS cancelled, state.has_dependents
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'succeeded',
        finished_at = now(),
        result = %(results)s::jsonb -> attempt.id::text
    -- An array, not a semi-join: joined, each finished job re-reads the attempt ids'
    -- whole array through the primary key (a nested loop of bitmap scans, batch size
    -- squared probes); as an array it is read once.
    WHERE attempt.id = ANY (%(attempt_ids)s::bigint[])
      AND attempt.job_id = ANY (ARRAY(SELECT job_id FROM done))
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM done)
), settled AS (
    -- workflows: settle the dependents of the jobs completed (or ended cancelled)
    SELECT pgqueue_settle(
        ARRAY(SELECT job_id FROM done WHERE has_dependents AND NOT cancelled),
        ARRAY(SELECT job_id FROM done WHERE has_dependents AND cancelled)
    ) AS steps
    WHERE EXISTS (SELECT FROM done WHERE has_dependents)
)
SELECT job_id, cancelled FROM done CROSS JOIN woken LEFT JOIN settled ON true;


-- name: job_fail
-- Record a failed attempt of a job a worker still owns.
-- The job goes back to pending at now() + delay, or to dead when the failure is
-- permanent or its attempts are spent, or to cancelled when an operator asked to
-- cancel it while it ran. Fenced; returns the new status and run_at, or no row when
-- the lease was lost.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH failed AS (
    UPDATE queue_job_state AS state
    SET status = CASE
            WHEN state.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN %(permanent)s::boolean OR state.attempts >= state.max_attempts THEN 'dead'
            ELSE 'pending'
        END,
        run_at = CASE
            WHEN state.cancel_requested_at IS NOT NULL OR %(permanent)s::boolean
                 OR state.attempts >= state.max_attempts THEN state.run_at
            ELSE now() + make_interval(secs => %(delay)s::float8)
        END,
        finished_at = CASE
            WHEN state.cancel_requested_at IS NOT NULL OR %(permanent)s::boolean
                 OR state.attempts >= state.max_attempts THEN now()
        END,
        locked_by = NULL,
        locked_until = NULL,
        last_error = %(last_error)s::text,
        updated_at = now()
    WHERE state.job_id = %(job_id)s::bigint
      AND state.lease_version = %(lease_version)s::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.lease_version, state.status, state.run_at,
              state.has_dependents
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'failed',
        finished_at = now(),
        error_class = %(error_class)s::text,
        error_message = %(error_message)s::text,
        traceback = %(traceback)s::text
    WHERE attempt.id = %(attempt_id)s::bigint
      AND EXISTS (SELECT FROM failed)
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM failed WHERE status <> 'pending')
), settled AS (
    -- workflows: a job that ended dead or cancelled settles its dependents as failed
    SELECT pgqueue_settle('{}', ARRAY(SELECT job_id FROM failed)) AS steps
    WHERE EXISTS (
        SELECT FROM failed WHERE failed.has_dependents AND failed.status IN ('dead', 'cancelled')
    )
)
SELECT status, run_at FROM failed CROSS JOIN woken LEFT JOIN settled ON true;


-- name: lease_renew
-- Extend the leases a worker still holds, all in one statement.
-- owned maps job ids (as text) to the lease versions held. Touches only
-- locked_until, which no index covers, so renewals can be HOT updates. Returns the
-- jobs still owned, each with whether an operator asked to cancel it; the others
-- were lost (swept, or finished by someone else).
UPDATE queue_job_state AS state
SET locked_until = now() + make_interval(secs => %(lease)s::float8)
WHERE state.job_id = ANY (%(job_ids)s::bigint[])
  AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
  AND state.status = 'running'
RETURNING state.job_id, state.cancel_requested_at IS NOT NULL AS cancel_requested;


-- name: job_release
-- Hand back claimed jobs a worker never started (shutdown).
-- They return to pending at once, the claim's attempt is given back and the attempt
-- row is marked released. A job an operator asked to cancel ends cancelled instead.
-- Fenced like job_complete; returns the jobs released.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH released AS (
    UPDATE queue_job_state AS state
    SET status = CASE WHEN state.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        finished_at = CASE WHEN state.cancel_requested_at IS NOT NULL THEN now() END,
        attempts = state.attempts - 1,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = ANY (%(job_ids)s::bigint[])
      AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.queue, state.status, state.has_dependents
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'released', finished_at = now()
    WHERE attempt.id = ANY (%(attempt_ids)s::bigint[])
      AND attempt.job_id = ANY (ARRAY(SELECT job_id FROM released))  -- as in job_complete
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM released) AS q
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM released WHERE status = 'cancelled')
), settled AS (
    -- workflows: a job that ended cancelled settles its dependents as failed
    SELECT pgqueue_settle(
        '{}', ARRAY(SELECT job_id FROM released WHERE has_dependents AND status = 'cancelled')
    ) AS steps
    WHERE EXISTS (SELECT FROM released WHERE has_dependents AND status = 'cancelled')
)
SELECT released.job_id FROM released CROSS JOIN wake CROSS JOIN woken LEFT JOIN settled ON true;


-- name: plan_size_probe
-- The size in bytes of the tables the worker's prepared statements read. PostgreSQL keeps
-- a prepared statement's generic plan until ANALYZE or VACUUM of its tables; one made
-- while they were nearly empty is a sequential scan that stays as they grow (for ever
-- with autovacuum off). The worker discards its plans (DISCARD PLANS) when this has
-- doubled or halved since they were made; the next executions plan again.
SELECT pg_relation_size('queue_job_state') + pg_relation_size('queue_attempts');


-- name: plan_discard
-- Drop the cached plans of this session's prepared statements (they stay prepared).
DISCARD PLANS;


-- name: lease_sweep
-- Requeue running jobs whose lease ran out, or mark them dead when their attempts are spent.
-- Any worker may run it, several at once: expired rows are locked with SKIP LOCKED,
-- and the UPDATE re-checks status and locked_until on the row it changes, so a
-- completion or a renewal that landed after the sweep looked is never undone. The
-- lost attempt is closed as 'lost'. lease_version grows so the old token is dead.
-- run_at stays as it was: the job was due already and keeps its place in line, so
-- it runs again as soon as a worker is free, not after the whole backlog behind it.
-- An attempt closed as 'interrupted' (job_interrupt: its worker stopped while the
-- handler ran, and held the row until its process was gone) is given back instead:
-- the job is pending again (never dead for it), its attempt not spent.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH expired AS MATERIALIZED (
    SELECT state.job_id, state.lease_version,
           EXISTS (
               SELECT FROM queue_attempts AS attempt
               WHERE attempt.job_id = state.job_id
                 AND attempt.lease_version = state.lease_version
                 AND attempt.status = 'interrupted'
           ) AS interrupted
    FROM queue_job_state AS state
    WHERE state.status = 'running' AND state.locked_until < now()
    ORDER BY state.job_id
    LIMIT %(limit)s::integer
    FOR UPDATE OF state SKIP LOCKED
), known AS MATERIALIZED (
    -- Each expired row's lease version and whether it was interrupted, as one object
    -- looked up per row (by key): joined to the rows updated, the CTE was scanned
    -- whole for each of them (1,000 expired leases: 999,000 rows compared, 150 ms).
    SELECT jsonb_object_agg(job_id::text, jsonb_build_array(lease_version, interrupted)) AS rows
    FROM expired
), swept AS (
    UPDATE queue_job_state AS state
    -- A job an operator asked to cancel while it ran ends cancelled, not requeued.
    SET status = CASE
            WHEN state.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN state.attempts >= state.max_attempts
                 AND NOT ((SELECT rows FROM known) -> state.job_id::text ->> 1)::boolean
            THEN 'dead'
            ELSE 'pending'
        END,
        finished_at = CASE
            WHEN state.cancel_requested_at IS NOT NULL
              OR (state.attempts >= state.max_attempts
                  AND NOT ((SELECT rows FROM known) -> state.job_id::text ->> 1)::boolean)
            THEN now()
        END,
        attempts = CASE
            WHEN ((SELECT rows FROM known) -> state.job_id::text ->> 1)::boolean
                 AND state.cancel_requested_at IS NULL
            THEN state.attempts - 1 ELSE state.attempts
        END,
        lease_version = state.lease_version + 1,
        last_error = CASE
            WHEN ((SELECT rows FROM known) -> state.job_id::text ->> 1)::boolean
            THEN 'interrupted: worker ' || state.locked_by
                 || ' stopped before the handler finished; the attempt was given back'
            ELSE 'lease expired: worker ' || state.locked_by
                 || ' stopped renewing it (crashed, frozen or cut off)'
        END,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = ANY (ARRAY(SELECT job_id FROM expired))
      AND state.lease_version = ((SELECT rows FROM known) -> state.job_id::text ->> 0)::bigint
      AND state.status = 'running'
      AND state.locked_until < now()
    -- lease_version is the new one here: the lost attempt's is one less.
    RETURNING state.job_id, state.queue, state.lease_version - 1 AS lost_version, state.status,
              state.has_dependents
), lost AS (
    -- The swept jobs' attempts by key, as above: no join to swept.
    UPDATE queue_attempts AS attempt
    SET status = 'lost',
        finished_at = now(),
        error_class = 'django_pgqueue.LeaseExpired',
        error_message = 'the lease ran out before the worker finished; the job was requeued'
    WHERE attempt.job_id = ANY (ARRAY(SELECT job_id FROM swept))
      AND attempt.lease_version = ((SELECT rows FROM known) -> attempt.job_id::text ->> 0)::bigint
      AND attempt.status = 'running'
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM swept WHERE status = 'pending') AS q
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM swept WHERE status <> 'pending')
), settled AS (
    -- workflows: a job the sweep ended dead or cancelled settles its dependents as failed
    SELECT pgqueue_settle(
        '{}', ARRAY(SELECT job_id FROM swept
                    WHERE has_dependents AND status IN ('dead', 'cancelled'))
    ) AS steps
    WHERE EXISTS (SELECT FROM swept WHERE has_dependents AND status IN ('dead', 'cancelled'))
)
SELECT swept.job_id, swept.queue, swept.lost_version, swept.status
FROM swept CROSS JOIN wake CROSS JOIN woken LEFT JOIN settled ON true;


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
-- Workflows: a step that still waits for a dependency (one unfinished, or retried in
-- this same call) goes back to waiting, not pending; a dead or cancelled job retried
-- counts as unfinished again for its dependents, and every dependent that has not
-- started waits for it again: pending ones, and those its failure cancelled; a retried
-- step forgets what cancelled it (pgqueue_unsettle, migration 0016), in this same
-- statement.
WITH candidate AS MATERIALIZED (
    SELECT state.job_id, state.queue, state.idempotency_key, state.status
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
    SET status = CASE
            WHEN EXISTS (
                SELECT FROM queue_workflow_steps AS step
                WHERE step.job_id = state.job_id AND step.waiting_for > 0
            ) OR EXISTS (
                SELECT FROM queue_job_deps AS dep
                WHERE dep.job_id = state.job_id
                  AND dep.depends_on IN (SELECT job_id FROM target)
            ) THEN 'waiting'
            ELSE 'pending'
        END,
        run_at = now(),
        attempts = 0,
        lease_version = state.lease_version + 1,
        finished_at = NULL,
        cancel_requested_at = NULL,
        updated_at = now()
    FROM target
    WHERE state.job_id = target.job_id
      AND state.status IN ('dead', 'cancelled', 'pending')
    RETURNING state.job_id, state.queue, state.has_dependents,
              EXISTS (SELECT FROM queue_workflow_steps AS step
                      WHERE step.job_id = state.job_id AND step.cancelled_by IS NOT NULL)
                  AS cancelled_by_dependency
), wake AS (
    SELECT count(pg_notify('pgqueue', queue)::text) AS queues
    FROM (SELECT DISTINCT queue FROM retried) AS q
), unsettled AS (
    -- The step rows are written by the function alone, one statement after another:
    -- a step row written twice in one statement (here and in the function) errors.
    SELECT pgqueue_unsettle(
        ARRAY(
            SELECT retried.job_id FROM retried
            JOIN candidate ON candidate.job_id = retried.job_id
            WHERE retried.has_dependents AND candidate.status IN ('dead', 'cancelled')
        ),
        ARRAY(SELECT job_id FROM retried WHERE cancelled_by_dependency)
    ) AS steps
    WHERE EXISTS (SELECT FROM retried WHERE has_dependents OR cancelled_by_dependency)
)
SELECT retried.job_id FROM retried CROSS JOIN wake LEFT JOIN unsettled ON true;


-- name: job_cancel
-- Operator cancel: pending and waiting jobs become cancelled. Running jobs are never touched.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH cancelled AS (
    UPDATE queue_job_state
    SET status = 'cancelled', finished_at = now(), updated_at = now()
    WHERE job_id = ANY(%(job_ids)s::bigint[])
      AND status IN ('pending', 'waiting')
    RETURNING job_id, has_dependents
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM cancelled)
), settled AS (
    -- workflows: the jobs cancelled settle their dependents as failed
    SELECT pgqueue_settle('{}', ARRAY(SELECT job_id FROM cancelled WHERE has_dependents))
        AS steps
    WHERE EXISTS (SELECT FROM cancelled WHERE has_dependents)
)
SELECT cancelled.job_id FROM cancelled CROSS JOIN woken LEFT JOIN settled ON true;


-- name: stats_by_queue
-- Count each queue's pending, running, dead, cancelled and waiting jobs, for the admin,
-- queue_stats and the metrics. Completed jobs, most of the table, are not read, and each count stops
-- at %(cap)s jobs per queue and status (reading as cap means "at least"), so a reading
-- costs the same with a backlog of ten thousand jobs or ten million.
-- The queues come from skip scans of the partial indexes (one probe per queue: the next
-- queue name after the last); then per queue, pending jobs and those due now are
-- counted from the claim index (index-only) up to the cap, and oldest_due_seconds is how
-- long the longest-waiting due job has been due: the claim index orders a queue's jobs
-- by priority, then run_at, so the oldest is the first job of one of its priorities,
-- found by a skip scan over the priorities (one probe each). Running jobs are at most
-- the workers' threads, counted in full from the running index; dead and cancelled jobs
-- from queue_job_state_failed_idx (index-only), up to the cap, and waiting workflow
-- steps from queue_job_state_waiting_idx, up to the cap. expired counts running
-- jobs whose lease has run out and that no sweep has requeued yet.
WITH RECURSIVE pending_queues AS (
    (SELECT queue FROM queue_job_state WHERE status = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT s.queue FROM queue_job_state s
            WHERE s.status = 'pending' AND s.queue > q.queue ORDER BY s.queue LIMIT 1)
    FROM pending_queues q
    WHERE q.queue IS NOT NULL
),
failed_queues AS (
    (SELECT queue FROM queue_job_state
     WHERE status IN ('dead', 'cancelled') ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT s.queue FROM queue_job_state s
            WHERE s.status IN ('dead', 'cancelled') AND s.queue > q.queue
            ORDER BY s.queue LIMIT 1)
    FROM failed_queues q
    WHERE q.queue IS NOT NULL
),
waiting_queues AS (
    (SELECT queue FROM queue_job_state WHERE status = 'waiting' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT s.queue FROM queue_job_state s
            WHERE s.status = 'waiting' AND s.queue > q.queue ORDER BY s.queue LIMIT 1)
    FROM waiting_queues q
    WHERE q.queue IS NOT NULL
)
SELECT q.queue, 'pending' AS status, c.jobs, c.due, 0 AS expired, o.oldest_due_seconds
FROM pending_queues q
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs, count(*) FILTER (WHERE s.run_at <= now()) AS due
    FROM (SELECT run_at FROM queue_job_state
          WHERE status = 'pending' AND queue = q.queue
          LIMIT %(cap)s::int8) s
) c
CROSS JOIN LATERAL (
    WITH RECURSIVE levels AS (
        (SELECT priority FROM queue_job_state
         WHERE status = 'pending' AND queue = q.queue ORDER BY priority DESC LIMIT 1)
        UNION ALL
        SELECT (SELECT s.priority FROM queue_job_state s
                WHERE s.status = 'pending' AND s.queue = q.queue AND s.priority < l.priority
                ORDER BY s.priority DESC LIMIT 1)
        FROM levels l
        WHERE l.priority IS NOT NULL
    )
    SELECT extract(epoch FROM now() - min(first.run_at))::float8 AS oldest_due_seconds
    FROM levels l
    CROSS JOIN LATERAL (
        SELECT run_at FROM queue_job_state
        WHERE status = 'pending' AND queue = q.queue AND priority = l.priority
        ORDER BY run_at LIMIT 1
    ) first
    WHERE l.priority IS NOT NULL AND first.run_at <= now()
) o
WHERE q.queue IS NOT NULL
UNION ALL
SELECT queue, 'running', count(*), 0, count(*) FILTER (WHERE locked_until < now()), NULL
FROM queue_job_state
WHERE status = 'running'
GROUP BY queue
UNION ALL
SELECT q.queue, f.status, c.jobs, 0, 0, NULL
FROM failed_queues q
CROSS JOIN (VALUES ('dead'), ('cancelled')) f (status)
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs
    FROM (SELECT 1 FROM queue_job_state
          WHERE status = f.status AND queue = q.queue
          LIMIT %(cap)s::int8) s
) c
WHERE q.queue IS NOT NULL AND c.jobs > 0
UNION ALL
-- Workflow steps waiting for their dependencies, from queue_job_state_waiting_idx.
SELECT q.queue, 'waiting', c.jobs, 0, 0, NULL
FROM waiting_queues q
CROSS JOIN LATERAL (
    SELECT count(*) AS jobs
    FROM (SELECT 1 FROM queue_job_state
          WHERE status = 'waiting' AND queue = q.queue
          LIMIT %(cap)s::int8) s
) c
WHERE q.queue IS NOT NULL;


-- name: stats_pending_types
-- Count each queue's pending jobs by type, for the check and the queue_stats lines that
-- find jobs no handler knows or no worker serves: (queue, type, jobs).
-- The queues come from a skip scan of the claim index (one probe per queue: the next
-- queue name after the last); per queue, at most %(cap)s pending jobs are read from the
-- claim index, each probed in queue_jobs for its type. So a reading costs the same with
-- a backlog of ten thousand jobs or ten million; a queue whose counts add up to the cap
-- has more jobs, and a type with jobs only beyond the ones read is not seen until the
-- queue drains to them. The probe's LIMIT 1 keeps it a primary-key probe per job: as a
-- join, PostgreSQL hashes the sample and reads all of queue_jobs. Sent after
-- stats_no_jit, in one transaction: the estimate (100 queues of cap jobs) is above
-- jit_above_cost, and compiling took 1.2 s where running takes milliseconds.
WITH RECURSIVE pending_queues AS (
    (SELECT queue FROM queue_job_state WHERE status = 'pending' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT s.queue FROM queue_job_state s
            WHERE s.status = 'pending' AND s.queue > q.queue ORDER BY s.queue LIMIT 1)
    FROM pending_queues q
    WHERE q.queue IS NOT NULL
)
SELECT q.queue, t.type, t.jobs
FROM pending_queues q
CROSS JOIN LATERAL (
    SELECT job.type, count(*) AS jobs
    FROM (SELECT job_id FROM queue_job_state
          WHERE status = 'pending' AND queue = q.queue
          LIMIT %(cap)s::int8) s
    CROSS JOIN LATERAL (
        SELECT type FROM queue_jobs WHERE id = s.job_id LIMIT 1
    ) job
    GROUP BY job.type
) t
WHERE q.queue IS NOT NULL
ORDER BY q.queue, t.type;


-- name: stats_no_jit
-- Turn JIT compilation off for the rest of the transaction: sent just before
-- stats_by_queue and stats_pending_types, whose skip scans look costly to the planner
-- (it guesses a hundred queues) and would be compiled for longer than they run.
SELECT set_config('jit', 'off', true);


-- name: stats_completed_by_queue
-- Count each queue's completed jobs exactly. Reads the whole table: for queue_stats --exact,
-- never for a page load.
SELECT queue, count(*) AS jobs
FROM queue_job_state
WHERE status = 'completed'
GROUP BY queue;


-- name: names_known
-- List the job types and queues the admin's filters and Queues page offer, as (kind,
-- name) with kind 'type' or 'queue'; queues with unfinished or failed jobs come from
-- stats_by_queue instead. Types: a skip scan of queue_jobs_type_idx (type, id), one
-- index probe for the next type above the last, at most `limit` types, so the cost
-- follows the number of types, not of jobs. Queues: those with controls, served by a
-- registered worker, fed by a schedule, in the last day's rollup, or holding the newest
-- job of a type (one backward probe of queue_jobs_type_idx per type). No part scans
-- the jobs: a queue whose jobs all completed long ago, under types that have since
-- moved to other queues, is the one that can be missed.
WITH RECURSIVE types (type, n) AS (
    (SELECT j.type, 1 FROM queue_jobs AS j ORDER BY j.type LIMIT 1)
    UNION ALL
    SELECT (SELECT j.type FROM queue_jobs AS j WHERE j.type > types.type
            ORDER BY j.type LIMIT 1),
           types.n + 1
    FROM types
    WHERE types.type IS NOT NULL AND types.n < %(limit)s::integer
)
SELECT 'type' AS kind, type AS name FROM types WHERE type IS NOT NULL
UNION ALL
SELECT 'queue', known.queue
FROM (
    SELECT queue FROM queue_controls
    UNION
    SELECT jsonb_array_elements_text(w.queues) FROM queue_workers AS w
    UNION
    SELECT queue FROM queue_schedules
    UNION
    SELECT r.queue FROM queue_stats_minutely AS r WHERE r.minute > now() - interval '1 day'
    UNION
    SELECT (SELECT j.queue FROM queue_jobs AS j WHERE j.type = types.type
            ORDER BY j.type DESC, j.id DESC LIMIT 1)
    FROM types
    WHERE types.type IS NOT NULL
) AS known (queue)
WHERE known.queue IS NOT NULL;


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


-- name: replica_lag
-- How stale a replica's data is: the time since the last transaction it replayed was
-- committed on the primary (pg_is_in_recovery: whether this server is a replica). The
-- lag is NULL on a primary, and on a replica that has replayed nothing yet.
SELECT pg_is_in_recovery() AS replica,
       extract(epoch FROM now() - pg_last_xact_replay_timestamp())::float8 AS lag_seconds;


-- name: queue_tables_missing
-- Name the queue's tables the database lacks, of those given (a worker does not start
-- on a database that was never migrated).
SELECT name FROM unnest(%(names)s::text[]) AS name WHERE to_regclass(name) IS NULL;


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
-- Count, by status, the jobs job_prune_batch would delete (a prune's dry run), in one
-- statement over the whole table, judged on its snapshot: job_prune_batch's units (a
-- batch's members and callbacks, a workflow's steps, or a plain job), each counted when
-- every job of it finished before the cutoff in a status asked for. It takes no lock:
-- a unit an operator holds at the moment of the prune is counted here and left by it.
-- Set-based (hash joins): it reads every step and batch member once, not a probe each.
WITH unit_job AS MATERIALIZED (
    -- Every job stored with others, with its unit: a batch (its members, and its
    -- callbacks: the steps of its workflow) as its id negated, else its workflow's id.
    SELECT member.job_id, -member.batch_id AS unit
    FROM queue_batch_jobs AS member
    UNION ALL
    SELECT step.job_id, coalesce(-batch.id, step.workflow_id)
    FROM queue_workflow_steps AS step
    LEFT JOIN queue_batches AS batch ON batch.workflow_id = step.workflow_id
), judged AS MATERIALIZED (
    SELECT state.job_id, state.status,
           state.status = ANY(%(statuses)s::text[])
               AND state.status IN ('completed', 'dead', 'cancelled')
               AND state.finished_at < %(cutoff)s::timestamptz AS due
    FROM queue_job_state AS state
), whole AS (
    SELECT unit_job.unit
    FROM unit_job
    JOIN judged USING (job_id)
    GROUP BY unit_job.unit
    HAVING bool_and(judged.due)
)
SELECT judged.status, count(*) AS jobs
FROM judged
LEFT JOIN unit_job USING (job_id)
WHERE judged.due
  AND (unit_job.unit IS NULL OR unit_job.unit IN (SELECT unit FROM whole))
GROUP BY judged.status;


-- name: workflow_prune_batch
-- Delete at most `limit` workflows created before the cutoff whose steps are all gone
-- (their jobs pruned: job_prune_batch deletes a workflow's steps all together),
-- walking the primary key upwards from after_id. A workflow's row and its steps are
-- written in one transaction, so a committed workflow has no step-less moment; the
-- cutoff keeps even a row mid-way out of reach. The steps' probe uses their
-- (workflow_id, name) unique index.
WITH doomed AS MATERIALIZED (
    SELECT wf.id
    FROM queue_workflows AS wf
    WHERE wf.id > %(after_id)s::bigint
      AND wf.created_at < %(cutoff)s::timestamptz
      AND NOT EXISTS (SELECT FROM queue_workflow_steps AS step WHERE step.workflow_id = wf.id)
    ORDER BY wf.id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
DELETE FROM queue_workflows AS wf
USING doomed
WHERE wf.id = doomed.id
RETURNING wf.id;


-- name: batch_prune_batch
-- Delete at most `limit` batches created before the cutoff whose members and callbacks
-- are all gone (pruned: job_prune_batch deletes them all together), walking
-- the primary key upwards from after_id; run after workflow_prune_batch, so a pruned
-- batch's callbacks' workflow is gone too (its workflow_id set NULL) or step-less. A
-- batch's row, members and callbacks are written in one transaction, and the cutoff
-- keeps even a row mid-way out of reach. The members' probe uses their batch_id index.
WITH doomed AS MATERIALIZED (
    SELECT batch.id
    FROM queue_batches AS batch
    WHERE batch.id > %(after_id)s::bigint
      AND batch.created_at < %(cutoff)s::timestamptz
      AND NOT EXISTS (SELECT FROM queue_batch_jobs AS member WHERE member.batch_id = batch.id)
      AND NOT EXISTS (SELECT FROM queue_workflow_steps AS callback
                      WHERE callback.workflow_id = batch.workflow_id)
    ORDER BY batch.id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
DELETE FROM queue_batches AS batch
USING doomed
WHERE batch.id = doomed.id
RETURNING batch.id;


-- name: job_prune_batch
-- Delete the next finished jobs older than the cutoff, each with its whole unit, and
-- their state and attempts; return (more, scanned_to, deleted by status).
-- A unit is what a job is stored with: a batch's members and callbacks (the steps of
-- the batch's workflow), else a workflow's steps, else the job alone. It goes whole or
-- not at all, so a step's parents and a batch's members stay as long as anything of
-- it does, and a step an operator's retry brings back finds them (invariant 4 of
-- docs/concepts/workflows.md). It goes when every job of it is completed, dead or
-- cancelled (whatever statuses the caller passes: a pending or running job is never
-- deleted), in a status asked for, and finished before the cutoff: judged on the
-- snapshot (whole), then on the rows the statement holds (held, doomed). Those are
-- locked FOR UPDATE SKIP LOCKED, which reads a row's latest version: a row an
-- operator's retry changed since the snapshot is judged on what the retry wrote, and
-- a row a retry holds now leaves its whole unit for a later run. A retry that comes
-- while a prune holds the unit waits (job_retry_now locks FOR UPDATE), then finds
-- the unit's jobs gone.
-- The walk goes up the primary key from after_id, `limit` candidates at a time; their
-- units are taken in walk order while their jobs fit in `limit` (a larger one goes
-- alone). scanned_to is where the next batch starts (the last candidate, or before the
-- first unit left for lack of room), more whether one may follow. The state rows go
-- with the jobs through queue_jobs' AFTER DELETE trigger (migration 0008), the
-- attempts, edges, steps and memberships through their ON DELETE CASCADE foreign
-- keys. Each batch is one short statement in its own transaction; no index over every
-- finished job is needed, which would weigh on the hot table.
WITH candidate AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE job_id > %(after_id)s::bigint
      AND status = ANY(%(statuses)s::text[])
      AND status IN ('completed', 'dead', 'cancelled')
      AND finished_at < %(cutoff)s::timestamptz
    ORDER BY job_id
    LIMIT %(limit)s::integer
), placed AS MATERIALIZED (
    -- Each candidate's batch (as a member, or as a callback: a step of the batch's
    -- workflow) and workflow, each a probe by key (a scalar subquery per candidate,
    -- never a hash of a whole table).
    SELECT candidate.job_id, placed.step_of,
           coalesce(placed.member_of, (SELECT batch.id FROM queue_batches AS batch
                                       WHERE batch.workflow_id = placed.step_of)) AS batch_id
    FROM candidate
    CROSS JOIN LATERAL (
        SELECT (SELECT member.batch_id FROM queue_batch_jobs AS member
                WHERE member.job_id = candidate.job_id) AS member_of,
               (SELECT step.workflow_id FROM queue_workflow_steps AS step
                WHERE step.job_id = candidate.job_id) AS step_of
        OFFSET 0  -- each probe runs once, not once per use of its value
    ) AS placed
), unit AS MATERIALIZED (
    -- Each candidate's unit, named by its first candidate: its batch, else its
    -- workflow, else the job alone.
    SELECT min(job_id) AS first, batch_id,
           CASE WHEN batch_id IS NULL THEN step_of END AS workflow_id,
           CASE WHEN batch_id IS NULL AND step_of IS NULL THEN job_id END AS job_id
    FROM placed
    GROUP BY 2, 3, 4
), unit_job AS MATERIALIZED (
    -- Every job of each unit, by key: the steps through their (workflow_id, name)
    -- index, the members through their batch_id index.
    SELECT unit.first, job.id
    FROM unit
    CROSS JOIN LATERAL (
        SELECT unit.job_id WHERE unit.job_id IS NOT NULL
        UNION ALL
        SELECT step.job_id FROM queue_workflow_steps AS step
        WHERE step.workflow_id = unit.workflow_id
        UNION ALL
        SELECT member.job_id FROM queue_batch_jobs AS member
        WHERE member.batch_id = unit.batch_id
        UNION ALL
        SELECT step.job_id FROM queue_workflow_steps AS step
        WHERE step.workflow_id = (SELECT batch.workflow_id FROM queue_batches AS batch
                                  WHERE batch.id = unit.batch_id)
    ) AS job(id)
), whole AS MATERIALIZED (
    -- The units every job of which qualifies on the snapshot, with their size. Each
    -- job's state row is one probe of its primary key (the scalar subquery).
    SELECT unit_job.first, count(*) AS jobs
    FROM unit_job
    GROUP BY unit_job.first
    HAVING bool_and(coalesce((
        SELECT state.status = ANY(%(statuses)s::text[])
               AND state.status IN ('completed', 'dead', 'cancelled')
               AND state.finished_at < %(cutoff)s::timestamptz
        FROM queue_job_state AS state
        WHERE state.job_id = unit_job.id), false))
), taken AS MATERIALIZED (
    -- In walk order, while the jobs fit in `limit`; the first always.
    SELECT first
    FROM (SELECT first, jobs, sum(jobs) OVER (ORDER BY first) AS upto FROM whole) AS sized
    WHERE upto <= %(limit)s::integer OR upto = jobs
), held AS MATERIALIZED (
    -- The taken units' state rows that still qualify, locked (see above).
    SELECT state.job_id, state.status
    FROM queue_job_state AS state
    WHERE state.job_id = ANY (ARRAY(SELECT unit_job.id FROM unit_job JOIN taken USING (first)))
      AND state.status = ANY(%(statuses)s::text[])
      AND state.status IN ('completed', 'dead', 'cancelled')
      AND state.finished_at < %(cutoff)s::timestamptz
    ORDER BY state.job_id
    FOR UPDATE SKIP LOCKED
), doomed AS MATERIALIZED (
    -- The taken units whose every row the statement holds.
    SELECT held.job_id, held.status
    FROM unit_job
    JOIN held ON held.job_id = unit_job.id
    WHERE unit_job.first IN (
        SELECT unit_job.first
        FROM unit_job
        JOIN taken USING (first)
        LEFT JOIN held ON held.job_id = unit_job.id
        GROUP BY unit_job.first
        HAVING count(held.job_id) = count(*)
    )
), deleted AS (
    DELETE FROM queue_jobs AS job
    WHERE job.id = ANY (ARRAY(SELECT job_id FROM doomed))
    RETURNING job.id
)
SELECT (SELECT count(*) FROM candidate) = %(limit)s::integer
           OR EXISTS (SELECT FROM whole WHERE first NOT IN (SELECT first FROM taken)) AS more,
       least((SELECT max(job_id) FROM candidate),
             (SELECT min(first) - 1 FROM whole WHERE first NOT IN (SELECT first FROM taken)))
           AS scanned_to,
       coalesce((SELECT jsonb_object_agg(status, jobs)
                 FROM (SELECT doomed.status, count(*) AS jobs
                       FROM deleted JOIN doomed ON doomed.job_id = deleted.id
                       GROUP BY doomed.status) AS counted),
                '{}') AS deleted;


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


-- Recurring jobs (django_pgqueue.schedules) ---------------------------------------------

-- name: schedule_list_for_queues
-- Read the enabled schedules of some queues, with the database's now(): what a worker
-- serving those queues may fire. The table holds one row per schedule, so = ANY is fine.
SELECT name, type, queue, cron, extract(epoch FROM every)::float8 AS every_seconds,
       timezone, catch_up, next_tick, now() AS db_now
FROM queue_schedules
WHERE enabled
  AND queue = ANY(%(queues)s::text[]);


-- name: schedule_advance
-- Move a schedule's next_tick without firing (first tick after a change, or skipped ticks).
-- Compare-and-set: only if next_tick still holds the value the caller read.
UPDATE queue_schedules
SET next_tick = %(next_tick)s::timestamptz, updated_at = now()
WHERE name = %(name)s::text
  AND next_tick IS NOT DISTINCT FROM %(expected)s::timestamptz
RETURNING name;


-- name: schedule_fire
-- Fire one due tick: move the schedule past it, record the tick and enqueue its job,
-- all or nothing. The UPDATE is a compare-and-set on next_tick (the value the worker
-- read): of several workers racing for a tick, the first to commit moves next_tick and
-- the others' UPDATE re-checks the row, finds it moved, and their statement does
-- nothing. The tick's primary key (schedule, tick_at) with ON CONFLICT DO NOTHING is
-- the second guard (a schedule whose next_tick was reset): the job rows are inserted
-- only for a tick row this statement inserted. The job is a normal job, inserted like
-- job_enqueue_keyed's (state row first, its id from the jobs' sequence), keyed by
-- (schedule, tick), and due now. Returns (job_id) or no row.
WITH advanced AS (
    UPDATE queue_schedules AS s
    SET next_tick = %(next_tick)s::timestamptz, last_tick = %(tick_at)s::timestamptz,
        updated_at = now()
    WHERE s.name = %(name)s::text
      AND s.enabled
      AND s.next_tick = %(expected)s::timestamptz
      AND %(tick_at)s::timestamptz <= now()
    RETURNING s.name, s.type, s.queue, s.payload, s.priority, s.max_attempts
), new_job AS (
    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, advanced.*
    FROM advanced
), tick AS (
    INSERT INTO queue_schedule_ticks (schedule, tick_at, job_id, missed, fired_at)
    SELECT new_job.name, %(tick_at)s::timestamptz, new_job.id, %(missed)s::integer, now()
    FROM new_job
    ON CONFLICT (schedule, tick_at) DO NOTHING
    RETURNING job_id
), state AS (
    INSERT INTO queue_job_state AS st (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, updated_at
    )
    SELECT new_job.id, new_job.queue, 'pending', new_job.priority, now(), 0,
           coalesce(new_job.max_attempts, %(default_max_attempts)s::integer), 0,
           %(idempotency_key)s::text, now()
    FROM new_job
    JOIN tick ON tick.job_id = new_job.id
    RETURNING st.job_id, st.queue
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at)
    SELECT new_job.id, new_job.queue, new_job.type, new_job.payload,
           %(idempotency_key)s::text, now()
    FROM new_job
    JOIN state ON state.job_id = new_job.id
    RETURNING id, queue
)
SELECT job.id, (SELECT pg_notify('pgqueue', job.queue)) IS NULL
FROM job;


-- name: schedule_code_newest
-- Note that a worker runs this set of code schedules (its fingerprint) now, and say
-- whether it is the newest set still running: first seen no earlier than every other
-- set a worker said it ran within the last `alive` seconds. Only the newest set's
-- workers write the code schedules, so during a rolling deploy they converge to the
-- new code whatever order the workers start in; once the workers of a newer set are
-- gone (a rollback, a withdrawn canary), the newest set left takes over.
WITH me AS (
    INSERT INTO queue_schedule_code AS c (fingerprint, first_seen, last_seen)
    VALUES (%(fingerprint)s::text, clock_timestamp(), clock_timestamp())
    ON CONFLICT (fingerprint) DO UPDATE SET last_seen = excluded.last_seen
    RETURNING c.first_seen
)
SELECT (SELECT first_seen FROM me) >= coalesce((
    SELECT max(first_seen) FROM queue_schedule_code
    WHERE fingerprint <> %(fingerprint)s::text
      AND last_seen > clock_timestamp() - make_interval(secs => %(alive)s::float8)
), '-infinity'::timestamptz);


-- name: schedule_sync
-- Upsert one schedule declared in code, by name. A schedule created in the admin
-- (source 'db') keeps its definition: code does not take it over (no row back).
-- next_tick is reset (the next firing worker sets it from now()) when the timing
-- changed or a schedule removed from code comes back; removed ones come back enabled.
INSERT INTO queue_schedules AS s (
    name, type, queue, cron, every, payload, timezone, catch_up, priority, max_attempts,
    enabled, source, next_tick, last_tick, created_at, updated_at
)
VALUES (
    %(name)s::text, %(type)s::text, %(queue)s::text, %(cron)s::text,
    make_interval(secs => %(every_seconds)s::float8), %(payload)s::jsonb, %(timezone)s::text,
    %(catch_up)s::text, %(priority)s::smallint, %(max_attempts)s::integer,
    true, 'code', NULL, NULL, now(), now()
)
ON CONFLICT (name) DO UPDATE
SET type = excluded.type, queue = excluded.queue, cron = excluded.cron,
    every = excluded.every, payload = excluded.payload, timezone = excluded.timezone,
    catch_up = excluded.catch_up, priority = excluded.priority,
    max_attempts = excluded.max_attempts,
    enabled = s.enabled OR s.source = 'removed',
    next_tick = CASE
        WHEN s.source = 'removed'
          OR (s.cron, s.every, s.timezone)
             IS DISTINCT FROM (excluded.cron, excluded.every, excluded.timezone)
        THEN NULL ELSE s.next_tick END,
    source = 'code',
    updated_at = now()
WHERE s.source <> 'db'
RETURNING name;


-- name: schedule_disable_removed
-- Disable the code schedules no longer declared in code (their history stays).
UPDATE queue_schedules
SET enabled = false, source = 'removed', updated_at = now()
WHERE source = 'code'
  AND name <> ALL(%(names)s::text[])
RETURNING name;


-- name: schedule_late
-- List enabled schedules whose due tick has not fired within `seconds` (2 poll
-- intervals): no worker serves their queue, or every worker that does is down or
-- stuck. A schedule that never got its first next_tick counts from its last change.
SELECT name, queue, coalesce(next_tick, updated_at) AS due_at,
       extract(epoch FROM now() - coalesce(next_tick, updated_at))::float8 AS late_seconds
FROM queue_schedules
WHERE enabled
  AND coalesce(next_tick, updated_at) < now() - make_interval(secs => %(seconds)s::float8)
ORDER BY due_at, name;


-- Issue 15: the worker registry and the per-minute rollup (django_pgqueue/observability).
-- Observation only: nothing below decides who owns a job (leases do).


-- name: worker_upsert
-- Record that a worker is alive (its heartbeat runs this every cycle), with how many jobs it runs.
-- One statement on the heartbeat's own connection; last_seen_at is the database's
-- clock. A worker marked gone that reports again (a partition healed) is alive again.
INSERT INTO queue_workers AS w (
    id, host, pid, queues, concurrency, lease_seconds, version, running,
    started_at, last_seen_at, gone_at
)
VALUES (
    %(id)s::text, %(host)s::text, %(pid)s::integer, %(queues)s::jsonb, %(concurrency)s::integer,
    %(lease)s::float8, %(version)s::text, %(running)s::integer, now(), now(), NULL
)
ON CONFLICT (id) DO UPDATE
SET last_seen_at = now(), running = excluded.running, gone_at = NULL;


-- name: worker_stopped
-- Mark a worker gone as it stops (its own shutdown); its row stays until worker_prune.
UPDATE queue_workers
SET gone_at = now(), last_seen_at = now(), running = 0
WHERE id = %(id)s::text;


-- name: worker_mark_gone
-- Mark gone the workers whose heartbeat has not been seen for two of their leases.
-- Any worker's heartbeat may run it; the table holds one row per worker process, so
-- reading it whole is cheap. Returns the ids marked.
UPDATE queue_workers
SET gone_at = now()
WHERE gone_at IS NULL
  AND last_seen_at < now() - make_interval(secs => 2 * lease_seconds)
RETURNING id;


-- name: worker_prune
-- Delete workers gone for longer than keep_seconds, and rollup minutes older than keep_minutes.
WITH workers AS (
    DELETE FROM queue_workers
    WHERE gone_at < now() - make_interval(secs => %(keep_seconds)s::float8)
    RETURNING id
), minutes AS (
    DELETE FROM queue_stats_minutely
    WHERE minute < now() - make_interval(mins => %(keep_minutes)s::integer)
    RETURNING id
)
SELECT (SELECT count(*) FROM workers), (SELECT count(*) FROM minutes);


-- name: worker_list
-- List the registered workers, live ones first, with whether each is alive now.
-- Alive means not marked gone and seen within two of its leases (a worker that died
-- without a word counts as gone before any heartbeat has marked it).
SELECT id, host, pid, queues, concurrency, lease_seconds, version, running,
       started_at, last_seen_at, gone_at,
       (gone_at IS NULL AND last_seen_at >= now() - make_interval(secs => 2 * lease_seconds))
           AS alive,
       extract(epoch FROM now() - last_seen_at)::float8 AS seen_seconds_ago
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
SELECT count(*) FILTER (
           WHERE gone_at IS NULL
             AND last_seen_at >= now() - make_interval(secs => 2 * lease_seconds)
       ) AS alive,
       count(*) FILTER (
           WHERE NOT (gone_at IS NULL
                      AND last_seen_at >= now() - make_interval(secs => 2 * lease_seconds))
       ) AS gone
FROM queue_workers;


-- name: stats_minute_add
-- Add the attempts a worker finished to their minute's rollup rows, one upsert for a batch.
-- The arrays are parallel, one element per attempt whose outcome was written: its id,
-- queue, run_at as claimed, and outcome (succeeded, retried or dead). The wait is the
-- attempt's start (the database's clock at the claim) minus the run_at it was claimed
-- at, counted into the buckets of `bounds` (width_bucket: 0 below the first bound).
-- Each attempt is read by primary key. Two workers adding to one minute serialize on
-- its row for the length of this statement only.
WITH finished AS (
    SELECT date_trunc('minute', a.finished_at) AS minute, i.queue, i.outcome,
           greatest(extract(epoch FROM a.started_at - i.run_at)::float8, 0) AS wait
    FROM unnest(
        %(attempt_ids)s::bigint[], %(queues)s::text[], %(run_ats)s::timestamptz[],
        %(outcomes)s::text[]
    ) AS i(attempt_id, queue, run_at, outcome)
    JOIN queue_attempts AS a ON a.id = i.attempt_id
    WHERE a.finished_at IS NOT NULL
), per_bucket AS (
    SELECT minute, queue, width_bucket(wait, %(bounds)s::float8[]) AS bucket,
           count(*) AS attempts,
           count(*) FILTER (WHERE outcome = 'succeeded') AS completed,
           count(*) FILTER (WHERE outcome = 'retried') AS retried,
           count(*) FILTER (WHERE outcome = 'dead') AS dead,
           sum(wait) AS wait_sum
    FROM finished
    GROUP BY 1, 2, 3
), per_minute AS (
    SELECT k.minute, k.queue,
           coalesce(sum(p.completed), 0)::integer AS completed,
           coalesce(sum(p.retried), 0)::integer AS retried,
           coalesce(sum(p.dead), 0)::integer AS dead,
           coalesce(sum(p.wait_sum), 0)::float8 AS wait_sum,
           array_agg(coalesce(p.attempts, 0)::integer ORDER BY b.bucket) AS buckets
    FROM (SELECT DISTINCT minute, queue FROM per_bucket) AS k
    CROSS JOIN generate_series(0, cardinality(%(bounds)s::float8[])) AS b(bucket)
    LEFT JOIN per_bucket AS p
        ON p.minute = k.minute AND p.queue = k.queue AND p.bucket = b.bucket
    GROUP BY k.minute, k.queue
)
INSERT INTO queue_stats_minutely AS r (
    minute, queue, completed, retried, dead, wait_seconds_sum, wait_buckets
)
SELECT minute, queue, completed, retried, dead, wait_sum, buckets
FROM per_minute
ORDER BY minute, queue
ON CONFLICT (minute, queue) DO UPDATE
SET completed = r.completed + excluded.completed,
    retried = r.retried + excluded.retried,
    dead = r.dead + excluded.dead,
    wait_seconds_sum = r.wait_seconds_sum + excluded.wait_seconds_sum,
    wait_buckets = ARRAY(
        SELECT old + new
        FROM unnest(r.wait_buckets, excluded.wait_buckets) WITH ORDINALITY AS u(old, new, n)
        ORDER BY n
    );


-- name: stats_minute_range
-- Read the rollup rows of the last `minutes` minutes, oldest first, with the current minute.
-- A range walk of queue_stats_minutely_key (minute, queue), in its order: no sort,
-- never a read of queue_attempts.
SELECT date_trunc('minute', now()) AS now_minute, r.minute, r.queue, r.completed, r.retried,
       r.dead, r.wait_seconds_sum, r.wait_buckets
FROM queue_stats_minutely AS r
WHERE r.minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s::integer)
ORDER BY r.minute, r.queue;


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


-- Queue control: pause, concurrency limits, concurrency keys, rate limits,
-- snooze and cancelling a running job. A queue without a queue_controls row never
-- runs any of these on its claim path: it claims with job_claim above, which only
-- leaves jobs with a concurrency key alone.


-- name: queue_control_lock
-- Lock a controlled queue's row until the transaction ends: its claimers take turns.
-- Sent in one pipeline and one transaction with job_claim_controlled (and
-- queue_control_state) right after it. The count of running jobs must be in that next
-- statement, not here: in READ COMMITTED a statement that waited for a row lock
-- re-reads only the locked row, every other table and subquery keeps the snapshot it
-- took before waiting, so a count taken here would miss the jobs the previous lock
-- holder claimed. The next statement takes a fresh snapshot after the lock: it sees
-- every claim that holder committed.
SELECT queue FROM queue_controls WHERE queue = %(queue)s::text FOR NO KEY UPDATE;


-- name: transaction_guard
-- Bound how long this transaction may wait on its own client: the first statement of
-- a controlled claim's pipeline. The queue lock stalls every claimer of the queue
-- while it is held, and the completions sent before it hold their rows (the sweep
-- skips locked rows), so the transaction must not outlive its client: a worker frozen
-- (SIGSTOP, a partition) between two messages of the pipeline would otherwise hold
-- them until TCP keepalives noticed. The transaction-local
-- idle_in_transaction_session_timeout ends such a session after `idle_ms`; the
-- worker reconnects when it wakes and reads back what it had sent. Local to the
-- transaction, so nothing outlives it on a pooled connection.
SELECT set_config('idle_in_transaction_session_timeout', %(idle_ms)s::text, true);


-- name: job_claim_controlled
-- Claim up to `limit` due jobs of a controlled queue, within its pause, limits and rate.
-- Runs after queue_control_lock in the same transaction, so no other claim of this
-- queue runs at the same time. Slots are not counters: running jobs are counted, so
-- the fenced write that ends an attempt (complete, fail, snooze, release) or the sweep
-- that takes an expired lease frees the slot by changing the status, and a stale
-- worker's rejected write frees nothing. Budget = least(limit, concurrency_limit -
-- running, rate_count - starts in the last rate_period); 0 while paused. Per key:
-- a walked job is eligible while its key's running jobs plus the earlier walked
-- jobs of that key stay under key_limit, counted once per key (running_keys) and by
-- rank (a window over the walked jobs: a sort of at most `scan` rows), so the check is
-- linear in the walk, not quadratic. The walk is the ordered scan of the claim index
-- of job_claim: it passes over the jobs of keys already at their limit (reading at
-- most `read` jobs) and keeps at most `scan` (>= limit) others. The rate
-- window keeps the last start times in queue_controls.rate_starts, oldest first: a
-- start at t is allowed only while fewer than rate_count starts are later than
-- t - rate_period, which is exact for every window of that length because t comes
-- from clock_timestamp() under the queue lock (it only grows). started_at of the
-- attempts is that same t. Rows come back unordered, like job_claim's.
-- Only the controlled steps stand here: sql/__init__.py puts job_claim's claimed and
-- opened steps (the attempts starting at budget.at) and its rows at the two marks,
-- so both claims take a job the same way.
WITH budget AS MATERIALIZED (
    SELECT CASE WHEN c.paused THEN 0 ELSE GREATEST(0, LEAST(
               %(limit)s::integer,
               c.concurrency_limit - (
                   SELECT count(*) FROM queue_job_state AS r
                   WHERE r.queue = %(queue)s::text AND r.status = 'running'
               ),
               c.rate_count - (
                   SELECT count(*) FROM unnest(c.rate_starts) AS s(at)
                   WHERE s.at > clock.at - make_interval(secs => c.rate_period)
               )
           )) END AS n,
           coalesce(c.key_limit, 1) AS key_limit,
           clock.at
    FROM (SELECT clock_timestamp() AS at) AS clock
    LEFT JOIN queue_controls AS c ON c.queue = %(queue)s::text
), typed AS MATERIALIZED (
    -- The queue's per-type limits (most queues have none): each type's key limit, and
    -- the starts its rate window still admits.
    SELECT t.type, t.key_limit,
           t.rate_count - (
               SELECT count(*) FROM unnest(t.rate_starts) AS s(at)
               WHERE s.at > budget.at - make_interval(secs => t.rate_period)
           ) AS room
    FROM queue_type_controls AS t, budget
    WHERE t.queue = %(queue)s::text
), saturated AS MATERIALIZED (
    -- The keys already at the queue's key limit (from the running jobs' key index):
    -- the walk passes over their jobs without counting them against its bound, so a
    -- key with a long backlog does not hide the other keys behind it. Not when the
    -- queue has per-type limits, whose key limits may differ by type.
    SELECT r.concurrency_key
    FROM queue_job_state AS r
    WHERE r.queue = %(queue)s::text
      AND r.status = 'running'
      AND r.concurrency_key IS NOT NULL
      AND NOT EXISTS (SELECT FROM typed)
    GROUP BY r.concurrency_key
    HAVING count(*) >= (SELECT key_limit FROM budget)
), walk AS MATERIALIZED (
    -- row_number() OVER () numbers the rows in the order the ordered scan yields them.
    -- The scan reads at most `read` jobs and keeps at most `scan` of them (those of keys
    -- not at their limit). A walked job's type is read (one primary-key probe) only
    -- when the queue has per-type limits.
    SELECT ordered.job_id, ordered.concurrency_key, ordered.type, row_number() OVER () AS pos
    FROM (
        SELECT s.job_id, s.concurrency_key,
               CASE WHEN EXISTS (SELECT FROM typed)
                    THEN (SELECT j.type FROM queue_jobs AS j
                          WHERE j.id = s.job_id AND j.queue = %(queue)s::text) END AS type
        FROM (
            SELECT s.job_id, s.concurrency_key
            FROM queue_job_state AS s
            WHERE s.queue = %(queue)s::text
              AND s.status = 'pending'
              AND s.run_at <= now()
            ORDER BY s.priority DESC, s.run_at, s.job_id
            LIMIT (SELECT CASE WHEN n > 0 THEN %(read)s::integer ELSE 0 END FROM budget)
        ) AS s
        -- NOT IN a subquery: one hashed lookup per job, however many keys are saturated
        -- (the keys are never NULL).
        WHERE s.concurrency_key IS NULL
           OR s.concurrency_key NOT IN (SELECT concurrency_key FROM saturated)
        LIMIT %(scan)s::integer
    ) AS ordered
), running_keys AS MATERIALIZED (
    -- The running jobs of each key the walk met, counted once per key.
    SELECT r.concurrency_key, count(*) AS n
    FROM queue_job_state AS r
    WHERE r.queue = %(queue)s::text
      AND r.status = 'running'
      AND r.concurrency_key = ANY (ARRAY(
          SELECT DISTINCT w.concurrency_key FROM walk AS w WHERE w.concurrency_key IS NOT NULL
      ))
    GROUP BY r.concurrency_key
), ranked AS (
    -- Each walked job's place among the walked jobs of its key, and of its type.
    SELECT walk.job_id, walk.pos, walk.concurrency_key, walk.type,
           row_number() OVER (PARTITION BY walk.concurrency_key ORDER BY walk.pos) AS key_rank,
           row_number() OVER (PARTITION BY walk.type ORDER BY walk.pos) AS type_rank
    FROM walk
), eligible AS (
    -- Within its key's limit (its type's, else the queue's), counting the key's running
    -- jobs and the jobs of that key walked before it; and within its type's rate window,
    -- counting the jobs of that type walked before it.
    SELECT ranked.job_id, ranked.pos
    FROM ranked
    LEFT JOIN running_keys AS rk ON rk.concurrency_key = ranked.concurrency_key
    LEFT JOIN typed ON typed.type = ranked.type
    WHERE (ranked.concurrency_key IS NULL
           OR coalesce(rk.n, 0) + ranked.key_rank
              <= coalesce(typed.key_limit, (SELECT key_limit FROM budget)))
      AND (ranked.type IS NULL OR coalesce(ranked.type_rank <= typed.room, true))
), candidates AS MATERIALIZED (
    -- The eligible jobs in walk order, up to the budget; each is locked and re-checked
    -- (an operator may have cancelled it since the walk's snapshot).
    SELECT job_id
    FROM queue_job_state
    WHERE job_id = ANY (ARRAY(
        SELECT job_id FROM eligible ORDER BY pos LIMIT (SELECT n FROM budget)
    ))
      AND queue = %(queue)s::text  -- the shard, on Citus; here a check of the row found
      AND status = 'pending'
    FOR UPDATE SKIP LOCKED
-- job_claim_controlled: job_claim's claimed and opened steps
), started AS (
    -- The rate window: the starts still inside it, then this claim's, oldest first.
    -- Rewritten when this claim started jobs, or when its oldest start has left the
    -- window (so that the array only holds starts inside it: queue_control_state reads
    -- a full array as a full window).
    UPDATE queue_controls AS c
    SET rate_starts = ARRAY(
            SELECT s.at FROM unnest(c.rate_starts) AS s(at)
            WHERE s.at > budget.at - make_interval(secs => c.rate_period)
        ) || array_fill(budget.at, ARRAY[(SELECT count(*) FROM claimed)::integer])
    FROM budget
    WHERE c.queue = %(queue)s::text
      AND c.rate_count IS NOT NULL
      AND (EXISTS (SELECT FROM claimed)
           OR c.rate_starts[1] <= budget.at - make_interval(secs => c.rate_period))
), type_started AS (
    -- The same for each type with a rate of its own.
    UPDATE queue_type_controls AS t
    SET rate_starts = ARRAY(
            SELECT s.at FROM unnest(t.rate_starts) AS s(at)
            WHERE s.at > budget.at - make_interval(secs => t.rate_period)
        ) || array_fill(budget.at, ARRAY[(
            SELECT count(*) FROM claimed JOIN walk ON walk.job_id = claimed.job_id
            WHERE walk.type = t.type)::integer])
    FROM budget
    WHERE t.queue = %(queue)s::text
      AND t.rate_count IS NOT NULL
      AND (t.type IN (SELECT walk.type FROM claimed JOIN walk ON walk.job_id = claimed.job_id)
           OR t.rate_starts[1] <= budget.at - make_interval(secs => t.rate_period))
)
-- job_claim_controlled: job_claim's rows
;


-- name: queue_control_state
-- Say why a controlled queue's claim may have come back short, after the claim.
-- Runs last in the claim's transaction (it sees that claim's writes). Returns
-- (paused, full: running >= concurrency_limit, rate_wait: seconds until a full rate
-- window (the queue's, or the soonest of its types') admits the next start, 0 when one
-- filled at the claim has room again already, or NULL when none was full; keyed: the
-- queue has keyed jobs, whose keys' slots free when any worker's job ends). The claim
-- trims every window whose oldest start has left it, so a full array is a window that
-- was full at the claim: an expired one would read as "0 s" for ever, and the worker
-- would claim an empty queue in a loop.
SELECT c.paused,
       coalesce(c.concurrency_limit <= (
           SELECT count(*) FROM queue_job_state AS r
           WHERE r.queue = c.queue AND r.status = 'running'
       ), false) AS full,
       least(
           (SELECT greatest(0.0, extract(epoch FROM
                       s.at + make_interval(secs => c.rate_period) - clock_timestamp()))::float8
            FROM unnest(c.rate_starts) WITH ORDINALITY AS s(at, n)
            WHERE c.rate_count IS NOT NULL
              AND cardinality(c.rate_starts) >= c.rate_count
              AND s.n = cardinality(c.rate_starts) - c.rate_count + 1),
           (SELECT min(greatest(0.0, extract(epoch FROM
                       t.rate_starts[cardinality(t.rate_starts) - t.rate_count + 1]
                       + make_interval(secs => t.rate_period) - clock_timestamp())))::float8
            FROM queue_type_controls AS t
            WHERE t.queue = c.queue
              AND t.rate_count IS NOT NULL
              AND cardinality(t.rate_starts) >= t.rate_count)
       ) AS rate_wait,
       c.keyed
FROM queue_controls AS c
WHERE c.queue = %(queue)s::text;


-- name: queue_control_list
-- List the queues whose claims must go through job_claim_controlled (a worker's
-- per-poll view); every other queue claims with job_claim.
SELECT queue
FROM queue_controls AS c
WHERE paused OR concurrency_limit IS NOT NULL OR rate_count IS NOT NULL OR keyed
   OR EXISTS (SELECT FROM queue_type_controls AS t
              WHERE t.queue = c.queue AND t.rate_count IS NOT NULL);


-- name: queue_control_sync
-- Write one queue's PGQUEUE["QUEUES"] entry at worker start, unless it is the entry
-- written last time. `configured` remembers that entry: a run-time edit (admin,
-- queue_control, the Python API) stands until the setting itself changes; workers
-- restarting with the same settings leave it alone. Pause is never set by settings.
INSERT INTO queue_controls AS c (
    queue, paused, concurrency_limit, key_limit, rate_count, rate_period, rate_starts,
    keyed, configured, updated_at
)
VALUES (
    %(queue)s::text, false, %(concurrency_limit)s::integer, %(key_limit)s::integer,
    %(rate_count)s::integer, %(rate_period)s::float8, '{}', false, %(configured)s::jsonb, now()
)
ON CONFLICT (queue) DO UPDATE
SET concurrency_limit = excluded.concurrency_limit,
    key_limit = excluded.key_limit,
    rate_count = excluded.rate_count,
    rate_period = excluded.rate_period,
    configured = excluded.configured,
    updated_at = now()
WHERE c.configured IS DISTINCT FROM excluded.configured
RETURNING queue;


-- name: queue_control_update
-- Change a queue's controls at run time, creating its row if needed.
-- Each set_* flag says whether its value is written (a NULL value removes that limit);
-- paused is written unless NULL. Returns the row as it now is. queue_type_control_update
-- writes a type's key limit and rate with this statement's text for them.
INSERT INTO queue_controls AS c (
    queue, paused, concurrency_limit, key_limit, rate_count, rate_period, rate_starts,
    keyed, updated_at
)
VALUES (
    %(queue)s::text, coalesce(%(paused)s::boolean, false),
    CASE WHEN %(set_limit)s::boolean THEN %(concurrency_limit)s::integer END,
    CASE WHEN %(set_key_limit)s::boolean THEN %(key_limit)s::integer ELSE 1 END,
    CASE WHEN %(set_rate)s::boolean THEN %(rate_count)s::integer END,
    CASE WHEN %(set_rate)s::boolean THEN %(rate_period)s::float8 END,
    '{}', false, now()
)
ON CONFLICT (queue) DO UPDATE
SET paused = coalesce(%(paused)s::boolean, c.paused),
    concurrency_limit = CASE WHEN %(set_limit)s::boolean THEN %(concurrency_limit)s::integer
                             ELSE c.concurrency_limit END,
    key_limit = CASE WHEN %(set_key_limit)s::boolean THEN %(key_limit)s::integer
                     ELSE c.key_limit END,
    rate_count = CASE WHEN %(set_rate)s::boolean THEN %(rate_count)s::integer
                      ELSE c.rate_count END,
    rate_period = CASE WHEN %(set_rate)s::boolean THEN %(rate_period)s::float8
                       ELSE c.rate_period END,
    updated_at = now()
RETURNING c.queue, c.paused, c.concurrency_limit, c.key_limit, c.rate_count, c.rate_period;


-- name: queue_control_show
-- List every controlled queue with its running jobs, the starts in its rate window and
-- its per-type limits (a JSON array, by type).
SELECT c.queue, c.paused, c.concurrency_limit, c.key_limit, c.rate_count, c.rate_period,
       c.keyed, c.configured, c.updated_at,
       (SELECT count(*) FROM queue_job_state AS r
        WHERE r.queue = c.queue AND r.status = 'running') AS running,
       (SELECT count(*) FROM unnest(c.rate_starts) AS s(at)
        WHERE s.at > now() - make_interval(secs => c.rate_period)) AS recent_starts,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'type', t.type, 'key_limit', t.key_limit, 'rate_count', t.rate_count,
                   'rate_period', t.rate_period) ORDER BY t.type), '[]')::text
        FROM queue_type_controls AS t WHERE t.queue = c.queue) AS types
FROM queue_controls AS c
ORDER BY c.queue;


-- name: queue_type_control_sync
-- Replace a queue's per-type limits with its PGQUEUE["QUEUES"] entry's `types`
-- ({type: {key_limit, rate_count, rate_period}}), keeping the rate windows of the types
-- that stay. Run with queue_control_sync, when that entry changed.
WITH wanted AS (
    SELECT w.key AS type,
           (w.value ->> 'key_limit')::integer AS key_limit,
           (w.value ->> 'rate_count')::integer AS rate_count,
           (w.value ->> 'rate_period')::float8 AS rate_period
    FROM jsonb_each(%(types)s::jsonb) AS w
), dropped AS (
    DELETE FROM queue_type_controls AS t
    WHERE t.queue = %(queue)s::text AND t.type NOT IN (SELECT type FROM wanted)
)
INSERT INTO queue_type_controls AS t (
    queue, type, key_limit, rate_count, rate_period, rate_starts, updated_at
)
SELECT %(queue)s::text, type, key_limit, rate_count, rate_period, '{}', now()
FROM wanted
ON CONFLICT (queue, type) DO UPDATE
SET key_limit = excluded.key_limit,
    rate_count = excluded.rate_count,
    rate_period = excluded.rate_period,
    updated_at = now();


-- name: queue_type_control_update
-- Change one type's limits within a queue at run time, creating its row if needed.
-- Like queue_control_update: each set_* flag says whether its value is written (NULL
-- removes that limit). Returns the row as it now is.
-- The key limit and rate are written as queue_control_update writes them (sql/__init__.py
-- puts its text at the mark); the row is c there too.
INSERT INTO queue_type_controls AS c (
    queue, type, key_limit, rate_count, rate_period, rate_starts, updated_at
)
VALUES (
    %(queue)s::text, %(type)s::text,
    CASE WHEN %(set_key_limit)s::boolean THEN %(key_limit)s::integer END,
    CASE WHEN %(set_rate)s::boolean THEN %(rate_count)s::integer END,
    CASE WHEN %(set_rate)s::boolean THEN %(rate_period)s::float8 END,
    '{}', now()
)
ON CONFLICT (queue, type) DO UPDATE
SET
    -- queue_type_control_update: queue_control_update's key limit and rate
RETURNING c.queue, c.type, c.key_limit, c.rate_count, c.rate_period;


-- name: queue_type_control_prune
-- Remove a type's row once it limits nothing (so the queue's claims stop reading types).
DELETE FROM queue_type_controls
WHERE queue = %(queue)s::text AND type = %(type)s::text
  AND key_limit IS NULL AND rate_count IS NULL;


-- name: job_give_back
-- Put a job a worker still owns back to pending at now() + delay, giving its attempt
-- back: a snooze, or an attempt the worker's own shutdown interrupted. The attempt row
-- is closed with %(attempt_status)s ('snoozed' or 'interrupted'); lease_version grows
-- at the next claim as always. A job an operator asked to cancel ends cancelled
-- instead. Fenced; returns the new status and run_at, or no row when the lease was lost.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle, migration 0011), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH snoozed AS (
    UPDATE queue_job_state AS state
    SET status = CASE WHEN state.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        run_at = CASE
            WHEN state.cancel_requested_at IS NULL
            THEN now() + make_interval(secs => %(delay)s::float8)
            ELSE state.run_at
        END,
        attempts = CASE
            WHEN state.cancel_requested_at IS NULL THEN state.attempts - 1 ELSE state.attempts
        END,
        finished_at = CASE WHEN state.cancel_requested_at IS NOT NULL THEN now() END,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = %(job_id)s::bigint
      AND state.lease_version = %(lease_version)s::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.status, state.run_at, state.has_dependents
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = %(attempt_status)s::text,
        finished_at = now(),
        error_class = %(error_class)s::text,
        error_message = %(reason)s::text
    WHERE attempt.id = %(attempt_id)s::bigint
      AND EXISTS (SELECT FROM snoozed)
), woken AS (
    -- Wake the wait() callers of these jobs (see job_waiter_add).
    SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
    FROM queue_job_waiters AS w
    WHERE w.job_id IN (SELECT job_id FROM snoozed WHERE status = 'cancelled')
), settled AS (
    -- workflows: a job that ended cancelled settles its dependents as failed
    SELECT pgqueue_settle('{}', ARRAY[%(job_id)s::bigint]) AS steps
    WHERE EXISTS (
        SELECT FROM snoozed WHERE snoozed.has_dependents AND snoozed.status = 'cancelled'
    )
)
SELECT status, run_at FROM snoozed CROSS JOIN woken LEFT JOIN settled ON true;


-- name: job_hold_tables
-- Open the hold (job_hold) with the table locks its final give-back (job_give_back)
-- needs: taken now, a DDL statement queued meanwhile cannot deadlock the give-back.
LOCK TABLE queue_job_state, queue_attempts IN ROW EXCLUSIVE MODE;


-- name: job_hold
-- Lock the rows of running jobs whose handlers a stopping worker gave up on but cannot
-- stop (they end with its process): FOR KEY SHARE, on a connection of the worker's own,
-- in a transaction it leaves open until the handlers returned or the process is gone.
-- The sweep (FOR UPDATE SKIP LOCKED) passes over them meanwhile, so neither the job
-- nor its slot under a queue or key limit goes to anyone else while its handler may
-- still run; the worker's own fenced writes (FOR NO KEY UPDATE) are not held up.
SELECT state.job_id
FROM queue_job_state AS state
WHERE state.job_id = ANY (%(job_ids)s::bigint[])
  AND state.lease_version = (%(owned)s::jsonb ->> state.job_id::text)::bigint
  AND state.status = 'running'
FOR KEY SHARE;


-- name: job_interrupt
-- Record that the worker's own shutdown interrupted a job whose handler still runs,
-- on a row the worker holds (job_hold): the attempt is closed as 'interrupted' (given
-- back, not spent) and the lease ends now, but the row stays running, its slot held.
-- The worker gives the job back once the handler returned (job_give_back, on the
-- holding connection); if its process ends first, the hold goes with it and the
-- sweep gives the attempt back. Fenced; returns the status and run_at, or no row
-- when the lease was lost.
WITH ended AS (
    UPDATE queue_job_state AS state
    SET locked_until = now(), updated_at = now()
    WHERE state.job_id = %(job_id)s::bigint
      AND state.lease_version = %(lease_version)s::bigint
      AND state.status = 'running'
    RETURNING state.status, state.run_at
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = 'interrupted',
        finished_at = now(),
        error_class = %(error_class)s::text,
        error_message = %(reason)s::text
    WHERE attempt.id = %(attempt_id)s::bigint
      AND EXISTS (SELECT FROM ended)
)
SELECT status, run_at FROM ended;


-- name: job_cancel_request
-- Operator cancel of running jobs: mark them; the status stays running.
-- The worker hears of it from its next lease renewal (lease_renew returns the mark);
-- the fenced write that ends the attempt, or the sweep, then ends the job cancelled.
-- Touches no indexed column, so the update can be HOT. Returns the jobs marked.
UPDATE queue_job_state
SET cancel_requested_at = now(), updated_at = now()
WHERE job_id = ANY(%(job_ids)s::bigint[])
  AND status = 'running'
  AND cancel_requested_at IS NULL
RETURNING job_id;


-- name: index_sizes
-- The pages of each hot partial index of queue_job_state (those whose rows come and go
-- with every job: pending, running, keyed), and whether an index is being built on the
-- table right now (a REINDEX CONCURRENTLY of another worker, or an operator's). VACUUM
-- frees a dead entry's space but hands no page back: after a backlog of a million jobs
-- drains, the claim index keeps its million-entry size for a few thousand live entries,
-- and the planner, costing it by its pages, turns the at-a-glance counts into scans of
-- the whole table.
SELECT c.relname::text,
       pg_relation_size(c.oid) / current_setting('block_size')::int8 AS pages,
       i.indisvalid,
       EXISTS (
           SELECT 1 FROM pg_stat_progress_create_index p
           WHERE p.relid = 'queue_job_state'::regclass
       ) AS building
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
WHERE i.indrelid = 'queue_job_state'::regclass
  AND c.relname::text ~ (
      '^queue_job_state_(claim_idx|running_idx|live_key_unique|run_key_idx)'
      || '(_ccnew[0-9]*|_ccold[0-9]*)?$'
  );


-- name: index_walk_forced
-- Sent first in the transaction of index_live_entries: the entries are counted through
-- the index itself, even where a bloated index makes the planner prefer the table.
-- Local to the transaction.
SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true);


-- name: index_live_entries
-- How many live entries each hot index holds, each counted up to its cap (the count at
-- which its size is justified, so a large healthy index costs no more than a small one
-- to look at).
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM queue_job_state WHERE status = 'pending'
            LIMIT %(claim_idx)s::int8) s) AS claim_idx,
       (SELECT count(*) FROM (
            SELECT 1 FROM queue_job_state WHERE status = 'running'
            LIMIT %(running_idx)s::int8) s) AS running_idx,
       (SELECT count(*) FROM (
            SELECT 1 FROM queue_job_state
            WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
            LIMIT %(live_key_unique)s::int8) s) AS live_key_unique,
       (SELECT count(*) FROM (
            SELECT 1 FROM queue_job_state
            WHERE concurrency_key IS NOT NULL AND status = 'running'
            LIMIT %(run_key_idx)s::int8) s) AS run_key_idx;


-- name: index_rebuild
-- Rebuild one hot index without blocking the queue: REINDEX CONCURRENTLY builds a new
-- copy beside it and swaps them, holding only a SHARE UPDATE EXCLUSIVE lock on
-- queue_job_state, which inserts, claims, updates and deletes never wait for (VACUUM,
-- ANALYZE and other index builds do). It waits for the transactions older than it
-- before each phase. Cannot run in a transaction block. {index} is one of the names
-- index_sizes returns, quoted as an identifier.
REINDEX INDEX CONCURRENTLY {index};


-- name: index_drop_leftover
-- Drop what an interrupted REINDEX CONCURRENTLY left behind: an invalid copy
-- (<name>_ccnew, <name>_ccold), which every write still maintains and no read uses.
DROP INDEX CONCURRENTLY IF EXISTS {index};


-- name: job_waiter_add
-- Register a wait() for a job's outcome: the statements that finish a job NOTIFY
-- pgqueue_finished (payload: the queue) for the jobs that have a row here. Rows whose
-- waiter stopped renewing them (a crashed process) are deleted first. Returns the
-- waiter's id and the job's queue, or no row when there is no such job.
WITH cleared AS (
    DELETE FROM queue_job_waiters WHERE expires_at < now()
)
INSERT INTO queue_job_waiters (job_id, queue, expires_at)
SELECT state.job_id, state.queue, now() + make_interval(secs => %(hold)s::float8)
FROM queue_job_state AS state
WHERE state.job_id = %(job_id)s::bigint
RETURNING id, queue;


-- name: job_waiter_check
-- Read a waited-for job's outcome, and keep its waiter's row for `hold` seconds more:
-- the status, the last error, the class of the last failed attempt's error, and the
-- result of the last succeeded attempt. No row when the job is gone (pruned).
WITH renewed AS (
    UPDATE queue_job_waiters
    SET expires_at = now() + make_interval(secs => %(hold)s::float8)
    WHERE id = %(waiter_id)s::bigint
)
SELECT state.status,
       state.last_error,
       (SELECT attempt.error_class FROM queue_attempts AS attempt
        WHERE attempt.job_id = state.job_id AND attempt.error_class IS NOT NULL
        ORDER BY attempt.lease_version DESC LIMIT 1) AS error_class,
       (SELECT attempt.result FROM queue_attempts AS attempt
        WHERE attempt.job_id = state.job_id AND attempt.status = 'succeeded'
        ORDER BY attempt.lease_version DESC LIMIT 1) AS result
FROM queue_job_state AS state
WHERE state.job_id = %(job_id)s::bigint;


-- name: job_waiter_remove
-- Forget a wait() that returned: its job's finishing statement notifies nobody for it.
DELETE FROM queue_job_waiters WHERE id = %(waiter_id)s::bigint;


-- Workflows (django_pgqueue.workflows) ------------------------------------------------
-- A job may wait for others: queue_job_deps holds the edges, queue_workflow_steps each
-- step's failure policy and counters. The statements that end a job settle its
-- dependents (see job_complete). The ones below write and read workflows.

-- name: workflow_enqueue
-- Insert a whole workflow in one statement: its row, every step's job, state and step
-- row, and the edges between them; wake the queues of the steps due now. Arrays are
-- parallel, one element per step (payloads one JSON array); a step that waits for
-- others (waiting_for > 0) starts 'waiting', in no claim index, the others 'pending';
-- has_dependents is true for a step others wait for (NULL otherwise).
-- Edges are pairs of positions (1-based) in those arrays: children[i] waits for
-- parents[i]; the caller checked they form a DAG. Returns (workflow id, job ids in
-- input order).
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*
    FROM ROWS FROM (
        unnest(%(queues)s::text[]), unnest(%(types)s::text[]),
        unnest(%(priorities)s::smallint[]), unnest(%(run_ats)s::timestamptz[]),
        unnest(%(delays)s::float8[]), unnest(%(max_attempts)s::integer[]),
        unnest(%(names)s::text[]), unnest(%(on_failures)s::text[]),
        unnest(%(waiting_for)s::integer[]), unnest(%(has_dependents)s::boolean[]),
        jsonb_array_elements(%(payloads)s::jsonb)
    ) WITH ORDINALITY
        AS i(queue, type, priority, run_at, delay, max_attempts, name, on_failure,
             waiting_for, parent, payload, position)
), flow AS (
    INSERT INTO queue_workflows (name, steps, created_at)
    VALUES (%(name)s::text, cardinality(%(names)s::text[]), now())
    RETURNING id
), job AS (
    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
    SELECT id, queue, type, payload, now(), %(traceparent)s::text
    FROM numbered
), state AS (
    INSERT INTO queue_job_state (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        updated_at, has_dependents
    )
    SELECT id, queue, CASE WHEN waiting_for > 0 THEN 'waiting' ELSE 'pending' END, priority,
           coalesce(run_at, now() + make_interval(secs => delay)), 0, max_attempts, 0, now(),
           parent
    FROM numbered
), step AS (
    INSERT INTO queue_workflow_steps (job_id, workflow_id, name, on_failure, waiting_for, failed)
    SELECT numbered.id, flow.id, numbered.name, numbered.on_failure, numbered.waiting_for, 0
    FROM numbered CROSS JOIN flow
), edge AS (
    INSERT INTO queue_job_deps (job_id, depends_on)
    SELECT child.id, parent.id
    FROM unnest(%(children)s::integer[], %(parents)s::integer[]) AS e(child, parent)
    JOIN numbered AS child ON child.position = e.child
    JOIN numbered AS parent ON parent.position = e.parent
), wake AS (
    SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
    FROM (
        SELECT DISTINCT queue FROM numbered
        WHERE waiting_for = 0 AND coalesce(run_at, now() + make_interval(secs => delay)) <= now()
    ) AS due
)
SELECT (SELECT id FROM flow), array_agg(numbered.id ORDER BY numbered.position)
FROM numbered
CROSS JOIN wake;


-- name: workflow_no_jit
-- Turn JIT compilation off for the rest of the transaction, sent just before
-- workflow_enqueue of a big workflow: the planner prices its thousands of rows high
-- enough to compile it, which takes longer than running it (1.4 s of 1.9 s for 10,000
-- steps). Returns the setting it replaced, for workflow_jit_back.
SELECT current_setting('jit'), set_config('jit', 'off', true);


-- name: workflow_jit_back
-- Put back the JIT setting workflow_no_jit replaced, for the rest of the caller's
-- transaction.
SELECT set_config('jit', %(jit)s::text, true);


-- name: workflow_parent_results
-- The stored results of the jobs a job waits for: (step name, job id, status, result of
-- its last succeeded attempt). Reads the job's edges (queue_job_deps_job_id index),
-- then each parent's step and attempts by key.
SELECT step.name, dep.depends_on, state.status, last.result
FROM queue_job_deps AS dep
JOIN queue_workflow_steps AS step ON step.job_id = dep.depends_on
JOIN queue_job_state AS state ON state.job_id = dep.depends_on
LEFT JOIN LATERAL (
    SELECT attempt.result
    FROM queue_attempts AS attempt
    WHERE attempt.job_id = dep.depends_on AND attempt.status = 'succeeded'
    ORDER BY attempt.lease_version DESC
    LIMIT 1
) AS last ON true
WHERE dep.job_id = %(job_id)s::bigint
ORDER BY dep.depends_on;


-- name: workflow_jobs
-- The jobs of a workflow by status, for cancelling it: (job id, status).
SELECT step.job_id, state.status
FROM queue_workflow_steps AS step
JOIN queue_job_state AS state ON state.job_id = step.job_id
WHERE step.workflow_id = %(workflow_id)s::bigint;


-- name: workflow_steps
-- A workflow's steps with their job's type, status and what each waits for, in step order.
SELECT step.job_id, step.name, job.type, state.status, step.on_failure, step.waiting_for,
       step.failed, coalesce(array_agg(dep.depends_on ORDER BY dep.depends_on)
                             FILTER (WHERE dep.depends_on IS NOT NULL), '{}') AS parents
FROM queue_workflow_steps AS step
JOIN queue_jobs AS job ON job.id = step.job_id
JOIN queue_job_state AS state ON state.job_id = step.job_id
LEFT JOIN queue_job_deps AS dep ON dep.job_id = step.job_id
WHERE step.workflow_id = %(workflow_id)s::bigint
GROUP BY step.job_id, job.type, state.status
ORDER BY step.job_id;


-- name: workflow_page
-- One keyset page of workflows, newest first, for the admin: (id, name, steps, created_at,
-- waiting, pending, running, completed, dead, cancelled, skipped, started_at,
-- finished_at, state, scanned_to, scanned). Reads at most `scan` workflows with ids below
-- `before` (the primary key, backwards), and each one's steps through the
-- (workflow_id, name) unique index with their state rows and first attempts by key;
-- nothing counts the whole table. The state is derived from the steps: running while
-- any step is waiting, pending or running; then failed if one ended dead, cancelled if
-- one was cancelled, else finished; pruned once prune_queue_jobs deleted its steps
-- (the workflow's row stays). A link_error step skipped because nothing failed
-- (cancelled, on_failure 'error', no failed dependency) counts as skipped, not
-- cancelled. `state` (NULL: any) filters the scanned rows. Every row ends with the
-- lowest id scanned and how many were: where the next page starts when a filter left
-- this one short; a page where nothing matched is one row of NULLs and those two.
-- `scanned` is inlined, not materialized: the page then reads the primary key in its
-- order and stops at its last row (LIMIT) instead of summing every scanned workflow
-- before a sort; the bounds read the same index range once more, ids only.
WITH scanned AS NOT MATERIALIZED (
    SELECT flow.id, flow.name, flow.steps, flow.created_at
    FROM queue_workflows AS flow
    WHERE flow.id < %(before)s::bigint
    ORDER BY flow.id DESC
    LIMIT %(scan)s::integer
), summed AS (
    SELECT scanned.*, counts.*,
           CASE
               WHEN counts.present = 0 THEN 'pruned'
               WHEN counts.waiting + counts.pending + counts.running > 0 THEN 'running'
               WHEN counts.dead > 0 THEN 'failed'
               WHEN counts.cancelled > 0 THEN 'cancelled'
               ELSE 'finished'
           END AS state
    FROM scanned
    CROSS JOIN LATERAL (
        SELECT count(*) AS present,
               count(*) FILTER (WHERE state.status = 'waiting') AS waiting,
               count(*) FILTER (WHERE state.status = 'pending') AS pending,
               count(*) FILTER (WHERE state.status = 'running') AS running,
               count(*) FILTER (WHERE state.status = 'completed') AS completed,
               count(*) FILTER (WHERE state.status = 'dead') AS dead,
               count(*) FILTER (WHERE state.status = 'cancelled'
                                  AND NOT (step.on_failure = 'error' AND step.failed = 0))
                   AS cancelled,
               count(*) FILTER (WHERE state.status = 'cancelled'
                                  AND step.on_failure = 'error' AND step.failed = 0)
                   AS skipped,
               min(first.started_at) AS started_at,
               CASE WHEN bool_and(state.status IN ('completed', 'dead', 'cancelled'))
                    THEN max(state.finished_at) END AS finished_at
        FROM queue_workflow_steps AS step
        JOIN queue_job_state AS state ON state.job_id = step.job_id
        LEFT JOIN LATERAL (
            SELECT attempt.started_at
            FROM queue_attempts AS attempt
            WHERE attempt.job_id = step.job_id
            ORDER BY attempt.lease_version
            LIMIT 1
        ) AS first ON true
        WHERE step.workflow_id = scanned.id
    ) AS counts
)
SELECT page.*, bounds.scanned_to, bounds.scanned
FROM (SELECT min(id), count(*) FROM scanned) AS bounds(scanned_to, scanned)
LEFT JOIN LATERAL (
    SELECT id, name, steps, created_at, waiting, pending, running, completed, dead,
           cancelled, skipped, started_at, finished_at, state
    FROM summed
    WHERE %(state)s::text IS NULL OR state = %(state)s::text
    ORDER BY id DESC
    LIMIT %(limit)s::integer
) AS page ON true;


-- name: workflow_step_details
-- A workflow's first `limit` steps for its admin page, in job id order (a workflow's
-- jobs are numbered parents first, so any first n steps hold their parents):
-- (job id, name, type, queue, status, attempts, max_attempts, on_failure, finished_at,
-- parents). Reads the steps through the (workflow_id, name) unique index, each job's
-- rows and edges by key.
SELECT step.job_id, step.name, job.type, state.queue, state.status, state.attempts,
       state.max_attempts, step.on_failure, state.finished_at,
       coalesce(array_agg(dep.depends_on ORDER BY dep.depends_on)
                FILTER (WHERE dep.depends_on IS NOT NULL), '{}') AS parents
FROM queue_workflow_steps AS step
JOIN queue_jobs AS job ON job.id = step.job_id
JOIN queue_job_state AS state ON state.job_id = step.job_id
LEFT JOIN queue_job_deps AS dep ON dep.job_id = step.job_id
WHERE step.workflow_id = %(workflow_id)s::bigint
GROUP BY step.job_id, job.type, state.queue, state.status, state.attempts,
         state.max_attempts, state.finished_at
ORDER BY step.job_id
LIMIT %(limit)s::integer;


-- name: workflow_of_job
-- The workflow a job is a step of, for its admin page: (workflow id, workflow name, step
-- name), no row for a plain job. One probe of each primary key.
SELECT flow.id, flow.name, step.name
FROM queue_workflow_steps AS step
JOIN queue_workflows AS flow ON flow.id = step.workflow_id
WHERE step.job_id = %(job_id)s::bigint;


-- Batches (django_pgqueue.workflows.batches) --------------------------------------------
-- A batch's members are plain jobs, its callbacks the steps of a workflow, each
-- waiting for every member through queue_job_deps, so the statements that end a member
-- settle them (pgqueue_settle) like any other step: once, under the step row's lock,
-- in the transaction of the member's final write.

-- name: batch_insert
-- Insert a batch closed by its block and its members' rows: the jobs enqueued in the
-- block that still exist (one rolled back to a savepoint inside it is left out).
-- Returns (batch id, member job ids).
WITH live AS MATERIALIZED (
    SELECT job_id FROM queue_job_state WHERE job_id = ANY (%(members)s::bigint[])
), batch AS (
    INSERT INTO queue_batches (name, size, created_at)
    SELECT %(name)s::text, count(*), now() FROM live
    RETURNING id
), member AS (
    INSERT INTO queue_batch_jobs (job_id, batch_id)
    SELECT live.job_id, batch.id FROM live CROSS JOIN batch
)
SELECT batch.id, coalesce((SELECT array_agg(job_id ORDER BY job_id) FROM live), '{}')
FROM batch;


-- name: batch_link
-- Make a batch's callbacks (steps inserted waiting, waiting_for = the batch's size)
-- wait for every member: the edges, the members' has_dependents (their finishing
-- statements call pgqueue_settle), and the batch's workflow.
WITH batch AS (
    UPDATE queue_batches SET workflow_id = %(workflow_id)s::bigint
    WHERE id = %(batch_id)s::bigint
), edge AS (
    INSERT INTO queue_job_deps (job_id, depends_on)
    SELECT callback, member
    FROM unnest(%(callbacks)s::bigint[]) AS callback
    CROSS JOIN unnest(%(members)s::bigint[]) AS member
), marked AS (
    UPDATE queue_job_state SET has_dependents = true
    WHERE job_id = ANY (%(members)s::bigint[])
    RETURNING job_id
)
SELECT count(*) FROM marked;


-- name: batch_find
-- The batch a job belongs to: as a member, or as one of its callbacks (NULL: none).
SELECT coalesce(
    (SELECT batch_id FROM queue_batch_jobs WHERE job_id = %(job_id)s::bigint),
    (SELECT batch.id
     FROM queue_workflow_steps AS step
     JOIN queue_batches AS batch ON batch.workflow_id = step.workflow_id
     WHERE step.job_id = %(job_id)s::bigint)
);


-- name: batch_status
-- A batch's row, its members counted by status (a JSON object) and its callbacks
-- (a JSON array of [step name, job id, status]), or no row for an unknown batch.
SELECT batch.id, batch.name, batch.size, batch.created_at,
       coalesce((SELECT jsonb_object_agg(counted.status, counted.n)
                 FROM (SELECT state.status, count(*) AS n
                       FROM queue_batch_jobs AS member
                       JOIN queue_job_state AS state ON state.job_id = member.job_id
                       WHERE member.batch_id = batch.id
                       GROUP BY state.status) AS counted), '{}'),
       coalesce((SELECT jsonb_agg(jsonb_build_array(step.name, step.job_id, state.status)
                                  ORDER BY step.job_id)
                 FROM queue_workflow_steps AS step
                 JOIN queue_job_state AS state ON state.job_id = step.job_id
                 WHERE step.workflow_id = batch.workflow_id), '[]')
FROM queue_batches AS batch
WHERE batch.id = %(batch_id)s::bigint;
