-- Durable execution inside a handler: checkpoints, sleeps, events (store/durable.py).

-- name: step_load
-- Every checkpoint of a job, in one statement, with the database's clock (a sleep's
-- wake-up is compared with it): {name: [kind, result]}, NULL when it has none.
SELECT now(),
       (SELECT jsonb_object_agg(step.name, jsonb_build_array(step.kind, step.result))
        FROM queue_job_steps AS step
        WHERE step.job_id = %(job_id)s::bigint);


-- name: step_record
-- Record a checkpoint, fenced by the job's lease: inserted only while the job is
-- running under this lease version. The state row is locked FOR SHARE until the
-- transaction ends, so the lease cannot be taken (the sweep, an operator) between the
-- fence and the commit: in an atomic step, the step's writes commit with the
-- checkpoint under the lease or roll back with it. A step's checkpoint is its result
-- (%(result)s); a durable sleep's (kind 'sleep') is its wake-up by the database's
-- clock: at %(wake_at)s, or (NULL) at now() + %(seconds)s. Returns the wake-up and
-- the seconds left until it (<= 0: due; NULL for a step). No row back: not recorded
-- (the lease was lost, or the name has a checkpoint already). recorded_at is the
-- insert's own time, not its transaction's: the steps of one transaction of the
-- handler's (atomic steps in its transaction.atomic()) keep the order they ran in, which
-- step_run_again goes by.
-- %(flush)s false (a plain step's checkpoint outside any transaction of the handler's):
-- it commits without waiting for its WAL to reach the disk (synchronous_commit off for
-- this transaction only). A server crash may then lose it, as a worker killed before its
-- commit would: the step runs again, which a plain step may (at least once). What the
-- steps before and after depend on stays in order: WAL is flushed in order, and the next
-- flushed commit (an atomic step's, a sleep's, the job's end) flushes it too.
WITH commit_mode AS MATERIALIZED (
    SELECT set_config('synchronous_commit', 'off', true)
    WHERE NOT %(flush)s::boolean
)
INSERT INTO queue_job_steps (job_id, name, kind, result, lease_version, runtime, recorded_at)
SELECT state.job_id, %(name)s::text, %(kind)s::text,
       CASE WHEN %(kind)s::text = 'sleep'
            THEN jsonb_build_object('wake_at', coalesce(
                %(wake_at)s::timestamptz, now() + make_interval(secs => %(seconds)s::float8)
            ))
            ELSE %(result)s::jsonb
       END,
       state.lease_version, %(runtime)s::float8, clock_timestamp()
FROM queue_job_state AS state
LEFT JOIN commit_mode ON true
WHERE state.job_id = %(job_id)s::bigint
  AND state.lease_version = %(lease_version)s::bigint
  AND state.status = 'running'
FOR SHARE OF state
ON CONFLICT (job_id, name) DO NOTHING
RETURNING result ->> 'wake_at',
          extract(epoch FROM (result ->> 'wake_at')::timestamptz - now())::float8;


-- name: event_take
-- A wait for an event already emitted: its payload recorded as the wait's checkpoint,
-- fenced and timed like step_record, so the handler goes on without parking. No row: no such
-- event yet (the handler parks: job_park), or the lease was lost.
INSERT INTO queue_job_steps (job_id, name, kind, result, lease_version, recorded_at)
SELECT state.job_id, %(name)s::text, 'event', jsonb_build_object('payload', event.payload),
       state.lease_version, clock_timestamp()
FROM queue_job_state AS state
JOIN queue_events AS event ON event.key = %(key)s::text
WHERE state.job_id = %(job_id)s::bigint
  AND state.lease_version = %(lease_version)s::bigint
  AND state.status = 'running'
FOR SHARE OF state
ON CONFLICT (job_id, name) DO NOTHING
RETURNING result;


-- name: job_park
-- End an attempt that waits for an event: the job waits (in no claim index) until
-- the event is emitted or the wait's timeout passes, its attempt given back; an event
-- emitted meanwhile makes it pending at once. Fenced; returns the new status and
-- run_at, or no row when the lease was lost (pgqueue_park).
SELECT status, run_at
FROM pgqueue_park(
    %(job_id)s::bigint, %(lease_version)s::bigint, %(attempt_id)s::bigint, %(key)s::text,
    %(name)s::text, %(timeout)s::float8, %(reason)s::text
);


-- name: event_emit
-- Emit an event, in the caller's transaction: stored once (the first emit of a key
-- wins), delivered to the jobs waiting for it (each wait's checkpoint, the job
-- pending), NOTIFY at commit. Returns whether this emit stored it and to how many
-- waits it was delivered (pgqueue_emit).
SELECT emitted, delivered FROM pgqueue_emit(%(key)s::text, %(payload)s::jsonb);


-- name: event_wait_timeout
-- Time out the waits whose timeout passed: the ones no emit holds (it takes them
-- itself) end with a checkpoint that says the wait timed out, each wait's row taken
-- once (pgqueue_end_event_waits), its job pending again. Returns the
-- queues of the jobs woken, for the worker's claims.
SELECT DISTINCT ended.woken_queue AS queue
FROM pgqueue_end_event_waits(
    ARRAY(
        SELECT due.job_id
        FROM queue_event_waits AS due
        WHERE due.timeout_at <= now()
        ORDER BY due.timeout_at
        LIMIT %(limit)s::integer
        FOR UPDATE SKIP LOCKED
    ),
    '{"timed_out": true}'::jsonb
) AS ended
WHERE ended.woken_queue IS NOT NULL;


-- name: step_run_again
-- Operator: a job runs again from its checkpoint %(name)s. That checkpoint and every
-- one recorded after it (the order the admin's job page lists them in: recorded_at,
-- then name) are deleted, with the job's event wait if it has one (a wait comes after
-- every checkpoint); the checkpoints recorded before it stay, and their steps do not
-- run again. It runs in the operator's transaction right after job_retry_now made the
-- job due again, whose row lock it holds until the commit: no worker claims the job
-- between the two, and a handler still running under an earlier lease records nothing
-- more (its lease version is behind). A running job's checkpoints are never touched.
-- Returns the names deleted; no row when the job has no checkpoint of that name (or
-- runs), and the caller then rolls the retry back.
WITH chosen AS MATERIALIZED (
    SELECT step.job_id, step.recorded_at, step.name
    FROM queue_job_steps AS step
    JOIN queue_job_state AS state ON state.job_id = step.job_id
    WHERE step.job_id = %(job_id)s::bigint
      AND step.name = %(name)s::text
      AND state.status <> 'running'
), unwaited AS (
    DELETE FROM queue_event_waits AS wait
    USING chosen
    WHERE wait.job_id = chosen.job_id
)
DELETE FROM queue_job_steps AS step
USING chosen
WHERE step.job_id = chosen.job_id
  AND (step.recorded_at, step.name) >= (chosen.recorded_at, chosen.name)
RETURNING step.name;


-- name: step_sleep_due_now
-- Testing (django_pgqueue.testing.run_durable): bring a pending job's durable sleeps
-- due now, their wake-up and the job's run_at moved to now() (the database's clock is
-- left alone). Returns the job if a sleep was moved.
WITH moved AS (
    UPDATE queue_job_steps AS step
    SET result = jsonb_build_object('wake_at', now())
    WHERE step.job_id = %(job_id)s::bigint
      AND step.kind = 'sleep'
      AND (step.result ->> 'wake_at')::timestamptz > now()
    RETURNING step.job_id
)
UPDATE queue_job_state AS state
SET run_at = now(), updated_at = now()
WHERE state.job_id = %(job_id)s::bigint
  AND state.status = 'pending'
  AND EXISTS (SELECT FROM moved)
RETURNING state.job_id;


-- name: event_wait_due_now
-- Testing (django_pgqueue.testing.run_durable): make a parked job's wait time out now
-- (event_wait_timeout then takes it). Returns the job if it has a wait.
UPDATE queue_event_waits AS wait
SET timeout_at = now()
WHERE wait.job_id = %(job_id)s::bigint
RETURNING wait.job_id;


-- name: event_prune_batch
-- Prune: delete the events emitted before the cutoff among the next `limit` keys above
-- after_key, walking the primary key (no index over emitted_at is needed); returns the
-- last key looked at (NULL: none left), how many were looked at and deleted. An event
-- is finished once emitted (delivered to the waits then, kept for a later wait): it
-- goes with the completed jobs' retention.
WITH scanned AS MATERIALIZED (
    SELECT event.key, event.emitted_at
    FROM queue_events AS event
    WHERE event.key > %(after_key)s::text
    ORDER BY event.key
    LIMIT %(limit)s::integer
), deleted AS (
    DELETE FROM queue_events AS event
    USING scanned
    WHERE event.key = scanned.key
      AND scanned.emitted_at < %(cutoff)s::timestamptz
    RETURNING event.key
)
SELECT (SELECT max(scanned.key) FROM scanned), (SELECT count(*) FROM scanned),
       (SELECT count(*) FROM deleted);


-- name: event_prune_count
-- Prune, dry run: how many events were emitted before the cutoff.
SELECT count(*) FROM queue_events WHERE emitted_at < %(cutoff)s::timestamptz;


-- name: stats_parked
-- For the stats and the metrics: per queue of %(queues)s, the jobs sleeping (pending,
-- not due, a durable sleep's wake-up still ahead) and the jobs parked for an event
-- (waiting, with an event wait). Each reads at most %(cap)s of the queue's not-due
-- pending jobs, and of its waiting jobs, from the claim index and the waiting index,
-- probing each one's steps or wait by key; the scanned counts say whether a count
-- stopped at the cap (it then means "at least").
SELECT q.queue, sleeping.jobs, sleeping.scanned, awaiting.jobs, awaiting.scanned
FROM unnest(%(queues)s::text[]) AS q(queue)
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE EXISTS (
               SELECT FROM queue_job_steps AS step
               WHERE step.job_id = later.job_id
                 AND step.kind = 'sleep'
                 AND (step.result ->> 'wake_at')::timestamptz > now()
           )) AS jobs,
           count(*) AS scanned
    FROM (SELECT state.job_id FROM queue_job_state AS state
          WHERE state.status = 'pending' AND state.queue = q.queue AND state.run_at > now()
          LIMIT %(cap)s::int8) AS later
) AS sleeping
CROSS JOIN LATERAL (
    SELECT count(*) FILTER (WHERE EXISTS (
               SELECT FROM queue_event_waits AS wait WHERE wait.job_id = waiting.job_id
           )) AS jobs,
           count(*) AS scanned
    FROM (SELECT state.job_id FROM queue_job_state AS state
          WHERE state.status = 'waiting' AND state.queue = q.queue
          LIMIT %(cap)s::int8) AS waiting
) AS awaiting;
