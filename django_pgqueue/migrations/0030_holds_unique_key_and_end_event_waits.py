# Two rules, each written once as a function that every statement needing it calls:
#
# - pgqueue_holds_unique_key: whether a state row holds its unique key now, by its hold
#   and status. It is the predicate of the unique index queue_job_state_unique_key (the
#   models declare it as a Q, the squash creates the index from it); a single SQL
#   expression, IMMUTABLE, so the planner inlines it and still proves the index's
#   predicate: the unique enqueue's ON CONFLICT and holder lookup, and the operator
#   retry's check for another holder (job_retry_now in sql/core.sql), use the index.
#   The retry also asks it whether the job it retries will hold its key (pending, its
#   lease version grown).
# - pgqueue_end_event_waits: end the event waits of the jobs given, each wait's row taken
#   once (its DELETE decides), with the checkpoint's result; each job still waiting is
#   pending again. It returns a row per wait it took, with the woken job's queue. The
#   emit (pgqueue_emit) and the waits' timeout (event_wait_timeout in sql/durable.sql)
#   call it; whichever takes a wait's row records its checkpoint.
#
# pgqueue_enqueue_unique and pgqueue_emit, which call them, are written here in their
# final text (CREATE OR REPLACE): a fresh database gets them from here (the squash no
# longer creates them), a database the old files took to 0029 has them replaced, so
# both end the same (tests/integration/test_migrations.py). Unapplied, this migration
# drops all four: a database taken back to 0029 this way has no unique enqueue nor
# emit until it is migrated forward again.

import importlib

from django.db import migrations

# The last statements of pgqueue_enqueue_unique, shared with pgqueue_enqueue.
KEYED_AND_DUE = importlib.import_module(
    "django_pgqueue.migrations.0001_squashed_0029_enqueue_statement_work"
).KEYED_AND_DUE

HOLDS_UNIQUE_KEY = r"""
CREATE FUNCTION pgqueue_holds_unique_key(
    p_unique_hold text, p_status text, p_lease_version bigint
) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT (p_unique_hold = 'pending' AND p_status = 'pending' AND p_lease_version = 0)
        OR (p_unique_hold = 'active' AND p_status IN ('waiting', 'pending', 'running'))
        OR (p_unique_hold = 'until_completed'
            AND p_status IN ('waiting', 'pending', 'running', 'dead'))
$$
"""

# PL/pgSQL for its plan, kept for the session (a SQL function's is made at each call).
END_EVENT_WAITS = r"""
CREATE FUNCTION pgqueue_end_event_waits(p_job_ids bigint[], p_result jsonb)
RETURNS TABLE (job_id bigint, woken_queue text)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH taken AS (
        DELETE FROM queue_event_waits AS wait
        WHERE wait.job_id = ANY(p_job_ids)
        RETURNING wait.job_id, wait.name
    ), recorded AS (
        INSERT INTO queue_job_steps (job_id, name, kind, result)
        SELECT taken.job_id, taken.name, 'event', p_result
        FROM taken
        ON CONFLICT DO NOTHING
    ), woken AS (
        UPDATE queue_job_state AS state
        SET status = 'pending', run_at = now(), updated_at = now()
        WHERE state.job_id IN (SELECT taken.job_id FROM taken)
          AND state.status = 'waiting'
        RETURNING state.job_id, state.queue
    )
    SELECT taken.job_id, woken.queue::text
    FROM taken
    LEFT JOIN woken ON woken.job_id = taken.job_id;
END
$$
"""

# The new job's state row with its unique key, unless a holder holds the key: ON
# CONFLICT names the unique index queue_job_state_unique_key by its predicate, the
# holds' rule (inlined, the planner proves it is the index's). Both policies on
# conflict (replace the holder, or return it) go on from this row.
UNIQUE_STATE_ROW = """\
                WITH new_job AS (
                    SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
                ), state AS (
                    INSERT INTO queue_job_state AS s (
                        job_id, queue, status, priority, run_at, attempts, max_attempts,
                        lease_version, concurrency_key, unique_key, unique_hold, fair_key,
                        updated_at
                    )
                    SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0,
                           p_max_attempts, 0, p_concurrency_key, p_unique_key, p_unique_hold,
                           p_fair_key, now()
                    FROM new_job
                    ON CONFLICT (queue, unique_key)
                        WHERE pgqueue_holds_unique_key(unique_hold, status, lease_version)"""

# Unique jobs and debounce: a unique key with a hold and a policy on conflict, decided
# by the database in the enqueuing transaction (never a read, then a write).
#
# - The holds that follow a job's status (pending, until first claimed; active: pending,
#   running or parked in waiting; until it completed) are one unique partial index on
#   the state rows, whose predicate is each row's own hold: a row with no key never
#   enters it, so queues without unique keys pay nothing. The INSERT names the
#   predicate in ON CONFLICT: DO NOTHING to return or refuse (then the holder is looked
#   up, and a key that changed hands after the statement's snapshot is tried again, as
#   pgqueue_enqueue does), DO UPDATE of a holder never claimed (pending, lease_version
#   0) of the same type to replace (a debounce: its due time here, its payload in the
#   same statement; the holder's row lock keeps the claim off it until the caller
#   commits; a "pending" holder claimed meanwhile no longer conflicts, so a new job is
#   written; a holder of another hold that was claimed is returned, one of another type
#   refused: 'other_type'). A "pending" hold ends at the first claim (lease_version >
#   0), so a job going back to pending (a retry, a lost lease) never meets the newer
#   holder of its key.
# - A hold for a period is a row per key (queue_unique_keys): INSERT ... ON CONFLICT DO
#   UPDATE takes the key when its period ended, and otherwise locks the row all the
#   same, so the holder read next is the one that holds it until this transaction ends.
ENQUEUE_UNIQUE = rf"""
CREATE OR REPLACE FUNCTION pgqueue_enqueue_unique(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_traceparent text, p_concurrency_key text,
    p_unique_key text, p_unique_hold text, p_unique_seconds float8, p_on_conflict text,
    p_fair_key text,
    OUT job_id bigint, OUT outcome text, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_woken boolean;  -- pg_notify's (void) result
    v_held_type text;
    v_run_at timestamptz := coalesce(p_run_at, now() + make_interval(secs => p_delay));
BEGIN
    IF p_unique_hold = 'period' THEN
        v_id := nextval(pg_get_serial_sequence('queue_jobs', 'id'));
        INSERT INTO queue_unique_keys AS k (queue, unique_key, job_id, held_until)
        VALUES (p_queue, p_unique_key, v_id,
                now() + make_interval(secs => p_unique_seconds))
        ON CONFLICT (queue, unique_key) DO UPDATE
            SET job_id = excluded.job_id, held_until = excluded.held_until
            WHERE k.held_until <= now()
        RETURNING k.job_id INTO v_id;
        IF v_id IS NULL THEN
            -- Held: the row is locked by this transaction now, its holder final.
            SELECT k.job_id INTO job_id
            FROM queue_unique_keys AS k
            WHERE k.queue = p_queue AND k.unique_key = p_unique_key;
            SELECT held.created_at INTO created_at FROM queue_jobs AS held WHERE held.id = job_id;
            outcome := 'existing';
            RETURN;
        END IF;
        INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
        VALUES (v_id, p_queue, p_type, p_payload, now(), p_traceparent);
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            concurrency_key, unique_key, unique_hold, fair_key, updated_at
        )
        VALUES (v_id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts, 0,
                p_concurrency_key, p_unique_key, 'period', p_fair_key, now());
        outcome := 'created';
    ELSE
        FOR attempt IN 1..5 LOOP
            IF p_on_conflict = 'replace' THEN
{UNIQUE_STATE_ROW}
                    DO UPDATE SET run_at = excluded.run_at, updated_at = now()
                        -- Only a holder never claimed, of this job type, is replaced:
                        -- another is returned below (or, of another type, refused).
                        WHERE s.status = 'pending' AND s.lease_version = 0
                          AND EXISTS (
                              SELECT FROM queue_jobs AS held
                              WHERE held.id = s.job_id AND held.type = p_type
                          )
                    RETURNING s.job_id, s.job_id = (SELECT id FROM new_job) AS inserted
                ), job AS (
                    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
                    SELECT state.job_id, p_queue, p_type, p_payload, now(), p_traceparent
                    FROM state
                    WHERE state.inserted
                    RETURNING id, 'created' AS outcome, queue_jobs.created_at
                ), replaced AS (
                    UPDATE queue_jobs AS j
                    SET payload = p_payload, traceparent = p_traceparent
                    FROM state
                    WHERE j.id = state.job_id AND NOT state.inserted
                    RETURNING j.id, 'replaced' AS outcome, j.created_at
                )
                SELECT written.id, written.outcome, written.created_at
                INTO v_id, outcome, created_at
                FROM (SELECT * FROM job UNION ALL SELECT * FROM replaced) AS written;
            ELSE
{UNIQUE_STATE_ROW}
                    DO NOTHING
                    RETURNING s.job_id
                ), job AS (
                    INSERT INTO queue_jobs (id, queue, type, payload, created_at, traceparent)
                    SELECT state.job_id, p_queue, p_type, p_payload, now(), p_traceparent
                    FROM state
                    RETURNING id, queue_jobs.created_at
                )
                SELECT job.id, 'created', job.created_at INTO v_id, outcome, created_at
                FROM job;
            END IF;
            EXIT WHEN v_id IS NOT NULL;
            SELECT live.job_id, held.created_at, held.type
            INTO job_id, created_at, v_held_type
            FROM queue_job_state AS live
            JOIN queue_jobs AS held ON held.id = live.job_id
            WHERE live.queue = p_queue
              AND live.unique_key = p_unique_key
              AND pgqueue_holds_unique_key(live.unique_hold, live.status, live.lease_version);
            IF job_id IS NOT NULL THEN
                -- A debounce never puts its payload on a job of another type.
                outcome := CASE
                    WHEN p_on_conflict = 'replace' AND v_held_type <> p_type THEN 'other_type'
                    ELSE 'existing'
                END;
                RETURN;
            END IF;
        END LOOP;
        IF v_id IS NULL THEN
            RETURN;  -- the key kept changing hands: all NULL, the caller says so
        END IF;
    END IF;
    IF outcome = 'created' AND p_concurrency_key IS NOT NULL THEN
{KEYED_AND_DUE}
    job_id := v_id;
END
$$
"""  # noqa: S608 (its text from constant pieces, no input)

EMIT = r"""
CREATE OR REPLACE FUNCTION pgqueue_emit(p_key text, p_payload jsonb)
RETURNS TABLE (emitted boolean, delivered integer)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
BEGIN
    PERFORM pg_advisory_xact_lock(1886418805, hashtext(p_key));
    INSERT INTO queue_events (key, payload) VALUES (p_key, p_payload)
    ON CONFLICT (key) DO NOTHING;
    IF NOT FOUND THEN
        emitted := false;  -- the first emit of a key wins
        delivered := 0;
        RETURN NEXT;
        RETURN;
    END IF;
    -- The key's waits, locked (a timeout skips them, an operator's run-again waits),
    -- end with the event's payload: delivered to each wait this emit took.
    WITH ended AS (
        SELECT ended.job_id, ended.woken_queue
        FROM pgqueue_end_event_waits(
            ARRAY(
                SELECT wait.job_id FROM queue_event_waits AS wait
                WHERE wait.key = p_key
                FOR UPDATE
            ),
            jsonb_build_object('payload', p_payload)
        ) AS ended
    ), notified AS (
        SELECT count(pg_notify('pgqueue', queues.queue)) AS queues
        FROM (
            SELECT DISTINCT ended.woken_queue AS queue
            FROM ended
            WHERE ended.woken_queue IS NOT NULL
        ) AS queues
    )
    SELECT (SELECT count(*) FROM ended)::integer INTO delivered FROM notified;
    emitted := true;
    RETURN NEXT;
END
$$
"""

ENQUEUE_UNIQUE_SIGNATURE = (
    "pgqueue_enqueue_unique(text, text, jsonb, smallint, timestamptz, float8, integer, text, "
    "text, text, text, float8, text, text)"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0029_enqueue_statement_work")]

    operations = [
        migrations.RunSQL(
            sql=[HOLDS_UNIQUE_KEY, END_EVENT_WAITS, ENQUEUE_UNIQUE, EMIT],
            reverse_sql=[
                "DROP FUNCTION pgqueue_emit(text, jsonb)",
                f"DROP FUNCTION {ENQUEUE_UNIQUE_SIGNATURE}",
                "DROP FUNCTION pgqueue_end_event_waits(bigint[], jsonb)",
                "DROP FUNCTION pgqueue_holds_unique_key(text, text, bigint)",
            ],
        ),
    ]
