"""Alternating pairs: two checkouts of the project, measured turn about.

Three figures a user sees, each from `throughput.py` (the same functions): a drain
(a queue filled before the worker processes start; from the first job's start to the
last completion, and again from the moment the last process took its first job) at
several worker configurations, a single enqueue
(one transaction each, jobs per second), and an idle worker's pickup (enqueue to the
handler's start, p50 and p99 in ms: lower is better). Each runs in a fresh interpreter
for each checkout, with that checkout first on the import path, on a database of its
own (each migrated by its own checkout), each pair in the opposite order to the last.
The ratio after / before of each pair is what to read (for the pickup, before /
after, so that above 1 is better everywhere): this machine's rate drifts far more
between minutes than between two runs side by side.
`--before` is usually a `git worktree` of the baseline.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import DEFAULT_SERVER, ROOT, machine, parser, setup_django, write_json

# (processes, concurrency, batch size); None means the PGQUEUE defaults.
CONFIGS = [(1, None, None), (2, None, None), (4, None, None), (2, 50, 50)]
SMOKE_CONFIGS = [(1, None, None)]

MEASURE = """
import json, sys
sys.path.insert(0, "benchmarks")
import throughput
from _common import setup_django, sql
setup_django({url!r})
result = throughput.{call}
if {drain!r}:
    result = {{"rate": result, "steady": sql(STEADY)[0][0]}}
print("RESULT", json.dumps(result))
"""
# A drain's rate once every worker process is up: the jobs started after the last one's
# first start, over the time from then to the last completion. Its cold rate (from the
# first start) also counts how far apart the processes came up: at 20,000 jobs (about 4 s
# on this machine) a second process that imports for half a second longer costs ~10%.
STEADY = """
WITH first_start AS (
    SELECT max(started) AS at
    FROM (SELECT min(started_at) AS started FROM queue_attempts GROUP BY worker_id) AS w
)
SELECT count(*) / extract(epoch FROM max(a.finished_at) - first_start.at)::float8
FROM queue_attempts AS a, first_start
WHERE a.started_at >= first_start.at
GROUP BY first_start.at
"""


def measure(tree: Path, url: str, call: str) -> Any:
    """What `throughput.<call>` returns, measured by the checkout at `tree`."""
    code = f"STEADY = {STEADY!r}\n" + MEASURE.format(
        url=url, call=call, drain=call.startswith("drain(")
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{call} in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[0].removeprefix("RESULT "))


def workloads(jobs: int, smoke: bool, one_process: bool = False) -> list[tuple[str, str, str]]:
    """(name, call, the figure's key or "" for a number): what each pair measures;
    `one_process`: the drain of one process at the defaults alone."""
    drains = [
        (f"drain {list(config)}{label}", f"drain({jobs}, {', '.join(map(repr, config))})", key)
        for config in (SMOKE_CONFIGS if smoke or one_process else CONFIGS)
        for label, key in (("", "rate"), (", all workers up", "steady"))
    ]
    if one_process:
        return drains
    enqueues = 200 if smoke else 3_000
    pickups = (5, 0.05) if smoke else (200, 0.1)
    return [
        *drains,
        ("single enqueue", f"enqueue_single({enqueues})", ""),
        ("pickup p50", f"pickup_latency{pickups}", "p50_ms"),
        ("pickup p99", f"pickup_latency{pickups}", "p99_ms"),
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_pairs")
    p.add_argument("--before", type=Path, default=ROOT, help="the baseline checkout")
    p.add_argument("--after", type=Path, default=ROOT, help="the checkout measured")
    p.add_argument("--pairs", type=int, default=5, help="pairs per configuration")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    p.add_argument(
        "--one-process",
        action="store_true",
        help="only the drain of one process at the defaults (no other drain, enqueue or pickup)",
    )
    args = p.parse_args()
    url = args.database_url or f"{DEFAULT_SERVER}/pgqueue_bench_pairs"
    pairs, jobs = (1, 300) if args.smoke else (args.pairs, args.jobs)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    setup_django(url)  # this process reads the machine's figures; each drain its own
    # A database per checkout: each tree's migrations and truncates fit its own tables.
    urls = {tree: f"{url}_{tree}" for tree in trees}
    rows = []
    for n in range(pairs):
        measured: dict[str, dict[str, Any]] = {}  # call -> tree -> value, once a pair
        for name, call, key in workloads(jobs, args.smoke, args.one_process):
            order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
            if call not in measured:
                measured[call] = {tree: measure(trees[tree], urls[tree], call) for tree in order}
            values = {tree: value[key] if key else value for tree, value in measured[call].items()}
            better_low = key.endswith("_ms")  # a latency: lower is better
            ratio = (
                values["before"] / values["after"]
                if better_low
                else values["after"] / values["before"]
            )
            row = {"workload": name, **values, "ratio": ratio, "load1": os.getloadavg()[0]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for name in dict.fromkeys(row["workload"] for row in rows):
        ratios = [row["ratio"] for row in rows if row["workload"] == name]
        summary[name] = {
            "median": statistics.median(ratios),
            "geometric_mean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
            "pairs": len(ratios),
        }
        print(f"{name}: after vs before over {len(ratios)} pairs (above 1: after is better): "
              f"median {summary[name]['median']:.2f}, "
              f"geometric mean {summary[name]['geometric_mean']:.2f}")  # fmt: skip
    results = {
        "machine": machine(),
        "smoke": args.smoke,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    write_json(args.json_out, "pairs", {**results, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
