"""run_queue_worker refuses out-of-range options with one line naming the option.

Every case is refused before the worker is built, so no database is needed.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue import supervisor
from django_pgqueue.management.supervision import needs_supervisor
from tests.conftest import MANAGE

SECONDS = r"must be a finite number of seconds > 0 and at most 316,224,000 \(10 years\)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lease", "inf"], "--lease " + SECONDS + ", got inf"),
        (["--lease", "1e308"], "--lease " + SECONDS + ", got 1e[+]308"),
        (["--lease", "nan"], "--lease " + SECONDS),
        (["--lease", "0"], "--lease " + SECONDS),
        (["--poll-interval", "inf", "--sweep-interval", "inf"], "--sweep-interval " + SECONDS),
        (["--poll-interval", "inf"], "--poll-interval " + SECONDS),
        (["--job-timeout", "inf"], "--job-timeout " + SECONDS),
        (["--heartbeat-interval", "1e13"], "--heartbeat-interval " + SECONDS),
        (["--shutdown-grace", "nan"], "--shutdown-grace must be a finite number of seconds >= 0"),
        (["--shutdown-grace", "-1"], "--shutdown-grace must be a finite number of seconds >= 0"),
        (["--concurrency", "0"], "--concurrency must be an integer from 1 to 1000, got 0"),
        (["--concurrency", "100000"], "--concurrency must be an integer from 1 to 1000"),
        (["--async-concurrency", "0"], "--async-concurrency must be an integer from 1 to 10000"),
        (["--async-concurrency", "10001"], "--async-concurrency must be an integer from 1 to"),
        (["--batch-size", "0"], "--batch-size must be an integer from 1 to 10000"),
        (["--weights", "payments=-1"], "--weights: the weight of 'payments' must be an integer"),
        (["--weights", "payments=0"], "--weights: the weight of 'payments' must be an integer"),
        (["--weights", "payments=x"], "--weights: 'payments=x' is not QUEUE=WEIGHT"),
        (["--weights", "=3"], "--weights: '=3' is not QUEUE=WEIGHT"),
        (["--weights", "payments=1,payments=2"], "--weights: 'payments' is given twice"),
        (["--processes", "x"], r"--processes: expected a number of processes \(1..256\) or 'auto'"),
        (["--processes", "0"], "--processes must be an integer from 1 to 256, got 0"),
        (["--processes", "257"], "--processes must be an integer from 1 to 256, got 257"),
        (["--processes", "1.5"], "--processes: expected a number of processes"),
        # Refused by the supervisor, before any child starts.
        (["--processes", "2", "--weights", "email=2"], "weight given for 'email'"),
        (["--processes", "2", "--lease", "3", "--heartbeat-interval", "2"], "heartbeat_interval"),
        (["--processes", "3", "--metrics-port", "65534"], "the port is at most 65533"),
        (["--max-jobs-per-process", "0"], "--max-jobs-per-process must be an integer from 1"),
        (["--max-tasks-per-child", "0"], "--max-jobs-per-process must be an integer from 1"),
        (["--max-memory-per-process", "0"], "--max-memory-per-process must be an integer"),
        (
            ["--max-memory-per-child", "204800"],
            r"--max-memory-per-child is Celery's, in KiB; here it is --max-memory-per-process, "
            r"in MiB \(--max-memory-per-process 200 for 204800 KiB\)",
        ),
        (["-c", "0"], "--concurrency must be an integer from 1 to 1000, got 0"),
    ],
)
def test_bad_options_are_refused_naming_the_option(args, message):
    with pytest.raises(CommandError, match=message):
        call_command("run_queue_worker", "payments", *args, stdout=io.StringIO())


def test_a_bad_weight_is_one_line_without_a_traceback():
    done = subprocess.run(
        [sys.executable, str(MANAGE), "run_queue_worker", "payments", "--weights", "payments=-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "CommandError: --weights: the weight of 'payments' must be an integer from 1 to 1000, "
        "got -1."
    ]


def test_processes_auto_is_the_cpus_this_process_may_use():
    assert supervisor.parse_processes("auto") == supervisor.available_cpus()
    assert supervisor.parse_processes(" AUTO ") == supervisor.available_cpus()
    assert 1 <= supervisor.available_cpus() <= supervisor.MAX_PROCESSES
    if hasattr(os, "sched_getaffinity"):
        assert supervisor.available_cpus() == min(len(os.sched_getaffinity(0)), 256)
    assert supervisor.parse_processes("3") == 3


def test_restart_delays_double_up_to_the_cap():
    delays = [supervisor.restart_delay(n) for n in range(10)]
    assert delays[:6] == [0.5, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert delays[-1] == supervisor.RESTART_DELAY_MAX


@pytest.mark.parametrize(
    ("codes", "status"),
    [([0, 0], 0), ([0, 1], 1), ([1, 69], 69), ([0, -9], 137), ([-15, 1], 143), ([], 0)],
)
def test_the_supervisor_exit_says_why_a_child_failed(codes, status):
    assert supervisor.exit_status(codes) == status


def test_exit_descriptions():
    assert supervisor.describe_exit(-9) == "killed by SIGKILL"
    assert supervisor.describe_exit(3) == "exit code 3"


def test_processes_need_a_settings_module(monkeypatch):
    from django.conf import settings

    # What settings.configure() leaves: no module a child could set Django up from.
    monkeypatch.setattr(settings._wrapped, "SETTINGS_MODULE", None)
    with pytest.raises(CommandError, match="--processes needs a settings module"):
        call_command("run_queue_worker", "payments", "--processes", "2", stdout=io.StringIO())


@pytest.mark.parametrize(
    ("options", "pgqueue", "expected"),
    [
        ({}, {}, False),
        ({"max_jobs_per_process": 5}, {}, True),
        ({"max_memory_per_process": 200}, {}, True),
        ({}, {"TIME_LIMIT": 60}, True),
        ({}, {"SOFT_TIME_LIMIT": 60}, False),  # a soft limit needs no process ended
    ],
)
def test_recycling_or_a_hard_limit_runs_the_worker_under_a_supervisor(
    settings, options, pgqueue, expected
):
    settings.PGQUEUE = pgqueue
    given = {"max_jobs_per_process": None, "max_memory_per_process": None, **options}
    assert needs_supervisor(given) is expected
