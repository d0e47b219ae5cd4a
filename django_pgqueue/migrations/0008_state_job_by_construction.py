# Issue 16: the state row's foreign key to its job, replaced by construction plus triggers
# off the hot path. The foreign key (job_id, queue) -> queue_jobs (id, queue) ran a
# referential check per state row inserted: 23-40 µs of each single enqueue's server
# time and 5 µs per job of enqueue_many (a quarter of a 20,000-job statement), plus
# the unique (id, queue) index on queue_jobs that existed only as its target.
#
# What holds the invariant "a state row always has its job, on the same queue" now:
# - every statement that inserts a state row inserts its job in the same statement
#   (pgqueue_enqueue, job_enqueue_many, job_enqueue_many_keyed, schedule_fire), with
#   the same id and queue: proven by tests/integration/test_constraints.py;
# - a job's id and queue never change: an AFTER UPDATE OF trigger refuses an update
#   that changes them, on either table (no statement of the app updates them, so the
#   trigger never fires on a hot path; it is checked only for updates that list them);
# - deleting a job deletes its state row (and, through queue_attempts_job_fk, its
#   attempts): a statement-level AFTER DELETE trigger, one DELETE per statement rather
#   than one per row; TRUNCATE queue_jobs is refused unless queue_job_state goes too.

from django.db import migrations

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

FOREIGN_KEY = (
    "ALTER TABLE queue_job_state ADD CONSTRAINT queue_job_state_job_fk "
    "FOREIGN KEY (job_id, queue) REFERENCES queue_jobs (id, queue) ON DELETE CASCADE"
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0007_enqueue_function")]

    operations = [
        migrations.RunSQL(
            sql=[
                "ALTER TABLE queue_job_state DROP CONSTRAINT queue_job_state_job_fk",
                KEYS_FIXED,
                DELETE_STATE,
                "CREATE TRIGGER queue_jobs_keys_fixed AFTER UPDATE OF id, queue ON queue_jobs "
                "FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.queue IS DISTINCT FROM "
                "NEW.queue) EXECUTE FUNCTION queue_job_keys_fixed()",
                "CREATE TRIGGER queue_job_state_keys_fixed AFTER UPDATE OF job_id, queue "
                "ON queue_job_state FOR EACH ROW WHEN (OLD.job_id IS DISTINCT FROM NEW.job_id "
                "OR OLD.queue IS DISTINCT FROM NEW.queue) "
                "EXECUTE FUNCTION queue_job_keys_fixed()",
                "CREATE TRIGGER queue_jobs_delete_state AFTER DELETE ON queue_jobs "
                "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT "
                "EXECUTE FUNCTION queue_jobs_delete_state()",
                "CREATE TRIGGER queue_jobs_truncate_state AFTER TRUNCATE ON queue_jobs "
                "FOR EACH STATEMENT EXECUTE FUNCTION queue_jobs_delete_state()",
            ],
            reverse_sql=[
                "DROP TRIGGER queue_jobs_truncate_state ON queue_jobs",
                "DROP TRIGGER queue_jobs_delete_state ON queue_jobs",
                "DROP TRIGGER queue_job_state_keys_fixed ON queue_job_state",
                "DROP TRIGGER queue_jobs_keys_fixed ON queue_jobs",
                "DROP FUNCTION queue_jobs_delete_state()",
                "DROP FUNCTION queue_job_keys_fixed()",
                FOREIGN_KEY,
            ],
        ),
        migrations.RemoveConstraint(model_name="job", name="queue_jobs_id_queue_unique"),
    ]
