"""Which statements of sql/ filter on the queue, the distribution column of the Citus design.

docs/howto/scaling-out.md lays out the design: queue_jobs, queue_job_state and
queue_attempts distributed by queue. A statement runs on one node (a router query,
the only kind in which FOR UPDATE and SKIP LOCKED work) when each of its steps that
touches those tables filters on the queue. tests/routing.py says what is checked
(a reading of the lexed SQL, no Citus here); this file holds the classification of
every statement that touches the job tables, so that a new or changed statement must
be placed in it:

- ROUTED: every step filters on the queue (the claims, enqueue), except the steps
  listed in UNROUTED_STEPS with why: the attempt rows (queue_attempts has no queue
  column yet, which the design adds first) and the claim's update by primary key.
  The claims' walks are statements of sql/; the jobs they walked are taken by the
  function pgqueue_claim (its migration), whose statement is read here too, with its
  queue argument (p_queue) standing for the parameter; so is the statement of
  pgqueue_end_event_waits, which the emit and the waits' timeout call.
- BY_JOB_ID: worker statements that still address their rows by job id alone; they
  would run on every shard. Each says why the queue is not passed yet.
- EXEMPT: operator, admin and multi-queue maintenance statements, with the reason
  they read or write across queues.

The mutated statements at the end take a routed statement, take its queue filter
away (or weaken it), and check the checker flags that step, so the classification
cannot pass by reading nothing.
"""

from __future__ import annotations

import importlib

import pytest

from django_pgqueue.sql import QUERIES
from tests.routing import references, touches_job_tables, unrouted


def _function_statement(migration: str, constant: str) -> str:
    """The statement a PL/pgSQL function of `migration` returns (RETURN QUERY ... ;)."""
    text = getattr(importlib.import_module(f"django_pgqueue.migrations.{migration}"), constant)
    return text.split("RETURN QUERY", 1)[1].split(";\nEND", 1)[0]


# The functions' statements, with the arguments that stand for parameters in them.
FUNCTIONS = {
    "pgqueue_claim": (
        _function_statement("0001_squashed_0029_enqueue_statement_work", "CLAIM"),
        ("p_queue",),
    ),
    "pgqueue_end_event_waits": (
        _function_statement("0001_squashed_0029_enqueue_statement_work", "END_EVENT_WAITS"),
        (),
    ),
}
STATEMENTS = {**QUERIES, **{name: text for name, (text, _) in FUNCTIONS.items()}}
PARAMETERS = {name: parameters for name, (_, parameters) in FUNCTIONS.items()}

ROUTED = {
    # The claims: their walk and their probes name the one queue they claim from (but
    # for the steps in UNROUTED_STEPS), and the worker's reads of one queue.
    "job_claim",
    "job_claim_after",
    "job_claim_controlled",
    "job_claim_fair",
    "job_claim_fair_alone",
    "pgqueue_claim",
    "queue_next_due",
    "queue_control_state",
    # Counts each control row's running jobs on that row's queue: one shard per row
    # (queue_controls co-located), over every controlled queue: a multi-shard read.
    "queue_control_show",
    # A worker's backlog sample: one count per queue it serves, each on that queue.
    "stats_minute_backlog",
    # The parked durable jobs: one count per queue asked about, each on that queue.
    "stats_parked",
    # Enqueue: each row inserted carries its queue (a row is routed by its own value).
    "job_enqueue_many",
    "job_enqueue_many_alike",
    "job_enqueue_many_keyed",
    "workflow_enqueue",
    "schedule_fire",
    # Joined on queue to the (queue, key) pairs asked about: one shard per pair, but
    # several pairs of several queues make it a multi-shard read (no lock taken).
    "job_live_by_keys",
    # The type of a unique key's holder, named when a debounce of another type is refused.
    "job_type",
}

# The steps of routed statements left unrouted, with why. The claim opens each attempt
# in the same statement, and queue_attempts has no queue column yet.
_ATTEMPTS = "queue_attempts has no queue column yet"
# The claim's update finds the candidates' rows by primary key. A queue filter there is
# a filter on rows found already, but it lowers the planner's estimate of the rows
# updated, which changes the plan's later joins (measured: the join of the updated rows
# with their attempts turns from a hash join into a nested loop); the claim's plan is
# kept as it is. On Citus this step needs the filter, and the plan a check there anyway.
_CLAIMED = "the filter would change the claim's plan (see above)"
UNROUTED_STEPS = {
    "pgqueue_claim": {
        ("opened", "queue_attempts"): _ATTEMPTS,
        ("claimed", "queue_job_state"): _CLAIMED,
    },
}

_COMPLETION = (
    "the store's Completion is (job_id, lease_version, attempt_id, result): the queue "
    "the worker claimed the job from is not passed yet, and one completion batch may "
    "hold jobs of several queues (it is sent with the next claim, of any queue)"
)
_ONE_JOB = (
    "Store.fail/give-back take (job_id, lease_version, attempt_id, failure): the "
    "queue is known to the worker (ClaimedRow.queue) but not passed yet"
)
_DURABLE = (
    "a durable step is recorded from the handler's context, which knows its queue "
    "(ctx.queue) but does not pass it yet; queue_job_steps would be co-located by it"
)
BY_JOB_ID = {
    "job_complete": _COMPLETION,
    "lease_renew": "the heartbeat renews every job the worker holds, of all its queues, "
    "in one statement: per queue it would be one statement per queue served",
    "job_release": "shutdown hands back the unstarted jobs of all the worker's queues at once",
    "job_fail": _ONE_JOB,
    "job_interrupt": _ONE_JOB,
    "job_hold": "a stopping worker locks (FOR KEY SHARE) the rows of all its queues at "
    "once: on Citus a row lock needs a router query, so this one must be split per queue",
    "job_locked_by": "after a reconnect the worker asks which rows name it, in any of its "
    "queues: one statement per queue served would route",
    "attempt_outcome": "reads attempts by id after a lost COMMIT; queue_attempts has no "
    "queue column yet",
    "stats_minute_add": "reads the finished attempts by id for the rollup; queue_attempts "
    "has no queue column yet (the queues are in the parameters)",
    "step_record": _DURABLE,
    "event_take": _DURABLE,
}

EXEMPT = {
    "fair_keys_page": "the admin's page of a fair queue's keys: its keys and counts filter "
    "on the queue, but its share reads the newest attempts of every queue (queue_attempts "
    "has no queue column yet), each joined to its job on the queue",
    "lease_sweep": "multi-queue maintenance: any worker requeues expired leases of every "
    "queue; on Citus its FOR UPDATE SKIP LOCKED needs a per-queue sweep",
    "job_retry_now": "operator action on job ids picked in the admin, of any queues",
    "job_cancel": "operator action on job ids picked in the admin, of any queues",
    "job_cancel_request": "operator action on running job ids, of any queues",
    "step_run_again": "operator action on one job id picked in the admin, after its retry",
    "job_dead_page": "requeue_dead pages through the dead jobs of every queue (queue optional)",
    "job_prune_count": "prune's dry run counts finished jobs of every queue",
    "job_prune_batch": "prune deletes finished jobs of every queue, by primary key order",
    "stats_by_queue": "admin counts, queue_stats and metrics: every queue at once",
    "stats_pending_types": "queue_stats and the system check: every queue at once",
    "stats_completed_by_queue": "queue_stats --exact: every queue at once",
    "names_known": "the admin's filters: every type and queue",
    "worker_running_jobs": "the admin's workers page: the jobs of the workers shown, any queue",
    "attempt_feed": "the admin's live feed: the latest attempts of every queue, by id",
    "attempt_feed_start": "the admin's live feed: where the latest attempts of every queue start",
    "index_live_entries": "index upkeep counts the hot indexes' entries over all queues",
    "job_hold_tables": "LOCK TABLE: a table lock, not a row read (Citus locks every shard)",
    "job_waiter_add": "wait() is given a job id by its caller, not its queue",
    "job_waiter_check": "wait() is given a job id by its caller, not its queue",
    "workflow_parent_results": "a step's parents may be in other queues",
    "workflow_parent_failures": "a link_error step's parents may be in other queues",
    "workflow_failure": "a workflow's steps may be in several queues",
    "workflow_jobs": "a workflow's steps may be in several queues",
    "workflow_page": "the admin's Workflows list: workflows whose steps span queues",
    "workflow_step_details": "the admin's workflow page: steps in several queues",
    "batch_insert": "a batch gathers the jobs its block enqueued, of any queues",
    "batch_link": "a batch's callbacks wait for members of any queues",
    "batch_status": "a batch's counts: its members and callbacks, of any queues",
    "pgqueue_end_event_waits": "ends the waits of the jobs given, by id: an emit's (one "
    "event key) and the timeout's (multi-queue maintenance, like the lease sweep) are of "
    "any queues",
    "step_sleep_due_now": "testing only (run_durable): one job, by its id",
}


def test_every_statement_on_the_job_tables_is_classified_once() -> None:
    touching = {name for name, text in STATEMENTS.items() if touches_job_tables(text)}
    classes = [ROUTED, set(BY_JOB_ID), set(EXEMPT)]
    assert sum(len(c) for c in classes) == len(set().union(*classes)), "classified twice"
    assert set().union(*classes) == touching
    steps = [reason for listed in UNROUTED_STEPS.values() for reason in listed.values()]
    assert all(reason.strip() for reason in [*BY_JOB_ID.values(), *EXEMPT.values(), *steps])
    assert set(UNROUTED_STEPS) <= ROUTED


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_routed_statements_filter_on_the_queue_in_every_step(name: str) -> None:
    problems = {(p.step, p.table) for p in unrouted(STATEMENTS[name], PARAMETERS.get(name, ()))}
    assert problems == set(UNROUTED_STEPS.get(name, {}))


@pytest.mark.parametrize("name", sorted(set(BY_JOB_ID) | set(EXEMPT)))
def test_the_statements_let_off_do_not_filter_on_the_queue(name: str) -> None:
    # A statement that came to filter on the queue belongs in ROUTED: the lists stay exact.
    assert unrouted(STATEMENTS[name]), f"{name} is routed now: move it to ROUTED"


def test_the_claim_is_read_step_by_step() -> None:
    # The checker saw each step of the claim and each table it touches (nothing passes
    # for having been skipped): the walk, then in pgqueue_claim the update, the
    # attempts and the job rows.
    walk = {("candidates", "queue_job_state")}
    assert set(references(QUERIES["job_claim"])) == walk
    assert set(references(QUERIES["job_claim_after"])) == walk
    controlled = set(references(QUERIES["job_claim_controlled"]))
    assert walk | {("budget", "queue_job_state"), ("walk", "queue_jobs")} <= controlled
    assert set(references(STATEMENTS["pgqueue_claim"])) == {
        ("claimed", "queue_job_state"),
        ("opened", "queue_attempts"),
        ("(main)", "queue_jobs"),
    }
    # Each claim hands the jobs it walked to pgqueue_claim, with its queue.
    call = "pgqueue_claim( ARRAY(SELECT job_id FROM candidates), %(queue)s::text,"
    for name in ("job_claim", "job_claim_after", "job_claim_controlled"):
        assert call in " ".join(QUERIES[name].split()), name


CLAIM_WALK = "WHERE queue = %(queue)s::text\n      AND status = 'pending'"
JOB_PROBE = "\n          AND j.queue = p_queue"
TYPE_PROBE = "WHERE j.id = s.job_id AND j.queue = %(queue)s::text"
CONTROLLED_CANDIDATES = "      AND queue = %(queue)s::text  -- the shard"
ALIKE_STATE = "job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version"

MUTATIONS = [
    # (statement, text, replacement, the step then flagged, its table)
    ("job_claim", CLAIM_WALK, "WHERE status = 'pending'", "candidates", "queue_job_state"),
    (
        "job_claim",
        CLAIM_WALK,
        "WHERE queue = ANY (%(queues)s::text[])\n      AND status = 'pending'",
        "candidates",
        "queue_job_state",
    ),
    (
        "job_claim",
        CLAIM_WALK,
        "WHERE queue > %(queue)s::text\n      AND status = 'pending'",
        "candidates",
        "queue_job_state",
    ),
    (
        # The equality moved into a subquery of another table filters nothing here.
        "job_claim",
        CLAIM_WALK,
        "WHERE EXISTS (SELECT FROM queue_controls AS c WHERE c.queue = %(queue)s::text)\n"
        "      AND status = 'pending'",
        "candidates",
        "queue_job_state",
    ),
    (
        # An equality of another column to the queue's parameter is not one.
        "job_claim",
        CLAIM_WALK,
        "WHERE locked_by = %(queue)s::text\n      AND status = 'pending'",
        "candidates",
        "queue_job_state",
    ),
    ("pgqueue_claim", JOB_PROBE, "", "(main)", "queue_jobs"),
    (
        # A name that is not the function's queue argument is no parameter.
        "pgqueue_claim",
        JOB_PROBE,
        "\n          AND j.queue = p_worker_id",
        "(main)",
        "queue_jobs",
    ),
    ("job_claim_after", CLAIM_WALK, "WHERE status = 'pending'", "candidates", "queue_job_state"),
    ("job_claim_controlled", TYPE_PROBE, "WHERE j.id = s.job_id", "walk", "queue_jobs"),
    (
        "job_claim_controlled",
        CONTROLLED_CANDIDATES,
        "      -- the shard",
        "candidates",
        "queue_job_state",
    ),
    (
        "job_enqueue_many_alike",
        ALIKE_STATE,
        "job_id, status, priority, run_at, attempts, max_attempts, lease_version",
        "state",
        "queue_job_state",
    ),
    (
        # The filter only in a comment is no filter: comments are tokens of their own.
        "queue_next_due",
        "WHERE queue = %(queue)s::text AND status",
        "WHERE -- queue = %(queue)s::text\n  status",
        "(main)",
        "queue_job_state",
    ),
    (
        # Nor in a string.
        "queue_next_due",
        "WHERE queue = %(queue)s::text AND status",
        "WHERE 'queue = %(queue)s' <> '' AND status",
        "(main)",
        "queue_job_state",
    ),
]


@pytest.mark.parametrize(("name", "old", "new", "step", "table"), MUTATIONS)
def test_a_statement_whose_queue_filter_is_taken_away_is_flagged(
    name: str, old: str, new: str, step: str, table: str
) -> None:
    text, parameters = STATEMENTS[name], PARAMETERS.get(name, ())
    assert text.count(old) == 1, f"{name}: the text to mutate is not in it exactly once"
    flagged = {(p.step, p.table) for p in unrouted(text, parameters)}
    assert (step, table) not in flagged
    mutated = {(p.step, p.table) for p in unrouted(text.replace(old, new), parameters)}
    assert (step, table) in mutated


def test_a_table_named_outside_a_from_list_is_flagged() -> None:
    # Forms the checker does not read fail rather than pass.
    assert unrouted(
        "SELECT 1 FROM queue_controls AS c, queue_job_state AS s WHERE s.queue = c.queue"
    )
    assert unrouted("LOCK TABLE queue_jobs IN ROW EXCLUSIVE MODE")
