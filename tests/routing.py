"""Which steps of a statement would not be router queries on Citus, by queue.

On Citus (docs/howto/scaling-out.md), queue_jobs and queue_job_state are distributed
by queue, and queue_attempts would be once it has a queue column. A statement is a
router query, run whole on the one node holding a queue's shard, when every reference
to a distributed table can be pruned to one shard: `FOR UPDATE` and `SKIP LOCKED`
work only there. `unrouted` reads a statement the way that matters for this: it
lexes it with sqlparse (comments, strings, placeholders and casts are tokens, not
text), groups the tokens into parenthesized scopes itself (sqlparse's grouping does
not know `AS MATERIALIZED (`), and for every reference to a distributed table in
every scope (each CTE step, subquery and lateral) asks:

- a SELECT, UPDATE or DELETE reference (FROM, JOIN, UPDATE, USING) must have, in its
  own scope (not in a subquery below it), an equality of its queue column
  (`alias.queue`, or plain `queue` when it is the scope's only table) to a parameter
  (`%(queue)s`) or to another relation's `queue` column (a join on the distribution
  column, co-located). `queue = ANY(...)`, an inequality, a filter on job_id alone
  or on another column is not one;
- an INSERT must name the queue column in its column list (each row is then routed
  by its own value);
- any other mention of a distributed table (a comma join, `LOCK TABLE`) is reported,
  so a form this reading does not know fails rather than passes.

It does not check where the compared value comes from (that `claimed.queue` is the
queue of a routed row), nor that two references in one statement name the same
queue: a statement filtering each step on a different queue is passed. It checks
text, never a plan; Citus itself is not involved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlparse
from sqlparse import tokens as T

# Tables distributed by queue in the design: their rows live on the shard of their queue.
DISTRIBUTED = ("queue_jobs", "queue_job_state", "queue_attempts")
# Keywords after which a table name is a reference of that kind.
READS = {"from", "join", "using"}
WRITES = {"update"}
INSERTS = {"into"}
KINDS = {**dict.fromkeys(WRITES, "write"), **dict.fromkeys(INSERTS, "insert")}
QUERY_STARTS = {"select", "with", "insert", "update", "delete"}


@dataclass
class Scope:
    """The tokens of one parenthesized group (or the whole statement), children in place."""

    items: list[Token | Scope] = field(default_factory=list)
    # The CTE step this scope is, when it is one (else the enclosing step's name).
    step: str = ""

    def is_query(self) -> bool:
        first = next((item for item in self.items if isinstance(item, Token)), None)
        return first is not None and first.value in QUERY_STARTS


@dataclass(frozen=True)
class Token:
    kind: object
    value: str  # lowercased


DOT = Token(T.Punctuation, ".")


def _tokens(sql: str) -> list[Token]:
    statement = sqlparse.parse(sql)[0]
    return [
        Token(token.ttype, token.value.lower())
        for token in statement.flatten()
        if not token.is_whitespace and token.ttype not in T.Comment
    ]


def _scopes(tokens: list[Token]) -> Scope:
    root = Scope(step="(main)")
    stack = [root]
    for token in tokens:
        if token.value == "(" and token.kind in T.Punctuation:
            child = Scope()
            stack[-1].items.append(child)
            stack.append(child)
        elif token.value == ")" and token.kind in T.Punctuation:
            stack.pop()
        else:
            stack[-1].items.append(token)
    _name_steps(root, "(main)")
    return root


def _name_steps(scope: Scope, step: str) -> None:
    """Give each scope the name of the CTE step it is part of: `name AS [..] (scope)`."""
    scope.step = scope.step or step
    pending = None
    for i, item in enumerate(scope.items):
        if isinstance(item, Token):
            before = scope.items[i - 1] if i else None
            if item.value == "as" and isinstance(before, Token) and before.kind in T.Name:
                pending = before.value
            elif item.value not in {"materialized", "not"}:
                pending = None
            continue
        _name_steps(item, pending or scope.step)
        pending = None


def _queue_equalities(scope: Scope, parameters: frozenset[str]) -> list[str | None]:
    """Qualifiers of `queue` columns compared by equality to a parameter or a queue column.

    Looks in `scope` and in its parenthesized groups that are not queries of their own.
    `parameters` are names that stand for parameters (a function's arguments).
    """
    found: list[str | None] = []
    items = scope.items
    for i, item in enumerate(items):
        if isinstance(item, Scope):
            if not item.is_query():
                found += _queue_equalities(item, parameters)
            continue
        if item.value != "=" or item.kind not in T.Operator.Comparison:
            continue
        left = _operand_before(items, i, parameters)
        right = _value(items, i + 1, parameters)
        if left and right:
            # alias.queue = <param or x.queue>, or <param or x.queue> = alias.queue
            if left[1] == "queue" and right[0] in {"param", "queue"}:
                found.append(left[0])
            if right[0] == "queue" and left[1] in {"param", "queue"}:
                found.append(right[1])
    return found


def _value(
    items: list[Token | Scope], i: int, parameters: frozenset[str]
) -> tuple[str, str | None] | None:
    """The operand starting at items[i]: ('param', None), ('queue', qualifier) or None."""
    item = items[i] if i < len(items) else None
    if not isinstance(item, Token):
        return None
    if item.kind in T.Name.Placeholder or item.value in parameters:
        return "param", None
    dot, column = [*items[i + 1 : i + 3], None, None][:2]
    if item.kind in T.Name and dot == DOT and isinstance(column, Token):
        return ("queue", item.value) if column.value == "queue" else None
    return None


def _operand_before(
    items: list[Token | Scope], i: int, parameters: frozenset[str]
) -> tuple[str | None, str] | None:
    """The operand ending before items[i]: (qualifier or None, column), or (None, 'param').

    A cast after it (`%(queue)s::text`) is skipped.
    """
    j = i - 1
    if j >= 2 and items[j - 1] == Token(T.Punctuation, "::"):
        j -= 2
    item = items[j] if j >= 0 else None
    if not isinstance(item, Token):
        return None
    if item.kind in T.Name.Placeholder or item.value in parameters:
        return None, "param"
    if item.kind not in T.Name:
        return None
    qualifier = items[j - 2] if j >= 2 and items[j - 1] == DOT else None
    return (qualifier.value if isinstance(qualifier, Token) else None), item.value


@dataclass(frozen=True)
class Problem:
    """One reference to a distributed table that a router query could not prune."""

    step: str
    table: str
    why: str


def _references(scope: Scope) -> list[tuple[str, str, str | None, int]]:
    """(kind, table, alias, index) of the distributed tables `scope` names directly."""
    refs = []
    items = scope.items
    for i, item in enumerate(items):
        if not isinstance(item, Token) or item.value not in DISTRIBUTED:
            continue
        after = items[i + 1] if i + 1 < len(items) else None
        if after == DOT:
            continue  # a column's qualifier (queue_jobs.id), not a reference
        before = items[i - 1] if i else None
        keyword = before.value if isinstance(before, Token) else ""
        # sqlparse lexes "LEFT JOIN", "CROSS JOIN" and the like as one keyword.
        reads = keyword in READS or keyword.endswith(" join")
        kind = "read" if reads else KINDS.get(keyword, "other")
        alias = None
        j = i + 1
        if j < len(items) and items[j] == Token(T.Keyword, "as"):
            j += 1
        if j < len(items) and isinstance(items[j], Token) and items[j].kind in T.Name:
            alias = items[j].value
        refs.append((kind, item.value, alias, i))
    return refs


def _inserts_queue(scope: Scope, index: int) -> bool:
    """Whether the INSERT naming a table at items[index] lists a queue column."""
    for item in scope.items[index + 1 :]:
        if isinstance(item, Scope):
            return any(isinstance(t, Token) and t.value == "queue" for t in item.items)
    return False


def _walk(scope: Scope, parameters: frozenset[str]) -> list[Problem]:
    problems = []
    refs = _references(scope)
    equalities = _queue_equalities(scope, parameters)
    for kind, table, alias, index in refs:
        if kind == "insert":
            if not _inserts_queue(scope, index):
                problems.append(Problem(scope.step, table, "INSERT without the queue column"))
            continue
        if kind == "other":
            problems.append(Problem(scope.step, table, "named outside FROM/JOIN/UPDATE/INTO"))
            continue
        names = {alias or table} | ({table} if alias is None else set())
        alone = len(refs) == 1
        if not any(q in names or (q is None and alone) for q in equalities):
            problems.append(Problem(scope.step, table, f"{kind} without a queue equality"))
    for item in scope.items:
        if isinstance(item, Scope):
            problems += _walk(item, parameters)
    return problems


def unrouted(sql: str, parameters: tuple[str, ...] = ()) -> list[Problem]:
    """The references to distributed tables in `sql` that no queue equality routes.

    `parameters` names what stands for a parameter besides %(name)s placeholders: the
    arguments of a function whose statement `sql` is.
    """
    return _walk(_scopes(_tokens(sql)), frozenset(parameters))


def touches_job_tables(sql: str) -> bool:
    """Whether `sql` names a distributed table as a table (not in a string)."""
    return any(t.kind in T.Name and t.value in DISTRIBUTED for t in _tokens(sql))


def references(sql: str) -> list[tuple[str, str]]:
    """(step, table) of every reference to a distributed table in `sql`, in every scope."""

    def walk(scope: Scope) -> list[tuple[str, str]]:
        found = [(scope.step, table) for _, table, _, _ in _references(scope)]
        for item in scope.items:
            if isinstance(item, Scope):
                found += walk(item)
        return found

    return walk(_scopes(_tokens(sql)))
