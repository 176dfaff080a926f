"""doctor: one line per check, stops at the first failure with what to fix, exits non-zero.

Happy path and "no schema" on every dialect of ``db_url`` (SQLite, PostgreSQL, and SQL Server in
the conformance run); the failure paths against the real stand-ins: a closed port, an unknown
PostgreSQL role, a role that may only read, a driver that is not installed, a storage queue
nobody answers for.
"""

from __future__ import annotations

import re

import pytest

from shared.cli.commands import main as cli
from shared.engine.agent import Agent
from shared.ops.doctor import CHECKS, run_doctor, server_description
from shared.settings import load_settings
from tests.support.azurite import ACCOUNT, ACCOUNT_KEY, azurite, azurite_server, free_loopback_port  # noqa: F401
from tests.support.harness import PG_BASE, attempts_table, db_dialect, execute, make_agent, pg_admin_connection, query, service_missing

LINE = re.compile(r"^\[(?P<mark> OK |FAIL| -- )\] (?P<name>[a-z]+)\s+(?P<detail>.*)$")


def doctor(capsys, db: str) -> tuple[int, dict[str, tuple[str, str]], str]:
    """Run `doctor` through the CLI: exit code, {check: (mark, detail)}, the whole output."""
    code = cli(["--db", db, "doctor"])
    out = capsys.readouterr().out
    checks = {}
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            checks[match["name"]] = (match["mark"].strip(), match["detail"])
    assert list(checks) == list(CHECKS), out
    return code, checks, out


def _pg_driver_installed() -> None:
    try:
        import pyodbc
    except ImportError as exc:
        service_missing("pyodbc/unixODBC", f"install unixodbc and odbc-postgresql ({exc})")
    if "PostgreSQL Unicode" not in pyodbc.drivers():
        service_missing("the PostgreSQL ODBC driver", "install odbc-postgresql")


def _with_user(connection_string: str, user: str) -> str:
    parts = [p for p in connection_string.split(";") if p.strip() and p.split("=", 1)[0].strip().lower() not in ("uid", "user id", "username")]
    return ";".join(parts + [f"Uid={user}"]) + ";"


def test_happy_path_leaves_nothing_behind(db_url, capsys):
    agent = make_agent(db_url)
    try:
        for _ in range(2):                         # twice: the scratch run is really gone
            code, checks, out = doctor(capsys, db_url)
            assert code == 0, out
            assert all(mark == "OK" for mark, _ in checks.values()), out
            assert f"version {agent.store().latest_version()} (latest)" in checks["schema"][1]
            assert "inserted, completed, read back and deleted" in checks["permissions"][1]
            assert "claim straight from the runs table" in checks["queue"][1]
            assert checks["targets"] == ("OK", "no job has fleet targets (JOB__<name>__TARGETS, agent.add_scheduled_job @targets)"), out
            assert out.rstrip().endswith("all checks passed")
            # The server, as it describes itself (@@VERSION, version()); Babelfish is named so.
            if db_dialect(db_url) == "postgres":
                assert re.search(r"; server: PostgreSQL \d+", checks["connectivity"][1]), out
            elif db_dialect(db_url) == "mssql":
                version = agent.store().execute("server_version").scalar()
                expected = "Babelfish for PostgreSQL" if "Babelfish" in version else version.splitlines()[0].strip()
                assert f"; server: {expected}" in checks["connectivity"][1], out
        assert agent.store().execute("count_runs_by_status").rows == []
        assert query(agent, f"SELECT COUNT(*) FROM {attempts_table(agent)}") == [(0,)]
    finally:
        agent.close()


def test_no_schema_fails_naming_init_db(db_url, capsys, tmp_path):
    code, checks, out = doctor(capsys, db_url)
    assert code == 1
    assert [checks[name][0] for name in CHECKS] == ["OK", "OK", "OK", "FAIL", "--", "--", "--", "--", "--"], out
    assert "no agent schema" in checks["schema"][1]
    assert "fix: run `sql-agent init-db`" in out
    assert "not checked (fix the failure above first)" in checks["permissions"][1]
    if db_url.startswith("sqlite"):
        assert not (tmp_path / "agent.db").exists()    # the doctor does not create the file


def test_a_newer_schema_is_reported(db_url, capsys):
    agent = make_agent(db_url)
    table = "agent_schema_version" if agent.target.dialect == "sqlite" else "agent.schema_version"
    execute(agent, f"INSERT INTO {table} (version, description, applied_at) "
                   "VALUES (99, 'from the future', '2030-01-01 00:00:00')")
    agent.close()
    code, checks, out = doctor(capsys, db_url)
    assert code == 1 and checks["schema"][0] == "FAIL"
    from shared.control.queries import load_migrations

    latest = load_migrations(db_dialect(db_url))[-1].version
    assert f"schema version 99 is newer than this code ({latest})" in checks["schema"][1], out


def test_unreachable_postgres_is_a_connectivity_failure(capsys):
    _pg_driver_installed()
    port = free_loopback_port()                   # nothing listens there
    db = f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={port};Uid=root;Database=postgres;"
    code, checks, out = doctor(capsys, db)
    assert code == 1
    assert [checks[name][0] for name in CHECKS] == ["OK", "FAIL", "--", "--", "--", "--", "--", "--", "--"], out
    assert f"port {port} failed" in checks["connectivity"][1] and "Connection refused" in checks["connectivity"][1]
    assert "fix: check that PostgreSQL runs and listens where Server= and Port= say" in out


def test_unknown_postgres_role_is_an_authentication_failure(capsys):
    pg_admin_connection().close()                 # PostgreSQL must run (skip/fail as the other PG tests)
    db = _with_user(PG_BASE + "Database=postgres;", "no_such_role_for_doctor")
    code, checks, out = doctor(capsys, db)
    assert code == 1
    assert [checks[name][0] for name in CHECKS] == ["OK", "OK", "FAIL", "--", "--", "--", "--", "--", "--"], out
    assert "the server answered" in checks["connectivity"][1]
    assert 'role "no_such_role_for_doctor" does not exist' in checks["authentication"][1]


def test_a_role_that_may_only_read_fails_the_permissions_check(pg_url, capsys):
    agent = make_agent(pg_url)
    agent.close()
    role = "doctor_reader_" + re.sub(r"\W", "", pg_url.split("Database=")[1])[-12:]
    import pyodbc

    admin = pyodbc.connect(pg_url, autocommit=True, timeout=5)
    cursor = admin.cursor()
    cursor.execute(f"CREATE ROLE {role} LOGIN")
    try:
        cursor.execute(f"GRANT USAGE ON SCHEMA agent TO {role}")
        cursor.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA agent TO {role}")
        code, checks, out = doctor(capsys, _with_user(pg_url, role))
        assert code == 1
        assert [checks[name][0] for name in CHECKS] == ["OK", "OK", "OK", "OK", "OK", "FAIL", "--", "--", "--"], out
        assert "permission denied for table runs" in checks["permissions"][1]
        assert "grant-sql --agent-login <login> --apply" in out
    finally:
        cursor.execute(f"DROP OWNED BY {role}")
        cursor.execute(f"DROP ROLE {role}")
        admin.close()
    # The failed attempt rolled back: no scratch run stayed behind.
    agent = make_agent(pg_url)
    assert agent.store().execute("count_runs_by_status").rows == []
    agent.close()


def test_a_driver_that_is_not_installed_is_named(capsys):
    _pg_driver_installed()
    code, checks, out = doctor(capsys, "Driver={PostgreSQL Nonexistent};Server=127.0.0.1;Uid=root;")
    assert code == 1
    assert [checks[name][0] for name in CHECKS] == ["FAIL", "--", "--", "--", "--", "--", "--", "--", "--"], out
    assert "ODBC driver 'PostgreSQL Nonexistent' is not installed" in checks["driver"][1]
    assert "'PostgreSQL Unicode'" in checks["driver"][1] and "apt-get install odbc-postgresql" in out


def test_entra_target_without_odbc_driver_18_says_how_to_install_it(capsys, monkeypatch, tmp_path):
    try:
        import pyodbc
    except ImportError as exc:
        service_missing("pyodbc/unixODBC", f"install unixodbc ({exc})")
    if "ODBC Driver 18 for SQL Server" in pyodbc.drivers():
        pytest.skip("ODBC Driver 18 is installed here: the Entra ID path needs an Azure SQL server "
                    "(exercised against a real server by the conformance run)")
    monkeypatch.setenv("AGENT_SQL_SERVER", "myserver")
    monkeypatch.setenv("AGENT_SQL_DATABASE", "agentdb")
    agent = Agent(load_settings(environ={"AGENT_SQL_SERVER": "myserver", "AGENT_SQL_DATABASE": "agentdb"}))
    report = run_doctor(agent)
    agent.close()
    assert [c.ok for c in report.checks] == [False] + [None] * (len(CHECKS) - 1)
    assert report.target == "Azure SQL myserver/agentdb (Entra ID token)"
    assert "ODBC Driver 18 for SQL Server" in report.checks[0].detail and "msodbcsql18" in report.checks[0].detail
    assert cli(["doctor"]) == 1                    # the same through the CLI (from the environment)
    assert "[FAIL] driver" in capsys.readouterr().out


def test_azure_storage_queue_is_checked(tmp_path, capsys, monkeypatch, azurite):
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    make_agent(db).close()
    name = azurite.unique_name("doctor")
    for key, value in azurite.settings().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AGENT_QUEUE_NAME", name)
    code, checks, out = doctor(capsys, db)
    assert code == 0, out
    assert f"AzureStorageQueue('{name}'" in checks["queue"][1] and "0 message(s)" in checks["queue"][1]
    assert azurite.queue(name).depth() == 0        # the doctor created it


def test_unreachable_storage_queue_is_a_queue_failure(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    make_agent(db).close()
    port = free_loopback_port()
    monkeypatch.setenv("AzureWebJobsStorage",
                       f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                       f"QueueEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")
    code, checks, out = doctor(capsys, db)
    assert code == 1
    assert [checks[name][0] for name in CHECKS] == ["OK", "OK", "OK", "OK", "OK", "OK", "FAIL", "--", "--"], out
    assert "queue 'agent-tasks'" in checks["queue"][1] and f"127.0.0.1:{port}" in checks["queue"][1]
    assert "AzureWebJobsStorage" in out
    assert ACCOUNT_KEY not in out
    # The same roles the Bicep grants and docs/deploying.md lists (tests/repo/test_infra.py checks those agree).
    assert "Storage Queue Data Contributor on the storage account" in out
    assert "Storage Blob Data Owner, Storage Queue Data Contributor, Storage Table Data Contributor" in out



def test_the_monitor_check_requires_app_service_authentication_when_the_monitor_is_open():
    """The HTTP trigger trusts X-MS-CLIENT-PRINCIPAL only because App Service Authentication strips
    it from client requests: in Azure, an open monitor without required sign-in fails the check."""
    from shared.ops.doctor import _Failed, monitor_auth_detail

    assert "does not apply" in monitor_auth_detail({})
    azure = {"WEBSITE_SITE_NAME": "agent-app"}
    assert "closed" in monitor_auth_detail(azure)
    opened = {**azure, "AGENT_MONITOR_ALLOWED_GROUP": "00000000-1111-2222-3333-444444444444"}
    for env, says in [
        (opened, "App Service Authentication is off"),
        ({**opened, "WEBSITE_AUTH_ENABLED": "True", "WEBSITE_AUTH_UNAUTHENTICATED_ACTION": "AllowAnonymous"},
         "not required"),
        ({**opened, "WEBSITE_AUTH_ENABLED": "True",
          "WEBSITE_AUTH_V2_CONFIG_JSON": '{"globalValidation": {"requireAuthentication": false}}'}, "not required"),
    ]:
        with pytest.raises(_Failed, match=says):
            monitor_auth_detail(env)
    for env in ({**opened, "WEBSITE_AUTH_ENABLED": "True", "WEBSITE_AUTH_UNAUTHENTICATED_ACTION": "RedirectToLoginPage"},
                {**opened, "WEBSITE_AUTH_ENABLED": "True",
                 "WEBSITE_AUTH_V2_CONFIG_JSON": '{"globalValidation": {"requireAuthentication": true, '
                                                '"unauthenticatedClientAction": 2}}'}):
        assert "on and required" in monitor_auth_detail(env)


def test_the_server_is_named_from_what_it_says_it_is():
    """@@VERSION and version() texts as the servers answer them (Babelfish for PostgreSQL 4.2.0
    through FreeTDS, Azure SQL Database, SQL Server 2022, PostgreSQL): Babelfish is named with
    what differs, the others by their first line."""
    babelfish = ("Babelfish for PostgreSQL with SQL Server Compatibility - 12.0.2000.8\nNov 25 2026 08:11:35\n"
                 "Copyright (c) Amazon Web Services\nPostgreSQL 16.3 on x86_64-pc-linux-gnu (Babelfish 4.2.0)")
    assert server_description(babelfish) == (
        "Babelfish for PostgreSQL 4.2.0 (PostgreSQL 16.3): T-SQL over TDS; table hints are ignored and applocks "
        "are server-wide (see docs/azure-sql.md)")
    assert server_description("Microsoft SQL Azure (RTM) - 12.0.2000.8 \n\tOct  2 2024 11:51:41 \n\tCopyright (C) "
                              "2022 Microsoft Corporation\n") == "Microsoft SQL Azure (RTM) - 12.0.2000.8"
    assert server_description("Microsoft SQL Server 2022 (RTM-CU14) (KB5038325) - 16.0.4135.4 (X64) \n\tJul 10 2024 "
                              "14:09:09 \n\tCopyright (C) 2022 Microsoft Corporation\n\tDeveloper Edition (64-bit) on "
                              "Linux (Ubuntu 22.04.4 LTS) <X64>") == (
        "Microsoft SQL Server 2022 (RTM-CU14) (KB5038325) - 16.0.4135.4 (X64)")
    assert server_description("PostgreSQL 15.8 (Debian 15.8-0+deb12u1) on x86_64-pc-linux-gnu, compiled by gcc") == (
        "PostgreSQL 15.8 (Debian 15.8-0+deb12u1)")
    assert server_description("") == "unknown"
