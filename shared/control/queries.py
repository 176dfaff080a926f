"""Named queries: every SQL statement the engine runs lives in ``shared/control/sql/<dialect>.sql``.

File format (as procrastinate does it)::

    -- claim_due_runs --
    -- One-line description.
    INSERT INTO ... VALUES (:job_name, :now);

Parameters are written ``:name`` and turned into qmark (``?``) placeholders, the style both
sqlite3 and pyodbc take, with the parameter order recorded. A query may hold several
statements separated by a ``;`` at the end of a line; they run in order, in one
transaction, and the rows of every statement that returns rows, in order, are the result.
On PostgreSQL and SQL Server the statements of a query go to the server as one batch (one
round trip); SQLite runs them one by one inside the same transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"
DIALECTS = ("sqlite", "postgres", "mssql")

_HEADER = re.compile(r"^-- ([a-z][a-z0-9_]*) --\s*\Z")
# :name, but not ::type casts (PostgreSQL) and not inside time literals like '12:30'.
_PARAM = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)")
# Where a ':name' is text, not a parameter: comments, string literals, quoted identifiers and
# dollar-quoted bodies, scanned left to right so that whichever opens first wins (an apostrophe
# in a comment opens no string, a '--' in a string starts no comment). Reading only string
# literals once let an apostrophe in a comment swallow the text up to the next one, and every
# :name in it was silently sent as text.
_OPAQUE = re.compile(r"""
      --[^\n]*                         # line comment
    | /\*.*?\*/                        # block comment
    | '(?:[^']|'')*'                   # string literal ('' escapes; N'' and E'' end the same)
    | "(?:[^"]|"")*"                   # quoted identifier
    | (\$[A-Za-z_]*\$).*?\1            # dollar-quoted body (PostgreSQL)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Statement:
    sql: str                    # with ? placeholders
    params: tuple[str, ...]     # parameter names in placeholder order


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    text: str                   # as written, with :name parameters
    statements: tuple[Statement, ...]

    # Computed once per query (a run's path asks each of its queries for both).
    @cached_property
    def parameters(self) -> frozenset[str]:
        return frozenset(p for statement in self.statements for p in statement.params)

    @cached_property
    def batch(self) -> Statement:
        """Every statement as one batch (one round trip on PostgreSQL and SQL Server)."""
        return Statement(sql="\n".join(s.sql for s in self.statements),
                         params=tuple(p for s in self.statements for p in s.params))


def to_qmark(sql: str) -> Statement:
    """``sql`` with its ``:name`` parameters as ``?`` placeholders, and their names in order."""
    names: list[str] = []
    text = substitute_parameters(sql, lambda name: names.append(name) or "?")
    return Statement(sql=text, params=tuple(names))


def substitute_parameters(sql: str, placeholder: Callable[[str], str]) -> str:
    """``sql`` with each ``:name`` parameter (in SQL text only) replaced by ``placeholder(name)``.
    An unterminated string, identifier or comment is an error: it would hide the parameters
    after it."""
    out: list[str] = []
    position = 0
    for opaque in _OPAQUE.finditer(sql):
        out.append(_replace_params(sql[position:opaque.start()], placeholder))
        out.append(opaque.group(0))
        position = opaque.end()
    out.append(_replace_params(sql[position:], placeholder))
    return "".join(out)


def _replace_params(fragment: str, placeholder: Callable[[str], str]) -> str:
    for opener, what in (("'", "string literal"), ('"', "quoted identifier"), ("/*", "comment")):
        if opener in fragment:
            line = fragment[fragment.index(opener):].splitlines()[0]
            raise ValueError(f"unterminated {what} at: {line[:80]!r}")
    return _PARAM.sub(lambda match: placeholder(match.group(1)), fragment)


# A T-SQL module (procedure, function, view, trigger) must be the whole of its batch: from its
# CREATE OR ALTER (T-SQL only; PostgreSQL says CREATE OR REPLACE) it runs to the next GO line.
# In T-SQL text (``tsql=True``: the mssql migrations and queries) a plain CREATE or ALTER of a
# module starts one too: the forms Babelfish accepts (it refuses CREATE OR ALTER), which in the
# other dialects' text are ordinary statements ending at their ';'.
_TSQL_MODULE = re.compile(r"^\s*CREATE\s+OR\s+ALTER\s+(PROCEDURE|PROC|FUNCTION|VIEW|TRIGGER)\b", re.IGNORECASE)
_TSQL_ANY_MODULE = re.compile(r"^\s*(?:CREATE\s+(?:OR\s+ALTER\s+)?|ALTER\s+)(PROCEDURE|PROC|FUNCTION|VIEW|TRIGGER)\b",
                              re.IGNORECASE)


def _only_comments(chunk: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in chunk.splitlines())


def split_statements(text: str, *, tsql: bool = False) -> list[str]:
    """Split on ``;`` at the end of a line (our own SQL keeps to that rule), or on a line
    holding only ``GO`` (T-SQL batch separator); never inside a ``$$``-quoted body, and never
    inside a T-SQL module (``CREATE OR ALTER PROCEDURE ...``, and with ``tsql`` also ``CREATE
    PROCEDURE``/``ALTER PROCEDURE``, views, functions, triggers: runs to the next ``GO``). A chunk
    of nothing but comments is no statement."""
    module_start = _TSQL_ANY_MODULE if tsql else _TSQL_MODULE
    statements: list[str] = []
    current: list[str] = []
    in_body = False   # inside a $$-quoted function body (PostgreSQL): its ';' end no statement
    in_module = False  # inside a T-SQL module: only GO ends it
    for line in text.splitlines():
        if line.strip().upper() == "GO":
            chunk = "\n".join(current).strip()
            if chunk and not _only_comments(chunk):
                statements.append(chunk)
            current = []
            in_module = False
            continue
        if not in_module and _only_comments("\n".join(current)) and module_start.match(line):
            in_module = True
        current.append(line)
        if in_module:
            continue
        if line.split("--", 1)[0].count("$$") % 2:
            in_body = not in_body
        if in_body:
            continue
        if line.rstrip().endswith(";") and not line.lstrip().startswith("--"):
            # The ";" stays: every dialect accepts it, and T-SQL requires it after MERGE.
            statements.append("\n".join(current).strip())
            current = []
    tail = "\n".join(current).strip()
    if tail and not _only_comments(tail):
        statements.append(tail)
    return statements


def parse_query_file(text: str, *, source: str = "<sql>", tsql: bool = False) -> dict[str, Query]:
    queries: dict[str, Query] = {}
    name: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if name is None:
            return
        body = list(lines)
        while body and not body[0].strip():
            body.pop(0)
        if not body or not body[0].startswith("--"):
            raise ValueError(f"{source}: query {name!r} needs a one-line '-- description' after its name")
        description = body[0].lstrip("-").strip()
        sql = "\n".join(body[1:]).strip()
        if not sql:
            raise ValueError(f"{source}: query {name!r} is empty")
        if name in queries:
            raise ValueError(f"{source}: query {name!r} is defined twice")
        try:
            statements = tuple(to_qmark(s) for s in split_statements(sql, tsql=tsql))
        except ValueError as exc:
            raise ValueError(f"{source}: query {name!r}: {exc}") from None
        queries[name] = Query(name=name, description=description, text=sql, statements=statements)

    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            flush()
            name, lines = header.group(1), []
        elif name is not None:
            lines.append(line)
    flush()
    return queries


@lru_cache(maxsize=None)
def load_queries(dialect: str) -> dict[str, Query]:
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}")
    path = SQL_DIR / f"{dialect}.sql"
    return parse_query_file(path.read_text(encoding="utf-8"), source=str(path), tsql=dialect == "mssql")


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    path: Path

    def statements(self) -> list[str]:
        return split_statements(self.path.read_text(encoding="utf-8"), tsql=self.path.parent.name == "mssql")


@lru_cache(maxsize=None)
def load_migrations(dialect: str) -> tuple[Migration, ...]:
    """Numbered, forward-only migrations: ``NNNN_description.sql``."""
    folder = SQL_DIR / "migrations" / dialect
    migrations: list[Migration] = []
    for path in sorted(folder.glob("*.sql")):
        match = re.fullmatch(r"(\d{4})_([a-z0-9_]+)\.sql", path.name)
        if not match:
            raise ValueError(f"{path}: migration files are named NNNN_description.sql")
        migrations.append(Migration(int(match.group(1)), match.group(2).replace("_", " "), path))
    versions = [m.version for m in migrations]
    if versions != list(range(1, len(versions) + 1)):
        raise ValueError(f"{folder}: migrations must be numbered 1..n without gaps, found {versions}")
    return tuple(migrations)
