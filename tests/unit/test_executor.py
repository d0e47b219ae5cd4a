import json

from django_pgqueue import executor, outcomes
from django_pgqueue.context import JobContext
from django_pgqueue.exceptions import PermanentFailure, RetryLater
from django_pgqueue.registry import Handler
from django_pgqueue.retry import FixedDelay


def ctx(attempt: int = 1) -> JobContext:
    return JobContext(
        job_id=1, queue="q", type="t", payload={}, attempt=attempt, max_attempts=3, lease_version=1
    )


def run(func, attempt: int = 1):
    return executor.run(ctx(attempt), Handler("t", func), FixedDelay(7))


def test_success_keeps_a_json_result():
    outcome = run(lambda c: {"n": 1})
    assert outcome == executor.Success('{"n":1}')
    assert run(lambda c: None) == executor.Success(None)


def test_ordinary_exception_is_retried_with_the_policy_delay():
    def boom(c):
        raise KeyError("missing")

    outcome = run(boom)
    assert isinstance(outcome, executor.Failure)
    assert (outcome.permanent, outcome.delay, outcome.error_class) == (False, 7.0, "KeyError")
    assert "boom" in outcome.traceback


def test_control_flow_exceptions():
    def later(c):
        raise RetryLater(42)

    def never(c):
        raise PermanentFailure("no")

    assert run(later).delay == 42
    assert not run(later).permanent
    assert run(never).permanent


def test_system_exit_and_keyboard_interrupt_become_failures():
    def exits(c):
        raise SystemExit(3)

    def interrupts(c):
        raise KeyboardInterrupt

    assert run(exits).error_class == "SystemExit"
    assert run(interrupts).error_class == "KeyboardInterrupt"


def test_unknown_type_is_permanent():
    outcome = executor.run(ctx(), None, FixedDelay(1))
    assert outcome.permanent
    assert "UnknownJobType" in outcome.error_class


def test_unstorable_result_is_a_permanent_failure_not_a_rerun():
    outcome = run(lambda c: {"x": {1, 2}})
    assert outcome.permanent
    assert "cannot be stored as JSON" in outcome.message


def test_error_text_is_made_storable():
    def nasty(c):
        raise ValueError("nul \x00 and \udc80 and " + "x" * 10_000)

    outcome = run(nasty)
    assert "\x00" not in outcome.message
    assert "\x00" not in outcome.traceback
    outcome.message.encode("utf-8")
    outcome.last_error.encode("utf-8")
    assert len(outcome.message) <= executor.MESSAGE_LIMIT
    assert len(outcome.last_error) <= outcomes.LAST_ERROR_LIMIT
    json.dumps(outcome.traceback)


def test_broken_str_does_not_break_the_worker():
    class Weird(Exception):
        def __str__(self):
            raise RuntimeError("no str for you")

    def raises_weird(c):
        raise Weird

    assert "str() of the exception failed" in run(raises_weird).message


def test_idempotency_key_is_stable_across_attempts():
    assert ctx(1).idempotency_key == ctx(3).idempotency_key == "pgqueue-1"


def test_a_backslash_before_u0000_is_storable_and_a_real_nul_is_not():
    path = r"C:\u0000dir"  # a backslash, a 'u' and four digits: no NUL
    assert executor.success(path) == executor.Success(json.dumps(path, ensure_ascii=False))
    assert executor.success({"dir": [path]}) == executor.Success('{"dir":["C:\\\\u0000dir"]}')
    for value in ("a\x00b", {"k": ["a\x00"]}, {"a\x00": 1}):
        outcome = executor.success(value)
        assert isinstance(outcome, executor.Failure), value
        assert outcome.permanent
        assert "NUL" in outcome.message


def test_the_plain_text_rewrite_of_a_refused_failure_keeps_its_end():
    """A failure PostgreSQL refused is written again as plain text: still a snooze or an
    interruption (its attempt given back), still logged where it ran."""
    for failure in (
        outcomes.Snoozed("E\x00", "bad\x00", "trace", delay=1e30),
        outcomes.Interrupted("E\x00", "bad\x00", "trace"),
        outcomes.Retry("E\x00", "bad\x00", "trace", logged=True, delay=float("inf")),
    ):
        again = outcomes.as_plain_text(failure)
        assert type(again) is type(failure)
        assert again.logged == failure.logged
        assert again.traceback == ""
        assert "\x00" not in again.error_class
        assert getattr(again, "delay", 0.0) <= outcomes.MAX_RETRY_DELAY
