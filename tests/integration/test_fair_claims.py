"""Fair queues: each claim takes jobs round-robin across the keys with due work."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from typing import Any

import pytest
from django.db import transaction

from django_pgqueue import JobSpec, enqueue, enqueue_many
from django_pgqueue.store.rows import ClaimRequest
from tests.conftest import sql

pytestmark = pytest.mark.django_db(transaction=True)

HANG_GUARD = 120  # seconds a test waits for its condition before calling it hung


@pytest.fixture
def fair(settings: Any) -> Any:
    """Declare the queues `fq` (weight 3 for key "heavy") and `fq2` fair."""
    settings.PGQUEUE = {
        **getattr(settings, "PGQUEUE", {}),
        "FAIR_QUEUES": {"fq": {"weights": {"heavy": 3}}, "fq2": {}},
    }
    return settings


def fair_store(stores: Any) -> Any:
    return stores("fair", fair_queues={"fq": {"heavy": 3}, "fq2": {}})


def claim(store: Any, queue: str, limit: int) -> list[str]:
    """The fair keys of the jobs one claim took, in job id order."""
    _, rows = store.claims.claim(None, ClaimRequest(queue, limit, "fair-worker", 60.0))
    ids = sorted(row.job_id for row in rows)
    keys = dict(sql("SELECT job_id, fair_key FROM queue_job_state WHERE job_id = ANY(%s)", [ids]))
    return [keys[job_id] for job_id in ids]


def insert_jobs(
    queue: str,
    count: int,
    *,
    backlog: int = 0,
    keys: int = 1_000_000,
    priorities: int = 1,
    due_in: str = "-1 s",
) -> None:
    """Write `count` pending jobs of `queue` in one statement: the first `backlog` of key
    "a", the others of keys "t" + their number modulo `keys` (6 digits), priorities 0 to
    `priorities` - 1 in turn, due `due_in` from now."""
    sql(
        """
        WITH ids AS MATERIALIZED (
            SELECT nextval(pg_get_serial_sequence('queue_jobs', 'id')) AS id, n
            FROM generate_series(1, %(count)s) AS n
        ), jobs AS (
            INSERT INTO queue_jobs (id, queue, type, payload, created_at)
            SELECT id, %(queue)s, 'qa.noop', '{}', now() FROM ids
        )
        INSERT INTO queue_job_state (
            job_id, queue, status, priority, run_at, attempts, max_attempts, lease_version,
            fair_key, updated_at
        )
        SELECT id, %(queue)s, 'pending', n %% %(priorities)s, now() + %(due_in)s::interval,
               0, 5, 0,
               CASE WHEN n <= %(backlog)s THEN 'a'
                    ELSE 't' || lpad((n %% %(keys)s)::text, 6, '0') END,
               now()
        FROM ids
        """,
        {
            "queue": queue,
            "count": count,
            "backlog": backlog,
            "keys": keys,
            "priorities": priorities,
            "due_in": due_in,
        },
    )


def fair_claim_plan(store: Any, params: dict[str, Any], explain: str) -> list[dict]:
    """The nodes of the fair claim's plan, `EXPLAIN (explain)`, rolled back."""
    from django_pgqueue.sql import QUERIES

    with store.holding("plan") as conn, conn.transaction(force_rollback=True):
        conn.execute(QUERIES["fair_claim_plan"])
        (plan,) = conn.execute(
            f"EXPLAIN ({explain}, FORMAT JSON) " + QUERIES["job_claim_fair"], params
        ).fetchone()

    def nodes(node: dict) -> Any:
        yield node
        for child in node.get("Plans", []):
            yield from nodes(child)

    return list(nodes(plan[0]["Plan"]))


def test_a_fair_queue_gives_every_job_a_key(fair):
    keyed = enqueue("qa.noop", queue="fq2", fairness_key="acme")
    plain = enqueue("qa.noop", queue="fq2")
    many = enqueue_many([("qa.noop", 1), JobSpec("qa.noop", fairness_key="b")], queue="fq2")
    elsewhere = enqueue("qa.noop", queue="not-fair")
    keys = dict(sql("SELECT job_id, fair_key FROM queue_job_state"))
    assert keys[keyed.id] == "acme"
    assert keys[plain.id] == ""
    assert [keys[job.id] for job in many] == ["", "b"]
    assert keys[elsewhere.id] is None


def test_a_claim_takes_one_job_of_each_key_before_a_second_of_any(fair, stores):
    enqueue_many([JobSpec("qa.noop", fairness_key="big") for _ in range(50)], queue="fq2")
    for tenant in "bcde":
        enqueue("qa.noop", queue="fq2", fairness_key=tenant)
    store = fair_store(stores)
    assert sorted(claim(store, "fq2", 5)) == ["b", "big", "c", "d", "e"]
    # Only the big key is left: a claim takes its jobs turn after turn.
    assert claim(store, "fq2", 4) == ["big"] * 4


def test_a_claim_opens_its_attempts_in_turn_order(fair, stores):
    # Key "b"'s job is the older (the lower id), key "a"'s comes first in the walk.
    b = enqueue("qa.noop", queue="fq2", fairness_key="b")
    a = enqueue("qa.noop", queue="fq2", fairness_key="a")
    _, rows = fair_store(stores).claims.claim(None, ClaimRequest("fq2", 2, "w", 60.0))
    assert [row.job_id for row in rows] == [a.id, b.id]
    attempts = sql("SELECT job_id FROM queue_attempts ORDER BY id")
    assert attempts == [(a.id,), (b.id,)]


def test_the_next_claim_starts_after_the_key_served_last(fair, stores):
    for tenant in "abc":
        enqueue_many([JobSpec("qa.noop", fairness_key=tenant) for _ in range(5)], queue="fq2")
    store = fair_store(stores)
    assert [claim(store, "fq2", 1)[0] for _ in range(7)] == list("abcabca")


def test_the_walk_comes_round_to_the_key_of_jobs_without_a_fairness_key(fair, stores):
    # Their key is "", before every other: each round of the walk starts from it, also
    # when the worker resumes it (the claims of one worker, within FAIR_RESUME_TTL).
    enqueue_many([("qa.noop", n) for n in range(3)], queue="fq2")
    enqueue_many([JobSpec("qa.noop", fairness_key="b") for _ in range(3)], queue="fq2")
    store = fair_store(stores)
    assert [claim(store, "fq2", 1)[0] for _ in range(6)] == ["", "b"] * 3


def executions(store: Any, marker: str) -> int:
    """How many times the store's connection ran its prepared statement whose text
    holds `marker` (on the generic plan, as the fair claims run)."""
    rows = store.raw.execute(
        "SELECT generic_plans + custom_plans FROM pg_prepared_statements "
        "WHERE strpos(statement, %s) > 0",
        [marker],
    ).fetchall()
    return sum(count for (count,) in rows)


WHOLE = "WITH RECURSIVE steps"  # job_claim_fair's text
ALONE = "WITH resumed_at AS MATERIALIZED"  # job_claim_fair_alone's


def test_a_key_alone_is_claimed_without_the_walk_until_another_key_comes(fair, stores):
    # One tenant's backlog: after a claim whose walk found its key alone, the worker's
    # claims take its jobs by the key's own statement, without the walk.
    enqueue_many([JobSpec("qa.noop", fairness_key="a") for _ in range(20)], queue="fq2")
    store = fair_store(stores)
    assert [claim(store, "fq2", 4) for _ in range(3)] == [["a"] * 4] * 3
    assert (executions(store, WHOLE), executions(store, ALONE)) == (1, 2)
    # A new tenant: the key's statement sees it and takes nothing, and the whole claim
    # gives the new key its turn in the same call.
    enqueue("qa.noop", queue="fq2", fairness_key="b")
    assert "b" in claim(store, "fq2", 4)
    assert (executions(store, WHOLE), executions(store, ALONE)) == (2, 3)
    # "b" has no job left: "a" is alone again.
    assert claim(store, "fq2", 2) == ["a", "a"]
    assert claim(store, "fq2", 2) == ["a", "a"]
    assert (executions(store, WHOLE), executions(store, ALONE)) == (3, 4)


def test_jobs_without_a_key_are_claimed_once_the_key_alone_has_none_due(fair, stores):
    unkeyed = enqueue("qa.noop", queue="fq3")  # written before the queue was fair
    enqueue_many([JobSpec("qa.noop", fairness_key="a") for _ in range(8)], queue="fq3")
    store = stores("fair", fair_queues={"fq3": {}})
    assert [claim(store, "fq3", 4) for _ in range(2)] == [["a"] * 4] * 2
    # The key's statement finds nothing due; the whole claim then looks for jobs
    # without a key, in the same call.
    _, rows = store.claims.claim(None, ClaimRequest("fq3", 4, "w", 60.0))
    assert [row.job_id for row in rows] == [unkeyed.id]


def test_priority_orders_the_jobs_within_a_key(fair, stores):
    low = enqueue("qa.noop", queue="fq2", fairness_key="a", priority=-5)
    high = enqueue("qa.noop", queue="fq2", fairness_key="a", priority=5)
    store = fair_store(stores)
    _, rows = store.claims.claim(None, ClaimRequest("fq2", 1, "w", 60.0))
    assert [row.job_id for row in rows] == [high.id]
    _, rows = store.claims.claim(None, ClaimRequest("fq2", 1, "w", 60.0))
    assert [row.job_id for row in rows] == [low.id]


def test_a_weighted_key_takes_its_weight_each_turn(fair, stores):
    for tenant in ("heavy", "light"):
        enqueue_many([JobSpec("qa.noop", fairness_key=tenant) for _ in range(40)], queue="fq")
    store = fair_store(stores)
    taken: Counter[str] = Counter()
    for _ in range(10):
        taken.update(claim(store, "fq", 4))
    assert taken == {"heavy": 30, "light": 10}


def test_jobs_without_a_key_run_once_no_key_has_a_job_due(fair, stores):
    # Written before the queue was fair (no key), beside keyed jobs.
    unkeyed = enqueue("qa.noop", queue="fq3")
    keyed = enqueue("qa.noop", queue="fq3", fairness_key="a")
    store = stores("fair", fair_queues={"fq3": {}})
    _, rows = store.claims.claim(None, ClaimRequest("fq3", 5, "w", 60.0))
    assert [row.job_id for row in rows] == [keyed.id]
    _, rows = store.claims.claim(None, ClaimRequest("fq3", 5, "w", 60.0))
    assert [row.job_id for row in rows] == [unkeyed.id]


def test_jobs_not_due_are_not_taken(fair, stores):
    enqueue("qa.noop", queue="fq2", fairness_key="later", delay=3600)
    now = enqueue("qa.noop", queue="fq2", fairness_key="now")
    _, rows = fair_store(stores).claims.claim(None, ClaimRequest("fq2", 5, "w", 60.0))
    assert [row.job_id for row in rows] == [now.id]


def test_a_due_key_behind_many_keys_with_only_delayed_jobs_is_claimed(fair, stores):
    # More keys with nothing due than one claim walks (4 x 10 + 8), ahead of a due key.
    delayed = [JobSpec("qa.noop", fairness_key=f"d{n:03}", delay=3600) for n in range(60)]
    enqueue_many(delayed, queue="fq2")
    due = enqueue("qa.noop", queue="fq2", fairness_key="z")
    store = fair_store(stores)
    taken = [claim(store, "fq2", 10) for _ in range(3)]
    assert ["z"] in taken, taken
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [due.id]) == [("running",)]


@pytest.mark.django_db(transaction=True)
def test_late_tenants_start_within_two_claim_cycles_behind_a_big_backlog(fair, run_worker):
    """Tenant A's backlog, then 25 tenants of one job: two workers start each of the 25
    before A starts more than two jobs a worker (two turns of the round-robin)."""
    backlog = 400
    enqueue_many(
        [JobSpec("qa.sleep", {"seconds": 0.01}, fairness_key="a") for _ in range(backlog)],
        queue="fq2",
    )
    workers = [run_worker(["fq2"], concurrency=4) for _ in range(2)]
    deadline = time.monotonic() + HANG_GUARD
    while sql("SELECT count(*) FROM queue_attempts")[0][0] < 20:  # A is draining
        assert time.monotonic() < deadline, "the workers never started A's jobs"
        time.sleep(0.02)
    # The late jobs are enqueued while no claim runs: the table lock waits for the
    # claims in flight and holds new ones back until they are committed, so every
    # attempt after the mark is of a claim that saw them due.
    with transaction.atomic():
        sql("LOCK TABLE queue_job_state IN EXCLUSIVE MODE")
        (mark,) = sql("SELECT coalesce(max(id), 0) FROM queue_attempts")[0]
        late = enqueue_many(
            [JobSpec("qa.sleep", {"seconds": 0.01}, fairness_key=f"t{n:02}") for n in range(25)],
            queue="fq2",
        )
    late_ids = [job.id for job in late]
    while sql("SELECT count(*) FROM queue_attempts WHERE job_id = ANY(%s)", [late_ids])[0][0] < 25:
        assert time.monotonic() < deadline, "a late tenant's job never started"
        time.sleep(0.02)
    for worker in workers:
        worker.stop()
    # A's starts between the late jobs' enqueue and each late job's start.
    a_starts = sql(
        "SELECT late.job_id, count(a.id) FROM queue_attempts AS late "
        "JOIN queue_attempts AS a ON a.id > %s AND a.id < late.id "
        "AND a.job_id <> ALL(%s) "
        "WHERE late.job_id = ANY(%s) GROUP BY late.job_id",
        [mark, late_ids, late_ids],
    )
    worst = max([count for _, count in a_starts], default=0)
    # Two cycles: a turn for A per worker per cycle (a claim opens its attempts in turn
    # order, so A's jobs after the late job's turn in its own claim are not counted).
    assert worst <= 2 * 2, a_starts


def test_the_fair_claim_walks_indexes_only_at_many_keys(stores):
    """Every scan of the fair claim is an index scan, beside 2,000 keys and a backlog;
    the only sorts are of its candidates (the contract's plan, docs/howto/many-tenants.md)."""
    insert_jobs("fq-plan", 4000, backlog=2000)
    sql("ANALYZE queue_job_state")

    params = {
        "queue": "fq-plan",
        "limit": 10,
        "worker_id": "w",
        "lease": 60.0,
        "after": "t003000",
        "keys": 48,
        "weights": "{}",
        "resume": "{}",
    }
    every = fair_claim_plan(stores("fair-plan"), params, "COSTS ON")
    scans = {(n["Node Type"], n.get("Index Name")) for n in every if "Scan" in n["Node Type"]}
    assert not [n for n in every if n["Node Type"] == "Seq Scan"], scans
    assert ("Index Only Scan", "queue_job_state_fair_idx") in scans
    assert ("Index Scan", "queue_job_state_fair_idx") in scans
    sorted_over = {tuple(n["Sort Key"]) for n in every if n["Node Type"] == "Sort"}
    # Sorts of the candidates, of the jobs taken (by key: their resume positions) and of
    # the unkeyed walk's few rows, never of the queue's keys.
    assert all(
        "fair_key" not in key or key.startswith("taken") for keys in sorted_over for key in keys
    ), sorted_over


def test_the_unkeyed_walk_reads_no_job_scheduled_later(stores):
    """With every key's jobs scheduled later, the fair claim's walk for unkeyed jobs stops
    at the first job not due of each priority: it reads a few pages of the claim index,
    not the delayed backlog (its whole index was read at every claim, 7 ms at 100,000)."""
    insert_jobs("fq-later", 20000, keys=100, priorities=2, due_in="1 hour")
    unkeyed = enqueue("qa.noop", queue="fq-later")  # the queue is not fair here: no key
    sql("ANALYZE queue_job_state")

    params = {
        "queue": "fq-later",
        "limit": 10,
        "worker_id": "w",
        "lease": 60.0,
        "after": None,
        "keys": 48,
        "weights": "{}",
        "resume": "{}",
    }
    store = stores("fair-later", fair_queues={"fq-later": {}})
    # The unkeyed walk's reads of the claim index: not the keyed walk's lookups of each
    # key (their conditions name the walked key), which PostgreSQL 18 may also plan on
    # the claim index, as a skip scan.
    claim_index = [
        n
        for n in fair_claim_plan(store, params, "ANALYZE, BUFFERS")
        if n.get("Index Name") == "queue_job_state_claim_idx"
        and "walk" not in f"{n.get('Index Cond', '')} {n.get('Filter', '')}"
    ]
    read = sum(n["Shared Hit Blocks"] + n["Shared Read Blocks"] for n in claim_index)
    # A probe per priority (two here, and the one that finds no third) and a walk that
    # stops at once for each, each a root-to-leaf descent of a few pages (18 pages on
    # PostgreSQL 15, 20 on 18, which plans the probes as a skip scan): far from the
    # ~100 leaf pages of the 20,000 delayed jobs, which the walk read before (171).
    assert read <= 30, claim_index
    _, rows = store.claims.claim(None, ClaimRequest("fq-later", 10, "w", 60.0))
    assert [row.job_id for row in rows] == [unkeyed.id]


def test_a_claim_resumes_a_key_past_the_entries_of_its_claimed_jobs(stores):
    """The entries of a key's claimed jobs stay in the fair index, dead, until VACUUM: a
    claim given where the last one stopped in the key reads past them (the walk and the
    key's jobs), where one from the key's front steps over them all."""
    insert_jobs("fq-resume", 20000, backlog=20000)
    sql("ANALYZE queue_job_state")
    # Claimed and finished since the last VACUUM: 15,000 dead entries at the key's front.
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() "
        "WHERE job_id IN (SELECT job_id FROM queue_job_state ORDER BY job_id LIMIT 15000)"
    )
    from django_pgqueue.sql import QUERIES

    params = {
        "queue": "fq-resume",
        "limit": 10,
        "worker_id": "w",
        "lease": 60.0,
        "after": None,
        "keys": 48,
        "weights": "{}",
        "resume": "{}",
    }
    store = stores("fair-resume")

    def fair_index_reads() -> int:
        return sum(
            n["Shared Hit Blocks"] + n["Shared Read Blocks"]
            for n in fair_claim_plan(store, params, "ANALYZE, BUFFERS")
            if n.get("Index Name") == "queue_job_state_fair_idx"
        )

    from_front = fair_index_reads()
    with store.holding("claim") as conn, conn.transaction():
        conn.execute(QUERIES["fair_claim_plan"])
        rows = conn.execute(QUERIES["job_claim_fair"], params).fetchall()
    assert len(rows) == 10
    params["after"], _, resume = rows[0][-3:]
    params["resume"] = json.dumps(resume)
    assert list(resume) == ["a"]
    resumed = fair_index_reads()
    # ~80 pages of dead entries, read twice from the front; a few descents resumed.
    assert from_front >= 100, from_front
    assert resumed <= 30, resumed


def test_late_tenants_are_claimed_within_a_counted_number_of_claims(fair, stores):
    """Tenant A's backlog, then 25 tenants of one job: two workers' claims, of 1 to 4 jobs
    as their free capacity would ask, take all 25 within a bounded number of claims,
    A taking at most a turn a worker a round (two cycles), long before its backlog drains.
    Counted claims, no clock."""
    enqueue_many([JobSpec("qa.noop", fairness_key="a") for _ in range(2000)], queue="fq2")
    workers = [fair_store(stores), fair_store(stores)]
    sizes = random.Random(43)
    for _ in range(5):  # A is draining
        for worker in workers:
            claim(worker, "fq2", sizes.randint(1, 4))
    late = enqueue_many(
        [JobSpec("qa.noop", fairness_key=f"t{n:02}") for n in range(25)], queue="fq2"
    )
    late_ids = [job.id for job in late]
    claims, a_taken = 0, 0
    while sql(
        "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) AND status = 'pending'",
        [late_ids],
    )[0][0]:
        claims += 1
        assert claims <= 100, "the late tenants' jobs are not being claimed"
        a_taken += claim(workers[claims % 2], "fq2", sizes.randint(1, 4)).count("a")
    # 25 jobs, at least one a claim (A's turns aside): at most 25 + 4 claims.
    assert claims <= 25 + 4, claims
    assert a_taken <= 2 * 2, a_taken
    (a_left,) = sql(
        "SELECT count(*) FROM queue_job_state WHERE fair_key = 'a' AND status = 'pending'"
    )[0]
    assert a_left > 1900, a_left
