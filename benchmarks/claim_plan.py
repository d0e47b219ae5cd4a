"""The claim query's plan as the table grows: the design article's experiment, our schema.

Datasets, over three queues: 1K, 10K and 100K pending jobs, and 1M jobs of which the
newest 100K are pending (the rest completed); VACUUM ANALYZE after loading. For each,
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) of three claim statements, claiming 20:

- any: the article's claim, `state.queue = ANY($1::text[])` over the three queues;
- equality: the same statement with `state.queue = $1::text` (the article's control);
- production: QUERIES["job_claim"] verbatim, as the worker sends it.

Each EXPLAIN ANALYZE really claims (updates rows, inserts attempts) inside a
transaction that is rolled back, so every run sees the same dataset. One warm-up run,
then --runs (at least 5) per variant; the series of datasets is run --rounds times
(default 3) and the median is taken over all the samples of a dataset. Extra rows: the
production claim under a generic plan (what a prepared statement may switch to after
five executions), and the 1M dataset with stale statistics (analyzed while empty,
loaded, not analyzed again).

Run: python benchmarks/claim_plan.py [--smoke] [--runs 5]
"""

from __future__ import annotations

import json
import re
import statistics
import time
from typing import Any

from _common import (
    QUEUES,
    load_jobs,
    machine,
    markdown_table,
    parser,
    setup_django,
    sql,
    truncate,
    write_json,
)

LIMIT = 20

# The article's claim (benchmarks/run.ts, getClaimExplainSql), with our column names and
# %(name)s parameters. {predicate} is the only difference between variants a and b.
ARTICLE_CLAIM = """
WITH candidates AS (
    SELECT state.job_id
    FROM queue_job_state AS state
    WHERE {predicate}
      AND state.status = 'pending'
      AND state.run_at <= NOW()
    ORDER BY state.priority DESC, state.run_at ASC, state.job_id ASC
    FOR UPDATE SKIP LOCKED
    LIMIT %(limit)s::integer
),
claimed AS (
    UPDATE queue_job_state AS state
    SET status = 'running', attempts = state.attempts + 1,
        lease_version = state.lease_version + 1, locked_by = %(worker_id)s::text,
        locked_until = NOW() + (%(lease_ms)s::bigint * INTERVAL '1 millisecond'),
        updated_at = NOW()
    FROM candidates
    WHERE state.job_id = candidates.job_id
    RETURNING state.job_id, state.queue, state.priority, state.attempts,
        state.max_attempts, state.lease_version
),
attempts AS (
    INSERT INTO queue_attempts (job_id, lease_version, attempt_index, worker_id, status)
    SELECT claimed.job_id, claimed.lease_version, claimed.attempts, %(worker_id)s::text,
           'running'
    FROM claimed
    RETURNING id AS attempt_id, job_id, lease_version
)
SELECT claimed.job_id, claimed.queue, job.type, job.payload, claimed.priority,
    claimed.attempts, claimed.max_attempts, claimed.lease_version,
    attempts.attempt_id, job.created_at
FROM claimed
JOIN queue_jobs AS job ON job.id = claimed.job_id
JOIN attempts ON attempts.job_id = claimed.job_id
    AND attempts.lease_version = claimed.lease_version
ORDER BY claimed.priority DESC, claimed.job_id ASC
"""

VARIANTS: dict[str, tuple[str, str]] = {
    # name: (label, SQL)
    "any": ("article, queue = ANY(...)", "state.queue = ANY(%(queues)s::text[])"),
    "equality": ("article, queue = $1", "state.queue = %(queue)s::text"),
    "production": ("production job_claim", ""),
}

DATASETS = [
    # (name, total, pending)
    ("1K pending", 1_000, 1_000),
    ("10K pending", 10_000, 10_000),
    ("100K pending", 100_000, 100_000),
    ("1M total / 100K pending", 1_000_000, 100_000),
]
SMOKE_DATASETS = [
    ("300 pending", 300, 300),
    ("3K total / 300 pending", 3_000, 300),
]


def statement(variant: str) -> str:
    from django_pgqueue.sql import QUERIES

    if variant == "production":
        return QUERIES["job_claim"]
    return ARTICLE_CLAIM.format(predicate=VARIANTS[variant][1])


def params(variant: str) -> dict[str, Any]:
    return {
        "queue": QUEUES[0],
        "queues": list(QUEUES),
        "limit": LIMIT,
        "worker_id": "claim-plan",
        "lease": 30.0,
        "lease_ms": 30_000,
    }


def nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a plan, depth first, the root first."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(nodes(child))
    return found


def candidates_subtree(plan: dict[str, Any]) -> dict[str, Any]:
    """The candidate selection: the CTE subplan if there is one, else the LockRows node."""
    for node in nodes(plan):
        if node.get("Subplan Name") == "CTE candidates":
            return node
    for node in nodes(plan):
        if node["Node Type"] == "LockRows":
            return node
    raise ValueError("no candidate selection (CTE candidates or LockRows) in the plan")


def describe(explained: dict[str, Any]) -> dict[str, Any]:
    """The figures of one EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) result."""
    plan = explained["Plan"]
    subtree = candidates_subtree(plan)
    scans = [n for n in nodes(subtree) if "Scan" in n["Node Type"]]
    scan = scans[0] if scans else {"Node Type": "?"}
    index = next((n["Index Name"] for n in nodes(scan) if "Index Name" in n), None)
    all_types = {n["Node Type"] for n in nodes(plan)}
    candidate_types = {n["Node Type"] for n in nodes(subtree)}
    triggers = explained.get("Triggers", [])
    return {
        "execution_ms": explained["Execution Time"],
        "planning_ms": explained["Planning Time"],
        "candidates_ms": subtree.get("Actual Total Time"),
        "scan": scan["Node Type"],
        "index": index,
        "scan_rows": scan.get("Actual Rows"),
        "sort": "Sort" in all_types,
        "sort_in_candidates": "Sort" in candidate_types,
        "sort_nodes": [
            {"key": n.get("Sort Key"), "method": n.get("Sort Method")}
            for n in nodes(plan)
            if n["Node Type"] == "Sort"
        ],
        "shared_hit": plan.get("Shared Hit Blocks", 0),
        "shared_read": plan.get("Shared Read Blocks", 0),
        "candidates_hit": subtree.get("Shared Hit Blocks", 0),
        "candidates_read": subtree.get("Shared Read Blocks", 0),
        "claimed": plan.get("Actual Rows"),
        "triggers_ms": sum(t.get("Time", 0.0) for t in triggers),
        "triggers": [(t.get("Trigger Name"), t.get("Calls"), t.get("Time")) for t in triggers],
    }


class Rollback(Exception):
    """Raised to roll the explained claim back."""


def prepared(variant: str) -> tuple[str, str]:
    """PREPARE and EXECUTE statements for `variant`, its %(name)s parameters made $n."""
    values = params(variant)
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, statement(variant)).replace("%%", "%")
    literals = ", ".join(adapt(values[name]) for name in names)
    return f"PREPARE bench_claim AS {text}", f"EXECUTE bench_claim({literals})"


def adapt(value: Any) -> str:
    """A SQL literal of a parameter value (numbers, strings, lists of strings)."""
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(adapt(v) for v in value) + "]"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def explain(variant: str, *, generic: bool = False) -> dict[str, Any]:
    """EXPLAIN ANALYZE one claim in a transaction that is rolled back; its figures.

    With `generic`, the statement is PREPAREd and EXPLAIN EXECUTEd under
    plan_cache_mode = force_generic_plan: the plan built without the parameter values.
    """
    from django.db import connection, transaction

    result: dict[str, Any] = {}
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if generic:
                prepare, execute = prepared(variant)
                cursor.execute(prepare)
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + execute)
                raw = cursor.fetchone()[0]
                cursor.execute("DEALLOCATE bench_claim")
            else:
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement(variant),
                    params(variant),
                )
                raw = cursor.fetchone()[0]
            result = describe((json.loads(raw) if isinstance(raw, str) else raw)[0])
            raise Rollback
    except Rollback:
        pass
    return result


def sample(variant: str, runs: int, *, generic: bool = False) -> list[dict[str, Any]]:
    """One warm-up, then the figures of `runs` explained claims."""
    explain(variant, generic=generic)
    return [explain(variant, generic=generic) for _ in range(runs)]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The median sample's figures, with the median time and every time."""
    times = [s["execution_ms"] for s in samples]
    median = statistics.median(times)
    typical = min(samples, key=lambda s: abs(s["execution_ms"] - median))
    shapes = {(s["scan"], s["index"], s["sort"]) for s in samples}
    return {
        **typical,
        "execution_ms": median,
        "runs_ms": times,
        "min_ms": min(times),
        "max_ms": max(times),
        "same_plan_every_run": len(shapes) == 1,
    }


def measure(variant: str, runs: int, *, generic: bool = False) -> dict[str, Any]:
    """One warm-up, then `runs` explained claims: the median run's figures, and all times."""
    return summarize(sample(variant, runs, generic=generic))


def run_dataset(total: int, pending: int, runs: int, *, stale: bool = False) -> dict[str, Any]:
    """Load a dataset and sample every variant; the samples, unsummarized."""
    truncate()
    if stale:
        sql("ANALYZE queue_job_state")  # statistics of the empty table
        sql("ANALYZE queue_jobs")
    started = time.perf_counter()
    load_jobs(total, pending, analyze=not stale)
    load_s = time.perf_counter() - started
    counts = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
    assert counts.get("pending") == pending, counts
    out: dict[str, Any] = {"total": total, "pending": pending, "load_s": load_s, "samples": {}}
    for variant in VARIANTS:
        out["samples"][variant] = sample(variant, runs)
    if not stale:
        out["samples"]["production_generic"] = sample("production", runs, generic=True)
    after = dict(sql("SELECT status, count(*) FROM queue_job_state GROUP BY status"))
    assert after == counts, f"the dataset changed: {counts} -> {after}"
    return out


def merge(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One dataset's rounds: every variant summarized over the samples of all rounds."""
    variants = rounds[0]["samples"]
    return {
        "total": rounds[0]["total"],
        "pending": rounds[0]["pending"],
        "load_s": [r["load_s"] for r in rounds],
        "variants": {
            v: {
                **summarize([s for r in rounds for s in r["samples"][v]]),
                "round_medians_ms": [
                    statistics.median(s["execution_ms"] for s in r["samples"][v]) for r in rounds
                ],
            }
            for v in variants
        },
    }


def sort_label(m: dict[str, Any]) -> str:
    """Where the plan sorts: the candidates (all matching rows), the 20 claimed, nowhere."""
    if m["sort_in_candidates"]:
        return "yes: candidates"
    return "yes: the 20 claimed rows" if m["sort"] else "no"


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_claim")
    p.set_defaults(runs=5)
    p.add_argument("--no-stale", action="store_true", help="skip the stale-statistics row")
    p.add_argument("--rounds", type=int, default=3, help="times the series of datasets is run")
    args = p.parse_args()
    setup_django(args.database_url)
    runs = 3 if args.smoke else max(5, args.runs)
    rounds = 1 if args.smoke else max(1, args.rounds)
    datasets = SMOKE_DATASETS if args.smoke else DATASETS
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "rounds": rounds,
        "limit": LIMIT,
        "queues": list(QUEUES),
        "datasets": [],
    }
    # Rounds: the whole series of datasets again, so that each dataset is measured at
    # several moments and a busy spell on a shared machine does not land on one size.
    sampled: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(rounds):
        for name, total, pending in datasets:
            print(f"round {round_ + 1}/{rounds}, {name}: loading and explaining", flush=True)
            sampled.setdefault(name, []).append(run_dataset(total, pending, runs))
    results["datasets"] = [{"name": name, **merge(sampled[name])} for name, _, _ in datasets]
    if not args.no_stale:
        name, total, pending = datasets[-1]
        print(f"{name}, stale statistics: loading and explaining", flush=True)
        results["stale"] = {
            "name": f"{name}, stale statistics",
            **merge([run_dataset(total, pending, runs, stale=True)]),
        }
    truncate()

    print(table(results))
    print(f"results: {write_json(args.json_out, 'claim_plan', results)}")


def table(results: dict[str, Any]) -> str:
    """The Markdown table of a claim_plan result."""
    labels = {
        **{k: v[0] for k, v in VARIANTS.items()},
        "production_generic": "production, generic plan",
    }
    rows = []
    datasets = list(results["datasets"])
    if results.get("stale"):
        datasets.append(results["stale"])
    for dataset in datasets:
        for variant, m in dataset["variants"].items():
            rows.append(
                [
                    dataset["name"],
                    labels[variant],
                    f"{m['execution_ms']:.3f}",
                    f"{m['min_ms']:.3f}-{m['max_ms']:.3f}",
                    f"{m['candidates_ms']:.3f}",
                    m["scan"],
                    m["index"] or "-",
                    sort_label(m),
                    f"{m['shared_hit']:,} / {m['shared_read']:,}",
                ]
            )
    headers = [
        "dataset",
        "claim of 20",
        f"execution ms (median of {results['runs'] * results.get('rounds', 1)})",
        "min-max ms",
        "candidates ms",
        "candidates scan",
        "index",
        "Sort node",
        "buffers hit / read",
    ]
    return markdown_table(headers, rows)


if __name__ == "__main__":
    main()
