"""The owner boundary (issue 34, item 1), on PostgreSQL through pyodbc: nothing an owned job leaves
behind runs after its owner's context ends, or later with the agent's rights, and what a job asks
of the agent is asked as its owner (docs/tsql.md, "The owner boundary").

The agent's login here is a superuser (root): an escape would reach everything. The operator is a
LOGIN role, member of agent_operator, with CREATE on schema public and INSERT on owned_work
(tests/integration/test_job_owner.py's fixture). Every escape below worked before this change.
"""

from __future__ import annotations

import uuid

import pytest

from tests.integration.test_job_owner import operator  # noqa: F401 - the fixture
from tests.support.harness import PG_BASE, admin_execute, execute, pg_admin_connection, query, work
from tests.support.tsql_caller import call


def _run(agent, run_id: int) -> dict:
    return agent.store().execute("get_run", run_id=run_id).one()


def _gained_nothing(agent, name: str) -> None:
    """The operator has no CREATEROLE and no membership but agent_operator; nothing was written
    as the agent (root)."""
    assert query(agent, f"SELECT CAST(rolcreaterole AS int), CAST(rolsuper AS int) FROM pg_roles WHERE rolname = '{name}'") == [(0, 0)]
    assert query(agent, "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
                        f"JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = '{name}'") == [("agent_operator",)]
    assert query(agent, "SELECT COUNT(*) FROM owned_work WHERE who = 'root'") == [(0,)]


def _escalate(name: str) -> str:
    """A trigger body that, run as the agent's superuser, gives the operator CREATEROLE and the
    membership of pg_read_all_data, and records who ran it."""
    return (f"INSERT INTO owned_work SELECT current_user, 'trigger'; ALTER ROLE \"{name}\" CREATEROLE; "
            f"GRANT pg_read_all_data TO \"{name}\";")


def _deferred_trigger_job(name: str, table: str, *, temporary: bool = False) -> str:
    create = f"CREATE TEMP TABLE {table} (x int)" if temporary else f"CREATE TABLE {table} (x int)"
    return (f"{create}; CREATE FUNCTION {table}_fire() RETURNS trigger LANGUAGE plpgsql AS "
            f"$t$BEGIN {_escalate(name)} RETURN NULL; END$t$; "
            f"CREATE CONSTRAINT TRIGGER {table}_late AFTER INSERT ON {table} DEFERRABLE INITIALLY DEFERRED "
            f"FOR EACH ROW EXECUTE FUNCTION {table}_fire(); INSERT INTO {table} VALUES (1)")


@pytest.mark.parametrize("temporary", [False, True], ids=["table", "temp_table"])
def test_a_deferred_constraint_trigger_fires_as_the_owner_through_exec_async(operator, temporary):  # noqa: F811
    name, as_operator, agent = operator
    table = f"late_{uuid.uuid4().hex[:8]}"
    (task,) = call(as_operator, "exec_async", sql=_deferred_trigger_job(name, table, temporary=temporary),
                   execution_order=None)
    work(agent, concurrency=1)
    failed = _run(agent, task["run_id"])
    # It fired before the job's transaction ended, as the operator: ALTER ROLE was refused.
    assert failed["status"] == "failed", failed
    assert "permission denied" in failed["last_error"] or "must have" in failed["last_error"], failed
    _gained_nothing(agent, name)
    assert query(agent, f"SELECT COUNT(*) FROM pg_class WHERE relname = '{table}'") == [(0,)]


def test_a_deferred_constraint_trigger_fires_as_the_owner_through_add_scheduled_job(operator):  # noqa: F811
    name, as_operator, agent = operator
    table = f"late_{uuid.uuid4().hex[:8]}"
    call(as_operator, "add_scheduled_job", name="late", sql=_deferred_trigger_job(name, table),
         schedule="0 0 4 * * *", max_attempts=1)
    agent.tick(agent.clock())
    (started,) = call(as_operator, "start_job", job_name="late")
    work(agent, concurrency=1)
    assert _run(agent, started["run_id"])["status"] == "failed"
    _gained_nothing(agent, name)


def test_a_deferred_constraint_trigger_fires_as_the_owner_in_a_fleet_execution(operator):  # noqa: F811
    name, as_operator, agent = operator
    prefix = "ob" + uuid.uuid4().hex[:8]
    database = f"{prefix}_0"
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"CREATE DATABASE {database}")
        # In the target, the operator may create tables (as an owner of its own schema would).
        import pyodbc

        target = pyodbc.connect(PG_BASE + f"Database={database};", autocommit=True, timeout=5)
        target.cursor().execute(f'GRANT CREATE ON SCHEMA public TO "{name}"; '
                                "CREATE TABLE owned_work (who text, login text); "
                                f'GRANT INSERT ON owned_work TO "{name}"')
        target.close()
        call(as_operator, "add_scheduled_job", name="fleet_late", sql=_deferred_trigger_job(name, "late_t"),
             schedule="0 0 4 * * *", targets=f"db:{prefix}_*", max_attempts=1)
        agent.tick(agent.clock())
        (started,) = call(as_operator, "start_job", job_name="fleet_late")
        work(agent, concurrency=2, max_seconds=60)
        executions = query(agent, "SELECT status, last_error FROM agent.runs "
                                  f"WHERE parent_run_id = {int(started['run_id'])}")
        assert [s for s, _ in executions] == ["failed"], executions
        _gained_nothing(agent, name)
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_the_owners_deferred_triggers_and_foreign_keys_still_work_and_fire_as_the_owner(operator):  # noqa: F811
    """A trigger that defers itself again and writes (a chain of three rounds), a deferred
    trigger on a temporary table, a deferred foreign key satisfied before the end: all fire, as
    the operator; a deferred foreign key still violated at the end fails the run."""
    name, as_operator, agent = operator
    chain = (
        "CREATE TABLE chain (x int); "
        "CREATE FUNCTION chain_next() RETURNS trigger LANGUAGE plpgsql AS $t$BEGIN "
        "INSERT INTO owned_work SELECT current_user, 'chain ' || NEW.x; "
        "IF NEW.x < 3 THEN SET CONSTRAINTS ALL DEFERRED; INSERT INTO chain VALUES (NEW.x + 1); END IF; "
        "RETURN NULL; END$t$; "
        "CREATE CONSTRAINT TRIGGER chain_late AFTER INSERT ON chain DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION chain_next(); "
        "CREATE TEMP TABLE scratch (x int); "
        "CREATE FUNCTION scratch_seen() RETURNS trigger LANGUAGE plpgsql AS $t$BEGIN "
        "INSERT INTO owned_work SELECT current_user, 'temp'; RETURN NULL; END$t$; "
        "CREATE CONSTRAINT TRIGGER scratch_late AFTER INSERT ON pg_temp.scratch DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION scratch_seen(); "
        "CREATE TABLE parent (id int PRIMARY KEY); "
        "CREATE TABLE child (parent_id int REFERENCES parent DEFERRABLE INITIALLY DEFERRED); "
        "INSERT INTO child VALUES (7); INSERT INTO parent VALUES (7); "
        "INSERT INTO chain VALUES (1); INSERT INTO pg_temp.scratch VALUES (1)")
    (good,) = call(as_operator, "exec_async", sql=chain, execution_order=None)
    work(agent, concurrency=1)
    assert _run(agent, good["run_id"])["status"] == "succeeded", _run(agent, good["run_id"])
    assert sorted(query(agent, "SELECT who, login FROM owned_work")) == [
        (name, "chain 1"), (name, "chain 2"), (name, "chain 3"), (name, "temp")]
    assert query(agent, "SELECT COUNT(*) FROM child") == [(1,)]

    (orphan,) = call(as_operator, "exec_async", sql="INSERT INTO child VALUES (8)", execution_order=None)
    work(agent, concurrency=1)
    failed = _run(agent, orphan["run_id"])
    assert failed["status"] == "failed" and "foreign key" in failed["last_error"], failed
    assert query(agent, "SELECT COUNT(*) FROM child") == [(1,)]


def test_a_job_whose_deferred_triggers_never_settle_fails_and_keeps_nothing(operator):  # noqa: F811
    name, as_operator, agent = operator
    forever = (
        "SET stats_fetch_consistency = snapshot; CREATE TABLE ping (x int); INSERT INTO owned_work VALUES ('before', 'x'); "
        "CREATE FUNCTION ping_again() RETURNS trigger LANGUAGE plpgsql AS $t$BEGIN "
        f"SET CONSTRAINTS ALL DEFERRED; INSERT INTO ping VALUES (NEW.x + 1); {_escalate(name)} RETURN NULL; END$t$; "
        "CREATE CONSTRAINT TRIGGER ping_late AFTER INSERT ON ping DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION ping_again(); INSERT INTO ping VALUES (1)")
    # The escalation inside the trigger would fail as the operator at once: without it, the
    # chain runs until the agent gives up.
    forever = forever.replace(_escalate(name), "")
    (task,) = call(as_operator, "exec_async", sql=forever, execution_order=None)
    work(agent, concurrency=1)
    failed = _run(agent, task["run_id"])
    assert failed["status"] == "failed", failed
    assert "deferred triggers did not settle" in failed["last_error"], failed
    assert "10 rounds" in failed["last_error"], failed
    assert query(agent, "SELECT COUNT(*) FROM owned_work") == [(0,)]
    assert query(agent, "SELECT COUNT(*) FROM pg_class WHERE relname = 'ping'") == [(0,)]
    _gained_nothing(agent, name)


@pytest.mark.parametrize("procedure", ["exec_async", "add_scheduled_job", "pause_job", "add_calendar"])
def test_what_a_job_asks_of_the_agent_is_asked_as_its_owner(operator, procedure):  # noqa: F811
    """agent.* called from inside an owned job: the caller recorded is the job's owner, not the
    agent's login (session_user); the work it queues runs with the owner's rights."""
    name, as_operator, agent = operator
    victim = f"evil_{uuid.uuid4().hex[:8]}"
    if procedure == "add_calendar":
        nested = "PERFORM agent.add_calendar(name => 'nested_cal', dates => '2030-01-01');"
        check = "SELECT defined_by FROM agent.calendars WHERE name = 'nested_cal'"
    elif procedure == "pause_job":
        call(as_operator, "add_scheduled_job", name="to_pause", sql="SELECT 1", schedule="0 0 4 * * *")
        nested = "PERFORM agent.pause_job(job_name => 'to_pause');"
        check = "SELECT paused_by FROM agent.job_pauses WHERE job_name = 'to_pause'"
    elif procedure == "exec_async":
        nested = f"PERFORM agent.exec_async(sql => 'CREATE ROLE {victim} SUPERUSER', execution_order => NULL);"
        check = "SELECT owner FROM agent.runs WHERE kind = 'task' AND command LIKE 'CREATE ROLE%'"
    else:
        nested = (f"PERFORM agent.add_scheduled_job(name => 'nested', sql => 'CREATE ROLE {victim} SUPERUSER', "
                  "schedule => '0 0 4 * * *');")
        check = "SELECT owner FROM agent.jobs WHERE job_name = 'nested'"
    try:
        (outer,) = call(as_operator, "exec_async", sql=f"DO $n$BEGIN {nested} END$n$", execution_order=None)
        work(agent, concurrency=1)
        assert _run(agent, outer["run_id"])["status"] == "succeeded", _run(agent, outer["run_id"])
        assert query(agent, check) == [(name,)]
        # Its audit row (migration 0017) names the owner too, not the agent's login.
        principals = {principal for (principal,) in query(agent, "SELECT principal FROM agent.audit WHERE source = 'tsql'")}
        assert principals == {name}, principals
        if procedure == "add_scheduled_job":
            agent.tick(agent.clock())
            call(as_operator, "start_job", job_name="nested")
        work(agent, concurrency=1)
        assert query(agent, f"SELECT COUNT(*) FROM pg_roles WHERE rolname = '{victim}'") == [(0,)]
        _gained_nothing(agent, name)
    finally:   # an escape (before the fix) made a superuser: never leave it on the server
        admin = pg_admin_connection()
        try:
            admin.cursor().execute(f'DROP ROLE IF EXISTS "{victim}"')
        finally:
            admin.close()


def test_a_search_path_the_job_set_never_resolves_the_agents_names(operator):  # noqa: F811
    """The job puts a schema of its own first in the session's search_path, with now(), an `=`
    for every type pair the agent compares and json functions that escalate when the agent's
    later statements resolve them. None runs as the agent: the rest of the job's batch resolves
    in pg_catalog, the completion resets every setting first, and the connection is closed when
    the transaction ends."""
    name, as_operator, agent = operator
    schema = f"evil_{uuid.uuid4().hex[:8]}"
    admin_execute(agent.target.location,
                  f'DO $g$BEGIN EXECUTE format(\'GRANT CREATE ON DATABASE %I TO "{name}"\', current_database()); END$g$')
    escalate = _escalate(name).replace("'trigger'", "'hijack'")
    trap = (
        f"CREATE SCHEMA {schema}; "
        f"CREATE FUNCTION {schema}.now() RETURNS timestamptz LANGUAGE plpgsql AS $f$BEGIN {escalate} "
        "RETURN pg_catalog.now(); END$f$; "
        f"CREATE FUNCTION {schema}.eq(bigint, bigint) RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN {escalate} "
        "RETURN $1 OPERATOR(pg_catalog.=) $2; END$f$; "
        f"CREATE OPERATOR {schema}.= (LEFTARG = bigint, RIGHTARG = bigint, FUNCTION = {schema}.eq); "
        f"CREATE FUNCTION {schema}.eq(int, int) RETURNS boolean LANGUAGE plpgsql AS $f$BEGIN {escalate} "
        "RETURN $1 OPERATOR(pg_catalog.=) $2; END$f$; "
        f"CREATE OPERATOR {schema}.= (LEFTARG = int, RIGHTARG = int, FUNCTION = {schema}.eq); "
        f"CREATE FUNCTION {schema}.json_to_recordset(json) RETURNS SETOF record LANGUAGE plpgsql AS $f$BEGIN "
        f"{escalate} RETURN QUERY SELECT * FROM pg_catalog.json_to_recordset($1); END$f$; "
        f"CREATE FUNCTION {schema}.pg_backend_pid() RETURNS int LANGUAGE plpgsql AS $f$BEGIN {escalate} "
        "RETURN pg_catalog.pg_backend_pid(); END$f$; "
        f"CREATE FUNCTION {schema}.txid_current() RETURNS bigint LANGUAGE plpgsql AS $f$BEGIN {escalate} "
        "RETURN pg_catalog.txid_current(); END$f$; "
        f"GRANT USAGE ON SCHEMA {schema} TO PUBLIC; "
        f"SELECT set_config('search_path', '{schema}, pg_catalog, public', false); "
        "SELECT set_config('TimeZone', 'Pacific/Kiritimati', false); "
        f"SET search_path = {schema}, pg_catalog, public")
    (task,) = call(as_operator, "exec_async", sql=trap, execution_order=None)
    (after,) = call(as_operator, "exec_async", sql="INSERT INTO owned_work SELECT current_user, 'next'",
                    execution_order=None)
    work(agent, concurrency=1)
    assert _run(agent, task["run_id"])["status"] == "succeeded", _run(agent, task["run_id"])
    assert _run(agent, after["run_id"])["status"] == "succeeded"
    assert query(agent, "SELECT who, login FROM owned_work") == [(name, "next")]
    _gained_nothing(agent, name)
    # The agent's later statements are unaffected: its clock is the database's UTC one still.
    (row,) = query(agent, f"SELECT finished_at FROM agent.runs WHERE run_id = {int(after['run_id'])}")
    assert abs((row[0] - query(agent, "SELECT CAST(now() AT TIME ZONE 'UTC' AS timestamp)")[0][0]).total_seconds()) < 600
    execute(agent, f"DROP SCHEMA {schema} CASCADE")


def test_nothing_a_job_left_in_its_session_outlives_its_run(operator):  # noqa: F811
    """A session advisory lock, a cursor WITH HOLD, a prepared statement, a listener, a temporary
    function: after the owned run the session is gone (the agent closed the connection), so no
    lock is still held and the agent's next runs meet none of them."""
    name, as_operator, agent = operator
    leave = ("SELECT pg_advisory_lock(424242); LISTEN agent_owner_boundary; "
             "DO $d$BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT 1'; "
             "EXECUTE 'PREPARE left_behind AS SELECT 1'; END$d$; "
             "CREATE FUNCTION pg_temp.left_fn() RETURNS int LANGUAGE sql AS 'SELECT 1'; "
             "INSERT INTO owned_work SELECT current_user, CAST(pg_backend_pid() AS text)")
    (task,) = call(as_operator, "exec_async", sql=leave, execution_order=None)
    work(agent, concurrency=1)
    assert _run(agent, task["run_id"])["status"] == "succeeded", _run(agent, task["run_id"])
    ((_, pid),) = query(agent, "SELECT who, login FROM owned_work")
    admin = pg_admin_connection()
    try:
        cursor = admin.cursor()
        assert cursor.execute("SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 424242"
                              ).fetchone()[0] == 0
        assert cursor.execute("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = ?", int(pid)).fetchone()[0] == 0
    finally:
        admin.close()


def test_a_jobs_own_database_with_an_operators_agent_schema_is_never_written(operator):  # noqa: F811
    """A task's @database where the operator made its own "agent.owned_sessions", with a trigger
    that escalates whoever writes the table: the agent marks only a table its own login owns, so
    the trigger never runs as the agent, and the task runs as the operator."""
    import pyodbc

    name, as_operator, agent = operator
    database = "ob" + uuid.uuid4().hex[:8]
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"CREATE DATABASE {database}")
        target = pyodbc.connect(PG_BASE + f"Database={database};", autocommit=True, timeout=5)
        target.cursor().execute(
            f'CREATE SCHEMA agent AUTHORIZATION "{name}"; SET ROLE "{name}"; '
            "CREATE TABLE agent.owned_sessions (backend_pid int, transaction_id bigint, owner varchar(256)); "
            "CREATE FUNCTION agent.hook() RETURNS trigger LANGUAGE plpgsql AS "
            f"$t$BEGIN ALTER ROLE \"{name}\" CREATEROLE; RETURN NEW; END$t$; "
            "CREATE TRIGGER hook BEFORE INSERT OR DELETE ON agent.owned_sessions "
            "FOR EACH ROW EXECUTE FUNCTION agent.hook(); RESET ROLE")
        target.close()
        (task,) = call(as_operator, "exec_async", sql="DO $d$BEGIN RAISE NOTICE 'ran as %', current_user; END$d$",
                       database=database, execution_order=None)
        work(agent, concurrency=1)
        run = _run(agent, task["run_id"])
        assert run["status"] == "succeeded", run
        _gained_nothing(agent, name)
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_a_cursor_with_hold_in_a_jobs_own_database_never_runs_as_the_agent(operator):  # noqa: F811
    """A held cursor still open at COMMIT runs its query then, as the session's user. In a task's
    @database no completion closes it before that COMMIT: the owner's function does."""
    import pyodbc

    name, as_operator, agent = operator
    database = "oc" + uuid.uuid4().hex[:8]
    admin = pg_admin_connection()
    try:
        admin.cursor().execute(f"CREATE DATABASE {database}")
        target = pyodbc.connect(PG_BASE + f"Database={database};", autocommit=True, timeout=5)
        target.cursor().execute(f'GRANT CREATE ON SCHEMA public TO "{name}"')
        target.close()
        sql = ("CREATE FUNCTION escalate() RETURNS int LANGUAGE plpgsql AS "
               f"$f$BEGIN ALTER ROLE \"{name}\" CREATEROLE; RETURN 1; END$f$; "
               "DO $d$BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT escalate()'; END$d$")
        (task,) = call(as_operator, "exec_async", sql=sql, database=database, execution_order=None)
        work(agent, concurrency=1)
        run = _run(agent, task["run_id"])
        assert run["status"] == "succeeded", run
        _gained_nothing(agent, name)
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()
