-- Recurring jobs (django_pgqueue.schedules): the ticks a worker fires, the schedules
-- declared in code, and the operators' view of late ones.


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
