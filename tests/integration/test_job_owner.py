"""Jobs defined from the database side run as their owner, and no job escapes the principal it
runs as (issue 23, item 2), on PostgreSQL through pyodbc.

The agent's login here is a superuser (root): the worst case, where an escape would reach
everything. The operator is a LOGIN role that is a member of agent_operator and nothing else.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest

from shared.cli.commands import main as cli
from tests.support.harness import admin_execute, agent_login_of, execute, make_agent, pg_admin_connection, query, work
from tests.support.tsql_caller import call

ESCAPES = {
    "reset_role": "RESET ROLE",
    "set_role": "SET ROLE root",
    "set_local_role": "SET LOCAL ROLE root",
    "session_authorization": "SET SESSION AUTHORIZATION root",
    "reset_session_authorization": "RESET SESSION AUTHORIZATION",
    "set_config": "SELECT set_config('role', 'root', true)",
    "nested_do": "DO $$BEGIN EXECUTE 'RESET ROLE'; END$$",
    "commit": "COMMIT",
}


@pytest.fixture
def operator(pg_url):
    """A login role, member of agent_operator only (no CREATEROLE), with INSERT on one table;
    its connection; the agent (as root)."""
    agent = make_agent(pg_url)
    name = f"op_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
    import pyodbc

    least = agent_login_of(pg_url)
    if least:
        # AGENT_TEST_PG_LEAST_PRIVILEGE=1: the agent is grant-sql --agent-login's login; the admin
        # makes the operator one as docs/tsql.md says (grant-sql --operator ... --app-name LOGIN).
        login, admin_url = least
        assert cli(["--db", admin_url, "grant-sql", "--operator", name, "--app-name", login, "--apply"]) == 0
        admin_execute(pg_url, f'GRANT CREATE ON SCHEMA public TO "{name}"')
    else:
        execute(agent, f'GRANT agent_operator TO "{name}"; GRANT CREATE ON SCHEMA public TO "{name}"')
    execute(agent, f'CREATE TABLE owned_work (who text, login text); '
                   f'GRANT INSERT, SELECT ON owned_work TO "{name}"; '
                   f'CREATE TABLE secret (x int); '
                   f'INSERT INTO secret VALUES (42)')
    user = least[0] if least else "root"
    connection = pyodbc.connect(pg_url.replace(f"Uid={user};", f"Uid={name};"), autocommit=True, timeout=10)
    try:
        yield name, connection, agent
    finally:
        with contextlib.suppress(Exception):      # a test may have closed it
            connection.close()
        if _exists(admin, name):
            admin_execute(pg_url, f'DROP OWNED BY "{name}"')   # its grants in the test database
        agent.close()
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


@contextlib.contextmanager
def _another_operator(pg_url, agent):
    """One more operator login (as the fixture makes one), without rights on owned_work."""
    import pyodbc

    name = f"op_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
    least = agent_login_of(pg_url)
    try:
        if least:
            login, admin_url = least
            assert cli(["--db", admin_url, "grant-sql", "--operator", name, "--app-name", login, "--apply"]) == 0
        else:
            execute(agent, f'GRANT agent_operator TO "{name}"')
        user = least[0] if least else "root"
        connection = pyodbc.connect(pg_url.replace(f"Uid={user};", f"Uid={name};"), autocommit=True, timeout=10)
        try:
            yield name, connection
        finally:
            connection.close()
    finally:
        if _exists(admin, name):
            admin_execute(pg_url, f'DROP OWNED BY "{name}"')
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


def test_a_run_keeps_the_owner_of_the_sql_it_carries_whoever_owns_the_job_when_it_runs(operator, pg_url):
    """An attack (migration 0032): operator B's job, started (agent.start_job) and waiting to run or
    to retry, redefined by operator A (which makes A its owner), or removed by B and defined again
    by A, ran B's SQL as A: a run took its owner from the job when it executed. It keeps the owner
    of the SQL it copied: B's SQL runs as B, and fails for want of A's rights."""
    a_name, as_a, agent = operator
    with _another_operator(pg_url, agent) as (b_name, as_b):
        sql = "INSERT INTO owned_work SELECT current_user, session_user"     # only A may write owned_work
        started = []
        for name, redefine in (("redefined", False), ("removed_and_defined", True)):
            call(as_b, "add_scheduled_job", name=name, sql=sql, max_attempts=1)
            agent.tick(agent.clock())
            (run,) = call(as_b, "start_job", job_name=name)
            started.append(run["run_id"])
            if redefine:
                call(as_b, "remove_scheduled_job", name=name)
            call(as_a, "add_scheduled_job", name=name, sql="SELECT 1")       # A owns the name now
        agent.tick(agent.clock())
        work(agent, concurrency=1)
        for run_id in started:
            run = _run(agent, run_id)
            assert run["status"] == "failed" and f"its owner '{b_name}'" in (run["last_error"] or ""), run
        assert query(agent, "SELECT COUNT(*) FROM owned_work") == [(0,)]


def _login(agent) -> str:
    """The agent's login: root, or grant-sql --agent-login's (AGENT_TEST_PG_LEAST_PRIVILEGE=1)."""
    return query(agent, "SELECT CAST(session_user AS text)")[0][0]


def _exists(admin, role: str) -> bool:
    return admin.cursor().execute("SELECT COUNT(*) FROM pg_roles WHERE rolname = ?", role).fetchone()[0] == 1


def _run(agent, run_id: int) -> dict:
    return agent.store().execute("get_run", run_id=run_id).one()


def test_a_task_runs_as_the_operator_who_queued_it_and_cannot_create_roles(operator):
    name, as_operator, agent = operator
    victim = f"evil_{uuid.uuid4().hex[:8]}"
    (good,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT current_user, session_user",
                   execution_order=None)
    (superuser,) = call(as_operator, "exec_async", sql=f"CREATE ROLE {victim} SUPERUSER", execution_order=None)
    (role,) = call(as_operator, "exec_async", sql=f"CREATE ROLE {victim}", execution_order=None)
    (read,) = call(as_operator, "exec_async", sql="CREATE TEMP TABLE t AS SELECT * FROM secret", execution_order=None)
    assert query(agent, f"SELECT owner FROM agent.runs WHERE run_id = {int(good['run_id'])}") == [(name,)]
    work(agent, concurrency=2)
    assert _run(agent, good["run_id"])["status"] == "succeeded"
    # Its SQL ran with the operator's rights (current_user), on the agent's connection (session_user).
    assert query(agent, "SELECT who, login FROM owned_work") == [(name, _login(agent))]
    for run in (superuser, role, read):
        failed = _run(agent, run["run_id"])
        assert failed["status"] == "failed", failed
        assert "permission denied" in failed["last_error"] or "must be superuser" in failed["last_error"], failed
        assert repr(name) in failed["last_error"]                        # whose rights they were
    assert query(agent, f"SELECT COUNT(*) FROM pg_roles WHERE rolname = '{victim}'") == [(0,)]


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_a_job_cannot_escape_its_owner_and_nothing_it_did_commits(operator, escape):
    name, as_operator, agent = operator
    table = f"esc_{escape}"
    sql = (f"CREATE TABLE {table} (x int); INSERT INTO owned_work VALUES ('{escape}', 'before'); "
           f"{ESCAPES[escape]}; INSERT INTO owned_work SELECT current_user, 'after'; "
           "INSERT INTO owned_work SELECT 'stolen', CAST(x AS text) FROM secret")
    (task,) = call(as_operator, "exec_async", sql=sql, execution_order=None)
    work(agent, concurrency=1)
    failed = _run(agent, task["run_id"])
    assert failed["status"] == "failed", failed
    assert ("cannot set parameter" in failed["last_error"] or "transaction" in failed["last_error"]), failed
    assert query(agent, "SELECT COUNT(*) FROM owned_work") == [(0,)]      # the work before the attempt: gone
    assert query(agent, f"SELECT COUNT(*) FROM pg_class WHERE relname = '{table}'") == [(0,)]
    # The agent's own session is its own again, and goes on running jobs.
    (after,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT current_user, 'next'",
                    execution_order=None)
    work(agent, concurrency=1)
    assert _run(agent, after["run_id"])["status"] == "succeeded"
    assert query(agent, "SELECT who, login FROM owned_work") == [(name, "next")]


def test_a_job_defined_with_add_scheduled_job_runs_as_its_owner_and_fails_naming_a_dropped_owner(operator, pg_url):
    name, as_operator, agent = operator
    call(as_operator, "add_scheduled_job", name="owned", sql="INSERT INTO owned_work SELECT current_user, 'job'",
         schedule="0 0 4 * * *", max_attempts=1)
    agent.tick(agent.clock())
    assert query(agent, "SELECT owner FROM agent.jobs WHERE job_name = 'owned'") == [(name,)]
    (started,) = call(as_operator, "start_job", job_name="owned")
    work(agent, concurrency=1)
    assert _run(agent, started["run_id"])["status"] == "succeeded"
    assert query(agent, "SELECT who FROM owned_work") == [(name,)]

    (queued,) = call(as_operator, "exec_async", sql="SELECT 1", execution_order=None)
    (again,) = call(as_operator, "start_job", job_name="owned")
    as_operator.close()
    admin = pg_admin_connection()
    try:
        admin_execute(agent.target.location, f'DROP OWNED BY "{name}"')
        admin.cursor().execute(f'DROP ROLE "{name}"')
    finally:
        admin.close()
    work(agent, concurrency=1)
    for run in (queued, again):
        failed = _run(agent, run["run_id"])
        assert failed["status"] == "failed", failed
        assert f"the job's owner {name!r} cannot run this job" in failed["last_error"], failed
        assert "does not exist" in failed["last_error"], failed


def test_agent_job_principal_cannot_be_escaped_either(pg_url):
    """AGENT_JOB_PRINCIPAL's jobs (from the settings) get the same boundary: RESET ROLE used to
    return them to the agent's login."""
    role = f"jp_{uuid.uuid4().hex[:8]}"
    setup = make_agent(pg_url)
    least = agent_login_of(pg_url)
    # The deployer makes the role and lets the agent's login act as it (grant-sql --agent-login
    # ... --job-principal; root is a superuser already).
    admin_execute(pg_url, f"CREATE ROLE {role} NOLOGIN" + (f'; GRANT {role} TO "{least[0]}"' if least else ""))
    execute(setup, f"CREATE TABLE jp_work (who text); GRANT INSERT ON jp_work TO {role}")
    setup.close()
    agent = make_agent(pg_url, {"plain": {"SCHEDULE": "0 0 4 * * *",
                                           "COMMAND": "INSERT INTO jp_work SELECT current_user"},
                                "escape": {"SCHEDULE": "0 0 4 * * *", "MAX_ATTEMPTS": "1",
                                           "COMMAND": "RESET ROLE; UPDATE agent.runs SET note = 'forged'"}},
                       AGENT_JOB_PRINCIPAL=role)
    try:
        agent.tick(agent.clock())
        plain = agent.request_run_now("plain")["run_id"]
        escape = agent.request_run_now("escape")["run_id"]
        work(agent, concurrency=1)
        assert _run(agent, plain)["status"] == "succeeded"
        assert query(agent, "SELECT who FROM jp_work") == [(role,)]
        failed = _run(agent, escape)
        assert failed["status"] == "failed" and "cannot set parameter \"role\"" in failed["last_error"], failed
        assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE note = 'forged'") == [(0,)]
    finally:
        agent.close()
        admin_execute(pg_url, f"DROP OWNED BY {role}; DROP ROLE {role}")


def test_settings_jobs_and_cli_tasks_still_run_as_the_agent(pg_url):
    agent = make_agent(pg_url, {"mine": {"SCHEDULE": "0 0 4 * * *",
                                          "COMMAND": "CREATE TABLE mine AS SELECT current_user AS who"}})
    try:
        agent.tick(agent.clock())
        run_id = agent.request_run_now("mine")["run_id"]
        work(agent, concurrency=1)
        assert _run(agent, run_id)["status"] == "succeeded"
        assert query(agent, "SELECT who FROM mine") == [(_login(agent),)]
        assert query(agent, f"SELECT owner FROM agent.runs WHERE run_id = {int(run_id)}") == [(None,)]
    finally:
        agent.close()


def test_each_fleet_execution_of_an_operators_job_runs_as_the_operator(operator):
    """agent.add_scheduled_job @targets by the operator: every target database's execution runs
    as the operator (checked inside each database), and a command beyond its rights fails there."""
    name, as_operator, agent = operator
    prefix = "ow" + uuid.uuid4().hex[:8]
    databases = [f"{prefix}_{i}" for i in range(3)]
    admin = pg_admin_connection()
    try:
        for database in databases:
            admin.cursor().execute(f"CREATE DATABASE {database}")
        check = (f"DO $$BEGIN IF current_user <> '{name}' OR session_user <> '{_login(agent)}' THEN "
                 "RAISE EXCEPTION 'ran as %', current_user; END IF; RAISE NOTICE 'ran as %', current_user; END$$")
        call(as_operator, "add_scheduled_job", name="fleet_ok", sql=check, schedule="0 0 4 * * *",
             targets=f"db:{prefix}_*", max_attempts=1)
        call(as_operator, "add_scheduled_job", name="fleet_bad", sql=f"CREATE ROLE {prefix}_evil",
             schedule="0 0 4 * * *", targets=f"db:{prefix}_*", max_attempts=1)
        agent.tick(agent.clock())
        (ok,) = call(as_operator, "start_job", job_name="fleet_ok")
        (bad,) = call(as_operator, "start_job", job_name="fleet_bad")
        work(agent, concurrency=3, max_seconds=60)
        executions = query(agent, "SELECT parent_run_id, target_database, status, last_error FROM agent.runs "
                                  f"WHERE parent_run_id IN ({int(ok['run_id'])}, {int(bad['run_id'])})")
        assert sorted((p, d, s) for p, d, s, _ in executions if p == ok["run_id"]) == [
            (ok["run_id"], d, "succeeded") for d in databases]
        failed = [(d, s, e) for p, d, s, e in executions if p == bad["run_id"]]
        assert sorted(d for d, _, _ in failed) == databases
        assert all(s == "failed" and "permission denied" in e and repr(name) in e for _, s, e in failed), failed
        assert query(agent, f"SELECT COUNT(*) FROM pg_roles WHERE rolname = '{prefix}_evil'") == [(0,)]
    finally:
        for database in databases:
            admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_the_jobs_sql_reaches_the_owners_function_exactly(operator):
    """The job's SQL is a parameter of the function call, never spliced into its body: quotes,
    backslashes, '?', dollar quotes and Unicode arrive as written."""
    name, as_operator, agent = operator
    literal = "it's \\ ? $$ $agent$ ünï ✓ ;"
    sql = ("INSERT INTO owned_work SELECT " + "'" + literal.replace("'", "''") + "'" + ", current_user; "
           "DO $x$BEGIN RAISE NOTICE 'done %', current_user; END$x$")
    (task,) = call(as_operator, "exec_async", sql=sql, execution_order=None)
    work(agent, concurrency=1)
    assert _run(agent, task["run_id"])["status"] == "succeeded"
    assert query(agent, "SELECT who, login FROM owned_work") == [(literal, name)]


@pytest.mark.parametrize("owner", ["ops", "it's", "a]b", "Ünïcode 名前", "x'; REVERT; --"])
def test_the_sql_server_batch_impersonates_the_owner_with_a_cookie_and_parses(owner):
    """The T-SQL the agent sends on SQL Server / Azure SQL (run there by the conformance run):
    EXECUTE AS USER = the owner WITH COOKIE, the job's SQL through sp_executesql (its own scope),
    REVERT only with the cookie; the owner's name is one string literal, whatever it holds."""
    from sqlfluff.core import FluffConfig, Linter
    from sqlglot.dialects.tsql import TSQL

    from shared.control.store import mssql_job_batch

    batch = mssql_job_batch(owner)
    lines = batch.splitlines()
    # sqlfluff's T-SQL grammar has no EXECUTE AS / REVERT statements: the rest is parsed, those two
    # are checked token by token (the owner one N'' literal; the cookie the batch's own variable).
    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql"}))
    rest = "\n".join(line for line in lines if not line.startswith(("EXECUTE AS", "REVERT")))
    parsed = linter.parse_string(rest.replace("?", "N'SELECT 1'"))
    assert not parsed.violations and "unparsable" not in parsed.tree.stringify(), parsed.tree.stringify()
    (execute_as,) = [line for line in lines if line.startswith("EXECUTE AS")]
    tokens = [(t.token_type.name, t.text) for t in TSQL().tokenize(execute_as)]
    assert [t for t in tokens if t[0] == "NATIONAL_STRING"] == [("NATIONAL_STRING", owner)]
    assert [t[1].upper() for t in tokens[:4]] == ["EXECUTE", "AS", "USER", "="]
    assert [t[1].upper() for t in tokens[-5:]] == ["COOKIE", "INTO", "@", "AGENT_COOKIE", ";"] or \
        [t[1].upper() for t in tokens[-4:]] == ["COOKIE", "INTO", "@AGENT_COOKIE", ";"], tokens
    assert "WITH COOKIE INTO @agent_cookie" in batch and "REVERT WITH COOKIE = @agent_cookie" in batch
    assert batch.index("\nEXECUTE AS USER") < batch.index("\nEXEC sp_executesql N'SET NOCOUNT OFF;") < \
        batch.index("@agent_job = ?;") < batch.index("\nREVERT WITH COOKIE")


def test_in_queue_mode_the_started_run_carries_its_owner(operator, pg_url):
    """Queue mode (the Functions host): start_run hands the owner over with the run; the task
    runs as the operator, and a job's escape fails there too."""
    from shared.messaging.memory import MemoryQueue

    name, as_operator, direct = operator
    agent = make_agent(pg_url, queue=MemoryQueue())
    try:
        (good,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT current_user, 'queued'",
                       execution_order=None)
        (bad,) = call(as_operator, "exec_async", sql="RESET ROLE; INSERT INTO owned_work VALUES ('x', 'y')",
                      execution_order=None)
        agent.tick(agent.clock())
        work(agent, concurrency=1)
        assert _run(agent, good["run_id"])["status"] == "succeeded"
        assert _run(agent, bad["run_id"])["status"] == "failed"
        assert query(agent, "SELECT who, login FROM owned_work") == [(name, "queued")]
    finally:
        agent.close()


def test_a_claim_that_cannot_see_its_run_never_reads_as_no_owner(operator):
    """claim_runs/start_run say '' for a run of the agent's user and NULL when the claim's outer
    statement could not see the run (on PostgreSQL its snapshot predates the claim function's:
    a fleet execution another worker created meanwhile). NULL is looked up (run_owner), never
    taken for the agent's user: a full-suite run saw an operator's fleet execution run as root."""
    name, as_operator, agent = operator
    (queued,) = call(as_operator, "exec_async", sql="SELECT 1", execution_order=None)
    store = agent.store()
    executor = agent.executor()
    assert executor._owner(store, {"run_id": queued["run_id"], "owner": None}) == name
    assert executor._owner(store, {"run_id": queued["run_id"]}) == name
    assert executor._owner(store, {"run_id": queued["run_id"], "owner": name}) == name
    assert executor._owner(store, {"run_id": queued["run_id"], "owner": ""}) is None
    # What the claim itself says for it (it saw the run: the owner, not NULL).
    claimed = {row["run_id"]: row["owner"] for row in store.execute(
        "claim_runs", now=agent.clock(), late_cutoff=agent.clock(), batch=10, max_concurrency=10,
        worker="test").rows}
    assert claimed[queued["run_id"]] == name
