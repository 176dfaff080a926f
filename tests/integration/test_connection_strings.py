"""Connection strings are built from parts by one function (shared.control.db.build_connection_string),
every value quoted for its driver, so a database name found at run time (a glob, server:) can
never make the agent connect to another database or server (issue 23, item 1).

On PostgreSQL the hostile names are real databases: each fleet execution runs in exactly the
database it names, and a name psqlODBC cannot carry fails its own execution with a clear error.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest

from shared.control.connection_strings import build_connection_string, odbc_pairs, with_database, with_server
from shared.errors import ConfigError
from tests.support.harness import fresh_database, make_agent, pg_admin_connection, query, work

UTC = timezone.utc
HOSTILE = ["h;Database={decoy}", "h;Server=127.0.0.2", "h;te", "h=x", "h{x", "h}x", "h}}x", "h'x", 'h"x',
           "h x ", "hünï ✓", "h\\x", "h%41+x"]


# ---------------------------------------------------------------- the builder, on its own


@pytest.mark.parametrize("name", HOSTILE + ["{x}", " lead", "}", "{", "a;b}", "x};Database=master"])
def test_sql_server_values_are_braced_and_read_back_exactly(name):
    base = "Driver={ODBC Driver 18 for SQL Server};Server=tcp:a.example,1433;UID=u;PWD={p;w}}d};Database=ctl;"
    built = with_database(base, name, "mssql")
    pairs = odbc_pairs(built)
    assert pairs["database"] == name and pairs["server"] == "tcp:a.example,1433" and pairs["pwd"] == "p;w}d"
    assert set(pairs) == {"driver", "server", "uid", "pwd", "database"}
    moved = odbc_pairs(with_server(built, "other.example,1444", "mssql"))
    assert moved["server"] == "other.example,1444" and moved["database"] == name and moved["pwd"] == "p;w}d"


@pytest.mark.parametrize("name", ["h;Database=postgres", "h;Server=127.0.0.2", "h;te", "{h", "{h}", "  {h", "h\x00x"])
def test_a_postgresql_value_psqlodbc_cannot_carry_is_refused_naming_it(name):
    base = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;Database=ctl;"
    with pytest.raises(ConfigError) as caught:
        with_database(base, name, "postgres")
    assert repr(name) in str(caught.value) and caught.value.setting == "Database"


def test_nul_is_refused_on_every_dialect_and_a_driver_name_cannot_close_its_braces():
    for dialect in ("mssql", "postgres"):
        with pytest.raises(ConfigError, match="NUL"):
            build_connection_string(None, dialect, [("Database", "a\x00b")])
    with pytest.raises(ConfigError, match="ODBC driver"):
        build_connection_string(None, "mssql", [("Driver", "x};Server=evil")])


def test_every_spelling_of_a_key_is_replaced_and_the_rest_kept_as_written():
    base = "DRIVER={PostgreSQL Unicode};servername=h1;PORT=5433;UID=root;PWD={a;b};Initial Catalog=x;"
    built = with_server(with_database(base, "tenant 1", "postgres"), "h2", "postgres")
    pairs = odbc_pairs(built)
    # the port the allow-list compared (5432 when none is written) replaces the base's
    assert pairs["servername"] == "h2" and pairs["port"] == "5432" and "initial catalog" not in pairs
    assert pairs["database"] == "tenant 1" and pairs["pwd"] == "a;b" and pairs["uid"] == "root"


# ---------------------------------------------------------------- real databases on PostgreSQL


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def test_each_fleet_execution_runs_in_exactly_the_database_it_names_whatever_the_name(tmp_path):
    """Databases with hostile names, found by a glob: the ones psqlODBC carries run the step in
    themselves (current_database() recorded there equals the name; history shows the true
    name); the ones with ';' fail alone, naming the database and why; the decoy a name points
    at is never touched."""
    prefix = "cs" + uuid.uuid4().hex[:8]
    decoy = f"{prefix}decoy"
    names = [f"{prefix}_{n.replace('{decoy}', decoy)}" for n in HOSTILE]
    admin = pg_admin_connection()
    created = []
    try:
        for name in [decoy, *names]:
            admin.cursor().execute(f"CREATE DATABASE {_quote(name)}")
            created.append(name)
        with fresh_database("postgres", tmp_path) as control:
            agent = make_agent(control, {"fleet": {
                "SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{prefix}_*", "MAX_ATTEMPTS": "1",
                "TARGET_PARALLELISM": "8",
                "COMMAND": "CREATE TABLE seen (db text); INSERT INTO seen SELECT current_database()"}},
                AGENT_CONNECT_RETRY_SECONDS="1")
            agent.tick(datetime.now(UTC))
            run_id = agent.request_run_now("fleet")["run_id"]
            work(agent, concurrency=4, max_seconds=120)
            rows = query(agent, "SELECT target_database, status, last_error FROM agent.runs "
                                f"WHERE parent_run_id = {int(run_id)}")
        done = {row[0]: (row[1], row[2]) for row in rows}
        assert set(done) == set(names)                       # history: the true names, each once
        carried = [n for n in names if ";" not in n]
        for name in names:
            status, error = done[name]
            if name in carried:
                assert status == "succeeded", (name, error)
            else:
                assert status == "failed" and repr(name) in error and "psqlODBC" in error, (name, error)
        for name in carried:                                  # the work happened there, and only there
            connection = _connect(name)
            try:
                assert [tuple(r) for r in connection.cursor().execute("SELECT db FROM seen").fetchall()] == [(name,)]
            finally:
                connection.close()
        connection = _connect(decoy)
        try:
            assert connection.cursor().execute("SELECT to_regclass('seen')").fetchone()[0] is None
        finally:
            connection.close()
    finally:
        for name in created:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        admin.close()


def _connect(name: str):
    import pyodbc

    from tests.support.harness import PG_BASE

    return pyodbc.connect(with_database(PG_BASE, name, "postgres"), autocommit=True, timeout=5)


def test_grant_sql_and_doctor_quote_or_name_each_listed_name_and_go_on(tmp_path, capsys, monkeypatch):
    """Listed names in grant-sql --targets: quoted identifiers (a name with ';' or '"' is one
    identifier), a name with a line break (which would end a comment) left out with a warning
    naming it; doctor probes each target, the ones psqlODBC cannot carry named with why."""
    import re

    from shared.cli.commands import main as cli

    prefix = "cg" + uuid.uuid4().hex[:8]
    names = [f"{prefix}_plain", f'{prefix}_q";x', f"{prefix}_nl\nGRANT ALL ON DATABASE postgres TO PUBLIC; --"]
    admin = pg_admin_connection()
    try:
        for name in names:
            admin.cursor().execute(f"CREATE DATABASE {_quote(name)}")
        with fresh_database("postgres", tmp_path) as control:
            jobs = {"fleet": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1", "TARGETS": f"db:{prefix}_*"}}
            make_agent(control, jobs).close()
            for key, value in jobs["fleet"].items():
                monkeypatch.setenv(f"JOB__fleet__{key}", value)
            assert cli(["--db", control, "grant-sql", "--app-name", "app", "--targets", "fleet"]) == 0
            captured = capsys.readouterr()
            grants = [line for line in captured.out.splitlines() if not line.startswith("--") and line.strip()]
            assert grants == [f"GRANT CONNECT ON DATABASE {_quote(n)} TO \"app\";" for n in sorted(names[:2])]
            assert repr(names[2]) in captured.err and "left out" in captured.err
            assert "GRANT ALL" not in captured.out
            cli(["--db", control, "doctor"])
            out = capsys.readouterr().out
            assert re.search(re.escape(repr(names[1])) + r".*psqlODBC", out) or (
                names[1] in out and "psqlODBC" in out), out
    finally:
        for name in names:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {_quote(name)} WITH (FORCE)")
        admin.close()


def test_a_tds_server_through_freetds_is_the_t_sql_dialect():
    """Babelfish for PostgreSQL (or SQL Server) through Debian's FreeTDS driver: the T-SQL dialect,
    named by the driver's name or by its library's path; an unknown driver is refused by name."""
    from shared.control.db import parse_database_url

    for driver in ("{FreeTDS}", "/usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so", "{ODBC Driver 18 for SQL Server}"):
        target = parse_database_url(f"Driver={driver};Server=127.0.0.1;Port=1433;UID=u;PWD=secret;TDS_Version=7.4;")
        assert target.dialect == "mssql", driver
        assert "secret" not in target.display
    with pytest.raises(ConfigError, match=r"or FreeTDS \('FreeTDS': SQL Server, Babelfish\)"):
        parse_database_url("Driver={Some Other Driver};Server=x;")


def test_every_postgresql_session_is_pinned_whatever_the_connection_string_sets():
    """The owner boundary's construction 4 (docs/tsql.md): the agent adds search_path and role to
    every PostgreSQL connection's startup options; a pqopt of the deployer's keeps its keys, one
    that sets options itself is refused naming it; a connection really starts pinned, and RESET
    ALL returns to the pin."""
    import pyodbc

    from shared.control.connection_strings import PINNED_SESSION_OPTIONS, with_postgres_defaults
    from tests.support.harness import PG_BASE

    plain = with_postgres_defaults("Driver={PostgreSQL Unicode};Server=db;Uid=agent;")
    assert odbc_pairs(plain)["pqopt"] == f"options='{PINNED_SESSION_OPTIONS}'"
    assert with_postgres_defaults(plain) == plain
    kept = odbc_pairs(with_postgres_defaults("Driver={PostgreSQL Unicode};Server=db;pqopt={keepalives=1};"))
    assert kept["pqopt"] == f"keepalives=1 options='{PINNED_SESSION_OPTIONS}'"
    with pytest.raises(ConfigError) as refused:
        with_postgres_defaults("Driver={PostgreSQL Unicode};Server=db;pqopt={options='-c search_path=public'};")
    assert "pqopt" in str(refused.value) and "search_path=public" in str(refused.value)
    connection = pyodbc.connect(with_postgres_defaults(PG_BASE + "Database=postgres;"), autocommit=True, timeout=10)
    try:
        cursor = connection.cursor()
        cursor.execute("SET search_path = public")
        cursor.execute("RESET ALL")
        cursor.execute("SELECT current_setting('search_path'), CAST(current_user = session_user AS int)")
        assert tuple(cursor.fetchone()) == ("pg_catalog,pg_temp", 1)
    finally:
        connection.close()


def test_a_session_that_did_not_start_pinned_is_refused(monkeypatch):
    """Fail closed: when the startup options do not reach the server (a pooler dropping them, here
    a connection string the agent did not add them to), the agent refuses the connection, naming
    the search_path it got, rather than resolve names through it."""
    from shared.control import db as db_module
    from shared.control.db import DatabaseTarget, connector
    from shared.errors import AgentError
    from tests.support.harness import PG_BASE

    monkeypatch.setattr(db_module, "with_postgres_defaults", lambda location: location)
    target = DatabaseTarget(dialect="postgres", location=PG_BASE + "Database=postgres;", display="test")
    with pytest.raises(AgentError) as refused:
        connector(target)()
    assert "did not reach the server" in str(refused.value) and "public" in str(refused.value)
