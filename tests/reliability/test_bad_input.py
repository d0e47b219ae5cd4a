"""Scenario 9: bad input is refused before anything is written, or fails the job, never the worker.

Enqueue-time cases go through enqueue(), enqueue_many() (the bad item after a good one,
so a half-written batch would show) and, where the input can be expressed there, the
django.tasks backend. Each runs inside the caller's transaction.atomic(): the error is
caught, 0 rows may have been written to the three queue tables, and a following enqueue
in the same transaction must commit. Run-time cases run in a real run_queue_worker
process: the job ends dead (or retried, then dead) with its error recorded, and the
same worker then completes a healthy job.
"""

from __future__ import annotations

import datetime as dt
import math
import signal
from collections.abc import Callable
from decimal import Decimal
from functools import partial
from typing import Any

import pytest
from django.db import transaction
from qa import tasks as qa_tasks
from qa.models import TaskCall

from django_pgqueue import EnqueueError, JobSpec, PayloadError, enqueue, enqueue_many
from django_pgqueue.conf import get_settings
from django_pgqueue.tasks.api import InvalidTask
from tests.conftest import sql
from tests.reliability.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

TABLES = ("queue_jobs", "queue_job_state", "queue_attempts")
SQL_QUEUE = "x'; DROP TABLE queue_jobs; --"


def rows() -> int:
    """Rows in the three queue tables, as the caller's connection sees them."""
    return sum(sql(f"SELECT count(*) FROM {table}")[0][0] for table in TABLES)


def too_large() -> str:
    limit = get_settings().MAX_PAYLOAD_BYTES
    assert limit is not None
    return "x" * (limit + 1)


# (input as shown in the doc, enqueue() arguments, expected error, text the message
# must contain, the same input through the django.tasks backend or None; or that call
# and the text when Django's own check answers first, in its own words)
Backend = Callable[[], Any] | tuple[Callable[[], Any], str] | None
Case = tuple[str, dict[str, Any], type[Exception], str, Backend]


def cases() -> list[Case]:
    naive = dt.datetime(2030, 1, 1, 12, 0)
    aware = dt.datetime(2030, 1, 1, 12, 0, tzinfo=dt.UTC)
    echo = qa_tasks.echo
    circular: dict[str, Any] = {}
    circular["self"] = circular
    return [
        (
            "payload {'tags': {1, 2}} (a set)",
            {"payload": {"tags": {1, 2}}},
            PayloadError,
            "set",
            lambda: echo.enqueue(tags={1, 2}),
        ),
        (
            "payload {'blob': b'...'} (bytes)",
            {"payload": {"blob": b"\x00\xff"}},
            PayloadError,
            "bytes",
            lambda: echo.enqueue(blob=b"\x00\xff"),
        ),
        (
            "payload {'amount': Decimal('9.99')}",
            {"payload": {"amount": Decimal("9.99")}},
            PayloadError,
            "Decimal",
            lambda: echo.enqueue(amount=Decimal("9.99")),
        ),
        (
            "payload {'call': TaskCall(...)} (a model instance)",
            {"payload": {"call": TaskCall(label="x")}},
            PayloadError,
            "model instance",
            lambda: echo.enqueue(call=TaskCall(label="x")),
        ),
        (
            "payload {'ratio': nan}",
            {"payload": {"ratio": math.nan}},
            PayloadError,
            "NaN",
            lambda: echo.enqueue(ratio=math.nan),
        ),
        (
            "payload [inf]",
            {"payload": [math.inf]},
            PayloadError,
            "Infinity",
            lambda: echo.enqueue(math.inf),
        ),
        (
            "payload {'note': 'a\\x00b'} (NUL in a value)",
            {"payload": {"note": "a\x00b"}},
            PayloadError,
            "NUL",
            lambda: echo.enqueue(note="a\x00b"),
        ),
        (
            "payload {'a\\x00b': 1} (NUL in a key)",
            {"payload": {"a\x00b": 1}},
            PayloadError,
            "NUL",
            lambda: echo.enqueue(**{"a\x00b": 1}),
        ),
        (
            "payload {'s': '\\udc80'} (lone surrogate)",
            {"payload": {"s": "\udc80"}},
            PayloadError,
            "surrogate",
            lambda: echo.enqueue(s="\udc80"),
        ),
        (
            "payload {1: 'a'} (non-string key)",
            {"payload": {1: "a"}},
            PayloadError,
            "keys must be strings",
            lambda: echo.enqueue({1: "a"}),
        ),
        (
            "payload {'self': <itself>} (a circular reference)",
            {"payload": circular},
            PayloadError,
            "circular reference",
            lambda: echo.enqueue(circular),
        ),
        (
            "payload 10**5000 (an int of 5,001 digits)",
            {"payload": 10**5000},
            PayloadError,
            "4300 digits",
            lambda: echo.enqueue(10**5000),
        ),
        (
            "payload of MAX_PAYLOAD_BYTES + 1 bytes",
            {"payload": too_large()},
            PayloadError,
            "over the limit",
            lambda: echo.enqueue(too_large()),
        ),
        (
            "queue ''",
            {"queue": ""},
            EnqueueError,
            "not a valid queue name",
            (lambda: echo.using(queue_name="").enqueue(), "is not valid for backend"),
        ),
        (
            "queue of 64 characters",
            {"queue": "q" * 64},
            EnqueueError,
            "not a valid queue name",
            (lambda: echo.using(queue_name="q" * 64).enqueue(), "is not valid for backend"),
        ),
        (
            f"queue {SQL_QUEUE!r}",
            {"queue": SQL_QUEUE},
            EnqueueError,
            "not a valid queue name",
            (lambda: echo.using(queue_name=SQL_QUEUE).enqueue(), "is not valid for backend"),
        ),
        (
            'type "qa.noop\'; DROP TABLE queue_jobs; --"',
            {"type": "qa.noop'; DROP TABLE queue_jobs; --"},
            EnqueueError,
            "not a valid job type",
            None,
        ),
        (
            "priority 101",
            {"priority": 101},
            EnqueueError,
            "out of range",
            (lambda: echo.using(priority=101).enqueue(), "between -100 and 100"),
        ),
        (
            "priority -101",
            {"priority": -101},
            EnqueueError,
            "out of range",
            (lambda: echo.using(priority=-101).enqueue(), "between -100 and 100"),
        ),
        (
            "priority '5' (a string)",
            {"priority": "5"},
            EnqueueError,
            "must be an integer",
            lambda: echo.using(priority="5").enqueue(),
        ),
        (
            "delay -5",
            {"delay": -5},
            EnqueueError,
            "delay must be a finite number of seconds >= 0",
            None,
        ),
        (
            "delay nan",
            {"delay": math.nan},
            EnqueueError,
            "delay must be a finite number of seconds >= 0",
            None,
        ),
        (
            "run_at naive datetime(2030, 1, 1, 12, 0)",
            {"run_at": naive},
            EnqueueError,
            "naive",
            (lambda: echo.using(run_after=naive).enqueue(), "must be an aware datetime"),
        ),
        (
            "run_at and delay both given",
            {"run_at": aware, "delay": 5},
            EnqueueError,
            "not both",
            None,
        ),
        ("max_attempts 0", {"max_attempts": 0}, EnqueueError, "max_attempts", None),
        (
            "idempotency_key 'k\\x00'",
            {"idempotency_key": "k\x00"},
            EnqueueError,
            "NUL",
            None,
        ),
    ]


def try_in_transaction(call: Callable[[], Any]) -> tuple[BaseException | None, int, int]:
    """Run a bad call inside transaction.atomic(), then a good enqueue in the same one.

    Returns (the error, rows the bad call left, id of the good job after commit).
    """
    error = None
    with transaction.atomic():
        before = rows()
        try:
            call()
        except Exception as exc:
            error = exc
        written = rows() - before
        # The caller's transaction is still usable: a query, then an enqueue.
        assert sql("SELECT 1")[0][0] == 1
        good = enqueue("qa.noop", {"after": "error"}, queue="after-error")
    assert sql("SELECT status FROM queue_job_state WHERE job_id = %s", [good.id]) == [
        ("pending",)
    ], "the enqueue after the error did not commit"
    return error, written, good.id


def enqueue_time_rows() -> list[dict[str, Any]]:
    table = []
    for label, kwargs, error_class, text, through_backend in cases():
        kwargs = dict(kwargs)
        type_ = kwargs.pop("type", "qa.noop")
        payload = kwargs.pop("payload", {"ok": True})
        schedule = {k: kwargs.pop(k) for k in ("run_at", "delay") if k in kwargs}
        calls: dict[str, Callable[[], Any]] = {
            "enqueue": partial(enqueue, type_, payload, **kwargs, **schedule),
            # The bad item comes second: a batch written item by item would leave one.
            "enqueue_many": partial(
                enqueue_many,
                [
                    JobSpec("qa.noop", {"first": "good"}),
                    JobSpec(type_, payload, **kwargs, **schedule),
                ],
            ),
        }
        texts = dict.fromkeys(("enqueue", "enqueue_many", "tasks backend"), text)
        if isinstance(through_backend, tuple):
            through_backend, texts["tasks backend"] = through_backend
        if through_backend is not None:
            calls["tasks backend"] = through_backend
        seen = ""
        total_written = 0
        for path, call in calls.items():
            error, written, _ = try_in_transaction(call)
            expected = (error_class, InvalidTask) if path == "tasks backend" else error_class
            assert isinstance(error, expected), f"{label} via {path}: got {error!r}"
            assert texts[path].lower() in str(error).lower(), f"{label} via {path}: {error}"
            assert written == 0, f"{label} via {path} wrote {written} rows"
            total_written += written
            if path == "enqueue":
                seen = f"{type(error).__name__}: {str(error)[:160]}"
            if path == "enqueue_many":
                assert "item 1" in str(error), f"{label}: the batch error names no item: {error}"
        table.append(
            {
                "input": label,
                "through": ", ".join(calls),
                "error seen": seen,
                "rows written": total_written,
            }
        )
    return table


# (input as shown in the doc, job type, payload, max_attempts, final status, attempts,
# error class on every attempt, text last_error must contain)
RUNTIME = [
    (
        "unknown job type 'qa.no_such_type'",
        "qa.no_such_type",
        {},
        3,
        "dead",
        1,
        "django_pgqueue.exceptions.UnknownJobType",
        "No handler is registered for job type 'qa.no_such_type'",
    ),
    (
        "handler raises SystemExit",
        "qa.exit",
        {"raise": "SystemExit"},
        2,
        "dead",
        2,
        "SystemExit",
        "bye",
    ),
    (
        "handler raises KeyboardInterrupt",
        "qa.exit",
        {"raise": "KeyboardInterrupt"},
        2,
        "dead",
        2,
        "KeyboardInterrupt",
        "bye",
    ),
    (
        "exception message with NUL and a lone surrogate (qa.nul_error)",
        "qa.nul_error",
        {},
        1,
        "dead",
        1,
        "ValueError",
        "bad ",
    ),
    (
        "result {'when': object()} (qa.bad_result)",
        "qa.bad_result",
        {},
        3,
        "dead",
        1,
        "django_pgqueue.ResultNotStorable",
        "cannot be stored as JSON",
    ),
    (
        "result 'bad \\x00 result' (qa.nul_result)",
        "qa.nul_result",
        {},
        3,
        "dead",
        1,
        "django_pgqueue.ResultNotStorable",
        "NUL",
    ),
]


def run_time_rows(worker_process: Any) -> list[dict[str, Any]]:
    jobs = [
        (case, enqueue(case[1], case[2], queue="bad", max_attempts=case[3]).id) for case in RUNTIME
    ]
    worker = worker_process(
        "bad",
        "--lease",
        "2",
        "--heartbeat-interval",
        "0.6",
        "--sweep-interval",
        "1",
        "--poll-interval",
        "0.2",
        "--concurrency",
        "2",
        "-v",
        "0",
    )
    ids = [job_id for _, job_id in jobs]
    wait_until(
        "SELECT count(*) FROM queue_job_state WHERE job_id = ANY(%s) "
        "AND status IN ('completed', 'dead', 'cancelled')",
        lambda n: n == len(ids),
        timeout=60,
        params=[ids],
    )
    table = []
    for (label, _, _, _, status, attempts, error_class, text), job_id in jobs:
        state = sql(
            "SELECT status, attempts, last_error FROM queue_job_state WHERE job_id = %s",
            [job_id],
        )[0]
        tries = sql(
            "SELECT status, error_class, error_message FROM queue_attempts "
            "WHERE job_id = %s ORDER BY lease_version",
            [job_id],
        )
        assert state[0] == status, f"{label}: {state}"
        assert state[1] == attempts == len(tries), f"{label}: {state} {tries}"
        assert all(t[0] == "failed" and t[1] == error_class for t in tries), f"{label}: {tries}"
        assert text in (state[2] or ""), f"{label}: last_error {state[2]!r}"
        assert text in (tries[-1][2] or ""), f"{label}: attempt error {tries[-1][2]!r}"
        assert "\x00" not in state[2]
        table.append(
            {
                "input": label,
                "through": "run_queue_worker",
                "error seen": state[2][:200],
                "rows written": (
                    f"job {status}" + (f" after {attempts} attempts" if attempts > 1 else "")
                ),
            }
        )
    # The same worker process is alive and still completes a healthy job.
    assert worker.proc.poll() is None, worker.wait(5)[1]
    healthy = enqueue("qa.ledger", {}, queue="bad")
    wait_until(
        "SELECT status FROM queue_job_state WHERE job_id = %s",
        lambda s: s == "completed",
        timeout=30,
        params=[healthy.id],
    )
    assert sql("SELECT count(*) FROM qa_ledger WHERE job_id = %s", [healthy.id])[0][0] == 1
    worker.signal(signal.SIGTERM)
    code, output = worker.wait(30)
    assert code == 0, output
    return table


def test_bad_input(worker_process, report):
    """9. Bad input"""
    table = enqueue_time_rows()
    table += run_time_rows(worker_process)
    report(
        size=len(table),
        cases=table,
        lost=0,
        completed_twice=0,
        notes=(
            "Enqueue-time cases are refused before any row is written (0 rows in the three "
            "queue tables, through enqueue, enqueue_many and the django.tasks backend) and the "
            "caller's transaction commits a following enqueue; run-time cases end dead with "
            "the error recorded, and the same worker process then completes a healthy job."
        ),
    )
