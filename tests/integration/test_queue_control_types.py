"""Per-type limits within a queue (issue 14): a type's key limit and its own rate window.

Store level, real connections; plus the settings, the Python API and the command.
"""

from __future__ import annotations

import datetime as dt
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue import enqueue, enqueue_many, set_key_limit, set_queue_rate
from django_pgqueue.control import api
from django_pgqueue.control.store import sync_settings
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.limits import QueueLimits, TypeLimits, parse_queues
from django_pgqueue.validators import QUEUE_NAME_RE
from tests.conftest import sql
from tests.integration.test_queue_control import controlled_store

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def store_class() -> object:
    return controlled_store


def types_of(rows) -> list[str]:
    return [sql("SELECT type FROM queue_jobs WHERE id = %s", [row.job_id])[0][0] for row in rows]


def test_a_type_key_limit_replaces_the_queues_for_its_jobs(stores):
    set_key_limit("kt", 2, type="qa.echo")  # the queue keeps its key limit of 1
    for _ in range(3):
        enqueue("qa.echo", queue="kt", concurrency_key="a")
    for _ in range(2):
        enqueue("qa.noop", queue="kt", concurrency_key="b")
    store = stores()
    rows = store.claim("kt", 10, "w", 30)
    assert sorted(types_of(rows)) == ["qa.echo", "qa.echo", "qa.noop"]
    assert store.claim("kt", 10, "w", 30) == []  # both keys at their limits
    set_key_limit("kt", None, type="qa.echo")  # back to the queue's: 1
    assert api.queue_controls()[0]["types"] == []
    store.complete([(r.job_id, r.lease_version, r.attempt_id, None) for r in rows])
    assert sorted(types_of(store.claim("kt", 10, "w", 30))) == ["qa.echo", "qa.noop"]


def test_a_type_rate_window_is_exact_and_other_types_run_past_it(stores):
    set_queue_rate("rt", "5/0.5s", type="qa.echo")
    enqueue_many([(kind, {}) for _ in range(20) for kind in ("qa.echo", "qa.noop")], queue="rt")
    store = stores()
    first = store.claim("rt", 30, "w", 30)
    assert sorted(types_of(first)).count("qa.echo") == 5
    assert sorted(types_of(first)).count("qa.noop") == 20
    second = store.claim("rt", 30, "w", 30)
    wait = store.claims.retry_short("rt", 10.0)
    # Read after both: if the window was still open then, both ran inside it.
    window_age = sql(
        "SELECT extract(epoch FROM clock_timestamp() - min(a.started_at)) FROM queue_attempts a "
        "JOIN queue_jobs j ON j.id = a.job_id WHERE j.type = 'qa.echo'"
    )[0][0]
    if window_age < 0.5:
        assert second == []  # the type's window is full
        assert 0 < wait <= 0.5  # retried when the window admits the next start
    else:  # a stalled machine let the window pass: only the type's next starts came
        assert set(types_of(second)) <= {"qa.echo"}
        assert len(second) <= 5

    def echo_starts() -> int:
        return sql(
            "SELECT count(*) FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
            "WHERE j.type = 'qa.echo'"
        )[0][0]

    deadline = time.monotonic() + 120  # a hang guard: the 20 starts take 2 s at 5 per 0.5 s
    while echo_starts() < 20:
        assert time.monotonic() < deadline, f"{echo_starts()} starts in 120 s"
        if not store.claim("rt", 30, "w", 30):
            time.sleep(max(store.claims.retry_short("rt", 10.0), 0.001))
    starts = [
        row[0]
        for row in sql(
            "SELECT a.started_at FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
            "WHERE j.type = 'qa.echo' ORDER BY a.started_at"
        )
    ]
    window = dt.timedelta(seconds=0.5)
    assert len(starts) == 20
    assert max(sum(1 for t in starts if s <= t < s + window) for s in starts) == 5


def test_a_drained_rate_limited_queue_is_not_claimed_in_a_loop(stores):
    """A window whose starts have left it is not full: no 0 s recheck (a busy loop)."""
    set_queue_rate("calm", "2/0.2s")
    set_queue_rate("calm", "2/0.2s", type="qa.noop")
    enqueue_many([("qa.noop", {}) for _ in range(2)], queue="calm")
    store = stores()
    assert len(store.claim("calm", 10, "w", 30)) == 2
    time.sleep(0.3)
    assert store.claim("calm", 10, "w", 30) == []  # drained, windows empty again
    assert store.claims.retry_short("calm", 1.0) == 1.0


def test_a_window_full_at_the_claim_is_retried_at_once_when_it_has_room(stores):
    """The claim filled the window; if a start leaves it before the worker looks, the
    worker tries again at once (0 s), not a poll interval later (13d's dip)."""
    set_queue_rate("edge", "2/0.2s")
    set_queue_rate("edge", "2/0.2s", type="qa.noop")
    enqueue_many([("qa.noop", {}) for _ in range(6)], queue="edge")
    store = stores()
    assert len(store.claim("edge", 10, "w", 30)) == 2
    time.sleep(0.25)
    [(_, _, rate_wait, _)] = store.run("queue_control_state", {"queue": "edge"})
    assert rate_wait == 0.0
    assert len(store.claim("edge", 10, "w", 30)) == 2


def test_settings_write_types_and_run_time_edits_stand(stores):
    configured = {
        "sms": QueueLimits(
            types={"sms.bulk": TypeLimits(key_limit=2, rate_count=10, rate_period=1.0)}
        )
    }
    assert sync_settings("default", configured) == ["sms"]
    set_queue_rate("sms", "3/s", type="sms.bulk")
    assert sync_settings("default", configured) == []  # same settings: the edit stands
    [row] = api.queue_controls()
    assert row["types"] == [
        {"type": "sms.bulk", "key_limit": 2, "rate_count": 3, "rate_period": 1.0}
    ]
    changed = {"sms": QueueLimits(types={"sms.other": TypeLimits(key_limit=3)})}
    assert sync_settings("default", changed) == ["sms"]  # a new setting wins
    [row] = api.queue_controls()
    assert row["types"] == [
        {"type": "sms.other", "key_limit": 3, "rate_count": None, "rate_period": None}
    ]


@pytest.mark.parametrize(
    ("types", "message"),
    [
        (["sms.bulk"], r"\['types'\] must map job type names"),
        ({"bad type": {"rate": "1/s"}}, r"\['types'\] keys must be job type names"),
        ({"sms.bulk": {"limit": 3}}, r"\['sms.bulk'\] has unknown key\(s\) 'limit'"),
        ({"sms.bulk": {}}, r"\['sms.bulk'\] sets nothing"),
        ({"sms.bulk": {"rate": "fast"}}, r"\['sms.bulk'\]\['rate'\] must look like"),
        ({"sms.bulk": {"key_limit": 0}}, r"\['sms.bulk'\]\['key_limit'\]"),
        ({"sms.bulk": 5}, r"\['sms.bulk'\] must be a dict"),
    ],
)
def test_bad_type_settings_name_the_problem(types, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_queues({"sms": {"types": types}}, QUEUE_NAME_RE)


def test_the_command_sets_and_shows_type_limits():
    out = StringIO()
    call_command("queue_control", "rate", "sms", "10/s", "--type", "sms.bulk", stdout=out)
    assert out.getvalue() == "type sms.bulk: key_limit=queue's rate=10/1s\n"
    call_command("queue_control", "key-limit", "sms", "2", "--type", "sms.bulk", stdout=StringIO())
    out = StringIO()
    call_command("queue_control", "show", stdout=out)
    assert out.getvalue() == (
        "sms: active limit=- key_limit=1 rate=- running=0\n"
        "  type sms.bulk: key_limit=2 rate=10/1s\n"
    )
    with pytest.raises(CommandError, match="--type applies to key-limit and rate"):
        call_command("queue_control", "pause", "sms", "--type", "sms.bulk")
    with pytest.raises(CommandError, match="expected a job type name"):
        call_command("queue_control", "rate", "sms", "1/s", "--type", "bad type")


def test_the_admin_shows_a_queues_type_limits(superuser_client):
    set_queue_rate("sms", "10/s", type="sms.bulk")
    page = superuser_client.get("/admin/django_pgqueue/queuecontrol/sms/change/")
    assert page.status_code == 200
    assert "type sms.bulk: key_limit=queue&#x27;s rate=10/1s" in page.content.decode()


def test_two_workers_keep_a_type_rate_while_other_types_run(run_worker):
    set_queue_rate("mixed", "4/0.5s", type="qa.echo")
    enqueue_many([(kind, {}) for _ in range(12) for kind in ("qa.echo", "qa.noop")], queue="mixed")
    workers = [run_worker(["mixed"], concurrency=4, poll_interval=0.2) for _ in range(2)]
    deadline = time.monotonic() + 120  # a hang guard, not a bound
    while sql("SELECT count(*) FROM queue_job_state WHERE status = 'completed'")[0][0] < 24:
        assert time.monotonic() < deadline, "not drained in time"
        time.sleep(0.05)
    for worker in workers:
        worker.stop()
    starts = {
        kind: [
            row[0]
            for row in sql(
                "SELECT a.started_at FROM queue_attempts a JOIN queue_jobs j ON j.id = a.job_id "
                "WHERE j.type = %s ORDER BY a.started_at",
                [kind],
            )
        ]
        for kind in ("qa.echo", "qa.noop")
    }
    window = dt.timedelta(seconds=0.5)
    echo = starts["qa.echo"]
    assert max(sum(1 for t in echo if s <= t < s + window) for s in echo) == 4
    # 12 at 4 per 0.5 s take at least 1 s; the other type did not wait for them.
    assert (echo[-1] - echo[0]).total_seconds() >= 1.0
    assert max(starts["qa.noop"]) < echo[-1]
