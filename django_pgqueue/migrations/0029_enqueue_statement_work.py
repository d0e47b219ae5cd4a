# Less work per statement on the enqueue path, every invariant kept.
#
# - queue_job_state had two CHECK constraints: queue_job_state_valid (a function call)
#   and queue_job_state_sequence_valid (an expression). PostgreSQL reads each one back
#   from its stored form and prepares it for every statement that writes the table, so
#   each costs per statement, whatever it checks. The sequence rule is now one more
#   condition of queue_job_state_valid: one CHECK per state-row write. Its parameters
#   have the columns' own types (varchar), so the stored call holds no casts to read
#   back.
# - pgqueue_enqueue and pgqueue_enqueue_unique: the concurrency key's look at
#   queue_controls is a condition of its own, run only for a job with a key (as one
#   condition with the key's test, PL/pgSQL ran the sub-query's statement for every
#   job); pg_notify is called in an assignment, a simple expression, where PERFORM ran
#   a statement.
#
# The functions are the squashed migration's text with those changes.

import importlib

from django.db import migrations

_squashed = importlib.import_module("django_pgqueue.migrations.0001_squashed_0022_many_tenants")

# queue_job_state_valid: the squashed migration's function with the sequence rule (and
# its messages) added and its parameters in the columns' types.
OLD_PARAMS = """\
    status text, priority smallint, attempts integer, max_attempts integer,
    lease_version bigint, locked_by text, locked_until timestamptz, finished_at timestamptz
) RETURNS boolean"""
NEW_PARAMS = """\
    status varchar, priority smallint, attempts integer, max_attempts integer,
    lease_version bigint, locked_by varchar, locked_until timestamptz,
    finished_at timestamptz, sequence_key varchar, sequence_on_failure varchar
) RETURNS boolean"""
OLD_VALID = """\
       AND (status IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL) THEN
"""
NEW_VALID = """\
       AND (status IN ('completed', 'dead', 'cancelled')) = (finished_at IS NOT NULL)
       AND (sequence_key IS NULL) = (sequence_on_failure IS NULL)
       AND (sequence_on_failure IS NULL OR sequence_on_failure IN ('hold', 'continue')) THEN
"""
OLD_LAST = """\
    END IF;
    RAISE check_violation USING MESSAGE = format(
        'queue_job_state: a %s row must %s finished_at', status,
        CASE WHEN status IN ('completed', 'dead', 'cancelled') THEN 'have' ELSE 'not have' END);
END
"""
NEW_LAST = r"""
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
""".removeprefix("\n")
JOB_STATE_VALID = _squashed.JOB_STATE_VALID
for _old, _new in ((OLD_PARAMS, NEW_PARAMS), (OLD_VALID, NEW_VALID), (OLD_LAST, NEW_LAST)):
    if JOB_STATE_VALID.count(_old) != 1:
        raise RuntimeError("queue_job_state_valid is not the text this migration changes")
    JOB_STATE_VALID = JOB_STATE_VALID.replace(_old, _new)
JOB_STATE_VALID_SIGNATURE = (
    "queue_job_state_valid(varchar, smallint, integer, integer, bigint, varchar, timestamptz, "
    "timestamptz, varchar, varchar)"
)
STATE_CHECK = (
    "ALTER TABLE queue_job_state ADD CONSTRAINT queue_job_state_valid "
    "CHECK (queue_job_state_valid(status, priority, attempts, max_attempts, lease_version, "
    "locked_by, locked_until, finished_at, sequence_key, sequence_on_failure))"
)
OLD_STATE_CHECK = (
    "ALTER TABLE queue_job_state ADD CONSTRAINT queue_job_state_valid "
    "CHECK (queue_job_state_valid(status, priority, attempts, max_attempts, "
    "lease_version, locked_by, locked_until, finished_at))"
)
DROP_STATE_CHECK = "ALTER TABLE queue_job_state DROP CONSTRAINT queue_job_state_valid"

# The tail both enqueue functions share (the squashed migration's KEYED_AND_DUE and the
# condition before it), and what it becomes.
OLD_TAIL = "p_concurrency_key IS NOT NULL AND NOT EXISTS (\n" + _squashed.KEYED_AND_DUE
NEW_TAIL = """\
p_concurrency_key IS NOT NULL THEN
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
OLD_DECLARE = "DECLARE\n    v_id bigint;\n"
NEW_DECLARE = "DECLARE\n    v_id bigint;\n    v_woken boolean;  -- pg_notify's (void) result\n"


def _replaced(text: str) -> tuple[str, str]:
    """The squashed migration's function `text` as it was and as this migration makes it."""
    old = text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    if old.count(OLD_TAIL) != 1 or old.count(OLD_DECLARE) != 1:
        raise RuntimeError("an enqueue function is not the text this migration changes")
    return old, old.replace(OLD_TAIL, NEW_TAIL).replace(OLD_DECLARE, NEW_DECLARE)


OLD_ENQUEUE, NEW_ENQUEUE = _replaced(_squashed.ENQUEUE)
OLD_ENQUEUE_UNIQUE, NEW_ENQUEUE_UNIQUE = _replaced(_squashed.ENQUEUE_UNIQUE)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0028_claim_order")]

    operations = [
        migrations.RemoveConstraint(model_name="jobstate", name="queue_job_state_sequence_valid"),
        migrations.RunSQL(
            sql=[
                JOB_STATE_VALID,
                DROP_STATE_CHECK,
                STATE_CHECK,
                f"DROP FUNCTION {_squashed.JOB_STATE_VALID_SIGNATURE}",
            ],
            reverse_sql=[
                _squashed.JOB_STATE_VALID,
                DROP_STATE_CHECK,
                OLD_STATE_CHECK,
                f"DROP FUNCTION {JOB_STATE_VALID_SIGNATURE}",
            ],
        ),
        migrations.RunSQL(
            sql=[NEW_ENQUEUE, NEW_ENQUEUE_UNIQUE], reverse_sql=[OLD_ENQUEUE, OLD_ENQUEUE_UNIQUE]
        ),
    ]
