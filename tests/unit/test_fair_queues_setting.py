"""PGQUEUE["FAIR_QUEUES"]: what it accepts and what it refuses, by name."""

from __future__ import annotations

import pytest

from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.limits import parse_fair_queues


def test_queues_with_and_without_weights():
    assert parse_fair_queues({"imports": {}, "reports": {"weights": {"big": 3}}}) == {
        "imports": {},
        "reports": {"big": 3},
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["imports"], "must be a dict"),
        ({"bad name!": {}}, "queue"),
        ({"imports": {"weight": {}}}, r"\['imports'\] must be"),
        ({"imports": {"weights": {"": 2}}}, r"\['imports'\] must be"),
        ({"imports": {"weights": {"big": 0}}}, "weight of 'big'"),
        ({"imports": {"weights": {"big": 1001}}}, "weight of 'big'"),
    ],
)
def test_bad_values_are_refused(value, message):
    with pytest.raises(ConfigurationError, match=message):
        parse_fair_queues(value)
