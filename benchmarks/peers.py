"""Side by side with the peers: django-pgqueue, pgqueuer and procrastinate, in one run.

The same workloads for each system, interleaved (ours, pgqueuer, procrastinate, ours,
... for every figure), medians of --runs:

- drain of --jobs no-op jobs by 2 worker processes, at each system's defaults, and
  tuned (ours: concurrency = batch = 200; pgqueuer: batch 1000; procrastinate:
  concurrency 100; the peers' best of a sweep, see benchmarks/README.md); timed on the
  database clock and checked exactly-once in the database (ours: queue_attempts; the
  peers: their own event tables, benchmarks/peers/*_driver.py);
- single enqueue, one transaction each; bulk enqueue of 20,000 in one call;
- pickup latency of an idle worker, jobs enqueued one by one 50 ms apart: from the
  start of the enqueue call (the producer's clock, carried in the payload) to the
  handler's first line (time.time(), the same machine's clock; the handler's first
  statement would add its own round trip, through a different driver on each side);
- async drain: --async-jobs jobs whose handler awaits a 200 ms asyncio.sleep, one
  worker process with 1,000 in flight (ours: --async-concurrency 1000, batch 500;
  pgqueuer: batch 500, max_concurrent_tasks 1000);
- ours only: the bare-SQL loop of throughput.py (the ceiling the tuned drain is held to),
  run in the same rounds as the tuned drains; and the bare INSERT + NOTIFY transaction
  and the seed design's bare statements on our tables (throughput.py's floors of a
  single enqueue), in the same rounds as the single enqueues.

The peers run from their own virtual environments (benchmarks/_peer_env.py), each in its
own database: the --database-url name with _pgqueuer or _procrastinate appended. A peer
that cannot be installed or fails is skipped with a line saying why. Ratios are ours /
peer: above 1 is ours ahead for rates; for latencies, below 1 is ours ahead.

Run: python benchmarks/peers.py [--smoke] [--runs 3] [--jobs 20000]
         [--only enqueue_single,enqueue_bulk] [--peers pgqueuer]
(--only: a subset of the workloads, the JSON then holds only those figures; the bare-SQL
loop runs with drain_tuned. --peers: only these peers.)
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import async_io
import throughput
from _common import machine, markdown_table, parser, setup_django, write_json
from _peer_env import PEERS, Peer, PeerFailed, call, prepare

OURS = "django-pgqueue"
OURS_TUNED = (200, 200)  # concurrency, batch
PROCESSES = 2
# (key, label, unit, higher is better)
FIGURES = (
    ("drain_default", "drain, each at its defaults", "jobs/s", True),
    ("drain_tuned", "drain, tuned", "jobs/s", True),
    ("enqueue_single", "single enqueue, 1 transaction each", "jobs/s", True),
    ("enqueue_bulk", "bulk enqueue", "jobs/s", True),
    ("pickup_p50", "pickup latency p50, idle worker", "ms", False),
    ("pickup_p99", "pickup latency p99, idle worker", "ms", False),
    ("async_sleep", "async drain, 200 ms awaits, 1,000 in flight", "jobs/s", True),
)
# (figure, peer, target ratio ours/peer, higher is better): the targets.
TARGETS = (
    ("enqueue_single", "pgqueuer", 1.3, True),
    ("enqueue_bulk", "pgqueuer", 2.0, True),
    ("drain_default", "pgqueuer", 1.3, True),
    ("drain_tuned", "pgqueuer", 1.2, True),
    ("pickup_p50", "pgqueuer", 0.8, False),
    ("pickup_p99", "pgqueuer", 0.8, False),
    ("async_sleep", "pgqueuer", 1.2, True),
)
BARE_TARGET = 0.85  # tuned drain / bare-SQL loop
BARE_ENQUEUE_TARGET = 1.25  # time of a single enqueue / the bare INSERT + NOTIFY
BARE_SEED_TARGET = 1.2  # time of a single enqueue / the seed's bare statements, our tables
ASYNC = (1000, 500)  # in flight, batch
ASYNC_DELAY = 0.2


def sizes(smoke: bool, jobs: int, async_jobs: int = 10_000) -> dict[str, int]:
    if smoke:
        return {"jobs": 300, "singles": 50, "bulk": 500, "pickups": 10, "async_jobs": 300}
    return {
        "jobs": jobs,
        "singles": 5_000,
        "bulk": 20_000,
        "pickups": 200,
        "async_jobs": async_jobs,
    }


def ours(size: dict[str, int]) -> dict[str, Callable[[], dict[str, float]]]:
    """Our side of each workload, from throughput.py; every drain is checked exactly-once."""

    def pickup() -> dict[str, float]:
        return throughput.pickup_latency(size["pickups"], 0.05)

    return {
        "drain_default": lambda: {
            "jobs_per_s": throughput.drain(size["jobs"], PROCESSES, None, None)
        },
        "drain_tuned": lambda: {
            "jobs_per_s": throughput.drain(size["jobs"], PROCESSES, *OURS_TUNED)
        },
        "enqueue_single": lambda: {"jobs_per_s": throughput.enqueue_single(size["singles"])},
        "enqueue_bulk": lambda: {"jobs_per_s": throughput.enqueue_bulk(size["bulk"])},
        "pickup": pickup,
        "bare_loop": lambda: {"jobs_per_s": throughput.bare_drain(size["jobs"], *throughput.BARE)},
        "bare_enqueue": lambda: {"jobs_per_s": throughput.bare_enqueue_single(size["singles"])},
        "bare_seed_enqueue": lambda: {
            "jobs_per_s": throughput.bare_seed_enqueue_single(size["singles"])
        },
        "async_sleep": lambda: async_io.drain(
            size["async_jobs"],
            "bench.async_io",
            ["--async-concurrency", str(ASYNC[0])],
            {"delay": ASYNC_DELAY},
            ASYNC[1],
        ),
    }


def theirs(peer: Peer, url: str, size: dict[str, int]) -> dict[str, Callable[[], dict[str, Any]]]:
    """The peer's side of each workload: one driver command each."""
    jobs = {"url": url, "n": size["jobs"], "processes": PROCESSES}
    option, value = peer.tuned
    return {
        "drain_default": lambda: call(peer, "drain", **jobs),
        "drain_tuned": lambda: call(peer, "drain", **jobs, **{option: value}),
        "enqueue_single": lambda: call(peer, "enqueue_single", url=url, n=size["singles"]),
        "enqueue_bulk": lambda: call(peer, "enqueue_bulk", url=url, n=size["bulk"]),
        "pickup": lambda: call(peer, "pickup", url=url, count=size["pickups"], gap=0.05),
        **(
            {
                "async_sleep": lambda: call(
                    peer,
                    "async_drain",
                    url=url,
                    n=size["async_jobs"],
                    delay=ASYNC_DELAY,
                    in_flight=ASYNC[0],
                    batch=ASYNC[1],
                )
            }
            if peer.name == "pgqueuer"
            else {}
        ),
    }


def prepare_peers(
    url: str, names: str | None = None
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Install each peer (those `names` lists) and set up its database; skipped ones say why."""
    return prepare(PEERS, url, names, "peers")


WORKLOADS = (
    "enqueue_single",
    "bare_enqueue",
    "bare_seed_enqueue",
    "enqueue_bulk",
    "drain_default",
    "drain_tuned",
    "bare_loop",
    "pickup",
    "async_sleep",
)


def chosen_workloads(only: str | None) -> tuple[str, ...]:
    """The workloads --only names (all by default), in the order they run."""
    if not only:
        return WORKLOADS
    wanted = {name.strip() for name in only.split(",") if name.strip()}
    unknown = wanted - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"--only: unknown workload(s) {sorted(unknown)}; use {WORKLOADS}")
    if "enqueue_single" in wanted:
        wanted.add("bare_seed_enqueue")  # the floor it is held to, same rounds
    if "drain_tuned" in wanted:
        wanted.add("bare_loop")  # the ceiling the tuned drain is held to, same rounds
    return tuple(w for w in WORKLOADS if w in wanted)


def measure(
    runs: int,
    size: dict[str, int],
    url: str,
    info: dict[str, dict[str, Any]],
    runners: dict,
    order: tuple[str, ...] = WORKLOADS,
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every workload, every run, systems interleaved; a peer's failing workload is dropped."""
    systems: dict[str, dict[str, Callable[[], dict[str, Any]]]] = {OURS: ours(size)}
    for name, (peer, peer_url) in runners.items():
        systems[name] = theirs(peer, peer_url, size)
    samples: dict[str, dict[str, list[dict[str, Any]]]] = {name: {} for name in systems}
    # The bare-SQL loop (ours only) right after the tuned drains, in the same rounds.
    for workload in order:
        for run in range(runs):
            for name, workloads in systems.items():
                if workload not in workloads or workload in info.get(name, {}).get("failed", {}):
                    continue
                try:
                    sample = workloads[workload]()
                except PeerFailed as exc:
                    info[name].setdefault("failed", {})[workload] = str(exc)
                    samples[name].pop(workload, None)
                    print(f"peers: dropping {name}'s {workload}: {exc}", flush=True)
                    continue
                samples[name].setdefault(workload, []).append(sample)
                print(f"{workload} run {run + 1}: {name} {fmt_sample(sample)}", flush=True)
    return samples


def fmt_sample(sample: dict[str, Any]) -> str:
    if "jobs_per_s" in sample:
        return f"{sample['jobs_per_s']:,.0f} jobs/s"
    return f"p50 {sample['p50_ms']:.2f} ms, p99 {sample['p99_ms']:.2f} ms"


def figures(samples: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Median of each figure per system: {figure: {system: {"value", "runs"}}}."""
    out: dict[str, Any] = {}
    for key, _, _, _ in FIGURES:
        workload, field = (
            ("pickup", key[len("pickup_") :] + "_ms")
            if "pickup" in key
            else (
                key,
                "jobs_per_s",
            )
        )
        out[key] = {}
        for name, by_workload in samples.items():
            values = [s[field] for s in by_workload.get(workload, [])]
            if values:
                out[key][name] = {"value": statistics.median(values), "runs": values}
    return out


def ratio(results: dict[str, Any], key: str, peer: str) -> float | None:
    figure = results["figures"].get(key, {})
    if OURS not in figure or peer not in figure:
        return None
    return figure[OURS]["value"] / figure[peer]["value"]


def peer_names(results: dict[str, Any]) -> list[str]:
    return [name for name, p in results["peers"].items() if "skipped" not in p]


def table(results: dict[str, Any]) -> str:
    """One row per figure: each system's median and ours / peer."""
    names = peer_names(results)
    headers = ["figure", OURS]
    for name in names:
        p = results["peers"][name]
        headers += [f"{name} {p['version']}", f"ours / {name}"]
    rows = []
    for key, label, unit, higher in FIGURES:
        figure = results["figures"].get(key, {})
        note = "" if higher else " (lower is better: ours / peer < 1 is ours ahead)"
        row = [f"{label}{note}", value_text(figure.get(OURS), unit)]
        for name in names:
            r = ratio(results, key, name)
            row += [value_text(figure.get(name), unit), "-" if r is None else f"{r:.2f}x"]
        rows.append(row)
    return markdown_table(headers, rows)


def value_text(entry: dict[str, Any] | None, unit: str) -> str:
    if not entry:
        return "-"
    return f"{entry['value']:,.0f} {unit}" if unit == "jobs/s" else f"{entry['value']:.2f} ms"


def targets(results: dict[str, Any]) -> list[list[str]]:
    """The issue's targets: [figure, target, measured, met]."""
    rows = []
    labels = {key: label for key, label, _, _ in FIGURES}
    for key, peer, target, higher in TARGETS:
        r = ratio(results, key, peer)
        sign = "≥" if higher else "≤"
        met = None if r is None else (r >= target if higher else r <= target)
        rows.append(
            [
                f"{labels[key]}, ours / {peer}",
                f"{sign} {target:g}x",
                "not measured" if r is None else f"{r:.2f}x",
                {True: "met", False: "**missed**", None: "-"}[met],
            ]
        )
    single = results["figures"].get("enqueue_single", {}).get(OURS)
    floors = (
        ("bare_enqueue", "the bare INSERT + NOTIFY transaction", BARE_ENQUEUE_TARGET),
        ("bare_seed_enqueue", "the seed's bare statements on our tables", BARE_SEED_TARGET),
    )
    for key, label, target in floors:
        floor = results.get(key)
        if not (floor and single):
            continue
        slower = floor["value"] / single["value"]  # time per enqueue, ours / bare
        rows.append(
            [
                f"time of a single enqueue / {label}, same run",
                f"≤ {target:g}x",
                f"{single['value']:,.0f} / {floor['value']:,.0f} jobs/s = {slower:.2f}x",
                "met" if slower <= target else "**missed**",
            ]
        )
    bare = results.get("bare_loop")
    tuned = results["figures"].get("drain_tuned", {}).get(OURS)
    if bare and tuned:
        share = tuned["value"] / bare["value"]
        rows.append(
            [
                "tuned drain / the bare-SQL loop (throughput.py's ceiling), same run",
                f"≥ {BARE_TARGET:.0%}",
                f"{tuned['value']:,.0f} / {bare['value']:,.0f} jobs/s = {share:.0%}",
                "met" if share >= BARE_TARGET else "**missed**",
            ]
        )
    return rows


def plot(results: dict[str, Any], path: Any) -> None:
    """Each figure's ratio ours / peer per peer, with the issue's targets against pgqueuer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = peer_names(results)
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [ratio(results, key, name) or 0 for key, _, _, _ in FIGURES]
        xs = [x + (i - (len(names) - 1) / 2) * width for x in range(len(FIGURES))]
        bars = ax.bar(xs, values, width, label=f"ours / {name} {results['peers'][name]['version']}")
        ax.bar_label(bars, [f"{v:.2f}x" for v in values], fontsize=7)
    for key, _, target, _ in TARGETS:
        x = [k for k, _, _, _ in FIGURES].index(key)
        ax.hlines(target, x - 0.45, x + 0.45, colors="black", linestyles="--", linewidth=1)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_yscale("log")
    labels = [
        f"{label}\n({'higher' if higher else 'LOWER'} is better)" for _, label, _, higher in FIGURES
    ]
    ax.set_xticks(range(len(FIGURES)), [t.replace(", ", "\n", 1) for t in labels], fontsize=7)
    ax.set_ylabel("ours / peer (log scale)")
    ax.set_title(
        f"django-pgqueue against its peers, {results['processes']} worker processes, "
        f"{results['sizes']['jobs']:,} no-op jobs, median of {results['runs']} "
        "(dashed: the issue's target against pgqueuer)",
        fontsize=9,
    )
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def section(results: dict[str, Any], image: str) -> str:
    """The README's peers section: setup, the ratio table, the targets, the plot."""
    m = results["machine"]
    versions = ", ".join(
        f"{name} {p['version']} ({', '.join(p['requirements'][1:])}; tuned: "
        + ", ".join(f"{k} {v}" for k, v in p["tuned"].items())
        + ")"
        if "skipped" not in p
        else f"{name}: skipped ({p['skipped']})"
        for name, p in results["peers"].items()
    )
    failures = "".join(
        f" {name} failed its {workload} workload: {reason}."
        for name, p in results["peers"].items()
        for workload, reason in p.get("failed", {}).items()
    )
    size = results["sizes"]
    return "\n".join(
        [
            "### peers.py",
            "",
            f"Commit `{m['commit']}`, {m['cpus']} CPUs, PostgreSQL {m['postgresql']}, "
            f"yardstick {m.get('calibration_ms', float('nan')):.0f} ms; {versions}. "
            f"{results['processes']} worker processes; drains of {size['jobs']:,} no-op jobs; "
            f"{size['singles']:,} single enqueues; bulk enqueue of {size['bulk']:,}; "
            f"pickup of {size['pickups']} jobs 50 ms apart; async drain of "
            f"{size.get('async_jobs', 0):,} jobs awaiting {ASYNC_DELAY * 1000:.0f} ms, one "
            f"worker process, {ASYNC[0]:,} in flight; ours tuned: concurrency "
            f"{results['ours_tuned']['concurrency']}, batch {results['ours_tuned']['batch_size']}. "
            f"Median of {results['runs']}, systems interleaved.{failures}",
            "",
            table(results),
            "",
            markdown_table(["target", "wanted", "measured", ""], targets(results)),
            "",
            f"![ours against the peers]({image})",
            "",
        ]
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0], database="pgqueue_bench_peers")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs per drain run")
    p.add_argument("--async-jobs", type=int, default=10_000, help="jobs per async drain run")
    p.add_argument("--only", help=f"comma-separated workloads to run, of {', '.join(WORKLOADS)}")
    p.add_argument("--peers", help="comma-separated peers to run (default: all)")
    args = p.parse_args()
    order = chosen_workloads(args.only)
    setup_django(args.database_url)
    runs = 1 if args.smoke else args.runs
    size = sizes(args.smoke, args.jobs, args.async_jobs)
    results: dict[str, Any] = {
        "machine": machine(),
        "smoke": args.smoke,
        "runs": runs,
        "sizes": size,
        "processes": PROCESSES,
        "ours_tuned": {"concurrency": OURS_TUNED[0], "batch_size": OURS_TUNED[1]},
    }
    results["peers"], runners = prepare_peers(args.database_url, args.peers)
    samples = measure(runs, size, args.database_url, results["peers"], runners, order)
    results["figures"] = figures(samples)
    if order != WORKLOADS:
        results["only"] = list(order)
    for key in ("bare_enqueue", "bare_seed_enqueue"):
        floor = [s["jobs_per_s"] for s in samples[OURS].get(key, [])]
        if floor:
            results[key] = {"value": statistics.median(floor), "runs": floor}
    bare = [s["jobs_per_s"] for s in samples[OURS].get("bare_loop", [])]
    if bare:
        results["bare_loop"] = {"value": statistics.median(bare), "runs": bare}
        results["bare_loop"]["processes"], results["bare_loop"]["batch_size"] = throughput.BARE
    print(table(results))
    print(markdown_table(["target", "wanted", "measured", ""], targets(results)))
    print(f"results: {write_json(args.json_out, 'peers', results)}")


if __name__ == "__main__":
    sys.exit(main())
