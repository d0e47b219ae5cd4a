# The schema of 0001_initial to 0029_enqueue_statement_work in one migration, written
# as it ends: each table created with its final columns, indexes and constraints, each
# PL/pgSQL function created once in its final text (plain text: no function here is
# another's text edited). A database migrated to 0029 by the old files (by 0023 to 0029
# after the squash of 0001 to 0022, or by the files before that squash, whose names it
# recorded too) has it applied already (replaces) and gets from 0030 the functions
# written here since (see pgqueue_holds_unique_key); a fresh one gets the same schema
# (pg_dump --schema-only of both is the same after 0030). Later migrations may depend on
# ("django_pgqueue", "0029_enqueue_statement_work"), or on any name replaced here:
# Django points a dependency on a replaced migration to this one
# (tests/integration/test_migrations.py).

from typing import Any

import django.db.models.deletion
from django.db import migrations, models
from django.db.models.functions import Cast, Now

import django_pgqueue.models.controls
import django_pgqueue.models.observability

# The invariants, as one CHECK per table calling a PL/pgSQL function. PostgreSQL
# re-reads every CHECK expression from its stored form for each statement that writes
# the table; a dozen Django-generated expressions cost a third of a single enqueue. A
# function call is short to read back, its body is compiled once per session, and the
# message says which rule was broken. Each CHECK costs per statement whatever it
# checks, so the state row has one: the sequence rule is a condition of
# queue_job_state_valid, whose parameters have the columns' own types (varchar), so the
# stored call holds no casts to read back.
JOBS_VALID = r"""
CREATE FUNCTION queue_jobs_valid(queue text, type text) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    -- Unbounded repetition plus length(): PostgreSQL's regex engine expands {0,254}
    -- into a large automaton that costs more than the rest of the insert.
    IF queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(queue) <= 63
       AND type ~ '^[A-Za-z_][A-Za-z0-9_.:-]*$' AND length(type) <= 255 THEN
        RETURN true;
    END IF;
    IF NOT (queue ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' AND length(queue) <= 63) THEN
        RAISE check_violation USING MESSAGE = format('queue_jobs: queue name %L has not the '
            'shape [A-Za-z0-9][A-Za-z0-9_.:-]{0,62}', queue);
    END IF;
    RAISE check_violation USING MESSAGE = format('queue_jobs: job type %L has not the '
        'shape [A-Za-z_][A-Za-z0-9_.:-]{0,254}', type);
END
$$
"""

JOB_STATE_VALID = r"""
CREATE FUNCTION queue_job_state_valid(
    status varchar, priority smallint, attempts integer, max_attempts integer,
    lease_version bigint, locked_by varchar, locked_until timestamptz,
    finished_at timestamptz, sequence_key varchar, sequence_on_failure varchar
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF status IN ('waiting', 'pending', 'running', 'completed', 'dead', 'cancelled')
       AND priority BETWEEN -100 AND 100
       AND attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts
       AND lease_version >= 0
       AND (status = 'running') = (locked_by IS NOT NULL AND locked_until IS NOT NULL)
       AND (status IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)
       AND (sequence_key IS NULL) = (sequence_on_failure IS NULL)
       AND (sequence_on_failure IS NULL OR sequence_on_failure IN ('hold', 'continue')) THEN
        RETURN true;
    END IF;
    IF status NOT IN ('waiting', 'pending', 'running', 'completed', 'dead', 'cancelled') THEN
        RAISE check_violation USING MESSAGE = format('queue_job_state: unknown status %L', status);
    ELSIF priority NOT BETWEEN -100 AND 100 THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: priority %s is outside -100..100', priority);
    ELSIF NOT (attempts >= 0 AND max_attempts >= 1 AND attempts <= max_attempts) THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: attempts %s / max_attempts %s break 0 <= attempts <= max_attempts, '
            'max_attempts >= 1', attempts, max_attempts);
    ELSIF lease_version < 0 THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: lease_version %s is negative', lease_version);
    ELSIF (status = 'running') <> (locked_by IS NOT NULL AND locked_until IS NOT NULL) THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: a %s row must %s locked_by and locked_until', status,
            CASE WHEN status = 'running' THEN 'have' ELSE 'not have' END);
    ELSIF (status IN ('completed', 'dead', 'cancelled')) <> (finished_at IS NOT NULL) THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: a %s row must %s finished_at', status,
            CASE WHEN status IN ('completed', 'dead', 'cancelled') THEN 'have'
                 ELSE 'not have' END);
    ELSIF sequence_on_failure IS NULL THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: a row with sequence_key %L must have sequence_on_failure '
            '''hold'' or ''continue''', sequence_key);
    ELSIF sequence_key IS NULL THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_job_state: a row without sequence_key must not have '
            'sequence_on_failure (it has %L)', sequence_on_failure);
    END IF;
    RAISE check_violation USING MESSAGE = format(
        'queue_job_state: sequence_on_failure %L is neither ''hold'' nor ''continue''',
        sequence_on_failure);
END
$$
"""

# Its statuses are long for one line of the function.
ATTEMPT_STATUSES = "'running', 'succeeded', 'failed', 'lost', 'released', 'snoozed', 'interrupted'"
ATTEMPTS_VALID = rf"""
CREATE FUNCTION queue_attempts_valid(
    status text, attempt_index integer, lease_version bigint, finished_at timestamptz
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF status IN ({ATTEMPT_STATUSES})
       AND attempt_index >= 1 AND lease_version >= 1
       AND (status = 'running') = (finished_at IS NULL) THEN
        RETURN true;
    END IF;
    IF status NOT IN ({ATTEMPT_STATUSES}) THEN
        RAISE check_violation USING MESSAGE = format('queue_attempts: unknown status %L', status);
    ELSIF NOT (attempt_index >= 1 AND lease_version >= 1) THEN
        RAISE check_violation USING MESSAGE = format(
            'queue_attempts: attempt_index %s and lease_version %s must be >= 1',
            attempt_index, lease_version);
    END IF;
    RAISE check_violation USING MESSAGE = format(
        'queue_attempts: a %s attempt must %s finished_at', status,
        CASE WHEN status = 'running' THEN 'not have' ELSE 'have' END);
END
$$
"""

# The last statements of both enqueue functions (pgqueue_enqueue, pgqueue_enqueue_unique),
# written once: a job with a
# concurrency key marks its queue keyed (the controlled claim's cue, written the first
# time only), and a job due now wakes its queue's workers. It closes the condition each
# function opens with the keys it checks. The look at queue_controls is a condition of
# its own, run only for a job with a key (as one condition with the key's test,
# PL/pgSQL ran its statement for every job), and pg_notify is called in an assignment,
# a simple expression (PERFORM runs a statement).
KEYED_AND_DUE = """\
        IF NOT EXISTS (
            SELECT FROM queue_controls AS known WHERE known.queue = p_queue AND known.keyed
        ) THEN
            INSERT INTO queue_controls AS c (queue, paused, key_limit, rate_starts, keyed,
                                             updated_at)
            VALUES (p_queue, false, 1, '{}', true, now())
            ON CONFLICT (queue) DO UPDATE SET keyed = true, updated_at = now();
        END IF;
    END IF;
    IF v_run_at <= now() THEN
        v_woken := pg_notify('pgqueue', p_queue) IS NULL;
    END IF;"""

# Enqueue through a PL/pgSQL function: PostgreSQL plans its statements once per
# session, so a single enqueue does not plan two INSERTs every time (Django binds
# parameters on the client, and a transaction-mode pooler may not allow prepared
# statements; a function call needs neither). The call is job_enqueue in sql/core.sql.
# A keyed job marks its queue keyed in queue_controls (the controlled claim's cue); a
# fair queue's job carries its fair key on the state row.
ENQUEUE = rf"""
CREATE FUNCTION pgqueue_enqueue(
    p_queue text, p_type text, p_payload jsonb, p_priority smallint, p_run_at timestamptz,
    p_delay float8, p_max_attempts integer, p_idempotency_key text, p_traceparent text,
    p_concurrency_key text, p_fair_key text,
    OUT job_id bigint, OUT created boolean, OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_woken boolean;  -- pg_notify's (void) result
    v_run_at timestamptz := coalesce(p_run_at, now() + make_interval(secs => p_delay));
BEGIN
    IF p_idempotency_key IS NULL THEN
        INSERT INTO queue_jobs (queue, type, payload, created_at, traceparent)
        VALUES (p_queue, p_type, p_payload, now(), p_traceparent)
        RETURNING id INTO v_id;
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            concurrency_key, fair_key, updated_at
        )
        VALUES (v_id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts, 0,
                p_concurrency_key, p_fair_key, now());
    ELSE
        FOR attempt IN 1..5 LOOP
            WITH new_job AS (
                SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id
            ), state AS (
                INSERT INTO queue_job_state AS s (
                    job_id, queue, status, priority, run_at, attempts, max_attempts,
                    lease_version, idempotency_key, concurrency_key, fair_key, updated_at
                )
                SELECT new_job.id, p_queue, 'pending', p_priority, v_run_at, 0, p_max_attempts,
                       0, p_idempotency_key, p_concurrency_key, p_fair_key, now()
                FROM new_job
                ON CONFLICT (queue, idempotency_key)
                    WHERE idempotency_key IS NOT NULL AND status IN ('pending', 'running')
                    DO NOTHING
                RETURNING s.job_id
            ), job AS (
                INSERT INTO queue_jobs (id, queue, type, payload, idempotency_key, created_at,
                                        traceparent)
                SELECT state.job_id, p_queue, p_type, p_payload, p_idempotency_key, now(),
                       p_traceparent
                FROM state
                RETURNING id
            )
            SELECT job.id INTO v_id FROM job;
            EXIT WHEN v_id IS NOT NULL;
            SELECT live.job_id, held.created_at INTO job_id, created_at
            FROM queue_job_state AS live
            JOIN queue_jobs AS held ON held.id = live.job_id
            WHERE live.queue = p_queue
              AND live.idempotency_key = p_idempotency_key
              AND live.status IN ('pending', 'running');
            IF job_id IS NOT NULL THEN
                created := false;
                RETURN;
            END IF;
        END LOOP;
        IF v_id IS NULL THEN
            RETURN;
        END IF;
    END IF;
    IF p_concurrency_key IS NOT NULL THEN
{KEYED_AND_DUE}
    job_id := v_id;
    created := true;
    created_at := now();
END
$$
"""  # noqa: S608 (its text from constant pieces, no input)

# "A state row always has its job, on the same queue" holds by construction, not by a
# foreign key (whose check cost 23-40 us of each single enqueue): every statement that
# inserts a state row inserts its job in the same statement, with the same id and
# queue (tests/integration/test_constraints.py); a job's id and queue never change (an
# AFTER UPDATE OF trigger refuses it on either table, and never fires on a hot path);
# deleting jobs deletes their state rows (a statement-level AFTER DELETE trigger), and
# TRUNCATE queue_jobs is refused unless queue_job_state goes too.
KEYS_FIXED = r"""
CREATE FUNCTION queue_job_keys_fixed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE foreign_key_violation USING MESSAGE = format(
        '%s: a job''s id and queue never change (the state row must agree with its job)',
        TG_TABLE_NAME);
END
$$
"""

DELETE_STATE = r"""
CREATE FUNCTION queue_jobs_delete_state() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        IF EXISTS (SELECT FROM queue_job_state) THEN
            RAISE foreign_key_violation USING MESSAGE = 'queue_jobs: truncate '
                'queue_job_state and queue_attempts in the same TRUNCATE';
        END IF;
    ELSE
        DELETE FROM queue_job_state AS state USING gone WHERE state.job_id = gone.id;
    END IF;
    RETURN NULL;
END
$$
"""

DELETE_STATE_TRIGGERS = [
    "CREATE TRIGGER queue_jobs_delete_state AFTER DELETE ON queue_jobs "
    "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
    "EXECUTE FUNCTION queue_jobs_delete_state()",
    "CREATE TRIGGER queue_jobs_truncate_state AFTER TRUNCATE ON queue_jobs "
    "FOR EACH STATEMENT EXECUTE FUNCTION queue_jobs_delete_state()",
]


def _generic_plans(head: str, body: str, *settings: str) -> str:
    """CREATE FUNCTION head (its name, arguments and RETURNS) in PL/pgSQL whose
    statements are planned once per connection: generic plans, sequential scans off.

    Its plans are cached for the session, possibly built while the tables it reads were
    empty: without sequential scans they are the index probes at every size. The body
    is what stands between AS $$ and $$; settings are further SET clauses ("name =
    value"), after those two.
    """
    sets = "".join(f"SET {setting}\n" for setting in settings)
    return (
        f"\nCREATE FUNCTION {head}\nLANGUAGE plpgsql\nSET enable_seqscan = off\n"
        f"SET plan_cache_mode = force_generic_plan\n{sets}AS $$\n{body}$$\n"
    )


# Workflows: the statements that end a job (job_complete, job_fail, job_cancel,
# lease_sweep, job_release, job_give_back) call pgqueue_settle in the same statement,
# so a dependent is made pending, or cancelled, in the transaction that finished its
# last dependency; job_retry_now calls pgqueue_unsettle, which counts the retried jobs
# unfinished again and puts back to waiting every dependent that has not started and
# that no operator cancelled. PL/pgSQL, so that a cascade is one call. Both plan their
# statements once per connection (force_generic_plan: with a single job's one-element
# arrays the custom plans always looked cheaper, and planning cost more than running)
# with sequential scans off, so the plan kept is the index probes at every size.
# A step made pending is due its own delay after the settle (queue_workflow_steps.delay,
# as Celery counts a chained task's countdown from its parent's end). A step started
# when its current lease was claimed (an attempt under its lease_version) stays run
# when its dependencies are counted again: pgqueue_unsettle leaves a pending one (a
# durable step asleep, a step waiting for its retry) pending, pgqueue_settle leaves a
# waiting one (a durable step parked for an event) waiting for its event. The settle
# also moves the sequences of the jobs it is given on (pgqueue_sequence_next, below).
SETTLE = _generic_plans(
    "pgqueue_settle(p_completed bigint[], p_failed bigint[]) RETURNS integer",
    r"""DECLARE
    v_completed bigint[] := coalesce(p_completed, '{}');
    v_failed bigint[] := coalesce(p_failed, '{}');
    v_cancelled bigint[];
    v_culprits bigint[];
    v_moved integer;
    v_total integer := 0;
BEGIN
    -- Sequences: the jobs given move their sequences on (their row locks first).
    PERFORM pgqueue_sequence_next(v_completed || v_failed);
    WHILE cardinality(v_completed) + cardinality(v_failed) > 0 LOOP
        -- The dependents' step rows, locked in job_id order: two transactions settling
        -- one fan-in queue on the first row instead of deadlocking. Once locked, the
        -- next statement's snapshot sees every settle committed before: the counters
        -- it reads are the latest, so each finished dependency is counted once.
        PERFORM FROM queue_workflow_steps AS step
        WHERE step.job_id IN (
            SELECT dep.job_id FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_completed || v_failed)
        )
        ORDER BY step.job_id
        FOR UPDATE;
        WITH hits AS (
            SELECT dep.job_id, count(*)::integer AS finished,
                   (count(*) FILTER (WHERE dep.depends_on = ANY (v_failed)))::integer AS failed,
                   min(dep.depends_on) FILTER (WHERE dep.depends_on = ANY (v_failed)) AS culprit
            FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_completed || v_failed)
            GROUP BY dep.job_id
        ), counted AS (
            UPDATE queue_workflow_steps AS step
            SET waiting_for = step.waiting_for - hits.finished,
                failed = step.failed + hits.failed
            FROM hits
            WHERE step.job_id = hits.job_id
            RETURNING step.job_id,
                CASE
                    WHEN step.on_failure = 'cancel' AND step.failed > 0 THEN 'cancelled'
                    WHEN step.waiting_for > 0 THEN NULL
                    WHEN step.on_failure = 'error' AND step.failed = 0 THEN 'cancelled'
                    ELSE 'pending'
                END AS status,
                CASE
                    WHEN step.on_failure = 'error' AND step.failed = 0 THEN
                        'skipped: nothing it waits for failed (a link_error step)'
                    ELSE format('cancelled: job %s it waits for ended dead or cancelled',
                                coalesce(hits.culprit::text, 'a job'))
                END AS reason,
                hits.culprit,
                step.delay
        ), moved AS (
            -- Only a waiting step changes: one an operator cancelled, or that runs
            -- already (on_failure "run", or put back by a retry), keeps its status.
            UPDATE queue_job_state AS state
            SET status = counted.status,
                run_at = CASE WHEN counted.status = 'pending'
                              THEN greatest(state.run_at, now() + make_interval(secs => counted.delay))
                              ELSE state.run_at END,
                finished_at = CASE WHEN counted.status = 'cancelled' THEN now() END,
                last_error = CASE WHEN counted.status = 'cancelled' THEN counted.reason
                                  ELSE state.last_error END,
                updated_at = now()
            FROM counted
            WHERE state.job_id = counted.job_id
              AND counted.status IS NOT NULL
              AND state.status = 'waiting'
              -- a durable step parked for an event started: it waits for its event
              AND NOT EXISTS (SELECT FROM queue_attempts AS attempt
                                    WHERE attempt.job_id = state.job_id
                                      AND attempt.lease_version = state.lease_version)
            RETURNING state.job_id, state.queue, state.status
        ), wake AS (
            SELECT count(pg_notify('pgqueue', due.queue)::text) AS queues
            FROM (SELECT DISTINCT queue FROM moved WHERE status = 'pending') AS due
        ), woken AS (
            -- Wake the wait() callers of the steps cancelled (see job_waiter_add).
            SELECT count(pg_notify('pgqueue_finished', w.queue)) AS waiters
            FROM queue_job_waiters AS w
            WHERE w.job_id IN (SELECT job_id FROM moved WHERE status = 'cancelled')
        )
        SELECT coalesce(array_agg(moved.job_id) FILTER (WHERE moved.status = 'cancelled'),
                        '{}'),
               coalesce(array_agg(counted.culprit) FILTER (WHERE moved.status = 'cancelled'),
                        '{}'),
               count(moved.job_id)
        INTO v_cancelled, v_culprits, v_moved
        FROM wake
        CROSS JOIN woken
        LEFT JOIN moved ON true
        LEFT JOIN counted ON counted.job_id = moved.job_id;
        IF cardinality(v_cancelled) > 0 THEN
            -- Remember which failure cancelled them: an operator retry of it puts them
            -- back to waiting (a skipped link_error step has no culprit and stays).
            UPDATE queue_workflow_steps AS step
            SET cancelled_by = cancel.culprit
            FROM unnest(v_cancelled, v_culprits) AS cancel(job_id, culprit)
            WHERE step.job_id = cancel.job_id;
        END IF;
        v_total := v_total + v_moved;
        v_completed := '{}';
        v_failed := v_cancelled;
    END LOOP;
    RETURN v_total;
END
""",  # noqa: E501 (its text as the databases migrated before hold it)
)

UNSETTLE = _generic_plans(
    "pgqueue_unsettle(p_reopened bigint[], p_retried bigint[]) RETURNS integer",
    r"""DECLARE
    v_back bigint[] := coalesce(p_reopened, '{}');
    v_moved integer;
    v_total integer := 0;
BEGIN
    -- The retried steps and the first dependents, locked together in job_id order (as
    -- pgqueue_settle locks), so a settle running at the same time queues behind.
    PERFORM FROM queue_workflow_steps AS step
    WHERE step.job_id = ANY (coalesce(p_retried, '{}') || ARRAY(
        SELECT dep.job_id FROM queue_job_deps AS dep WHERE dep.depends_on = ANY (v_back)
    ))
    ORDER BY step.job_id
    FOR UPDATE;
    -- The retried steps' own cancellation is over (each is pending or waiting now):
    -- a later retry of what cancelled one must not take it for a step that failure
    -- cancelled.
    UPDATE queue_workflow_steps
    SET cancelled_by = NULL
    WHERE job_id = ANY (coalesce(p_retried, '{}')) AND cancelled_by IS NOT NULL;
    WHILE cardinality(v_back) > 0 LOOP
        -- The dependents' step rows, locked in job_id order (held already at the
        -- first turn).
        PERFORM FROM queue_workflow_steps AS step
        WHERE step.job_id IN (
            SELECT dep.job_id FROM queue_job_deps AS dep WHERE dep.depends_on = ANY (v_back)
        )
        ORDER BY step.job_id
        FOR UPDATE;
        -- Each job in v_back was counted finished and failed when it ended dead or
        -- cancelled; it is unfinished again.
        WITH hits AS (
            SELECT dep.job_id, count(*)::integer AS back
            FROM queue_job_deps AS dep
            WHERE dep.depends_on = ANY (v_back)
            GROUP BY dep.job_id
        ), counted AS (
            UPDATE queue_workflow_steps AS step
            SET waiting_for = step.waiting_for + hits.back,
                failed = step.failed - hits.back
            FROM hits
            WHERE step.job_id = hits.job_id
            RETURNING step.job_id, step.failed, step.cancelled_by
        ), restored AS (
            -- A dependent waits while a dependency is unfinished, unless it started
            -- (a claim under its lease: it stays run, a durable step asleep too)
            -- or an operator cancelled it (cancelled_by NULL): pending
            -- (due, not claimed yet) goes back to waiting, and so does one its
            -- dependencies' failure cancelled, once none of them is failed.
            UPDATE queue_job_state AS state
            SET status = 'waiting',
                finished_at = NULL,
                last_error = CASE WHEN state.status = 'cancelled' THEN NULL
                                  ELSE state.last_error END,
                lease_version = state.lease_version + 1,
                updated_at = now()
            FROM counted
            WHERE state.job_id = counted.job_id
              AND ((state.status = 'pending'
                    AND NOT EXISTS (SELECT FROM queue_attempts AS attempt
                                    WHERE attempt.job_id = state.job_id
                                      AND attempt.lease_version = state.lease_version))
                   OR (state.status = 'cancelled'
                       AND counted.cancelled_by IS NOT NULL
                       AND counted.failed = 0))
            RETURNING state.job_id, counted.cancelled_by IS NOT NULL AS reopened
        )
        -- Only a restored cancelled step had been counted finished by its own
        -- dependents: it is unfinished for them again (the next turn).
        SELECT coalesce(array_agg(job_id) FILTER (WHERE reopened), '{}'), count(*)
        INTO v_back, v_moved
        FROM restored;
        UPDATE queue_workflow_steps SET cancelled_by = NULL WHERE job_id = ANY (v_back);
        v_total := v_total + v_moved;
    END LOOP;
    RETURN v_total;
END
""",
)

# Every claim takes its jobs through one function: the claims differ only in which
# jobs they walk to (job_claim, job_claim_after, job_claim_controlled in sql/); taking
# them (a new lease, an attempt opened, the row returned) is written once here. It is
# given the ids its caller's walk locked (FOR UPDATE SKIP LOCKED), so its statements
# find them as the walk left them. Generic plans, sequential scans off: planned once
# per connection, also behind a pooler that allows no prepared statements. It opens the
# attempts, and returns the rows, in the order given: the order of the claim's walk
# (the fair claim's turns, the plain claim's priority and due time), so the attempts'
# ids number the jobs as the walk took them. Sorts on: the plain claim's transaction
# turns them off (claim_plan_generic), and the two sorts of a few rows, priced as
# disabled, put the plan above jit_above_cost (compiling it took ~250 ms a claim).
CLAIM = _generic_plans(
    """pgqueue_claim(
    p_job_ids bigint[], p_queue text, p_worker_id text, p_lease float8,
    p_started_at timestamptz
) RETURNS TABLE (
    job_id bigint, queue text, type text, payload text, priority smallint,
    attempts integer, max_attempts integer, lease_version bigint, attempt_id bigint,
    idempotency_key text, created_at timestamptz, run_at timestamptz, traceparent text
)""",
    r"""#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH claimed AS (
        UPDATE queue_job_state AS state
        SET status = 'running',
            attempts = state.attempts + 1,
            lease_version = state.lease_version + 1,
            locked_by = p_worker_id,
            locked_until = now() + make_interval(secs => p_lease),
            updated_at = now()
        -- An array of ids, not a join: a join can turn into a sequential scan of the
        -- whole table when the statistics are stale (and autovacuum may be off). The
        -- queue is not repeated here: a filter on it lowers the planner's estimate of
        -- the rows updated, which changes the joins below.
        WHERE state.job_id = ANY (p_job_ids)
        RETURNING state.job_id, state.queue, state.priority, state.run_at, state.attempts,
                  state.max_attempts, state.lease_version
    ), opened AS (
        -- started_at is the clock when the row is claimed (p_started_at: the controlled
        -- claim's rate-window time), not now(): now() is the transaction's start,
        -- before the walk took its snapshot, so a job that a sweep requeued in between
        -- would show its new attempt starting before the lost one ended (seen in the
        -- claims-racing-sweeps scenario).
        INSERT INTO queue_attempts (
            job_id, lease_version, attempt_index, worker_id, status, started_at
        )
        SELECT claimed.job_id, claimed.lease_version, claimed.attempts, p_worker_id,
               'running', coalesce(p_started_at, clock_timestamp())
        FROM claimed
        -- in the order given: the attempts' ids number the jobs as the walk took them
        ORDER BY array_position(p_job_ids, claimed.job_id)
        RETURNING queue_attempts.id, queue_attempts.job_id
    )
    SELECT claimed.job_id, claimed.queue::text, job.type::text, job.payload,
           claimed.priority, claimed.attempts, claimed.max_attempts, claimed.lease_version,
           opened.id, job.idempotency_key::text, job.created_at, claimed.run_at,
           job.traceparent
    FROM claimed
    JOIN opened ON opened.job_id = claimed.job_id
    -- LIMIT 1 keeps this subquery from being flattened into a join: one primary-key
    -- probe per claimed row, instead of a hash join that reads all of queue_jobs when
    -- the planner underestimates how cheap the probes are.
    CROSS JOIN LATERAL (
        SELECT j.type, j.payload::text AS payload, j.idempotency_key, j.created_at,
               j.traceparent
        FROM queue_jobs AS j
        WHERE j.id = claimed.job_id
          -- The queue names the shard where the tables are distributed by it (Citus,
          -- see docs/howto/scaling-out.md); here it only checks the row the key found.
          AND j.queue = p_queue
        LIMIT 1
    ) AS job
    ORDER BY opened.id;
END
""",
    "enable_sort = on",
)

# Whether a registered worker process is alive now: not marked gone, and seen within
# three of its beats (its report says how often it beats), or two of its leases if
# shorter (a row without a report: two leases). One rule for every statement that
# asks (the Workers page, the metrics, the marking of silent workers, the requests).
WORKER_ALIVE = r"""
CREATE FUNCTION pgqueue_worker_alive(
    p_gone_at timestamptz, p_last_seen_at timestamptz, p_lease float8, p_report jsonb
) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT p_gone_at IS NULL
       AND p_last_seen_at >= now() - make_interval(
           secs => least(2 * p_lease,
                         3 * coalesce((p_report ->> 'beat_seconds')::float8, p_lease)))
$$
"""

# Durable execution: a park and an emit of one event key are decided under a
# transaction-level advisory lock on the key, each by a PL/pgSQL function whose
# statements run with snapshots of their own taken after the lock: whichever comes
# second sees what the first committed, so an event emitted while a job parks is never
# missed by both (in one statement, the snapshot is taken before the lock is granted).
# A transaction lock, not a session one: nothing a connection pooler could strand. The
# lock's first key is the event keys' name space (the two-key form, so a project's own
# one-key advisory locks never collide with these).
PARK = r"""
CREATE FUNCTION pgqueue_park(
    p_job_id bigint, p_lease_version bigint, p_attempt_id bigint, p_key text,
    p_name text, p_timeout float8, p_reason text
) RETURNS TABLE (status text, run_at timestamptz)
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    v_payload jsonb;
    v_emitted boolean;
    v_status text;
    v_run_at timestamptz;
    v_queue text;
    v_has_dependents boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(1886418805, hashtext(p_key));
    SELECT event.payload INTO v_payload FROM queue_events AS event WHERE event.key = p_key;
    v_emitted := FOUND;
    -- Fenced like every end of an attempt; the attempt is given back (a park is no
    -- failure). Parked, the job is waiting: in no claim index until an emit or its
    -- timeout makes it pending; an event already emitted makes it pending at once.
    UPDATE queue_job_state AS state
    SET status = CASE
            WHEN state.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN v_emitted THEN 'pending'
            ELSE 'waiting'
        END,
        run_at = CASE
            WHEN state.cancel_requested_at IS NULL AND v_emitted THEN now() ELSE state.run_at
        END,
        attempts = CASE
            WHEN state.cancel_requested_at IS NULL THEN state.attempts - 1 ELSE state.attempts
        END,
        finished_at = CASE WHEN state.cancel_requested_at IS NOT NULL THEN now() END,
        locked_by = NULL,
        locked_until = NULL,
        updated_at = now()
    WHERE state.job_id = p_job_id
      AND state.lease_version = p_lease_version
      AND state.status = 'running'
    RETURNING state.status, state.run_at, state.queue, state.has_dependents
    INTO v_status, v_run_at, v_queue, v_has_dependents;
    IF NOT FOUND THEN
        RETURN;  -- the lease was lost
    END IF;
    UPDATE queue_attempts AS attempt
    SET status = 'snoozed', finished_at = now(),
        error_class = 'django_pgqueue.AwaitEvent', error_message = p_reason
    WHERE attempt.id = p_attempt_id;
    IF v_status = 'cancelled' THEN
        PERFORM pg_notify('pgqueue_finished', waiter.queue)
        FROM queue_job_waiters AS waiter WHERE waiter.job_id = p_job_id;
        IF v_has_dependents THEN
            PERFORM pgqueue_settle('{}', ARRAY[p_job_id]);
        END IF;
    ELSIF v_emitted THEN
        INSERT INTO queue_job_steps (job_id, name, kind, result, lease_version)
        VALUES (p_job_id, p_name, 'event', jsonb_build_object('payload', v_payload),
                p_lease_version)
        ON CONFLICT DO NOTHING;
        PERFORM pg_notify('pgqueue', v_queue);
    ELSE
        INSERT INTO queue_event_waits (job_id, key, name, timeout_at)
        VALUES (p_job_id, p_key, p_name, now() + make_interval(secs => p_timeout))
        ON CONFLICT (job_id) DO UPDATE
        SET key = EXCLUDED.key, name = EXCLUDED.name, timeout_at = EXCLUDED.timeout_at,
            created_at = now();
    END IF;
    status := v_status;
    run_at := v_run_at;
    RETURN NEXT;
END
$$
"""

# Two rules, each written once as a function that every statement needing it calls:
# pgqueue_holds_unique_key, whether a state row holds its unique key now (the unique
# index queue_job_state_unique_key's predicate; a single IMMUTABLE SQL expression, so
# the planner inlines it and still proves the index's predicate), and
# pgqueue_end_event_waits, which ends the event waits of the jobs given (each wait's
# row taken once, by its DELETE). pgqueue_enqueue_unique and pgqueue_emit call them.
# These four are CREATE OR REPLACE: 0030 runs the same text again on a database the
# old files took to 0029, whose pgqueue_enqueue_unique and pgqueue_emit wrote the
# rules out inline.
HOLDS_UNIQUE_KEY = r"""
CREATE OR REPLACE FUNCTION pgqueue_holds_unique_key(
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
CREATE OR REPLACE FUNCTION pgqueue_end_event_waits(p_job_ids bigint[], p_result jsonb)
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
#   job back to waiting, unless it heads its sequence, and calls it too. The prune
#   deletes the row of a sequence with nothing left (head NULL), so it writes the row
#   again when it is gone (INSERT ... ON CONFLICT DO UPDATE: the row locked either way):
#   a dead or cancelled job of a pruned sequence, retried, finds its row and runs.
# - pgqueue_sequence_release: an operator lets a held sequence go on past its dead head
#   (its on_failure becomes 'continue'), by the same rule.
# - pgqueue_enqueue_cancel_running: an enqueue with Unique.cancel_running(key). The key
#   is a sequence key of the queue: under the sequence's row lock, the key's jobs not
#   running (its waiting ones; a head pending, or parked for an event) are cancelled
#   and settled as job_cancel settles them, the running head gets a cancel request
#   (job_cancel_request's mark: the worker hears of it at its next renewal), then the
#   new job is written with pgqueue_enqueue_sequenced, on_failure 'continue'. Behind a
#   running head it waits: the head stays running until its code returned (the fenced
#   write that ends it, or the sweep once its process is gone), and only that end moves
#   the sequence on. The new job never starts while the cancelled code runs: the hold.
SEQUENCE_NEXT = _generic_plans(
    "pgqueue_sequence_next(p_job_ids bigint[]) RETURNS integer",
    r"""DECLARE
    v_moved integer;
BEGIN
    -- The sequences of the given jobs, locked in key order (an enqueue holds one at a
    -- time). Once locked, the next statement's snapshot sees every enqueue and every
    -- move committed before: no waiting job is missed, none released twice.
    -- A sequence whose row was pruned (nothing was left of it) gets it back: an
    -- operator's retry of one of its finished jobs.
    INSERT INTO queue_sequences AS seq (queue, sequence_key, head_job_id)
    SELECT DISTINCT state.queue, state.sequence_key, NULL::bigint
    FROM queue_job_state AS state
    WHERE state.job_id = ANY (p_job_ids) AND state.sequence_key IS NOT NULL
    ORDER BY state.queue, state.sequence_key
    ON CONFLICT (queue, sequence_key) DO UPDATE SET head_job_id = seq.head_job_id;
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

REPLACED = [
    "0001_initial",
    "0002_admin_permissions_and_indexes",
    "0003_schedules",
    "0004_workers",
    "0005_queue_control",
    "0006_queue_type_controls",
    "0007_enqueue_function",
    "0008_state_job_by_construction",
    "0009_attempt_interrupted",
    "0010_schedule_code",
    "0011_workflows",
    "0012_job_waiters",
    "0013_batches",
    "0014_settle_wakes_waiters",
    "0015_settle_generic_plans",
    "0016_unsettle_every_dependent",
    "0017_claim_function",
    "0018_step_inputs",
    "0019_stats_run_time_and_backlog",
    "0020_workers_inspect_control",
    "0021_durable_steps",
    "0022_many_tenants",
    # The squash of the names above, and the migrations written after it.
    "0001_squashed_0022_many_tenants",
    "0023_sequences",
    "0025_started_steps_stay_run",
    "0027_cancel_in_progress",
    "0028_claim_order",
    "0029_enqueue_statement_work",
]

ATTEMPTS_VALID_SIGNATURE = "queue_attempts_valid(text, integer, bigint, timestamptz)"
JOB_STATE_VALID_SIGNATURE = (
    "queue_job_state_valid(varchar, smallint, integer, integer, bigint, varchar, timestamptz, "
    "timestamptz, varchar, varchar)"
)
ENQUEUE_SIGNATURE = (
    "pgqueue_enqueue(text, text, jsonb, smallint, timestamptz, float8, integer, text, text, "
    "text, text)"
)
ENQUEUE_SEQUENCED_SIGNATURE = (
    "pgqueue_enqueue_sequenced(text, text, jsonb, smallint, timestamptz, float8, integer, "
    "text, text, text, text, text)"
)
ENQUEUE_CANCEL_RUNNING_SIGNATURE = (
    "pgqueue_enqueue_cancel_running(text, text, jsonb, smallint, timestamptz, float8, "
    "integer, text, text, text, text)"
)


def _foreign_key(table: str, key: str, column: str, target: str, on_delete: str = "CASCADE") -> str:
    """Add a foreign key the models declare without a constraint (db_constraint=False),
    named {table}_{key}_fk."""
    return (
        f"ALTER TABLE {table} ADD CONSTRAINT {table}_{key}_fk FOREIGN KEY ({column}) "
        f"REFERENCES {target} ON DELETE {on_delete}"
    )


# The foreign keys, by hand: ON DELETE in the database (pruning a job removes its
# state, attempts, step, dependencies, batch membership, checkpoints and event wait).
FOREIGN_KEYS = [
    ("queue_attempts", "job", "job_id", "queue_job_state (job_id)"),
    ("queue_workflow_steps", "job", "job_id", "queue_jobs (id)"),
    ("queue_workflow_steps", "flow", "workflow_id", "queue_workflows (id)"),
    ("queue_job_deps", "job", "job_id", "queue_jobs (id)"),
    ("queue_job_deps", "depends_on", "depends_on", "queue_jobs (id)"),
    ("queue_batch_jobs", "job", "job_id", "queue_jobs (id)"),
    ("queue_batch_jobs", "batch", "batch_id", "queue_batches (id)"),
    ("queue_batches", "workflow", "workflow_id", "queue_workflows (id)", "SET NULL"),
    ("queue_job_steps", "job", "job_id", "queue_jobs (id)"),
    ("queue_event_waits", "job", "job_id", "queue_jobs (id)"),
]


def _table(
    name: str, db_table: str, verbose_name: str, fields: list[Any], **options: Any
) -> migrations.CreateModel:
    """CreateModel of one of the app's tables: the model's name, its table, what the
    admin calls a row, its fields, and its other Meta options (indexes, constraints)."""
    return migrations.CreateModel(
        name=name,
        fields=fields,
        options={"verbose_name": verbose_name, "db_table": db_table, **options},
    )


def _id() -> tuple[str, models.BigAutoField]:
    """A table's own bigint primary key, "id"."""
    return ("id", models.BigAutoField(primary_key=True, serialize=False))


def _optional(field: type[models.Field], **options: Any) -> models.Field:
    """A column that may be NULL (and left blank in a form)."""
    return field(blank=True, null=True, **options)


def _partial(name: str, fields: list[str], **condition: Any) -> models.Index:
    """An index of the rows that meet the condition (lookups, as filter() takes them)."""
    return models.Index(condition=models.Q(**condition), fields=fields, name=name)


def _now() -> models.DateTimeField:
    """A time the database writes when the row is inserted."""
    return models.DateTimeField(db_default=Now())


def _job_row(related_name: str) -> models.OneToOneField:
    """The job a row is one of a kind for: its primary key, deleted with it."""
    return models.OneToOneField(
        db_column="job_id",
        db_constraint=False,
        on_delete=django.db.models.deletion.CASCADE,
        primary_key=True,
        related_name=related_name,
        serialize=False,
        to="django_pgqueue.job",
    )


def _job_link(column: str, related_name: str, **options: bool) -> models.ForeignKey:
    """A job a row belongs to (its foreign key by hand, in FOREIGN_KEYS)."""
    return models.ForeignKey(
        db_column=column,
        db_constraint=False,
        on_delete=django.db.models.deletion.CASCADE,
        related_name=related_name,
        to="django_pgqueue.job",
        **options,
    )


def _composite_key(*columns: str) -> models.CompositePrimaryKey:
    """A primary key of several columns."""
    return models.CompositePrimaryKey(
        *columns, blank=True, editable=False, primary_key=True, serialize=False
    )


def _rate_fields() -> list[tuple[str, models.Field]]:
    """A rate limit's columns: at most rate_count starts per rate_period seconds."""
    timestamps = django_pgqueue.models.controls.TimestampArray
    return [
        ("rate_count", _optional(models.IntegerField)),
        ("rate_period", _optional(models.FloatField)),
        (
            "rate_starts",
            timestamps(
                db_default=Cast(models.Value("{}"), output_field=timestamps()), editable=False
            ),
        ),
    ]


def _rate_valid(name: str) -> models.CheckConstraint:
    """A rate limit is both numbers or neither."""
    return models.CheckConstraint(
        condition=models.Q(
            models.Q(("rate_count__isnull", True), ("rate_period__isnull", True)),
            models.Q(("rate_count__gte", 1), ("rate_count__lte", 10000), ("rate_period__gt", 0)),
            _connector="OR",
        ),
        name=name,
    )


class Migration(migrations.Migration):
    replaces = [("django_pgqueue", name) for name in REPLACED]

    initial = True

    dependencies = []

    operations = [
        _table(
            "Job",
            "queue_jobs",
            "job",
            [
                _id(),
                ("queue", models.CharField(max_length=63)),
                ("type", models.CharField(max_length=255)),
                ("payload", models.JSONField()),
                ("idempotency_key", _optional(models.CharField, max_length=255)),
                ("created_at", _now()),
                ("traceparent", _optional(models.TextField)),
            ],
            indexes=[
                models.Index(fields=["type", "id"], name="queue_jobs_type_idx"),
                _partial("queue_jobs_key_idx", ["idempotency_key"], idempotency_key__isnull=False),
            ],
            permissions=[("operate_job", "Can retry and cancel jobs")],
        ),
        _table(
            "JobState",
            "queue_job_state",
            "job state",
            [
                ("job", _job_row(related_name="state")),
                ("queue", models.CharField(max_length=63)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("waiting", "waiting (for its dependencies)"),
                            ("pending", "Pending"),
                            ("running", "Running"),
                            ("completed", "Completed"),
                            ("dead", "Dead"),
                            ("cancelled", "Cancelled"),
                        ],
                        db_default="pending",
                        max_length=16,
                    ),
                ),
                ("priority", models.SmallIntegerField(db_default=0)),
                ("run_at", _now()),
                ("attempts", models.IntegerField(db_default=0)),
                ("max_attempts", models.IntegerField()),
                ("lease_version", models.BigIntegerField(db_default=0)),
                ("locked_by", _optional(models.CharField, max_length=255)),
                ("locked_until", _optional(models.DateTimeField)),
                ("last_error", _optional(models.TextField)),
                ("idempotency_key", _optional(models.CharField, max_length=255)),
                ("updated_at", _now()),
                ("finished_at", _optional(models.DateTimeField)),
                ("cancel_requested_at", _optional(models.DateTimeField)),
                ("concurrency_key", _optional(models.CharField, max_length=255)),
                ("has_dependents", _optional(models.BooleanField)),
                ("unique_key", _optional(models.CharField, max_length=255)),
                ("unique_hold", _optional(models.CharField, max_length=16)),
                ("fair_key", _optional(models.CharField, max_length=255)),
                ("sequence_key", _optional(models.CharField, max_length=255)),
                ("sequence_on_failure", _optional(models.CharField, max_length=8)),
            ],
            indexes=[
                _partial(
                    "queue_job_state_claim_idx",
                    ["queue", "-priority", "run_at", "job"],
                    status="pending",
                ),
                _partial("queue_job_state_running_idx", ["job"], status="running"),
                _partial(
                    "queue_job_state_failed_age_idx",
                    ["status", "finished_at", "job"],
                    status__in=["dead", "cancelled"],
                ),
                _partial(
                    "queue_job_state_failed_idx",
                    ["queue", "status"],
                    status__in=["dead", "cancelled"],
                ),
                _partial(
                    "queue_job_state_run_key_idx",
                    ["queue", "concurrency_key"],
                    concurrency_key__isnull=False,
                    status="running",
                ),
                _partial("queue_job_state_waiting_idx", ["queue"], status="waiting"),
                _partial(
                    "queue_job_state_fair_idx",
                    ["queue", "fair_key", "-priority", "run_at", "job"],
                    fair_key__isnull=False,
                    status="pending",
                ),
                _partial(
                    "queue_job_state_sequence_idx",
                    ["queue", "sequence_key", "job"],
                    sequence_key__isnull=False,
                    status="waiting",
                ),
                _partial(
                    "queue_job_state_held_idx",
                    ["finished_at", "job"],
                    sequence_on_failure="hold",
                    status="dead",
                ),
            ],
            constraints=[
                models.UniqueConstraint(
                    condition=models.Q(
                        ("idempotency_key__isnull", False),
                        ("status__in", ["pending", "running"]),
                    ),
                    fields=("queue", "idempotency_key"),
                    name="queue_job_state_live_key_unique",
                ),
                models.UniqueConstraint(
                    condition=models.Q(
                        models.Q(
                            ("lease_version", 0),
                            ("status", "pending"),
                            ("unique_hold", "pending"),
                        ),
                        models.Q(
                            ("status__in", ["waiting", "pending", "running"]),
                            ("unique_hold", "active"),
                        ),
                        models.Q(
                            ("status__in", ["waiting", "pending", "running", "dead"]),
                            ("unique_hold", "until_completed"),
                        ),
                        _connector="OR",
                    ),
                    fields=("queue", "unique_key"),
                    name="queue_job_state_unique_key",
                ),
            ],
        ),
        _table(
            "Attempt",
            "queue_attempts",
            "attempt",
            [
                _id(),
                ("lease_version", models.BigIntegerField()),
                ("attempt_index", models.IntegerField()),
                ("worker_id", models.CharField(max_length=255)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("running", "Running"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("lost", "lost (lease expired)"),
                            ("released", "released (never started)"),
                            ("snoozed", "snoozed (attempt given back)"),
                            ("interrupted", "interrupted (the worker stopped; attempt given back)"),
                        ],
                        db_default="running",
                        max_length=16,
                    ),
                ),
                ("started_at", _now()),
                ("finished_at", _optional(models.DateTimeField)),
                ("error_class", _optional(models.CharField, max_length=255)),
                ("error_message", _optional(models.TextField)),
                ("traceback", _optional(models.TextField)),
                ("result", _optional(models.JSONField)),
                ("job", _job_link("job_id", related_name="attempts", db_index=False)),
            ],
            constraints=[
                models.UniqueConstraint(
                    fields=("job", "lease_version"), name="queue_attempts_job_lease_unique"
                )
            ],
        ),
        migrations.CreateModel(
            name="DeadJob",
            fields=[],
            options={
                "verbose_name": "dead job",
                "ordering": ["-state__finished_at"],
                "proxy": True,
            },
            bases=("django_pgqueue.job",),
        ),
        _table(
            "Schedule",
            "queue_schedules",
            "schedule",
            [
                ("name", models.CharField(max_length=100, primary_key=True, serialize=False)),
                (
                    "type",
                    models.CharField(help_text="The job type each tick enqueues.", max_length=255),
                ),
                ("queue", models.CharField(default="default", max_length=63)),
                (
                    "cron",
                    models.CharField(
                        blank=True,
                        help_text="Cron expression (5 fields, 6 with seconds first), or use every.",
                        max_length=255,
                        null=True,
                    ),
                ),
                (
                    "every",
                    models.DurationField(
                        blank=True,
                        help_text="A fixed interval (whole seconds), instead of cron.",
                        null=True,
                    ),
                ),
                ("payload", models.JSONField(blank=True, default=dict)),
                (
                    "timezone",
                    models.CharField(
                        help_text="IANA zone the cron expression is read in, e.g. Europe/Berlin.",
                        max_length=63,
                    ),
                ),
                (
                    "catch_up",
                    models.CharField(
                        choices=[("once", "once for the whole gap"), ("skip", "skip missed ticks")],
                        default="once",
                        help_text="After missed ticks: one job for the whole gap, or none.",
                        max_length=8,
                    ),
                ),
                ("priority", models.SmallIntegerField(default=0)),
                ("max_attempts", _optional(models.IntegerField)),
                ("enabled", models.BooleanField(default=True)),
                (
                    "source",
                    models.CharField(
                        choices=[
                            ("code", "code"),
                            ("db", "database"),
                            ("removed", "removed from code"),
                        ],
                        default="db",
                        max_length=8,
                    ),
                ),
                ("next_tick", _optional(models.DateTimeField)),
                ("last_tick", _optional(models.DateTimeField)),
                ("created_at", _now()),
                ("updated_at", _now()),
            ],
            ordering=["name"],
            permissions=[("run_schedule", "Can run a schedule now")],
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(
                        models.Q(("cron__isnull", False), ("every__isnull", True)),
                        models.Q(("cron__isnull", True), ("every__isnull", False)),
                        _connector="OR",
                    ),
                    name="queue_schedules_cron_or_every",
                ),
                models.CheckConstraint(
                    condition=models.Q(
                        ("every__isnull", True), ("every__gte", "1 second"), _connector="OR"
                    ),
                    name="queue_schedules_every_positive",
                ),
                models.CheckConstraint(
                    condition=models.Q(("catch_up__in", ["once", "skip"])),
                    name="queue_schedules_catch_up_valid",
                ),
                models.CheckConstraint(
                    condition=models.Q(("source__in", ["code", "db", "removed"])),
                    name="queue_schedules_source_valid",
                ),
                models.CheckConstraint(
                    condition=models.Q(("priority__gte", -100), ("priority__lte", 100)),
                    name="queue_schedules_priority_valid",
                ),
            ],
        ),
        _table(
            "ScheduleTick",
            "queue_schedule_ticks",
            "schedule tick",
            [
                ("pk", _composite_key("schedule", "tick_at")),
                ("tick_at", models.DateTimeField()),
                ("job_id", models.BigIntegerField()),
                ("missed", models.IntegerField(default=0)),
                ("fired_at", _now()),
                (
                    "schedule",
                    models.ForeignKey(
                        db_column="schedule",
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ticks",
                        to="django_pgqueue.schedule",
                    ),
                ),
            ],
            ordering=["schedule", "-tick_at"],
        ),
        _table(
            "WorkerRecord",
            "queue_workers",
            "worker",
            [
                ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("queues", models.JSONField()),
                ("concurrency", models.IntegerField()),
                ("lease_seconds", models.FloatField()),
                ("version", models.CharField(max_length=64)),
                ("running", models.IntegerField(db_default=0)),
                ("started_at", _now()),
                ("last_seen_at", _now()),
                ("gone_at", _optional(models.DateTimeField)),
                ("report", _optional(models.JSONField)),
                ("supervisor", _optional(models.CharField, max_length=255)),
            ],
            ordering=["-last_seen_at"],
            permissions=[("control_worker", "Can stop, drain, resume and resize workers")],
        ),
        _table(
            "MinuteStats",
            "queue_stats_minutely",
            "chart",
            [
                _id(),
                ("minute", models.DateTimeField()),
                ("queue", models.CharField(max_length=63)),
                ("completed", models.IntegerField(db_default=0)),
                ("retried", models.IntegerField(db_default=0)),
                ("dead", models.IntegerField(db_default=0)),
                ("wait_seconds_sum", models.FloatField(db_default=0.0)),
                ("wait_buckets", django_pgqueue.models.observability.IntegerArrayField()),
                ("run_seconds_sum", models.FloatField(db_default=0.0)),
                (
                    "run_buckets",
                    django_pgqueue.models.observability.IntegerArrayField(blank=True, null=True),
                ),
                ("backlog", _optional(models.IntegerField)),
            ],
            verbose_name_plural="charts",
            constraints=[
                models.UniqueConstraint(fields=("minute", "queue"), name="queue_stats_minutely_key")
            ],
        ),
        _table(
            "QueueControl",
            "queue_controls",
            "queue",
            [
                ("queue", models.CharField(max_length=63, primary_key=True, serialize=False)),
                ("paused", models.BooleanField(db_default=False)),
                ("concurrency_limit", _optional(models.IntegerField)),
                ("key_limit", models.IntegerField(db_default=1)),
                *_rate_fields(),
                ("keyed", models.BooleanField(db_default=False)),
                ("configured", _optional(models.JSONField)),
                ("updated_at", _now()),
            ],
            verbose_name_plural="queues",
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(
                        ("concurrency_limit__isnull", True),
                        ("concurrency_limit__gte", 0),
                        _connector="OR",
                    ),
                    name="queue_controls_limit_valid",
                ),
                models.CheckConstraint(
                    condition=models.Q(("key_limit__gte", 1)), name="queue_controls_key_valid"
                ),
                _rate_valid("queue_controls_rate_valid"),
            ],
        ),
        _table(
            "QueueTypeControl",
            "queue_type_controls",
            "job type limit",
            [
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("queue", models.CharField(max_length=63)),
                ("type", models.CharField(max_length=255)),
                ("key_limit", _optional(models.IntegerField)),
                *_rate_fields(),
                ("updated_at", _now()),
            ],
            constraints=[
                models.UniqueConstraint(fields=("queue", "type"), name="queue_type_controls_key"),
                models.CheckConstraint(
                    condition=models.Q(
                        ("key_limit__isnull", True), ("key_limit__gte", 1), _connector="OR"
                    ),
                    name="queue_type_controls_key_valid",
                ),
                _rate_valid("queue_type_controls_rate_valid"),
            ],
        ),
        _table(
            "ScheduleCode",
            "queue_schedule_code",
            "schedule code version",
            [
                ("fingerprint", models.CharField(max_length=64, primary_key=True, serialize=False)),
                ("first_seen", _now()),
                ("last_seen", _now()),
            ],
        ),
        _table(
            "Workflow",
            "queue_workflows",
            "workflow",
            [
                _id(),
                ("name", models.CharField(max_length=255)),
                ("steps", models.IntegerField()),
                ("created_at", _now()),
            ],
        ),
        _table(
            "JobDependency",
            "queue_job_deps",
            "job dependency",
            [
                _id(),
                ("depends_on", _job_link("depends_on", related_name="dependents", db_index=False)),
                ("job", _job_link("job_id", related_name="dependencies")),
            ],
            constraints=[
                models.UniqueConstraint(fields=("depends_on", "job"), name="queue_job_deps_edge"),
                models.CheckConstraint(
                    condition=models.Q(("job", models.F("depends_on")), _negated=True),
                    name="queue_job_deps_not_self",
                ),
            ],
        ),
        _table(
            "WorkflowStep",
            "queue_workflow_steps",
            "workflow step",
            [
                ("job", _job_row(related_name="workflow_step")),
                ("name", models.CharField(max_length=255)),
                (
                    "on_failure",
                    models.CharField(
                        choices=[
                            ("cancel", "cancelled when a dependency fails"),
                            ("run", "runs anyway once its dependencies finished"),
                            ("error", "runs only when a dependency failed (link_error)"),
                        ],
                        max_length=8,
                    ),
                ),
                ("waiting_for", models.IntegerField()),
                ("failed", models.IntegerField(default=0)),
                ("cancelled_by", _optional(models.BigIntegerField)),
                (
                    "workflow",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="step_rows",
                        to="django_pgqueue.workflow",
                    ),
                ),
                ("collects", models.BooleanField(db_default=False, default=False)),
                ("delay", models.FloatField(db_default=0.0, default=0.0)),
            ],
            constraints=[
                models.UniqueConstraint(
                    fields=("workflow", "name"), name="queue_workflow_steps_name"
                ),
                models.CheckConstraint(
                    condition=models.Q(("failed__gte", 0), ("waiting_for__gte", 0)),
                    name="queue_workflow_steps_counts",
                ),
                models.CheckConstraint(
                    condition=models.Q(("on_failure__in", ["cancel", "run", "error"])),
                    name="queue_workflow_steps_on_failure",
                ),
            ],
        ),
        _table(
            "JobWaiter",
            "queue_job_waiters",
            "job waiter",
            [
                _id(),
                ("job_id", models.BigIntegerField()),
                ("queue", models.CharField(max_length=63)),
                ("expires_at", models.DateTimeField()),
            ],
            indexes=[models.Index(fields=["job_id"], name="queue_job_waiters_job_idx")],
        ),
        _table(
            "Batch",
            "queue_batches",
            "batch",
            [
                _id(),
                ("name", models.CharField(max_length=255)),
                ("size", models.IntegerField()),
                ("created_at", _now()),
                (
                    "workflow",
                    models.OneToOneField(
                        blank=True,
                        db_constraint=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="batch",
                        to="django_pgqueue.workflow",
                    ),
                ),
            ],
            verbose_name_plural="batches",
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(("size__gte", 0)), name="queue_batches_size"
                )
            ],
        ),
        _table(
            "BatchJob",
            "queue_batch_jobs",
            "batch member",
            [
                ("job", _job_row(related_name="batch_membership")),
                (
                    "batch",
                    models.ForeignKey(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="members",
                        to="django_pgqueue.batch",
                    ),
                ),
            ],
        ),
        _table(
            "WorkerRequest",
            "queue_worker_requests",
            "worker request",
            [
                _id(),
                ("worker_id", models.CharField(max_length=255)),
                ("action", models.CharField(max_length=16)),
                ("concurrency", _optional(models.IntegerField)),
                ("requested_by", models.CharField(max_length=255)),
                ("requested_at", _now()),
                ("taken_at", _optional(models.DateTimeField)),
                ("answer", _optional(models.TextField)),
            ],
            indexes=[
                _partial("queue_worker_requests_open_idx", ["worker_id"], taken_at__isnull=True)
            ],
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(("action__in", ["stop", "drain", "resume", "concurrency"])),
                    name="queue_worker_requests_action_valid",
                ),
                models.CheckConstraint(
                    condition=models.Q(
                        models.Q(("action", "concurrency"), ("concurrency__gte", 1)),
                        models.Q(
                            models.Q(("action", "concurrency"), _negated=True),
                            ("concurrency__isnull", True),
                        ),
                        _connector="OR",
                    ),
                    name="queue_worker_requests_concurrency_valid",
                ),
            ],
        ),
        _table(
            "Event",
            "queue_events",
            "event",
            [
                ("key", models.TextField(primary_key=True, serialize=False)),
                ("payload", models.JSONField(null=True)),
                ("emitted_at", _now()),
            ],
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(("key__regex", "^.{1,200}$")),
                    name="queue_events_valid",
                )
            ],
        ),
        _table(
            "EventWait",
            "queue_event_waits",
            "event wait",
            [
                ("job_id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("key", models.TextField()),
                ("name", models.TextField()),
                ("timeout_at", models.DateTimeField(null=True)),
                ("created_at", _now()),
            ],
            indexes=[
                models.Index(fields=["key"], name="queue_event_waits_key_idx"),
                _partial("queue_event_waits_timeout_idx", ["timeout_at"], timeout_at__isnull=False),
            ],
        ),
        _table(
            "JobStep",
            "queue_job_steps",
            "job step",
            [
                ("pk", _composite_key("job_id", "name")),
                ("job_id", models.BigIntegerField()),
                ("name", models.TextField()),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("step", "Step"),
                            ("atomic", "Atomic"),
                            ("sleep", "Sleep"),
                            ("event", "Event"),
                        ],
                        max_length=16,
                    ),
                ),
                ("result", models.JSONField(null=True)),
                ("lease_version", models.BigIntegerField(null=True)),
                ("runtime", models.FloatField(null=True)),
                ("recorded_at", _now()),
            ],
            constraints=[
                models.CheckConstraint(
                    condition=models.Q(
                        ("kind__in", ["step", "atomic", "sleep", "event"]),
                        ("name__regex", "^.{1,200}$"),
                        models.Q(("runtime__isnull", True), ("runtime__gte", 0), _connector="OR"),
                    ),
                    name="queue_job_steps_valid",
                )
            ],
        ),
        _table(
            "UniqueKey",
            "queue_unique_keys",
            "unique key",
            [
                _id(),
                ("queue", models.CharField(max_length=63)),
                ("unique_key", models.CharField(max_length=255)),
                ("job_id", models.BigIntegerField()),
                ("held_until", models.DateTimeField()),
            ],
            constraints=[
                models.UniqueConstraint(
                    fields=("queue", "unique_key"), name="queue_unique_keys_key"
                )
            ],
        ),
        _table(
            "Sequence",
            "queue_sequences",
            "sequence",
            [
                _id(),
                ("queue", models.CharField(max_length=63)),
                ("sequence_key", models.CharField(max_length=255)),
                ("head_job_id", _optional(models.BigIntegerField)),
            ],
            constraints=[
                models.UniqueConstraint(
                    fields=("queue", "sequence_key"), name="queue_sequences_key"
                ),
                models.UniqueConstraint(
                    condition=models.Q(("head_job_id__isnull", False)),
                    fields=("head_job_id",),
                    name="queue_sequences_head",
                ),
            ],
        ),
        migrations.RunSQL(
            sql=[_foreign_key(*key) for key in FOREIGN_KEYS],
            reverse_sql=[
                f"ALTER TABLE {table} DROP CONSTRAINT {table}_{key}_fk"
                for table, key, *_ in reversed(FOREIGN_KEYS)
            ],
        ),
        # Storage: a job's state row is rewritten several times (claim, renewals,
        # finish). Free space on each page lets the new version stay on the same page,
        # and lets lease renewals, which touch no indexed column, be HOT updates that
        # add no index entries. Vacuum early on the hot table: dead versions pile up
        # fast and a small table stays cached.
        migrations.RunSQL(
            sql=[
                "ALTER TABLE queue_job_state SET (fillfactor = 70, "
                "autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000, "
                "autovacuum_vacuum_insert_scale_factor = 0.05, "
                "autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)",
                "ALTER TABLE queue_attempts SET (fillfactor = 90)",
                "CREATE INDEX queue_jobs_created_brin ON queue_jobs USING brin (created_at)",
            ],
            reverse_sql=[
                "DROP INDEX queue_jobs_created_brin",
                "ALTER TABLE queue_attempts RESET (fillfactor)",
                "ALTER TABLE queue_job_state RESET (fillfactor, autovacuum_vacuum_scale_factor, "
                "autovacuum_vacuum_threshold, autovacuum_vacuum_insert_scale_factor, "
                "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)",
            ],
        ),
        migrations.RunSQL(
            sql=[
                JOBS_VALID,
                JOB_STATE_VALID,
                ATTEMPTS_VALID,
                "ALTER TABLE queue_jobs ADD CONSTRAINT queue_jobs_valid "
                "CHECK (queue_jobs_valid(queue, type))",
                "ALTER TABLE queue_job_state ADD CONSTRAINT queue_job_state_valid "
                "CHECK (queue_job_state_valid(status, priority, attempts, max_attempts, "
                "lease_version, locked_by, locked_until, finished_at, sequence_key, "
                "sequence_on_failure))",
                "ALTER TABLE queue_attempts ADD CONSTRAINT queue_attempts_valid "
                "CHECK (queue_attempts_valid(status, attempt_index, lease_version, finished_at))",
            ],
            reverse_sql=[
                "ALTER TABLE queue_attempts DROP CONSTRAINT queue_attempts_valid",
                "ALTER TABLE queue_job_state DROP CONSTRAINT queue_job_state_valid",
                "ALTER TABLE queue_jobs DROP CONSTRAINT queue_jobs_valid",
                f"DROP FUNCTION {ATTEMPTS_VALID_SIGNATURE}",
                f"DROP FUNCTION {JOB_STATE_VALID_SIGNATURE}",
                "DROP FUNCTION queue_jobs_valid(text, text)",
            ],
        ),
        migrations.RunSQL(
            sql=[
                KEYS_FIXED,
                DELETE_STATE,
                "CREATE TRIGGER queue_jobs_keys_fixed AFTER UPDATE OF id, queue ON queue_jobs "
                "FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.queue IS DISTINCT FROM "
                "NEW.queue) EXECUTE FUNCTION queue_job_keys_fixed()",
                "CREATE TRIGGER queue_job_state_keys_fixed AFTER UPDATE OF job_id, queue "
                "ON queue_job_state FOR EACH ROW WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id "
                "OR OLD.queue IS DISTINCT FROM NEW.queue) "
                "EXECUTE FUNCTION queue_job_keys_fixed()",
                *DELETE_STATE_TRIGGERS,
            ],
            reverse_sql=[
                "DROP TRIGGER queue_jobs_truncate_state ON queue_jobs",
                "DROP TRIGGER queue_jobs_delete_state ON queue_jobs",
                "DROP TRIGGER queue_job_state_keys_fixed ON queue_job_state",
                "DROP TRIGGER queue_jobs_keys_fixed ON queue_jobs",
                "DROP FUNCTION queue_jobs_delete_state()",
                "DROP FUNCTION queue_job_keys_fixed()",
            ],
        ),
        migrations.RunSQL(
            sql=[
                HOLDS_UNIQUE_KEY,
                END_EVENT_WAITS,
                ENQUEUE,
                ENQUEUE_UNIQUE,
                SEQUENCE_NEXT,
                SETTLE,
                UNSETTLE,
                CLAIM,
                WORKER_ALIVE,
                PARK,
                EMIT,
                ENQUEUE_SEQUENCED,
                SEQUENCE_RELEASE,
                ENQUEUE_CANCEL_RUNNING,
            ],
            reverse_sql=[
                f"DROP FUNCTION {ENQUEUE_CANCEL_RUNNING_SIGNATURE}",
                "DROP FUNCTION pgqueue_sequence_release(text, text)",
                f"DROP FUNCTION {ENQUEUE_SEQUENCED_SIGNATURE}",
                "DROP FUNCTION pgqueue_emit(text, jsonb)",
                "DROP FUNCTION pgqueue_park(bigint, bigint, bigint, text, text, float8, text)",
                "DROP FUNCTION pgqueue_worker_alive(timestamptz, timestamptz, float8, jsonb)",
                "DROP FUNCTION pgqueue_claim(bigint[], text, text, float8, timestamptz)",
                "DROP FUNCTION pgqueue_unsettle(bigint[], bigint[])",
                "DROP FUNCTION pgqueue_settle(bigint[], bigint[])",
                f"DROP FUNCTION {ENQUEUE_UNIQUE_SIGNATURE}",
                f"DROP FUNCTION {ENQUEUE_SIGNATURE}",
                "DROP FUNCTION pgqueue_sequence_next(bigint[])",
                "DROP FUNCTION pgqueue_end_event_waits(bigint[], jsonb)",
                "DROP FUNCTION pgqueue_holds_unique_key(text, text, bigint)",
            ],
        ),
    ]
