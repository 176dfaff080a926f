"""The three SQL dialects cannot drift apart silently.

SQL Server cannot run on our machines, so every T-SQL statement is parsed with sqlglot's T-SQL
dialect, strictly: a statement sqlglot only swallows as an opaque ``Command`` fails, and so does
an unquoted T-SQL reserved word used as a name (sqlglot would read ``IF x IS NULL EXEC (...)`` as
an alias named EXEC and still "parse" it). Then, for every named query, the three dialects must
agree on the name, the parameter set and the result columns, and every dialect's migrations
must create the same tables, columns, defaults, references and indexes.

The files are enumerated from ``shared/control/sql``, so a new query or a new dialect file cannot slip
past these tests. Result columns come from sqlglot (SELECT list, RETURNING, T-SQL OUTPUT); the
extraction itself is checked against ``cursor.description`` of the real databases (SQLite,
PostgreSQL, and SQL Server when the conformance suite runs).
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from shared.control.queries import DIALECTS, SQL_DIR, Query, load_migrations, load_queries, split_statements
from shared.control.sqlerrors import classify
from tests.support.harness import make_agent, mssql_server_is_babelfish

UTC = timezone.utc
SQLGLOT_DIALECT = {"sqlite": "sqlite", "postgres": "postgres", "mssql": "tsql"}

# Known drift of postgres.sql's result columns, each a strict xfail: once the file is fixed the
# test passes, which fails the run until the entry is removed here.
POSTGRES_COLUMN_DRIFT: dict[str, str] = {}

# Reserved keywords of Transact-SQL (learn.microsoft.com, "Reserved keywords (Transact-SQL)").
# Used unquoted as a table, column or alias name they are a syntax error on the server.
TSQL_RESERVED = frozenset("""
ADD ALL ALTER AND ANY AS ASC AUTHORIZATION BACKUP BEGIN BETWEEN BREAK BROWSE BULK BY CASCADE CASE
CHECK CHECKPOINT CLOSE CLUSTERED COALESCE COLLATE COLUMN COMMIT COMPUTE CONSTRAINT CONTAINS
CONTAINSTABLE CONTINUE CONVERT CREATE CROSS CURRENT CURRENT_DATE CURRENT_TIME CURRENT_TIMESTAMP
CURRENT_USER CURSOR DATABASE DBCC DEALLOCATE DECLARE DEFAULT DELETE DENY DESC DISK DISTINCT
DISTRIBUTED DOUBLE DROP DUMP ELSE END ERRLVL ESCAPE EXCEPT EXEC EXECUTE EXISTS EXIT EXTERNAL FETCH
FILE FILLFACTOR FOR FOREIGN FREETEXT FREETEXTTABLE FROM FULL FUNCTION GOTO GRANT GROUP HAVING
HOLDLOCK IDENTITY IDENTITY_INSERT IDENTITYCOL IF IN INDEX INNER INSERT INTERSECT INTO IS JOIN KEY
KILL LEFT LIKE LINENO LOAD MERGE NATIONAL NOCHECK NONCLUSTERED NOT NULL NULLIF OF OFF OFFSETS ON
OPEN OPENDATASOURCE OPENQUERY OPENROWSET OPENXML OPTION OR ORDER OUTER OVER PERCENT PIVOT PLAN
PRECISION PRIMARY PRINT PROC PROCEDURE PUBLIC RAISERROR READ READTEXT RECONFIGURE REFERENCES
REPLICATION RESTORE RESTRICT RETURN REVERT REVOKE RIGHT ROLLBACK ROWCOUNT ROWGUIDCOL RULE SAVE
SCHEMA SECURITYAUDIT SELECT SEMANTICKEYPHRASETABLE SEMANTICSIMILARITYDETAILSTABLE
SEMANTICSIMILARITYTABLE SESSION_USER SET SETUSER SHUTDOWN SOME STATISTICS SYSTEM_USER TABLE
TABLESAMPLE TEXTSIZE THEN TO TOP TRAN TRANSACTION TRIGGER TRUNCATE TRY_CONVERT TSEQUAL UNION
UNIQUE UNPIVOT UPDATE UPDATETEXT USE USER VALUES VARYING VIEW WAITFOR WHEN WHERE WHILE WITH
WRITETEXT
""".split())


# ---------------------------------------------------------------- helpers


def query_files() -> dict[str, Path]:
    return {path.stem: path for path in sorted(SQL_DIR.glob("*.sql"))}


def all_query_names() -> list[str]:
    names: set[str] = set()
    for dialect in DIALECTS:
        names |= load_queries(dialect).keys()
    return sorted(names)


# PostgreSQL session commands and PL/pgSQL functions sqlglot has no grammar for (it falls back to Command, or worse,
# misreads them). They run against the real PostgreSQL in every test that resets a session or
# takes the start lock, which is the check that counts; T-SQL has no such exemption.
POSTGRES_SESSION_COMMANDS = ("LOCK ", "CLOSE ALL", "RESET ", "UNLISTEN ", "DISCARD ", "CREATE FUNCTION ",
                             "CREATE OR REPLACE FUNCTION ", "DO $$")
# T-SQL statements sqlglot has no grammar for: parsed by sqlfluff alone (which parses every T-SQL
# statement as well, see test_tsql_statements_parse_with_sqlfluff).
TSQL_SQLFLUFF_ONLY = ("THROW ", "IF XACT_STATE() <> 1 THROW ", "IF @LOCK_RESULT < 0 THROW ",
                      # The T-SQL interface's modules (procedures, views) and the operator role's grants.
                      "CREATE PROCEDURE ", "ALTER PROCEDURE ", "CREATE FUNCTION ", "CREATE TRIGGER ",
                      "IF DATABASE_PRINCIPAL_ID(N'AGENT_OPERATOR') IS NULL CREATE ROLE ", "GRANT EXECUTE ON OBJECT::",
                      # Fleet targets: pool: members on a server without elastic pools.
                      "IF @POOLS_VIEW IS NULL THROW ")


def _code(sql: str) -> str:
    return "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--")).strip()


def parse_strict(sql: str, dialect: str) -> list[exp.Expression]:
    """Parse ``sql`` (one named-query statement or one migration statement) with sqlglot; raise
    AssertionError for anything sqlglot did not really understand."""
    code = _code(sql).upper()
    if dialect == "postgres" and code.startswith(POSTGRES_SESSION_COMMANDS):
        return []
    if dialect == "mssql" and code.startswith(TSQL_SQLFLUFF_ONLY):
        return []
    read = SQLGLOT_DIALECT[dialect]
    try:
        trees = [tree for tree in sqlglot.parse(sql, read=read, error_level=sqlglot.ErrorLevel.RAISE)
                 if tree is not None]
    except sqlglot.errors.ParseError as exc:
        raise AssertionError(f"{dialect}: sqlglot cannot parse\n{sql}\n{exc}") from None
    assert trees, f"{dialect}: no statement in\n{sql}"
    for tree in trees:
        commands = [node for node in tree.walk() if isinstance(node, exp.Command)]
        assert not commands, (f"{dialect}: sqlglot fell back to an opaque Command for "
                              f"{commands[0].sql(read)[:120]!r} in\n{sql}")
        if dialect == "mssql":
            for node in tree.find_all(exp.Identifier):
                assert node.quoted or node.name.upper() not in TSQL_RESERVED, (
                    f"T-SQL reserved word {node.name!r} used as a name (quote it as [{node.name}]) in\n{sql}")
    return trees


def result_columns(tree: exp.Expression) -> list[str] | None:
    """Names of the columns a statement returns: SELECT list, RETURNING or T-SQL OUTPUT;
    None when it returns no rows."""
    if isinstance(tree, exp.Query):
        if all(isinstance(column, exp.EQ) and isinstance(column.this, exp.Parameter) for column in tree.selects):
            return None   # T-SQL SELECT @variable = ...: assigns, returns no rows
        return [column.alias_or_name.lower() for column in tree.selects]
    returning = tree.args.get("returning")
    if isinstance(returning, exp.Returning) and not returning.args.get("into"):
        return [column.alias_or_name.lower() for column in returning.expressions]
    return None


_TSQL_EXEC = re.compile(r"^\s*EXEC\s+agent\.(\w+)\b", re.IGNORECASE)
# A procedure body's statements that sqlglot does not read: session settings, the transaction's
# own statements, control flow (an IF chunk runs to the first ';' of its block: the block's EXEC).
TSQL_CONTROL = ("SET ", "BEGIN TRANSACTION", "COMMIT TRANSACTION", "IF ", "THROW ", "RETURN", "END")


def tsql_body_statement(statement: str) -> str | None:
    """A body statement as sqlglot should read it: None for control flow (TSQL_CONTROL), the
    statement after an ``ELSE`` (0029's start_follow_up_runs: ``ELSE SELECT ...``)."""
    code = _code(statement)
    if code.upper().startswith("ELSE"):
        code = re.sub(r"(?is)^ELSE\s+(BEGIN\s+)?", "", code)
    return None if code.upper().startswith(TSQL_CONTROL) else code


def tsql_procedure_statements(name: str) -> list[str]:
    """The statements of the body of procedure agent.<name>, as the latest migration creating or
    altering it has them (the hot path's procedures: migration 0023, altered by 0025, 0029, 0030)."""
    found: list[str] = []
    for migration in load_migrations("mssql"):
        for statement in migration.statements():
            match = re.search(r"^(?:CREATE|ALTER) PROCEDURE agent\." + name + r"\b.*?^AS\s*\nBEGIN\s*\n(.*)^END\s*$",
                              _code(statement), re.MULTILINE | re.DOTALL)
            if match:
                found = [s.strip() for s in split_statements(match.group(1), tsql=True)]
    return found


# The T-SQL interface's bodies (agent.<name>_unaudited) the monitor's job form calls (issue 32 item
# 6): created in 0005 and renamed in 0017, their latest body is an ALTER with nested blocks that the
# strict parse does not take; each ends with this one SELECT, which the latest body must still hold.
TSQL_INTERFACE_RESULTS = {
    "add_scheduled_job_unaudited": ("SELECT @name AS job_name, @action AS action;", ["job_name", "action"]),
    "remove_scheduled_job_unaudited": ("SELECT @name AS job_name, @skipped AS skipped_runs;", ["job_name", "skipped_runs"]),
    "set_job_steps_unaudited": ("SELECT CAST(@job_name AS NVARCHAR(64)) AS job, @stored AS requested_steps;",
                                ["job", "requested_steps"]),
}


def tsql_interface_columns(name: str) -> list[str]:
    last = None
    for migration in load_migrations("mssql"):
        for statement in migration.statements():
            if re.search(r"^(?:CREATE|ALTER) PROCEDURE agent\." + name + r"\b", _code(statement), re.MULTILINE):
                last = statement
    select, columns = TSQL_INTERFACE_RESULTS[name]
    assert last is not None and select in last, f"the latest body of agent.{name} no longer ends with {select!r}"
    return columns


def tsql_body_columns(name: str) -> list[str] | None:
    """The columns of the rows procedure agent.<name> returns (every statement of its body that
    returns rows must return the same)."""
    body = tsql_procedure_statements(name)
    assert body, f"no migration creates procedure agent.{name}"
    columns = None
    for statement in body:
        statement = tsql_body_statement(statement)
        if statement is None:
            continue
        for tree in parse_strict(statement, "mssql"):
            found = result_columns(tree)
            if found is not None:
                assert columns is None or found == columns, (name, columns, found)
                columns = found
    return columns


def query_columns(query: Query, dialect: str) -> list[str] | None:
    """Like the Store: the rows of every statement that returns rows, so they must all return
    the same columns. A T-SQL query that calls a procedure of the agent returns its body's."""
    # A DECLARE before the EXEC returns nothing (a variable for an argument that cannot be an
    # expression, as define_job's @run_at): the call's result is the query's.
    calls = [s for s in query.statements if not _code(s.sql).upper().startswith("DECLARE ")]
    if dialect == "mssql" and len(calls) == 1 and (call := _TSQL_EXEC.match(_code(calls[0].sql))) \
            and call.group(1) in TSQL_INTERFACE_RESULTS:
        return tsql_interface_columns(call.group(1))
    if dialect == "mssql" and len(calls) == 1 and (call := _TSQL_EXEC.match(_code(calls[0].sql))):
        return tsql_body_columns(call.group(1))
    columns = None
    for statement in query.statements:
        for tree in parse_strict(statement.sql, dialect):
            found = result_columns(tree)
            if found is not None:
                assert columns is None or found == columns, (
                    f"{query.name} ({dialect}): its statements return different columns: {columns} and {found}")
                columns = found
    return columns


def _against_postgres(name: str, dialect: str):
    reason = POSTGRES_COLUMN_DRIFT.get(name)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, dialect, marks=marks, id=f"{name}-{dialect}")


# ---------------------------------------------------------------- the files


def test_every_query_file_is_a_known_dialect_and_every_dialect_has_both_files():
    assert set(query_files()) == set(DIALECTS)
    for dialect in DIALECTS:
        assert load_migrations(dialect), f"no migrations for {dialect}"


def test_every_dialect_defines_the_same_queries():
    names = {dialect: set(load_queries(dialect)) for dialect in DIALECTS}
    everything = set().union(*names.values())
    missing = {dialect: sorted(everything - defined) for dialect, defined in names.items() if everything - defined}
    assert not missing, f"queries missing from a dialect: {missing}"


def test_every_dialect_has_the_same_migration_versions():
    versions = {dialect: [(m.version, m.description) for m in load_migrations(dialect)] for dialect in DIALECTS}
    assert versions["sqlite"] == versions["postgres"] == versions["mssql"], versions


# ---------------------------------------------------------------- every statement parses


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", all_query_names())
def test_named_query_parses(name, dialect):
    query = load_queries(dialect)[name]
    for statement in query.statements:
        parse_strict(statement.sql, dialect)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_migrations_parse(dialect):
    for migration in load_migrations(dialect):
        for statement in migration.statements():
            parse_strict(statement, dialect)


def test_the_strict_parse_rejects_what_sqlglot_only_pretends_to_parse():
    """The two ways sqlglot accepts T-SQL it does not understand, both caught."""
    with pytest.raises(AssertionError, match="reserved word"):
        parse_strict("IF SCHEMA_ID(N'agent') IS NULL EXEC (N'CREATE SCHEMA agent')", "mssql")
    with pytest.raises(AssertionError, match="Command"):
        parse_strict("CREATE USER [app] FROM EXTERNAL PROVIDER", "mssql")
    with pytest.raises(AssertionError, match="reserved word"):
        parse_strict("SELECT b.key FROM OPENJSON(?) AS b", "mssql")


def _babelfish_refusals(sql: str) -> list[str]:
    """What Babelfish for PostgreSQL 4.2 refuses in one T-SQL statement (each is valid on SQL
    Server), found in sqlglot's tree."""
    found = []
    for tree in parse_strict(sql, "mssql"):
        for node in tree.walk():
            if isinstance(node, exp.Merge):
                found.append("MERGE")
            elif isinstance(node, exp.WithinGroup) or (isinstance(node, exp.GroupConcat)
                                                        and isinstance(node.this, exp.Order)):
                found.append("STRING_AGG ... WITHIN GROUP")
            elif isinstance(node, exp.Update):
                output = node.args.get("returning")
                if node.args.get("with") or node.args.get("with_"):
                    found.append("UPDATE through a CTE")
                if output is not None:
                    if any(column.table.lower() == "deleted" for column in output.find_all(exp.Column)):
                        found.append("deleted.* in an UPDATE's OUTPUT")
                    # The joins of the UPDATE's own FROM (not those inside a derived table there).
                    source = node.args.get("from") or node.args.get("from_")
                    joins = [*(source.args.get("joins") or []), *(source.this.args.get("joins") or [])] if source else []
                    joined = {join.this.alias_or_name.lower() for join in joins if join.args.get("on") is not None}
                    read = {column.table.lower() for assignment in node.expressions
                            for column in assignment.expression.find_all(exp.Column)}
                    if joined & read:
                        found.append("UPDATE ... OUTPUT whose SET reads a table joined with ON (join in the WHERE clause)")
            elif isinstance(node, exp.Insert):
                select = node.expression
                if node.args.get("returning") is not None and isinstance(select, exp.Query) and select.args.get("order"):
                    found.append("INSERT ... OUTPUT ... SELECT ... ORDER BY")
    return found


def test_tsql_keeps_to_what_babelfish_accepts_too():
    """One T-SQL dialect for SQL Server, Azure SQL and Babelfish: none of the statements Babelfish
    refuses (MERGE, UPDATE through a CTE, deleted.* in OUTPUT, INSERT ... OUTPUT ... ORDER BY,
    STRING_AGG ... WITHIN GROUP, an UPDATE ... OUTPUT reading a table joined with ON), no CREATE
    OR ALTER in the migrations. The conformance run on Babelfish (AGENT_TEST_MSSQL) runs them."""
    refused = {name: found for name, query in load_queries("mssql").items()
               for statement in query.statements if (found := _babelfish_refusals(statement.sql))}
    assert not refused, refused
    for migration in load_migrations("mssql"):
        code = "\n".join(line.split("--", 1)[0] for line in migration.path.read_text(encoding="utf-8").splitlines())
        assert "OR ALTER" not in code.upper(), migration.path.name
    # The check itself finds each of them.
    assert _babelfish_refusals("MERGE agent.state AS t USING (SELECT 1 AS k) AS s ON t.k = s.k "
                               "WHEN MATCHED THEN UPDATE SET v = 1;") == ["MERGE"]
    assert "UPDATE through a CTE" in _babelfish_refusals(
        "WITH p AS (SELECT TOP (1) * FROM agent.runs ORDER BY run_id) UPDATE p SET token = token + 1")
    assert "deleted.* in an UPDATE's OUTPUT" in _babelfish_refusals(
        "UPDATE agent.runs SET token = 1 OUTPUT deleted.status INTO @t WHERE run_id = 1")
    assert _babelfish_refusals("UPDATE r SET note = j.note OUTPUT inserted.run_id INTO @t FROM agent.runs AS r "
                               "JOIN agent.jobs AS j ON j.job_name = r.job_name") == [
        "UPDATE ... OUTPUT whose SET reads a table joined with ON (join in the WHERE clause)"]
    assert not _babelfish_refusals("UPDATE r SET note = N'x' OUTPUT inserted.run_id INTO @t FROM agent.runs AS r "
                                   "JOIN agent.jobs AS j ON j.job_name = r.job_name")
    assert not _babelfish_refusals("UPDATE r SET note = j.note OUTPUT inserted.run_id INTO @t FROM agent.runs AS r, "
                                   "agent.jobs AS j WHERE j.job_name = r.job_name")
    assert _babelfish_refusals("INSERT INTO agent.runs (run_id) OUTPUT inserted.run_id INTO @t "
                               "SELECT x FROM y ORDER BY x") == ["INSERT ... OUTPUT ... SELECT ... ORDER BY"]
    assert _babelfish_refusals("SELECT STRING_AGG(name, N', ') WITHIN GROUP (ORDER BY name) FROM t") == [
        "STRING_AGG ... WITHIN GROUP"]


_LIKE_CLASS_WITH_TRAILING_HYPHEN = re.compile(r"LIKE\s+N?'[^']*\[\^?[^\]]*-\]")


def _latest_tsql_modules() -> dict[str, str]:
    """Each procedure, function, view and trigger's text as the last migration defines it."""
    latest: dict[str, str] = {}
    for migration in load_migrations("mssql"):
        text = migration.path.read_text(encoding="utf-8")
        for found in re.finditer(r"^(?:CREATE|ALTER) (?:PROCEDURE|FUNCTION|VIEW|TRIGGER) (agent\.\w+)", text, re.M):
            end = text.find("\nGO\n", found.start())
            latest[found.group(1)] = text[found.start(): end if end > 0 else len(text)]
    return latest


def test_tsql_like_classes_put_a_literal_hyphen_first():
    """SQL Server reads a hyphen first or last in a LIKE class as itself; Babelfish only when it
    comes first (with it last, '%[^A-Za-z0-9_.-]%' matched nothing in 'bad name' or 'a;b', and the
    procedures' name checks let hostile names through). Every module as it stands, and every named
    query, writes the hyphen first."""
    offending = {name: _LIKE_CLASS_WITH_TRAILING_HYPHEN.findall(text) for name, text in _latest_tsql_modules().items()
                 if _LIKE_CLASS_WITH_TRAILING_HYPHEN.search(text)}
    offending.update({name: [s.sql for s in query.statements] for name, query in load_queries("mssql").items()
                      if any(_LIKE_CLASS_WITH_TRAILING_HYPHEN.search(s.sql) for s in query.statements)})
    assert not offending, offending
    assert "agent.exec_async" in _latest_tsql_modules() and "agent.add_scheduled_job" in _latest_tsql_modules()
    assert _LIKE_CLASS_WITH_TRAILING_HYPHEN.search("@name COLLATE Latin1_General_BIN2 LIKE N'%[^A-Za-z0-9_.-]%'")
    assert not _LIKE_CLASS_WITH_TRAILING_HYPHEN.search("@name COLLATE Latin1_General_BIN2 LIKE N'%[^-A-Za-z0-9_.]%'")


def test_tsql_uses_only_what_azure_sql_database_has():
    """No msdb, no cross-database (three-part) names, no xp_ procedures, no USE."""
    texts = {f"query {name}": query.text for name, query in load_queries("mssql").items()}
    texts.update({f"migration {m.path.name}": m.path.read_text(encoding="utf-8") for m in load_migrations("mssql")})
    for where, text in texts.items():
        code = "\n".join(line.split("--", 1)[0] for line in text.splitlines()).lower()
        assert "msdb" not in code and "xp_" not in code, where
        for statement in split_statements(text, tsql=True):
            for tree in parse_strict(statement, "mssql"):
                assert not isinstance(tree, exp.Use), where
                for table in tree.find_all(exp.Table):
                    assert not table.catalog, f"{where}: cross-database name {table.sql('tsql')}"


# ---------------------------------------------------------------- same parameters, same columns


@pytest.mark.parametrize("name", all_query_names())
def test_same_parameters_in_every_dialect(name):
    parameters = {dialect: load_queries(dialect)[name].parameters for dialect in DIALECTS}
    assert parameters["mssql"] == parameters["postgres"] == parameters["sqlite"], parameters


@pytest.mark.parametrize("name,dialect", [_against_postgres(name, dialect)
                                          for name in all_query_names() for dialect in ("sqlite", "mssql")])
def test_same_result_columns_as_postgres(name, dialect):
    expected = query_columns(load_queries("postgres")[name], "postgres")
    actual = query_columns(load_queries(dialect)[name], dialect)
    assert actual == expected, f"{name}: {dialect} returns {actual}, postgres returns {expected}"


@pytest.mark.parametrize("name", all_query_names())
def test_tsql_returns_the_same_columns_as_sqlite(name):
    assert query_columns(load_queries("mssql")[name], "mssql") == query_columns(load_queries("sqlite")[name], "sqlite")


# Values for running every row-returning query against a real database (in a transaction that is
# rolled back): the point is cursor.description, not the rows.
_T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
DUMMY_VALUES = {
    "now": _T, "late_cutoff": _T, "lease_until": _T, "retry_at": _T, "invisible_until": _T,
    "visible_at": _T, "stale_before": _T, "far": _T, "far_lease": _T, "horizon": _T, "lookahead_until": _T,
    "jobs": [], "advances": [], "runs": [], "run_ids": [], "bodies": [], "slots": [], "events": [], "held": [],
    "max_concurrency": 5, "batch": 1, "history_before": _T, "poison_before": _T, "ahead_limit": 5, "dispatch_lease_seconds": 60, "max_lapses": 3,
    "max_chain_jobs": 100, "run_id": 1, "token": 1, "limit": 5, "max_in_flight": 5, "dequeue_count": 1, "attempt": 1,
    "version": 999999, "poison_id": 1, "max_attempts": 1, "timeout_seconds": 1, "lease_seconds": 60,
    "error_number": None, "task_order": None, "target_database": None,
    "command": "SELECT 1", "worker": "w", "body": "b", "reason": "r", "errors": "[]",
    "operation_id": "op", "description": "d", "state_key": "k", "state_value": "v",
    "queue_name": "q", "pop_receipt": "p", "outcome": "o", "error_message": "e",
    "error_sqlstate": "HY000", "message_id": "m", "job_name": "j",
}
# The monitor's queries (issue 17).
DUMMY_VALUES.update({"since": _T})
# raise_alerts (issue 32 items 1-2): the p95 history of SLOWER_THAN.
DUMMY_VALUES.update({"history": 20, "min_history": 5, "oldest_slot": _T})

# The T-SQL interface's planning of jobs defined in the database (issue 14).
DUMMY_VALUES.update({"plans": []})
# Issue 15 (steps, output, notifications).
DUMMY_VALUES.update({
    "step": 1, "next_step": 2, "failures": 0, "failed_step": None, "run_status": "running", "runnable_at": _T,
    "next_database": None, "step_output": "(1 row(s) affected)",
    "default_url": None, "claim_token": "c", "claimed_until": _T, "notification_id": 1, "status": "sent",
    "next_attempt_at": _T, "last_error": None,
})
# Issue 27 (pause and resume).
DUMMY_VALUES.update({"paused_by": "p", "paused_until": None})
# Issue 34 (pauses settled again at each change).
DUMMY_VALUES.update({"pause_start": _T, "pause_end": None})
# Issue 35 (the hot path): the id of the job's transaction (NULL: nothing to compare).
DUMMY_VALUES.update({"work_transaction": None})
# Issue 16 (fleet jobs).
DUMMY_VALUES.update({
    "pool": "p", "targets": [], "parallelism": 8, "stagger_seconds": 0, "next_on_success": 0, "next_on_failure": -1,
    "target_count": 0, "retry_interval_seconds": None, "parent_run_id": None,
})
# Issue 33 item 4 (run with parameters): a run's values, as JSON (NULL: none given).
DUMMY_VALUES.update({"params": None})
# set_job_steps (migration 0028)
DUMMY_VALUES.update({"steps": None})
# Issue 33 item 5 (backfill): the note its runs carry, the slots as JSON.
DUMMY_VALUES.update({"note": "backfill: test"})

# Issue 32 item 4 (the audit trail).
DUMMY_VALUES.update({"principal": None, "fallback_principal": "u", "client": "c", "source": "cli",
                     "action": "stop", "arguments": "{}", "detail": None, "audit_outcome": "done"})
# Issue 32, from the attack (F5): the row 'done' asked for after a commit whose connection was lost.
DUMMY_VALUES.update({"audit_id": 1})
# Issue 32 item 6 (the monitor's job form): agent.add_scheduled_job's arguments, valid ones (the
# procedure's body runs, in the rolled-back transaction).
DUMMY_VALUES.update({"sql": "SELECT 1", "schedule": "0 0 1 * * *", "run_at": None, "timezone": "UTC", "enabled": 1,
                     "overlap": "skip", "database": None, "misfire": "run-once", "grace_seconds": 86400,
                     "target_parallelism": 8, "after": None, "after_outcome": "succeeded",
                     "target_stagger_seconds": 0, "catchup_seconds": 0, "owner": "o"})
# Issue 32 item 3 (condition alerts).
DUMMY_VALUES.update({"alerts": [], "checks": [], "results": [], "firings": [], "limit": 10, "alert_name": None,
                     "firing_id": 1, "response_error": None, "timeout_ms": "1000"})


def test_result_columns_match_the_real_database(db_url, tmp_path):
    """The sqlglot extraction above agrees with what the driver reports, on each real database."""
    agent = make_agent(db_url)
    store = agent.new_store()
    checked: list[str] = []
    undescribed: list[str] = []
    refused: list[str] = []
    unavailable: list[str] = []
    try:
        for name, query in sorted(store.queries.items()):
            expected = query_columns(query, store.dialect)
            if expected is None or name in ("lock_migrations", "bootstrap_schema", "release_migration_lock"):
                continue   # no rows to describe (the lock would also wait on init-db's commit)
            unknown = query.parameters - DUMMY_VALUES.keys()
            assert not unknown, f"{name}: add dummy values for {sorted(unknown)}"
            described = None

            class Rollback(Exception):
                pass

            # Sent as the store sends it: on SQL Server the whole query is one batch (a table
            # variable or DECLAREd value lives for one batch only, on every T-SQL server), so its
            # result sets are read in turn; elsewhere statement by statement.
            sent = [query.batch] if store.dialect == "mssql" else query.statements
            if store.dialect == "mssql" and name == "probe_rows":
                # reads the temporary table prepare_probe makes in the probe's transaction
                sent = [store.queries["prepare_probe"].batch, query.batch]
            with pytest.raises(Rollback):
                with store.transaction():
                    for statement in sent:
                        values = [_bind(store, DUMMY_VALUES[p]) for p in statement.params]
                        # SQL Server: autocommit outside the transaction, whose BEGIN rides on its
                        # first batch (Store._tsql_begun), so that the rollback undoes the query.
                        sql = store._tsql_begun(statement.sql) if store.dialect == "mssql" else statement.sql
                        cursor = store.connection.cursor()
                        try:
                            cursor.execute(sql, values) if values else cursor.execute(sql)
                        except Exception as exc:
                            info = classify(exc)
                            if (store.dialect == "mssql" and mssql_server_is_babelfish()
                                    and NOT_ON_BABELFISH.get(name) == info.number):
                                unavailable.append(name)   # the query refuses this server, as it must
                                raise Rollback() from None
                            if REFUSED_WITH_DUMMY_VALUES.get((store.dialect, name)) not in (info.sqlstate, info.number):
                                raise
                            refused.append(name)    # the fence raised, as it must for a run not running
                            raise Rollback() from None
                        while True:
                            if cursor.description and not statement.sql.upper().startswith("SELECT PG_ADVISORY_UNLOCK_ALL"):
                                described = [column[0].lower() for column in cursor.description]
                            if store.dialect != "mssql" or not cursor.nextset():
                                break
                        cursor.close()
                    raise Rollback()
            if name in refused or name in unavailable:
                continue
            if described is None and store.dialect == "postgres" and not query.text.lstrip().upper().startswith("SELECT"):
                # psqlodbc describes no result set for an UPDATE/INSERT ... RETURNING that
                # affected no row; such a statement is checked on the other databases.
                undescribed.append(name)
                continue
            assert described == expected, f"{name}: the database describes {described}, sqlglot found {expected}"
            checked.append(name)
    finally:
        store.close()
        agent.close()
    selects = [name for name, q in store.queries.items()
               if q.text.lstrip().upper().startswith("SELECT") and name not in ("lock_migrations", "release_migration_lock", "bootstrap_schema")]
    assert set(selects) <= set(checked) | set(refused) | set(unavailable), sorted(set(selects) - set(checked) - set(refused))
    assert refused == sorted(name for dialect, name in REFUSED_WITH_DUMMY_VALUES if dialect == store.dialect)
    assert len(checked) + len(undescribed) >= 20


# Queries that raise with the dummy values, by design: PostgreSQL's finish_run is the fence, raising
# (SQLSTATE AG001) for a run that is not running with the given token, so that a completion batch
# ending with COMMIT stops before it; T-SQL's since migration 0023 too (THROW 50003). Their columns
# are compared by sqlglot above.
# Babelfish is not Azure SQL Database: a pool: target's lookup raises 51400 there by design (no
# sys.database_service_objectives, no elastic pools); its columns are checked on SQL Server.
NOT_ON_BABELFISH: dict[str, int] = {"list_pool_databases": 51400}
# remove_job (the monitor's job form): agent.remove_scheduled_job's body refuses a job that is not
# defined ('j'), P0002 on PostgreSQL, 51404 on T-SQL.
REFUSED_WITH_DUMMY_VALUES: dict[tuple[str, str], str | int] = {("postgres", "finish_run"): "AG001",
                                                               ("mssql", "finish_run"): 50003,
                                                               ("postgres", "remove_job"): "P0002",
                                                               ("mssql", "remove_job"): 51404,
                                                               # set_job_steps: likewise (0028)
                                                               ("postgres", "set_job_steps"): "P0002",
                                                               ("mssql", "set_job_steps"): 51404}


def _bind(store, value):
    import json

    if isinstance(value, datetime):
        return store.db_time(value)
    if isinstance(value, list):
        return json.dumps(value)
    return value


# ---------------------------------------------------------------- same schema


def _table_key(table: exp.Table) -> str:
    name = table.name.lower()
    if table.db:
        assert table.db.lower() == "agent", f"table outside the agent schema: {table.sql()}"
        return name
    assert name.startswith("agent_"), f"SQLite tables carry the agent_ prefix: {name}"
    return name[len("agent_"):]


def _type_family(kind: exp.DataType | None) -> tuple[str, int | None]:
    """PostgreSQL and T-SQL column types reduced to what must agree between them."""
    if kind is None:
        return ("?", None)
    this = kind.this
    size = None
    params = kind.expressions
    if params and isinstance(params[0].this, exp.Literal):
        size = int(params[0].this.this)
    text = {exp.DataType.Type.VARCHAR, exp.DataType.Type.NVARCHAR, exp.DataType.Type.TEXT}
    if this in text:
        return ("text", size)
    if this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.DATETIME2):
        return ("timestamp", None)
    return (this.name.lower(), None)


def _column(column: exp.ColumnDef, dialect: str) -> tuple:
    constraints = [c.args.get("kind") for c in column.constraints]
    not_null = any(isinstance(c, exp.PrimaryKeyColumnConstraint) for c in constraints) or any(
        isinstance(c, exp.NotNullColumnConstraint) and not c.args.get("allow_null")
        for c in constraints)
    default = next((c.this.sql() for c in constraints
                    if isinstance(c, exp.DefaultColumnConstraint)), None)
    reference = next((f"{_table_key(c.this.this)}({', '.join(e.name for e in c.this.expressions)})"
                      for c in constraints if isinstance(c, exp.Reference)), None)
    family = _type_family(column.args.get("kind")) if dialect != "sqlite" else None
    return (column.name.lower(), not_null, default, reference, family)


def schema_of(dialect: str) -> dict[str, dict]:
    """{table: {"columns": [(name, not_null, default, references, type)], "indexes": {...}}} from the
    bootstrap query and every migration of ``dialect``."""
    statements = [s.sql for s in load_queries(dialect)["bootstrap_schema"].statements]
    for migration in load_migrations(dialect):
        statements.extend(migration.statements())
    tables: dict[str, dict] = {}
    for statement in statements:
        for tree in parse_strict(statement, dialect):
            if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "TABLE":
                for dropped in tree.args.get("tables") or [tree.this]:
                    tables.pop(_table_key(dropped), None)
                continue
            if isinstance(tree, exp.Alter):
                table = tables[_table_key(tree.this)]
                for action in tree.args.get("actions") or []:
                    if isinstance(action, exp.ColumnDef):
                        table["columns"].append(_column(action, dialect))
                continue
            for create in tree.find_all(exp.Create):
                kind = (create.args.get("kind") or "").upper()
                if kind == "TABLE":
                    schema = create.this
                    columns = [_column(column, dialect) for column in schema.expressions
                               if isinstance(column, exp.ColumnDef)]
                    tables.setdefault(_table_key(schema.this), {"indexes": {}})["columns"] = columns
                elif kind == "INDEX":
                    index = create.this
                    columns = tuple(o.this.name.lower() for o in index.args["params"].args["columns"])
                    table = tables.setdefault(_table_key(index.args["table"]), {"indexes": {}})
                    table["indexes"][index.name.lower()] = (columns, bool(create.args.get("unique")))
    return tables


# PostgreSQL's alone: agent.owned_sessions, whose job a session is running, so that agent.* called
# from inside an owned job records its owner (migration 0019). T-SQL's procedures see the owner
# as USER_NAME() inside the job's EXECUTE AS USER; SQLite has no procedures.
POSTGRES_ONLY_TABLES = {"owned_sessions"}


def test_every_dialect_creates_the_same_tables_columns_and_indexes():
    schemas = {dialect: schema_of(dialect) for dialect in DIALECTS}
    assert set(schemas["postgres"]) == {"schema_version", "state", "jobs", "runs", "attempts", "job_events",
                                         "poison_messages", "start_lock", "notifications", "job_pauses", "calendars", "audit",
                                         "alerts", "alert_firings", *POSTGRES_ONLY_TABLES}
    for table in POSTGRES_ONLY_TABLES:
        del schemas["postgres"][table]
    for dialect in ("sqlite", "mssql"):
        assert set(schemas[dialect]) == set(schemas["postgres"]), dialect
        for table, expected in schemas["postgres"].items():
            actual = schemas[dialect][table]
            strip = (lambda cols: [c[:4] for c in cols]) if dialect == "sqlite" else (lambda cols: cols)
            assert strip(actual["columns"]) == strip(expected["columns"]), f"{dialect}: table {table}"
            assert actual["indexes"] == expected["indexes"], f"{dialect}: indexes of {table}"


def test_tsql_claim_index_is_unique_and_filtered_on_job_name():
    """SQL Server treats NULLs as equal in a unique index; every task has job_name NULL."""
    statements = [s for m in load_migrations("mssql") for s in m.statements() if "runs_job_slot" in s]
    (create,) = [t for s in statements for t in parse_strict(s, "mssql") if isinstance(t, exp.Create)]
    assert create.args.get("unique")
    where = create.this.args["params"].args.get("where")
    assert where is not None and where.sql("tsql") == "WHERE NOT job_name IS NULL"


# ---------------------------------------------------------------- a second T-SQL grammar


def _as_tsql_variables(sql: str) -> str:
    """:name parameters as @name (what the server receives through sp_prepexec), outside strings."""
    from shared.control.queries import substitute_parameters

    return substitute_parameters(sql, lambda name: "@" + name)


def _tsql_statements() -> list[tuple[str, str]]:
    found = [(f"query {name}", statement) for name, query in load_queries("mssql").items()
             for statement in split_statements(query.text, tsql=True)]
    found += [(f"migration {m.path.name}", statement) for m in load_migrations("mssql") for statement in m.statements()]
    return found


def test_tsql_statements_parse_with_sqlfluff():
    """Every T-SQL statement also parses with sqlfluff's T-SQL grammar (no unparsable section):
    an independent second grammar, and the only one for what sqlglot cannot read (THROW)."""
    from sqlfluff.core import FluffConfig, Linter

    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql", "large_file_skip_byte_limit": 0}))
    failures = []
    for where, statement in _tsql_statements():
        parsed = linter.parse_string(_as_tsql_variables(statement))
        problems = [str(v) for v in parsed.violations]
        if problems or parsed.tree is None or "unparsable" in parsed.tree.stringify():
            failures.append(f"{where}:\n{statement}\n{problems[:2]}")
    assert not failures, "\n\n".join(failures)


def test_the_sqlfluff_check_fails_on_broken_tsql():
    from sqlfluff.core import FluffConfig, Linter

    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
    parsed = linter.parse_string("UPDATE agent.runs SET WHERE run_id = @run_id;")
    assert parsed.violations or "unparsable" in parsed.tree.stringify()


def test_tsql_hot_path_procedures_keep_to_what_babelfish_accepts_too():
    """The procedures of migration 0023 (the claim, the start, the completion's calls): every
    statement of their bodies sqlglot reads is free of what Babelfish refuses, and each named
    query that calls one returns its body's columns (test_same_result_columns_as_postgres)."""
    calls = {m.group(1) for q in load_queries("mssql").values() if len(q.statements) == 1
             and (m := _TSQL_EXEC.match(_code(q.statements[0].sql)))} - set(TSQL_INTERFACE_RESULTS)
    assert {"claim_runs", "start_run", "finish_run", "start_follow_up_runs", "dispatch_runs"} <= calls
    # And the procedures their bodies call (0029's start_follow_up_runs_found).
    nested = {m.group(1) for name in calls for statement in tsql_procedure_statements(name)
              for m in re.finditer(r"\bEXEC\s+agent\.(\w+)", _code(statement), re.IGNORECASE)}
    assert "start_follow_up_runs_found" in nested, nested
    # A procedure that hands its call on returns what the one it calls returns, in both branches.
    assert tsql_body_columns("start_follow_up_runs_found") == tsql_body_columns("start_follow_up_runs")
    calls |= nested
    refused = {}
    for name in sorted(calls):
        body = tsql_procedure_statements(name)
        assert body, name
        for statement in body:
            statement = tsql_body_statement(statement)
            if statement is None:
                continue
            if found := _babelfish_refusals(statement):
                refused[name] = found
        migration = "\n".join(p.read_text() for p in sorted((SQL_DIR / "migrations" / "mssql").glob("0023_*.sql")))
        assert "CREATE OR ALTER" not in _code(migration).upper() and "MERGE " not in _code(migration).upper()
    assert not refused, refused
