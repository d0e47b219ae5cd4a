"""Unique(): what it accepts, what it refuses, and the parameters it gives the statement."""

from __future__ import annotations

import datetime as dt

import pytest

from django_pgqueue import EnqueueError, Unique


def test_defaults_hold_while_active_and_return_the_holder():
    assert Unique("k").params() == {
        "unique_key": "k",
        "unique_hold": "active",
        "unique_seconds": None,
        "on_conflict": "return",
    }


def test_a_period_is_seconds_or_a_timedelta():
    assert Unique("k", hold=90).params()["unique_seconds"] == 90.0
    params = Unique("k", hold=dt.timedelta(minutes=2), on_conflict="refuse").params()
    assert (params["unique_hold"], params["unique_seconds"]) == ("period", 120.0)


def test_debounce_replaces_a_pending_job():
    assert Unique.debounce("k") == Unique("k", hold="pending", on_conflict="replace")


def test_cancel_running_is_a_policy_on_an_active_hold():
    unique = Unique.cancel_running("k")
    assert unique == Unique("k", hold="active", on_conflict="cancel_running")
    assert unique.params()["on_conflict"] == "cancel_running"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": None}, "Unique needs a key"),
        ({"key": ""}, "Unique key must be a non-empty string"),
        ({"key": "a\x00b"}, "NUL"),
        ({"key": "k", "hold": "forever"}, "Unique hold must be one of pending, active"),
        ({"key": "k", "hold": 0}, "more than 0"),
        ({"key": "k", "hold": True}, "more than 0"),
        ({"key": "k", "hold": 1e12}, "at most"),
        ({"key": "k", "on_conflict": "ignore"}, "on_conflict must be one of return"),
        ({"key": "k", "on_conflict": "replace"}, 'needs hold="pending"'),
        ({"key": "k", "hold": 60, "on_conflict": "replace"}, 'needs hold="pending"'),
        ({"key": "k", "hold": "pending", "on_conflict": "cancel_running"}, 'needs hold="active"'),
        ({"key": "k", "hold": 60, "on_conflict": "cancel_running"}, 'needs hold="active"'),
    ],
)
def test_bad_values_are_refused_by_name(kwargs, message):
    with pytest.raises(EnqueueError, match=message):
        Unique(**kwargs)
