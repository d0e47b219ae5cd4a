"""Start to first claim: how long `run_queue_worker` takes to claim a job already due.

Each run enqueues one no-op job, reads the database's clock, starts
`manage.py run_queue_worker --burst` and takes the claim's time from the attempt row
(`started_at`, the database's clock again), so nothing of the worker is instrumented.
The same run also starts, on their own, a bare interpreter and `django.setup()` of the
test project: the differences say where the time goes. CPU seconds (user + system, of
the child process) are given beside the wall clock: on a loaded machine the wall clock
is mostly waiting for a core, and the CPU time is what an idle machine would see.

    python benchmarks/startup.py [--runs 5] [--smoke] [--json-out FILE]
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import (
    MANAGE,
    ROOT,
    machine,
    markdown_table,
    parser,
    setup_django,
    sql,
    truncate,
    write_json,
)

SETUP = (
    "import sys; sys.path[:0] = [{project!r}, {root!r}]; import django; django.setup()"
).format(project=str(ROOT / "testproject"), root=str(ROOT))


def timed(argv: list[str]) -> tuple[float, float]:
    """Run `argv`; (wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def first_claim(extra: list[str]) -> tuple[float, float]:
    """(seconds from the process start to its first claim, CPU of the whole burst run)."""
    from django_pgqueue import enqueue

    truncate()
    enqueue("qa.noop", {}, queue="startup")
    [(t0,)] = sql("SELECT clock_timestamp()")
    _, cpu = timed(
        [sys.executable, str(MANAGE), "run_queue_worker", "startup", "--burst", "-v", "0", *extra]
    )
    [(claim,)] = sql(
        "SELECT extract(epoch FROM min(started_at) - %s)::float8 FROM queue_attempts", [t0]
    )
    return float(claim), cpu


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_startup")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    # An installed package has its .pyc files (pip compiles them); a checkout run with
    # PYTHONDONTWRITEBYTECODE would compile every module of the queue at every start.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            str(ROOT / "django_pgqueue"),
            str(ROOT / "testproject"),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    env_note = "the queue's and the project's modules precompiled first, as pip does at install"
    samples: dict[str, list[tuple[float, float]]] = {
        "interpreter": [],
        "django.setup()": [],
        "first claim": [],
        "first claim, --skip-checks": [],
    }
    for _ in range(runs):
        samples["interpreter"].append(timed([sys.executable, "-c", "pass"]))
        samples["django.setup()"].append(timed([sys.executable, "-c", SETUP]))
        for name, extra in (("first claim", []), ("first claim, --skip-checks", ["--skip-checks"])):
            claim, cpu = first_claim(extra)
            samples[name].append((claim, cpu))
    result: dict[str, Any] = {
        name: {
            "wall_s": round(statistics.median(wall for wall, _ in values), 3),
            "cpu_s": round(statistics.median(cpu for _, cpu in values), 3),
            "wall_runs_s": [round(wall, 3) for wall, _ in values],
        }
        for name, values in samples.items()
    }
    result["load_average"] = os.getloadavg()
    result["note"] = env_note
    result["machine"] = machine()
    rows = [
        [name, f"{result[name]['wall_s']:.3f}", f"{result[name]['cpu_s']:.3f}"] for name in samples
    ]
    print(markdown_table(["stage (median)", "wall s", "CPU s of the process"], rows))
    print(
        "first claim: wall from the start of the process to the claim; CPU of the whole "
        "burst run (start, claim, shutdown)"
    )
    print(f"load average {result['load_average']}; {env_note}")
    result["smoke"] = args.smoke
    print(write_json(args.json_out, "startup", result))


if __name__ == "__main__":
    main()
