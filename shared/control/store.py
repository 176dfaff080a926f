"""The store: runs named queries of one dialect on one connection, and migrates the schema.

A Store owns one connection and is used by one thread at a time (the executor's
heartbeat opens its own). Outside ``transaction()`` each named query commits on its own.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterator, Mapping, Sequence

from shared.control.db import DatabaseTarget, connector
from shared.control.queries import _TSQL_ANY_MODULE, Query, load_migrations, load_queries
from shared.control.sqlerrors import classify, describe
from shared.control.transaction_control import postgres_transaction_statement, refused_message
from shared.errors import AgentError, LeaseLost, OwnerError, SchemaError, TransactionControlRefused
from shared.jobs.params import NAME_EXPECTED, name_problem

UTC = timezone.utc
_TIME_SUFFIXES = ("_at", "_for", "_until")


@dataclass
class Result:
    rows: list[dict[str, Any]] = field(default_factory=list)
    rowcount: int = 0
    returns_rows: bool = False

    def one(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return next(iter(self.rows[0].values())) if self.rows else None


class Store:
    def __init__(self, target: DatabaseTarget, connect: Callable[[], Any] | None = None, *,
                 job_principal: str | None = None, pool: Any = None, kind: str = "work",
                 control: bool = True) -> None:
        """``pool``: the process's ConnectionPool (shared.control.pool): the connection is taken from it
        on the first statement and given back by close(), within AGENT_MAX_CONNECTIONS; ``kind``
        is the pool's share it comes from. Without one, ``connect`` opens a connection of the
        store's own (a job's target database, a one-off command). ``control``: False for a job's
        own database (a task's @database, a fleet target), whose agent schema, if it has one, the
        agent trusts only when its own login owns it (see _owned_session_mark)."""
        self.target = target
        self.pool = pool
        self.kind = kind
        # AGENT_JOB_PRINCIPAL: the principal a job's SQL runs as (no rights on schema agent).
        self.job_principal = job_principal
        # A job ran on this connection as another principal (its owner, AGENT_JOB_PRINCIPAL): once
        # its transaction ends, committed or rolled back, the connection is closed, never reused,
        # so that nothing the job left in the session (settings, cursors, prepared statements,
        # temporary objects, listeners, session locks, loaded modules) is ever met by the agent's
        # own statements (docs/tsql.md, "The owner boundary").
        self._owned_session = False
        self.control = control
        self.dialect = target.dialect
        self.queries: dict[str, Query] = load_queries(self.dialect)
        self._connect = connect or connector(target)
        self._connection: Any = None
        self._active_cursor: Any = None
        self._active_thread: int | None = None
        # close() was called from another thread while a statement ran: done when it ends.
        self._close_when_idle = False
        # SQL Server dialect: (session id, whether the server is Babelfish, the database user)
        # of the current connection, asked before its first job (session_identity); None until then.
        self._session: tuple[int, bool, str] | None = None
        # PostgreSQL, a store without a pool: the job's search_path and when it was read
        # (_job_search_path; a pooled store keeps it on its pool).
        self._job_path: tuple[str, float] | None = None
        self._in_transaction = False
        # commit_with() ran the open transaction's last calls: nothing more runs in it, and on
        # PostgreSQL (whose batch committed it) transaction() does not commit it again.
        self._transaction_ended = False
        # SQL Server: the connection is in autocommit mode outside transaction(); a transaction's
        # BEGIN TRANSACTION rides on its first batch (pending until then), and its COMMIT on the
        # batch of commit_with() when that batch could carry it (_tsql_committed).
        self._tsql_begin = False
        self._tsql_committed = False
        # PostgreSQL: the id of the transaction a job's SQL ran in (taken in the job's own batch,
        # before the job), for check_work_transaction; None when there is nothing to compare (no
        # job ran in this transaction, or it ran where it cannot end one).
        self.work_transaction: int | None = None
        # Guards _active_cursor: cancel() (another thread) never touches a cursor being closed.
        self._lock = threading.Lock()
        # Round trips sent (one per statement batch) and commits: the benchmark's counters.
        self.statements_executed = 0
        self.commits = 0
        # Telemetry hook: called with (query name, duration ms, success, operation id) after
        # every named query; the executor sets operation_id while it works on a run.
        self.observer: Callable[[str, float, bool, str | None], None] | None = None
        self.operation_id: str | None = None

    # ------------------------------------------------------------ connection

    @property
    def connection(self) -> Any:
        if self._connection is None:
            self._connection = self._connect() if self.pool is None else self.pool.take(self.kind)
        return self._connection

    @property
    def connected(self) -> bool:
        return self._connection is not None

    def close(self) -> None:
        """Done with the connection for now: back to the pool (the next statement takes one
        again), or closed when the store has no pool. Inside a transaction it is closed instead
        (whatever was begun is rolled back by the server).

        Called from another thread while this store's statement runs (the process ends while a
        worker is still in a statement), the close waits for the statement to end: closing a
        connection under a running statement crashes the sqlite3 module (a segmentation fault)
        and is undefined for ODBC drivers."""
        with self._lock:
            if self._active_cursor is not None and self._active_thread != threading.get_ident():
                self._close_when_idle = True
                return
        self._release(keep=not self._in_transaction)

    def _release(self, *, keep: bool) -> None:
        keep, self._owned_session = keep and not self._owned_session, False
        with self._lock:
            connection, self._connection = self._connection, None
            self._active_cursor = None
            self._session = None
            if connection is not None and self.pool is None:
                with contextlib.suppress(Exception):
                    connection.close()   # under the lock: never while cancel() is using it
        if connection is None or self.pool is None:
            return
        # A cancel() in flight held the lock: none can reach this connection any more. The pool
        # refuses one that is still inside a transaction (ConnectionPool.give).
        if keep:
            self.pool.give(self.kind, connection)
        else:
            self.pool.discard(self.kind, connection)

    def __del__(self) -> None:
        # A store dropped with a pooled connection (its thread ended without releasing it):
        # the place in AGENT_MAX_CONNECTIONS is freed, the connection closed. Not while the
        # interpreter is exiting: a daemon thread (the pool's reaper, woken by a discard) freezes
        # there holding the pool's lock, and the next discard waited for it forever (a CLI
        # command that never exited); the process's end closes its connections anyway.
        if sys.is_finalizing():
            return
        connection = getattr(self, "_connection", None)
        pool = getattr(self, "pool", None)
        if connection is not None and pool is not None:
            self._connection = None
            try:
                # Never blocking: a finalizer that waits on a lock held by a thread frozen at
                # interpreter exit hangs the process for good (six racing init-db did, 1 in 3).
                pool.discard(self.kind, connection, wait_seconds=FINALIZER_LOCK_SECONDS)
            except Exception:  # noqa: BLE001 - at interpreter exit the pool may be half gone
                pass

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _discard_connection(self) -> None:
        """After a failure the connection may be broken; reconnect on next use."""
        self._release(keep=False)

    # ------------------------------------------------------------ time values

    def db_time(self, value: datetime | None) -> Any:
        if value is None:
            return None
        value = value.astimezone(UTC) if value.tzinfo else value
        naive = value.replace(tzinfo=None)
        if self.dialect == "sqlite":
            # isoformat, not strftime: %Y writes year 999 as "999" (glibc), which no reader takes back.
            return naive.isoformat(sep=" ", timespec="milliseconds")
        return naive

    def json_time(self, value: datetime | None) -> str | None:
        """A timestamp inside a JSON parameter (text the SQL casts back)."""
        if value is None:
            return None
        converted = self.db_time(value)
        if isinstance(converted, str):
            return converted
        return converted.isoformat(sep=" ", timespec="microseconds")

    def _convert_param(self, value: Any) -> Any:
        if isinstance(value, datetime):
            return self.db_time(value)
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (list, dict)):
            return json.dumps(value, default=str)
        return value

    def _convert_row(self, names: Sequence[str], values: Sequence[Any]) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for name, value in zip(names, values):
            if isinstance(value, datetime):
                value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
            elif isinstance(value, str) and self.dialect == "sqlite" and name.endswith(_TIME_SUFFIXES):
                value = datetime.fromisoformat(value).replace(tzinfo=UTC)
            row[name] = value
        return row

    # ------------------------------------------------------------ execution

    def execute(self, name: str, **params: Any) -> Result:
        """Run one named query. Outside ``transaction()`` it commits on its own; a query of
        several statements is one transaction (and, on PostgreSQL and SQL Server, one batch)."""
        return self.chain((name, params))[0]

    def chain(self, *calls: tuple[str, Mapping[str, Any]]) -> list[Result]:
        """Run several named queries in order, in one transaction, and return one Result each.

        On PostgreSQL they go to the server as a single batch (one round trip: the server
        answers one result per statement, so each query's rows are found by counting its
        statements). SQL Server answers only the statements that return rows, so there, as on
        SQLite, the queries run one after another in the same transaction."""
        return self._chain(calls, end=False)

    def commit_with(self, *calls: tuple[str, Mapping[str, Any]],
                    then: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> list[Result]:
        """Inside ``transaction()``: the last calls of the transaction. On PostgreSQL their batch
        ends with ``COMMIT`` (one round trip, not two): a statement that raises stops the batch
        before the COMMIT, and the transaction block rolls everything back; so on PostgreSQL
        every call whose refusal must undo the work (a fence) has to raise in SQL, not merely
        return no row. Elsewhere the transaction block's end commits, as for chain() (the
        caller's checks of the results still come first). Nothing more may run in the
        transaction after it.

        ``then`` (PostgreSQL only, see :meth:`can_run_after_commit`): calls that ride on the same
        batch AFTER its COMMIT, each statement in an implicit transaction of its own that the
        server commits at the batch's end; their results follow the calls'. They run only if the
        COMMIT did (a refusal before it stops the batch). One of them that fails after the COMMIT
        is raised as :class:`AfterCommitFailed` (the transaction committed; what they did rolled
        back), never as the transaction's failure."""
        if not self._in_transaction:
            raise AgentError("commit_with must run inside a transaction")
        if not then:
            return self._chain(calls, end=True)
        if not self.can_run_after_commit():
            raise AgentError("commit_with(then=...) runs on PostgreSQL only, after a job's work in this transaction")
        work_transaction = self.work_transaction
        try:
            return self._chain(calls, end=True, then=then)
        except (LeaseLost, TransactionControlRefused):
            raise                     # raised before the COMMIT, by design (the fences)
        except Exception as exc:
            # psqlODBC raises an error of any statement of the batch from execute(), and the
            # results before it are lost: whether the COMMIT ran is asked of the server (the
            # job's transaction id: committed, or not). Only on this rare path: a round trip more.
            if _connection_lost(exc) or not self._committed(work_transaction):
                raise
            self._end_transaction()
            raise AfterCommitFailed(exc) from exc

    def can_run_after_commit(self) -> bool:
        """commit_with(then=...) may be used: PostgreSQL, a job's work in this transaction (its
        id known, so that a failure after the COMMIT can be told from one before it), and a
        session that is the agent's own (not the one an owned run used: that connection is
        closed after the transaction, and the agent's own statements never run in it after)."""
        return (self.dialect == "postgres" and self._in_transaction and self.work_transaction is not None
                and not self._owned_session and not self._transaction_ended)

    def _committed(self, transaction: int | None) -> bool:
        """PostgreSQL, after a batch with a COMMIT failed: did ``transaction`` commit?"""
        if transaction is None:
            return False
        try:
            cursor = self.connection.cursor()
            try:
                # Refused (25P02) while the failed transaction block is still open: not committed.
                cursor.execute("SELECT txid_status(CAST(? AS BIGINT))", transaction)
                self.statements_executed += 1
                row = cursor.fetchone()
            finally:
                cursor.close()
        except Exception:  # noqa: BLE001 - cannot tell: the failure is raised as it came
            return False
        return bool(row) and row[0] == "committed"

    def _chain(self, calls: Sequence[tuple[str, Mapping[str, Any]]], *, end: bool,
               then: Sequence[tuple[str, Mapping[str, Any]]] = ()) -> list[Result]:
        if self._transaction_ended:
            raise AgentError("the transaction was committed (commit_with): nothing more may run in it")
        queries = [(self._query(name, params), params) for name, params in calls]
        after = [(self._query(name, params), params) for name, params in then]
        started = time.perf_counter()
        success = False
        try:
            single = len(queries) == 1 and len(queries[0][0].statements) == 1
            if self._in_transaction or single:
                results = self._run(queries, commit=not self._in_transaction, end=end, after=after)
            else:
                with self.transaction():
                    # SQL Server: BEGIN and COMMIT ride on the batch when it can carry them (one
                    # round trip; XACT_ABORT ON rolls all of it back on an error).
                    results = self._run(queries, commit=False, end=self.dialect == "mssql")
            success = True
            return results
        finally:
            if self.observer is not None:
                elapsed = (time.perf_counter() - started) * 1000
                for query, _ in [*queries, *after]:
                    with contextlib.suppress(Exception):  # telemetry never breaks the work
                        self.observer(query.name, elapsed / (len(queries) + len(after)), success, self.operation_id)

    def _query(self, name: str, params: Mapping[str, Any]) -> Query:
        query = self.queries.get(name)
        if query is None:
            raise AgentError(f"no query named {name!r} for {self.dialect}")
        missing = query.parameters - params.keys()
        if missing:
            raise TypeError(f"query {name!r} needs parameters {sorted(missing)}")
        return query

    def _run(self, queries: Sequence[tuple[Query, Mapping[str, Any]]], *, commit: bool,
             end: bool = False, after: Sequence[tuple[Query, Mapping[str, Any]]] = ()) -> list[Result]:
        """``end``: commit the open transaction after the queries (commit_with); ``after``
        (PostgreSQL, with ``end``): queries of the same batch after its COMMIT."""
        try:
            if self.dialect == "postgres":
                sql = "\n".join(query.batch.sql for query, _ in queries)
                if end:
                    # The transaction's COMMIT rides on the batch: the server runs it only if every
                    # statement before it succeeded (a failed one stops the batch there).
                    sql += "\nCOMMIT;"
                    if after:
                        sql += "\n" + "\n".join(query.batch.sql for query, _ in after)
                values = [self._convert_param(params[p]) for query, params in [*queries, *after]
                          for p in query.batch.params]
                parts = self._execute_statement(sql, values)
                results, position = [], 0
                for index, (query, _) in enumerate([*queries, *after]):
                    if index == len(queries):
                        position += 1          # the COMMIT's own result
                    count = len(query.statements)
                    results.append(_merge(parts[position:position + count]))
                    position += count
            elif self.dialect == "mssql":
                results = self._run_tsql(queries, end=end)
            else:
                results = []
                for query, params in queries:
                    parts: list[Result] = []
                    for statement in query.statements:
                        values = [self._convert_param(params[p]) for p in statement.params]
                        parts += self._execute_statement(statement.sql, values)
                    results.append(_merge(parts))
            if commit:
                self._commit()
            elif end:
                self._end_transaction()
        except BaseException as exc:
            self._after_failure(exc)
            refusal = _refusal(exc) if self.dialect in ("postgres", "mssql") else None
            if refusal is not None:
                raise refusal from exc
            raise
        return results

    def _run_tsql(self, queries: Sequence[tuple[Query, Mapping[str, Any]]], *, end: bool) -> list[Result]:
        """SQL Server: the queries as one batch when their results can be told apart (one query, or
        every query's count of result sets known: TSQL_RESULT_SETS), with the transaction's COMMIT
        riding on it when ``end``; else one batch per query (and transaction() commits)."""
        counts = [TSQL_RESULT_SETS.get(query.name) for query, _ in queries]
        if len(queries) == 1 or all(count is not None for count in counts):
            sql = "\n".join(query.batch.sql for query, _ in queries)
            if end:
                sql += "\nCOMMIT TRANSACTION;"
            values = [self._convert_param(params[p]) for query, params in queries for p in query.batch.params]
            parts = self._execute_statement(sql, values)
            self._tsql_committed = end
            if len(queries) == 1:
                return [_merge(parts)]
            parts = [part for part in parts if part.returns_rows]
            if len(parts) != sum(counts):   # type: ignore[arg-type]
                raise AgentError(f"SQL Server answered {len(parts)} result sets to the batch of "
                                 f"{[query.name for query, _ in queries]}, expected {sum(counts)}")  # type: ignore[arg-type]
            results, position = [], 0
            for count in counts:
                results.append(_merge(parts[position:position + count]))   # type: ignore[operator]
                position += count   # type: ignore[operator]
            return results
        results = []
        for query, params in queries:
            values = [self._convert_param(params[p]) for p in query.batch.params]
            results.append(_merge(self._execute_statement(query.batch.sql, values)))
        self._tsql_committed = False
        return results

    def _tsql_begun(self, sql: str) -> str:
        """SQL Server: ``sql`` with the pending BEGIN TRANSACTION of transaction() in front."""
        if not self._tsql_begin:
            return sql
        self._tsql_begin = False
        if _TSQL_ANY_MODULE.match(_code_start(sql)):
            # A CREATE PROCEDURE (a migration) must be the first statement of its batch.
            self._send("BEGIN TRANSACTION;")
            return sql
        return "BEGIN TRANSACTION;\n" + sql

    def _send(self, sql: str) -> None:
        cursor = self.connection.cursor()
        try:
            cursor.execute(sql)
            self.statements_executed += 1
        finally:
            with contextlib.suppress(Exception):
                cursor.close()

    def _end_transaction(self) -> None:
        """commit_with ran: on PostgreSQL (and on SQL Server when the batch could carry it) the
        batch's COMMIT committed the transaction."""
        if self.dialect == "postgres" or self._tsql_committed:
            self.commits += 1
        self._transaction_ended = True

    def _execute_statement(self, sql: str, values: Sequence[Any]) -> list[Result]:
        """One round trip; one Result per result the server sent (every result set is read,
        so an error in a later statement of a batch is raised here, not lost)."""
        connection = self.connection
        if self.dialect == "mssql":
            sql = self._tsql_begun(sql)
        cursor = connection.cursor()
        self._set_active(cursor)
        try:
            cursor.execute(sql, values) if values else cursor.execute(sql)
            self.statements_executed += 1
            parts = [self._read_result(cursor)]
            if self.dialect != "sqlite":
                while cursor.nextset():
                    parts.append(self._read_result(cursor))
            return parts
        finally:
            self._set_active(None)
            with contextlib.suppress(Exception):
                cursor.close()

    def _read_result(self, cursor: Any) -> Result:
        if cursor.description:
            names = [column[0].lower() for column in cursor.description]
            return Result(rows=[self._convert_row(names, row) for row in cursor.fetchall()], returns_rows=True)
        return Result(rowcount=max(cursor.rowcount, 0))

    def _commit(self) -> None:
        # PostgreSQL and SQL Server outside transaction(): the connection is in autocommit mode,
        # and the server ran the statement (or the batch its BEGIN and COMMIT rode on) as one
        # transaction, committed as it ended (no COMMIT round trip).
        return

    def _after_failure(self, exc: BaseException | None = None) -> None:
        if exc is not None and _connection_lost(exc):
            self._discard_connection()
            return
        if self._in_transaction:
            return  # the transaction block rolls back
        try:
            if self._connection is not None:
                if self.dialect == "sqlite":
                    if self._connection.in_transaction:
                        self._connection.execute("ROLLBACK")
                elif self.dialect == "mssql":
                    self._send(TSQL_ROLLBACK)
                # PostgreSQL in autocommit: the failed batch's implicit transaction is gone already
        except Exception:
            self._discard_connection()

    @contextlib.contextmanager
    def transaction(self, *, immediate: bool = True) -> Iterator["Store"]:
        """All named queries inside commit together, or not at all.

        On SQLite ``immediate`` takes the write lock up front (the agent's own writes:
        no lock-upgrade failures). A job's work uses ``immediate=False`` so a job that
        mostly reads does not hold every other writer off for its whole duration."""
        if self._in_transaction:
            raise AgentError("nested transactions are not supported")
        connection = self.connection
        self.work_transaction = None
        if self.dialect == "sqlite":
            connection.execute("BEGIN IMMEDIATE" if immediate else "BEGIN DEFERRED")
        elif self.dialect == "postgres":
            connection.autocommit = False   # client side: BEGIN rides on the first statement
        else:
            self._tsql_begin, self._tsql_committed = True, False   # BEGIN rides on the first batch
        self._in_transaction = True
        try:
            yield self
        except BaseException as exc:
            self._in_transaction = False
            self._transaction_ended = False
            if _connection_lost(exc):
                self._discard_connection()
                raise
            begun, self._tsql_begin = not self._tsql_begin, False
            try:
                if self.dialect == "sqlite":
                    if connection.in_transaction:
                        connection.execute("ROLLBACK")
                elif self.dialect == "mssql":
                    if begun:   # (XACT_ABORT ON has rolled back after an error already, mostly)
                        self._send(TSQL_ROLLBACK)
                else:
                    connection.rollback()
                    if self.dialect == "postgres":
                        connection.autocommit = True
            except Exception:
                self._discard_connection()
            if self._owned_session:   # the job's session state (or impersonation) may still be there
                self._discard_connection()
            raise
        self._in_transaction = False
        committed = self._transaction_ended and (self.dialect == "postgres" or self._tsql_committed)
        begun = not self._tsql_begin
        self._transaction_ended, self._tsql_begin, self._tsql_committed = False, False, False
        try:
            if committed:
                if self.dialect == "postgres":
                    connection.autocommit = True
            elif self.dialect == "sqlite":
                connection.execute("COMMIT")
            elif self.dialect == "mssql":
                if begun:   # nothing was sent: nothing to commit
                    self._send("COMMIT TRANSACTION;")
                    self.commits += 1
            else:
                connection.commit()
                self.commits += 1
                if self.dialect == "postgres":
                    connection.autocommit = True
        except BaseException as exc:
            self._after_failure(exc)
            if self.dialect == "postgres":
                # A COMMIT the server refused (a deferred check) leaves the connection out of
                # autocommit: what ran next would never commit (an operator's row 'refused').
                self._discard_connection()
            raise
        finally:
            if self._owned_session:
                self._discard_connection()

    # ------------------------------------------------------------ user SQL

    def run_script(self, sql: str, output: list[str] | None = None, *, owner: str | None = None,
                   params: Mapping[str, str] | None = None) -> list[str]:
        """Run a job's SQL inside the current transaction (no commit here) and return what the
        server said while it ran: its messages (PRINT, RAISERROR below 11, notices) and the
        rows each statement affected, one line each.

        Every result set is read to the end, and an error raised while reading one (a
        conversion or a division by zero in the middle of a result set) is raised, never
        swallowed: the job failed. The job's own session changes do not outlive it: on SQL
        Server it runs through sp_executesql, whose scope restores SET options and drops its
        temporary tables; on PostgreSQL the agent resets the session before its own
        statements (``reset_session``); agent statements time out waiting for locks after
        30 s, the job's do not.

        ``output``: a list the lines are appended to as they come, so that what the server said
        before an error is kept too (the step attempt's output).

        ``owner``: the principal that defined the job from the database side (migration 0007);
        the SQL runs with that principal's rights and no more, as AGENT_JOB_PRINCIPAL's jobs do
        (see :meth:`_run_as`).

        ``params``: the run's parameters (shared/jobs/params.py), BOUND, never pasted into the SQL:
        on SQL Server the job's SQL reads ``@k`` (its sp_executesql declares each as NVARCHAR(MAX));
        on PostgreSQL ``current_setting('agent.param.k')`` (set_config(..., true) in this
        transaction, one statement before the job's; visible inside the owner's function too);
        on SQLite ``@k`` or ``:k``, named parameters of each statement. None or empty: the path
        of every run without parameters, unchanged (no statement more)."""
        if not self._in_transaction:
            raise AgentError("run_script must run inside a transaction")
        connection = self.connection
        output = [] if output is None else output
        if self.dialect == "sqlite":
            if hasattr(connection, "cancelled"):
                connection.cancelled.clear()
            # SQLite's parser decides: every transaction statement of the job is denied at
            # prepare time (shared/control/transaction_control.py). Setting an authorizer expires the
            # connection's cached statements, so none escapes it.
            denied: list[str] = []
            connection.set_authorizer(_job_authorizer(denied))
            try:
                for statement in _sqlite_statements(sql):
                    cursor = connection.cursor()
                    self._set_active(cursor)
                    try:
                        if params:
                            cursor.execute(statement, _SqliteParams(params))
                        else:
                            cursor.execute(statement)
                        cursor.fetchall()
                        if cursor.rowcount >= 0 and not cursor.description:
                            output.append(f"({cursor.rowcount} row(s) affected)")
                    except sqlite3.DatabaseError:
                        if denied:
                            raise TransactionControlRefused(refused_message(statement[:80])) from None
                        raise
                    finally:
                        self._set_active(None)
                        cursor.close()
            finally:
                _clear_authorizer(connection)
            return output
        if self.dialect == "postgres":
            refused = postgres_transaction_statement(sql)
            if refused is not None:
                raise TransactionControlRefused(refused_message(refused))
        if params and self.dialect == "postgres":
            _set_postgres_params(connection, params)
        principal = owner or self.job_principal
        who = f"the job's owner {principal!r}" if owner else f"AGENT_JOB_PRINCIPAL {principal!r}"
        if principal and self.dialect == "postgres" and principal != self._session_user(connection):
            return self._run_as(connection, principal, who, sql, output)
        if self.dialect == "mssql" and self._session is None:
            # Asked once per connection, as it opened (shared/control/db.py); else here.
            self._session = getattr(connection, "agent_session", None)
        if self.dialect == "mssql" and self._session is None:
            row = self.execute("session_identity").one()
            assert row is not None
            self._session = (int(row["spid"]), str(row["babelfish"] or "") == "1", str(row["user_name"] or ""))
        if principal and self.dialect == "mssql" and self._session is not None \
                and principal.casefold() == self._session[2].casefold():
            # A job of the agent's own database user (a job dbo defined from T-SQL, with the
            # agent connected as dbo) runs with the rights it has already: impersonating oneself
            # changes nothing, and Babelfish has no EXECUTE AS ... WITH COOKIE. User names
            # compare as the database's default (case-insensitive) collation does.
            principal = None
        cursor = connection.cursor()
        self._set_active(cursor)
        try:
            if self.dialect == "mssql":
                if principal:
                    # With the cookie, only this batch can revert: the job's SQL cannot. A job
                    # that fails leaves the batch before its REVERT; and what the job leaves in
                    # the session (GLOBAL cursors, SESSION_CONTEXT, CONTEXT_INFO, #procedures,
                    # session applocks) outlives sp_executesql's scope: the connection is closed
                    # when the transaction ends, committed or not (_owned_session).
                    self._owned_session = True
                    # The cookie is a local variable of this batch: sp_executesql runs the job's SQL
                    # in a module scope of its own, where a REVERT applies only to an EXECUTE AS of
                    # that scope and the variable cannot be read; the batch's context, set with
                    # the cookie, is reverted only with it. EXECUTE AS anyone else needs
                    # IMPERSONATE, which the job's principal does not hold (SQL Server Agent's own
                    # rule for a non-sysadmin owner's job step).
                    try:
                        _execute_tsql_job(cursor, self._tsql_begun(mssql_job_batch(principal, params)), sql, params)
                    except Exception as exc:
                        if "15517" in str(exc) or "Cannot execute as the database principal" in str(exc):
                            raise OwnerError(f"{who} cannot run this job: {_one_line(exc)} (the user must exist in "
                                             f"this database and the app's user needs IMPERSONATE on it)") from exc
                        raise
                    drain_results(cursor, output)
                    return output
                # The path of most runs (no principal, no parameters): agent.run_job (migration
                # 0023), the same batch as a procedure; else the batch itself.
                batch = TSQL_RUN_JOB if not params else mssql_job_batch(None, params)
                _execute_tsql_job(cursor, self._tsql_begun(batch), sql, params)
            else:
                # Agent statements wait 30 s for a lock at most; the job's own SQL waits as long
                # as its timeout allows; both SET LOCALs end with the transaction (and
                # reset_session resets the role before the agent's own statements). First, the
                # id of the job's transaction: check_work_transaction, in the completion's batch,
                # compares it with the transaction the completion runs in (its SQL ended it, or not).
                # The job's search_path: read from the catalogs, or the value read at most
                # JOB_SEARCH_PATH_MAX_AGE seconds ago (the lookup's planning was a tenth of the
                # server's time a run). The lock timeout stays a statement of its own: with it in
                # the first statement instead, psqlODBC crashed (a segmentation fault) on a job
                # whose notices passed 32 KB (test_step_output), the layout of results it is
                # handed being another.
                path, looked_up = self._job_search_path()
                prefix = [f"SELECT pg_catalog.txid_current() AS agent_transaction, {path} AS job_path;\n",
                          "SET LOCAL lock_timeout = 0;\n"]
                heard = PostgresNotices()
                cursor.execute("".join(prefix) + sql + heard.end_statement())
                first = cursor.fetchone()
                transaction = int(first[0])
                if looked_up:
                    self._keep_job_search_path((str(first[1]), time.monotonic()))
                drained = False
                for _ in prefix:   # past the agent's own statements
                    # psqlODBC hands notices to whichever result it was reading: keep them all.
                    output += heard.take(cursor)
                    if not cursor.nextset():
                        drained = True
                        break
                if not drained:
                    drain_results(cursor, output, heard)
                heard.note_cut(output)
                self.work_transaction = transaction
                return output
            drain_results(cursor, output)
        finally:
            self._set_active(None)
            with contextlib.suppress(Exception):
                cursor.close()
        return output

    def _job_search_path(self) -> tuple[str, bool]:
        """The expression that sets the job's search_path (PostgreSQL) and whether it is the
        catalog lookup (JOB_SEARCH_PATH; its answer is kept) or the value it gave this store at most
        JOB_SEARCH_PATH_MAX_AGE seconds ago, as a literal. Every connection of a store (and of its
        pool) logs in with the same login to the same database: the lookup gives all the same path;
        ``ALTER ROLE/DATABASE ... SET search_path`` reaches jobs within that age (a new session
        of PostgreSQL's own sees it at once, one opened before never)."""
        kept = self.pool.job_search_path if self.pool is not None else self._job_path
        if kept is None or time.monotonic() - kept[1] > JOB_SEARCH_PATH_MAX_AGE:
            return JOB_SEARCH_PATH, True
        return f"pg_catalog.set_config('search_path',{dollar_quoted(kept[0])},true)", False

    def _keep_job_search_path(self, kept: tuple[str, float]) -> None:
        # On the pool, for all of its connections' stores (a worker's store lives as long as its
        # thread, an invocation's as long as the invocation); a store of its own keeps it itself.
        if self.pool is not None:
            self.pool.job_search_path = kept
        else:
            self._job_path = kept

    def _session_user(self, connection: Any) -> str:
        """The login role of the store's connections (asked once per store: every connection of a
        store logs in with the same connection string, and an owned run closes the one it used)."""
        cached = getattr(self, "_session_user_of", None)
        if cached is None:
            cursor = connection.cursor()
            try:
                cursor.execute("SELECT CAST(session_user AS text)")
                cached = cursor.fetchone()[0]
            finally:
                cursor.close()
            self._session_user_of = cached
        return cached

    def _run_as(self, connection: Any, principal: str, who: str, sql: str, output: list[str]) -> list[str]:
        """PostgreSQL: run ``sql`` with ``principal``'s rights, in a way the SQL cannot undo.

        ``SET [LOCAL] ROLE`` alone is no boundary: the job's own ``RESET ROLE`` (or ``SET ROLE``
        to any role of the agent's login, or ``set_config('role', ...)``) returns to the agent's
        rights. So the job's SQL runs inside a SECURITY DEFINER function OWNED BY ``principal``
        (made in pg_temp for this one run, in the job's transaction, dropped after it):

        * inside it every statement runs as ``principal`` (current_user), whatever the session;
        * PostgreSQL refuses to change ``role`` or ``session_authorization`` inside a
          security-definer function — SET ROLE, RESET ROLE, SET/RESET SESSION AUTHORIZATION,
          set_config('role', ...), also from a nested DO block or function: "cannot set parameter
          "role" within security-definer function" (guc.c, GUC_NOT_WHILE_SEC_REST). That is the
          server's own rule, not a check of ours that SQL could race or outwit;
        * transaction control (COMMIT, ROLLBACK, a procedure that commits) is refused inside it,
          and so is DISCARD ALL: nothing the job did commits unless the whole run does;
        * the definer is the LOWER principal here (the function gives the owner's rights to the
          agent's session, never the reverse), its body fixed text (``EXECUTE job_sql``, then
          _OWNED_JOB_BODY's closing), the job's SQL a parameter;
        * nothing the job leaves behind runs after the function returns, or as the agent: every
          trigger event it left pending (deferred constraint triggers, deferred foreign keys)
          fires inside the function, as the principal (_OWNED_JOB_BODY); the function ends with
          ``search_path`` pinned to pg_catalog for the rest of the transaction; and the
          connection is closed when the transaction ends (``_owned_session``), so no setting,
          cursor, prepared statement, listener, session lock or temporary object of the job's
          is ever met by the agent's own statements;
        * agent.* called from inside the job records the principal as its caller, not the
          agent's login (agent.owned_sessions, _owned_session_mark).

        The whole argument, mechanism by mechanism: docs/tsql.md, "The owner boundary".

        Making the function the owner's needs the agent's login to be a member of the role
        (``GRANT owner TO agent``; ``grant-sql --operator`` prints it) and the owner to hold TEMP
        on the database (PUBLIC does by default). A missing role or membership is an error naming
        the principal. What the job returns as rows and row counts is not reported (a function
        runs it); its notices are."""

        function = f"pg_temp.agent_job_{uuid.uuid4().hex}"
        role = '"' + principal.replace('"', '""') + '"'
        # From here to the transaction's end the connection is the job's: closed afterwards.
        self._owned_session = True
        # Who calls agent.* from inside the job: its principal (agent.calling_principal, migration
        # 0019), wherever the job runs: the control database, or a job's own database that is a
        # control database too (a task's @database may name it).
        mark, unmark = _owned_session_mark(function, trusted=self.control)
        # A round trip of its own, not the job's batch: sent there (a DO block whose failure raised
        # SQLSTATE AG003, tried for issue 35), psqlODBC handed the job's notices on twice, to the
        # setup's result and to the next one (test_step_output: 60 notices for 30).
        cursor = connection.cursor()
        self._set_active(cursor)
        try:
            try:
                # The end notice is raised in the same statement as the job's: psqlODBC hands a
                # statement's notices on together (see PostgresNotices).
                create = (f"CREATE FUNCTION {function}(job_sql text, end_notice text) RETURNS void LANGUAGE plpgsql "
                          f"SECURITY DEFINER AS $agent$\n{_OWNED_JOB_BODY_SENT}$agent$;\n"
                          f"ALTER FUNCTION {function}(text, text) OWNER TO {role};\n{mark}")
                cursor.execute(create)
                while cursor.nextset():
                    pass
            except Exception as exc:
                raise OwnerError(f"{who} cannot run this job: {_one_line(exc)} (the role must exist, and the "
                                 "agent's login must be a member of it: GRANT it to the agent's login; "
                                 "grant-sql --operator prints this)") from exc
            heard = PostgresNotices()
            # The job's search_path is set before the function runs (a subquery in FROM is scanned
            # before the target list is evaluated; set_config is volatile: never pulled up).
            cursor.execute(f"SET LOCAL lock_timeout = 0;\nSELECT {function}(?, ?) FROM (SELECT {JOB_SEARCH_PATH} "
                           f"OFFSET 0) AS job_path;\n{unmark}"
                           f"DROP FUNCTION IF EXISTS {function}(text, text);", sql, heard.end_text)
            while True:
                output += heard.take(cursor)
                if cursor.description:
                    cursor.fetchall()
                if not cursor.nextset():
                    break
            output += heard.take(cursor)
            heard.note_cut(output)
        finally:
            self._set_active(None)
            with contextlib.suppress(Exception):
                cursor.close()
        return output

    def _set_active(self, cursor: Any) -> None:
        with self._lock:
            self._active_cursor = cursor
            self._active_thread = threading.get_ident() if cursor is not None else None
            deferred_close = cursor is None and self._close_when_idle
            self._close_when_idle = False if deferred_close else self._close_when_idle
        if deferred_close:
            self._release(keep=False)   # close() came from another thread meanwhile (see close)

    def cancel(self) -> None:
        """Stop the statement running on this store's connection (called from another thread).
        The cursor cannot be closed while the cancel is in flight (the lock).

        Babelfish reads a cancel (the TDS attention SQLCancel sends) only once the statement has
        ended, so there the session running the job is ended with KILL from a connection of its
        own: the job's transaction rolls back, and the store reconnects for its next statement.
        KILL needs the right to end sessions (sysadmin on Babelfish); without it this raises,
        the caller logs it, and the statement runs to its end (its result is still fenced)."""
        with self._lock:
            connection, cursor, session = self._connection, self._active_cursor, self._session
            with contextlib.suppress(Exception):
                if self.dialect == "sqlite" and connection is not None:
                    (connection.cancel if hasattr(connection, "cancel") else connection.interrupt)()
                elif cursor is not None:
                    cursor.cancel()
        if self.dialect == "mssql" and cursor is not None and session is not None and session[1]:
            killer = self._connect()
            try:
                killer.autocommit = True            # KILL is refused inside a transaction (6615)
                killer.cursor().execute(f"KILL {int(session[0])}")
            finally:
                with contextlib.suppress(Exception):
                    killer.close()

    # ------------------------------------------------------------ schema

    def schema_version(self) -> int:
        if not self.execute("schema_exists").rows:
            return 0
        return int(self.execute("get_schema_version").scalar() or 0)

    def latest_version(self) -> int:
        migrations = load_migrations(self.dialect)
        return migrations[-1].version if migrations else 0

    def migrate(self, now: datetime, *, up_to: int | None = None) -> tuple[int, int]:
        """Apply the migrations this database lacks (idempotent; concurrent calls queue on a lock).
        ``up_to``: stop after that version (a database left where an older release left it: the
        upgrade tests start there)."""
        migrations = [m for m in load_migrations(self.dialect) if up_to is None or m.version <= up_to]
        # bootstrap_schema takes a session-level migration lock (PostgreSQL advisory lock, SQL
        # Server applock) before it creates anything; it is held until the migrations committed.
        with self.transaction():
            self.execute("bootstrap_schema")
        try:
            with self.transaction():
                self.execute("lock_migrations")
                before = int(self.execute("get_schema_version").scalar() or 0)
                latest = self.latest_version()
                if before > latest:
                    raise SchemaError(f"the control database has schema version {before}, newer than this code "
                                      f"knows ({latest}); upgrade the agent")
                for migration in migrations:
                    if migration.version <= before:
                        continue
                    for statement in migration.statements():
                        self._execute_statement(statement, [])
                    self.execute("record_migration", version=migration.version,
                                 description=migration.description, now=now)
        finally:
            with contextlib.suppress(Exception):   # a lost connection released it already
                self.execute("release_migration_lock")
        return before, latest

    def require_schema(self) -> None:
        version = self.schema_version()
        latest = self.latest_version()
        if version == 0:
            raise SchemaError(f"{self.target.display} has no agent schema: run `sql-agent init-db` (from a clone: .venv/bin/sql-agent) first")
        if version < latest:
            raise SchemaError(f"{self.target.display} has schema version {version}, this code needs {latest}: run `init-db` to upgrade")
        if version > latest:
            raise SchemaError(f"{self.target.display} has schema version {version}, newer than this code ({latest}): upgrade the agent")


def _owned_session_mark(function: str, *, trusted: bool) -> tuple[str, str]:
    """The statements that write, and delete, the row of agent.owned_sessions (migration 0019)
    that makes agent.calling_principal() the job's owner while the job runs: written before the
    job, deleted after its function returned. The owner recorded is the owner of the function the
    job runs in (no name is spliced into the text): exactly the role its statements run as.

    ``trusted``: the control database, whose agent schema the agent writes all the time. In a
    job's own database the table is written only if the agent's own login owns it: there an
    operator's "agent.owned_sessions" could carry a trigger or a rule, which the agent's INSERT
    would run with the agent's rights; no such table, nothing to mark (no agent.* to call). Every
    name is qualified, operators too: these statements run as the agent."""
    insert = ("INSERT INTO agent.owned_sessions SELECT pg_catalog.pg_backend_pid(), pg_catalog.txid_current(), "
              "r.rolname FROM pg_catalog.pg_proc AS p JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) "
              f"p.proowner WHERE p.oid OPERATOR(pg_catalog.=) CAST('{function}(pg_catalog.text, pg_catalog.text)' "
              "AS pg_catalog.regprocedure)")
    delete = ("DELETE FROM agent.owned_sessions AS s WHERE s.backend_pid OPERATOR(pg_catalog.=) "
              "pg_catalog.pg_backend_pid()")
    if trusted:
        return insert + ";\n", delete + ";\n"
    check = ("SELECT 1 FROM pg_catalog.pg_tables AS t WHERE t.schemaname OPERATOR(pg_catalog.=) CAST('agent' AS name) "
             "AND t.tablename OPERATOR(pg_catalog.=) CAST('owned_sessions' AS name) "
             "AND t.tableowner OPERATOR(pg_catalog.=) session_user")
    return tuple(f"DO $m$BEGIN IF EXISTS ({check}) THEN {statement}; END IF; END$m$;\n"  # type: ignore[return-value]
                 for statement in (insert, delete))


# The search_path a job's SQL runs with, for its transaction only (set_config(..., true)): the one
# the database's and role's settings give the agent's login (ALTER ROLE ... IN DATABASE, ALTER ROLE,
# ALTER DATABASE, in PostgreSQL's order), else PostgreSQL's built-in default ("$user", public; a
# search_path set in postgresql.conf is not visible to a non-superuser, so not honoured).
# The agent's sessions are pinned to pg_catalog, pg_temp (connection_strings.PINNED_SESSION_OPTIONS),
# which the job would not expect: its unqualified names find what they found before the pin. An
# owned job's function ends by pinning the path again, and reset_session's RESET ALL returns to the
# pin before the agent's completion. This statement runs pinned itself: its unqualified names are
# pg_catalog's (kept short: it travels with every run). An expression, evaluated in a statement the
# agent sends anyway (psqlODBC loses its footing over a job's notices after one result set more).
JOB_SEARCH_PATH = (
    "pg_catalog.set_config('search_path',COALESCE((SELECT substr(c,13)FROM pg_db_role_setting,unnest(setconfig)c "
    "WHERE setdatabase IN(0,(SELECT oid FROM pg_database WHERE datname=current_database()))AND setrole IN(0,"
    "(SELECT oid FROM pg_roles WHERE rolname=session_user))AND c LIKE'search_path=%'ORDER BY setrole<>0 DESC,"
    "setdatabase<>0 DESC LIMIT 1),'\"$user\", public'),true)")

# How long a store keeps the search_path JOB_SEARCH_PATH read for its jobs (Store._job_search_path).
JOB_SEARCH_PATH_MAX_AGE = 60.0


def dollar_quoted(text: str) -> str:
    """``text`` as a PostgreSQL dollar-quoted literal, with a tag it does not contain (dollar quotes
    mean the same whatever standard_conforming_strings says)."""
    tag, n = "$p$", 0
    while (text + tag).find(tag) != len(text):   # the tag closes where the text ends, not before
        n += 1
        tag = f"$p{n}$"
    return f"{tag}{text}{tag}"


# How many rounds of SET CONSTRAINTS ALL IMMEDIATE an owned job's deferred triggers get to settle
# in (see _OWNED_JOB_BODY); one that still writes rows after that many fails.
OWNED_JOB_SETTLE_ROUNDS = 10

# The body of the function an owned job's SQL runs in (PostgreSQL; Store._run_as), run as the
# job's principal. Its own names are all schema-qualified, operators too: the job may have set
# search_path (for the session or the transaction) to a schema of its own, with an `=` that lies.
# After the job's SQL:
# * every trigger event the job left pending (deferred constraint triggers, deferred foreign keys)
#   fires NOW, still as the principal: at COMMIT it would fire as whoever the session is then,
#   the agent's login. SET CONSTRAINTS ALL IMMEDIATE fires them; a trigger fired so can defer
#   again (SET CONSTRAINTS ... DEFERRED) and write rows that queue new events, so rounds repeat
#   until one writes no row at all: events are queued only by row writes (row-level triggers;
#   only constraint triggers, always row-level, can be deferred), and every row write of the
#   transaction, temporary tables and catalogs included, is counted in pg_stat_xact_all_tables
#   (which needs track_counts, a setting only a superuser can change). A round without a write
#   fired everything pending at its start and queued nothing: nothing is left for COMMIT. The
#   triggers fire with the job's own search_path, as they would have at COMMIT;
# * every cursor is closed: a cursor WITH HOLD still open at COMMIT runs its query to the end
#   then, as the session's user, the agent's login (in a job's own database no completion's
#   CLOSE ALL comes before that COMMIT);
# * then the search_path is pg_catalog's for the rest of the transaction (SET LOCAL): the agent's
#   statements after the job (DELETE of the session's mark, the completion) resolve nothing the
#   job defined.
_OWNED_JOB_BODY = f"""DECLARE
    rounds int := 0;
    written numeric;
BEGIN
    EXECUTE job_sql;
    IF pg_catalog.current_setting('track_counts') OPERATOR(pg_catalog.<>) 'on' THEN
        RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = 'track_counts is off: an owned job cannot be run, '
            'because the agent could not tell that its deferred triggers have all fired as its owner '
            '(turn track_counts on, the server''s default)';
    END IF;
    LOOP
        written := (SELECT COALESCE(pg_catalog.sum(s.n_tup_ins OPERATOR(pg_catalog.+) s.n_tup_upd
                                                   OPERATOR(pg_catalog.+) s.n_tup_del), 0)
                    FROM pg_catalog.pg_stat_xact_all_tables AS s);
        SET CONSTRAINTS ALL IMMEDIATE;
        EXIT WHEN written OPERATOR(pg_catalog.=) (
            SELECT COALESCE(pg_catalog.sum(s.n_tup_ins OPERATOR(pg_catalog.+) s.n_tup_upd
                                           OPERATOR(pg_catalog.+) s.n_tup_del), 0)
            FROM pg_catalog.pg_stat_xact_all_tables AS s);
        rounds := rounds OPERATOR(pg_catalog.+) 1;
        IF rounds OPERATOR(pg_catalog.>=) {OWNED_JOB_SETTLE_ROUNDS} THEN
            RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = pg_catalog.format('the job''s deferred triggers did '
                'not settle: after %s rounds of SET CONSTRAINTS ALL IMMEDIATE they still wrote rows and deferred '
                'their constraints again; they must all fire before the job''s transaction ends, as its owner '
                '(nothing the job did is kept)', rounds);
        END IF;
    END LOOP;
    EXECUTE 'CLOSE ALL';
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    RAISE NOTICE '%', end_notice;
END
"""
# As sent: each line without its indentation (the body travels with every owned run).
_OWNED_JOB_BODY_SENT = "\n".join(line.strip() for line in _OWNED_JOB_BODY.splitlines()) + "\n"


def _execute_tsql_job(cursor: Any, batch: str, sql: str, params: Mapping[str, str] | None = None) -> None:
    """Run a job's T-SQL batch; a COMMIT or ROLLBACK in it that the nesting caught (SQL Server's
    error 266 when sp_executesql returns with another @@TRANCOUNT, Babelfish's words for the same)
    is the rule in words, with the server's message after it."""
    try:
        cursor.execute(batch, sql, *(params or {}).values())
    except Exception as exc:
        text = str(exc)
        if "(266)" in text or "Transaction count after EXECUTE" in text or "Transaction count after execution" in text:
            raise TransactionControlRefused(f"{MSSQL_REFUSED} ({_one_line(exc)})") from exc
        if "agent: transaction control" in text:   # the nesting's THROW 50002 (a job's own 50002 is its error)
            raise TransactionControlRefused(MSSQL_REFUSED) from exc
        raise


def mssql_job_batch(job_principal: str | None, params: Mapping[str, str] | None = None) -> str:
    """The T-SQL batch that runs a job's SQL (its one parameter) in the agent's transaction: the
    job's own lock timeout; one more nested transaction around it, so that a COMMIT in it only
    decrements @@TRANCOUNT and commits nothing (SQL Server commits only the outermost), and a
    changed count afterwards (its COMMIT or ROLLBACK) fails the attempt before anything else
    runs (the agent then rolls back); with a job principal (a job's owner, or AGENT_JOB_PRINCIPAL),
    impersonation of that database user that only this batch's cookie reverts.

    The agent's sessions run with NOCOUNT ON; the job's SQL runs with NOCOUNT OFF, so its row
    counts reach its output ("(2 row(s) affected)"), as SQL Server Agent's step output shows
    them. The setting is made inside an outer sp_executesql scope, which SQL Server (and
    Babelfish) restore when it returns, also after an error, so the agent's own statements never
    see it; the job's text is passed on unchanged (a CREATE PROCEDURE must still be first).

    ``params``: the run's parameters, in this order after the job's text: the job's SQL reads
    each as @name (NVARCHAR(MAX)). Only their NAMES are in the text (identifiers, checked by
    shared/jobs/params.py; checked again here); their values are bound (@agent_param_n = ?)."""
    names = list(params or {})
    for name in names:
        if name_problem(name):
            raise AgentError(f"parameter name {name!r}: expected {NAME_EXPECTED}")
    declare = "".join(f", @agent_param_{n} NVARCHAR(MAX)" for n in range(1, len(names) + 1))
    bound = "".join(f", @agent_param_{n} = ?" for n in range(1, len(names) + 1))
    inner = ""
    if names:
        # Inside the outer statement's N'...' literal: its quotes doubled.
        inner = (", N''" + ", ".join(f"@{name} NVARCHAR(MAX)" for name in names) + "''"
                 + "".join(f", @{name} = @agent_param_{n}" for n, name in enumerate(names, 1)))
    nest = "DECLARE @agent_trancount INT;\nBEGIN TRANSACTION;\nSET @agent_trancount = @@TRANCOUNT;\n"
    run = (f"EXEC sp_executesql N'SET NOCOUNT OFF; EXEC sp_executesql @agent_job{inner};', "
           f"N'@agent_job NVARCHAR(MAX){declare}', @agent_job = ?{bound};\n")
    # The refusal's words are the engine's (_execute_tsql_job maps 50002 to MSSQL_REFUSED): they
    # need not travel with every run (issue 35: the job's batch is most of what a task sends).
    unnest = "IF @@TRANCOUNT <> @agent_trancount THROW 50002, N'agent: transaction control', 1;\nCOMMIT TRANSACTION;\n"
    if job_principal:
        name = "N'" + job_principal.replace("'", "''") + "'"
        return ("SET LOCK_TIMEOUT -1;\nDECLARE @agent_cookie VARBINARY(8000);\n" + nest
                + f"EXECUTE AS USER = {name} WITH COOKIE INTO @agent_cookie;\n"
                + run + "REVERT WITH COOKIE = @agent_cookie;\n" + unnest + "SET LOCK_TIMEOUT 30000;")
    return "SET LOCK_TIMEOUT -1;\n" + nest + run + unnest + "SET LOCK_TIMEOUT 30000;"


# mssql_job_batch(None) as a procedure of migration 0023 (test_step_transactions compares them).
TSQL_RUN_JOB = "EXEC agent.run_job ?;"


MSSQL_REFUSED = ("the job's SQL may not end the agent's transaction (a COMMIT or ROLLBACK in it changed "
                 "@@TRANCOUNT): nothing it did is kept")


class _SqliteParams(dict):
    """A run's parameters as sqlite3 binds named parameters (@k, :k): a name the statement
    writes in another letter case finds its value (names ignore case, as on the other dialects);
    one it does not declare is sqlite3's own error naming it."""

    def __missing__(self, key: str) -> str:
        for name, value in self.items():
            if name.casefold() == key.casefold():
                return value
        raise KeyError(key)


def _set_postgres_params(connection: Any, params: Mapping[str, str]) -> None:
    """A run's parameters as settings of its transaction (set_config(name, value, true): gone
    when it ends), names and values bound: one statement, before the job's SQL."""
    cursor = connection.cursor()
    try:
        calls = ", ".join("pg_catalog.set_config(?, ?, true)" for _ in params)
        values: list[str] = []
        for name, value in params.items():
            values += [f"agent.param.{name.lower()}", value]
        cursor.execute(f"SELECT {calls}", *values)
        cursor.fetchall()
    finally:
        cursor.close()


def _job_authorizer(denied: list[str]) -> Callable[..., int]:
    def authorize(action: int, arg1: Any, arg2: Any, database: Any, source: Any) -> int:
        if action == sqlite3.SQLITE_TRANSACTION:
            denied.append(str(arg1))
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    return authorize


def _allow_everything(*_: Any) -> int:
    return sqlite3.SQLITE_OK


def _clear_authorizer(connection: Any) -> None:
    try:
        connection.set_authorizer(None)           # Python 3.11+
    except TypeError:
        connection.set_authorizer(_allow_everything)


def _one_line(exc: BaseException) -> str:

    return describe(exc)


# How long a dropped store's finalizer waits for the pool's lock before closing its connection
# without the pool's bookkeeping.
FINALIZER_LOCK_SECONDS = 1.0


def drain_results(cursor: Any, output: list[str] | None = None, notices: "PostgresNotices | None" = None) -> list[str]:
    """Read every result set of a job's batch to the end and return the server's messages and
    row counts. An error the server raises while a result set is being read (a conversion or a
    division by zero in its middle, with a driver that fetches incrementally) propagates: the job
    failed, and must never be recorded as succeeded. Lines are appended to ``output`` (when
    given) as they come, so the messages before such an error are kept.

    ``notices``: PostgreSQL's, read through :class:`PostgresNotices`; the batch's last result is
    then the agent's end statement's, whose row count is not the job's (and meaningless)."""
    output = [] if output is None else output
    take = notices.take if notices is not None else _messages
    counted: str | None = None       # a result's row-count line, written once a result follows it
    while True:
        if counted is not None:      # a result followed: the count was the job's
            output.append(counted)
            counted = None
        output += take(cursor)
        if cursor.description:
            cursor.fetchall()
        elif cursor.rowcount >= 0:
            counted = f"({cursor.rowcount} row(s) affected)"
        if notices is None and counted is not None:
            output.append(counted)
            counted = None
        if not cursor.nextset():
            break
    output += take(cursor)
    return output


# What the ODBC driver puts before a server's message: Microsoft's drivers say
# [Microsoft][ODBC Driver 18 for SQL Server][SQL Server], FreeTDS [FreeTDS][SQL Server].
_DRIVER_PREFIX = re.compile(r"\[Microsoft\]\[ODBC Driver \d+ for SQL Server\]\[SQL Server\]|\[FreeTDS\]\[SQL Server\]")


def _messages(cursor: Any) -> list[str]:
    """The informational messages pyodbc collected for the current result (SQL Server's PRINT
    and RAISERROR below 11: one message each)."""
    return [_DRIVER_PREFIX.sub("", str(text)).strip() for _, text in getattr(cursor, "messages", None) or ()]


# psqlODBC joins the notices it holds for one result as "SEVERITY: text;SEVERITY: text", and hands
# the text on in pieces of about 1 KB (one diagnostic record each, cut anywhere).
_PG_NOTICE_BOUNDARY = re.compile(r";(?=(?:NOTICE|WARNING|INFO|LOG|DEBUG): )")


class PostgresNotices:
    """A PostgreSQL job's notices as psqlODBC hands them on: one line per notice, counted.

    psqlODBC keeps the notices of each result in one text whose length it reports in ODBC's 16-bit
    field: past 32,767 characters that length wraps, and what arrives is nothing (600 notices of
    100 characters) or only the first few kilobytes (a 70,000-character notice arrives as its first
    4,472), without any error. So the length of what arrived says nothing about what was sent;
    instead the agent's batch ends with a notice of its own (``end_statement``), with a token
    nobody else knows: when it arrives, the notices it came with arrived whole; when it does not,
    they were cut, and ``note_cut`` says so, with what was kept (docs/steps.md)."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex[:16]     # 64 random bits: no job guesses it
        self.kept = 0              # notices kept (the agent's own end notice not counted)
        self.characters = 0        # their characters
        self.ended = False         # the end notice arrived

    def end_statement(self) -> str:
        """The statement that ends the job's batch (after the job's SQL, on a line of its own:
        a job's last line may be a comment)."""
        tag = f"$agent_{self.token}$"
        return f"\n;\nDO {tag} BEGIN RAISE NOTICE '{self.end_text}'; END {tag};"

    @property
    def end_text(self) -> str:
        """The end notice's text (raised by ``end_statement``, or by the agent's own function)."""
        return f"agent-output-end {self.token}"

    def take(self, cursor: Any) -> list[str]:
        """The notices of the current result, one line each, without the agent's end notice."""
        text = "".join(str(piece) for _, piece in getattr(cursor, "messages", None) or ())
        lines = []
        for notice in _PG_NOTICE_BOUNDARY.split(text) if text else ():
            if notice.strip() == f"NOTICE: {self.end_text}":
                self.ended = True
                continue
            lines.append(notice.strip())
            self.kept += 1
            self.characters += len(notice)
        return lines

    def note_cut(self, output: list[str]) -> None:
        """The batch ran to its end: when the end notice did not arrive, the driver cut notices."""
        if not self.ended:
            output.append(PSQLODBC_CUT_NOTE.format(kept=self.kept, characters=self.characters))


PSQLODBC_CUT_NOTE = ("[output cut by the PostgreSQL ODBC driver: it drops the notices of a statement past about 32 KB; "
                     "{kept} notice(s) of {characters} characters kept; write longer progress into a table]")


# PostgreSQL: what the agent's functions raise where a refusal must stop the batch (and the COMMIT
# it may end with) before it takes effect (migration 0013).
PG_FENCED_SQLSTATE = "AG001"            # agent.finish_run: the run's token moved on
PG_WORK_TRANSACTION_ENDED_SQLSTATE = "AG002"   # agent.check_work_transaction
TSQL_FENCED_NUMBER = 50003               # agent.finish_run (T-SQL, migration 0023): the token moved on
TSQL_ROLLBACK = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;"
# SQL Server answers only the statements that return rows (sessions run with NOCOUNT ON), so a
# batch of several queries is read by each one's count of result sets: the procedures of
# migration 0023 return exactly one (lock_starts none), and these ad-hoc queries as many as their
# SELECTs. A query not named here runs in a batch of its own.
TSQL_RESULT_SETS = {
    "reset_session": 1, "check_work_transaction": 1, "lock_starts": 0, "finish_run": 1,
    "record_attempt_output": 0, "start_follow_up_runs": 1, "dispatch_runs": 1,
}


def _code_start(sql: str) -> str:
    """``sql`` from its first line that is not a comment."""
    lines = sql.splitlines()
    for index, line in enumerate(lines):
        if line.strip() and not line.strip().startswith("--"):
            return "\n".join(lines[index:])
    return ""
WORK_TRANSACTION_ENDED = ("the job's SQL ended the agent's transaction (a COMMIT or ROLLBACK got past the agent's "
                          "check): the attempt fails; what the SQL committed before that stays committed")


class AfterCommitFailed(AgentError):
    """commit_with(then=...): the transaction committed; a call after its COMMIT failed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"after the commit: {describe(cause)}")
        self.cause = cause


def _refusal(exc: BaseException) -> BaseException | None:
    """The engine's own error for a refusal one of the agent's statements raised, or None."""
    info = classify(exc)
    if info.number == TSQL_FENCED_NUMBER:
        return LeaseLost()
    sqlstate = info.sqlstate
    if sqlstate == PG_FENCED_SQLSTATE:
        return LeaseLost()
    if sqlstate == PG_WORK_TRANSACTION_ENDED_SQLSTATE:
        return TransactionControlRefused(WORK_TRANSACTION_ENDED)
    return None


def _merge(parts: Sequence[Result]) -> Result:
    """The Result of one query: the rows of every statement that returns rows, in order (the
    rowcount of the last statement when none does)."""
    rows = [row for part in parts if part.returns_rows for row in part.rows]
    if any(part.returns_rows for part in parts):
        return Result(rows=rows, rowcount=len(rows), returns_rows=True)
    return Result(rowcount=parts[-1].rowcount if parts else 0)


def _connection_lost(exc: BaseException) -> bool:
    """A driver error after which this connection is no use (reconnect on next use)."""

    info = classify(exc)
    return bool(info.sqlstate and info.sqlstate.startswith("08")) or info.connection_lost


def _sqlite_statements(sql: str) -> list[str]:
    """Split a script into statements at the semicolons SQLite itself sees as ends."""
    statements: list[str] = []
    start = 0
    for index, char in enumerate(sql):
        if char == ";" and sqlite3.complete_statement(sql[start:index + 1]):
            statement = sql[start:index + 1].strip()
            if statement.rstrip(";").strip():
                statements.append(statement)
            start = index + 1
    tail = sql[start:].strip()
    if tail:
        statements.append(tail)
    return statements
