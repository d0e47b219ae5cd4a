"""The extension seam: hooks sorted by point once, loaded from PGQUEUE["EXTENSIONS"]."""

from __future__ import annotations

import math

import pytest

from django_pgqueue import extensions
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.extensions import Extension, Hooks, WorkerHooks


class Recorder(WorkerHooks):
    def __init__(self, name: str, log: list[tuple[str, object]]) -> None:
        self.name, self.log = name, log

    def completed(self, done):
        self.log.append((self.name, list(done)))

    def run_attempt(self, item, run):
        self.log.append((self.name, "before"))
        outcome = run(item.ctx, item.handler, item.policy)
        self.log.append((self.name, "after"))
        return outcome

    def short_claim(self, queue, poll_interval):
        return {"a": 0.5, "b": 0.2}[self.name]


class Item:
    ctx, handler, policy = "ctx", "handler", "policy"


def test_a_point_nobody_hooks_is_a_no_op_and_one_hook_is_called_directly():
    hooks = Hooks([])
    hooks.completed([1])  # nothing to call, nothing raised
    assert hooks.claimer is None
    assert hooks.write_now is None
    assert hooks.next_pass() == math.inf
    assert hooks.settled()
    assert hooks.resumable("q")
    log: list[tuple[str, object]] = []
    one = Recorder("a", log)
    hooks = Hooks([one])
    assert hooks.completed == one.completed  # the bound method itself, no fan-out
    hooks.completed([1])
    assert log == [("a", [1])]


def test_every_hook_of_a_point_is_called_in_order_and_answers_combine():
    log: list[tuple[str, object]] = []
    hooks = Hooks([Recorder("a", log), Recorder("b", log)])
    hooks.completed([7])
    assert log == [("a", [7]), ("b", [7])]
    assert hooks.short_claim("q", 1.0) == 0.2  # the soonest retry wins
    log.clear()
    outcome = hooks.run_attempt(Item(), lambda ctx, handler, policy: (ctx, handler, policy))
    assert outcome == ("ctx", "handler", "policy")
    assert log == [("a", "before"), ("b", "before"), ("b", "after"), ("a", "after")]


def test_two_features_cannot_both_take_over_the_claim():
    class Claiming(WorkerHooks):
        def claim(self, store, done, request):
            return None

    with pytest.raises(ConfigurationError, match="Two extensions take over the claim"):
        Hooks([Claiming(), Claiming()])


def test_a_periodic_pass_runs_only_when_due():
    ran = []

    class Pass(WorkerHooks):
        def __init__(self, due: float) -> None:
            self.due = due

        def next_pass(self):
            return self.due

        def periodic(self, now):
            ran.append(self.due)

    hooks = Hooks([Pass(5.0), Pass(10.0)])
    assert hooks.next_pass() == 5.0
    hooks.periodic(7.0)
    assert ran == [5.0]


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


def test_a_next_pass_without_a_periodic_pass_is_never_due():
    class Clock(WorkerHooks):
        def next_pass(self):
            return 0.0  # would be due for ever: nothing would ever run its pass

    assert Hooks([Clock()]).next_pass() == math.inf


class Overreach(Extension):
    def enqueue_columns(self):
        return {"traceparent": None, "queue": "elsewhere"}


def test_an_extension_cannot_fill_the_cores_enqueue_columns(settings):
    settings.PGQUEUE = {"EXTENSIONS": ["tests.unit.test_extensions.Overreach"]}
    with pytest.raises(ConfigurationError, match=r"\['queue'\]"):
        extensions.enqueue_columns()
