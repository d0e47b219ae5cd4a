-- Sequences (enqueue(sequence=...)): jobs with one sequence key run one at a time, in
-- enqueue order. The work is in the squashed migration's functions: the sequence's row in
-- queue_sequences names its head and is its lock; every statement that ends a job moves
-- its sequence on through pgqueue_settle -> pgqueue_sequence_next. The claim statements
-- know nothing of sequences: a job behind its sequence's head is waiting.


-- name: job_enqueue_sequenced
-- Insert one job of a sequence and return (id, head, created_at): head is true when
-- the job is its sequence's head (pending, due at its run_at), false when it waits
-- behind an unfinished earlier job of its sequence. pgqueue_enqueue_sequenced takes the
-- sequence's row lock (held until the caller's transaction ends), then writes the job
-- with pgqueue_enqueue: concurrent enqueues of one sequence queue on the row, in order.
SELECT job_id, head, created_at
FROM pgqueue_enqueue_sequenced(
    %(queue)s::text, %(type)s::text, %(payload)s::jsonb, %(priority)s::smallint,
    %(run_at)s::timestamptz, %(delay)s::float8, %(max_attempts)s::integer,
    %(traceparent)s::text, %(concurrency_key)s::text, %(fair_key)s::text,
    %(sequence_key)s::text, %(sequence_on_failure)s::text
);




-- name: sequence_lock_many
-- Take the rows of the sequences an enqueue_many() call writes jobs of (written when
-- missing), in key order, until the caller's transaction ends: then its jobs are
-- written one by one in list order (job_enqueue_many_sequenced), and concurrent calls
-- naming the same sequences in other orders wait for each other instead of deadlocking.
INSERT INTO queue_sequences AS seq (queue, sequence_key, head_job_id)
SELECT DISTINCT i.queue, i.sequence_key, NULL::bigint
FROM ROWS FROM (unnest(%(queues)s::text[]), unnest(%(sequence_keys)s::text[]))
    AS i(queue, sequence_key)
ORDER BY i.queue, i.sequence_key
ON CONFLICT (queue, sequence_key) DO UPDATE SET head_job_id = seq.head_job_id;


-- name: job_enqueue_many_sequenced
-- Insert many jobs, each with a sequence key, in list order: the rows are numbered as
-- job_enqueue_many's are and pgqueue_enqueue_sequenced is called per
-- row, in the rows' order (a nested loop over the numbered rows: the lateral call
-- depends on each), so a sequence's ids, its run order, follow the list. Returns each
-- job's id, in list order.
SELECT e.job_id
FROM ROWS FROM (
    unnest(%(queues)s::text[]), unnest(%(types)s::text[]),
    unnest(%(priorities)s::smallint[]), unnest(%(run_ats)s::timestamptz[]),
    unnest(%(delays)s::float8[]), unnest(%(max_attempts)s::integer[]),
    unnest(%(concurrency_keys)s::text[]), unnest(%(fair_keys)s::text[]),
    unnest(%(sequence_keys)s::text[]), unnest(%(sequence_on_failures)s::text[]),
    jsonb_array_elements(%(payloads)s::jsonb)
) WITH ORDINALITY
    AS i(queue, type, priority, run_at, delay, max_attempts, concurrency_key, fair_key,
         sequence_key, on_failure, payload, position)
CROSS JOIN LATERAL pgqueue_enqueue_sequenced(
    i.queue, i.type, i.payload, i.priority, i.run_at, i.delay, i.max_attempts,
    %(traceparent)s::text, i.concurrency_key, i.fair_key, i.sequence_key, i.on_failure
) AS e
ORDER BY i.position;

-- name: job_enqueue_cancel_running
-- Insert one job of a cancel-in-progress key (Unique.cancel_running) and return (id,
-- head, created_at), as job_enqueue_sequenced does: the key is a sequence key. Under
-- the sequence's row lock, pgqueue_enqueue_cancel_running cancels the
-- key's jobs that are not running, asks its running head to stop (cancel requested),
-- then writes the job, which waits while that head's code still runs.
SELECT job_id, head, created_at
FROM pgqueue_enqueue_cancel_running(
    %(queue)s::text, %(type)s::text, %(payload)s::jsonb, %(priority)s::smallint,
    %(run_at)s::timestamptz, %(delay)s::float8, %(max_attempts)s::integer,
    %(traceparent)s::text, %(concurrency_key)s::text, %(fair_key)s::text,
    %(unique_key)s::text
);

-- name: sequence_release
-- Let a held sequence go on past its dead head (the head's on_failure becomes
-- 'continue'; its next waiting job is pending): (released head, new head), released
-- NULL when the sequence's head was not dead and holding (retried or released
-- meanwhile).
SELECT released, head FROM pgqueue_sequence_release(%(queue)s::text, %(sequence_key)s::text);


-- name: sequence_prune_batch
-- Delete at most `limit` rows of sequences with nothing left (no head: no job of the
-- sequence pending, running, parked, held or waiting), walking the primary key upwards
-- from after_id. An enqueue of the sequence holds its row locked (taken with its head
-- set, until its transaction ends): SKIP LOCKED passes such a row, and the lock rechecks
-- a row changed since this statement's snapshot (a head set meanwhile keeps it). An
-- enqueue that meets a deleted row writes it again (INSERT ... ON CONFLICT), as does
-- pgqueue_sequence_next (an operator's retry of a finished job of the sequence).
WITH doomed AS MATERIALIZED (
    SELECT seq.id
    FROM queue_sequences AS seq
    WHERE seq.id > %(after_id)s::bigint
      AND seq.head_job_id IS NULL
    ORDER BY seq.id
    LIMIT %(limit)s::integer
    FOR UPDATE SKIP LOCKED
)
DELETE FROM queue_sequences AS seq
USING doomed
WHERE seq.id = doomed.id
RETURNING seq.id;
