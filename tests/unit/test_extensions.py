"""The seams: extensions loaded from PGQUEUE["EXTENSIONS"], the observers told in turn
(one that raises never stops the others), the middleware nested in order."""

from __future__ import annotations

import pytest

from django_pgqueue import extensions
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.extensions import (
    Extension,
    JobObserver,
    PeriodicService,
    RunMiddleware,
    WorkerParts,
)
from django_pgqueue.worker.observing import Observers, through


class Recorder(JobObserver, RunMiddleware):
    def __init__(self, name: str, log: list[tuple[str, object]]) -> None:
        self.name, self.log = name, log

    def jobs_ended(self, ends):
        self.log.append((self.name, list(ends)))

    def run(self, item, run):
        self.log.append((self.name, "before"))
        outcome = run(item.ctx, item.handler, item.policy)
        self.log.append((self.name, "after"))
        return outcome


class Raises(JobObserver):
    def jobs_ended(self, ends):
        raise RuntimeError("an observer's own bug")


class Item:
    ctx, handler, policy = "ctx", "handler", "policy"
    lost_told = False


def test_every_observer_is_told_in_order_even_after_one_raised(caplog):
    log: list[tuple[str, object]] = []
    observers = Observers([Recorder("a", log), Raises(), Recorder("b", log)])
    observers.jobs_ended([7])
    assert log == [("a", [7]), ("b", [7])]
    assert "an observer's own bug" in caplog.text
    observers.jobs_ended([])  # nothing ended: nobody is told
    assert len(log) == 2


def test_a_lost_lease_is_told_once_per_attempt():
    told = []

    class Losses(JobObserver):
        def lease_lost(self, item, detected_by):
            told.append(detected_by)

    observers = Observers([Losses()])
    item = Item()
    observers.lease_lost(item, "renewal")
    observers.lease_lost(item, "write")
    assert told == ["renewal"]


def test_middleware_nests_the_first_listed_outermost():
    log: list[tuple[str, object]] = []
    run = through([Recorder("a", log), Recorder("b", log)])
    outcome = run(Item(), lambda ctx, handler, policy: (ctx, handler, policy))
    assert outcome == ("ctx", "handler", "policy")
    assert log == [("a", "before"), ("b", "before"), ("b", "after"), ("a", "after")]
    assert through([])(Item(), lambda *args: args) == ("ctx", "handler", "policy")


def test_a_service_is_never_due_unless_it_says_so():
    assert PeriodicService().next_due() == float("inf")


def test_worker_parts_add_up_in_the_extensions_order():
    a, b = Recorder("a", []), Recorder("b", [])

    class One(Extension):
        def worker_parts(self, config, view):
            return WorkerParts(observers=(a,), middleware=(a,))

    class Two(Extension):
        def worker_parts(self, config, view):
            return WorkerParts(observers=(b,))

    parts = extensions.worker_parts(None, None, [One(), Two()])  # type: ignore[arg-type]
    assert parts.observers == (a, b)
    assert parts.middleware == (a,)
    assert parts.services == ()


class Stamp(Extension):
    def enqueue_columns(self):
        return {"traceparent": "00-stamp"}


def test_enqueue_columns_come_from_the_installed_extensions(settings):
    settings.PGQUEUE = {"EXTENSIONS": ["tests.unit.test_extensions.Stamp"]}
    assert extensions.enqueue_columns() == {"traceparent": "00-stamp"}
    settings.PGQUEUE = {"EXTENSIONS": []}
    assert extensions.installed() == ()
    assert extensions.enqueue_columns() == {}


def test_the_default_extensions_are_the_three_features(settings):
    settings.PGQUEUE = {}
    names = [type(e).__name__ for e in extensions.installed()]
    assert names == ["QueueControl", "Schedules", "Observability"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.unit.test_extensions.Missing", "cannot be imported"),
        ("tests.unit.test_extensions.Item", "is not an Extension"),
    ],
)
def test_a_bad_extension_path_is_refused_by_name(settings, path, message):
    settings.PGQUEUE = {"EXTENSIONS": [path]}
    with pytest.raises(ConfigurationError, match=message) as raised:
        extensions.installed()
    assert path in str(raised.value)


def test_the_setting_must_be_a_list_of_paths(settings):
    settings.PGQUEUE = {"EXTENSIONS": "django_pgqueue.control.extension.QueueControl"}
    with pytest.raises(ConfigurationError, match="EXTENSIONS"):
        extensions.installed()


class Overreach(Extension):
    def enqueue_columns(self):
        return {"traceparent": None, "queue": "elsewhere"}


def test_an_extension_cannot_fill_the_cores_enqueue_columns(settings):
    settings.PGQUEUE = {"EXTENSIONS": ["tests.unit.test_extensions.Overreach"]}
    with pytest.raises(ConfigurationError, match=r"\['queue'\]"):
        extensions.enqueue_columns()
