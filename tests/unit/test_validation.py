import datetime as dt
import decimal
import uuid

import pytest
from django.contrib.auth.models import User

from django_pgqueue import validation
from django_pgqueue.exceptions import EnqueueError, PayloadError


def test_payload_round_trips_as_compact_json():
    assert validation.payload({"a": [1, 2.5, None, True], "b": "é"}, None) == (
        '{"a":[1,2.5,null,true],"b":"é"}'
    )


@pytest.mark.parametrize(
    ("value", "path", "words"),
    [
        ({"tags": {"a", "b"}}, "payload['tags']", "set"),
        ({"blob": b"\x00\x01"}, "payload['blob']", "bytes"),
        ({"amount": decimal.Decimal("1.10")}, "payload['amount']", "Decimal"),
        ({"x": [1, float("nan")]}, "payload['x'][1]", "NaN"),
        ({"x": float("inf")}, "payload['x']", "Infinity"),
        ({"when": dt.datetime(2024, 1, 1)}, "payload['when']", "isoformat"),
        ({"id": uuid.UUID(int=1)}, "payload['id']", "UUID"),
        ({"note": "a\x00b"}, "payload['note']", "NUL"),
        ({"note": "\ud800"}, "payload['note']", "surrogate"),
        ({1: "int key"}, "payload", "key 1"),
        ("\x00", "payload", "NUL"),
    ],
)
def test_unstorable_payloads_name_the_culprit(value, path, words):
    with pytest.raises(PayloadError, match=r"not JSON|NaN|NUL|surrogate|key|Infinity") as info:
        validation.payload(value, None)
    assert info.value.path == path
    assert words in str(info.value)
    assert isinstance(info.value, TypeError)


def test_model_instances_are_refused_with_a_hint():
    user = User(pk=42, username="x")
    with pytest.raises(PayloadError, match=r"model instance.*primary key \(42\)"):
        validation.payload({"user": user}, None)


def test_circular_payload_is_refused():
    loop: list = []
    loop.append(loop)
    with pytest.raises(PayloadError, match="circular"):
        validation.payload(loop, None)


def test_payload_size_limit():
    validation.payload("x" * 10, 12)
    with pytest.raises(PayloadError, match="over the limit of 12"):
        validation.payload("x" * 11, 12)


@pytest.mark.parametrize(
    "name", ["", "a" * 64, "pay ments", "payments; DROP TABLE queue_jobs", "-x", "é", None, 5]
)
def test_bad_queue_names(name):
    with pytest.raises(EnqueueError, match="queue"):
        validation.queue_name(name)


def test_good_queue_names():
    for name in ["default", "payments", "a" * 63, "eu-west.emails:high", "Q1"]:
        assert validation.queue_name(name) == name


@pytest.mark.parametrize("value", [-101, 101, 1.5, True, "1", None])
def test_bad_priorities(value):
    with pytest.raises(EnqueueError, match="priority"):
        validation.priority(value)


def test_schedule_rules():
    assert validation.schedule(None, None) == (None, 0.0)
    assert validation.schedule(None, 5) == (None, 5.0)
    assert validation.schedule(None, dt.timedelta(minutes=1)) == (None, 60.0)
    with pytest.raises(EnqueueError, match=">= 0"):
        validation.schedule(None, -1)
    with pytest.raises(EnqueueError, match=">= 0"):
        validation.schedule(None, float("nan"))
    with pytest.raises(EnqueueError, match="not both"):
        validation.schedule(dt.datetime.now(dt.timezone.utc), 5)
    with pytest.raises(EnqueueError, match="naive"):
        validation.schedule(dt.datetime(2030, 1, 1), None)
    with pytest.raises(EnqueueError, match="10 years"):
        validation.schedule(None, 11 * 366 * 86400)
    with pytest.raises(EnqueueError, match="seconds"):
        validation.schedule(None, "5")


def test_type_names():
    assert validation.type_name("payments.charge") == "payments.charge"
    for bad in ["", "1abc", "a b", "x" * 256, None]:
        with pytest.raises(EnqueueError, match="type"):
            validation.type_name(bad)
