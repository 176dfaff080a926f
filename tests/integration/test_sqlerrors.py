"""The transient/permanent classifier and retry_transient.

PostgreSQL errors are produced for real, through pyodbc and psqlodbc, against the local
server (CI=true: a missing server fails these tests). SQL Server cannot run here, so the
Microsoft ODBC driver's errors are verbatim texts quoted in public issues, each cited; they are
wrapped in real pyodbc exception objects exactly as pyodbc renders them.
"""

from __future__ import annotations

import http.server
import os
import random
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import closing

import pytest

try:
    import pyodbc
except ImportError as exc:  # unixODBC missing: a CI failure, a skip elsewhere
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"pyodbc cannot be imported ({exc}): apt-get install unixodbc odbc-postgresql", allow_module_level=True)

from shared.control.sqlerrors import (
    PERMANENT_SQLSERVER_NUMBERS,
    TRANSIENT_SQLSERVER_NUMBERS,
    SqlErrorInfo,
    classify,
    diagnostic_records,
    is_transient,
    is_unique_violation,
    retry_transient,
)
from shared.errors import AgentError, ConfigError
from tests.support.harness import PG_BASE, create_pg_database, drop_pg_database, pg_admin_connection, service_missing


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raised(operation) -> BaseException:
    try:
        operation()
    except BaseException as exc:  # noqa: BLE001 - the point is to capture whatever the driver raises
        return exc
    pytest.fail("expected the operation to raise")


# --------------------------------------------------------------------------------- PostgreSQL


class Pg:
    """One scratch database (and roles) for the module."""

    def __init__(self) -> None:
        if "PostgreSQL Unicode" not in pyodbc.drivers() and "PostgreSQL Unicode" in PG_BASE:
            service_missing("the PostgreSQL ODBC driver", "apt-get install odbc-postgresql")
        self.suffix = uuid.uuid4().hex[:10]
        self.database, self.url = create_pg_database()
        self.reader = f"sqlerr_ro_{self.suffix}"
        self.limited = f"sqlerr_lim_{self.suffix}"
        admin = pg_admin_connection()
        try:
            admin.execute(f"CREATE ROLE {self.reader} LOGIN")
            admin.execute(f"CREATE ROLE {self.limited} LOGIN CONNECTION LIMIT 0")
        finally:
            admin.close()
        with self.connect(autocommit=True) as conn:
            conn.execute("CREATE TABLE t (i int PRIMARY KEY, v int NOT NULL)")
            conn.execute("INSERT INTO t VALUES (1, 0), (2, 0)")

    def connect(self, *, autocommit: bool = False, user: str | None = None):
        url = self.url if user is None else _with_uid(self.url, user)
        conn = pyodbc.connect(url, autocommit=autocommit, timeout=5)
        # No test may hang on a lock if something goes wrong.
        conn.execute("SET statement_timeout = '20s'")
        if not autocommit:
            conn.commit()
        return conn

    def close(self) -> None:
        drop_pg_database(self.database)
        admin = pg_admin_connection()
        try:
            admin.execute(f"DROP ROLE IF EXISTS {self.reader}")
            admin.execute(f"DROP ROLE IF EXISTS {self.limited}")
        finally:
            admin.close()


def _with_uid(url: str, user: str) -> str:
    parts = [p for p in url.split(";") if p and not p.lower().startswith("uid=")]
    return ";".join(parts + [f"Uid={user}"]) + ";"


@pytest.fixture(scope="module")
def pg():
    database = Pg()
    try:
        yield database
    finally:
        database.close()


def test_pg_syntax_error_is_permanent_with_clean_message(pg):
    with closing(pg.connect(autocommit=True)) as conn:
        exc = raised(lambda: conn.execute("SELEC 1"))
    info = classify(exc)
    assert info == SqlErrorInfo("permanent", None, "42601", 'syntax error at or near "SELEC"')
    assert not is_transient(exc)


@pytest.mark.parametrize(("sql", "sqlstate", "text"), [
    ("SELECT * FROM no_such_table", "42P01", 'relation "no_such_table" does not exist'),
    ("SELECT no_such_column FROM t", "42703", 'column "no_such_column" does not exist'),
    ("SELECT no_such_function(1)", "42883", "function no_such_function(integer) does not exist"),
    ("SELECT 1 / 0", "22012", "division by zero"),
    ("SELECT 'x'::int", "22P02", 'invalid input syntax for type integer: "x"'),
])
def test_pg_missing_objects_and_bad_data_are_permanent(pg, sql, sqlstate, text):
    with closing(pg.connect(autocommit=True)) as conn:
        exc = raised(lambda: conn.execute(sql))
    info = classify(exc)
    assert (info.kind, info.sqlstate, info.message) == ("permanent", sqlstate, text)
    # psqlodbc's "(1)" native code is not a SQL Server error number.
    assert info.number is None


@pytest.mark.parametrize("text", ["stop here;", "two;;", "no semicolon", "a; b"])
def test_pg_messages_keep_their_own_semicolons(pg, text):
    """psqlODBC appends ';' and "Error while executing the query" to every message: only that
    is removed, never a ';' of the server's own message."""
    with closing(pg.connect(autocommit=True)) as conn:
        exc = raised(lambda: conn.execute(f"DO $$BEGIN RAISE EXCEPTION '{text}'; END$$"))
    assert classify(exc).message == text
    assert is_unique_violation(exc) is False


def test_pg_unique_violation_is_permanent_and_one_line(pg):
    with closing(pg.connect(autocommit=True)) as conn:
        exc = raised(lambda: conn.execute("INSERT INTO t VALUES (1, 5)"))
    info = classify(exc)
    assert (info.kind, info.sqlstate, info.number) == ("permanent", "23505", None)
    assert info.message == 'duplicate key value violates unique constraint "t_pkey" DETAIL: Key (i)=(1) already exists.'
    assert "\n" not in info.message and "Error while executing" not in info.message
    assert is_unique_violation(exc)


def test_pg_permission_denied_is_permanent(pg):
    with closing(pg.connect(autocommit=True, user=pg.reader)) as conn:
        exc = raised(lambda: conn.execute("SELECT * FROM t"))
    info = classify(exc)
    assert (info.kind, info.sqlstate, info.message) == ("permanent", "42501", "permission denied for table t")


def test_pg_deadlock_between_two_connections_is_transient(pg):
    first, second = pg.connect(), pg.connect()
    errors: list[BaseException] = []

    def update(conn, sql):
        try:
            conn.execute(sql)
        except pyodbc.Error as exc:
            errors.append(exc)
            conn.rollback()  # release the victim's locks so the other statement can finish

    try:
        first.execute("UPDATE t SET v = 1 WHERE i = 1")
        second.execute("UPDATE t SET v = 1 WHERE i = 2")
        blocked = threading.Thread(target=update, args=(first, "UPDATE t SET v = 2 WHERE i = 2"))
        blocked.start()
        time.sleep(0.3)  # let the first connection wait on the second's row lock
        update(second, "UPDATE t SET v = 2 WHERE i = 1")
        blocked.join(timeout=30)
        assert not blocked.is_alive()
    finally:
        first.rollback(), second.rollback()
        first.close(), second.close()
    assert len(errors) == 1, errors
    info = classify(errors[0])
    assert (info.kind, info.sqlstate, info.number) == ("transient", "40P01", None)
    assert info.message.startswith("deadlock detected DETAIL: Process ")
    assert info.connection_lost is False


def test_pg_serialization_failure_is_transient_and_its_native_code_is_ignored(pg):
    first, second = pg.connect(), pg.connect()
    try:
        for conn in (first, second):
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            conn.execute("SELECT sum(v) FROM t").fetchall()
        first.execute("UPDATE t SET v = v + 1 WHERE i = 1")
        second.execute("UPDATE t SET v = v + 1 WHERE i = 2")
        first.commit()
        exc = raised(second.commit)
    finally:
        second.rollback()
        first.close(), second.close()
    info = classify(exc)
    assert (info.kind, info.sqlstate) == ("transient", "40001")
    # The message ends "... during commit attempt. (110) (SQLEndTran)": 110 is psqlodbc's code.
    assert "(110)" in exc.args[1] and info.number is None
    assert info.message.startswith("could not serialize access")


def test_pg_terminated_backend_is_transient_and_connection_lost(pg):
    victim = pg.connect(autocommit=True)
    pid = victim.execute("SELECT pg_backend_pid()").fetchval()
    admin = pg_admin_connection()
    try:
        assert admin.execute("SELECT CASE WHEN pg_terminate_backend(?) THEN 1 ELSE 0 END", pid).fetchval() == 1
    finally:
        admin.close()
    time.sleep(0.2)
    terminated = raised(lambda: victim.execute("SELECT 1").fetchall())
    afterwards = raised(lambda: victim.execute("SELECT 1").fetchall())
    first, second = classify(terminated), classify(afterwards)
    assert (first.kind, first.sqlstate, first.connection_lost) == ("transient", "57P01", True)
    assert first.message.startswith("terminating connection due to administrator command")
    assert second.sqlstate.startswith("08") and second.kind == "transient" and second.connection_lost


def test_closed_port_is_transient_08001_without_number():
    port = closed_port()
    url = f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={port};Database=postgres;Uid=root;"
    if "PostgreSQL Unicode" not in pyodbc.drivers():
        service_missing("the PostgreSQL ODBC driver", "apt-get install odbc-postgresql")
    exc = raised(lambda: pyodbc.connect(url, timeout=3))
    info = classify(exc)
    assert (info.kind, info.sqlstate, info.number, info.connection_lost) == ("transient", "08001", None, True)
    assert "Connection refused" in info.message
    assert "(101)" in exc.args[1]  # psqlodbc's native code, deliberately not trusted


def test_pg_connect_failures_that_retrying_cannot_fix_are_permanent(pg):
    missing_db = raised(lambda: pyodbc.connect(f"{PG_BASE}Database=sqlerr_missing_{pg.suffix};", timeout=5))
    missing_role = raised(lambda: pyodbc.connect(_with_uid(pg.url, f"sqlerr_nobody_{pg.suffix}"), timeout=5))
    for exc, text in ((missing_db, "does not exist"), (missing_role, "does not exist")):
        info = classify(exc)
        assert (info.kind, info.sqlstate) == ("permanent", "08001"), info
        assert text in info.message


def test_pg_too_many_connections_is_transient(pg):
    # 53300 as the server reports it; psqlodbc surfaces it as 08001 with the server's text.
    exc = raised(lambda: pg.connect(user=pg.limited))
    info = classify(exc)
    assert (info.kind, info.sqlstate) == ("transient", "08001")
    assert "too many connections for role" in info.message


def test_pg_statement_timeout_is_permanent(pg):
    # 57014: the job's own time limit, not a fault that goes away; the executor decides.
    with closing(pg.connect(autocommit=True)) as conn:
        conn.execute("SET statement_timeout = '100ms'")
        exc = raised(lambda: conn.execute("SELECT pg_sleep(2)"))
    info = classify(exc)
    assert (info.kind, info.sqlstate, info.message) == ("permanent", "57014", "canceling statement due to statement timeout")


# ------------------------------------------------------------- Microsoft ODBC driver (verbatim)

# (pyodbc class, sqlstate, message, kind, number, connection_lost, message start, source)
MICROSOFT_SAMPLES = [
    pytest.param(
        "Error", "HY000",
        "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Database 'databasename' on server "
        "'servername.database.windows.net' is not currently available.  Please retry the connection later.  "
        "If the problem persists, contact customer support, and provide them the session tracing ID of "
        "'{3B6C6E7D-744D-49D5-B152-8418ADA28174}'. (40613) (SQLDriverConnect)",
        "transient", 40613, True, "Database 'databasename' on server 'servername.database.windows.net' is not currently available. Please retry",
        # Source: Azure GPT-RAG troubleshooting guide, section "SQL Database is Unavailable or
        # Autopaused" (log line of a failed token-authenticated connect), found with the search
        # tool's code corpus.
        id="40613-serverless-paused-driver18",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Cannot open server 'databasename' "
        "requested by the login. Client with IP address '999.999.999.999' is not allowed to access the server.  "
        "To enable access, use the Azure Management Portal or run sp_set_firewall_rule on the master database "
        "to create a firewall rule for this IP address or address range.  It may take up to five minutes for "
        "this change to take effect. (40615) (SQLDriverConnect)",
        "permanent", 40615, False, "Cannot open server 'databasename' requested by the login. Client with IP",
        # Source: same guide, section "Client IP Address Not Allowed by SQL Database Firewall".
        id="40615-firewall-driver18",
    ),
    pytest.param(
        "IntegrityError", "40001",
        "[40001] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Transaction (Process ID 52) was "
        "deadlocked on lock resources with another process and has been chosen as the deadlock victim. "
        "Rerun the transaction. (1205) (SQLParamData)",
        "transient", 1205, False, "Transaction (Process ID 52) was deadlocked",
        # Source: https://github.com/qatrackplus/qatrackplus/issues/542
        id="1205-deadlock-driver17",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [FreeTDS][SQL Server]Transaction (Process ID 58) was deadlocked on lock | communication "
        "buffer resources with another process and has been chosen as the deadlock victim. Rerun the "
        "transaction. (1205) (SQLExecDirectW)",
        "transient", 1205, False, "Transaction (Process ID 58) was deadlocked",
        # Source: https://github.com/home-assistant/core/issues/34438 (FreeTDS reports 42000; the
        # number decides).
        id="1205-deadlock-freetds-42000",
    ),
    pytest.param(
        "ProgrammingError", "42S02",
        "[42S02] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Invalid object name "
        "'report_tvshows_2023_view'. (208) (SQLExecDirectW); [42S02] [Microsoft][ODBC Driver 17 for SQL "
        "Server][SQL Server]Statement(s) could not be prepared. (8180)",
        "permanent", 208, False, "Invalid object name 'report_tvshows_2023_view'. Statement(s) could not be prepared.",
        # Source: https://github.com/microsoft/mssql-django/issues/261
        id="208-invalid-object-two-records",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [Microsoft][ODBC SQL Server Driver][SQL Server]Sintaxis incorrecta cerca de 'Gaitón'. "
        "(102) (SQLExecDirectW)",
        "permanent", 102, False, "Sintaxis incorrecta cerca de 'Gaitón'.",
        # Source: https://github.com/mkleehammer/pyodbc/issues/760 (localized server text: the
        # number is what counts).
        id="102-syntax-localized",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Incorrect syntax near the keyword "
        "'if'. (156) (SQLExecDirectW)",
        "permanent", 156, False, "Incorrect syntax near the keyword 'if'.",
        # Source: https://github.com/dbt-msft/dbt-sqlserver/issues/11
        id="156-syntax-keyword",
    ),
    pytest.param(
        "InterfaceError", "28000",
        "[28000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Login failed for user 'admin'. "
        "(18456) (SQLDriverConnect)",
        "permanent", 18456, False, "Login failed for user 'admin'.",
        # Source: https://github.com/davidcomerford/pyodbc-mssql-lambda-layer/issues/4
        id="18456-login-failed-driver18",
    ),
    pytest.param(
        "InterfaceError", "28000",
        "[28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Login failed for user "
        "'<token-identified principal>'. (18456) (SQLDriverConnect)",
        "permanent", 18456, False, "Login failed for user '<token-identified principal>'.",
        # Source: https://github.com/Azure/azure-sdk-for-python/issues/29336 (a function app
        # connecting with an Entra ID token)
        id="18456-token-principal",
    ),
    pytest.param(
        "InterfaceError", "28000",
        "[28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]用户 'sa' 登录失败。 (18456) "
        "(SQLDriverConnect); [28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]无法打开登录所请求的数据库 "
        "\"qq\"。登录失败。 (4060); [28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]用户 'sa' "
        "登录失败。 (18456); [28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]无法打开登录所请求的数据库 "
        "\"qq\"。登录失败。 (4060)",
        "transient", 4060, False, "用户 'sa' 登录失败。 无法打开登录所请求的数据库 \"qq\"。登录失败。",
        # Source: https://github.com/yehoshuadimarsky/bcpandas/issues/28 (four records, two
        # numbers; 4060 is on Azure SQL's transient list, so it wins)
        id="4060-with-18456-four-records",
    ),
    pytest.param(
        "OperationalError", "HYT00",
        "[HYT00] [Microsoft][ODBC Driver 17 for SQL Server]Login timeout expired (0) (SQLDriverConnect)",
        "transient", None, False, "Login timeout expired",
        # Source: https://github.com/jeancochrane/pytest-flask-sqlalchemy/issues/58
        id="HYT00-login-timeout",
    ),
    pytest.param(
        "OperationalError", "08001",
        "[08001] [Microsoft][ODBC Driver 18 for SQL Server]TCP Provider: The wait operation timed out.\r\n "
        "(258) (SQLDriverConnect)",
        "transient", 258, True, "TCP Provider: The wait operation timed out.",
        # Source: https://github.com/mkleehammer/pyodbc/issues/1319 (the issue title: its first
        # diagnostic record, "\r\n" as the driver sends it)
        id="08001-tcp-timeout-driver18",
    ),
    pytest.param(
        "OperationalError", "08S01",
        "[08S01] [Microsoft][ODBC Driver 17 for SQL Server]TCP Provider: Error code 0x2746 (10054) (SQLExecDirectW)",
        "transient", 10054, True, "TCP Provider: Error code 0x2746",
        # Source: https://github.com/mkleehammer/pyodbc/issues/427 (Azure SQL, connection reset)
        id="10054-connection-reset",
    ),
    pytest.param(
        "Error", "HY000",
        # Not quoted from a log: the server text is Microsoft's documented message for 40501
        # (MicrosoftDocs/sql-docs, azure-sql/database/troubleshoot-common-errors-issues.md, as
        # reviewed in https://github.com/MicrosoftDocs/sql-docs/pull/7709) with its %ls/%d filled
        # in, in the rendering pyodbc gives every Microsoft-driver record above.
        "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]The service is currently busy. Retry "
        "the request after 10 seconds. Incident ID: {5D3D3B5A-1B7B-4C2A-9D0E-3A1F2B4C5D6E}. Code: 4. (40501) "
        "(SQLExecDirectW)",
        "transient", 40501, False, "The service is currently busy. Retry the request after 10 seconds.",
        id="40501-throttled-documented-text",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [FreeTDS][SQL Server]canceling statement due to lock timeout (33557097) (SQLExecDirectW)",
        "transient", 33557097, False, "canceling statement due to lock timeout",
        # Source: Babelfish for PostgreSQL 4.2.0 through FreeTDS, SET LOCK_TIMEOUT 2000 and a row
        # another session holds (PostgreSQL's 55P03 has no SQL Server number in Babelfish's mapping).
        id="babelfish-lock-timeout-unmapped",
    ),
    pytest.param(
        "ProgrammingError", "42000",
        "[42000] [FreeTDS][SQL Server]'MERGE' is not currently supported in Babelfish (33557097) (SQLExecDirectW)",
        "permanent", 33557097, False, "'MERGE' is not currently supported in Babelfish",
        # Source: Babelfish for PostgreSQL 4.2.0 through FreeTDS, a MERGE statement.
        id="babelfish-unsupported-permanent",
    ),
]


@pytest.mark.parametrize(
    ("cls", "sqlstate", "message", "kind", "number", "lost", "start"), MICROSOFT_SAMPLES
)
def test_microsoft_driver_errors(cls, sqlstate, message, kind, number, lost, start):
    exc = getattr(pyodbc, cls)(sqlstate, message)
    info = classify(exc)
    assert (info.kind, info.number, info.sqlstate, info.connection_lost) == (kind, number, sqlstate, lost)
    assert info.message.startswith(start), info.message
    # One line, driver prefixes and the "(N) (SQLxxx)" trailer gone.
    assert "\n" not in info.message and "\r" not in info.message
    assert "[Microsoft]" not in info.message and "[SQL Server]" not in info.message and "[FreeTDS]" not in info.message
    assert "(SQL" not in info.message and f"({number})" not in info.message


def test_number_lists_do_not_overlap_and_cover_the_azure_transient_list():
    assert not TRANSIENT_SQLSERVER_NUMBERS & PERMANENT_SQLSERVER_NUMBERS
    assert {4060, 4221, 40143, 40197, 40501, 40540, 40613, 49918, 49919, 49920, 10928, 10929, 10053, 10054,
            10060, 233, 997, 1204, 1205, 1222, 64, 20} <= TRANSIENT_SQLSERVER_NUMBERS
    assert {102, 156, 229, 230, 262, 297, 300, 208, 207, 2812, 2627, 2601, 245, 8114} <= PERMANENT_SQLSERVER_NUMBERS


def test_a_known_permanent_number_wins_over_a_connection_class_sqlstate():
    # Same record layout as the samples above; 2627 reported under a connection-class state must
    # not be retried (constraint violations never heal).
    exc = pyodbc.IntegrityError(
        "08S01", "[08S01] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Violation of PRIMARY KEY "
        "constraint 'pk_runs'. Cannot insert duplicate key in object 'agent.runs'. (2627) (SQLExecDirectW)")
    assert classify(exc).kind == "permanent"


def test_unknown_driver_error_is_permanent():
    exc = pyodbc.Error("HY000", "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Something odd. (50000) (SQLExecDirectW)")
    assert classify(exc) == SqlErrorInfo("permanent", 50000, "HY000", "Something odd.")


def test_diagnostic_records_keep_every_record_and_which_numbers_are_trusted(pg):
    with closing(pg.connect(autocommit=True)) as conn:
        pg_error = raised(lambda: conn.execute("SELEC 1"))
    (record,) = diagnostic_records(pg_error)
    assert (record.sqlstate, record.native, record.trusted) == ("42601", 1, False)
    ms = pyodbc.ProgrammingError("42S02", MICROSOFT_SAMPLES[4].values[2])
    records = diagnostic_records(AgentError("wrapped"))  # nothing ODBC-shaped inside
    assert records == []
    natives = [(r.sqlstate, r.native, r.trusted) for r in diagnostic_records(ms)]
    assert natives == [("42S02", 208, True), ("42S02", 8180, True)]


# ------------------------------------------------------------------------- wrappers, sqlite, OS


def test_wrapped_driver_error_is_classified_by_its_cause():
    if "PostgreSQL Unicode" not in pyodbc.drivers():
        service_missing("the PostgreSQL ODBC driver", "apt-get install odbc-postgresql")
    port = closed_port()
    driver_error = raised(lambda: pyodbc.connect(
        f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={port};Database=postgres;Uid=root;", timeout=3))
    try:
        raise AgentError("cannot connect to the control database") from driver_error
    except AgentError as wrapper:
        info = classify(wrapper)
    assert (info.kind, info.sqlstate, info.message) == ("transient", "08001", "cannot connect to the control database")

    try:
        raise ConfigError("AGENT_DB", "x", "a reachable database") from driver_error
    except ConfigError as config:
        assert classify(config).kind == "permanent"  # bad settings never become retryable


def test_sqlite_lock_errors_are_transient_and_others_permanent(tmp_path):
    path = tmp_path / "locks.db"
    holder = sqlite3.connect(path, timeout=0, isolation_level=None)
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        holder.execute("CREATE TABLE t (x)")
        holder.execute("BEGIN EXCLUSIVE")
        busy = raised(lambda: other.execute("INSERT INTO t VALUES (1)"))
        holder.execute("ROLLBACK")
    finally:
        holder.close(), other.close()
    assert classify(busy) == SqlErrorInfo("transient", None, None, "database is locked")

    memory = sqlite3.connect(":memory:", isolation_level=None)
    memory.execute("CREATE TABLE t (x)")
    memory.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
    reading = memory.execute("SELECT x FROM t")
    reading.fetchone()
    table_locked = raised(lambda: memory.execute("DROP TABLE t"))
    syntax = raised(lambda: memory.execute("SELEC 1"))
    missing = raised(lambda: memory.execute("SELECT * FROM nope"))
    memory.close()
    assert classify(table_locked).kind == "transient" and classify(table_locked).message == "database table is locked"
    assert classify(syntax) == SqlErrorInfo("permanent", None, None, 'near "SELEC": syntax error')
    assert classify(missing).kind == "permanent"


def test_python_network_errors_are_transient():
    refused = raised(lambda: socket.create_connection(("127.0.0.1", closed_port()), timeout=2))
    assert isinstance(refused, ConnectionRefusedError)
    info = classify(refused)
    assert info.kind == "transient" and info.connection_lost and info.message.startswith("ConnectionRefusedError: ")

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=0.05) as client:
            timed_out = raised(lambda: client.recv(1))  # the server never sends
    assert isinstance(timed_out, TimeoutError)
    assert classify(timed_out).kind == "transient"


def test_local_file_errors_and_plain_bugs_are_permanent(tmp_path):
    missing = raised(lambda: open(tmp_path / "nope.sql"))
    assert isinstance(missing, FileNotFoundError) and classify(missing).kind == "permanent"
    assert classify(ValueError("bad value")) == SqlErrorInfo("permanent", None, None, "ValueError: bad value")
    assert classify(KeyboardInterrupt()).kind == "permanent"


class _StatusHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's naming
        status = int(self.path.strip("/"))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_azure_sdk_request_errors():
    from azure.core import PipelineClient
    from azure.core.rest import HttpRequest

    port = closed_port()
    client = PipelineClient(base_url=f"http://127.0.0.1:{port}", policies=[])
    unreachable = raised(lambda: client.send_request(HttpRequest("GET", f"http://127.0.0.1:{port}/")))
    assert type(unreachable).__name__ == "ServiceRequestError" and classify(unreachable).kind == "transient"

    server = http.server.HTTPServer(("127.0.0.1", 0), _StatusHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        client = PipelineClient(base_url=base, policies=[])
        busy = raised(lambda: client.send_request(HttpRequest("GET", f"{base}/503")).raise_for_status())
        missing = raised(lambda: client.send_request(HttpRequest("GET", f"{base}/404")).raise_for_status())
    finally:
        server.shutdown()
        server.server_close()
    assert type(busy).__name__ == "HttpResponseError" and classify(busy).kind == "transient"
    assert classify(missing).kind == "permanent"


# ----------------------------------------------------------------------------- retry_transient


def transient_error() -> BaseException:
    return pyodbc.OperationalError(
        "HYT00", "[HYT00] [Microsoft][ODBC Driver 17 for SQL Server]Login timeout expired (0) (SQLDriverConnect)")


def permanent_error() -> BaseException:
    return pyodbc.ProgrammingError(
        "42S02", "[42S02] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Invalid object name 'x'. (208) (SQLExecDirectW)")


class Flaky:
    """Fails with the given errors in turn, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.raised: list[BaseException] = []

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            error = self.errors.pop(0)
            self.raised.append(error)
            raise error
        return "ok"


def test_retry_recovers_after_transient_errors_with_jittered_growing_backoff():
    sleeps: list[float] = []
    seen: list[tuple[int, str, float]] = []
    operation = Flaky(*[transient_error() for _ in range(4)])
    result = retry_transient(
        operation, what="test", attempts=5, base_delay=0.5, max_delay=15.0,
        sleep=sleeps.append, on_retry=lambda n, info, delay: seen.append((n, info.sqlstate, delay)),
        rng=random.Random(7),
    )
    assert result == "ok" and operation.calls == 5
    # Full jitter: retry n waits uniform(0, min(max, base * 2**(n-1))); same seed, same draws.
    reference = random.Random(7)
    assert sleeps == [reference.uniform(0.0, cap) for cap in (0.5, 1.0, 2.0, 4.0)]
    assert seen == [(n, "HYT00", delay) for n, delay in zip((1, 2, 3, 4), sleeps)]


def test_retry_backoff_bounds_and_growth_over_many_runs():
    per_retry: list[list[float]] = [[], [], [], [], []]
    for _ in range(400):
        sleeps: list[float] = []
        retry_transient(Flaky(*[transient_error() for _ in range(5)]), what="test", attempts=6,
                        base_delay=1.0, max_delay=5.0, sleep=sleeps.append)
        for index, delay in enumerate(sleeps):
            per_retry[index].append(delay)
    caps = [1.0, 2.0, 4.0, 5.0, 5.0]  # doubling, then held at max_delay
    for delays, cap in zip(per_retry, caps):
        assert all(0.0 <= d <= cap for d in delays)
        assert len(set(delays)) > 300  # jittered, not a fixed schedule
    means = [sum(d) / len(d) for d in per_retry]
    assert means[0] < means[1] < means[2] < means[3]  # grows until the cap...
    assert max(per_retry[3]) > 4.0  # ...and really uses the room max_delay leaves


def test_retry_stops_at_attempts_and_raises_the_last_error():
    sleeps: list[float] = []
    errors = [transient_error() for _ in range(3)]
    operation = Flaky(*errors)
    with pytest.raises(pyodbc.OperationalError) as caught:
        retry_transient(operation, what="test", attempts=3, sleep=sleeps.append)
    assert operation.calls == 3 and len(sleeps) == 2
    assert caught.value is errors[2]


def test_retry_does_not_retry_permanent_errors():
    sleeps: list[float] = []
    error = permanent_error()
    operation = Flaky(transient_error(), error)
    with pytest.raises(pyodbc.ProgrammingError) as caught:
        retry_transient(operation, what="test", attempts=5, sleep=sleeps.append)
    assert caught.value is error and operation.calls == 2 and len(sleeps) == 1


def test_retry_does_not_catch_keyboard_interrupt():
    operation = Flaky(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        retry_transient(operation, what="test", sleep=lambda s: pytest.fail("must not sleep"))
    assert operation.calls == 1


def test_retry_rejects_bad_arguments():
    with pytest.raises(ValueError, match="attempts=0"):
        retry_transient(lambda: 1, what="test", attempts=0)
    with pytest.raises(ValueError, match="base_delay=-1"):
        retry_transient(lambda: 1, what="test", base_delay=-1)


def test_retry_a_real_connect_to_a_closed_port():
    if "PostgreSQL Unicode" not in pyodbc.drivers():
        service_missing("the PostgreSQL ODBC driver", "apt-get install odbc-postgresql")
    url = f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={closed_port()};Database=postgres;Uid=root;"
    calls: list[int] = []
    sleeps: list[float] = []

    def connect():
        calls.append(1)
        return pyodbc.connect(url, timeout=3)

    with pytest.raises(pyodbc.OperationalError) as caught:
        retry_transient(connect, what="connect", attempts=3, sleep=sleeps.append)
    assert len(calls) == 3 and len(sleeps) == 2
    assert caught.value.args[0] == "08001"


# ---------------------------------------------------------------- connecting as long as Azure needs


class _FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def _odbc_error(number: int, text: str, sqlstate: str = "HY000"):
    import pyodbc

    return pyodbc.OperationalError(sqlstate, f"[{sqlstate}] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
                                             f"{text} ({number}) (SQLDriverConnect)")


def test_a_resuming_serverless_database_is_waited_for_with_ten_second_floors():
    from shared.control.sqlerrors import retry_connect

    fake = _FakeTime()
    failures = iter([_odbc_error(40613, "Database 'db' on server 's' is not currently available.")] * 5)

    def connect():
        error = next(failures, None)
        if error is not None:
            raise error
        return "connected"

    assert retry_connect(connect, what="t", budget_seconds=90, sleep=fake.sleep, monotonic=fake.monotonic) == "connected"
    assert len(fake.sleeps) == 5 and all(delay >= 10 for delay in fake.sleeps)   # 40613 asks for >= 10 s


def test_the_connect_budget_is_kept_then_the_last_error_is_raised():
    import pyodbc

    from shared.control.sqlerrors import retry_connect

    fake = _FakeTime()

    def connect():
        raise _odbc_error(40501, "The service is currently busy.")

    with pytest.raises(pyodbc.OperationalError, match="40501"):
        retry_connect(connect, what="t", budget_seconds=90, sleep=fake.sleep, monotonic=fake.monotonic)
    assert 80 <= sum(fake.sleeps) <= 90 and all(delay >= 10 or sum(fake.sleeps) >= 89 for delay in fake.sleeps[:-1])


def test_a_permanent_connect_error_is_raised_at_once():
    import pyodbc

    from shared.control.sqlerrors import retry_connect

    fake = _FakeTime()

    def connect():
        raise _odbc_error(18456, "Login failed for user 'x'.", "28000")

    with pytest.raises(pyodbc.Error):
        retry_connect(connect, what="t", budget_seconds=90, sleep=fake.sleep, monotonic=fake.monotonic)
    assert fake.sleeps == []


def test_cannot_open_database_is_transient_for_the_control_database_only():
    from shared.control.sqlerrors import classify
    from shared.errors import ConnectError

    cause = _odbc_error(4060, 'Cannot open database "tenant_x" requested by the login. The login failed.', "42000")
    assert classify(ConnectError("cannot connect to the control database", cause)).kind == "transient"
    assert classify(ConnectError("cannot connect to database tenant_x", cause, control_database=False)).kind == "permanent"


def test_freetds_words_for_a_lost_session_are_transient_whatever_the_sqlstate():
    """FreeTDS reports a session the server ended (Babelfish's KILL) as HY000 as often as 08S01."""
    import pyodbc

    from shared.control.sqlerrors import classify

    for state in ("HY000", "08S01"):
        info = classify(pyodbc.OperationalError(
            state, f"[{state}] [FreeTDS][SQL Server]Unexpected EOF from the server (20017) (SQLExecDirectW)"))
        assert info.kind == "transient" and info.connection_lost, (state, info)
    info = classify(pyodbc.ProgrammingError("42000", "[42000] [FreeTDS][SQL Server]Incorrect syntax near 'x'. (102) "
                                                     "(SQLExecDirectW)"))
    assert info.kind == "permanent"
