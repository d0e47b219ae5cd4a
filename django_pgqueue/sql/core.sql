-- The core's statements: enqueue, the claims and every fenced write about a claimed
-- job, the lease sweep, waits, and the operator's retry and cancel. The features'
-- statements are in files of their own beside this one (control, workflows, schedules,
-- observability, admin).
--
-- Each block opens with "-- name: <name>" and a line saying what it does;
-- django_pgqueue.sql loads the blocks of every file here into QUERIES, one name space.
-- Parameters are %(name)s and carry explicit casts, so the statements work with client-
-- and server-side binding alike. Each statement is written whole: nothing assembles one.
--
-- Rules every block keeps, in every file (docs/concepts/ explains them: leases.md,
-- fencing.md, claim-index.md):
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
-- (in the squashed migration): PostgreSQL plans its statements once per session and reuses the
-- plans, which a prepared statement would do too but a transaction-mode pooler may
-- not allow. Without an idempotency key: the job row, then its state row (with the
-- concurrency and fair keys, if any). With one: the state row first, its id drawn from the
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
    %(idempotency_key)s::text, %(traceparent)s::text, %(concurrency_key)s::text,
    %(fair_key)s::text
);


-- name: job_enqueue_unique
-- Insert one job with a unique key, or find the job that holds the key; return (id,
-- outcome, created_at), outcome 'created', 'existing' (the holder), 'replaced' (the
-- holder, never claimed, took this payload and due time) or 'other_type' (a debounce
-- met a holder of another job type: nothing written). The work is the PL/pgSQL function
-- pgqueue_enqueue_unique: ON CONFLICT on the unique partial index of
-- the state rows (queue_job_state_unique_key), or on the key's row of queue_unique_keys
-- for a hold of a period, so concurrent enqueues are decided by the database in their
-- transactions. All NULL when the key kept changing hands (5 tries).
SELECT job_id, outcome, created_at
FROM pgqueue_enqueue_unique(
    %(queue)s::text, %(type)s::text, %(payload)s::jsonb, %(priority)s::smallint,
    %(run_at)s::timestamptz, %(delay)s::float8, %(max_attempts)s::integer,
    %(traceparent)s::text, %(concurrency_key)s::text, %(unique_key)s::text,
    %(unique_hold)s::text, %(unique_seconds)s::float8, %(on_conflict)s::text,
    %(fair_key)s::text
);


-- name: job_type
-- One job's type (a debounce refused by a holder of another type names it).
SELECT type FROM queue_jobs WHERE queue = %(queue)s::text AND id = %(job_id)s::bigint;


-- name: job_enqueue_many
-- Insert many jobs without keys in one statement and wake their queues; return their
-- ids as one array, in input order.
-- Arrays are parallel, one element per job, and payloads is one JSON array, zipped by
-- ROWS FROM (no join). Ids are drawn from the jobs' sequence first so both tables can
-- be filled from the same rows (the sequence is looked up once, not per row). Kept
-- simple on purpose: its estimated cost must stay far below jit_above_cost, or
-- PostgreSQL spends longer compiling it than running it. job_enqueue_many_keyed
-- numbers its rows the same way, with the keys.
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
-- Insert many jobs, some with idempotency, concurrency or fair keys, skipping those whose
-- idempotency key a live job holds. Returns (position, id) for the jobs inserted;
-- job_live_by_keys then finds the holder for every other position, including keys
-- repeated within the call. The state row goes first so ON CONFLICT can skip the
-- whole job (see pgqueue_enqueue). A queue that receives a job with a concurrency key
-- is marked keyed in queue_controls (the first time only), as job_enqueue does.
-- Its rows are numbered as job_enqueue_many's are, with the three key arrays zipped in
-- before the payloads. The two statements stay apart: jobs without keys taken through
-- this one (ON CONFLICT, the state rows first) were inserted 1.3x slower at 20 jobs a
-- statement and 3.8x at 20,000.
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*
    FROM ROWS FROM (
        unnest(%(queues)s::text[]), unnest(%(types)s::text[]),
        unnest(%(priorities)s::smallint[]), unnest(%(run_ats)s::timestamptz[]),
        unnest(%(delays)s::float8[]), unnest(%(max_attempts)s::integer[]),
        unnest(%(idempotency_keys)s::text[]), unnest(%(concurrency_keys)s::text[]),
        unnest(%(fair_keys)s::text[]), jsonb_array_elements(%(payloads)s::jsonb)
    ) WITH ORDINALITY
        AS i(queue, type, priority, run_at, delay, max_attempts, idempotency_key,
             concurrency_key, fair_key, payload, position)
), state AS (
    INSERT INTO queue_job_state AS s (
        job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
        idempotency_key, concurrency_key, fair_key, updated_at
    )
    SELECT id, queue, 'pending', priority, coalesce(run_at, now() + make_interval(secs => delay)),
           0, max_attempts, 0, idempotency_key, concurrency_key, fair_key, now()
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
-- The jobs walked are taken by pgqueue_claim, as every claim's are:
-- each runs under a new lease (lease_version + 1) with an attempt opened, and its row
-- comes back with the attempt's id (later writes address the attempt by primary key).
-- Rows come back unordered (ordering here would add a Sort node); sort in the caller.
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
    ORDER BY priority DESC, run_at, job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM pgqueue_claim(
    ARRAY(SELECT job_id FROM candidates), %(queue)s::text, %(worker_id)s::text,
    %(lease)s::float8, NULL
);


-- name: job_claim_after
-- job_claim resumed after the key (priority, run_at, job_id) of a row claimed before:
-- the same priority, later in the claim index's order. The walk starts at that key
-- instead of the left end of the queue's entries, where the entries of claimed jobs
-- pile up, dead, until VACUUM removes them (see RESUME_TTL in worker/scheduler.py).
-- It is job_claim's walk with the key's two conditions, written again: one statement
-- for both would bound the walk by a range of priorities, and a walk bounded so cannot
-- stop at the first job not due yet: it reads on through the rest of its priority
-- (measured: a resumed claim that came back short beside 50,000 jobs due tomorrow
-- took 6.1 ms against 0.27 ms).
WITH candidates AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE queue = %(queue)s::text
      AND status = 'pending'
      AND run_at <= now()
      AND concurrency_key IS NULL  -- as in job_claim
      AND priority = %(after_priority)s::smallint
      AND (run_at, job_id) > (%(after_run_at)s::timestamptz, %(after_job_id)s::bigint)
    ORDER BY priority DESC, run_at, job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
SELECT * FROM pgqueue_claim(
    ARRAY(SELECT job_id FROM candidates), %(queue)s::text, %(worker_id)s::text,
    %(lease)s::float8, NULL
);


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
-- (pgqueue_settle), those with has_dependents set; for a job nothing
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
-- Record an attempt that ended without a result, of a job a worker still owns: a
-- failure, or an attempt given back (give_back: a snooze, or an attempt the worker's
-- own shutdown interrupted; the attempt does not count). The job goes back to pending
-- at now() + delay; a failure goes to dead instead when it is permanent or its
-- attempts are spent; a job an operator asked to cancel while it ran ends cancelled.
-- The attempt row is closed with attempt_status ('failed', 'snoozed' or
-- 'interrupted'); lease_version grows at the next claim as always. Fenced; returns the
-- new status and run_at, or no row when the lease was lost.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle), those with has_dependents set; for a job nothing
-- waits for (NULL) the function is not called and no other table is read.
WITH failed AS (
    UPDATE queue_job_state AS state
    SET status = CASE
            WHEN state.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN %(give_back)s::boolean THEN 'pending'
            WHEN %(permanent)s::boolean OR state.attempts >= state.max_attempts THEN 'dead'
            ELSE 'pending'
        END,
        run_at = CASE
            WHEN state.cancel_requested_at IS NOT NULL
                 OR NOT %(give_back)s::boolean AND (%(permanent)s::boolean
                                                    OR state.attempts >= state.max_attempts)
            THEN state.run_at
            ELSE now() + make_interval(secs => %(delay)s::float8)
        END,
        attempts = CASE
            WHEN %(give_back)s::boolean AND state.cancel_requested_at IS NULL
            THEN state.attempts - 1
            ELSE state.attempts
        END,
        finished_at = CASE
            WHEN state.cancel_requested_at IS NOT NULL
                 OR NOT %(give_back)s::boolean AND (%(permanent)s::boolean
                                                    OR state.attempts >= state.max_attempts)
            THEN now()
        END,
        locked_by = NULL,
        locked_until = NULL,
        last_error = CASE
            WHEN %(give_back)s::boolean THEN state.last_error ELSE %(last_error)s::text
        END,
        updated_at = now()
    WHERE state.job_id = %(job_id)s::bigint
      AND state.lease_version = %(lease_version)s::bigint
      AND state.status = 'running'
    RETURNING state.job_id, state.lease_version, state.status, state.run_at,
              state.has_dependents
), closed AS (
    UPDATE queue_attempts AS attempt
    SET status = %(attempt_status)s::text,
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
-- (pgqueue_settle), those with has_dependents set; for a job nothing
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
-- The size in bytes of each table the worker's prepared statements read. PostgreSQL keeps
-- a prepared statement's generic plan until ANALYZE or VACUUM of its tables; one made
-- while a table was nearly empty is a sequential scan of it that stays as it grows (for
-- ever with autovacuum off). The worker discards its plans (plan_discard,
-- plan_deallocate) when one of these has doubled or halved since they were made; the
-- next executions plan again.
SELECT pg_relation_size('queue_job_state'), pg_relation_size('queue_attempts');


-- name: plan_discard
-- Drop the cached plans of this session's PL/pgSQL functions (those without
-- enable_seqscan = off were made on the tables' size then) and of its prepared
-- statements; plan_deallocate then drops the statements themselves.
DISCARD PLANS;


-- name: plan_deallocate
-- Drop this session's prepared statements: psycopg forgets them at this command and
-- prepares each again at its next use, which plans it as a new session would. Kept
-- (DISCARD PLANS alone), they kept their history: the cost of the custom plans made on
-- the empty tables, against which PostgreSQL weighs the generic plan before it keeps
-- one. Made on the grown tables, the generic plan looked dearer than those and every
-- execution was planned again (lease_sweep: 0.4-0.7 ms of planning for 0.1 ms of
-- work, twice a fresh session's time).
DEALLOCATE ALL;


-- name: lease_sweep
-- Requeue running jobs whose lease ran out, or mark them dead when their attempts are spent.
-- Any worker may run it, several at once: expired rows are locked with SKIP LOCKED,
-- and the UPDATE re-checks status and locked_until on the row it changes, so a
-- completion or a renewal that landed after the sweep looked is never undone. The
-- lost attempt is closed as 'lost'. lease_version grows so the old token is dead.
-- run_at stays as it was: the job was due already and keeps its place in line, so
-- it runs again as soon as a worker is free, not after the whole backlog behind it.
-- An attempt closed as 'interrupted' (job_interrupt: its worker stopped while the
-- handler ran, and the row stayed running until its process was gone) is given back instead:
-- the job is pending again (never dead for it), its attempt not spent.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle), those with has_dependents set; for a job nothing
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
-- job whose idempotency key another live job holds, nor one whose unique key (held
-- while active or until completed: pending again, it would hold it) another job holds;
-- of several selected jobs sharing a key, only the newest is retried (two live jobs
-- cannot hold one key). A "pending" unique hold ends at the first claim (lease_version
-- grows here too): such a job is retried without its key. Returns the jobs changed.
-- Workflows: a step that still waits for a dependency (one unfinished, or retried in
-- this same call) goes back to waiting, not pending; a dead or cancelled job retried
-- counts as unfinished again for its dependents, and every dependent that has not
-- started waits for it again: pending ones, and those its failure cancelled; a retried
-- step forgets what cancelled it (pgqueue_unsettle), in this same
-- statement.
-- Sequences: a retried job of a sequence waits, then its sequence moves on by the rule
-- every ending statement uses (pgqueue_sequence_next): the job is
-- pending again if it headed its sequence (a held head retried) or the sequence has no
-- head; else it waits for its turn, behind the head.
WITH candidate AS MATERIALIZED (
    SELECT state.job_id, state.queue, state.idempotency_key, state.status,
           state.unique_key,
           -- whether it holds its key once retried: pending, its lease version grown
           coalesce(
               pgqueue_holds_unique_key(state.unique_hold, 'pending', state.lease_version + 1),
               false
           ) AS holds
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
      AND NOT EXISTS (
          SELECT FROM queue_job_state AS other
          WHERE pgqueue_holds_unique_key(state.unique_hold, 'pending', state.lease_version + 1)
            AND other.queue = state.queue
            AND other.unique_key = state.unique_key
            AND other.job_id <> state.job_id
            AND pgqueue_holds_unique_key(other.unique_hold, other.status, other.lease_version)
      )
    ORDER BY state.job_id
    FOR UPDATE
), target AS (
    SELECT job_id FROM candidate WHERE idempotency_key IS NULL AND NOT holds
    UNION ALL
    SELECT max(job_id) FROM candidate
    WHERE idempotency_key IS NOT NULL
    GROUP BY queue, idempotency_key
    UNION ALL
    SELECT max(job_id) FROM candidate
    WHERE holds
    GROUP BY queue, unique_key
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
            WHEN state.sequence_key IS NOT NULL THEN 'waiting'
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
                  AS cancelled_by_dependency,
              state.sequence_key IS NOT NULL AS sequenced
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
), sequenced AS (
    -- sequences: the retried jobs' sequences move on (the head's retry makes it pending)
    SELECT pgqueue_sequence_next(ARRAY(SELECT job_id FROM retried WHERE sequenced)) AS moved
    WHERE EXISTS (SELECT FROM retried WHERE sequenced)
)
SELECT retried.job_id
FROM retried CROSS JOIN wake LEFT JOIN unsettled ON true LEFT JOIN sequenced ON true;


-- name: job_cancel
-- Operator cancel: pending and waiting jobs become cancelled. Running jobs are never touched.
-- Workflows: the jobs it ended settle their dependents in this same statement
-- (pgqueue_settle), those with has_dependents set; for a job nothing
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


-- name: job_hold_tables
-- Open the hold (job_hold) with the table locks its final give-back (job_fail)
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
-- Record that the worker's own shutdown interrupted a job whose handler still runs:
-- the attempt is closed as 'interrupted' (given back, not spent), but the row stays
-- running, its slots held. On a row the worker holds (job_hold; end_lease) the lease
-- ends now: the worker gives the job back once the handler returned (job_fail, on
-- the holding connection), and if its process ends first the hold goes with it and
-- the sweep gives the attempt back. Without a hold the lease is kept: it runs out
-- once the process is gone (the heartbeat has stopped), and the sweep gives the
-- attempt back then. Fenced; returns the status and run_at, or no row when the lease
-- was lost.
WITH ended AS (
    UPDATE queue_job_state AS state
    SET locked_until = CASE WHEN %(end_lease)s::boolean THEN now() ELSE state.locked_until END,
        updated_at = now()
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
