"""The statements in this folder's .sql files, by name: one file per feature (core,
control, workflows, schedules, observability, admin), one name space.

A block starts with a line ``-- name: <name>``; the statement runs until the next
block. The name line is kept, so the statement names itself in pg_stat_activity and
the server's logs; the comment lines after it, which explain the statement to readers
of the file, are not sent (on a single enqueue they were most of the text to encode,
send and scan). Comment lines inside the statement are kept. A name defined twice, in
one file or in two, is an error at import.
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^-- name: ([a-z][a-z_]*)$", re.MULTILINE)


def load(text: str, source: str = "queries") -> dict[str, str]:
    """Split the text of a .sql file into {name: statement}; `source` names it in errors."""
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        block = text[match.start() : end]
        name = match.group(1)
        # The statement ends at its last ';'; only comments may follow it (a comment
        # there would otherwise end up inside the statement).
        body, semicolon, rest = block.rpartition(";")
        stray = [
            line
            for line in rest.splitlines()
            if line.strip() and not line.lstrip().startswith("--")
        ]
        if not semicolon or stray:
            raise ValueError(f"{source}: block {name!r} must end with ';' (then comments only)")
        if name in queries:
            raise ValueError(f"{source} defines {name!r} twice")
        header, _, statement = body.strip().partition("\n")
        lines = statement.splitlines()
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            del lines[0]
        queries[name] = "\n".join([header, *lines])
    return queries


def _between(text: str, start: str, end: str, what: str) -> str:
    """The text after `start` up to the first `end` that follows it."""
    _, started, rest = text.partition(start)
    part, ended, _ = rest.partition(end)
    if not (started and ended):
        raise ValueError(f"queries.sql: {what} is not found")
    return part


def _replace_once(text: str, old: str, new: str, what: str) -> str:
    """`text` with `new` in place of `old`, which must stand in it exactly once."""
    if text.count(old) != 1:
        raise ValueError(f"queries.sql: {what} must stand in it exactly once")
    return text.replace(old, new)


# job_claim resumed after the key (priority, run_at, job_id) of a row claimed before:
# the same priority, later in the claim index's order. The walk starts at that key
# instead of the left end of the queue's entries, where the entries of claimed jobs
# pile up, dead, until VACUUM removes them.
RESUME_MARK = "      -- job_claim_after: resume after a key\n"
RESUME_CONDITION = (
    "      AND priority = %(after_priority)s::smallint\n"
    "      AND (run_at, job_id) > (%(after_run_at)s::timestamptz, %(after_job_id)s::bigint)\n"
)


def resumed(claim: str) -> str:
    """The claim statement `claim` with the resume condition in place of its mark."""
    header, newline, body = claim.partition("\n")
    body = _replace_once(body, RESUME_MARK, RESUME_CONDITION, "job_claim's resume mark")
    return f"{header}_after{newline}{body}"


# job_claim_controlled holds only the controlled queue's steps (its budget, walk and
# candidates, then the rate window's update); job_claim's steps from claimed on and
# its rows stand at its marks, so both claims take a job with one text. Its attempts
# start at the budget's clock (the rate window's time), not at clock_timestamp().
STEPS_MARK = "-- job_claim_controlled: job_claim's claimed and opened steps\n"
ROWS_MARK = "-- job_claim_controlled: job_claim's rows"
CLAIMED = "), claimed AS (\n"
ROWS = ")\nSELECT claimed.job_id"
CLAIM_CLOCK = "clock_timestamp()"
BUDGET_CLOCK = "(SELECT at FROM budget)"


def controlled(own: str, claim: str) -> str:
    """The controlled claim `own` with the steps and rows of `claim` at its marks."""
    steps = _between(claim, CLAIMED, ROWS, "job_claim's claimed, opened and rows")
    steps = _replace_once(steps, CLAIM_CLOCK, BUDGET_CLOCK, "job_claim's opened step's clock")
    rows = ROWS.removeprefix(")\n") + claim.partition(ROWS)[2]
    if not own.endswith(ROWS_MARK):
        raise ValueError("queries.sql: job_claim_controlled must end with its rows mark")
    own = _replace_once(own, STEPS_MARK, CLAIMED + steps, "job_claim_controlled's steps mark")
    return own.removesuffix(ROWS_MARK) + rows


def load_folder(folder: Path) -> dict[str, str]:
    """Every statement of the .sql files in `folder`; a name defined in two is an error."""
    queries: dict[str, str] = {}
    where: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        for name, statement in load(path.read_text("utf-8"), path.name).items():
            if name in queries:
                raise ValueError(f"{path.name} defines {name!r}, which {where[name]} defines")
            queries[name] = statement
            where[name] = path.name
    return queries


QUERIES: dict[str, str] = load_folder(Path(__file__).parent)
QUERIES["job_claim_after"] = resumed(QUERIES["job_claim"])
QUERIES["job_claim_controlled"] = controlled(QUERIES["job_claim_controlled"], QUERIES["job_claim"])
