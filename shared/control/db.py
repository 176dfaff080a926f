"""Which control database, and how to open a connection to it.

* ``sqlite:///PATH`` — the embedded default (standard library sqlite3, no services).
* an ODBC connection string — PostgreSQL (``Driver={PostgreSQL Unicode};...``) or SQL
  Server / Azure SQL with SQL authentication (``Driver={ODBC Driver 18 for SQL Server};...``),
  or any T-SQL server through FreeTDS (``Driver={FreeTDS};...``, e.g. Babelfish for PostgreSQL).
* ``AGENT_SQL_SERVER`` + ``AGENT_SQL_DATABASE`` — Azure SQL Database with an Entra ID token.

pyodbc is imported only when an ODBC database is used, so the embedded default needs no
unixODBC on the machine.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from shared.control import azure_sql
from shared.control.connection_strings import (
    is_freetds,
    odbc_pairs,
    server_address,
    split_server,
    redact,
    repeated_server_keys,
    with_database,
    with_freetds_defaults,
    PINNED_SEARCH_PATH,
    with_postgres_defaults,
    with_server,
)
from shared.control.pool import is_refusal
from shared.control.sqlerrors import PERMANENT, SqlErrorInfo, classify, describe, retry_connect
from shared.errors import AgentError, ConfigError, ConnectError
from shared.jobs.targets import FLEET_SERVERS_SETTING
from shared.settings import AgentSettings

SQLITE_PREFIX = "sqlite:///"


@dataclass(frozen=True)
class DatabaseTarget:
    dialect: str            # "sqlite" | "postgres" | "mssql"
    location: str           # sqlite file path, or ODBC connection string
    display: str            # for messages: never contains a password
    sql_server: str | None = None
    sql_database: str | None = None
    sql_client_id: str | None = None
    connect_retry_seconds: float = 90.0   # AGENT_CONNECT_RETRY_SECONDS
    # The servers a fleet target may name (targets.server_address spellings): AGENT_FLEET_SERVERS,
    # the settings' jobs' servers and the control database's own. Connections go nowhere else.
    fleet_servers: frozenset[str] = frozenset()

    @property
    def uses_token(self) -> bool:
        return self.sql_server is not None

    def own_server(self) -> str | None:
        """The control database's server as a target would name it (None: SQLite)."""
        if self.uses_token:
            return self.sql_server
        if self.dialect == "sqlite":
            return None
        pairs = odbc_pairs(self.location)
        host = next((pairs[k] for k in ("servername", "server", "addr", "address", "data source") if pairs.get(k)), "")
        port = (pairs.get("port") or "").strip()
        if port and self.dialect == "postgres":
            host = f"{host}:{port}"
        elif port:
            # FreeTDS's Port= (it overrides a port written in Server=, seen with FreeTDS 1.3)
            host = f"{host.partition(',')[0]},{port}"
        return host or None

    def check_fleet_server(self, server: str) -> None:
        """ConfigError unless ``server`` is one the deployer allowed (AGENT_FLEET_SERVERS)."""
        if self.dialect == "sqlite":
            raise ConfigError(FLEET_SERVERS_SETTING, server, "no other server: the embedded SQLite control database "
                                                             "has no fleet targets (they need PostgreSQL or SQL Server)")
        if server_address(server, self.dialect) in self.fleet_servers:
            return
        allowed = ", ".join(sorted(self.fleet_servers)) or "none"
        raise ConfigError(FLEET_SERVERS_SETTING, server,
                          f"a server listed in {FLEET_SERVERS_SETTING} or named by a job in the settings "
                          f"(the agent takes its own credentials only there; allowed now: {allowed})")

    def with_fleet_servers(self, listed: tuple[str, ...], named: tuple[str, ...] = ()) -> "DatabaseTarget":
        """Allowed: ``listed`` (AGENT_FLEET_SERVERS: a spelling this dialect cannot reach is a
        ConfigError naming the setting), ``named`` (the settings' jobs' servers: one this dialect
        cannot reach is left out, and that job's run fails naming it) and the control database's
        own server."""
        if self.dialect == "sqlite":
            return self
        allowed = set()
        for server in listed:
            try:
                allowed.add(server_address(server, self.dialect))
            except ConfigError as exc:
                raise ConfigError(FLEET_SERVERS_SETTING, server, exc.expected) from None
        for server in named + ((self.own_server() or "",) if self.own_server() else ()):
            try:
                allowed.add(server_address(server, self.dialect))
            except ConfigError:
                continue
        return replace(self, fleet_servers=frozenset(allowed))


def resolve_database(agent: AgentSettings, override: str | None = None) -> DatabaseTarget:
    """The control database from ``--db`` (override), AGENT_SQL_SERVER/DATABASE or AGENT_DB."""

    if override is None and agent.sql_server and agent.sql_database:
        return DatabaseTarget(
            dialect="mssql", location="", display=f"Azure SQL {agent.sql_server}/{agent.sql_database} (Entra ID token)",
            sql_server=agent.sql_server, sql_database=agent.sql_database,
            sql_client_id=agent.sql_client_id, connect_retry_seconds=agent.connect_retry_seconds,
        ).with_fleet_servers(agent.fleet_servers, agent.job_servers)
    setting = "--db" if override is not None else "AGENT_DB"
    target = parse_database_url(override if override is not None else agent.db, setting=setting)
    return replace(target, connect_retry_seconds=agent.connect_retry_seconds).with_fleet_servers(
        agent.fleet_servers, agent.job_servers)


def parse_database_url(value: str, *, setting: str = "AGENT_DB") -> DatabaseTarget:
    value = value.strip()
    if value.lower().startswith("sqlite:"):
        if not value.startswith(SQLITE_PREFIX) or len(value) == len(SQLITE_PREFIX):
            raise ConfigError(setting, value, "sqlite:///PATH (relative) or sqlite:////absolute/PATH")
        path = value[len(SQLITE_PREFIX):]
        return DatabaseTarget(dialect="sqlite", location=path, display=f"SQLite {path}")
    pairs = odbc_pairs(value)
    driver = pairs.get("driver", "")
    if not driver:
        raise ConfigError(setting, redact(value),
                          "sqlite:///PATH or an ODBC connection string with Driver={...}")
    lowered = driver.lower()
    if "postgres" in lowered:
        dialect = "postgres"
    elif "sql server" in lowered or is_freetds(driver):
        dialect = "mssql"
    else:
        raise ConfigError(setting, redact(value),
                          "an ODBC driver for PostgreSQL ('PostgreSQL Unicode'), SQL Server "
                          "('ODBC Driver 18 for SQL Server') or FreeTDS ('FreeTDS': SQL Server, Babelfish)")
    # The server named once: drivers differ on which of two spellings wins (Server, Servername,
    # Address, ...), and the agent's own server (the fleet allow-list) must be the one it reaches.
    repeated = repeated_server_keys(value)
    if repeated:
        raise ConfigError(setting, redact(value),
                          f"an ODBC connection string naming its server once (it has {', '.join(repeated)}: keep one "
                          "of Server, Servername, Address, Addr, Data Source, and at most one Port)")
    return DatabaseTarget(dialect=dialect, location=value, display=redact(value))


class SqliteConnection(sqlite3.Connection):
    """sqlite3 connection that knows when its statement was cancelled: interrupt() stops
    SQLite's own work, and ``cancelled`` stops our long-running functions (agent_sleep)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()
        self.interrupt()


def _set_wal(connection: sqlite3.Connection, wait_seconds: float = 30.0) -> None:
    """Switch a database to WAL. The switch needs the database to itself, and SQLite answers
    "database is locked" at once (the busy timeout does not apply) when processes opening a new
    file together race for it, as concurrent first init-db runs do: wait for the winner."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def sqlite_connect(path: str) -> sqlite3.Connection:
    if path != ":memory:":
        parent = Path(path).expanduser().resolve().parent
        if not parent.is_dir():
            raise ConfigError("AGENT_DB", f"{SQLITE_PREFIX}{path}", f"a path in an existing folder ({parent} does not exist)")
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so writers queue on the
    # database lock instead of failing to upgrade a read lock (SQLITE_BUSY).
    connection = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False,
                                 factory=SqliteConnection)
    connection.execute("PRAGMA busy_timeout = 30000")
    _set_wal(connection)
    connection.execute("PRAGMA synchronous = NORMAL")
    # agent_sleep(seconds): lets embedded-default jobs (demos, tests of long work) take time.
    cancelled = connection.cancelled

    def agent_sleep(seconds: Any) -> int:
        deadline = time.monotonic() + float(seconds or 0)
        # Short slices so a cancel (timeout, lost lease) stops it promptly.
        while time.monotonic() < deadline:
            if cancelled.is_set():
                raise sqlite3.OperationalError("interrupted")
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
        return 0

    connection.create_function("agent_sleep", 1, agent_sleep)
    return connection


def import_pyodbc():
    try:
        # pyodbc loads on first use: not at import (cold start), and not at all on SQLite
        import pyodbc
    except ImportError as exc:
        text = str(exc)
        if "libodbc" in text:
            raise AgentError(
                "pyodbc cannot load unixODBC (libodbc.so.2): install it, e.g. `apt-get install unixodbc`"
                " (PostgreSQL also needs `odbc-postgresql`; SQL Server needs Microsoft ODBC Driver 18)") from None
        raise AgentError(f"pyodbc is not installed ({text}): pip install -r requirements.txt") from None
    # No pooling by the ODBC driver manager: a connection the agent closes must end its session
    # (the owner boundary closes the connection an owned job ran on, so that nothing the job left
    # in the session is met again; a pooled one would be lent back with it). The process pools its
    # own connections (shared/control/pool.py). Set before the first connection, as pyodbc needs.
    pyodbc.pooling = False
    return pyodbc


def odbc_connect(connection_string: str, *, display: str, retry_seconds: float = 90.0,
                 control_database: bool = True, retry_refusals: bool = True) -> Any:
    """A pyodbc connection (SQL authentication or PostgreSQL), retried on transient errors for
    up to ``retry_seconds`` (AGENT_CONNECT_RETRY_SECONDS), each wait at least as long as the
    error asks for. ``retry_refusals=False``: a refusal for too many connections raises at once
    (the process's connection pool paces those itself, see shared.control.pool)."""
    pyodbc = import_pyodbc()
    driver = odbc_pairs(connection_string).get("driver", "")
    if driver and driver not in pyodbc.drivers():
        installed = ", ".join(pyodbc.drivers()) or "none"
        hint = ("`apt-get install odbc-postgresql`" if "postgres" in driver.lower()
                else "FreeTDS's ODBC driver (`apt-get install tdsodbc`)" if is_freetds(driver)
                else "Microsoft ODBC Driver 18 for SQL Server (msodbcsql18)")
        raise AgentError(f"ODBC driver {driver!r} is not installed (installed: {installed}); install {hint}")

    def judge(exc: BaseException) -> SqlErrorInfo:
        info = classify(exc)
        if not retry_refusals and is_refusal(exc):
            return SqlErrorInfo(PERMANENT, info.number, info.sqlstate, info.message, info.connection_lost)
        return info

    def attempt() -> Any:
        try:
            return pyodbc.connect(connection_string, autocommit=False, timeout=30)
        except pyodbc.Error as exc:
            raise ConnectError(f"cannot connect to {display}: {describe(exc)}", exc,
                               control_database=control_database) from exc

    return retry_connect(attempt, what=f"connecting to {display}", budget_seconds=retry_seconds,
                         classify_error=judge)


def connector(target: DatabaseTarget, database: str | None = None, server: str | None = None, *,
              retry_refusals: bool = True) -> Callable[[], Any]:
    """A function opening a new raw connection to the control database (or, with
    ``database``, to another database on the same server; with ``server`` too, on that server:
    a fleet target, reached with the same credentials). ``retry_refusals=False`` (the process's
    connection pool): a refusal for too many connections is raised at once, not retried."""
    if target.dialect == "sqlite":
        if database:
            raise AgentError("JOB__<name>__DATABASE is not supported on the embedded SQLite database")
        return lambda: sqlite_connect(target.location)
    control = database is None and server is None
    if server is not None:
        # Before anything is opened: a fleet server the deployer did not allow gets none of the
        # agent's credentials (its password, its identity's token), whoever named it.
        target.check_fleet_server(server)
    if target.uses_token:
        if server is not None:
            host, port = split_server(server, "mssql")      # what was checked is what is reached
            server = f"{host},{port}"
        # One cached token for every server: Azure SQL's audience is the same for all of them.
        provider = azure_sql.shared_token_provider(target.sql_client_id)
        name = database or target.sql_database or ""
        return _sql_server_session(lambda: azure_sql.connect_azure_sql(
            server or target.sql_server or "", name, token_provider=provider,
            retry_seconds=target.connect_retry_seconds, control_database=control, retry_refusals=retry_refusals))
    location = with_database(target.location, database, target.dialect) if database else target.location
    if server:
        location = with_server(location, server, target.dialect)
    display = target.display if not database else f"database {database}" + (f" on server {server}" if server else "")
    if target.dialect == "postgres":
        location = with_postgres_defaults(location)
    elif is_freetds(odbc_pairs(location).get("driver", "")):
        location = with_freetds_defaults(location)
    opener = lambda: odbc_connect(location, display=display, retry_seconds=target.connect_retry_seconds,  # noqa: E731
                                  control_database=control, retry_refusals=retry_refusals)
    return _sql_server_session(opener) if target.dialect == "mssql" else _postgres_session(opener)


# Agent statements wait this long for a lock, then fail (transient: retried); job SQL does not.
LOCK_TIMEOUT_SECONDS = 30


def _postgres_session(opener: Callable[[], Any]) -> Callable[[], Any]:
    def open_session() -> Any:
        connection = opener()
        cursor = connection.cursor()
        # The same round trip checks that the session started pinned (connection_strings.
        # PINNED_SESSION_OPTIONS): a connection pooler that drops the startup packet's options
        # would leave the agent resolving names through the database's search_path; it fails closed.
        cursor.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_SECONDS}s';\n"
                       "SELECT pg_catalog.current_setting('search_path') AS path")
        path = cursor.fetchone()[0] if cursor.description else (cursor.nextset() and cursor.fetchone()[0])
        cursor.close()
        if path != PINNED_SEARCH_PATH:
            connection.close()
            raise AgentError(f"the PostgreSQL session started with search_path {path!r}, not {PINNED_SEARCH_PATH!r}: "
                             "the connection's startup options (pqopt, added by the agent) did not reach the server "
                             "(a connection pooler that drops them? connect to the server itself); the agent never "
                             "runs with a search_path an operator could add to (docs/tsql.md, \"The owner boundary\")")
        connection.commit()  # a SET in a transaction that rolls back would be undone
        # Outside Store.transaction() each batch is one implicit transaction the server commits
        # itself: a statement costs one round trip, not two (the Store turns this off for a
        # transaction of its own).
        connection.autocommit = True
        return connection

    return open_session


def transaction_open(dialect: str) -> Callable[[Any], bool]:
    """Whether a connection of ``dialect`` that is not in a Store.transaction() has a transaction
    open anyway (the pool refuses it), asked of the driver without a round trip. SQLite knows;
    a PostgreSQL connection outside Store.transaction() is in autocommit mode (_postgres_session),
    so one that is not may have begun one; SQL Server connections are in autocommit mode and the
    Store sends BEGIN TRANSACTION itself (and discards a connection released inside its
    transaction), so the driver cannot tell, and the Store's own bookkeeping stands alone."""
    if dialect == "sqlite":
        return lambda connection: bool(connection.in_transaction)
    if dialect == "postgres":
        return lambda connection: not connection.autocommit
    return lambda connection: False


def _sql_server_session(opener: Callable[[], Any]) -> Callable[[], Any]:
    """SQL Server sessions run with XACT_ABORT ON (any error aborts the whole transaction, so a
    failed batch can never leave half its work to be committed by a later statement), NOCOUNT
    ON (the agent counts rows through OUTPUT, never through row counts) and a lock timeout."""

    def open_session() -> Any:
        from shared.control.queries import load_queries

        connection = opener()
        cursor = connection.cursor()
        cursor.execute(f"SET XACT_ABORT ON; SET NOCOUNT ON; SET LOCK_TIMEOUT {LOCK_TIMEOUT_SECONDS * 1000};")
        # Outside Store.transaction() each batch is a transaction of its own the server commits
        # (a claim is one round trip, not two); the Store sends BEGIN TRANSACTION on the first
        # batch of a transaction of its own, and COMMIT on its last when it can (issue 35).
        connection.autocommit = True
        # The session's id, whether the server is Babelfish, the database user: asked once here,
        # not before every job (the Store's session_identity, which it asks when this is absent).
        cursor.execute(load_queries("mssql")["session_identity"].batch.sql)
        row = cursor.fetchone()
        cursor.close()
        session = (int(row[0]), str(row[1] or "") == "1", str(row[2] or "")) if row is not None else None
        return TsqlConnection(connection, session)

    return open_session


class TsqlConnection:
    """A SQL Server driver connection and what the agent learnt of its session when it opened it
    (``agent_session``: session id, Babelfish or not, database user); every other attribute, read
    or written, is the driver connection's own."""

    def __init__(self, connection: Any, session: tuple[int, bool, str] | None) -> None:
        object.__setattr__(self, "_connection", connection)
        object.__setattr__(self, "agent_session", session)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connection, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._connection, name, value)

    def __enter__(self) -> Any:
        return self._connection.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self._connection.__exit__(*exc)
