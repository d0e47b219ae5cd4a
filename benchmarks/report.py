"""Plots and the results section of benchmarks/README.md, from the scripts' JSON results.

Reads benchmarks/results/*.json (claim_plan, race, retry_storm, scale, throughput,
sustained, workflows, peers; whichever exist), draws the PNG plots into docs/images/ (headless, Agg
backend) and rewrites the part of benchmarks/README.md between the results markers: machine,
PostgreSQL version and settings, commit, each script's tables and the targets table;
and peers.py's section between the peers markers (each only from results that exist).
With --smoke it reads results/smoke/ and writes there instead (CI checks the code runs).

Run: python benchmarks/report.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import peers
from _common import RESULTS, ROOT, markdown_table

README = ROOT / "benchmarks" / "README.md"
START, END = "<!-- results:start -->", "<!-- results:end -->"
PEERS_START, PEERS_END = "<!-- peers:start -->", "<!-- peers:end -->"
CLAIM_INDEX = "queue_job_state_claim_idx"


def load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# -- plots -------------------------------------------------------------------------------


def plot_claims(claim: dict[str, Any] | None, scale: dict[str, Any] | None, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    labels = {
        "any": "article, queue = ANY(...)",
        "equality": "article, queue = $1",
        "production": "production job_claim",
    }
    if claim:
        for variant, label in labels.items():
            points = [
                (d["total"], d["variants"][variant]["execution_ms"], d["pending"])
                for d in claim["datasets"]
            ]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{label}")
        for d in claim["datasets"]:
            ax.annotate(
                f"{d['pending']:,} pending",
                (d["total"], d["variants"]["any"]["execution_ms"]),
                textcoords="offset points",
                xytext=(4, 6),
                fontsize=7,
            )
    if scale and scale.get("claim"):
        rows = scale["claim"]
        ax.plot(
            [c["total"] for c in rows],
            [c["execution_ms"] for c in rows],
            marker="s",
            linestyle="--",
            label=f"production, {rows[0]['pending']:,} pending (scale.py)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("rows in queue_job_state")
    ax.set_ylabel("EXPLAIN ANALYZE execution time, ms (median)")
    ax.set_title("Claim of 20 jobs against table size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save(fig, path)


def plot_storm(storm: dict[str, Any], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    labels = {
        "fixed": f"FixedDelay({storm['fixed_delay_s']:g} s)",
        "jitter": f"full jitter, base {storm['jitter_base_s']:g} s",
    }
    for policy, s in storm["policies"].items():
        counts = s["per_second"]
        ax.step(range(len(counts)), counts, where="post", label=f"{labels[policy]}")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("seconds since the first attempt")
    ax.set_ylabel("retries started in that second")
    ax.set_title(
        f"Retry storm: {storm['jobs']:,} jobs fail at once (dependency down {storm['down_s']:g} s)"
    )
    ax.grid(True, alpha=0.3)
    ax.legend()
    save(fig, path)


def plot_drain(throughput: dict[str, Any] | None, scale: dict[str, Any] | None, path: Path) -> None:
    bars: list[tuple[str, float, str]] = []
    for d in (throughput or {}).get("drain", []):
        bars.append(
            (
                f"{d['processes']} proc.\nc={d['concurrency']}\nb={d['batch_size']}\n"
                f"{d['jobs']:,} jobs",
                d["jobs_per_s"],
                "tab:blue",
            )
        )
    for key, color in (("drain", "tab:orange"), ("autovacuum", "tab:green")):
        d = (scale or {}).get(key) or {}
        for size in (k for k in d if k.isdigit()):
            where = "autovacuum on" if key == "autovacuum" else "autovacuum off"
            bars.append(
                (
                    f"{d['processes']} proc.\nc=b={d['concurrency']}\n"
                    f"{int(size):,} pending\n{where}",
                    d[size]["jobs_per_s"],
                    color,
                )
            )
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(8, 1.2 * len(bars)), 5.5))
    ax.bar(range(len(bars)), [b[1] for b in bars], color=[b[2] for b in bars])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    for i, (_, rate, _) in enumerate(bars):
        ax.annotate(f"{rate:,.0f}", (i, rate), ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("jobs per second (median)")
    ax.set_title(
        "Drain rate of no-op jobs per configuration: throughput.py (blue), "
        "scale.py (orange: autovacuum off, green: on)",
        fontsize=10,
    )
    ax.grid(True, axis="y", alpha=0.3)
    save(fig, path)


def plot_sustained(data: dict[str, Any], path: Path) -> None:
    """Completions per window under overload, and pickup latency, per mode."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    window = data["window_s"]
    for mode, m in data["modes"].items():
        counts = m["overload"]["completions_per_window"]
        rates = [c / window for c in counts]
        line = left.plot(
            [window * (k + 1) for k in range(len(rates))], rates, marker="o", label=mode
        )[0]
        median = m["overload"]["spread"]["median"] / window
        left.axhspan(0.75 * median, 1.25 * median, color=line.get_color(), alpha=0.08)
    left.set_ylim(bottom=0)
    left.set_xlabel(f"seconds into the overload phase (windows of {window:g} s)")
    left.set_ylabel("completions per second")
    left.set_title("Offered twice the peak: completions per window (band: median ±25%)")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=8)
    labels, groups = [], []
    for mode, m in data["modes"].items():
        for phase, name in (("half", "half the peak"), ("idle", "idle")):
            lat = m[phase]["latency"]
            labels.append(f"{mode}\n{name}")
            groups.append([lat.get(k, 0) for k in ("p50_ms", "p95_ms", "p99_ms")])
    width = 0.27
    for i, q in enumerate(("p50", "p95", "p99")):
        right.bar(
            [x + (i - 1) * width for x in range(len(groups))],
            [g[i] for g in groups],
            width,
            label=q,
        )
    right.axhline(50, color="tab:red", linestyle="--", linewidth=1, label="p99 target, half")
    right.set_xticks(range(len(labels)), labels, fontsize=7)
    right.set_ylabel("enqueue call to handler start, ms")
    right.set_title("Pickup latency")
    right.grid(True, axis="y", alpha=0.3)
    right.legend(fontsize=8)
    save(fig, path)


def save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


# -- targets -----------------------------------------------------------------------------


def targets(results: dict[str, dict[str, Any] | None]) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(figure: str, target: str, measured: str, met: bool | None) -> None:
        rows.append([figure, target, measured, {True: "met", False: "**missed**"}.get(met, "-")])

    claim = results["claim_plan"]
    if claim:
        by_name = {d["name"]: d for d in claim["datasets"]}
        first, last = claim["datasets"][0], claim["datasets"][-1]
        prod = last["variants"]["production"]
        add(
            f"production claim of 20, {last['name']}",
            "≤ 0.25 ms median",
            f"{prod['execution_ms']:.3f} ms (article's ANY "
            f"{last['variants']['any']['execution_ms']:.2f} ms, equality "
            f"{last['variants']['equality']['execution_ms']:.3f} ms)",
            prod["execution_ms"] <= 0.25,
        )
        shapes = [
            f"{name}: {d['variants']['production']['scan']}"
            + (", Sort" if d["variants"]["production"]["sort"] else "")
            for name, d in by_name.items()
        ]
        ordered = all(
            d["variants"]["production"]["scan"] == "Index Scan"
            and d["variants"]["production"]["index"] == CLAIM_INDEX
            and not d["variants"]["production"]["sort"]
            for d in claim["datasets"]
        )
        add(
            "claim plan at every size",
            f"ordered Index Scan on {CLAIM_INDEX}, no Sort",
            "; ".join(shapes),
            ordered,
        )
        ratio = prod["execution_ms"] / first["variants"]["production"]["execution_ms"]
        add(
            f"claim at {last['name']} / at {first['name']}",
            "≤ 1.3x",
            f"{ratio:.2f}x",
            ratio <= 1.3,
        )
    storm = results["retry_storm"]
    if storm:
        fixed = storm["policies"]["fixed"]["peak_1s_window"]
        jitter = storm["policies"]["jitter"]["peak_1s_window"]
        add(
            f"retry storm, {storm['jobs']:,} simultaneous failures: peak retries in 1 s",
            "full jitter ≤ 1/10 of fixed",
            f"fixed {fixed:g}, full jitter {jitter:g} ({jitter / fixed:.1%} of fixed), spread "
            f"{storm['policies']['jitter']['spread_p5_p95_s']:.0f} s (p5-p95)",
            jitter <= fixed / 10,
        )
    scale = results["scale"]
    if scale and scale.get("claim"):
        c = scale["claim"]
        ratio = c[-1]["execution_ms"] / c[0]["execution_ms"]
        add(
            f"claim at {c[-1]['total']:,} total / at {c[0]['total']:,}",
            "≤ 1.5x",
            f"{c[-1]['execution_ms']:.3f} / {c[0]['execution_ms']:.3f} ms = {ratio:.2f}x",
            ratio <= 1.5,
        )
    for key, where in (("drain", "autovacuum off"), ("autovacuum", "autovacuum on")):
        d = (scale or {}).get(key)
        if not d or "skipped" in d:
            continue
        sizes = [k for k in d if k.isdigit()]
        if len(sizes) > 1:
            add(
                f"drain at {int(sizes[-1]):,} pending / at {int(sizes[0]):,} ({where})",
                "≥ 80%",
                f"{d[sizes[-1]]['jobs_per_s']:,.0f} / {d[sizes[0]]['jobs_per_s']:,.0f} jobs/s "
                f"= {d['ratio']:.0%}",
                d["ratio"] >= 0.8,
            )
        big = d[sizes[-1]]
        if "growth" in big:
            add(
                f"queue_job_state + indexes after draining {int(sizes[-1]):,} jobs ({where})",
                "≤ 2x the size before",
                f"{big['before']['total'] / 1048576:,.0f} MB -> "
                f"{big['after']['total'] / 1048576:,.0f} MB = {big['growth']:.2f}x",
                big["growth"] <= 2,
            )
    t = results["throughput"]
    if t:
        drains = [d for d in t["drain"] if d["processes"] == 2]
        best = max(drains, key=lambda d: d["jobs_per_s"], default=None)
        default = next((d for d in drains if d["concurrency"] == "default"), None)
        bare = (
            f"; the bare-SQL loop, same run: {t['bare_loop']['jobs_per_s']:,.0f}"
            if "bare_loop" in t
            else ""
        )
        if best:
            add(
                "drain, no-op jobs, 2 worker processes, best settings",
                "≥ 27,000 jobs/s",
                f"{best['jobs_per_s']:,.0f} jobs/s (concurrency {best['concurrency']}, "
                f"batch {best['batch_size']}){bare}",
                best["jobs_per_s"] >= 27_000,
            )
        if default:
            add(
                "drain, no-op jobs, 2 worker processes, defaults",
                "≥ 10,000 jobs/s",
                f"{default['jobs_per_s']:,.0f} jobs/s",
                default["jobs_per_s"] >= 10_000,
            )
        single, bulk = t["enqueue_single"], t["enqueue_many"]
        add(
            "single enqueues, one transaction each",
            "≥ 3,400 jobs/s",
            f"{single['jobs_per_s']:,.0f} jobs/s"
            + (
                f" ({t['enqueue_single_prepared']['jobs_per_s']:,.0f} with prepared statements)"
                if "enqueue_single_prepared" in t
                else ""
            ),
            single["jobs_per_s"] >= 3_400,
        )
        add(
            f"enqueue_many of {bulk['jobs']:,} jobs",
            "≥ 100,000 jobs/s",
            f"{bulk['jobs_per_s']:,.0f} jobs/s",
            bulk["jobs_per_s"] >= 100_000,
        )
        pickup = t["pickup"]
        add(
            "pickup latency, idle worker, p50 / p99",
            "≤ 2 / ≤ 5 ms",
            f"{pickup['p50_ms']:.2f} / {pickup['p99_ms']:.2f} ms",
            pickup["p50_ms"] <= 2 and pickup["p99_ms"] <= 5,
        )
    if results.get("sustained"):
        import sustained

        for figure, target, measured, met in sustained.targets(results["sustained"]):
            add(f"sustained load, {figure}", target, measured, met == "met")
    wf = results.get("workflows")
    if wf:
        workflow_targets(wf, add)
    return rows


def workflow_targets(wf: dict[str, Any], add: Any) -> None:
    """workflows.py's rows of the targets table."""
    for e in wf.get("enqueue", []):
        add(
            f"enqueue of one workflow of {e['steps']:,} steps, {e['shape']}",
            "one round trip per level or better",
            f"{e['statements']} statement(s) for {e['levels']} levels, {e['edges']:,} edges, "
            f"{e['wall_s']:.2f} s",
            e["statements"] <= e["levels"],
        )
    for d in wf.get("drain", []):
        add(
            f"drain of {d['jobs']:,} jobs as {d['chords']} chords of 49 + callback / as plain "
            f"jobs, 1 process, concurrency {d['concurrency']}, batch {d['batch_size']}",
            "≥ 80%",
            f"{d['chord_jobs_per_s']:,.0f} / {d['plain_jobs_per_s']:,.0f} jobs/s "
            f"= {d['ratio']:.0%}",
            d["ratio"] >= 0.8,
        )
    w = wf.get("waiting")
    if w:
        same_walk = all(
            (w[k]["claim_scan"], w[k]["claim_index"]) == ("Index Scan", CLAIM_INDEX)
            for k in ("with", "without")
        )
        add(
            f"claim of 20 with {w['waiting']:,} waiting steps / without",
            "unchanged within noise (≤ 1.2x, the same ordered walk)",
            f"{w['with']['claim_ms']:.3f} / {w['without']['claim_ms']:.3f} ms = "
            f"{w['claim_ratio']:.2f}x; buffers {w['with']['claim_buffers']} / "
            f"{w['without']['claim_buffers']}",
            w["claim_ratio"] <= 1.2 and same_walk,
        )
        add(
            f"drain of {w['jobs']:,} plain jobs with {w['waiting']:,} waiting steps / without",
            "unchanged within noise (≥ 80%)",
            f"{w['with']['drain_jobs_per_s']:,.0f} / {w['without']['drain_jobs_per_s']:,.0f} "
            f"jobs/s = {w['drain_ratio']:.0%}",
            w["drain_ratio"] >= 0.8,
        )


# -- README ------------------------------------------------------------------------------


def machine_lines(results: dict[str, dict[str, Any] | None]) -> list[str]:
    lines = []
    for name, data in results.items():
        if not data:
            continue
        m = data["machine"]
        settings = ", ".join(f"{k}={v}" for k, v in sorted(m["pg_settings"].items()))
        lines.append(
            f"- `{name}`: commit `{m['commit']}`, {m['cpus']} CPUs, Python {m['python']}, "
            f"{m['platform']}, PostgreSQL {m['postgresql']} ({settings}), "
            f"yardstick {m.get('calibration_ms', float('nan')):.0f} ms, "
            f"{data['runs']} run(s) per figure"
        )
    return lines


def throughput_table(t: dict[str, Any]) -> str:
    rows = [
        ["enqueue, one transaction each", f"{t['enqueue_single']['jobs_per_s']:,.0f} jobs/s"],
        *(
            [
                [
                    'the same with OPTIONS {"prepare_threshold": 1}',
                    f"{t['enqueue_single_prepared']['jobs_per_s']:,.0f} jobs/s",
                ]
            ]
            if "enqueue_single_prepared" in t
            else []
        ),
        [
            f"enqueue_many of {t['enqueue_many']['jobs']:,}",
            f"{t['enqueue_many']['jobs_per_s']:,.0f} jobs/s",
        ],
        *[
            [
                f"drain {d['jobs']:,} no-op jobs, {d['processes']} process(es), "
                f"concurrency {d['concurrency']}, batch {d['batch_size']}",
                f"{d['jobs_per_s']:,.0f} jobs/s",
            ]
            for d in t["drain"]
        ],
        *(
            [
                [
                    f"bare-SQL loop (the ceiling), {t['bare_loop']['processes']} processes, "
                    f"batch {t['bare_loop']['batch_size']}",
                    f"{t['bare_loop']['jobs_per_s']:,.0f} jobs/s",
                ]
            ]
            if "bare_loop" in t
            else []
        ),
        [
            "pickup latency, idle worker, p50 / p99",
            f"{t['pickup']['p50_ms']:.2f} / {t['pickup']['p99_ms']:.2f} ms",
        ],
    ]
    return markdown_table(["figure", f"median of {t['runs']}"], rows)


def render(results: dict[str, dict[str, Any] | None], images: str) -> str:
    import claim_plan
    import race
    import retry_storm
    import scale
    import workflows

    parts = ["## Latest results", ""]
    parts += [
        "Generated by `benchmarks/report.py` from the JSON results; the machine each script "
        "ran on (the yardstick is `SELECT count(*) FROM generate_series(1, 1000000)` on the "
        "server, a CPU speed reference for comparing runs):",
        "",
        *machine_lines(results),
        "",
        "### Targets",
        "",
        markdown_table(["figure", "target", "measured", ""], targets(results)),
        "",
    ]
    if results["claim_plan"]:
        c = results["claim_plan"]
        parts += [
            "### claim_plan.py",
            "",
            f"Claim of {c['limit']} from queue `{c['queues'][0]}` (`= ANY` over "
            f"{', '.join(c['queues'])}); EXPLAIN (ANALYZE, BUFFERS) in a rolled-back "
            "transaction, median of "
            f'{c["runs"]} after one warm-up. "candidates ms" is the candidate selection '
            "alone; buffers are the whole statement's.",
            "",
            claim_plan.table(c),
            "",
            f"![claim time against table size]({images}/bench-claim-plan.png)",
            "",
        ]
    if results["retry_storm"]:
        s = results["retry_storm"]
        parts += [
            "### retry_storm.py",
            "",
            f"{s['jobs']:,} jobs, {s['processes']} worker processes (concurrency and batch "
            f"{s['concurrency']}), median of {s['runs']}.",
            "",
            retry_storm.table(s),
            "",
            f"![retry storm]({images}/retry-storm.png)",
            "",
        ]
    if results["race"]:
        r = results["race"]
        parts += [
            "### race.py",
            "",
            f"{r['workers']} workers, {r['jobs']} jobs, claim transaction {r['claim_ms']:g} ms, "
            f"handler {r['handler_ms']:g} ms, median of {r['runs']}.",
            "",
            race.table(r),
            "",
        ]
        for strategy in ("for_update", "skip_locked"):
            parts += [
                "<details><summary>event trace: " + race.LABELS[strategy] + "</summary>",
                "",
                race.trace_markdown(strategy, r["strategies"][strategy]["trace"]),
                "",
                "</details>",
                "",
            ]
    if results["scale"]:
        sc = results["scale"]
        intro = [
            "### scale.py",
            "",
            "Claim: the production claim of 20 with "
            f"{sc['claim'][0]['pending']:,} pending jobs among the totals shown (the rest "
            "completed), EXPLAIN ANALYZE rolled back, median of "
            f"{len(sc['claim'][0]['runs_ms'])}. Drains: jobs in insertion order, 2 "
            "`run_queue_worker --burst` processes, timed on the database clock, checked "
            f"exactly-once; median of {sc['runs']}. Sizes: `queue_job_state` heap + indexes. "
            f"Prune: {sc.get('prune', '')}.",
            "",
        ]
        av = sc.get("autovacuum") or {}
        if "machine" in av:
            settings = ", ".join(
                f"{k}={v}" for k, v in sorted(av["machine"]["pg_settings"].items())
            )
            intro += [
                f"Throwaway server: PostgreSQL {av['machine']['postgresql']} ({settings}).",
                "",
            ]
        parts += [*intro, *[t + "\n" for t in scale.tables(sc)]]
    if results["throughput"]:
        parts += [
            "### throughput.py",
            "",
            throughput_table(results["throughput"]),
            "",
            f"![drain rate]({images}/drain-rate.png)",
            "",
        ]
    if results.get("sustained"):
        import sustained

        su = results["sustained"]
        parts += [
            "### sustained.py",
            "",
            f"A producer enqueuing every 25 ms and a worker of concurrency {su['concurrency']} "
            "running 1 ms jobs, per mode; peak with a backlog, overload at twice the peak, "
            "pickup latency at half the peak and idle (from just before the enqueue call "
            "to the handler's first line). autovacuum "
            f"= {su['autovacuum']}: the dead tuples are what nothing reclaimed.",
            "",
            sustained.table(su),
            "",
            f"![sustained load]({images}/sustained.png)",
            "",
        ]
    if results.get("workflows"):
        parts += [
            "### workflows.py",
            "",
            "Enqueue: one workflow, autocommit, median of "
            f"{results['workflows']['runs']}; statements counted on the connection. Drains: one "
            "`run_queue_worker` process, plain and chord drains alternating, timed on the "
            "database clock, checked exactly-once (and each callback after its chord). Waiting "
            "rows: chains of 100 waiting steps behind a running job, in the claimed queues; "
            "the claim is EXPLAIN ANALYZE rolled back, as in claim_plan.py.",
            "",
            *[t + "\n" for t in workflows.tables(results["workflows"])],
        ]
    if results.get("multidb"):
        import multidb

        md = results["multidb"]
        load = ", ".join(f"{x:.2f}" for x in md["load"])
        parts += [
            "### multidb.py",
            "",
            f"Two queues of {md['jobs_per_queue']:,} no-op jobs, drained by `run_queue_worker "
            f"--burst`, one process per queue or one over both (concurrency and batch "
            f"{md['concurrency']} per process), on one server and on two "
            f"({md['second_server']} for the second); median of {md['runs']} alternating "
            f"runs; load average at the start {load}.",
            "",
            multidb.table(md),
            "",
        ]
    return "\n".join(parts).rstrip() + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="read and write results/smoke/")
    args = p.parse_args()
    folder = RESULTS / "smoke" if args.smoke else RESULTS
    names = (
        "claim_plan",
        "retry_storm",
        "race",
        "scale",
        "throughput",
        "sustained",
        "workflows",
        "multidb",
    )
    results = {name: load(folder, name) for name in names}
    images = folder / "images" if args.smoke else ROOT / "docs" / "images"
    if results["claim_plan"] or results["scale"]:
        plot_claims(results["claim_plan"], results["scale"], images / "bench-claim-plan.png")
    if results["retry_storm"]:
        plot_storm(results["retry_storm"], images / "retry-storm.png")
    plot_drain(results["throughput"], results["scale"], images / "drain-rate.png")
    if results["sustained"]:
        plot_sustained(results["sustained"], images / "sustained.png")
    section = render(results, "images" if args.smoke else "../docs/images")
    peer_results = load(folder, "peers")
    peer_section = ""
    if peer_results:
        peers.plot(peer_results, images / "peers.png")
        peer_section = peers.section(
            peer_results, f"{'images' if args.smoke else '../docs/images'}/peers.png"
        )
    if args.smoke:
        (folder / "README.md").write_text(section + "\n" + peer_section)
        print(f"report: {folder / 'README.md'}, plots in {images}")
        return
    text = README.read_text()
    # Each block is rewritten only from results that exist: peers.py alone redraws its own.
    if any(results.values()):
        text = replace_block(text, START, END, section)
    if peer_results:
        text = replace_block(text, PEERS_START, PEERS_END, peer_section)
    README.write_text(text)
    print(f"report: {README}, plots in {images}")


def replace_block(text: str, start: str, end: str, section: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `section`."""
    if start not in text:
        sys.exit(f"report: {README} has no {start} marker")
    before, rest = text.split(start, 1)
    after = rest.split(end, 1)[1] if end in rest else ""
    return f"{before}{start}\n{section}{end}{after}"


if __name__ == "__main__":
    main()
