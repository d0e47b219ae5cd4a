"""Render docs/reliability.md from the figures `make reliability` collected.

python -m tests.reliability.report RESULTS.jsonl [docs/reliability.md] [--merge]

With --merge, the page keeps its other scenarios and only the scenarios in RESULTS
are written (replaced, or added in their place): for a run of some scenarios alone
(`make reliability PYTEST_ARGS=tests/reliability/test_x.py`). Each such row's
details say the commit it was measured at, the page's header keeping its own.
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

COLUMNS = (
    ("size", "size"),
    ("duration_s", "duration (s)"),
    ("lost", "lost"),
    ("completed_twice", "completed twice"),
    ("re_executions", "re-executions"),
    ("recovery_s", "recovery (s)"),
)
MAIN = {"scenario", "full", "passed", *(key for key, _ in COLUMNS), "notes"}

INTRO = """\
# Reliability figures

Every scenario runs real `run_queue_worker` processes (or workers in real threads)
against a real PostgreSQL; nothing is mocked. Handlers write a ledger (job, lease
version, start, end, pid) on their own autocommit connection, so executions are counted
apart from the queue's own tables. *Lost*: jobs that did not end completed (or, where
the scenario expects it, dead). *Completed twice*: jobs with more than one succeeded
attempt. *Re-executions*: handler starts beyond one per job (at-least-once delivery
after a crash; each is accounted for by a lost attempt). *Recovery*: the scenario's
worst time from the fault to the job running or completing again.

The scenarios and their pass criteria are in `tests/reliability/`; `make test` runs
them at reduced sizes, `make reliability` at the sizes below and rewrites this page.
"""


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if value < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": ")).replace("|", "\\|")
    return str(value).replace("|", "\\|")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _table_line(row: dict[str, Any]) -> str:
    cells = [_cell(row.get(key)) for key, _ in COLUMNS]
    passed = "yes" if row.get("passed") else "**NO**"
    return f"| {row['scenario']} | {passed} | " + " | ".join(cells) + " |"


def _details(row: dict[str, Any], measured_at: str = "") -> list[str]:
    extra = {key: value for key, value in row.items() if key not in MAIN}
    lines = [f"### {row['scenario']}", ""]
    if row.get("notes"):
        lines += [str(row["notes"]), ""]
    if measured_at:
        lines.append(f"- measured at: {measured_at}")
    for key, value in extra.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            headers = list(value[0])
            lines.append(f"{key.replace('_', ' ')}:")
            lines.append("")
            lines.append("| " + " | ".join(headers) + " |")
            lines.append("|" + "---|" * len(headers))
            for entry in value:
                lines.append("| " + " | ".join(_cell(entry.get(h)) for h in headers) + " |")
            lines.append("")
        else:
            lines.append(f"- {key.replace('_', ' ')}: {_cell(value)}")
    lines.append("")
    return lines


def _provenance() -> str:
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain") else ""
    server = os.environ.get("PGQUEUE_RELIABILITY_SERVER", "")
    return (
        f"Commit `{commit}`{dirty}; {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}{'; ' + server if server else ''}."
    )


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        INTRO,
        _provenance(),
        "",
        "| scenario | passed | " + " | ".join(title for _, title in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    lines += [_table_line(row) for row in rows]
    lines += ["", "## Details", ""]
    for row in rows:
        lines += _details(row)
    return "\n".join(lines).rstrip() + "\n"


def merge(page: str, rows: list[dict[str, Any]]) -> str:
    """`page` (a rendered docs/reliability.md) with the scenarios of `rows` written in:
    replaced where the page has them, else added in their numbered place."""
    head, _, details = page.partition("\n## Details\n")
    head_lines = head.rstrip("\n").split("\n")
    table_at = next(i for i, line in enumerate(head_lines) if line.startswith("|---|"))
    table = {}
    for line in head_lines[table_at + 1 :]:
        if line.startswith("| "):
            table[line[2:].split(" | ", 1)[0]] = line
    sections = {}  # each scenario's details as the page has them, to the next one
    for chunk in ("\n" + details).split("\n### ")[1:]:
        sections[chunk.split("\n", 1)[0]] = "### " + chunk
    measured_at = _provenance().rstrip(".").replace("Commit", "commit", 1)
    for row in rows:
        table[row["scenario"]] = _table_line(row)
        sections[row["scenario"]] = "\n".join(_details(row, measured_at))
    names = sorted(table, key=lambda name: _order({"scenario": name}))
    lines = [*head_lines[: table_at + 1], *(table[name] for name in names), "", "## Details", ""]
    text = "\n".join(lines) + "\n" + "\n".join(sections[n] for n in names if n in sections)
    return text.rstrip() + "\n"


def _order(row: dict[str, Any]) -> tuple[int, str]:
    match = re.match(r"(\d+)([a-z]?)", row["scenario"])
    return (int(match.group(1)), match.group(2)) if match else (1_000, "")


def main(argv: list[str]) -> int:
    merging = "--merge" in argv
    argv = [arg for arg in argv if arg != "--merge"]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    source = Path(argv[0])
    target = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "reliability.md"
    rows = [json.loads(line) for line in source.read_text("utf-8").splitlines() if line]
    rows.sort(key=_order)  # pytest runs the files alphabetically; the page goes 1..10
    if not rows:
        print(f"error: {source} holds no results", file=sys.stderr)
        return 1
    page = merge(target.read_text("utf-8"), rows) if merging else render(rows)
    target.write_text(page, "utf-8")
    failed = [row["scenario"] for row in rows if not row.get("passed")]
    print(f"wrote {target}: {len(rows)} scenario(s), {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
