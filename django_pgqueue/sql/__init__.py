"""The statements in queries.sql, by name.

A block starts with a line ``-- name: <name>``; the statement runs until the next
block. The name line is kept, so the statement names itself in pg_stat_activity and
the server's logs; the comment lines after it, which explain the statement to readers
of the file, are not sent (on a single enqueue they were most of the text to encode,
send and scan). Comment lines inside the statement are kept.
"""

from __future__ import annotations

import re
from pathlib import Path

_HEADER = re.compile(r"^-- name: ([a-z][a-z_]*)$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    """Split a queries file into {name: statement}."""
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
            raise ValueError(f"queries.sql block {name!r} must end with ';' (then comments only)")
        if name in queries:
            raise ValueError(f"queries.sql defines {name!r} twice")
        header, _, statement = body.strip().partition("\n")
        lines = statement.splitlines()
        while lines and (not lines[0].strip() or lines[0].lstrip().startswith("--")):
            del lines[0]
        queries[name] = "\n".join([header, *lines])
    return queries


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
    if claim.count(RESUME_MARK) != 1:
        raise ValueError("queries.sql: job_claim must hold the resume mark exactly once")
    header, newline, body = claim.partition("\n")
    return f"{header}_after{newline}{body.replace(RESUME_MARK, RESUME_CONDITION)}"


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
    _, claimed, rest = claim.partition(CLAIMED)
    steps, rows, after = rest.partition(ROWS)
    if not (claimed and rows and steps.count(CLAIM_CLOCK) == 1):
        raise ValueError("queries.sql: job_claim's claimed, opened and rows are not found")
    if own.count(STEPS_MARK) != 1 or not own.endswith(ROWS_MARK):
        raise ValueError("queries.sql: job_claim_controlled must hold each mark once")
    steps = CLAIMED + steps.replace(CLAIM_CLOCK, BUDGET_CLOCK)
    rows = ROWS.removeprefix(")\n") + after
    return own.replace(STEPS_MARK, steps).removesuffix(ROWS_MARK) + rows


QUERIES: dict[str, str] = load((Path(__file__).parent / "queries.sql").read_text("utf-8"))
QUERIES["job_claim_after"] = resumed(QUERIES["job_claim"])
QUERIES["job_claim_controlled"] = controlled(QUERIES["job_claim_controlled"], QUERIES["job_claim"])
