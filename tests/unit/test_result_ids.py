"""Task result ids: the job id on DATABASE, prefixed with the alias on any other."""

from __future__ import annotations

import pytest

from django_pgqueue.job_refs import parse_result_id, result_id


def test_a_result_id_names_only_a_database_other_than_the_default():
    assert result_id(42, "default", "default") == "42"
    assert result_id(42, "bulk", "default") == "bulk:42"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("42", (42, "default")),
        (42, (42, "default")),
        ("bulk:42", (42, "bulk")),
        ("a:b:7", (7, "a:b")),  # the alias is all before the last colon
        (":42", None),
        ("bulk:", None),
        ("bulk:x", None),
        ("0", None),
        (True, None),
        (str(2**63), None),
        (None, None),
    ],
)
def test_parse_result_id(value, expected):
    assert parse_result_id(value, "default") == expected


def test_result_ids_round_trip():
    for alias in ("default", "bulk", "a:b"):
        assert parse_result_id(result_id(9, alias, "default"), "default") == (9, alias)
