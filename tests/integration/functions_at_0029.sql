-- pgqueue_enqueue_unique and pgqueue_emit as the migrations up to 0029 created them
-- (before 0030 wrote them again): what a database the old files migrated holds.

CREATE FUNCTION pgqueue_enqueue_unique(
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
                    ON CONFLICT (queue, unique_key) WHERE (
                        (unique_hold = 'pending' AND status = 'pending' AND lease_version = 0)
                        OR (unique_hold = 'active'
                            AND status IN ('waiting', 'pending', 'running'))
                        OR (unique_hold = 'until_completed'
                            AND status IN ('waiting', 'pending', 'running', 'dead'))
                    )
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
                    ON CONFLICT (queue, unique_key) WHERE (
                        (unique_hold = 'pending' AND status = 'pending' AND lease_version = 0)
                        OR (unique_hold = 'active'
                            AND status IN ('waiting', 'pending', 'running'))
                        OR (unique_hold = 'until_completed'
                            AND status IN ('waiting', 'pending', 'running', 'dead'))
                    )
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
              AND (
                  (live.unique_hold = 'pending' AND live.status = 'pending'
                   AND live.lease_version = 0)
                  OR (live.unique_hold = 'active'
                      AND live.status IN ('waiting', 'pending', 'running'))
                  OR (live.unique_hold = 'until_completed'
                      AND live.status IN ('waiting', 'pending', 'running', 'dead'))
              );
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
    END IF;
    job_id := v_id;
END
$$
;

CREATE FUNCTION pgqueue_emit(p_key text, p_payload jsonb)
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
    -- Each wait's row is taken once: by this delete or by the timeout's (whichever
    -- deletes it records the wait's checkpoint and wakes the job).
    WITH taken AS (
        DELETE FROM queue_event_waits AS wait
        WHERE wait.key = p_key
        RETURNING wait.job_id, wait.name
    ), recorded AS (
        INSERT INTO queue_job_steps (job_id, name, kind, result)
        SELECT taken.job_id, taken.name, 'event', jsonb_build_object('payload', p_payload)
        FROM taken
        ON CONFLICT DO NOTHING
    ), woken AS (
        UPDATE queue_job_state AS state
        SET status = 'pending', run_at = now(), updated_at = now()
        WHERE state.job_id IN (SELECT taken.job_id FROM taken)
          AND state.status = 'waiting'
        RETURNING state.queue
    ), notified AS (
        SELECT count(pg_notify('pgqueue', queues.queue)) AS queues
        FROM (SELECT DISTINCT woken.queue FROM woken) AS queues
    )
    SELECT (SELECT count(*) FROM taken)::integer INTO delivered FROM notified;
    emitted := true;
    RETURN NEXT;
END
$$
;
