"""manage.py queue_control: thin over the Python API, bad values refused."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import sql

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("queue_control", *args, stdout=out)
    return out.getvalue()


def test_pause_limit_rate_show_resume():
    assert "PAUSED" in run("pause", "emails")
    assert "limit=3" in run("limit", "emails", "3")
    assert "key_limit=2" in run("key-limit", "emails", "2")
    assert "rate=100/1s" in run("rate", "emails", "100/s")
    assert run("show") == "emails: PAUSED limit=3 key_limit=2 rate=100/1s running=0\n"
    assert "active" in run("resume", "emails")
    run("limit", "emails", "none")
    run("rate", "emails", "none")
    assert sql(
        "SELECT paused, concurrency_limit, key_limit, rate_count, rate_period "
        "FROM queue_controls WHERE queue = 'emails'"
    ) == [(False, None, 2, None, None)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("limit", "emails", "-1"), "from 0 to 100000"),
        (("limit", "emails", "many"), "whole number"),
        (("rate", "emails", "fast"), "must look like"),
        (("rate", "emails", "0/s"), "between 1 and 10000"),
        (("key-limit", "emails", "none"), "cannot be removed"),
        (("pause",), "give the queue's name"),
        (("pause", "bad queue"), "queue name"),
        (("resume", "emails", "3"), "takes no value"),
    ],
)
def test_bad_values_are_refused_and_nothing_is_written(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert sql("SELECT count(*) FROM queue_controls")[0][0] == 0
