-- Queue control (django_pgqueue.control): pause, concurrency limits, concurrency
-- keys, rate limits, snooze and cancelling a running job. A queue without a
-- queue_controls row never runs any of these on its claim path: it claims with
-- job_claim (core.sql), which only leaves jobs with a concurrency key alone.


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
-- from clock_timestamp() under the queue lock (it only grows). The jobs are taken by
-- pgqueue_claim, as job_claim's are, their attempts starting at that
-- same t. Rows come back unordered, like job_claim's.
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
), claimed AS MATERIALIZED (
    SELECT * FROM pgqueue_claim(
        ARRAY(SELECT job_id FROM candidates), %(queue)s::text, %(worker_id)s::text,
        %(lease)s::float8, (SELECT at FROM budget)
    )
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
SELECT * FROM claimed;


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
-- Change a queue's controls at run time, creating its row if needed; return the row.
-- `changes` is a JSON object of the columns to write (paused, concurrency_limit,
-- key_limit, rate_count, rate_period): a key given is written (null removes that
-- limit), a column not named keeps its value. jsonb_populate_record fills a row from
-- the keys it has and takes the others from the row it is given: the existing row, or
-- for a new one an unpaused queue with a key limit of 1.
INSERT INTO queue_controls AS c (
    queue, paused, concurrency_limit, key_limit, rate_count, rate_period, rate_starts,
    keyed, updated_at
)
SELECT %(queue)s::text, new.paused, new.concurrency_limit, new.key_limit, new.rate_count,
       new.rate_period, '{}', false, now()
FROM jsonb_populate_record(
    NULL::queue_controls, '{"paused": false, "key_limit": 1}' || %(changes)s::jsonb
) AS new
ON CONFLICT (queue) DO UPDATE
SET (paused, concurrency_limit, key_limit, rate_count, rate_period, updated_at) = (
    SELECT changed.paused, changed.concurrency_limit, changed.key_limit,
           changed.rate_count, changed.rate_period, now()
    FROM jsonb_populate_record(c, %(changes)s::jsonb) AS changed
)
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
-- Change one type's limits within a queue at run time, creating its row if needed;
-- return the row. `changes` names the columns to write (key_limit, rate_count,
-- rate_period) as in queue_control_update; a new row limits nothing it is not given.
INSERT INTO queue_type_controls AS c (
    queue, type, key_limit, rate_count, rate_period, rate_starts, updated_at
)
SELECT %(queue)s::text, %(type)s::text, new.key_limit, new.rate_count, new.rate_period,
       '{}', now()
FROM jsonb_populate_record(NULL::queue_type_controls, %(changes)s::jsonb) AS new
ON CONFLICT (queue, type) DO UPDATE
SET (key_limit, rate_count, rate_period, updated_at) = (
    SELECT changed.key_limit, changed.rate_count, changed.rate_period, now()
    FROM jsonb_populate_record(c, %(changes)s::jsonb) AS changed
)
RETURNING c.queue, c.type, c.key_limit, c.rate_count, c.rate_period;


-- name: queue_type_control_prune
-- Remove a type's row once it limits nothing (so the queue's claims stop reading types).
DELETE FROM queue_type_controls
WHERE queue = %(queue)s::text AND type = %(type)s::text
  AND key_limit IS NULL AND rate_count IS NULL;
