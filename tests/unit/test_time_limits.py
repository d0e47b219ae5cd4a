"""Time limits' and recycling's pieces that need no process: the options checked, the
last words of a process ended for a hard limit, a process's share of jobs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from django_pgqueue import ConfigurationError, handler
from django_pgqueue.outcomes import Dead, Retry
from django_pgqueue.worker.recycling import Recycling, resident_mib
from django_pgqueue.worker.report import read_events
from django_pgqueue.worker.signals import StopSwitch
from django_pgqueue.worker.time_limits import LastWords
from django_pgqueue.worker_config import WorkerConfig


def config(**options: Any) -> WorkerConfig:
    return WorkerConfig.build(["q"], worker_id="w", database="default", **options)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"time_limit": 0}, r"time_limit must be a finite number of seconds > 0"),
        ({"soft_time_limit": float("inf")}, r"soft_time_limit must be a finite number"),
        (
            {"soft_time_limit": 5, "time_limit": 5},
            r"soft_time_limit \(5s\) must be below time_limit \(5s\)",
        ),
    ],
)
def test_bad_time_limits_are_refused_naming_the_option(options, message):
    with pytest.raises(ConfigurationError, match=message):
        handler("unit.limited", **options)


def test_last_words_survive_the_pipe():
    words = LastWords(
        "default",
        failed=[(1, 2, 3, Retry("E", "past", "tb", delay=1.5)), (4, 5, 6, Dead("E", "x"))],
        given_back=[(7, 8, 9)],
        unstarted=[(10, 11, 12)],
    )
    assert LastWords.from_json(words.as_json()) == words


def test_reports_are_read_by_whole_lines():
    events, rest = read_events(b'{"event": "recycle"}\nnot json\n{"event": "ti')
    assert events == [{"event": "recycle"}]
    assert rest == b'{"event": "ti'


def test_a_process_never_claims_past_its_share():
    recycling = Recycling(config(max_jobs_per_process=5))
    assert recycling.room(4) == 4
    recycling.claimed(4)
    assert recycling.room(4) == 1
    assert not recycling.draining
    recycling.claimed(1)
    assert recycling.draining
    assert recycling.room(4) == 0


def test_a_process_past_its_memory_takes_no_new_job():
    assert resident_mib() > 1
    recycling = Recycling(config(max_memory_per_process=1))
    assert recycling.room(3) == 3
    switch = StopSwitch(threading.Event())
    assert recycling.done(switch, busy=False)
    assert switch.stopping.is_set()
    assert recycling.draining
    assert "--max-memory-per-process 1" in (recycling.reason or "")
