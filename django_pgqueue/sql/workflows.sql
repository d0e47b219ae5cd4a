-- Workflows (django_pgqueue.workflows) and batches (django_pgqueue.workflows.batches).
--
-- A job may wait for others: queue_job_deps holds the edges, queue_workflow_steps each
-- step's failure policy and counters. The statements that end a job settle its
-- dependents (see job_complete in core.sql). The ones below write and read workflows.
--
-- A batch's members are plain jobs, its callbacks the steps of a workflow, each
-- waiting for every member through queue_job_deps, so the statements that end a member
-- settle them (pgqueue_settle) like any other step: once, under the step row's lock,
-- in the transaction of the member's final write.


-- name: workflow_enqueue
-- Insert a whole workflow in one statement: its row, every step's job, state and step
-- row, and the edges between them; wake the queues of the steps due now. Arrays are
-- parallel, one element per step (payloads one JSON array); a step that waits for
-- others (waiting_for > 0) starts 'waiting', in no claim index, the others 'pending';
-- has_dependents is true for a step others wait for (NULL otherwise); collects is
-- true for a step that takes its parents' results as one list. A waiting step's delay
-- is also its step row's: pgqueue_settle counts it again from its last dependency's end.
-- Edges are pairs of positions (1-based) in those arrays: children[i] waits for
-- parents[i]; the caller checked they form a DAG. Returns (workflow id, job ids in
-- input order); a workflow of no steps (an empty group) is its row alone.
-- Its rows are numbered, and its jobs and state rows written, as job_enqueue_many's
-- are, with the steps' columns zipped in: job_enqueue_many stays the plain bulk
-- insert, without a workflow's row, step rows, edges and waiting status.
WITH numbered AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('queue_jobs', 'id')::regclass)) AS id, i.*
    FROM ROWS FROM (
        unnest(%(queues)s::text[]), unnest(%(types)s::text[]),
        unnest(%(priorities)s::smallint[]), unnest(%(run_ats)s::timestamptz[]),
        unnest(%(delays)s::float8[]), unnest(%(max_attempts)s::integer[]),
        unnest(%(names)s::text[]), unnest(%(on_failures)s::text[]),
        unnest(%(waiting_for)s::integer[]), unnest(%(has_dependents)s::boolean[]),
        unnest(%(collects)s::boolean[]), jsonb_array_elements(%(payloads)s::jsonb)
    ) WITH ORDINALITY
        AS i(queue, type, priority, run_at, delay, max_attempts, name, on_failure,
             waiting_for, parent, collects, payload, position)
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
    INSERT INTO queue_workflow_steps (
        job_id, workflow_id, name, on_failure, waiting_for, failed, collects, delay
    )
    SELECT numbered.id, flow.id, numbered.name, numbered.on_failure, numbered.waiting_for, 0,
           numbered.collects,
           CASE WHEN numbered.waiting_for > 0 THEN numbered.delay ELSE 0 END
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
SELECT (SELECT id FROM flow),
       coalesce(array_agg(numbered.id ORDER BY numbered.position), '{}')
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


-- name: workflow_step_input
-- What a step takes from its parents: whether their results come as one list, and its
-- failure policy ('error': a link_error step, given the failure). No row: no step.
SELECT step.collects, step.on_failure
FROM queue_workflow_steps AS step
WHERE step.job_id = %(job_id)s::bigint;


-- name: workflow_parent_failures
-- The jobs a job waits for that ended dead or cancelled, for a link_error step: (step
-- name, job id, status, the job's last error, and its last failed attempt's error class
-- and traceback), in job id order.
SELECT step.name, dep.depends_on, state.status, state.last_error, last.error_class,
       last.traceback
FROM queue_job_deps AS dep
JOIN queue_workflow_steps AS step ON step.job_id = dep.depends_on
JOIN queue_job_state AS state ON state.job_id = dep.depends_on
LEFT JOIN LATERAL (
    SELECT attempt.error_class, attempt.traceback
    FROM queue_attempts AS attempt
    WHERE attempt.job_id = dep.depends_on AND attempt.status <> 'succeeded'
      AND attempt.error_class IS NOT NULL
    ORDER BY attempt.lease_version DESC
    LIMIT 1
) AS last ON true
WHERE dep.job_id = %(job_id)s::bigint AND state.status IN ('dead', 'cancelled')
ORDER BY dep.depends_on;


-- name: workflow_failure
-- The first step of a workflow that failed by itself: ended dead, or cancelled by an
-- operator (not by the settle, which records the culprit in cancelled_by, and not a
-- link_error step skipped because nothing failed): (step name, job id, status, last
-- error), or no row. Reads the workflow's steps by the (workflow_id, name) index.
SELECT step.name, step.job_id, state.status, state.last_error
FROM queue_workflow_steps AS step
JOIN queue_job_state AS state ON state.job_id = step.job_id
WHERE step.workflow_id = %(workflow_id)s::bigint
  AND (state.status = 'dead'
       OR (state.status = 'cancelled' AND step.cancelled_by IS NULL
           AND NOT (step.on_failure = 'error' AND step.failed = 0)))
ORDER BY state.status = 'dead' DESC, step.job_id
LIMIT 1;


-- name: workflow_jobs
-- The jobs of a workflow by status, for cancelling it: (job id, status).
SELECT step.job_id, state.status
FROM queue_workflow_steps AS step
JOIN queue_job_state AS state ON state.job_id = step.job_id
WHERE step.workflow_id = %(workflow_id)s::bigint;


-- name: workflow_page
-- One keyset page of workflows, newest first, for the admin: (id, name, steps, created_at,
-- waiting, pending, running, completed, dead, cancelled, skipped, started_at,
-- finished_at, state, scanned_to, scanned). Reads at most `scan` workflows with ids below
-- `before` (the primary key, backwards), and each one's steps through the
-- (workflow_id, name) unique index with their state rows and first attempts by key;
-- nothing counts the whole table. The state is derived from the steps: running while
-- any step is waiting, pending or running; then failed if one ended dead, cancelled if
-- one was cancelled, else finished; pruned once prune_queue_jobs deleted its steps
-- (the workflow's row stays; an empty group, written with no steps, is finished). A link_error step skipped because nothing failed
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
               WHEN counts.present = 0 AND scanned.steps > 0 THEN 'pruned'
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
