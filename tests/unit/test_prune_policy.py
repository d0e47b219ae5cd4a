"""PGQUEUE["PRUNE"] read and checked: defaults, replaced keys, and errors that name the key."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue.conf import validate
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.prune_policy import parse, pruning_rounds

DAY = 86_400.0


def test_nothing_said_is_every_hour_two_weeks_and_ninety_days_for_dead_jobs():
    policy = validate({}).PRUNE
    assert policy.every == dt.timedelta(hours=1)
    assert policy.keep == {"completed": 14 * DAY, "cancelled": 14 * DAY, "dead": 90 * DAY}
    assert validate({"PRUNE": None}).PRUNE is None


def test_given_keys_replace_the_defaults_a_cron_replaces_every_and_none_keeps_a_status():
    policy = parse({"cron": "17 3 * * *", "completed": "3d", "dead": None}, "PRUNE")
    assert (policy.every, policy.cron) == (None, "17 3 * * *")
    assert policy.keep == {"completed": 3 * DAY, "cancelled": 14 * DAY, "dead": None}
    assert policy.payload() == {
        "older_than_seconds": {"completed": 259_200, "cancelled": 1_209_600}
    }
    assert (
        parse({"completed": dt.timedelta(hours=2), "every": 600}, "PRUNE").keep["completed"]
        == 7_200
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"completd": "1d"}, "unknown key(s) 'completd'"),
        ({"completed": "2 weeks"}, "['completed']: '2 weeks' is not a duration"),
        ({"dead": 0}, "PGQUEUE['PRUNE']['dead']"),
        ({"every": "1h", "cron": "0 * * * *"}, "give 'every' or 'cron', not both"),
        ({"every": None}, "needs 'every'"),
        ({"queue": "no spaces"}, "PGQUEUE['PRUNE']['queue']"),
        ({"completed": None, "cancelled": None, "dead": None}, "set it to None"),
        ("1h", "must be a dict"),
    ],
)
def test_a_bad_value_is_refused_naming_the_key(value, message):
    with pytest.raises(ConfigurationError) as caught:
        validate({"PRUNE": value})
    assert message in str(caught.value)


def test_each_pass_takes_every_status_kept_no_longer_than_its_age():
    rounds = pruning_rounds({"completed": 14 * DAY, "cancelled": 14 * DAY, "dead": 90 * DAY})
    assert rounds == [(14 * DAY, ["completed", "cancelled"]),
                      (90 * DAY, ["completed", "cancelled", "dead"])]  # fmt: skip
    assert pruning_rounds({"dead": DAY}) == [(DAY, ["dead"])]
