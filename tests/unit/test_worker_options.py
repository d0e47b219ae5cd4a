"""run_queue_worker refuses out-of-range options with one line naming the option.

Every case is refused before the worker is built, so no database is needed.
"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

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
