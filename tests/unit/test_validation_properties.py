"""Property-based tests of validation: payloads, names, seconds and settings.

Each property says what is accepted (and in what form), and that everything else is
refused with the documented error class and a message naming the argument.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("hypothesis")
from hypothesis import example, given
from hypothesis import strategies as st

from django_pgqueue import validation, validators
from django_pgqueue.conf import SETTINGS, QueueSettings, validate
from django_pgqueue.exceptions import ConfigurationError, EnqueueError, PayloadError, RetryLater
from django_pgqueue.retry import bounded
from django_pgqueue.validators import MAX_SECONDS
from tests.property_strategies import (
    PROPERTY_SETTINGS,
    bad_seconds,
    broken,
    good_seconds,
    json_values,
    queue_names,
    same_json,
    type_names,
    unstorable_values,
)

# -- payloads ------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(value=json_values, limit=st.one_of(st.none(), st.integers(2, 400)))
def test_a_json_payload_is_accepted_exactly_when_it_fits(value, limit):
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    fits = limit is None or size <= limit
    if not fits:
        with pytest.raises(PayloadError, match="over the limit") as info:
            validation.payload(value, limit)
        assert info.value.path == "payload"
    else:
        assert same_json(json.loads(validation.payload(value, limit)), value)


@PROPERTY_SETTINGS
@given(values=st.lists(json_values, min_size=1, max_size=6), limit=st.integers(2, 200))
@example(values=["é" * 60], limit=100)  # 62 characters, 122 bytes: was accepted in bulk
def test_enqueue_many_accepts_exactly_what_enqueue_accepts(values, limit):
    """The bulk check agrees with the single one item by item (bytes, not characters)."""
    accepted = []
    for value in values:
        try:
            validation.payload(value, limit)
        except PayloadError:
            accepted.append(False)
        else:
            accepted.append(True)
    if all(accepted):
        assert same_json(json.loads(validation.payloads(values, limit)), values)
    else:
        first_refused = accepted.index(False)
        with pytest.raises(PayloadError, match=f"^enqueue_many item {first_refused}: "):
            validation.payloads(values, limit)


@PROPERTY_SETTINGS
@given(value=unstorable_values())
def test_an_unstorable_payload_is_refused_naming_where(value):
    with pytest.raises(PayloadError) as info:
        validation.payload(value, None)
    assert info.value.path.startswith("payload")
    assert info.value.path in str(info.value)
    assert isinstance(info.value, TypeError)
    with pytest.raises(PayloadError, match=r"^enqueue_many item 1: "):
        validation.payloads([None, value], None)


def test_a_payload_nested_too_deep_is_a_payload_error():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested"):
        validation.payload(deep, None)
    with pytest.raises(PayloadError, match="item 0"):
        validation.payloads([deep], None)


# -- names ---------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(name=queue_names())
def test_every_queue_name_of_the_documented_shape_is_accepted(name):
    assert validation.queue_name(name) == name
    conf = validate({"DEFAULT_QUEUE": name})
    assert name == conf.DEFAULT_QUEUE


@PROPERTY_SETTINGS
@given(name=broken(queue_names(), 63))
def test_anything_else_is_refused_as_a_queue_name(name):
    with pytest.raises(EnqueueError, match=r"^queue "):
        validation.queue_name(name)
    with pytest.raises(ConfigurationError, match=r"^PGQUEUE\['DEFAULT_QUEUE'\]"):
        validate({"DEFAULT_QUEUE": name})


@PROPERTY_SETTINGS
@given(name=type_names())
def test_every_type_name_of_the_documented_shape_is_accepted(name):
    assert validation.type_name(name) == name


@PROPERTY_SETTINGS
@given(name=broken(type_names(), 255))
def test_anything_else_is_refused_as_a_type_name(name):
    with pytest.raises(EnqueueError, match=r"^type "):
        validation.type_name(name)


@PROPERTY_SETTINGS
@given(text=st.text(max_size=70))
def test_queue_names_are_exactly_the_documented_shape(text):
    """An independent statement of the rule: 1 to 63 of [A-Za-z0-9_.:-], led by [A-Za-z0-9]."""
    allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
    expected = 1 <= len(text) <= 63 and set(text) <= allowed and text[0] not in "_.:-"
    assert validators.is_queue_name(text) is expected


# -- seconds -------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(value=good_seconds)
def test_seconds_in_range_are_accepted_everywhere(value):
    assert validation.schedule(None, value) == (None, float(value))
    if value > 0:
        assert validators.seconds(value, "x") == float(value)
        conf = validate({"POLL_INTERVAL": value})
        assert float(value) == conf.POLL_INTERVAL
    assert RetryLater(value).delay == float(value)


@PROPERTY_SETTINGS
@given(value=bad_seconds)
def test_seconds_out_of_range_are_refused_naming_the_argument(value):
    with pytest.raises(EnqueueError, match=r"^delay must be"):
        validation.schedule(None, value)
    with pytest.raises(ConfigurationError, match=r"^PGQUEUE\['POLL_INTERVAL'\] must be"):
        validate({"POLL_INTERVAL": value})
    with pytest.raises(ValueError, match=r"^lease must be"):
        validators.seconds(value, "lease")


@PROPERTY_SETTINGS
@given(value=st.one_of(st.floats(), st.integers(min_value=0, max_value=10**500)))
def test_a_retry_delay_reaches_the_database_in_range(value):
    """RetryLater either refuses its delay or keeps one PostgreSQL can add to now()."""
    try:
        delay = RetryLater(value).delay
    except ValueError:
        assert math.isnan(value) or value < 0
    else:
        assert 0 <= delay <= MAX_SECONDS


class Returns:
    def __init__(self, value: float) -> None:
        self.value = value

    def delay(self, attempt: int) -> float:
        return self.value


@PROPERTY_SETTINGS
@given(value=st.floats(), attempt=st.integers(1, 10**6))
def test_a_custom_policys_delay_is_kept_in_range(value, attempt):
    assert 0 <= bounded(Returns(value)).delay(attempt) <= MAX_SECONDS


# -- settings ------------------------------------------------------------------------------

ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(),
    st.text(max_size=8),
    good_seconds,
    bad_seconds,
    queue_names(),
)
KEYS = st.sampled_from([*SETTINGS, "LEASES", "lease"])


@PROPERTY_SETTINGS
@given(raw=st.dictionaries(KEYS, ANY_VALUE, max_size=5))
def test_settings_are_valid_or_refused_naming_a_given_key(raw):
    try:
        conf = validate(raw)
    except ConfigurationError as exc:
        message = str(exc)
    else:
        message = None
    if message is not None:
        assert any(key in message for key in raw), message
    else:
        assert isinstance(conf, QueueSettings)
        for key in (
            "LEASE",
            "HEARTBEAT_INTERVAL",
            "SWEEP_INTERVAL",
            "POLL_INTERVAL",
            "SHUTDOWN_GRACE",
            "RECONNECT_MAX_DELAY",
            "RETRY_BACKOFF_BASE",
            "RETRY_BACKOFF_CAP",
        ):
            assert 0 <= getattr(conf, key) <= MAX_SECONDS, key
        assert conf.JOB_TIMEOUT is None or 0 < conf.JOB_TIMEOUT <= MAX_SECONDS
        assert 1 <= conf.CONCURRENCY <= validators.MAX_CONCURRENCY
        assert conf.BATCH_SIZE is None or 1 <= conf.BATCH_SIZE <= validators.MAX_BATCH_SIZE
        assert validators.is_queue_name(conf.DEFAULT_QUEUE)
