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
        ({"QUEUE_DATABASES": ["payments"]}, r"QUEUE_DATABASES'\] must be a dict"),
        ({"QUEUE_DATABASES": {"bad queue": "pay"}}, "QUEUE_DATABASES'\\] key 'bad queue'"),
        ({"QUEUE_DATABASES": {"mail.[x": "bulk"}}, "neither a queue name nor a glob"),
        ({"QUEUE_DATABASES": {"payments": ""}}, r"\['payments'\] must be a database alias"),
        ({"READ_DATABASE": "default"}, "an alias other than DATABASE"),
        ({"READ_DATABASE": 3}, "READ_DATABASE'\\] must be a database alias"),
    ],
)
def test_invalid_settings_name_the_key(raw, message):
    with pytest.raises(ConfigurationError, match=message):
        validate(raw)


def test_queue_databases_route_exact_names_then_globs_in_order():
    conf = validate(
        {
            "QUEUE_DATABASES": {"mail.*": "bulk", "payments": "pay", "mail.urgent": "pay"},
            "READ_DATABASE": "replica",
        }
    )
    assert conf.database_for("payments") == "pay"
    assert conf.database_for("mail.urgent") == "pay"  # an exact name beats a glob
    assert conf.database_for("mail.digest") == "bulk"
    assert conf.database_for("default") == "default"
    assert conf.queue_databases == ("default", "pay", "bulk")
    assert conf.read_database("default") == "replica"
    assert conf.read_database("pay") == "pay"  # the replica is DATABASE's only


def test_without_queue_databases_every_queue_is_on_database():
    conf = validate({"DATABASE": "queues"})
    assert conf.database_for("anything") == "queues"
    assert conf.queue_databases == ("queues",)
    assert conf.read_database("queues") == "queues"


def test_the_claim_size_follows_the_concurrency_unless_a_batch_size_is_given(settings):
    from django_pgqueue.worker_config import WorkerConfig

    settings.PGQUEUE = {}
    assert validate({}).BATCH_SIZE is None
    assert WorkerConfig.build(["q"], concurrency=16).batch_size == 16
    assert WorkerConfig.build(["q"]).batch_size == 10  # CONCURRENCY's default
    assert WorkerConfig.build(["q"], concurrency=16, batch_size=4).batch_size == 4
    settings.PGQUEUE = {"BATCH_SIZE": 10, "CONCURRENCY": 32}
    assert WorkerConfig.build(["q"]).batch_size == 10
    assert WorkerConfig.build(["q"], batch_size=50).batch_size == 50
