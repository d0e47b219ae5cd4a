-- What operators read and the maintenance passes: the figures of the admin,
-- queue_stats and /metrics, prune, requeue_dead's pages, the system checks' reads and
-- the index upkeep.


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
-- Each status by a constant: a status taken from a join (status = f.status) is no
-- proof for the planner that the rows lie in queue_job_state_failed_idx (status IN
-- ('dead', 'cancelled')), and each count read the table (150 ms a queue at 1,000,000
-- jobs, against 1.4 ms).
SELECT q.queue, f.status, f.jobs, 0, 0, NULL
FROM failed_queues q
CROSS JOIN LATERAL (
    SELECT 'dead' AS status, count(*) AS jobs
    FROM (SELECT 1 FROM queue_job_state
          WHERE status = 'dead' AND queue = q.queue
          LIMIT %(cap)s::int8) s
    UNION ALL
    SELECT 'cancelled', count(*)
    FROM (SELECT 1 FROM queue_job_state
          WHERE status = 'cancelled' AND queue = q.queue
          LIMIT %(cap)s::int8) s
) f
WHERE q.queue IS NOT NULL AND f.jobs > 0
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
               AND state.finished_at < %(cutoff)s::timestamptz
               -- a dead job that holds its sequence back stays (see job_prune_batch)
               AND (state.status <> 'dead' OR state.sequence_on_failure IS DISTINCT FROM 'hold')
               AS due
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
-- with the jobs through queue_jobs' AFTER DELETE trigger, their attempts through
-- queue_job_state's, the edges, steps and memberships through their ON DELETE CASCADE
-- foreign keys. Each batch is one short statement in its own transaction; no index over every
-- finished job is needed, which would weigh on the hot table.
WITH candidate AS MATERIALIZED (
    SELECT job_id
    FROM queue_job_state
    WHERE job_id > %(after_id)s::bigint
      AND status = ANY(%(statuses)s::text[])
      AND status IN ('completed', 'dead', 'cancelled')
      AND finished_at < %(cutoff)s::timestamptz
      -- A dead job that holds its sequence back is its head: it stays until an
      -- operator retries it or releases the sequence (then it is pruned like any other).
      AND (status <> 'dead' OR sequence_on_failure IS DISTINCT FROM 'hold')
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
