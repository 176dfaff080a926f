"""What tests build on (tests/conftest.py turns some of it into fixtures): control databases of
every dialect, agents on them, and direct SQL to set up and read test tables. Every store
scenario runs on SQLite and on PostgreSQL (through pyodbc, as production reaches Azure SQL).
Each PostgreSQL test gets a database of its own.

PostgreSQL location: AGENT_TEST_PG (an ODBC connection string without Database), default
``Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;``. With CI=true a
missing PostgreSQL fails the tests; elsewhere they are skipped with a message.

SQL Server / Azure SQL (the conformance run): AGENT_TEST_MSSQL holds an ODBC connection string
(``Driver={ODBC Driver 18 for SQL Server};Server=...;Uid=...;Pwd=...;Encrypt=yes;...``). Each
test gets a scratch database (CREATE DATABASE, READ_COMMITTED_SNAPSHOT ON as in Azure SQL), or,
with AGENT_TEST_MSSQL_DATABASE, the named existing database with its agent schema and the
tables the test created dropped. Unset, there is no "mssql" variant: SQL Server cannot run on
our machines (not even in CI); the T-SQL is still parsed and compared in test_dialects.py.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]

PG_BASE = os.environ.get("AGENT_TEST_PG", "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;")
IN_CI = os.environ.get("CI", "").lower() == "true"
MSSQL_BASE = os.environ.get("AGENT_TEST_MSSQL", "").strip()
MSSQL_DATABASE = os.environ.get("AGENT_TEST_MSSQL_DATABASE", "").strip()
# AGENT_TEST_PG_LEAST_PRIVILEGE=1: every db_url's PostgreSQL database is reached as a login with
# grant-sql --agent-login's rights (least_privilege_database), plus CREATE on schema public for the
# tables the tests set up through the agent's own connection; the agent's paths then run as it.
LEAST_PRIVILEGE = os.environ.get("AGENT_TEST_PG_LEAST_PRIVILEGE", "").strip().lower() in ("1", "true", "yes")
UTC = timezone.utc


def service_missing(what: str, how: str) -> None:
    """Fail in CI (a skipped test is a missing test), skip on a developer machine."""
    if IN_CI:
        pytest.fail(f"{what} is not available in CI: {how}", pytrace=False)
    pytest.skip(f"{what} is not available: {how}")


def pg_admin_connection():
    try:
        import pyodbc
    except ImportError as exc:
        service_missing("pyodbc/unixODBC", f"install unixodbc and odbc-postgresql ({exc})")
    try:
        return pyodbc.connect(PG_BASE + "Database=postgres;", autocommit=True, timeout=5)
    except pyodbc.Error as exc:
        service_missing("PostgreSQL", f"start it or set AGENT_TEST_PG ({exc.args[-1] if exc.args else exc})")


def create_pg_database() -> tuple[str, str]:
    name = f"agent_test_{uuid.uuid4().hex[:12]}"
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"CREATE DATABASE {name}")
    finally:
        admin.close()
    return name, f"{PG_BASE}Database={name};"


def drop_pg_database(name: str) -> None:
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        admin.close()


def mssql_connection(database: str):
    """An autocommit connection to ``database`` on the AGENT_TEST_MSSQL server."""
    from shared.control.connection_strings import with_database

    try:
        import pyodbc
    except ImportError as exc:
        pytest.fail(f"AGENT_TEST_MSSQL is set but pyodbc cannot load ({exc}): install unixODBC", pytrace=False)
    try:
        return pyodbc.connect(with_database(MSSQL_BASE, database), autocommit=True, timeout=30)
    except pyodbc.Error as exc:
        pytest.fail(f"AGENT_TEST_MSSQL is set but SQL Server cannot be reached: {exc}", pytrace=False)


def _mssql_user_tables(cursor) -> set[str]:
    cursor.execute("SELECT QUOTENAME(s.name) + '.' + QUOTENAME(t.name) FROM sys.tables AS t "
                   "JOIN sys.schemas AS s ON s.schema_id = t.schema_id WHERE s.name <> N'agent'")
    return {row[0] for row in cursor.fetchall()}


def _mssql_drop_agent_schema(cursor) -> None:
    cursor.execute("SELECT QUOTENAME(OBJECT_NAME(parent_object_id)), QUOTENAME(name) FROM sys.foreign_keys "
                   "WHERE OBJECT_SCHEMA_NAME(parent_object_id) = N'agent'")
    for table, constraint in cursor.fetchall():
        cursor.execute(f"ALTER TABLE [agent].{table} DROP CONSTRAINT {constraint}")
    cursor.execute("SELECT QUOTENAME(name) FROM sys.tables WHERE schema_id = SCHEMA_ID(N'agent')")
    for (table,) in cursor.fetchall():
        cursor.execute(f"DROP TABLE [agent].{table}")
    cursor.execute("IF SCHEMA_ID(N'agent') IS NOT NULL EXEC (N'DROP SCHEMA [agent]')")


@contextlib.contextmanager
def mssql_database() -> Iterator[str]:
    """A control database URL on SQL Server / Azure SQL for one test (see the module docstring)."""
    if not MSSQL_BASE:
        pytest.skip("SQL Server cannot run on this machine: set AGENT_TEST_MSSQL to an ODBC connection "
                    "string (and AGENT_TEST_MSSQL_DATABASE for an existing Azure SQL database) to run "
                    "the conformance suite against SQL Server or Azure SQL")
    from shared.control.connection_strings import with_database

    if MSSQL_DATABASE:
        # Azure SQL: CREATE DATABASE is slow and billed; reuse an empty database instead.
        connection = mssql_connection(MSSQL_DATABASE)
        cursor = connection.cursor()
        _mssql_drop_agent_schema(cursor)
        before = _mssql_user_tables(cursor)
        try:
            yield with_database(MSSQL_BASE, MSSQL_DATABASE)
        finally:
            _mssql_drop_agent_schema(cursor)
            for table in sorted(_mssql_user_tables(cursor) - before):
                cursor.execute(f"DROP TABLE {table}")
            connection.close()
        return
    name = f"agent_test_{uuid.uuid4().hex[:12]}"
    admin = mssql_connection("master")
    babelfish = mssql_is_babelfish(admin)
    try:
        cursor = admin.cursor()
        cursor.execute(f"CREATE DATABASE [{name}]")
        # What every Azure SQL database runs (and what the T-SQL dialect is written for).
        # Babelfish has no ALTER DATABASE: PostgreSQL's READ COMMITTED reads a snapshot taken
        # at each statement already, which is what READ_COMMITTED_SNAPSHOT ON gives.
        if not babelfish:
            cursor.execute(f"ALTER DATABASE [{name}] SET READ_COMMITTED_SNAPSHOT ON")
        yield with_database(MSSQL_BASE, name)
    finally:
        cursor = admin.cursor()
        if babelfish:
            babelfish_end_sessions(cursor, name)
        else:
            cursor.execute(f"IF DB_ID(N'{name}') IS NOT NULL ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE")
        cursor.execute(f"IF DB_ID(N'{name}') IS NOT NULL DROP DATABASE [{name}]")
        admin.close()


def babelfish_end_sessions(cursor, name: str) -> None:
    """Babelfish has no ALTER DATABASE ... SET SINGLE_USER WITH ROLLBACK IMMEDIATE, and refuses
    to drop a database a session still uses: end those sessions (a worker a test left running)."""
    import time

    import pyodbc

    deadline = time.monotonic() + 10
    while True:
        cursor.execute("SELECT session_id FROM sys.dm_exec_sessions "
                       f"WHERE database_id = DB_ID(N'{name}') AND session_id <> @@SPID")
        sessions = [row[0] for row in cursor.fetchall() if row[0] is not None]
        if not sessions or time.monotonic() > deadline:
            return
        for session in sessions:
            with contextlib.suppress(pyodbc.Error):
                cursor.execute(f"KILL {int(session)}")
        time.sleep(0.2)


def mssql_is_babelfish(connection) -> bool:
    """Whether a T-SQL connection reaches Babelfish for PostgreSQL (SERVERPROPERTY('Babelfish')
    is 1 there and NULL on SQL Server and Azure SQL)."""
    cursor = connection.cursor()
    cursor.execute("SELECT CAST(SERVERPROPERTY('Babelfish') AS NVARCHAR(10))")
    value = cursor.fetchone()[0]
    cursor.close()
    return value == "1"


# The SQL Server variant exists only when a server is given: SQL Server cannot run on our
# machines, and a test that can never run here is better absent than skipped every time.
DIALECT_PARAMS = ["sqlite", "postgres"] + (["mssql"] if MSSQL_BASE else [])


def as_from_a_terminal() -> None:
    """preexec_fn for a command a test stops with Ctrl-C (SIGINT): a terminal starts it with
    SIGINT at its default, but a test runner started in the background by a non-interactive
    shell hands SIGINT on ignored, and Python then never raises KeyboardInterrupt."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@contextlib.contextmanager
def fresh_database(dialect: str, tmp_path: Path | None = None) -> Iterator[str]:
    """A fresh, empty control database URL of ``dialect`` (sqlite needs ``tmp_path``), dropped
    afterwards."""
    if dialect == "sqlite":
        assert tmp_path is not None
        yield f"sqlite:///{tmp_path / 'agent.db'}"
        return
    if dialect == "mssql":
        with mssql_database() as url:
            yield url
        return
    if LEAST_PRIVILEGE:
        with least_privilege_database(test_tables=True) as (url, _, _):
            yield url
        return
    name, url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(name)


def job_env(jobs: dict[str, dict[str, str]], **agent: str) -> dict[str, str]:
    """App settings for jobs given as {name: {SUFFIX: value}} plus engine settings."""
    env = {f"JOB__{name}__{key}": value for name, settings in jobs.items() for key, value in settings.items()}
    env.update(agent)
    return env


class Clock:
    """A settable clock for the engine (the queue keeps real time)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        from datetime import timedelta

        self.now = self.now + timedelta(seconds=seconds)
        return self.now


def make_agent(db: str, jobs: dict[str, dict[str, str]] | None = None, *, clock=None, queue=None,
               simulated_time: bool = True, **agent_settings: str):
    """An agent on ``db`` with the schema applied. ``queue``: a queue port (queue mode, as the
    Functions app runs), or None for direct mode (the local runner claims from the runs table).
    ``simulated_time``: tests travel in time through ``tick(now)`` (the test hook: a tick's own
    time is the truth); False checks it against the database's clock, as the CLI does."""
    from shared.engine.agent import Agent
    from shared.settings import load_settings

    settings = load_settings(environ=job_env(jobs or {}, **agent_settings))
    agent = Agent(settings, db=db, clock=clock, queue=queue, simulated_time=simulated_time)
    AGENTS_MADE.append(agent)
    agent.init()
    return agent


# Every agent make_agent built, in order: tests/conftest.py closes those a test's body built
# after it, before its fixtures drop their databases (close is idempotent): one left open keeps
# its connections and its notifier thread, which would go on polling a dropped database and log
# into the tests after it. Agents its fixtures built are theirs to close (a module's fixture
# outlives the test).
AGENTS_MADE: list = []


def at(text: str) -> datetime:
    """An aware UTC datetime from 'YYYY-MM-DDTHH:MM:SS'."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def db_dialect(db: str) -> str:
    from shared.control.db import parse_database_url

    return parse_database_url(db).dialect


def sql_for(db: str, sqlite: str, postgres: str, mssql: str | None = None) -> str:
    """The test SQL for the dialect of ``db``. A test run on SQL Server must say its T-SQL."""
    dialect = db_dialect(db)
    if dialect == "mssql":
        if mssql is None:
            raise AssertionError("this test has no T-SQL variant: pass mssql=... to sql_for()")
        return mssql
    return sqlite if dialect == "sqlite" else postgres


def tsql_delay(seconds: float) -> str:
    """T-SQL's sleep, one statement: WAITFOR DELAY on SQL Server and Azure SQL. Babelfish refuses
    WAITFOR ("not currently supported"), so there it is PostgreSQL's pg_sleep called from T-SQL,
    inside sp_executesql so that its variable stays its own and its void value is never sent."""
    if mssql_server_is_babelfish():
        return ("EXEC sp_executesql N'DECLARE @agent_delay INT = "
                f"(SELECT COUNT(*) FROM (SELECT pg_catalog.pg_sleep({seconds:g}) AS s) AS z)'")
    whole, millis = int(seconds), round((seconds - int(seconds)) * 1000)
    return f"WAITFOR DELAY '{whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}.{millis:03d}'"


@functools.lru_cache(maxsize=None)
def mssql_server_is_babelfish() -> bool:
    """Whether AGENT_TEST_MSSQL is Babelfish for PostgreSQL (asked once per test process)."""
    if not MSSQL_BASE:
        return False
    connection = mssql_connection("master")
    try:
        return mssql_is_babelfish(connection)
    finally:
        connection.close()


def query(agent, sql: str) -> list[tuple]:
    """Read test tables directly (the agent's own queries are all named; tests may peek)."""
    store = agent.new_store()
    try:
        cursor = store.connection.cursor()
        _test_search_path(store, cursor)
        cursor.execute(sql)
        rows = [tuple(r) for r in cursor.fetchall()]
        if store.dialect != "sqlite":
            store.connection.commit()
        return rows
    finally:
        store.close()


def _test_search_path(store, cursor) -> None:
    """The agent's PostgreSQL sessions resolve names in pg_catalog only (the owner boundary pins
    search_path); the tests' own tables are in public: this store's session (closed after the
    test's statement) finds them, as a job's SQL does."""
    if store.dialect == "postgres":
        cursor.execute('SET search_path = "$user", public')


def runs_table(agent) -> str:
    return "agent_runs" if agent.target.dialect == "sqlite" else "agent.runs"


def attempts_table(agent) -> str:
    return "agent_attempts" if agent.target.dialect == "sqlite" else "agent.attempts"


def execute(agent, sql: str) -> None:
    """Set up test tables directly."""
    store = agent.new_store()
    try:
        cursor = store.connection.cursor()
        _test_search_path(store, cursor)
        cursor.execute(sql)
        if store.dialect != "sqlite":
            store.connection.commit()
    finally:
        store.close()


def work(agent, *, concurrency: int = 4, max_seconds: float = 60, visibility_timeout: float = 0):
    """Work until nothing is runnable now: the queue as the Functions host would (queue mode),
    or the runs table as the local runner does (direct mode)."""
    from shared.engine.runner import LocalRunner

    runner = LocalRunner(agent, concurrency=concurrency, visibility_timeout=visibility_timeout, poll_interval=0.05)
    return runner.work_until_idle(max_seconds=max_seconds)


@contextlib.contextmanager
def least_privilege_database(login: str | None = None, *, test_tables: bool = False) -> Iterator[tuple[str, str, str]]:
    """A fresh PostgreSQL control database and a login role with exactly the rights
    ``sql-agent grant-sql --agent-login`` gives (created with CREATE ROLE's defaults: NOSUPERUSER
    NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS; the script applied as the admin through the
    CLI, as docs/deploying.md says); yields (URL as that login, the login, the admin's URL). The
    database and the login are dropped afterwards. ``test_tables``: also CREATE on schema public,
    for a test that makes its own tables through the agent's connection (not a right the agent
    needs)."""
    from shared.cli.commands import main as cli

    name, admin_url = create_pg_database()
    login = login or f"lp_{uuid.uuid4().hex[:10]}"
    quoted = '"' + login.replace('"', '""') + '"'
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"CREATE ROLE {quoted} LOGIN")
        assert cli(["--db", admin_url, "grant-sql", "--agent-login", login, "--apply"]) == 0
        if test_tables:
            database = pyodbc_connect(admin_url)
            try:
                database.cursor().execute(f"GRANT CREATE ON SCHEMA public TO {quoted}")
            finally:
                database.close()
        # psqlODBC takes Uid as written up to the next ';' (no braces): a test of a hostile name
        # checks the script, not a connection.
        url = admin_url.replace("Uid=root;", f"Uid={login};")
        LEAST_PRIVILEGE_LOGINS[url] = (login, admin_url)
        yield url, login, admin_url
    finally:
        LEAST_PRIVILEGE_LOGINS.pop(admin_url.replace("Uid=root;", f"Uid={login};"), None)
        drop_pg_database(name)
        admin.cursor().execute(f"DROP ROLE IF EXISTS {quoted}")
        admin.close()


# The databases least_privilege_database made: URL as the login -> (the login, the admin's URL).
LEAST_PRIVILEGE_LOGINS: dict[str, tuple[str, str]] = {}


def agent_login_of(url: str) -> tuple[str, str] | None:
    """(the least-privilege login, the admin's URL) when ``url`` is a least_privilege_database's,
    else None (the agent connects as the admin, root)."""
    return LEAST_PRIVILEGE_LOGINS.get(url)


def admin_execute(url: str, sql: str) -> None:
    """Run ``sql`` in ``url``'s database as the admin (root): what a deployer, not the agent, does
    (CREATE on the database, a role's memberships). With the agent connected as root it is the
    same connection rights the agent has."""
    found = agent_login_of(url)
    connection = pyodbc_connect(found[1] if found else url)
    try:
        connection.cursor().execute(sql)
    finally:
        connection.close()


def grant_operator_args(url: str, name: str) -> list[str]:
    """The CLI arguments that make ``name`` an operator of ``url``'s agent, as docs/tsql.md says:
    with the agent connected as root, ``grant-sql --operator NAME --apply`` on its own URL; with a
    least-privilege login, the admin's ``grant-sql --operator NAME --app-name LOGIN --apply``."""
    found = agent_login_of(url)
    if found:
        return ["--db", found[1], "grant-sql", "--operator", name, "--app-name", found[0], "--apply"]
    return ["--db", url, "grant-sql", "--operator", name, "--apply"]


def url_as(url: str, role: str) -> str:
    """``url`` (the agent's) logging in as ``role`` instead."""
    found = agent_login_of(url)
    return url.replace(f"Uid={found[0] if found else 'root'};", f"Uid={role};")


def pyodbc_connect(url: str):
    import pyodbc

    return pyodbc.connect(url, autocommit=True, timeout=10)
