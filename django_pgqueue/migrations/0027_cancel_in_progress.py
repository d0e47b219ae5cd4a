# Cancel-in-progress on a key, and sequences' rows that may be pruned.
#
# - pgqueue_enqueue_cancel_running: an enqueue with Unique.cancel_running(key). The key
#   is a sequence key of the queue (its jobs run one at a time, in enqueue order): under
#   the sequence's row lock (held until the caller's transaction ends), the key's jobs
#   not running (its waiting ones; a head pending, or parked for an event) are
#   cancelled and settled as job_cancel settles them, the running head gets a cancel
#   request (job_cancel_request's mark: the worker hears of it at its next renewal),
#   then the new job is written with pgqueue_enqueue_sequenced, on_failure 'continue'.
#   Behind a running head it waits: the head stays running until its code returned
#   (the fenced write that ends it, or the sweep once its process is gone), and only
#   that end moves the sequence on (pgqueue_settle -> pgqueue_sequence_next). The new
#   job never starts while the cancelled code runs: the hold.
# - pgqueue_sequence_next took its sequences' rows with SELECT ... FOR UPDATE; the prune
#   now deletes the row of a sequence with nothing left (head NULL), so it writes the
#   row again when it is gone (INSERT ... ON CONFLICT DO UPDATE: the row locked either
#   way): a dead or cancelled job of a pruned sequence, retried, finds its row and runs.

import importlib

from django.db import migrations

_sequences = importlib.import_module("django_pgqueue.migrations.0023_sequences")

OLD_SEQUENCE_NEXT = _sequences.SEQUENCE_NEXT.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)
OLD_LOCK = """\
    PERFORM FROM queue_sequences AS seq
    WHERE (seq.queue, seq.sequence_key) IN (
        SELECT state.queue, state.sequence_key
        FROM queue_job_state AS state
        WHERE state.job_id = ANY (p_job_ids) AND state.sequence_key IS NOT NULL
    )
    ORDER BY seq.queue, seq.sequence_key
    FOR UPDATE;
"""
NEW_LOCK = """\
    -- A sequence whose row was pruned (nothing was left of it) gets it back: an
    -- operator's retry of one of its finished jobs.
    INSERT INTO queue_sequences AS seq (queue, sequence_key, head_job_id)
    SELECT DISTINCT state.queue, state.sequence_key, NULL::bigint
    FROM queue_job_state AS state
    WHERE state.job_id = ANY (p_job_ids) AND state.sequence_key IS NOT NULL
    ORDER BY state.queue, state.sequence_key
    ON CONFLICT (queue, sequence_key) DO UPDATE SET head_job_id = seq.head_job_id;
"""
if OLD_SEQUENCE_NEXT.count(OLD_LOCK) != 1:
    raise RuntimeError("the pgqueue_sequence_next of 0023 is not the text 0027 expects")
NEW_SEQUENCE_NEXT = OLD_SEQUENCE_NEXT.replace(OLD_LOCK, NEW_LOCK)

ENQUEUE_CANCEL_RUNNING = r"""
CREATE FUNCTION pgqueue_enqueue_cancel_running(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_traceparent text, p_concurrency_key text,
    p_fair_key text, p_key text,
    OUT job_id bigint, OUT head boolean, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
    v_cancelled bigint[];
BEGIN
    -- The key's row, locked until the caller's transaction ends: the statements below
    -- see every enqueue of the key committed before.
    INSERT INTO queue_sequences AS seq (queue, sequence_key, head_job_id)
    VALUES (p_queue, p_key, NULL)
    ON CONFLICT (queue, sequence_key) DO UPDATE SET head_job_id = seq.head_job_id
    RETURNING seq.head_job_id INTO v_head;
    -- The running head: asked to stop; it holds its place until its code returned.
    UPDATE queue_job_state AS state
    SET cancel_requested_at = now(), updated_at = now()
    WHERE state.job_id = v_head AND state.status = 'running'
      AND state.cancel_requested_at IS NULL;
    -- Every other job of the key not finished: cancelled (the head pending or parked,
    -- the waiting ones behind it), as job_cancel cancels them.
    WITH cancelled AS (
        UPDATE queue_job_state AS state
        SET status = 'cancelled', finished_at = now(), updated_at = now()
        WHERE state.job_id IN (
                SELECT v_head
                UNION ALL
                SELECT waiting.job_id
                FROM queue_job_state AS waiting
                WHERE waiting.queue = p_queue
                  AND waiting.sequence_key = p_key
                  AND waiting.status = 'waiting'
            )
          AND state.status IN ('pending', 'waiting')
        RETURNING state.job_id
    )
    SELECT array_agg(cancelled.job_id) INTO v_cancelled FROM cancelled;
    IF v_cancelled IS NOT NULL THEN
        -- Their wait() callers wake; their sequence moves on (a cancelled head lets go:
        -- with nothing left waiting, the head is none).
        PERFORM pg_notify('pgqueue_finished', w.queue)
        FROM queue_job_waiters AS w
        WHERE w.job_id = ANY (v_cancelled);
        PERFORM pgqueue_settle('{}', v_cancelled);
    END IF;
    SELECT e.job_id, e.head, e.created_at INTO job_id, head, created_at
    FROM pgqueue_enqueue_sequenced(
        p_queue, p_type, p_payload, p_priority, p_run_at, p_delay, p_max_attempts,
        p_traceparent, p_concurrency_key, p_fair_key, p_key, 'continue'
    ) AS e;
END
$$
"""

ENQUEUE_CANCEL_RUNNING_SIGNATURE = (
    "pgqueue_enqueue_cancel_running(text, text, jsonb, smallint, timestamptz, float8, "
    "integer, text, text, text, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0025_started_steps_stay_run")]

    operations = [
        migrations.RunSQL(
            sql=[NEW_SEQUENCE_NEXT, ENQUEUE_CANCEL_RUNNING],
            reverse_sql=[f"DROP FUNCTION {ENQUEUE_CANCEL_RUNNING_SIGNATURE}", OLD_SEQUENCE_NEXT],
        )
    ]
