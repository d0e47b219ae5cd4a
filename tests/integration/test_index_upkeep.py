"""The hot indexes stay small: a bloated one is rebuilt concurrently, a healthy one left.

VACUUM frees an index's dead entries but keeps its pages: after a backlog drains, the
claim index keeps the backlog's size. `keep_indexes_small` rebuilds it with REINDEX
CONCURRENTLY, which the queue's inserts, claims and completions never wait for.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from django_pgqueue import enqueue, enqueue_many
from django_pgqueue.index_upkeep import FLOOR_PAGES, keep_indexes_small
from django_pgqueue.store import indexes
from django_pgqueue.store.session import Session
from tests.conftest import database_url, sql

pytestmark = pytest.mark.django_db(transaction=True)

CLAIM_IDX = "queue_job_state_claim_idx"


def pages(name: str = CLAIM_IDX) -> int:
    return sql("SELECT pg_relation_size(%s::regclass) / 8192", [name])[0][0]


def definition(name: str = CLAIM_IDX) -> str:
    return sql("SELECT pg_get_indexdef(%s::regclass)", [name])[0][0]


def backlog(jobs: int, *, keep: int) -> None:
    """`jobs` pending jobs of which all but `keep` then finish, and a VACUUM: a drain."""
    for start in range(0, jobs, 20_000):
        enqueue_many([("qa.noop", None)] * min(20_000, jobs - start), queue="drained")
    sql(
        "UPDATE queue_job_state SET status = 'completed', finished_at = now() "
        "WHERE status = 'pending' AND job_id > (SELECT min(job_id) + %s FROM queue_job_state)",
        [keep],
    )
    sql("VACUUM queue_job_state")


@pytest.fixture
def session():
    opened = Session("default", "pgqueue upkeep test", prepared=False)
    yield opened
    opened.close()


def test_a_drained_claim_index_is_rebuilt_to_its_live_size(session):
    backlog(60_000, keep=500)
    before, shape = pages(), definition()
    assert before > FLOOR_PAGES  # the backlog's size, kept after the drain

    done = keep_indexes_small(session)

    assert [(r.name, r.pages_before, r.live_entries) for r in done] == [(CLAIM_IDX, before, 501)]
    assert pages() == done[0].pages_after < before / 10
    assert definition() == shape  # the same index, under the same name
    assert sql("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [CLAIM_IDX]) == [
        (True,)
    ]
    assert keep_indexes_small(session) == []  # small now: nothing more to do


def test_a_large_index_full_of_live_entries_is_left_alone(session):
    backlog(60_000, keep=60_000)
    before = pages()
    assert before > FLOOR_PAGES
    assert keep_indexes_small(session) == []
    assert pages() == before


def test_a_copy_left_by_an_interrupted_rebuild_is_dropped(session):
    enqueue("qa.noop", queue="left")
    enqueue("qa.noop", queue="left")
    # A concurrent build that fails leaves its index behind, invalid, as an interrupted
    # REINDEX CONCURRENTLY leaves <name>_ccnew.
    with (
        psycopg.connect(database_url(), autocommit=True) as conn,
        pytest.raises(psycopg.errors.UniqueViolation),
    ):
        conn.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY queue_job_state_claim_idx_ccnew "
            "ON queue_job_state (queue) WHERE status = 'pending'"
        )
    assert sql(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = "
        "'queue_job_state_claim_idx_ccnew'::regclass"
    ) == [(False,)]

    done = keep_indexes_small(session)

    assert [(r.name, r.dropped) for r in done] == [("queue_job_state_claim_idx_ccnew", True)]
    assert sql("SELECT to_regclass('queue_job_state_claim_idx_ccnew')") == [(None,)]
    assert sql("SELECT to_regclass(%s)", [CLAIM_IDX]) != [(None,)]


def test_only_hot_indexes_and_their_copies_can_be_rebuilt_or_dropped(session):
    with pytest.raises(ValueError, match="queue_jobs_pkey"):
        indexes.rebuild(session, "queue_jobs_pkey")
    with pytest.raises(ValueError, match="not a leftover copy"):
        indexes.drop_leftover(session, CLAIM_IDX)
    with pytest.raises(ValueError, match="is not a hot index"):
        indexes.rebuild(session, "queue_job_state_claim_idx_ccnew")


def test_the_queue_keeps_working_while_an_index_is_rebuilt(session, stores):
    """Enqueue, claim, complete, fail and sweep run while a rebuild is in progress.

    An open transaction that wrote the table holds the rebuild in its first phase (it
    waits for older writers), so each statement below provably ran during it; each has
    a statement timeout as a hang guard, far above what it needs.
    """
    backlog(2_000, keep=2_000)
    held = enqueue("qa.noop", queue="held").id
    holder = psycopg.connect(database_url())
    holder.execute("UPDATE queue_job_state SET priority = priority WHERE job_id = %s", [held])
    failures: list[BaseException] = []

    def rebuild() -> None:
        try:
            indexes.rebuild(session, CLAIM_IDX)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=rebuild, daemon=True)
    thread.start()
    try:
        wait_for_phase("waiting for writers before build")
        other = Session("default", "pgqueue upkeep other", prepared=False)
        try:
            assert keep_indexes_small(other) == []  # one rebuild at a time
        finally:
            other.close()

        store = stores("during rebuild")
        store.raw.execute("SET statement_timeout = '60s'")
        ids = [enqueue("qa.noop", queue="during").id for _ in range(3)]
        claimed = store.claim("during", 3, "w", 30)
        assert sorted(row.job_id for row in claimed) == ids
        first, second, third = sorted(claimed, key=lambda row: row.job_id)
        assert store.complete([(first.job_id, first.lease_version, first.attempt_id, None)]) == {
            first.job_id
        }
        sql(
            "UPDATE queue_job_state SET locked_until = now() - interval '1 second' "
            "WHERE job_id = %s",
            [second.job_id],
        )
        assert [row[0] for row in store.sweep()] == [second.job_id]
        assert store.complete([(third.job_id, third.lease_version, third.attempt_id, None)]) == {
            third.job_id
        }
        assert progress() == "waiting for writers before build"  # still held back
    finally:
        holder.rollback()
        holder.close()
        thread.join(120)
    assert not thread.is_alive()
    assert not failures
    assert sql("SELECT indisvalid FROM pg_index WHERE indexrelid = %s::regclass", [CLAIM_IDX]) == [
        (True,)
    ]
    assert sql("SELECT count(*) FROM pg_index WHERE NOT indisvalid") == [(0,)]


def progress() -> str | None:
    rows = sql(
        "SELECT phase FROM pg_stat_progress_create_index WHERE relid = 'queue_job_state'::regclass"
    )
    return rows[0][0] if rows else None


def wait_for_phase(phase: str, timeout: float = 60.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if progress() == phase:
            return
        done.wait(0.05)
    raise AssertionError(f"the rebuild never reached {phase!r}; last {progress()!r}")


def test_a_running_worker_rebuilds_a_bloated_index_by_itself(settings, run_worker):
    settings.PGQUEUE = {**settings.PGQUEUE, "INDEX_UPKEEP_INTERVAL": 0.2}
    backlog(60_000, keep=100)
    before = pages()
    worker = run_worker(["elsewhere"])
    try:
        for _ in range(1200):  # a hang guard of 60 s; the first look comes within 0.3 s
            if pages() < before / 10:
                break
            threading.Event().wait(0.05)
        assert pages() < before / 10
    finally:
        worker.stop()
