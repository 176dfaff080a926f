"""The agent runs under a least-privilege PostgreSQL login (issue 34, item 2): a login with
exactly the rights ``grant-sql --agent-login`` gives (applied by the admin, root here, through
the CLI), no superuser, no CREATEROLE, no CREATEDB. Over it the agent's main paths run: init-db
and its upgrade, tick, direct and queue mode, a multi-step run, jobs of an operator (exec_async,
add_scheduled_job), pause and resume, a fleet job, the monitor's pages. And the login really
lacks the rights an escape would want: it cannot create a role, alter another, create a
database or a schema, or become root.

docs/deploying.md ("What the agent's identity can do") lists these rights; T-SQL's are checked
by parsing (tests/unit/test_grants.py): no SQL Server runs here.
"""

from __future__ import annotations

import contextlib
import uuid
from datetime import datetime, timezone

import pyodbc
import pytest

from shared.cli.commands import main as cli
from shared.control.db import parse_database_url
from shared.engine.agent import Agent
from shared.engine.operations import apply_postgres_script, pause_job, resume_job
from shared.messaging.memory import MemoryQueue
from shared.ops.doctor import run_doctor
from shared.ops.grants import agent_login_postgres
from shared.settings import load_settings
from shared.web.app import Monitor, MonitorSettings
from tests.support import monitor_scenario
from tests.support.harness import (
    ROOT,
    Clock,
    create_pg_database,
    drop_pg_database,
    least_privilege_database,
    make_agent,
    pg_admin_connection,
    query,
    work,
)
from tests.support.tsql_caller import call

UTC = timezone.utc


@pytest.fixture
def least(request):
    """(URL as the least-privilege login, the login, the admin's URL)."""
    with least_privilege_database() as made:
        yield made


def _admin(url: str):
    return pyodbc.connect(url, autocommit=True, timeout=10)


def _refused(connection, sql: str) -> str:
    with pytest.raises(pyodbc.Error) as raised:
        connection.cursor().execute(sql)
    return str(raised.value)


def test_the_login_holds_no_privileged_right_and_cannot_take_one(least):
    url, login, admin_url = least
    admin = _admin(admin_url)
    row = admin.cursor().execute("SELECT rolsuper::int, rolcreaterole::int, rolcreatedb::int, rolreplication::int, "
                                 "rolbypassrls::int, rolinherit::int FROM pg_roles WHERE rolname = ?", login).fetchone()
    assert tuple(row) == (0, 0, 0, 0, 0, 1)
    other = f"other_{uuid.uuid4().hex[:8]}"
    admin.cursor().execute(f"CREATE ROLE {other} NOLOGIN")
    as_login = pyodbc.connect(url, autocommit=True, timeout=10)
    try:
        # 42501: insufficient_privilege, whatever the words.
        for sql in (f"CREATE ROLE {other}_x", f"ALTER ROLE {other} CREATEROLE", f"GRANT {other} TO {login}",
                    "ALTER ROLE root NOSUPERUSER", f"ALTER ROLE {login} CREATEROLE", f"CREATE DATABASE {other}",
                    "CREATE SCHEMA stolen", "SET ROLE root", "SELECT pg_read_file('/etc/passwd')",
                    "COPY (SELECT 1) TO PROGRAM 'true'", "SET SESSION AUTHORIZATION root",
                    "ALTER SYSTEM SET work_mem = '1MB'", "CREATE TABLE public.planted (x int)"):
            assert "42501" in _refused(as_login, sql), sql
    finally:
        as_login.close()
        admin.cursor().execute(f"DROP ROLE {other}")
        admin.close()


def test_init_db_runs_as_the_login_which_owns_every_agent_object(least):
    url, login, admin_url = least
    assert cli(["--db", url, "init-db"]) == 0
    agent = make_agent(url)                         # init again: nothing to do, still as the login
    latest = agent.store().latest_version()
    assert agent.store().schema_version() == latest
    owners = query(agent, "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class "
                          "WHERE relnamespace = 'agent'::regnamespace "
                          "UNION SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc "
                          "WHERE pronamespace = 'agent'::regnamespace "
                          "UNION SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'agent'")
    assert owners == [(login,)]
    # The definer functions the operators call run with the login's rights, not a superuser's.
    assert query(agent, "SELECT COUNT(*) FROM pg_proc WHERE pronamespace = 'agent'::regnamespace "
                        "AND prosecdef AND pg_get_userbyid(proowner) <> current_user") == [(0,)]


def test_a_schema_an_admin_made_is_handed_over_and_upgraded_by_the_login():
    """An existing deployment: init-db ran as a superuser (root) up to an older version; the
    admin applies grant-sql --agent-login, and the login owns everything and upgrades the rest."""
    name, admin_url = create_pg_database()
    login = f"lp_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    try:
        setup = Agent(load_settings({"AGENT_DB": admin_url}))        # as root, one migration short
        try:
            setup.store().migrate(datetime.now(UTC), up_to=setup.store().latest_version() - 1)
        finally:
            setup.close()
        cursor = _admin(admin_url).cursor()
        admin.cursor().execute(f'CREATE ROLE "{login}" LOGIN')
        assert cli(["--db", admin_url, "grant-sql", "--agent-login", login, "--apply"]) == 0
        cursor.execute("SELECT COUNT(*) FROM pg_class WHERE relnamespace = 'agent'::regnamespace "
                       "AND pg_get_userbyid(relowner) <> ?", login)
        assert cursor.fetchone()[0] == 0
        cursor.execute("SELECT COUNT(*) FROM pg_proc WHERE pronamespace = 'agent'::regnamespace "
                       "AND pg_get_userbyid(proowner) <> ?", login)
        assert cursor.fetchone()[0] == 0
        url = admin_url.replace("Uid=root;", f"Uid={login};")
        agent = make_agent(url, {"j": {"SCHEDULE": "0 0 4 * * *", "COMMAND": "SELECT 1"}})
        try:
            # The last migration ran as the login, on objects root had made.
            assert agent.store().schema_version() == agent.store().latest_version()
            agent.tick(agent.clock())
            run_id = agent.request_run_now("j")["run_id"]
            work(agent, concurrency=1)
            assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
        finally:
            agent.close()
        cursor.connection.close()
    finally:
        drop_pg_database(name)
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{login}"')
        admin.close()


def test_tick_direct_mode_steps_pause_and_resume_run_as_the_login(least):
    url, login, admin_url = least
    admin = _admin(admin_url)
    # What a deployer grants the jobs from the settings (they run as the agent's login): their tables.
    admin.cursor().execute(f'CREATE TABLE done (what text, who text); GRANT INSERT, SELECT ON done TO "{login}"')
    clock = Clock(datetime.now(UTC).replace(microsecond=0))
    jobs = {
        "plain": {"SCHEDULE": "0 0 4 * * *", "COMMAND": "INSERT INTO done SELECT 'plain', current_user"},
        "stepped": {"SCHEDULE": "0 0 4 * * *",
                    "STEPS__1__COMMAND": "INSERT INTO done SELECT 'step1', current_user",
                    "STEPS__2__COMMAND": "SELECT * FROM no_such_table",
                    "STEPS__2__ON_FAILURE": "goto:3", "STEPS__2__MAX_ATTEMPTS": "1",
                    "STEPS__3__COMMAND": "INSERT INTO done SELECT 'step3', current_user"},
        "often": {"SCHEDULE": "*/5 * * * * *", "COMMAND": "INSERT INTO done SELECT 'often', current_user"},
        "escape": {"SCHEDULE": "0 0 4 * * *", "MAX_ATTEMPTS": "1",
                   "COMMAND": f"CREATE ROLE escaped_{uuid.uuid4().hex[:6]}"},
    }
    agent = make_agent(url, jobs, clock=clock)
    try:
        agent.tick(clock.now)
        ids = {name: agent.request_run_now(name)["run_id"] for name in ("plain", "stepped", "escape")}
        work(agent, concurrency=2)
        status = {name: agent.store().execute("get_run", run_id=run_id).one() for name, run_id in ids.items()}
        assert status["plain"]["status"] == "succeeded", status["plain"]
        assert status["stepped"]["status"] == "succeeded", status["stepped"]
        # What a job running with the agent's own rights reaches: not a role.
        assert status["escape"]["status"] == "failed"
        assert "permission denied to create role" in status["escape"]["last_error"], status["escape"]
        assert sorted(query(agent, "SELECT what, who FROM done WHERE what <> 'often'")) == [
            ("plain", login), ("step1", login), ("step3", login)]
        # Pause, then resume: the definer-free paths of the engine, as the login.
        pause_job(agent.store(), "often", now=clock.now, paused_by="tester", reason="maintenance")
        clock.advance(20)
        agent.tick(clock.now)
        resume_job(agent.store(), "often", now=clock.now, resumed_by="tester")
        clock.advance(6)
        agent.tick(clock.now)
        work(agent, concurrency=2)
        assert query(agent, "SELECT COUNT(*) FROM done WHERE what = 'often'")[0][0] >= 1
    finally:
        agent.close()
        admin.close()


def test_queue_mode_and_the_monitor_pages_as_the_login(least):
    """The monitor's scenario (every run state, a queue, a poisoned message) built by the agent
    as the login, then every page read as it."""
    url, login, _ = least
    scenario = monitor_scenario.build(url)
    try:
        store = scenario.agent.new_store()

        @contextlib.contextmanager
        def lend():
            yield store

        monitor = Monitor(lend, clock=lambda: datetime.now(UTC), settings=lambda: MonitorSettings())
        for path in ("/", "/poison", "/stuck", "/jobs/nightly_ok", f"/runs/{scenario.run_ids['nightly_ok'][0]}"):
            response = monitor.handle("GET", path, "", "")
            assert response.status == 200, (path, response.body[:300])
        store.close()
        # Queue mode, end to end: a run dispatched to the queue and worked from it.
        queue = MemoryQueue()
        queued = make_agent(url, {"q": {"SCHEDULE": "0 0 4 * * *", "COMMAND": "SELECT 1"}}, queue=queue)
        queued.tick(queued.clock())
        run_id = queued.request_run_now("q")["run_id"]
        work(queued, concurrency=1)
        assert queued.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
        queued.close()
    finally:
        scenario.close()


@pytest.fixture
def operator(least):
    """An operator (a LOGIN role in agent_operator, nothing else) whose jobs the least-privilege
    agent runs: grant-sql --operator ... --app-name LOGIN, applied by the admin."""
    url, login, admin_url = least
    name = f"op_{uuid.uuid4().hex[:10]}"
    admin = _admin(admin_url)
    admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
    agent = make_agent(url)
    try:
        assert cli(["--db", admin_url, "grant-sql", "--operator", name, "--app-name", login, "--apply"]) == 0
        admin.cursor().execute(f'CREATE TABLE owned_work (who text, login text); '
                               f'GRANT INSERT, SELECT ON owned_work TO "{name}"; '
                               'CREATE TABLE secret (x int); INSERT INTO secret VALUES (42)')
        as_operator = pyodbc.connect(url.replace(f"Uid={login};", f"Uid={name};"), autocommit=True, timeout=10)
        yield name, as_operator, agent, login
        as_operator.close()
    finally:
        agent.close()
        admin.cursor().execute(f'DROP OWNED BY "{name}"')
        admin.cursor().execute(f'DROP ROLE "{name}"')
        admin.close()


def test_an_operators_jobs_run_as_the_operator_under_the_least_privilege_login(operator):
    name, as_operator, agent, login = operator
    (good,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT current_user, session_user",
                   execution_order=None)
    (denied,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT 'stolen', CAST(x AS text) "
                                                     "FROM secret", execution_order=None)
    (escape,) = call(as_operator, "exec_async", sql="RESET ROLE; CREATE ROLE escaped_op", execution_order=None)
    call(as_operator, "add_scheduled_job", name="owned", sql="INSERT INTO owned_work SELECT current_user, 'job'",
         schedule="0 0 4 * * *", max_attempts=1)
    agent.tick(agent.clock())
    (started,) = call(as_operator, "start_job", job_name="owned")
    work(agent, concurrency=2)
    run = lambda r: agent.store().execute("get_run", run_id=r["run_id"]).one()  # noqa: E731
    assert run(good)["status"] == "succeeded", run(good)
    assert run(started)["status"] == "succeeded", run(started)
    assert run(denied)["status"] == "failed" and "permission denied" in run(denied)["last_error"]
    assert run(escape)["status"] == "failed" and "cannot set parameter" in run(escape)["last_error"], run(escape)
    assert sorted(query(agent, "SELECT who, login FROM owned_work")) == [(name, "job"), (name, login)]
    assert query(agent, "SELECT COUNT(*) FROM pg_roles WHERE rolname = 'escaped_op'") == [(0,)]
    # Pause and resume from the operator's side, as the T-SQL interface does it.
    call(as_operator, "pause_job", job_name="owned")
    call(as_operator, "resume_job", job_name="owned")
    assert query(agent, "SELECT COUNT(*) FROM agent.jobs WHERE job_name = 'owned'") == [(1,)]


def test_a_fleet_job_runs_on_its_targets_as_the_login(least):
    url, login, admin_url = least
    prefix = "lf" + uuid.uuid4().hex[:8]
    databases = [f"{prefix}_{i}" for i in range(2)]
    admin = _admin(admin_url)
    try:
        for database in databases:
            admin.cursor().execute(f"CREATE DATABASE {database}")
        check = ("DO $$BEGIN IF current_user <> session_user THEN RAISE EXCEPTION 'ran as %', current_user; "
                 "END IF; END$$")
        agent = make_agent(url, {"fleet": {"SCHEDULE": "0 0 4 * * *", "COMMAND": check,
                                           "TARGETS": f"db:{prefix}_*", "MAX_ATTEMPTS": "1"}})
        try:
            agent.tick(agent.clock())
            parent = agent.request_run_now("fleet")["run_id"]
            work(agent, concurrency=2, max_seconds=60)
            executions = query(agent, "SELECT target_database, status FROM agent.runs "
                                      f"WHERE parent_run_id = {int(parent)} ORDER BY target_database")
            assert executions == [(d, "succeeded") for d in databases], executions
        finally:
            agent.close()
    finally:
        for database in databases:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_the_script_refuses_a_login_that_reaches_a_superuser(least):
    """A login that is a member of a superuser role could SET ROLE to it: grant-sql --agent-login
    --apply fails naming the role, and changes nothing (its one transaction rolls back)."""
    url, login, admin_url = least
    admin = _admin(admin_url)
    try:
        admin.cursor().execute(f'GRANT root TO "{login}"; ALTER ROLE "{login}" CREATEDB')
        with pytest.raises(pyodbc.Error) as raised:
            apply_postgres_script(parse_database_url(admin_url), agent_login_postgres(login))
        assert f"role {login} reaches" in str(raised.value) and "root" in str(raised.value)
        assert cli(["--db", admin_url, "grant-sql", "--agent-login", login, "--apply"]) == 1
        # The script's ALTER ROLE ... NOCREATEDB did not stay: nothing of it did.
        assert query_admin(admin_url, "SELECT rolcreatedb::int FROM pg_roles WHERE rolname = ?", login) == [(1,)]
    finally:
        admin.cursor().execute(f'REVOKE root FROM "{login}"; ALTER ROLE "{login}" NOCREATEDB')
        admin.close()


@pytest.mark.parametrize("login", ['lp "quoted"; DROP ROLE root; --', "lp $agent_grant$ ünï'\\"])
def test_a_hostile_login_name_is_quoted_everywhere(login):
    """The script applies to the role of that exact name (its schema, its database rights) and
    to nothing else; root is still there."""
    with least_privilege_database(login) as (_, made, admin_url):
        assert made == login
        assert query_admin(admin_url, "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'agent'") \
            == [(login,)]
        assert query_admin(admin_url, "SELECT has_database_privilege(?, current_database(), 'TEMPORARY')::int, "
                                      "(SELECT COUNT(*) FROM pg_roles WHERE rolname = 'root')", login) == [(1, 1)]


def query_admin(url: str, sql: str, *params) -> list[tuple]:
    connection = _admin(url)
    try:
        return [tuple(row) for row in connection.cursor().execute(sql, *params).fetchall()]
    finally:
        connection.close()


def test_init_db_says_what_to_do_when_agent_operator_is_missing_and_the_login_cannot_create_it():
    """agent_operator is the one role the migrations need; a login without CREATEROLE cannot make
    it, and init-db says who must (grant-sql --agent-login creates it)."""
    name, admin_url = create_pg_database()
    login = f"lp_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f'CREATE ROLE "{login}" LOGIN')
        db = _admin(admin_url)
        db.cursor().execute(f'CREATE SCHEMA agent AUTHORIZATION "{login}"')
        db.close()
        url = admin_url.replace("Uid=root;", f"Uid={login};")
        # The migration's own check, run as the login with the role renamed away for a moment.
        as_login = pyodbc.connect(url, autocommit=True, timeout=10)
        try:
            text = (ROOT / "shared/control/sql/migrations/postgres/0005_tsql_interface.sql").read_text(encoding="utf-8")
            block = text[text.index("DO $$\nBEGIN\n    IF NOT EXISTS"):]
            block = block[:block.index("$$;") + 3].replace("'agent_operator'", "'agent_operator_missing'")
            block = block.replace("CREATE ROLE agent_operator", "CREATE ROLE agent_operator_missing")
            message = _refused(as_login, block)
            assert "may not create roles" in message and "grant-sql --agent-login" in message, message
        finally:
            as_login.close()
    finally:
        drop_pg_database(name)
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{login}"')
        admin.close()


def test_doctor_warns_when_the_agent_connects_as_more_than_the_agent(least):
    """doctor as the least-privilege login: every check passes and no warning about its rights;
    as root (a superuser): a warning naming it and the fix."""
    url, login, admin_url = least
    for db, expected in ((url, None), (admin_url, "root (superuser)")):
        agent = make_agent(db)
        try:
            report = run_doctor(agent)
            assert report.ok, report.render()
            said = [w for w in report.warnings if "which is or can become" in w]
            if expected is None:
                assert said == [], said
            else:
                (warning,) = said
                assert "'root'" in warning and expected in warning and "grant-sql --agent-login" in warning
        finally:
            agent.close()


def test_an_escape_through_a_deferred_trigger_yields_no_role_under_the_least_privilege_login(operator, least):
    """Issue 34's attack: a job leaves a DEFERRABLE INITIALLY DEFERRED constraint trigger behind,
    which fires at COMMIT, after the owner's context. Whoever it runs as (the agent's login before
    the owner boundary's fix, the owner after it), under this login it can neither create a role
    nor give the operator CREATEROLE. (Whether the run fails or succeeds is the owner boundary's
    business, not this test's.)"""
    name, as_operator, agent, login = operator
    _, _, admin_url = least
    tag = uuid.uuid4().hex[:8]
    victim = f"lp_evil_{tag}"
    admin = _admin(admin_url)
    try:
        admin.cursor().execute(f'GRANT CREATE ON SCHEMA public TO "{name}"')
        trap = (f"CREATE FUNCTION public.trap_{tag}() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
                f"EXECUTE 'CREATE ROLE {victim}'; EXECUTE 'ALTER ROLE \"{name}\" CREATEROLE'; "
                f"EXECUTE 'GRANT agent_operator TO {login}'; RETURN NULL; END $f$; "
                f"CREATE TABLE public.trapped_{tag} (x int); "
                f"CREATE CONSTRAINT TRIGGER fire_{tag} AFTER INSERT ON public.trapped_{tag} "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.trap_{tag}(); "
                f"INSERT INTO public.trapped_{tag} VALUES (1)")
        call(as_operator, "exec_async", sql=trap, execution_order=None, max_attempts=1)
        work(agent, concurrency=1, max_seconds=20)
        assert query_admin(admin_url, "SELECT COUNT(*) FROM pg_roles WHERE rolname = ?", victim) == [(0,)]
        assert query_admin(admin_url, "SELECT rolcreaterole::int FROM pg_roles WHERE rolname = ?", name) == [(0,)]
        assert query_admin(admin_url, "SELECT COUNT(*) FROM pg_auth_members WHERE roleid = 'agent_operator'::regrole "
                                      "AND member = (SELECT oid FROM pg_roles WHERE rolname = ?)", login) == [(0,)]
    finally:
        admin.cursor().execute(f"DROP TABLE IF EXISTS public.trapped_{tag}; DROP FUNCTION IF EXISTS public.trap_{tag}()")
        admin.close()


def test_an_operator_that_reaches_a_privileged_role_is_refused(least):
    """grant-sql --operator makes the agent's login a member of the operator's role: an operator
    that is (or can SET ROLE to) a CREATEROLE role would make the agent reach it, so the script
    refuses, and neither membership stays."""
    url, login, admin_url = least
    operator, boss = f"op_{uuid.uuid4().hex[:8]}", f"boss_{uuid.uuid4().hex[:8]}"
    admin = _admin(admin_url)
    try:
        admin.cursor().execute(f'CREATE ROLE "{boss}" NOLOGIN CREATEROLE; CREATE ROLE "{operator}" LOGIN; '
                               f'GRANT "{boss}" TO "{operator}"')
        assert cli(["--db", admin_url, "grant-sql", "--operator", operator, "--app-name", login, "--apply"]) == 1
        assert query_admin(admin_url, "SELECT COUNT(*) FROM pg_auth_members WHERE member IN "
                                      "(SELECT oid FROM pg_roles WHERE rolname IN (?, ?)) "
                                      "AND roleid IN (SELECT oid FROM pg_roles WHERE rolname IN (?, 'agent_operator'))",
                           login, operator, operator) == [(0,)]
        admin.cursor().execute(f'REVOKE "{boss}" FROM "{operator}"')
        assert cli(["--db", admin_url, "grant-sql", "--operator", operator, "--app-name", login, "--apply"]) == 0
    finally:
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{operator}"; DROP ROLE IF EXISTS "{boss}"')
        admin.close()
