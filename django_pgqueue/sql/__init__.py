"""The statements in this folder's .sql files, by name: one file per feature (core,
control, workflows, schedules, observability, admin, durable), one name space.

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


def load(text: str, source: str = "<text>") -> dict[str, str]:
    """Split the text of a .sql file into {name: statement}; `source` names it in errors.

    Only comments may stand before the first block.
    """
    queries: dict[str, str] = {}
    matches = list(_HEADER.finditer(text))
    before = text[: matches[0].start()] if matches else text
    if any(line.strip() and not line.lstrip().startswith("--") for line in before.splitlines()):
        raise ValueError(f"{source}: only comments may stand before the first block")
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
