"""Alternating pairs of drains: two checkouts of the project, measured turn about.

A drain of `throughput.py` (the same function, enqueue to the last completion) runs in
a fresh interpreter for each checkout, with that checkout first on the import path, on
one database, each pair in the opposite order to the last. The ratio after / before of
each pair is what to read: this machine's rate drifts far more between minutes than
between two runs side by side. `--before` is usually a `git worktree` of the baseline.
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

DRAIN = """
import json, sys
sys.path.insert(0, "benchmarks")
import throughput
from _common import setup_django
setup_django({url!r})
print("RESULT", json.dumps(throughput.drain({jobs}, {processes}, {concurrency}, {batch})))
"""


def drain(tree: Path, url: str, jobs: int, config: tuple[Any, ...]) -> float:
    """Jobs per second of one drain by the checkout at `tree`."""
    processes, concurrency, batch = config
    code = DRAIN.format(
        url=url, jobs=jobs, processes=processes, concurrency=concurrency, batch=batch
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"drain in {tree} failed:\n{done.stderr[-3000:]}")
    return float(json.loads(lines[0].removeprefix("RESULT ")))


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_pairs")
    p.add_argument("--before", type=Path, default=ROOT, help="the baseline checkout")
    p.add_argument("--after", type=Path, default=ROOT, help="the checkout measured")
    p.add_argument("--pairs", type=int, default=5, help="pairs per configuration")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    args = p.parse_args()
    url = args.database_url or f"{DEFAULT_SERVER}/pgqueue_bench_pairs"
    pairs, jobs = (1, 300) if args.smoke else (args.pairs, args.jobs)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    setup_django(url)  # this process reads the machine's figures; each drain its own
    rows = []
    for n in range(pairs):
        for config in SMOKE_CONFIGS if args.smoke else CONFIGS:
            order = ["before", "after"] if n % 2 == 0 else ["after", "before"]
            rates = {name: drain(trees[name], url, jobs, config) for name in order}
            row = {
                "config": list(config),
                **rates,
                "ratio": rates["after"] / rates["before"],
                "load1": os.getloadavg()[0],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    ratios = [row["ratio"] for row in rows]
    summary = {
        "median": statistics.median(ratios),
        "geometric_mean": math.exp(sum(map(math.log, ratios)) / len(ratios)),
        "pairs": len(ratios),
    }
    print(f"after / before over {len(ratios)} pairs: median {summary['median']:.2f}, "
          f"geometric mean {summary['geometric_mean']:.2f}")  # fmt: skip
    results = {
        "machine": machine(),
        "smoke": args.smoke,
        "trees": {k: str(v) for k, v in trees.items()},
    }
    write_json(args.json_out, "pairs", {**results, "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
