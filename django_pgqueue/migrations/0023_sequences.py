# Sequences: jobs with one sequence key run one at a time, in enqueue order.
#
# - queue_sequences: a row per (queue, sequence key) naming the sequence's head, the one
#   job of it that may be pending, running, parked or held (dead, with on_failure
#   'hold'); every later job of the sequence is written `waiting` (in no claim index:
#   the claim statements are unchanged). The row is the sequence's lock.
# - pgqueue_enqueue_sequenced: takes the sequence's row (INSERT ... ON CONFLICT DO
#   UPDATE: locked until the caller's transaction ends, its head the latest committed),
#   then writes the job with pgqueue_enqueue, its id drawn under the lock, so a
#   sequence's ids are its enqueue order. No head: the job is the head, pending;
#   otherwise it waits. Concurrent enqueues of one sequence queue on the row: never two
#   heads.
# - pgqueue_sequence_next: the one rule that moves a sequence on, under its row's lock:
#   when its head is none, gone, completed, cancelled, dead with on_failure 'continue',
#   or put back to waiting by an operator's retry, its first waiting job (lowest id)
#   becomes pending and the head (none: the head is NULL). Called by pgqueue_settle for
#   the jobs it settles: a sequenced job has has_dependents set, so every statement that
#   ends a job (complete, fail, release, sweep, cancel, give back, park) moves its
#   sequence on in its own transaction, as it settles a workflow's dependents; a
#   refused (stale) write moves nothing. A retry (failure, lost lease) keeps the job
#   pending: it stays the head. job_retry_now (sql/core.sql) puts a retried sequenced
#   job back to waiting, unless it heads its sequence, and calls it too.
# - pgqueue_sequence_release: an operator lets a held sequence go on past its dead head
#   (its on_failure becomes 'continue'), by the same rule.

import importlib

from django.db import migrations, models

_squash = importlib.import_module("django_pgqueue.migrations.0001_squashed_0022_many_tenants")

OLD_SETTLE = _squash.SETTLE.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
SETTLE_START = "BEGIN\n    WHILE cardinality(v_completed) + cardinality(v_failed) > 0 LOOP\n"
if OLD_SETTLE.count(SETTLE_START) != 1:
    raise RuntimeError("the pgqueue_settle of the squash (0001-0022) is not the text 0023 expects")
NEW_SETTLE = OLD_SETTLE.replace(
    SETTLE_START,
    "BEGIN\n"
    "    -- Sequences: the jobs given move their sequences on (their row locks first).\n"
    "    PERFORM pgqueue_sequence_next(v_completed || v_failed);\n"
    "    WHILE cardinality(v_completed) + cardinality(v_failed) > 0 LOOP\n",
)
GENERIC = (
    "ALTER FUNCTION pgqueue_settle(bigint[], bigint[]) SET plan_cache_mode = force_generic_plan"
)

SEQUENCE_NEXT = _squash._generic_plans(
    "pgqueue_sequence_next(p_job_ids bigint[]) RETURNS integer",
    r"""DECLARE
    v_moved integer;
BEGIN
    -- The sequences of the given jobs, locked in key order (an enqueue holds one at a
    -- time). Once locked, the next statement's snapshot sees every enqueue and every
    -- move committed before: no waiting job is missed, none released twice.
    PERFORM FROM queue_sequences AS seq
    WHERE (seq.queue, seq.sequence_key) IN (
        SELECT state.queue, state.sequence_key
        FROM queue_job_state AS state
        WHERE state.job_id = ANY (p_job_ids) AND state.sequence_key IS NOT NULL
    )
    ORDER BY seq.queue, seq.sequence_key
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    WITH free AS (
        -- The sequences whose head let go: none, gone, finished for its sequence, or
        -- one of the given jobs put back to waiting (an operator's retry of the head).
        SELECT seq.id, seq.queue, seq.sequence_key
        FROM queue_sequences AS seq
        LEFT JOIN queue_job_state AS head ON head.job_id = seq.head_job_id
        WHERE (seq.queue, seq.sequence_key) IN (
            SELECT state.queue, state.sequence_key
            FROM queue_job_state AS state
            WHERE state.job_id = ANY (p_job_ids) AND state.sequence_key IS NOT NULL
        )
          AND (head.job_id IS NULL
               OR head.status IN ('completed', 'cancelled')
               OR (head.status = 'dead' AND head.sequence_on_failure = 'continue')
               OR (head.status = 'waiting' AND head.job_id = ANY (p_job_ids)))
    ), chosen AS (
        SELECT free.id,
               (SELECT waiting.job_id
                FROM queue_job_state AS waiting
                WHERE waiting.queue = free.queue
                  AND waiting.sequence_key = free.sequence_key
                  AND waiting.status = 'waiting'
                ORDER BY waiting.job_id
                LIMIT 1) AS next_id
        FROM free
    ), moved AS (
        UPDATE queue_job_state AS state
        SET status = 'pending', run_at = greatest(state.run_at, now()), updated_at = now()
        FROM chosen
        WHERE state.job_id = chosen.next_id AND state.status = 'waiting'
        RETURNING state.job_id, state.queue
    ), headed AS (
        UPDATE queue_sequences AS seq
        SET head_job_id = chosen.next_id
        FROM chosen
        WHERE seq.id = chosen.id
        RETURNING seq.id
    ), wake AS (
        SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
        FROM (SELECT DISTINCT queue FROM moved) AS due
    )
    SELECT count(moved.job_id) INTO v_moved
    FROM wake CROSS JOIN (SELECT count(*) FROM headed) AS heads LEFT JOIN moved ON true;
    RETURN v_moved;
END
""",
)

ENQUEUE_SEQUENCED = r"""
CREATE FUNCTION pgqueue_enqueue_sequenced(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_traceparent text, p_concurrency_key text,
    p_fair_key text, p_sequence_key text, p_on_failure text,
    OUT job_id bigint, OUT head boolean, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_head bigint;
BEGIN
    -- The sequence's row, locked until the caller's transaction ends; its head is the
    -- latest committed (ON CONFLICT DO UPDATE reads the newest version it locks).
    INSERT INTO queue_sequences AS seq (queue, sequence_key, head_job_id)
    VALUES (p_queue, p_sequence_key, NULL)
    ON CONFLICT (queue, sequence_key) DO UPDATE SET head_job_id = seq.head_job_id
    RETURNING seq.head_job_id INTO v_head;
    SELECT e.job_id, e.created_at INTO job_id, created_at
    FROM pgqueue_enqueue(
        p_queue, p_type, p_payload, p_priority, p_run_at, p_delay, p_max_attempts, NULL,
        p_traceparent, p_concurrency_key, p_fair_key
    ) AS e;
    head := v_head IS NULL;
    -- has_dependents: its end moves its sequence on (pgqueue_settle).
    UPDATE queue_job_state AS state
    SET sequence_key = p_sequence_key,
        sequence_on_failure = p_on_failure,
        has_dependents = true,
        status = CASE WHEN head THEN 'pending' ELSE 'waiting' END
    WHERE state.job_id = pgqueue_enqueue_sequenced.job_id;
    IF head THEN
        UPDATE queue_sequences AS seq
        SET head_job_id = pgqueue_enqueue_sequenced.job_id
        WHERE seq.queue = p_queue AND seq.sequence_key = p_sequence_key;
    END IF;
END
$$
"""

SEQUENCE_RELEASE = r"""
CREATE FUNCTION pgqueue_sequence_release(p_queue text, p_sequence_key text,
                                         OUT released bigint, OUT head bigint)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM FROM queue_sequences AS seq
    WHERE seq.queue = p_queue AND seq.sequence_key = p_sequence_key
    FOR UPDATE;
    -- Only a dead head that holds the rest back lets go (a head retried meanwhile runs).
    UPDATE queue_job_state AS state
    SET sequence_on_failure = 'continue', updated_at = now()
    FROM queue_sequences AS seq
    WHERE seq.queue = p_queue AND seq.sequence_key = p_sequence_key
      AND state.job_id = seq.head_job_id
      AND state.status = 'dead'
      AND state.sequence_on_failure = 'hold'
    RETURNING state.job_id INTO released;
    IF released IS NOT NULL THEN
        PERFORM pgqueue_sequence_next(ARRAY[released]);
    END IF;
    SELECT seq.head_job_id INTO head
    FROM queue_sequences AS seq
    WHERE seq.queue = p_queue AND seq.sequence_key = p_sequence_key;
END
$$
"""

ENQUEUE_SEQUENCED_SIGNATURE = (
    "pgqueue_enqueue_sequenced(text, text, jsonb, smallint, timestamptz, float8, integer, "
    "text, text, text, text, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0022_many_tenants")]

    operations = [
        _squash._table(
            "Sequence",
            "queue_sequences",
            "sequence",
            [
                _squash._id(),
                ("queue", models.CharField(max_length=63)),
                ("sequence_key", models.CharField(max_length=255)),
                ("head_job_id", _squash._optional(models.BigIntegerField)),
            ],
        ),
        migrations.AddConstraint(
            model_name="sequence",
            constraint=models.UniqueConstraint(
                fields=("queue", "sequence_key"), name="queue_sequences_key"
            ),
        ),
        migrations.AddConstraint(
            model_name="sequence",
            constraint=models.UniqueConstraint(
                condition=models.Q(("head_job_id__isnull", False)),
                fields=("head_job_id",),
                name="queue_sequences_head",
            ),
        ),
        migrations.AddField(
            model_name="jobstate",
            name="sequence_key",
            field=_squash._optional(models.CharField, max_length=255),
        ),
        migrations.AddField(
            model_name="jobstate",
            name="sequence_on_failure",
            field=_squash._optional(models.CharField, max_length=8),
        ),
        migrations.AddIndex(
            model_name="jobstate",
            index=_squash._partial(
                "queue_job_state_sequence_idx",
                ["queue", "sequence_key", "job"],
                sequence_key__isnull=False,
                status="waiting",
            ),
        ),
        migrations.AddIndex(
            model_name="jobstate",
            index=_squash._partial(
                "queue_job_state_held_idx",
                ["finished_at", "job"],
                sequence_on_failure="hold",
                status="dead",
            ),
        ),
        migrations.AddConstraint(
            model_name="jobstate",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        ("sequence_key__isnull", False),
                        ("sequence_on_failure__in", ["hold", "continue"]),
                    ),
                    models.Q(("sequence_key__isnull", True), ("sequence_on_failure__isnull", True)),
                    _connector="OR",
                ),
                name="queue_job_state_sequence_valid",
            ),
        ),
        migrations.RunSQL(
            sql=[SEQUENCE_NEXT, ENQUEUE_SEQUENCED, SEQUENCE_RELEASE, NEW_SETTLE, GENERIC],
            reverse_sql=[
                OLD_SETTLE,
                GENERIC,
                "DROP FUNCTION pgqueue_sequence_release(text, text)",
                f"DROP FUNCTION {ENQUEUE_SEQUENCED_SIGNATURE}",
                "DROP FUNCTION pgqueue_sequence_next(bigint[])",
            ],
        ),
    ]
