import pytest

from django_pgqueue.conf import SETTINGS, validate
from django_pgqueue.exceptions import ConfigurationError


def test_defaults_validate():
    conf = validate({})
    assert conf.LEASE == 30.0
    assert conf.HEARTBEAT_INTERVAL == 10.0  # a third of the lease
    assert set(SETTINGS) == set(conf.__dataclass_fields__)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"LEASES": 5}, "PGQUEUE has unknown key"),
        ({"LEASE": 0}, r"PGQUEUE\['LEASE'\] must be a finite number of seconds > 0"),
        ({"LEASE": 10, "HEARTBEAT_INTERVAL": 6}, "at most half the LEASE"),
        ({"CONCURRENCY": "4"}, "CONCURRENCY"),
        ({"DEFAULT_QUEUE": "bad queue"}, "DEFAULT_QUEUE"),
        ({"DEFAULT_PRIORITY": 500}, "DEFAULT_PRIORITY"),
        ({"RETRY_BACKOFF_BASE": 10, "RETRY_BACKOFF_CAP": 1}, "RETRY_BACKOFF_CAP"),
        ({"MAX_PAYLOAD_BYTES": -1}, "MAX_PAYLOAD_BYTES"),
        ({"WORKER_PREPARED_STATEMENTS": "no"}, "WORKER_PREPARED_STATEMENTS.*True or False"),
        ([], "must be a dict"),
    ],
)
def test_invalid_settings_name_the_key(raw, message):
    with pytest.raises(ConfigurationError, match=message):
        validate(raw)
