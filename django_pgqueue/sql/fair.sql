-- Fair queues (PGQUEUE["FAIR_QUEUES"]): the claim that takes jobs round-robin across
-- the queue's fair keys. Loaded with the others (django_pgqueue.sql); run by
-- store/claims.py. Every rule of core.sql holds here too: one queue per claim, by
-- equality; the jobs taken go through pgqueue_claim (a new lease, an attempt opened).

-- name: fair_claim_plan
-- Sent just before job_claim_fair in the same transaction: sequential scans off, so
-- each step is planned on its index at every size (the unkeyed walk, estimated at a
-- row or two, was planned as a Seq Scan of the whole table), and, prepared, the claim
-- runs on the generic plan built once for the session rather than planned at every
-- call. Not claim_plan_generic: it also turns sorts off, and the candidates' few rows
-- then took seconds to order. JIT off: the generic plan's estimates (a LIMIT it cannot
-- see, rows per key it cannot know) cross jit_above_cost, and compiling the statement
-- cost ~50 ms a claim that runs in ~1 ms. Local to the transaction.
SELECT set_config('enable_seqscan', 'off', true),
       set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true);


-- name: job_claim_fair
-- Claim up to `limit` due jobs of a fair queue, taking turns across its keys, from the
-- first key after `after` (the last key the worker's previous claim served; NULL: from
-- the first key), round the end of the keys and back to `after`.
-- resume: where the worker's recent claims stopped in the keys they took from (a JSON
-- object, key -> [priority, run_at, job_id] of the last job taken; `{}`: none). The
-- entries of claimed jobs stay in the index, dead, at the front of their key's range
-- until VACUUM removes them: a key drained for a while (one tenant's big backlog) has
-- thousands, and a read from the front of the key steps over them all, at every claim.
-- So the walk steps onto a resumed key without probing it, and the key's jobs are read
-- from where the last claim stopped, in its priority (as job_claim_after resumes a
-- plain queue's walk; the worker forgets the positions every FAIR_RESUME_TTL, and a
-- key whose resumed read comes back short is read from its front in the same claim).
-- walk: the keys with pending jobs, in key order, one index probe each on
-- queue_job_state_fair_idx (a skip scan: the next key after this one, below the next
-- resumed key, which is stepped onto unprobed), at most `keys` of them, so a claim
-- reads a bounded part of the index however many keys there are. Each step is the same
-- probe after a bound: the key walked last, then, past the last key, the key "" (the
-- round from the first key; "" itself, the key of jobs enqueued without one, is
-- probed apart: no bound sorts before it); the walk ends on coming round to `after`.
-- candidates: each key's first jobs in claim order (priority, due time, id), locked
-- FOR UPDATE SKIP LOCKED as job_claim locks (a job another claim holds is passed over,
-- so two workers serving one key take different jobs), numbered into turns: a key of
-- weight w (`weights`, a JSON object; 1 by default) gives w jobs a turn, and each key
-- gives as many turns as `limit` over the keys walked, so a claim locks about `limit`
-- rows plus the weights, not `limit` per key.
-- taken: the candidates turn by turn, key by key within a turn, up to `limit`; the
-- sort is of the candidates only (a few rows), never of the queue. A candidate not
-- taken is unlocked when the claim's transaction ends, at once.
-- unkeyed: jobs of the queue without a fair key (written by a workflow or a schedule,
-- or before the queue was made fair) are taken from the claim index when no key had a
-- job to give: they never wait for ever, but behind keys that always have due work
-- they wait. Its walk reads the first `keys` due jobs of each priority (`due`), never
-- a job not due: with every key's jobs scheduled later, it reads one index entry a
-- priority, not the queue's whole backlog.
-- cursor: where the worker's next claim starts (`last_key`, on every row): the key of
-- the last job taken, in turn order, when the claim took `limit` jobs; else the last
-- key walked, so keys with pending jobs none of them due (delayed, debounced) are
-- walked past, `keys` a claim, never again and again ahead of a key with a job due.
-- With it the positions for the next claim (`resume`): the last job taken of each key,
-- and the positions given of keys not walked, or walked with jobs none taken (a key
-- walked with no job is dropped).
-- alone: the key walked, when the walk stepped onto one key only (the one key with
-- pending jobs) and the claim took jobs of it: the worker's next claim of the queue is
-- job_claim_fair_alone, of that key. Else NULL.
-- No job taken: one row, its job columns NULL, with `last_key`, `alone` and `resume`.
WITH RECURSIVE steps (fair_key, depth, wrapped) AS (
    -- the walk's start: the key `after` (not walked itself), or before the first key
    SELECT %(after)s::text, 0, false
    UNION ALL
    SELECT next.fair_key, steps.depth + 1, next.wrapped
    FROM steps
    CROSS JOIN LATERAL (
        SELECT probe.fair_key, start.wrapped
        FROM (
            -- after the key walked last; past the last key, round to the first, once
            SELECT steps.fair_key AS after, steps.wrapped, false AS first
            UNION ALL
            SELECT '', true, true WHERE NOT steps.wrapped
        ) AS start
        CROSS JOIN LATERAL (
            SELECT min(k.key) AS key
            FROM jsonb_object_keys(%(resume)s::jsonb) AS k (key)
            WHERE k.key > start.after OR start.first
        ) AS resumed
        CROSS JOIN LATERAL (
            -- from the first key: the key "" (no key sorts before it), unless resumed
            SELECT ''::text AS fair_key
            WHERE start.first AND resumed.key IS DISTINCT FROM ''
              AND EXISTS (
                  SELECT FROM queue_job_state AS s
                  WHERE s.queue = %(queue)s::text AND s.status = 'pending'
                    AND s.fair_key = ''
              )
            UNION ALL
            -- the next key before the next resumed key. Apart from the "no resumed key"
            -- probe below: bounded in the index, it stops at the resumed key's first
            -- entry, live or dead; one bounded after the probe reads on through the dead
            -- entries at that key's front (a resumed claim in test_fair_claims: 103 pages,
            -- against at most 30)
            (SELECT s.fair_key
             FROM queue_job_state AS s
             WHERE s.queue = %(queue)s::text AND s.status = 'pending'
               AND s.fair_key IS NOT NULL
               AND s.fair_key > start.after
               AND s.fair_key < resumed.key
             ORDER BY s.fair_key
             LIMIT 1)
            UNION ALL
            -- the next resumed key, if it has a job after where the last claim stopped
            SELECT resumed.key
            WHERE EXISTS (
                SELECT FROM queue_job_state AS s
                WHERE s.queue = %(queue)s::text AND s.status = 'pending'
                  AND s.fair_key = resumed.key
                  AND s.priority = (%(resume)s::jsonb -> resumed.key ->> 0)::smallint
                  AND (s.run_at, s.job_id)
                      > ((%(resume)s::jsonb -> resumed.key ->> 1)::timestamptz,
                         (%(resume)s::jsonb -> resumed.key ->> 2)::bigint)
            )
            UNION ALL
            (SELECT s.fair_key
             FROM queue_job_state AS s
             WHERE s.queue = %(queue)s::text AND s.status = 'pending'
               AND s.fair_key IS NOT NULL AND s.fair_key >= resumed.key
             ORDER BY s.fair_key
             LIMIT 1)
            UNION ALL
            -- no resumed key ahead
            (SELECT s.fair_key
             FROM queue_job_state AS s
             WHERE s.queue = %(queue)s::text AND s.status = 'pending'
               AND s.fair_key IS NOT NULL
               AND s.fair_key > start.after
               AND resumed.key IS NULL
             ORDER BY s.fair_key
             LIMIT 1)
            LIMIT 1
        ) AS probe
        -- round again only up to the key the walk started after
        WHERE NOT start.wrapped OR %(after)s::text IS NULL OR probe.fair_key <= %(after)s::text
        LIMIT 1
    ) AS next
    WHERE steps.depth < %(keys)s::integer
      -- come round to the key the walk started after: no key is left to walk
      AND (NOT steps.wrapped OR %(after)s::text IS NULL OR steps.fair_key < %(after)s::text)
), walk AS MATERIALIZED (
    SELECT steps.fair_key, steps.depth, steps.wrapped FROM steps WHERE steps.depth > 0
), turns AS MATERIALIZED (
    -- how many turns the claim can fill: every key gives its weight a turn
    SELECT greatest(1, ceil(%(limit)s::numeric / nullif(count(*), 0)))::integer AS count FROM walk
), candidates AS MATERIALIZED (
    SELECT job.job_id, job.priority, job.run_at, walk.fair_key, walk.depth, job.place,
           (job.place - 1) / weight.value AS turn
    FROM walk
    CROSS JOIN turns
    CROSS JOIN LATERAL (
        SELECT coalesce((%(weights)s::jsonb ->> walk.fair_key)::integer, 1) AS value,
               %(resume)s::jsonb -> walk.fair_key AS resume
    ) AS weight
    CROSS JOIN LATERAL (
        SELECT locked.job_id, locked.priority, locked.run_at,
               row_number() OVER () AS place
        FROM (
            -- from where the last claim stopped in this key, in its priority (each
            -- branch a subquery: FOR UPDATE is not allowed on a UNION's own branches)
            SELECT * FROM (
             SELECT s.job_id, s.priority, s.run_at
             FROM queue_job_state AS s
             WHERE s.queue = %(queue)s::text AND s.status = 'pending'
               AND s.fair_key = walk.fair_key AND s.run_at <= now()
               -- a job with a concurrency key is the controlled claim's (as in job_claim)
               AND s.concurrency_key IS NULL
               AND s.priority = (weight.resume ->> 0)::smallint
               AND (s.run_at, s.job_id)
                   > ((weight.resume ->> 1)::timestamptz, (weight.resume ->> 2)::bigint)
             ORDER BY s.priority DESC, s.run_at, s.job_id
             LIMIT weight.value * turns.count
             FOR UPDATE OF s SKIP LOCKED) AS resumed
            UNION ALL
            -- from the front of the key: not resumed, or the resumed read came short
            SELECT * FROM (
             SELECT s.job_id, s.priority, s.run_at
             FROM queue_job_state AS s
             WHERE s.queue = %(queue)s::text AND s.status = 'pending'
               AND s.fair_key = walk.fair_key AND s.run_at <= now()
               AND s.concurrency_key IS NULL
               AND NOT coalesce(
                   s.priority = (weight.resume ->> 0)::smallint
                   AND (s.run_at, s.job_id)
                       > ((weight.resume ->> 1)::timestamptz, (weight.resume ->> 2)::bigint),
                   false)
             ORDER BY s.priority DESC, s.run_at, s.job_id
             LIMIT weight.value * turns.count
             FOR UPDATE OF s SKIP LOCKED) AS front
            LIMIT weight.value * turns.count
        ) AS locked
    ) AS job
), taken AS MATERIALIZED (
    SELECT candidates.job_id, candidates.priority, candidates.run_at, candidates.fair_key,
           candidates.turn, candidates.depth, candidates.place
    FROM candidates
    ORDER BY candidates.turn, candidates.depth
    LIMIT %(limit)s::integer
), priorities (priority) AS (
    -- the priorities of the queue's pending jobs, a skip scan of the claim index (one
    -- probe each: a queue has a few), walked only when no key had a job to give
    (SELECT s.priority
     FROM queue_job_state AS s
     WHERE s.queue = %(queue)s::text AND s.status = 'pending'
       AND NOT EXISTS (SELECT FROM candidates)
     ORDER BY s.priority DESC
     LIMIT 1)
    UNION ALL
    SELECT next.priority
    FROM priorities
    CROSS JOIN LATERAL (
        SELECT s.priority
        FROM queue_job_state AS s
        WHERE s.queue = %(queue)s::text AND s.status = 'pending'
          AND s.priority < priorities.priority
        ORDER BY s.priority DESC
        LIMIT 1
    ) AS next
), due AS MATERIALIZED (
    -- the first `keys` due jobs of each priority in claim order: a walk of the claim
    -- index that stops at the first job not due (by priority, the due time is its next
    -- column), so jobs scheduled later are never read, however many
    SELECT first.job_id
    FROM priorities
    CROSS JOIN LATERAL (
        SELECT s.job_id, s.fair_key, s.concurrency_key
        FROM queue_job_state AS s
        WHERE s.queue = %(queue)s::text AND s.status = 'pending'
          AND s.priority = priorities.priority AND s.run_at <= now()
        ORDER BY s.run_at, s.job_id
        LIMIT %(keys)s::integer
    ) AS first
    WHERE first.fair_key IS NULL AND first.concurrency_key IS NULL
), unkeyed AS MATERIALIZED (
    -- the unkeyed jobs among them (a keyed one is the walk's), locked as job_claim locks
    SELECT s.job_id
    FROM queue_job_state AS s
    WHERE s.queue = %(queue)s::text
      AND s.job_id IN (SELECT due.job_id FROM due)
      AND s.status = 'pending'
      AND s.run_at <= now()
      AND s.concurrency_key IS NULL
      AND s.fair_key IS NULL
    ORDER BY s.priority DESC, s.run_at, s.job_id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
), cursor AS MATERIALIZED (
    SELECT CASE
        -- full: the next claim goes on from the key of the last job taken, in turn order
        WHEN (SELECT count(*) FROM taken) >= %(limit)s::integer THEN
            (SELECT taken.fair_key FROM taken ORDER BY taken.turn DESC, taken.depth DESC
             LIMIT 1)
        -- not full: every key walked gave what it had due, so the next claim goes on
        -- past the last of them, past keys with nothing due too (else a walk over as
        -- many keys with only later jobs would be walked again and again)
        ELSE (SELECT walk.fair_key FROM walk ORDER BY walk.depth DESC LIMIT 1)
    END AS last_key,
    -- the one key walked, when the claim took jobs of it: see job_claim_fair_alone
    CASE WHEN (SELECT count(*) FROM walk) = 1 AND EXISTS (SELECT FROM taken)
         THEN (SELECT walk.fair_key FROM walk) END AS alone,
    (SELECT coalesce(jsonb_object_agg(position.fair_key, position.at), '{}')
     FROM (
         -- the last job taken of each key
         (SELECT DISTINCT ON (taken.fair_key)
                 taken.fair_key, jsonb_build_array(taken.priority, taken.run_at, taken.job_id)
          FROM taken
          ORDER BY taken.fair_key, taken.place DESC)
         UNION ALL
         -- the positions given, of keys not walked, or walked with jobs none taken
         SELECT given.key, given.value
         FROM jsonb_each(%(resume)s::jsonb) AS given
         WHERE NOT EXISTS (SELECT FROM taken WHERE taken.fair_key = given.key)
           AND (NOT EXISTS (SELECT FROM walk WHERE walk.fair_key = given.key)
                OR EXISTS (SELECT FROM candidates WHERE candidates.fair_key = given.key))
     ) AS position (fair_key, at)) AS resume
)
SELECT claimed.*, cursor.last_key, cursor.alone, cursor.resume
FROM cursor
-- a row, its job columns NULL, when no job is taken: it still carries the cursor
LEFT JOIN LATERAL pgqueue_claim(
    -- in turn order: the attempts are opened, and the rows returned, in this order
    ARRAY(SELECT taken.job_id FROM taken ORDER BY taken.turn, taken.depth)
    || ARRAY(SELECT unkeyed.job_id FROM unkeyed),
    %(queue)s::text, %(worker_id)s::text, %(lease)s::float8, NULL
) AS claimed ON true;


-- name: job_claim_fair_alone
-- job_claim_fair when one key has pending jobs: `key`, the one key the worker's last
-- fair claim of the queue walked, which took jobs of it (its `alone`). That walk, run
-- again, would step onto that key alone, give it every turn and take its first `limit`
-- due jobs from where the last claim stopped (`resume`), then from its front; so this
-- does, without the walk's probes, turns and unkeyed walk: a plan of a few nodes where
-- job_claim_fair's has about a hundred, whose start and end cost most of what one
-- tenant draining alone paid over a plain queue (benchmarks/README.md).
-- resumed_at: two probes of queue_job_state_fair_idx, for a key with pending jobs
-- before `key` ("" among them) and after it. If either finds one, or the key has no job
-- to give (jobs without a key may be due), the claim takes nothing and the worker
-- claims at once with job_claim_fair, whose walk sees every key: a new tenant's job is
-- seen by the first claim after it is committed, as before.
-- The rows of job_claim_fair: the jobs taken, each with `last_key` and `alone` (`key`)
-- and `resume` (the positions given, and the key's last job taken); none taken: one
-- row, its job columns NULL.
WITH resumed_at AS MATERIALIZED (
    -- where the last claim stopped in the key (NULLs: not given); no row if another key
    -- has pending jobs
    SELECT (%(resume)s::jsonb -> %(key)s::text ->> 0)::smallint AS priority,
           (%(resume)s::jsonb -> %(key)s::text ->> 1)::timestamptz AS run_at,
           (%(resume)s::jsonb -> %(key)s::text ->> 2)::bigint AS job_id
    WHERE NOT EXISTS (
              SELECT FROM queue_job_state AS s
              WHERE s.queue = %(queue)s::text AND s.status = 'pending'
                AND s.fair_key IS NOT NULL AND s.fair_key < %(key)s::text
          )
      AND NOT EXISTS (
              SELECT FROM queue_job_state AS s
              WHERE s.queue = %(queue)s::text AND s.status = 'pending'
                AND s.fair_key > %(key)s::text
          )
), taken AS MATERIALIZED (
    SELECT locked.job_id, locked.priority, locked.run_at, row_number() OVER () AS place
    FROM resumed_at AS at
    CROSS JOIN LATERAL (
        -- from where the last claim stopped in the key, in its priority, then from the
        -- key's front (each branch a subquery, as in job_claim_fair)
        SELECT * FROM (
         SELECT s.job_id, s.priority, s.run_at
         FROM queue_job_state AS s
         WHERE s.priority = at.priority AND (s.run_at, s.job_id) > (at.run_at, at.job_id)
           AND s.queue = %(queue)s::text AND s.status = 'pending' AND s.fair_key = %(key)s::text
           AND s.run_at <= now() AND s.concurrency_key IS NULL
         ORDER BY s.priority DESC, s.run_at, s.job_id
         LIMIT %(limit)s::integer
         FOR UPDATE OF s SKIP LOCKED) AS resumed
        UNION ALL
        SELECT * FROM (
         SELECT s.job_id, s.priority, s.run_at
         FROM queue_job_state AS s
         WHERE NOT coalesce(
                   s.priority = at.priority AND (s.run_at, s.job_id) > (at.run_at, at.job_id),
                   false)
           AND s.queue = %(queue)s::text AND s.status = 'pending' AND s.fair_key = %(key)s::text
           AND s.run_at <= now() AND s.concurrency_key IS NULL
         ORDER BY s.priority DESC, s.run_at, s.job_id
         LIMIT %(limit)s::integer
         FOR UPDATE OF s SKIP LOCKED) AS front
        LIMIT %(limit)s::integer
    ) AS locked
)
SELECT claimed.*, %(key)s::text AS last_key, %(key)s::text AS alone,
       %(resume)s::jsonb || coalesce(
           (SELECT jsonb_build_object(
                       %(key)s::text, jsonb_build_array(taken.priority, taken.run_at, taken.job_id))
            FROM taken ORDER BY taken.place DESC LIMIT 1),
           '{}') AS resume
FROM (SELECT) AS one
LEFT JOIN LATERAL pgqueue_claim(
    ARRAY(SELECT taken.job_id FROM taken ORDER BY taken.place),
    %(queue)s::text, %(worker_id)s::text, %(lease)s::float8, NULL
) AS claimed ON true;


-- name: fair_keys_page
-- The admin's page of a fair queue's keys: up to `limit` keys with pending jobs after
-- `after` (NULL: from the first key), in key order, found as the claim's walk finds them
-- (one probe of queue_job_state_fair_idx a key, a skip scan); for each, its pending jobs
-- due now and scheduled later, counted on the same index up to `cap` jobs of the key;
-- its running jobs (the queue's running rows, read once: as many as its workers run);
-- and its starts among the queue's starts in the newest `sample` attempts of the last
-- `minutes` minutes (the attempts' newest ids, each joined to its job by primary key).
-- Bounded work at any number of keys, whatever the backlog of each. Sent after
-- stats_no_jit (the planner guesses many keys and costs the skip scan high).
WITH RECURSIVE keys (fair_key, depth) AS (
    (SELECT s.fair_key, 1
     FROM queue_job_state AS s
     WHERE s.queue = %(queue)s AND s.status = 'pending' AND s.fair_key IS NOT NULL
       AND (%(after)s::text IS NULL OR s.fair_key > %(after)s::text)
     ORDER BY s.fair_key
     LIMIT 1)
    UNION ALL
    SELECT next.fair_key, keys.depth + 1
    FROM keys
    CROSS JOIN LATERAL (
        SELECT s.fair_key
        FROM queue_job_state AS s
        WHERE s.queue = %(queue)s AND s.status = 'pending' AND s.fair_key IS NOT NULL
          AND s.fair_key > keys.fair_key
        ORDER BY s.fair_key
        LIMIT 1
    ) AS next
    WHERE keys.depth < %(limit)s
), running AS MATERIALIZED (
    SELECT s.fair_key, count(*) AS jobs
    FROM queue_job_state AS s
    WHERE s.status = 'running' AND s.queue = %(queue)s AND s.fair_key IS NOT NULL
    GROUP BY s.fair_key
), starts AS MATERIALIZED (
    -- the queue's keyed starts among the newest attempts, in the window
    SELECT s.fair_key
    FROM (
        SELECT a.job_id, a.started_at
        FROM queue_attempts AS a
        ORDER BY a.id DESC
        LIMIT %(sample)s
    ) AS recent
    JOIN queue_job_state AS s ON s.job_id = recent.job_id
    WHERE s.queue = %(queue)s AND s.fair_key IS NOT NULL
      AND recent.started_at > now() - make_interval(mins => %(minutes)s)
), shares AS MATERIALIZED (
    SELECT starts.fair_key, count(*) AS jobs
    FROM starts
    GROUP BY starts.fair_key
)
SELECT keys.fair_key,
       pending.due,
       pending.later,
       coalesce(running.jobs, 0) AS running,
       coalesce(shares.jobs, 0) AS starts,
       (SELECT count(*) FROM starts) AS all_starts
FROM keys
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE first.run_at <= now()) AS due,
           count(*) FILTER (WHERE first.run_at > now()) AS later
    FROM (
        SELECT s.run_at
        FROM queue_job_state AS s
        WHERE s.queue = %(queue)s AND s.status = 'pending' AND s.fair_key = keys.fair_key
        LIMIT %(cap)s
    ) AS first
) AS pending
LEFT JOIN running ON running.fair_key = keys.fair_key
LEFT JOIN shares ON shares.fair_key = keys.fair_key
ORDER BY keys.depth;
