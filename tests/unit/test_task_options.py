"""PgQueueBackend's configuration: OPTIONS and QUEUES are checked when it is created."""

from __future__ import annotations

import pytest

from django_pgqueue.backends import PgQueueBackend, TaskOptions
from django_pgqueue.exceptions import ConfigurationError, EnqueueError
from django_pgqueue.retry import ExponentialBackoff, FixedDelay
from django_pgqueue.tasks import runner


def backend(options=None, queues=None) -> PgQueueBackend:
    params = {"BACKEND": "django_pgqueue.backends.PgQueueBackend", "OPTIONS": options or {}}
    if queues is not None:
        params["QUEUES"] = queues
    return PgQueueBackend("test", params)


def test_per_task_options_override_the_backend_wide_ones():
    configured = backend(
        {
            "MAX_ATTEMPTS": 4,
            "RETRY": {"policy": "exponential", "base": 2, "cap": 60},
            "TIMEOUT": 30,
            "TASKS": {"shop.tasks.charge": {"max_attempts": 8, "retry": FixedDelay(5)}},
        }
    )
    assert configured.task_options("shop.tasks.charge") == TaskOptions(
        max_attempts=8, retry=FixedDelay(5), timeout=30.0
    )
    other = configured.task_options("shop.tasks.mail")
    assert other == TaskOptions(
        max_attempts=4, retry=ExponentialBackoff(base=2, cap=60), timeout=30.0
    )
    assert backend().task_options("x.y") == TaskOptions()  # PGQUEUE's defaults apply


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"MAX_TRIES": 3}, "unknown key.*'MAX_TRIES'"),
        ({"MAX_ATTEMPTS": 0}, "MAX_ATTEMPTS.*1 to 1000"),
        ({"TIMEOUT": -1}, "TIMEOUT.*> 0"),
        ({"RETRY": "exponential"}, "RETRY.*must be a retry policy"),
        ({"RETRY": {"policy": "fixed", "secs": 1}}, "RETRY"),
        ({"RETRY": {"policy": "exponential", "base": 10, "cap": 1}}, r"cap \(1\) must be >= base"),
        ({"TASKS": ["shop.tasks.charge"]}, "TASKS.*must map"),
        ({"TASKS": {"charge": {}}}, "task module paths"),
        ({"TASKS": {"shop.tasks.charge": {"attempts": 2}}}, "unknown key.*'attempts'"),
        ({"TASKS": {"shop.tasks.charge": {"concurrency_key": 42}}}, "concurrency_key.*template"),
        ({"TASKS": {"shop.tasks.charge": {"concurrency_key": ""}}}, "concurrency_key.*template"),
        ({"TASKS": {"shop.tasks.charge": {"concurrency_key": "c:{"}}}, "not a valid template"),
        (
            {"TASKS": {"shop.tasks.charge": {"concurrency_key": "c:{order.customer}"}}},
            r"name an argument.*\{order.customer\}",
        ),
        ({"TASKS": {"shop.tasks.charge": {"concurrency_key": "c:{a[0]}"}}}, "name an argument"),
        ({"CONCURRENCY_KEY": "c"}, "unknown key.*'CONCURRENCY_KEY'"),
        ({"TASKS": {"shop.tasks.charge": {"time_limit": 0}}}, "time_limit must be a finite"),
        (
            {"TASKS": {"shop.tasks.charge": {"soft_time_limit": 9, "time_limit": 5}}},
            r"soft_time_limit \(9s\) must be below time_limit \(5s\)",
        ),
        ({"TIME_LIMIT": 5}, "unknown key.*'TIME_LIMIT'"),
        ({"TASKS": {"shop.tasks.charge": {"sequence": 42}}}, "sequence.*template"),
        (
            {"TASKS": {"shop.tasks.charge": {"sequence_on_failure": "skip"}}},
            r"sequence_on_failure'\] must be one of hold, continue, got 'skip'",
        ),
    ],
)
def test_bad_options_name_the_key(options, message):
    with pytest.raises(ConfigurationError, match=message):
        backend(options)


def test_a_tasks_time_limits_are_its_own():
    configured = backend(
        {"TASKS": {"shop.tasks.export": {"soft_time_limit": 50, "time_limit": 60}}}
    )
    options = configured.task_options("shop.tasks.export")
    assert (options.soft_time_limit, options.time_limit) == (50, 60)
    assert configured.has_time_limits()
    assert not backend().has_time_limits()


def test_queue_names_must_be_queue_names():
    with pytest.raises(ConfigurationError, match="not a valid queue name"):
        backend(queues=["payments", "bad queue"])


def charge(order_id, customer_id, *, amount=0):
    return order_id


def charge_in_context(context, customer_id):
    return customer_id


def test_a_concurrency_key_template_names_parameters_however_they_are_passed():
    options = backend(
        {"TASKS": {"shop.tasks.charge": {"concurrency_key": "customer:{customer_id}/{0}"}}}
    ).task_options("shop.tasks.charge")
    assert options.key_for(charge, False, [7, 42], {}) == "customer:42/7"
    assert options.key_for(charge, False, [7], {"customer_id": 42}) == "customer:42/7"
    contextual = TaskOptions(concurrency_key="customer:{customer_id}")
    assert contextual.key_for(charge_in_context, True, [42], {}) == "customer:42"
    with pytest.raises(EnqueueError, match="names argument 'customer_id'"):
        options.key_for(charge, False, [7], {})
    assert TaskOptions().key_for(charge, False, [7, 42], {}) is None
    sequenced = TaskOptions(sequence="ledger:{customer_id}")
    assert sequenced.key_for(charge, False, [7, 42], {}, "sequence") == "ledger:42"
    with pytest.raises(EnqueueError, match="the sequence template"):
        sequenced.key_for(charge, False, [7], {}, "sequence")


def test_a_concurrency_key_callable_gets_the_call_arguments():
    options = backend(
        {
            "TASKS": {
                "shop.tasks.charge": {
                    "concurrency_key": lambda order_id, customer_id, **kw: f"c:{customer_id}"
                }
            }
        }
    ).task_options("shop.tasks.charge")
    assert options.key_for(charge, False, [7, 42], {"amount": 1}) == "c:42"


def test_a_tasks_handler_runs_with_the_tasks_run_options(monkeypatch):
    """Every run option of a task's OPTIONS reaches the Handler its jobs run with, but
    takes_results: the task runner passes the parents' results itself."""
    options = TaskOptions(
        max_attempts=3,
        retry=FixedDelay(2),
        timeout=9.0,
        takes_results=True,
        soft_time_limit=4.0,
        time_limit=8.0,
        concurrency_key="customer:{0}",
    )
    task = object()
    monkeypatch.setattr(runner, "import_task", lambda path: task)
    monkeypatch.setattr(runner, "_options", lambda found: options)
    handler = runner.resolve_task("shop.tasks.charge")
    assert handler.type == "shop.tasks.charge"
    assert handler.func.task is task
    assert handler.func.takes_results
    assert (handler.max_attempts, handler.retry, handler.timeout) == (3, FixedDelay(2), 9.0)
    assert (handler.soft_time_limit, handler.time_limit) == (4.0, 8.0)
    assert handler.takes_results is False
    assert handler.retry_on is None
