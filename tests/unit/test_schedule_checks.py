"""Bad schedule declarations are system check errors naming the schedule and the problem."""

from __future__ import annotations

import pytest

from django_pgqueue.registry import Handler, registry
from django_pgqueue.schedules.checks import check_schedules


def errors(settings, schedules) -> list[tuple[str, str]]:
    settings.PGQUEUE = {**settings.PGQUEUE, "SCHEDULES": schedules}
    return [(error.id, error.msg) for error in check_schedules()]


@pytest.fixture
def scheduled_handler(monkeypatch):
    # Registered for this test only: monkeypatch takes it out of the registry again.
    handler = Handler("qa.scheduled", lambda ctx: None, schedule="0 6 * * *")
    monkeypatch.setitem(registry._handlers, "qa.scheduled", handler)


def test_valid_schedules_pass(settings, scheduled_handler):
    assert errors(settings, {"n": {"type": "qa.noop", "every": "10s"}}) == []


@pytest.mark.parametrize(
    ("entry", "check", "text"),
    [
        ({"type": "qa.noop", "cron": "0 25 * * *"}, "pgqueue.E031", "invalid cron expression"),
        (
            {"type": "qa.noop", "cron": "0 6 * * *", "timezone": "Europe/Atlantis"},
            "pgqueue.E031",
            "unknown time zone 'Europe/Atlantis'",
        ),
        ({"type": "qa.nobody", "cron": "0 6 * * *"}, "pgqueue.E032", "'qa.nobody'"),
        ({"type": "qa.noop", "cron": "0 6 * * *", "every": 5}, "pgqueue.E031", "exactly one"),
        ({"type": "qa.noop", "cron": "0 6 * * *", "when": 1}, "pgqueue.E030", "unknown key"),
        ({"type": "qa.noop", "every": "soon"}, "pgqueue.E030", "not a duration"),
        ("0 6 * * *", "pgqueue.E030", "must be a dict"),
    ],
)
def test_each_bad_declaration_is_an_error_naming_it(settings, entry, check, text):
    found = errors(settings, {"reports.daily": entry})
    assert len(found) == 1, found
    assert found[0][0] == check
    assert "'reports.daily'" in found[0][1]
    assert text in found[0][1]


def test_two_code_schedules_with_one_name_are_an_error(settings, scheduled_handler):
    found = errors(settings, {"qa.scheduled": {"type": "qa.noop", "every": "1m"}})
    assert [check for check, _ in found] == ["pgqueue.E033"]
    assert "'qa.scheduled'" in found[0][1]
    assert "@handler('qa.scheduled', schedule=...)" in found[0][1]
    assert "PGQUEUE['SCHEDULES']['qa.scheduled']" in found[0][1]


def test_task_schedules_come_from_the_tasks_backend_options(settings):
    from django_pgqueue.schedules.spec import code_schedules

    backend = settings.TASKS["default"]
    settings.TASKS = {
        "default": {
            **backend,
            "OPTIONS": {
                **backend["OPTIONS"],
                "SCHEDULES": {
                    "sums": {"task": "qa.tasks.add", "every": "1h", "args": [1, 2]},
                    "ghost": {"task": "qa.tasks.nothing_here", "cron": "0 6 * * *"},
                },
            },
        }
    }
    settings.PGQUEUE = {**settings.PGQUEUE, "SCHEDULES": {}}
    specs = {spec.name: spec for spec in code_schedules().specs}
    sums = specs["sums"]
    assert (sums.type, sums.queue) == ("qa.tasks.add", "qa-tasks")  # the task's queue_name
    assert sums.payload == {"args": [1, 2], "kwargs": {}, "backend": "default"}
    found = [(error.id, error.msg) for error in check_schedules()]
    assert [check for check, _ in found] == ["pgqueue.E032"]
    assert "'qa.tasks.nothing_here'" in found[0][1]
