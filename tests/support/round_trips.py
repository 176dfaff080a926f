"""Counting what the engine sends to its control database: round trips (each execute, commit and
rollback the engine asks of the driver) and bytes (the SQL text and the parameters, as UTF-8).

* :class:`CountingConnection` wraps a real driver connection (pyodbc, sqlite3) and forwards
  every attribute, reads and writes alike: ``connection.autocommit = True`` reaches the driver
  (a wrapper that kept it for itself left PostgreSQL's batches inside open transactions, and the
  benchmark's idle claims blocked each other for 30 s: issue 35).
* :class:`RecordingTsqlConnection` stands in for a SQL Server connection where there is none
  (CI, this machine): it answers each named T-SQL query with the rows a real database gave for the
  same query in the same scenario (recorded on PostgreSQL by :func:`record_answers`); a batch of
  several named queries (a completion since migration 0023, with the Store's BEGIN or COMMIT
  around it) is answered query by query, each with its count of result sets (TSQL_RESULT_SETS).
  It exists to
  count what the engine SENDS on the T-SQL path, round trips and bytes, and nothing else: its
  answers prove nothing about T-SQL's semantics (test_dialects.py parses the T-SQL, Babelfish and
  SQL Server run it).
"""

from __future__ import annotations

import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Iterator, Sequence


@dataclass
class Tally:
    """What went to the server: every execute, commit and rollback is one round trip. Bytes are
    the SQL text and the parameters' text in ``encoding``: UTF-8 for PostgreSQL and SQLite,
    UTF-16 for T-SQL (TDS sends text as UTF-16)."""

    encoding: str = "utf-8"
    executes: int = 0
    commits: int = 0
    rollbacks: int = 0
    bytes_sent: int = 0
    connections: int = 0          # connections counted: opened since, or idle in the pool then
    statements: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def round_trips(self) -> int:
        return self.executes + self.commits + self.rollbacks

    def sent(self, sql: str, params: Sequence[Any] = ()) -> None:
        size = len(sql.encode(self.encoding)) + sum(len(_param_text(p).encode(self.encoding)) for p in params)
        with self.lock:
            self.executes += 1
            self.bytes_sent += size
            self.statements.append(sql)

    def ended(self, kind: str) -> None:
        with self.lock:
            if kind == "commit":
                self.commits += 1
            else:
                self.rollbacks += 1
            self.bytes_sent += len(kind.encode(self.encoding))   # COMMIT / ROLLBACK on the wire
            self.statements.append(kind.upper())

    def snapshot(self) -> tuple[int, int, int, int, int]:
        with self.lock:
            return self.executes, self.commits, self.rollbacks, self.bytes_sent, len(self.statements)


def _param_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    return str(value)


def _params(args: Sequence[Any]) -> Sequence[Any]:
    if not args:
        return ()
    if len(args) == 1 and isinstance(args[0], (list, tuple)):
        return args[0]
    return args


class CountingCursor:
    def __init__(self, cursor: Any, tally: Tally) -> None:
        object.__setattr__(self, "_cursor", cursor)
        object.__setattr__(self, "_tally", tally)

    def execute(self, sql: str, *params: Any) -> Any:
        self._tally.sent(sql, _params(params))
        result = self._cursor.execute(sql, *params)
        return self if result is self._cursor else result

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cursor, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._cursor, name, value)


class CountingConnection:
    """A driver connection whose round trips and bytes are counted; every other attribute, read
    or written, is the driver connection's own."""

    def __init__(self, connection: Any, tally: Tally) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "_tally", tally)

    def cursor(self) -> CountingCursor:
        return CountingCursor(self._connection.cursor(), self._tally)

    def execute(self, sql: str, *params: Any) -> Any:    # sqlite3's shortcut
        self._tally.sent(sql, _params(params))
        return self._connection.execute(sql, *params)

    def commit(self) -> None:
        self._tally.ended("commit")
        self._connection.commit()

    def rollback(self) -> None:
        self._tally.ended("rollback")
        self._connection.rollback()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)


def count_connections(agent: Any, tally: Tally) -> None:
    """Every connection the agent's pool lends from now on is counted: those it opens, and those
    idle in it now (the calling thread's store gives its connection back first)."""
    agent.release()
    pool = agent.pool
    opener = pool._connect

    def open_counted() -> CountingConnection:
        with tally.lock:
            tally.connections += 1
        return CountingConnection(opener(), tally)

    with pool._cond:
        pool._connect = open_counted
        for kind, idle in pool._idle.items():
            pool._idle[kind] = [(CountingConnection(connection, tally), since) for connection, since in idle]
            with tally.lock:
                tally.connections += len(idle)


# ---------------------------------------------------------------- T-SQL without a server


class Answers:
    """Per named query, the results (column names and rows) a real database gave, in call order,
    recorded while ``recording`` is set."""

    def __init__(self) -> None:
        self._by_name: dict[str, deque[tuple[list[str], list[tuple]]]] = defaultdict(deque)
        self.lock = threading.Lock()
        self.recording = False

    def add(self, name: str, rows: list[dict[str, Any]]) -> None:
        names = list(rows[0]) if rows else []
        with self.lock:
            if self.recording:
                self._by_name[name].append((names, [tuple(row.get(c) for c in names) for row in rows]))

    def next(self, name: str) -> tuple[list[str], list[tuple]] | None:
        with self.lock:
            queue = self._by_name.get(name)
            return queue.popleft() if queue else None


def record_answers(monkeypatch: Any, answers: Answers) -> None:
    """Record what every named query returns into ``answers`` (while it is recording)."""
    from shared.control.store import Store

    original = Store._chain

    def recording(self: Any, calls: Any, *, end: bool, then: Any = ()) -> Any:
        results = original(self, calls, end=end, then=then)
        for index, ((name, _), result) in enumerate(zip([*calls, *then], results)):
            if index >= len(calls) and not result.rows:
                # A claim after a completion's COMMIT (PostgreSQL, direct mode) that found
                # nothing: the worker claims again on its own, and that answer is recorded; the
                # T-SQL path claims only that once.
                continue
            answers.add(name, [dict(row) for row in result.rows])
        return results

    monkeypatch.setattr(Store, "_chain", recording)


class RecordingTsqlCursor:
    def __init__(self, connection: "RecordingTsqlConnection") -> None:
        self._connection = connection
        self._results: list[tuple[list[str], list[tuple]] | None] = []
        self.description: Any = None
        self.rowcount = -1
        self.messages: list[Any] = []
        self._rows: list[tuple] = []

    def execute(self, sql: str, *params: Any) -> "RecordingTsqlCursor":
        from shared.control.store import TSQL_RESULT_SETS

        self._connection.tally.sent(sql, _params(params))
        names = self._connection.split(sql)
        if len(names) == 1:
            self._results = [self._connection.answer(names[0])]
        else:
            # A batch of several named queries (Store._run_tsql): each answers its count of result
            # sets, an empty one with a column still (as SQL Server describes it).
            self._results = []
            for name in names:
                columns, rows = self._connection.answer(name) or ([], [])
                if TSQL_RESULT_SETS.get(name, 1):
                    self._results.append((columns or ["_"], rows))
        self._show(self._results.pop(0) if self._results else None)
        return self

    def _show(self, answer: tuple[list[str], list[tuple]] | None) -> None:
        if answer is None:
            self.description, self._rows, self.rowcount = None, [], -1
            return
        columns, rows = answer
        self.description = [(c, None, None, None, None, None, True) for c in columns] or None
        self._rows = list(rows) if columns else []
        self.rowcount = len(self._rows)

    def fetchall(self) -> list[tuple]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> tuple | None:
        return self._rows.pop(0) if self._rows else None

    def nextset(self) -> bool:
        if not self._results:
            return False
        self._show(self._results.pop(0))
        return True

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


class RecordingTsqlConnection:
    """A T-SQL connection that records what is sent and answers from ``answers`` (see the module's
    docstring: for counting, never for semantics)."""

    def __init__(self, answers: Answers, tally: Tally, fixed: dict[str, tuple[list[str], list[tuple]]]) -> None:
        from shared.control.queries import load_queries

        self.answers = answers
        self.tally = tally
        self.fixed = fixed
        self.autocommit = False
        self.names = {query.batch.sql: name for name, query in load_queries("mssql").items()}

    def split(self, sql: str) -> list[str]:
        """The named queries a batch holds, in order (the Store's BEGIN and COMMIT around them
        aside): none for SQL that is no named query (a job's batch, a COMMIT)."""
        if sql in self.names:
            return [self.names[sql]]
        text = sql.removeprefix("BEGIN TRANSACTION;\n").removesuffix("\nCOMMIT TRANSACTION;")
        if text in self.names:
            return [self.names[text]]
        found: list[str] = []
        while text:
            match = next((known for known in self.names if text == known or text.startswith(known + "\n")), None)
            if match is None:
                return []
            found.append(self.names[match])
            text = text[len(match) + 1:]
        return found

    def answer(self, name: str) -> tuple[list[str], list[tuple]] | None:
        if name in self.fixed:
            return self.fixed[name]
        found = self.answers.next(name)
        return found if found is not None else ([], [])

    def cursor(self) -> RecordingTsqlCursor:
        return RecordingTsqlCursor(self)

    def commit(self) -> None:
        self.tally.ended("commit")

    def rollback(self) -> None:
        self.tally.ended("rollback")

    def close(self) -> None:
        pass
