"""The settle step: the fenced statements that end a job settle its dependents, once.

Driven through the worker's Store on real connections, like test_store.py: a stale
write settles nothing, a transaction that never commits settles nothing, the sweep's
dead path settles, and a fan-in completed from many threads at once counts every
member exactly once and makes its callback pending exactly once.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

import psycopg
import pytest
from django.db import connection, transaction

from django_pgqueue import Workflow, chain, chord, group, parent_results, step
from django_pgqueue.actions import retry_now
from django_pgqueue.maintenance import prune
from django_pgqueue.outcomes import Dead, Retry
from django_pgqueue.sql import QUERIES
from django_pgqueue.store.worker import complete_params
from django_pgqueue.workflows import cancel_workflow
from tests.conftest import database_url, sql

pytestmark = pytest.mark.django_db(transaction=True)

Q = "settle"


def s(payload, **options):
    return step("qa.noop", payload, queue=Q, **options)


def status(job_id: int) -> str:
    return sql("SELECT status FROM queue_job_state WHERE job_id = %s", [job_id])[0][0]


def counters(job_id: int) -> tuple[int, int]:
    return sql("SELECT waiting_for, failed FROM queue_workflow_steps WHERE job_id = %s", [job_id])[
        0
    ]


def test_a_stale_completion_settles_nothing_and_the_owners_settles_once(stores):
    run = chain(s("a"), s("b")).enqueue()
    a_id, b_id = run.jobs.values()
    old, new = stores("old"), stores("new")
    first = old.claim(Q, 1, "old", 0.2)[0]
    time.sleep(0.4)  # the lease runs out on the database clock
    assert [row[0] for row in new.sweep()] == [a_id]
    second = new.claim(Q, 1, "new", 30)[0]
    assert old.complete([(a_id, first.lease_version, first.attempt_id, None)]) == set()
    assert (status(b_id), counters(b_id)) == ("waiting", (1, 0))
    assert new.complete([(a_id, second.lease_version, second.attempt_id, None)]) == {a_id}
    assert (status(b_id), counters(b_id)) == ("pending", (0, 0))


def test_a_completion_that_never_commits_settles_nothing(stores):
    run = chain(s("a"), s("b")).enqueue()
    a_id, b_id = run.jobs.values()
    claimed = stores().claim(Q, 1, "w", 30)[0]
    done = [(a_id, claimed.lease_version, claimed.attempt_id, None)]
    # The worker's connection dies between its completion and the COMMIT.
    conn = psycopg.connect(database_url())
    try:
        conn.execute(QUERIES["job_complete"], complete_params(done))
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        assert conn.execute(
            "SELECT status FROM queue_job_state WHERE job_id = %s", [b_id]
        ).fetchone() == ("pending",)  # inside the transaction, settled
        sql("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(psycopg.OperationalError):
            conn.execute("COMMIT")
    finally:
        conn.close()
    assert (status(a_id), status(b_id), counters(b_id)) == ("running", "waiting", (1, 0))


def test_the_sweeps_dead_path_cancels_the_dependents(stores):
    run = chain(s("a", max_attempts=1), s("b"), s("c")).enqueue()
    a_id, b_id, c_id = run.jobs.values()
    store = stores()
    store.claim(Q, 1, "w", 0.1)
    time.sleep(0.3)
    assert [(row[0], row[3]) for row in store.sweep()] == [(a_id, "dead")]
    assert [status(j) for j in (a_id, b_id, c_id)] == ["dead", "cancelled", "cancelled"]
    assert counters(b_id) == (0, 1)
    assert counters(c_id) == (0, 1)


def test_a_retryable_failure_settles_nothing_a_permanent_one_does(stores):
    run = chain(s("a", max_attempts=3), s("b", on_failure="run")).enqueue()
    a_id, b_id = run.jobs.values()
    store = stores()
    first = store.claim(Q, 1, "w", 30)[0]
    retry = Retry("ValueError", "once", "", delay=0)
    assert store.fail(a_id, first.lease_version, first.attempt_id, retry)[0] == "pending"
    assert (status(b_id), counters(b_id)) == ("waiting", (1, 0))
    second = store.claim(Q, 1, "w", 30)[0]
    permanent = Dead("ValueError", "for good", "")
    assert store.fail(a_id, second.lease_version, second.attempt_id, permanent)[0] == "dead"
    # on_failure="run": it runs anyway, once its dependency finished.
    assert (status(b_id), counters(b_id)) == ("pending", (0, 1))


def test_a_plain_completion_never_calls_the_settle_function(stores):
    """A job nothing waits for costs one index probe, not a PL/pgSQL call."""
    plain = Workflow("plain-and-not")
    plain.add("alone", s("alone"))
    plain.add("parent", s("parent"))
    plain.add("child", s("child"), after=["parent"])
    run = plain.enqueue()
    claimed = {row.job_id: row for row in stores().claim(Q, 2, "w", 30)}
    calls = []
    with psycopg.connect(database_url()) as conn:
        conn.execute("SET track_functions = 'pl'")
        for name in ("alone", "parent"):
            row = claimed[run.jobs[name]]
            conn.execute(
                QUERIES["job_complete"],
                complete_params([(row.job_id, row.lease_version, row.attempt_id, None)]),
            )
            calls.append(
                conn.execute(
                    "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
                    "WHERE funcname = 'pgqueue_settle'"
                ).fetchone()[0]
            )
    assert calls == [0, 1]
    assert status(run.jobs["child"]) == "pending"


def test_the_settle_plans_its_statements_once_per_connection(stores):
    """A member completed alone settles with the generic plans of pgqueue_settle's
    statements (the function's parameters, not each call's values): PostgreSQL would
    otherwise re-plan them at every such call, which cost more than running them."""
    run = chord(group(*(s(i) for i in range(12))), s("cb")).enqueue()
    rows = stores().claim(Q, 12, "w", 30)
    plans: list[str] = []
    with psycopg.connect(database_url(), autocommit=True) as conn:
        for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_level = notice"):
            conn.execute("LOAD 'auto_explain'")
            conn.execute(f"SET auto_explain.{setting}")
        conn.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
        for row in rows:  # past the five custom plans PostgreSQL tries first
            conn.execute(
                QUERIES["job_complete"],
                complete_params([(row.job_id, row.lease_version, row.attempt_id, None)]),
            )
    probes = [
        line.strip()
        for plan in plans
        for line in plan.splitlines()
        if "Index Cond: (depends_on = ANY" in line
    ]
    # Two statements probe the edges at each of the 12 calls.
    assert len(probes) == 24, plans
    literal = [probe for probe in probes if "$" not in probe]
    assert literal == [], literal
    assert status(list(run.jobs.values())[-1]) == "pending"


@pytest.mark.parametrize("failures", [0, 7])
def test_a_fan_in_completed_from_eight_threads_counts_each_member_once(stores, failures):
    """200 members ended by 8 workers at once (completions in batches, some deaths):
    the callback is made pending exactly once, with every member counted."""
    members = 200
    run = chord(group(*(s(i) for i in range(members))), s("cb", on_failure="run")).enqueue()
    callback = list(run.jobs.values())[-1]
    doomed = set(list(run.jobs.values())[:failures])
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        store = stores(f"w{n}")
        barrier.wait()
        try:
            while rows := store.claim(Q, 5, f"w{n}", 30):
                done = []
                for row in rows:
                    if row.job_id in doomed:
                        store.fail(
                            row.job_id,
                            row.lease_version,
                            row.attempt_id,
                            Dead("X", "dies", ""),
                        )
                    else:
                        done.append((row.job_id, row.lease_version, row.attempt_id, None))
                assert store.complete(done) == {job_id for job_id, *_ in done}
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert counters(callback) == (0, failures)
    # Made pending once, claimed once (by whichever thread came next), and only after
    # the last member's ending transaction began.
    assert status(callback) == "completed"
    rows = sql("SELECT started_at FROM queue_attempts WHERE job_id = %s", [callback])
    assert len(rows) == 1
    last_member = sql(
        "SELECT max(finished_at) FROM queue_attempts WHERE job_id = ANY(%s)",
        [list(run.jobs.values())[:-1]],
    )[0][0]
    assert rows[0][0] >= last_member


# -- operator retries and prune meet the settle -------------------------------------------


def finish(store, rows, dead=()) -> None:
    """End claimed rows: complete each (its result: {"of": its payload's job id}) or,
    for those in `dead`, fail it for good."""
    for row in rows:
        if row.job_id in dead:
            failure = Dead("X", "dies", "")
            assert store.fail(row.job_id, row.lease_version, row.attempt_id, failure)[0] == "dead"
        else:
            done = [(row.job_id, row.lease_version, row.attempt_id, f'{{"of": {row.job_id}}}')]
            assert store.complete(done) == {row.job_id}


def age(job_ids, ago: str = "30 days") -> None:
    """Mark finished jobs as finished `ago` (a 7-day prune may take them)."""
    sql(
        "UPDATE queue_job_state SET finished_at = now() - %s::interval WHERE job_id = ANY(%s)",
        [ago, list(job_ids)],
    )


def ended_flow(stores):
    """a and b, then c after both: a completed, b dead, c cancelled by b."""
    flow = Workflow("ended")
    flow.add("a", s("a"))
    flow.add("b", s("b"))
    flow.add("c", s("c"), after=["a", "b"])
    run = flow.enqueue()
    store = stores()
    finish(store, store.claim(Q, 2, "w", 30), dead={run.jobs["b"]})
    assert [status(run.jobs[n]) for n in "abc"] == ["completed", "dead", "cancelled"]
    return run, store


class Held:
    """Run `action` in a transaction on this thread's own Django connection, and hold
    the transaction (and its row locks) open until `release()`; `pid` is its backend."""

    def __init__(self, action) -> None:
        self.action = action
        self.result = None
        self.error: BaseException | None = None
        self.pid: int | None = None
        self.started = threading.Event()
        self.acted = threading.Event()
        self.go = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with transaction.atomic():
                self.pid = sql("SELECT pg_backend_pid()")[0][0]
                self.started.set()
                self.result = self.action()
                self.acted.set()
                assert self.go.wait(60), "never released"
        except BaseException as exc:
            self.error = exc
        finally:
            self.started.set()
            self.acted.set()
            connection.close()

    def start(self) -> Held:
        self.thread.start()
        return self

    def release(self):
        self.go.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the held transaction did not end"
        if self.error is not None:
            raise self.error
        return self.result


def waits_for_a_lock(pid: int) -> bool:
    rows = sql("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
    return bool(rows) and rows[0][0] == "Lock"


def wait_until(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


WEEK = dt.timedelta(days=7)


def test_a_prune_while_a_retry_restores_a_step_keeps_its_parents(stores):
    """The retry holds the dead step and the step it puts back to waiting (not
    committed yet) while a prune judges the workflow: the prune takes nothing of it,
    so the restored step, once due, reads every parent's result."""
    run, store = ended_flow(stores)
    age(run.jobs.values())
    retry = Held(lambda: retry_now([run.jobs["b"]]).changed).start()
    assert retry.acted.wait(60)
    pruned = Held(lambda: prune(WEEK).jobs).start().release()
    assert retry.release() == [run.jobs["b"]]
    finish(store, store.claim(Q, 5, "w", 30))
    (c,) = store.claim(Q, 5, "w", 30)
    assert c.job_id == run.jobs["c"]
    assert parent_results(c.job_id) == {"a": {"of": run.jobs["a"]}, "b": {"of": run.jobs["b"]}}
    assert pruned == {}


def test_a_retry_while_a_prune_holds_the_workflow_finds_it_gone(stores):
    """The other crossing: the prune holds the workflow's rows (not committed yet)
    when the retry comes; the retry waits, then finds nothing to retry."""
    run, _ = ended_flow(stores)
    age(run.jobs.values())
    pruning = Held(lambda: prune(WEEK).jobs).start()
    assert pruning.acted.wait(60)
    retry = Held(lambda: retry_now([run.jobs["b"]]).changed).start()
    assert retry.started.wait(60)
    wait_until(lambda: waits_for_a_lock(retry.pid))
    assert pruning.release() == {"completed": 1, "dead": 1, "cancelled": 1}
    assert retry.release() == []
    assert sql("SELECT count(*) FROM queue_jobs WHERE id = ANY(%s)", [list(run.jobs.values())]) == [
        (0,)
    ]


def test_a_workflow_that_ended_across_the_cutoff_is_pruned_whole_or_not_at_all(stores):
    """a finished a month ago, b and c an hour ago: a prune keeps a, so a later retry
    of b runs c with a's result."""
    run, store = ended_flow(stores)
    age([run.jobs["a"]])
    age([run.jobs["b"], run.jobs["c"]], "1 hour")
    counted, pruned = prune(WEEK, dry_run=True).jobs, prune(WEEK).jobs
    assert retry_now([run.jobs["b"]]).changed == [run.jobs["b"]]
    finish(store, store.claim(Q, 5, "w", 30))
    (c,) = store.claim(Q, 5, "w", 30)
    assert parent_results(c.job_id) == {"a": {"of": run.jobs["a"]}, "b": {"of": run.jobs["b"]}}
    assert counted == pruned == {}
    finish(store, [c])
    age(run.jobs.values())
    assert prune(WEEK, dry_run=True).jobs == {"completed": 3}
    assert prune(WEEK).jobs == {"completed": 3}


@pytest.mark.parametrize("on_failure", ["run", "error"])
def test_a_retry_puts_a_dependent_made_due_but_not_started_back_to_waiting(stores, on_failure):
    """bad died, so `after` (runs anyway, or only on a failure) became pending; before
    any worker claims it, bad is retried: `after` waits for bad again, is not
    claimable meanwhile, and runs once, after bad's new ending."""
    flow = Workflow("due")
    flow.add("bad", s("bad"))
    flow.add("after", s("after", on_failure=on_failure), after=["bad"])
    run = flow.enqueue()
    bad, after = run.jobs["bad"], run.jobs["after"]
    store = stores()
    finish(store, store.claim(Q, 5, "w", 30), dead={bad})
    assert (status(after), counters(after)) == ("pending", (0, 1))
    assert retry_now([bad]).changed == [bad]
    assert (status(after), counters(after)) == ("waiting", (1, 0))
    rows = store.claim(Q, 5, "w", 30)
    assert [row.job_id for row in rows] == [bad]
    finish(store, rows, dead={bad})  # it dies again
    assert (status(after), counters(after)) == ("pending", (0, 1))
    finish(store, store.claim(Q, 5, "w", 30))
    assert status(after) == "completed"
    assert sql("SELECT count(*) FROM queue_attempts WHERE job_id = %s", [after]) == [(1,)]


def test_a_step_retried_directly_is_no_longer_cancelled_by_its_dependency(stores):
    """next was cancelled by bad's death; the operator retries next itself, then
    cancels the workflow: a later retry of bad does not bring next back."""
    flow = Workflow("direct")
    flow.add("bad", s("bad"))
    flow.add("next", s("next"), after=["bad"])
    run = flow.enqueue()
    bad, nxt = run.jobs["bad"], run.jobs["next"]
    store = stores()
    finish(store, store.claim(Q, 5, "w", 30), dead={bad})
    assert status(nxt) == "cancelled"
    assert retry_now([nxt]).changed == [nxt]
    assert status(nxt) == "pending"
    assert cancel_workflow(run.id).cancelled == [nxt]
    assert retry_now([bad]).changed == [bad]
    assert status(nxt) == "cancelled"
    assert status(bad) == "pending"


def test_a_step_retried_with_its_culprit_waits_and_is_cancelled_again_by_its_death(stores):
    """bad and next retried in one call: next waits for bad; bad dies again and cancels
    next again, so a further retry of bad puts next back once more."""
    flow = Workflow("together")
    flow.add("bad", s("bad"))
    flow.add("next", s("next"), after=["bad"])
    run = flow.enqueue()
    bad, nxt = run.jobs["bad"], run.jobs["next"]
    store = stores()
    finish(store, store.claim(Q, 5, "w", 30), dead={bad})
    assert retry_now([bad, nxt]).changed == [bad, nxt]
    assert (status(bad), status(nxt), counters(nxt)) == ("pending", "waiting", (1, 0))
    finish(store, store.claim(Q, 5, "w", 30), dead={bad})
    assert (status(nxt), counters(nxt)) == ("cancelled", (0, 1))
    assert retry_now([bad]).changed == [bad]
    assert (status(nxt), counters(nxt)) == ("waiting", (1, 0))
    finish(store, store.claim(Q, 5, "w", 30))
    assert status(nxt) == "pending"
