"""PgQueueBackend's configuration: OPTIONS and QUEUES are checked when it is created."""

from __future__ import annotations

import pytest

from django_pgqueue.backends import PgQueueBackend, TaskOptions
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.retry import ExponentialBackoff, FixedDelay


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
    assert configured.task_options("shop.tasks.charge") == TaskOptions(8, FixedDelay(5), 30.0)
    other = configured.task_options("shop.tasks.mail")
    assert other == TaskOptions(4, ExponentialBackoff(base=2, cap=60), 30.0)
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
    ],
)
def test_bad_options_name_the_key(options, message):
    with pytest.raises(ConfigurationError, match=message):
        backend(options)


def test_queue_names_must_be_queue_names():
    with pytest.raises(ConfigurationError, match="not a valid queue name"):
        backend(queues=["payments", "bad queue"])
