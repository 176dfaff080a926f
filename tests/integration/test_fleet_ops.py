"""Fleet targets from the operator's side: `grant-sql --targets JOB` and doctor's `targets` check,
against real PostgreSQL databases created (and dropped) by each test.

The fleet: <prefix>_a, <prefix>_b, <prefix>_locked (CONNECT revoked from PUBLIC: the superuser
still gets in, an ordinary role would not), <prefix>_refuse and <prefix>_skip (both
ALLOW_CONNECTIONS false: nobody gets in, root included). A job targets
``db:<prefix>_*, -db:<prefix>_skip``: the exclusion must hold, or doctor would name _skip too.

There is no SQL Server here: the T-SQL for the same resolved fleet is parsed with sqlglot's
T-SQL tokenizer, statement by statement (tests/unit/test_grants.py's parser, plus the one shape only
the fleet's master script has: ALTER ROLE [dbmanager] ADD MEMBER [app]).
"""

from __future__ import annotations

import re
import uuid

import pytest

from shared.cli.commands import main as cli
from shared.engine.fleet import fleet_steps, resolve_fleet
from shared.jobs.targets import Target
from shared.ops.grants import fleet_grant_scripts, render_fleet
from tests.integration.test_doctor import LINE
from tests.support.azurite import free_loopback_port
from tests.support.harness import PG_BASE, make_agent, pg_admin_connection
from tests.unit.test_grants import TRICKY_NAMES, _ident, _tokens, _words, parse_grant_statement, statements_of

SCHEDULE = "0 0 2 * * *"


@pytest.fixture
def fleet():
    """Five real databases named <prefix>_*; dropped afterwards (WITH (FORCE))."""
    prefix = f"fo_{uuid.uuid4().hex[:10]}"
    names = {key: f"{prefix}_{key}" for key in ("a", "b", "locked", "refuse", "skip")}
    admin = pg_admin_connection()
    cursor = admin.cursor()
    try:
        for name in names.values():
            cursor.execute(f"CREATE DATABASE {name}")
        cursor.execute(f"REVOKE CONNECT ON DATABASE {names['locked']} FROM PUBLIC")
        cursor.execute(f"ALTER DATABASE {names['refuse']} ALLOW_CONNECTIONS false")
        cursor.execute(f"ALTER DATABASE {names['skip']} ALLOW_CONNECTIONS false")
        yield prefix, names
    finally:
        for name in names.values():
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


def _set_jobs(monkeypatch, jobs: dict[str, dict[str, str]]) -> None:
    for name, values in jobs.items():
        for key, value in values.items():
            monkeypatch.setenv(f"JOB__{name}__{key}", value)


def _doctor(capsys, db: str) -> tuple[int, dict[str, tuple[str, str]], list[str], str]:
    """doctor through the CLI: exit code, {check: (mark, detail)}, the lines under `targets`, output."""
    code = cli(["--db", db, "doctor"])
    out = capsys.readouterr().out
    checks, under, current = {}, [], None
    for line in out.splitlines():
        match = LINE.match(line)
        if match:
            current = match["name"]
            checks[current] = (match["mark"].strip(), match["detail"])
        elif current == "targets" and line.startswith(" ") and not line.strip().startswith("fix:"):
            under.append(line.strip())
    return code, checks, under, out


def test_root_is_refused_by_allow_connections_false_and_not_by_a_revoked_connect(fleet):
    """The fixture's premise: which of its databases a superuser can reach."""
    import pyodbc

    _, names = fleet
    pyodbc.connect(PG_BASE + f"Database={names['locked']};", timeout=5).close()
    with pytest.raises(pyodbc.Error, match="not currently accepting connections"):
        pyodbc.connect(PG_BASE + f"Database={names['refuse']};", timeout=5)


def test_doctor_names_exactly_the_targets_that_do_not_answer(fleet, pg_url, capsys, monkeypatch):
    prefix, names = fleet
    closed = free_loopback_port()                    # nothing listens there: its listing fails
    jobs = {
        "tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": f"db:{prefix}_*, -db:{prefix}_skip"},
        # On "another server" (the same PostgreSQL, spelled host:port), and a database that does not exist.
        "remote": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1",
                   "TARGETS": f"db:127.0.0.1:5432/{names['a']}, db:{prefix}_missing"},
        "gone": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": f"server:127.0.0.1:{closed}"},
        "plain": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1"},
    }
    make_agent(pg_url, jobs).close()
    _set_jobs(monkeypatch, jobs)
    code, checks, under, out = _doctor(capsys, pg_url)
    assert code == 1, out
    assert [mark for mark, _ in checks.values()] == ["OK"] * 7 + ["FAIL", "--"], out
    # tenants: a, b, locked, refuse (skip excluded); remote: a on 127.0.0.1:5432 and missing.
    assert checks["targets"][1] == "4 of 6 targets of 3 fleet job(s) reachable; 2 unreachable; 1 listing(s) failed", out
    by_job = {}
    for line in under:
        by_job.setdefault(re.match(r"(?:cannot list .*\(for )?job (\w+)", line).group(1), []).append(line)
    assert sorted(by_job) == ["gone", "remote", "tenants"], out
    (refused,) = by_job["tenants"]
    assert refused.startswith(f"job tenants step 1: db {names['refuse']} on the agent's server: "), out
    assert f'database "{names["refuse"]}" is not currently accepting connections' in refused
    assert names["skip"] not in out                   # the exclusion held
    (missing,) = by_job["remote"]
    assert missing.startswith(f"job remote step 1: db {prefix}_missing on the agent's server: ")
    assert f'database "{prefix}_missing" does not exist' in missing
    (listing,) = by_job["gone"]
    assert listing.startswith(f"cannot list the databases of server 127.0.0.1:{closed} (for job gone step 1): ")
    assert f"port {closed} failed" in listing and "Connection refused" in listing
    assert "fix: check that each database exists" in out and "--targets <job>" in out


def test_doctor_passes_when_every_target_answers(fleet, pg_url, capsys, monkeypatch):
    prefix, names = fleet
    jobs = {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1",
                        "TARGETS": f"db:{prefix}_[ab], db:127.0.0.1:5432/{names['locked']}"}}
    make_agent(pg_url, jobs).close()
    _set_jobs(monkeypatch, jobs)
    code, checks, under, out = _doctor(capsys, pg_url)
    assert code == 0, out
    assert checks["targets"] == ("OK", "3 targets of 1 fleet job(s) reachable"), out
    assert under == [] and out.rstrip().endswith("all checks passed")


def test_grant_sql_targets_on_postgres_prints_and_applies_connect(fleet, pg_url, capsys, monkeypatch):
    prefix, names = fleet
    role = f"{prefix}_app"
    jobs = {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": f"db:{prefix}_*, -db:{prefix}_skip"}}
    make_agent(pg_url, jobs).close()
    _set_jobs(monkeypatch, jobs)
    assert cli(["--db", pg_url, "grant-sql", "--app-name", role, "--targets", "tenants"]) == 0
    out = capsys.readouterr().out
    granted = re.findall(r'^GRANT CONNECT ON DATABASE "([^"]+)" TO "([^"]+)";$', out, re.M)
    expected = sorted(names[k] for k in ("a", "b", "locked", "refuse"))
    assert granted == [(db, role) for db in expected], out
    assert out.count("-- =====") == 1 and "the agent's own server" in out      # one server, one script

    admin = pg_admin_connection()
    cursor = admin.cursor()
    cursor.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        def may_connect(db: str) -> bool:
            # (psqlODBC hands a boolean over as the text '0' / '1': compare an integer.)
            cursor.execute("SELECT CASE WHEN has_database_privilege(?, ?, 'CONNECT') THEN 1 ELSE 0 END", role, db)
            return int(cursor.fetchone()[0]) == 1

        assert not may_connect(names["locked"])           # CONNECT revoked from PUBLIC
        assert cli(["--db", pg_url, "grant-sql", "--app-name", role, "--targets", "tenants", "--apply"]) == 0
        assert "applied to the control database: GRANT CONNECT" in capsys.readouterr().out
        assert all(may_connect(db) for db in expected)
        # _skip was not granted: PUBLIC's default CONNECT is all it has (no ACL entry for the role).
        cursor.execute("SELECT datacl::text FROM pg_database WHERE datname = ?", names["skip"])
        assert role not in (cursor.fetchone()[0] or "")
    finally:
        for db in names.values():
            cursor.execute(f"REVOKE ALL ON DATABASE {db} FROM {role}")
        cursor.execute(f"DROP ROLE {role}")
        admin.close()


def test_a_fleet_job_defined_from_tsql_is_checked_by_doctor_and_served_by_grant_sql(fleet, pg_url, capsys):
    """agent.add_scheduled_job @targets: once the engine planned it, doctor probes its targets and
    grant-sql --targets prints its grants, as for a settings job."""
    from tests.support import tsql_caller

    prefix, names = fleet
    agent = make_agent(pg_url)
    connection = tsql_caller.connect(pg_url)
    try:
        tsql_caller.call(connection, "add_scheduled_job", name="tenants_sql", sql="SELECT 1", schedule=SCHEDULE,
                         targets=f"db:{prefix}_*, -db:{prefix}_skip")
    finally:
        connection.close()
    agent.tick()                                     # the engine plans it
    code, checks, under, out = _doctor(capsys, pg_url)
    assert code == 1 and checks["targets"][0] == "FAIL", out
    assert checks["targets"][1] == "3 of 4 targets of 1 fleet job(s) reachable; 1 unreachable", out
    (refused,) = under
    assert refused.startswith(f"job tenants_sql step 1: db {names['refuse']} on the agent's server: "), out
    assert cli(["--db", pg_url, "grant-sql", "--app-name", "app", "--targets", "tenants_sql"]) == 0
    granted = re.findall(r'^GRANT CONNECT ON DATABASE "([^"]+)" TO "app";$', capsys.readouterr().out, re.M)
    assert granted == sorted(names[k] for k in ("a", "b", "locked", "refuse"))


def _master_statement(statement: str) -> tuple:
    """The shapes of a master script: CREATE USER (as everywhere) or ALTER ROLE [r] ADD MEMBER [u]."""
    tokens = _tokens(statement)
    if tokens[0][1].upper() != "ALTER":
        return parse_grant_statement(statement)
    assert tokens[-1] == ("SEMICOLON", ";"), statement
    tokens = tokens[:-1]
    index = _words(tokens, 0, "ALTER", "ROLE")
    role, index = _ident(tokens, index)
    index = _words(tokens, index, "ADD", "MEMBER")
    user, index = _ident(tokens, index)
    assert index == len(tokens), statement
    return ("add_member", role, user)


def test_tsql_for_a_resolved_fleet_is_one_script_per_database_and_one_for_master(fleet, pg_url):
    prefix, names = fleet
    jobs = {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": f"db:{prefix}_*, -db:{prefix}_skip"}}
    agent = make_agent(pg_url, jobs)
    try:
        steps = fleet_steps(agent.settings.job("tenants"))
        resolution = resolve_fleet(steps, dialect="postgres", control_store=agent.store,
                                   target_store=agent.target_store)
    finally:
        agent.close()
    expected = sorted(names[k] for k in ("a", "b", "locked", "refuse"))
    assert [t.database for t in resolution.targets()] == expected
    assert resolution.listed == [("server", None, None)]
    for app in TRICKY_NAMES:
        scripts = fleet_grant_scripts(app, [(t.server, t.database) for t in resolution.targets()], resolution.listed,
                                      execute_schemas=["dbo"], job_name="tenants")
        assert [(s.server, s.database) for s in scripts] == [(None, "master")] + [(None, db) for db in expected]
        master, *targets = scripts
        assert [_master_statement(s) for s in master.statements] == [("create_user", app)]
        for script in targets:
            assert [parse_grant_statement(s) for s in script.statements] == [
                ("create_user", app), ("grant", ("EXECUTE",), "dbo", app)]
        text = render_fleet(scripts)
        # The printed text is exactly these statements, every one parsed.
        assert [_master_statement(s) for s in statements_of(text)] == [
            _master_statement(s) for script in scripts for s in script.statements]
        assert text.count("GO\n") == len(scripts) - 1


def test_tsql_master_scripts_are_grouped_by_server_and_pools_get_dbmanager():
    targets = [("srv-b.database.windows.net", "t2"), (None, "local_1"), ("srv-a.database.windows.net", "t1"),
               ("srv-b.database.windows.net", "t1")]
    listed = [("pool", "srv-b.database.windows.net", "tenants pool"), ("server", None, None)]
    scripts = fleet_grant_scripts("func-agent", targets, listed, job_principal="job_runner")
    assert [(s.server, s.database) for s in scripts] == [
        (None, "master"), (None, "local_1"),
        ("srv-a.database.windows.net", "t1"),
        ("srv-b.database.windows.net", "master"), ("srv-b.database.windows.net", "t1"),
        ("srv-b.database.windows.net", "t2")]
    pool_master = scripts[3]
    assert [_master_statement(s) for s in pool_master.statements] == [
        ("create_user", "func-agent"), ("add_member", "dbmanager", "func-agent")]
    assert "sys.database_service_objectives" in pool_master.comment
    assert [_master_statement(s) for s in scripts[0].statements] == [("create_user", "func-agent")]
    # A target gets what a JOB__<name>__DATABASE gets, job principal included.
    assert scripts[1].statements[1:] == (
        "IF DATABASE_PRINCIPAL_ID(N'job_runner') IS NULL CREATE USER [job_runner] WITHOUT LOGIN;",
        "GRANT IMPERSONATE ON USER::[job_runner] TO [func-agent];")


@pytest.mark.parametrize("argv,needle", [
    (["--targets", "nosuchjob"], "no valid job named 'nosuchjob' with fleet targets in the settings or defined from T-SQL "
                                 "(jobs with fleet targets: tenants)"),
    (["--targets", "plain"], "job 'plain' has no fleet step (expected JOB__plain__TARGETS"),
    (["--targets", "broken"], "--targets broken: the job is invalid: JOB__broken__TARGETS"),
])
def test_grant_sql_targets_refuses_bad_jobs_in_one_line(pg_url, capsys, monkeypatch, argv, needle):
    _set_jobs(monkeypatch, {
        "tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": "db:t_*"},
        "plain": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1"},
        "broken": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": "tenant_7"},
    })
    assert cli(["--db", pg_url, "grant-sql", "--app-name", "app", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    assert needle in captured.err, captured.err


@pytest.mark.parametrize("argv,needle", [
    (["grant-sql", "--app-name", "app", "--targets", "tenants"], "SQLite database has no other databases"),
    (["grant-sql", "--targets", "tenants"], "--app-name NAME is required"),
    (["grant-sql", "--operator", "ops", "--targets", "tenants"], "--operator PRINCIPAL takes no"),
    (["grant-sql", "--app-name", "app", "--targets", "tenants", "--job-database", "x"], "takes no --job-database"),
])
def test_grant_sql_targets_usage_errors(tmp_path, capsys, monkeypatch, argv, needle):
    _set_jobs(monkeypatch, {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": "db:t_*"}})
    assert cli(["--db", f"sqlite:///{tmp_path / 'agent.db'}", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err, err
    assert not (tmp_path / "agent.db").exists()


def test_pool_members_are_refused_on_postgres_naming_the_member(pg_url, capsys, monkeypatch):
    _set_jobs(monkeypatch, {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1",
                                        "TARGETS": "pool:srv.database.windows.net/p1"}})
    assert cli(["--db", pg_url, "grant-sql", "--app-name", "app", "--targets", "tenants"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pool:srv.database.windows.net/p1: elastic pools exist only on Azure SQL" in err


def test_doctor_on_sqlite_reports_fleet_jobs_it_cannot_run_without_failing(tmp_path, capsys, monkeypatch):
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    make_agent(db).close()
    _set_jobs(monkeypatch, {"tenants": {"SCHEDULE": SCHEDULE, "COMMAND": "SELECT 1", "TARGETS": "db:t_*"}})
    code, checks, under, out = _doctor(capsys, db)
    assert code == 0, out
    assert checks["targets"] == ("OK", "no fleet job this control database can run (1 refused, see the lines below)")
    assert under == ["job tenants: not checked: fleet targets need a database server (Azure SQL, SQL Server or "
                     "PostgreSQL); the embedded SQLite database has no other databases to run in"], out


def test_target_text_names_the_server():
    from shared.engine.fleet import target_text

    assert target_text(Target(None, "t1")) == "db t1 on the agent's server"
    assert target_text(Target("srv", "t1")) == "db t1 on server srv"
