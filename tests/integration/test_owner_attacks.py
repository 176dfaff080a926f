"""An attack on the owner boundary (issue 34, part A), written from the docs alone: an operator with
the documented rights (a login role, member of agent_operator, calling agent.exec_async,
agent.add_scheduled_job and fleet jobs) tries to get anything run as the agent's login, by every
mechanism of shared/attacks.md's "Identity and privilege" class beyond the deferred trigger that
tests/integration/test_owner_boundary.py covers. Each test fails if its escape works.

The agent's login here is a superuser (root), so an escape would reach everything: every trap
records ``current_user`` and ``session_user`` into a table and tries to give the operator
CREATEROLE and membership of pg_read_all_data, which only the agent's login could do. The
fixture (tests/integration/test_job_owner.py) gives the operator CREATE on schema public of the
control database, the right PostgreSQL 14 and older gave everyone.

Two escapes were found and are closed here (docs/tsql.md, "The owner boundary"):

* functions and operators an operator planted in a schema of the agent's default search_path
  (public), matching an unqualified call of the agent's better than pg_catalog's does
  (pg_advisory_xact_lock(integer) for the tick's lock, left(varchar, integer) for the audit
  row): they ran as the agent's login;
* a database the operator owns, targeted by its job, with ``ALTER DATABASE ... SET search_path``
  putting a schema of the operator's before pg_catalog: the agent's own statements there
  (txid_current(), the types of its function's arguments through a DOMAIN with a CHECK) ran the
  operator's code as the agent's login; ``SET role`` there made the agent's statements another
  role's.

Both are one class, closed as one: every session the agent opens (control database, a job's
database, fleet targets) pins ``search_path`` to ``pg_catalog, pg_temp`` and ``role`` to none in
the connection's startup packet (so no database or role setting, and no RESET ALL, changes them),
and the job's own SQL gets the search_path the database's and role's settings give, in its own
transaction only.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest

from shared.engine.operations import pause_job
from tests.integration.test_job_owner import operator  # noqa: F401 - the fixture
from tests.support.harness import PG_BASE, execute, pg_admin_connection, query, work
from tests.support.tsql_caller import CallError, call


def _run(agent, run_id: int) -> dict:
    return agent.store().execute("get_run", run_id=run_id).one()


def _agent_login(agent) -> str:
    return query(agent, "SELECT CAST(session_user AS text)")[0][0]


def _gained_nothing(agent, name: str) -> None:
    """The operator has no CREATEROLE and no membership but agent_operator; nothing of the
    operator's ran as the agent's login."""
    assert query(agent, f"SELECT CAST(rolcreaterole AS int), CAST(rolsuper AS int) FROM pg_roles WHERE rolname = '{name}'") == [(0, 0)]
    assert query(agent, "SELECT r.rolname FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid "
                        f"JOIN pg_roles u ON u.oid = m.member WHERE u.rolname = '{name}'") == [("agent_operator",)]
    login = _agent_login(agent)
    assert query(agent, f"SELECT who, login FROM owned_work WHERE who = '{login}'") == []


def _trap(name: str, what: str) -> str:
    """PL/pgSQL statements that record who runs them and, run as the agent's superuser, give the
    operator CREATEROLE and pg_read_all_data (refused, and swallowed, for anyone else)."""
    return (f"INSERT INTO public.owned_work SELECT CAST(current_user AS text), '{what}'; "
            f"BEGIN ALTER ROLE \"{name}\" CREATEROLE; GRANT pg_read_all_data TO \"{name}\"; "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END;")


def _owned_job(as_operator, agent, sql: str, **extra) -> dict:
    (task,) = call(as_operator, "exec_async", sql=sql, execution_order=None, **extra)
    work(agent, concurrency=1)
    return _run(agent, task["run_id"])


# --- objects the agent later uses: the default search_path ---------------------------------------

def test_functions_an_operator_plants_in_public_never_run_as_the_agent(operator):  # noqa: F811
    """ESCAPED before the fix: pg_advisory_xact_lock(integer) in public matches the tick's
    pg_advisory_xact_lock(7428014) exactly (pg_catalog's takes bigint), left(varchar, integer)
    the audit row's left(CAST(... AS varchar), 256); an operator (`||`) for text and integer the
    alerts' notes. Created as the operator, directly (no job needed): the agent's tick, its work
    and an audited pause then resolved them, as the agent's login."""
    name, as_operator, agent = operator
    overloads = [
        ("pg_advisory_xact_lock", "integer", "void", "PERFORM pg_catalog.pg_advisory_xact_lock(CAST($1 AS bigint));"),
        ("pg_advisory_xact_lock_shared", "integer", "void",
         "PERFORM pg_catalog.pg_advisory_xact_lock_shared(CAST($1 AS bigint));"),
        ("pg_advisory_lock", "integer", "void", "PERFORM pg_catalog.pg_advisory_lock(CAST($1 AS bigint));"),
        ("pg_advisory_unlock", "integer", "boolean", "RETURN pg_catalog.pg_advisory_unlock(CAST($1 AS bigint));"),
        ("left", "varchar, integer", "text", "RETURN pg_catalog.left(CAST($1 AS text), $2);"),
        ("to_char", "timestamp, varchar", "text", "RETURN pg_catalog.to_char($1, CAST($2 AS text));"),
        ("json_array_elements_text", "text", "SETOF text",
         "RETURN QUERY SELECT * FROM pg_catalog.json_array_elements_text(CAST($1 AS json));"),
    ]
    cursor = as_operator.cursor()
    for function, arguments, returns, body in overloads:
        cursor.execute(f"CREATE FUNCTION public.{function}({arguments}) RETURNS {returns} LANGUAGE plpgsql AS "
                       f"$f$BEGIN {_trap(name, 'public.' + function)} {body} END$f$")
    cursor.execute("CREATE FUNCTION public.cat(text, integer) RETURNS text LANGUAGE plpgsql AS "
                   f"$f$BEGIN {_trap(name, 'public.||')} RETURN $1 OPERATOR(pg_catalog.||) CAST($2 AS text); END$f$; "
                   "CREATE OPERATOR public.|| (LEFTARG = text, RIGHTARG = integer, FUNCTION = public.cat)")
    try:
        call(as_operator, "add_scheduled_job", name="planted", sql="INSERT INTO owned_work SELECT current_user, 'job'",
             schedule="0 0 4 * * *", max_attempts=1)
        agent.tick(agent.clock())
        (started,) = call(as_operator, "start_job", job_name="planted")
        task = _owned_job(as_operator, agent, "INSERT INTO owned_work SELECT current_user, 'task'")
        work(agent, concurrency=1)
        agent.tick(agent.clock())
        pause_job(agent.store(), "planted", now=agent.clock(), reason="attack")
        assert task["status"] == "succeeded", task
        assert _run(agent, started["run_id"])["status"] == "succeeded"
        _gained_nothing(agent, name)
        # The jobs themselves still see public (the database's default search_path), as before.
        assert {"job", "task"} <= {login for (login,) in query(agent, f"SELECT login FROM owned_work WHERE who = '{name}'")}
    finally:
        execute(agent, "DROP OPERATOR IF EXISTS public.|| (text, integer); DROP FUNCTION IF EXISTS public.cat(text, integer); "
                + " ".join(f"DROP FUNCTION IF EXISTS public.{f}({a});" for f, a, _, _ in overloads))


def test_an_unowned_job_relying_on_the_default_search_path_still_finds_public(operator):  # noqa: F811
    """The pin is the agent's, not the jobs': a job of the app (no owner) and an owned job both
    create and use unqualified tables of public, as they did before it."""
    name, as_operator, agent = operator
    table = f"plain_{uuid.uuid4().hex[:8]}"
    run = _owned_job(as_operator, agent, f"CREATE TABLE {table} (x int); INSERT INTO {table} VALUES (1); "
                                         f"INSERT INTO owned_work SELECT current_user, current_setting('search_path')")
    assert run["status"] == "succeeded", run
    assert query(agent, f"SELECT COUNT(*) FROM public.{table}") == [(1,)]
    ((path,),) = query(agent, f"SELECT login FROM owned_work WHERE who = '{name}'")
    assert "public" in path and "pg_catalog, pg_temp" != path
    store = agent.store()
    with store.transaction():
        output = store.run_script(f"INSERT INTO {table} SELECT x + 1 FROM {table}; SELECT 1")
    assert query(agent, f"SELECT COUNT(*) FROM public.{table}") == [(2,)], output
    execute(agent, f"DROP TABLE public.{table}")


# --- a database the operator owns -----------------------------------------------------------------

@contextlib.contextmanager
def _operators_database(name: str):
    """A database OWNED by the operator (its own application's database, a job's @database or a
    fleet target): its owner may ALTER DATABASE ... SET any setting a user may set."""
    import pyodbc

    database = "oa" + uuid.uuid4().hex[:8]
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE DATABASE {database} OWNER "{name}"')
    try:
        target = pyodbc.connect(PG_BASE.replace("Uid=root;", f"Uid={name};") + f"Database={database};",
                                autocommit=True, timeout=5)
        try:
            yield database, target.cursor()
        finally:
            target.close()
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_a_database_setting_of_the_operators_never_resolves_the_agents_names(operator):  # noqa: F811
    """ESCAPED before the fix: the operator's own database, the @database of its task, has
    ``search_path = evil, pg_catalog``; evil has txid_current(), set_config(), DOMAINs named
    text and varchar whose CHECK calls the trap, and a view named pg_type. The agent's own
    statements in that database (before and after the job's function) ran them as its login."""
    name, as_operator, agent = operator
    with _operators_database(name) as (database, target):
        target.execute("CREATE SCHEMA evil; CREATE TABLE public.owned_work (who text, login text); "
                       "GRANT INSERT, SELECT ON public.owned_work TO PUBLIC; GRANT USAGE ON SCHEMA evil TO PUBLIC")
        trap = _trap(name, "evil")
        target.execute(
            f"CREATE FUNCTION evil.mark() RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, public AS "
            f"$f$BEGIN {trap} RETURN true; END$f$; "
            "CREATE FUNCTION evil.txid_current() RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog AS "
            "$f$BEGIN PERFORM evil.mark(); RETURN pg_catalog.txid_current(); END$f$; "
            "CREATE FUNCTION evil.set_config(pg_catalog.text, pg_catalog.text, boolean) RETURNS pg_catalog.text "
            "LANGUAGE plpgsql SET search_path = pg_catalog AS "
            "$f$BEGIN PERFORM evil.mark(); RETURN pg_catalog.set_config($1, $2, $3); END$f$; "
            "CREATE FUNCTION evil.pg_backend_pid() RETURNS integer LANGUAGE plpgsql SET search_path = pg_catalog AS "
            "$f$BEGIN PERFORM evil.mark(); RETURN pg_catalog.pg_backend_pid(); END$f$; "
            "CREATE DOMAIN evil.text AS pg_catalog.text CHECK (evil.mark()); "
            "CREATE DOMAIN evil.varchar AS pg_catalog.varchar CHECK (evil.mark()); "
            "CREATE VIEW evil.pg_type AS SELECT t.oid, t.typbasetype, t.typname FROM pg_catalog.pg_type AS t "
            "WHERE evil.mark()")
        target.execute(f"ALTER DATABASE {database} SET search_path = evil, pg_catalog, public")
        run = _owned_job(as_operator, agent, "INSERT INTO public.owned_work SELECT current_user, 'job'",
                         database=database)
        assert run["status"] == "succeeded", run
        login = _agent_login(agent)
        rows = target.execute("SELECT who, login FROM public.owned_work").fetchall()
        assert [tuple(r) for r in rows if r[0] == login] == [], rows
        assert ("%s" % name, "job") in [tuple(r) for r in rows]
        _gained_nothing(agent, name)


def test_a_role_the_operators_database_sets_is_never_the_agents(operator):  # noqa: F811
    """``ALTER DATABASE ... SET role`` makes every session there that may take the role start
    as it: the agent's statements there became the operator's (or another operator's, whose
    role the agent's login is a member of too), and its function for the job could no longer be
    given to the job's owner. BLOCKED by the same pin (role = none at connection)."""
    name, as_operator, agent = operator
    with _operators_database(name) as (database, target):
        target.execute("CREATE TABLE public.seen (who text, login text); GRANT INSERT ON public.seen TO PUBLIC")
        target.execute(f"ALTER DATABASE {database} SET role = '{name}'")
        run = _owned_job(as_operator, agent, "INSERT INTO public.seen SELECT current_user, session_user",
                         database=database)
        assert run["status"] == "succeeded", run
        assert [tuple(r) for r in target.execute("SELECT who, login FROM public.seen").fetchall()] == \
            [(name, _agent_login(agent))]


# --- what a job leaves behind, beyond deferred triggers -------------------------------------------

def test_a_cursor_with_hold_calling_a_function_never_runs_as_the_agent(operator):  # noqa: F811
    """BLOCKED (CLOSE ALL in the owner's function): a held cursor in the control database whose
    query calls the trap would run at COMMIT as the session's user."""
    name, as_operator, agent = operator
    fn = f"held_{uuid.uuid4().hex[:8]}"
    run = _owned_job(as_operator, agent,
                     f"CREATE FUNCTION public.{fn}() RETURNS int LANGUAGE plpgsql AS $f$BEGIN {_trap(name, 'cursor')} "
                     "RETURN 1; END$f$; "
                     f"DO $d$BEGIN EXECUTE 'DECLARE held CURSOR WITH HOLD FOR SELECT public.{fn}() FROM "
                     "pg_catalog.generate_series(1, 3)'; END$d$")
    assert run["status"] == "succeeded", run
    _gained_nothing(agent, name)


def test_on_commit_actions_of_temporary_tables_run_nothing_as_the_agent(operator):  # noqa: F811
    """BLOCKED (by the server): ON COMMIT DELETE ROWS truncates without firing the table's
    triggers, ON COMMIT DROP drops without any; the traps on DELETE, TRUNCATE and a deferred
    trigger of those tables never run as the agent."""
    name, as_operator, agent = operator
    fn = f"oncommit_{uuid.uuid4().hex[:8]}"
    sql = (f"CREATE FUNCTION public.{fn}() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN {_trap(name, 'on commit')} "
           "RETURN NULL; END$f$; "
           "CREATE TEMP TABLE gone (x int) ON COMMIT DROP; "
           "CREATE TEMP TABLE emptied (x int) ON COMMIT DELETE ROWS; "
           f"CREATE TRIGGER t1 AFTER TRUNCATE ON emptied FOR EACH STATEMENT EXECUTE FUNCTION public.{fn}(); "
           f"CREATE TRIGGER t2 AFTER DELETE ON emptied FOR EACH ROW EXECUTE FUNCTION public.{fn}(); "
           f"CREATE TRIGGER t3 AFTER DELETE ON gone FOR EACH ROW EXECUTE FUNCTION public.{fn}(); "
           f"CREATE TRIGGER t4 AFTER TRUNCATE ON gone FOR EACH STATEMENT EXECUTE FUNCTION public.{fn}(); "
           "INSERT INTO gone VALUES (1); INSERT INTO emptied VALUES (1)")
    run = _owned_job(as_operator, agent, sql)
    assert run["status"] == "succeeded", run
    _gained_nothing(agent, name)


def test_session_settings_a_job_leaves_change_nothing_the_agent_does(operator):  # noqa: F811
    """BLOCKED (connection closed; RESET ALL; the pin): settings left for the session that a
    later statement of the agent's would read: search_path, role-like custom settings, the
    parameters' namespace (agent.param.*), time zone and date style, read-only transactions,
    1 ms timeouts. The next runs succeed."""
    name, as_operator, agent = operator
    leave = ("SELECT set_config('agent.param.x', 'hijacked', false); "
             "SET TimeZone = 'Pacific/Kiritimati'; SET DateStyle = 'SQL, DMY'; SET IntervalStyle = 'sql_standard'; "
             "SET search_path = public; SET default_transaction_read_only = on; SET lock_timeout = 1")
    first = _owned_job(as_operator, agent, leave)
    # Timeouts that end the job's own transaction harm only its own run (it may fail, and is
    # retried as any failure): the next run's session is a new one.
    _owned_job(as_operator, agent, "SET statement_timeout = 1; SET idle_in_transaction_session_timeout = 1")
    second = _owned_job(as_operator, agent,
                        "INSERT INTO owned_work SELECT current_user, coalesce(current_setting('agent.param.x', true), '-')")
    assert first["status"] == "succeeded", first
    assert second["status"] == "succeeded", second
    assert query(agent, f"SELECT login FROM owned_work WHERE who = '{name}'") == [("-",)]
    _gained_nothing(agent, name)


def test_role_and_session_authorization_changes_are_refused(operator):  # noqa: F811
    """BLOCKED (the server's rule inside a security-definer function): SET ROLE to the agent's
    login, SET SESSION AUTHORIZATION, set_config('role'), also inside a DO block; each run fails
    and keeps nothing."""
    name, as_operator, agent = operator
    login = _agent_login(agent)
    attempts = [f'SET ROLE "{login}"', f'SET SESSION AUTHORIZATION "{login}"', "RESET ROLE",
                f"SELECT set_config('role', '{login}', false)", "SELECT set_config('session_authorization', 'root', true)",
                f"DO $d$BEGIN EXECUTE 'SET ROLE \"{login}\"'; END$d$"]
    for attempt in attempts:
        run = _owned_job(as_operator, agent, f"{attempt}; INSERT INTO owned_work SELECT current_user, 'after'")
        assert run["status"] == "failed", (attempt, run)
    _gained_nothing(agent, name)
    assert query(agent, "SELECT COUNT(*) FROM owned_work") == [(0,)]


def test_locks_and_listeners_a_job_leaves_do_not_hold_the_agent(operator):  # noqa: F811
    """BLOCKED (connection closed): session advisory locks on every key the agent itself locks
    (the migration lock, the tick's and the fleet's), a LISTEN, a prepared statement whose plan
    calls the trap: the next tick and run go through, and nothing ran as the agent."""
    name, as_operator, agent = operator
    fn = f"prep_{uuid.uuid4().hex[:8]}"
    keys = (7428001, 7428014, 7428015)
    leave = (" ".join(f"SELECT pg_advisory_lock({k}); SELECT pg_advisory_lock_shared({k});" for k in keys)
             + f" CREATE FUNCTION public.{fn}() RETURNS int LANGUAGE plpgsql AS $f$BEGIN {_trap(name, 'prepared')} "
             f"RETURN 1; END$f$; PREPARE left_behind AS SELECT public.{fn}(); LISTEN agent; NOTIFY agent, 'x'")
    first = _owned_job(as_operator, agent, leave)
    assert first["status"] == "succeeded", first
    agent.tick(agent.clock())
    second = _owned_job(as_operator, agent, "INSERT INTO owned_work SELECT current_user, 'after'")
    assert second["status"] == "succeeded", second
    held = query(agent, "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                        "(SELECT oid FROM pg_database WHERE datname = current_database()) AND objid IN "
                        f"({', '.join(map(str, keys))})")
    assert held == [(0,)]
    _gained_nothing(agent, name)


@pytest.mark.parametrize("statement", [
    "CREATE RULE hijack AS ON INSERT TO agent.audit DO ALSO SELECT 1",
    "CREATE FUNCTION public.t() RETURNS trigger LANGUAGE plpgsql AS $f$BEGIN RETURN NEW; END$f$; "
    "CREATE TRIGGER hijack BEFORE UPDATE ON agent.runs FOR EACH ROW EXECUTE FUNCTION public.t()",
    "ALTER TABLE agent.runs ALTER COLUMN note SET DEFAULT 'x'",
    "UPDATE agent.runs SET owner = 'root'",
    "UPDATE agent.jobs SET owner = 'root'",
    "INSERT INTO agent.owned_sessions SELECT pg_backend_pid(), txid_current(), 'root'",
    "CREATE EVENT TRIGGER hijack ON ddl_command_end EXECUTE FUNCTION pg_catalog.now()",
    "SELECT lo_import('/etc/hostname')",
    "CREATE EXTENSION IF NOT EXISTS dblink",
    "SELECT agent.exec_async_unaudited('SELECT 1')",
], ids=["rule", "trigger", "default", "own_run_owner", "own_job_owner", "owned_sessions", "event_trigger",
        "large_object_import", "dblink", "unaudited_body"])
def test_objects_and_rows_of_the_agents_are_out_of_a_jobs_reach(operator, statement):  # noqa: F811
    """BLOCKED (rights): rules, triggers and defaults on the agent's tables, the owner columns of
    its own run and job, the session mark, event triggers (superuser only), server-side large
    object import, an untrusted extension (dblink, postgres_fdw need a superuser to create, and
    refuse a password-less connection for anyone else), the procedures' unaudited bodies."""
    name, as_operator, agent = operator
    run = _owned_job(as_operator, agent, statement)
    assert run["status"] == "failed", run
    assert "permission denied" in run["last_error"] or "must be" in run["last_error"] \
        or "does not exist" in run["last_error"], run
    _gained_nothing(agent, name)
    assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE owner = 'root'") == [(0,)]


def test_a_security_definer_function_of_the_operators_runs_as_the_operator(operator):  # noqa: F811
    """BLOCKED (nothing of the agent's calls it): a SECURITY DEFINER function the operator owns
    runs as the operator whoever calls it; one the job defines to run later (a deferred trigger's,
    a held cursor's) runs inside the owner's function. Here the job calls it and queues work
    through agent.exec_async from inside it: the work is the operator's."""
    name, as_operator, agent = operator
    fn = f"definer_{uuid.uuid4().hex[:8]}"
    cursor = as_operator.cursor()
    cursor.execute(f"CREATE FUNCTION public.{fn}() RETURNS void LANGUAGE plpgsql SECURITY DEFINER AS "
                   f"$f$BEGIN {_trap(name, 'definer')} PERFORM * FROM agent.exec_async("
                   "'INSERT INTO public.owned_work SELECT current_user, ''queued''', NULL); END$f$")
    run = _owned_job(as_operator, agent, f"SELECT public.{fn}()")
    assert run["status"] == "succeeded", run
    work(agent, concurrency=1)
    assert query(agent, f"SELECT owner FROM agent.runs WHERE command LIKE '%''queued''%' AND run_id <> {run['run_id']}") \
        == [(name,)]
    assert sorted(query(agent, "SELECT who, login FROM owned_work")) == [(name, "definer"), (name, "queued")]
    _gained_nothing(agent, name)


def test_a_job_cannot_queue_work_as_someone_else(operator):  # noqa: F811
    """BLOCKED (agent.calling_principal): whatever the job sets (the parameter namespace, a
    temporary agent.owned_sessions in pg_temp, application_name), work it queues is its owner's."""
    name, as_operator, agent = operator
    sql = ("SELECT set_config('agent.calling_principal', 'root', false); SET application_name = 'root'; "
           "CREATE TEMP TABLE owned_sessions (backend_pid int, transaction_id bigint, owner varchar(256)); "
           "INSERT INTO owned_sessions SELECT pg_backend_pid(), txid_current(), 'root'; "
           "SET search_path = pg_temp, agent, pg_catalog; "
           "SELECT * FROM agent.exec_async('INSERT INTO public.owned_work SELECT current_user, ''queued''', NULL)")
    run = _owned_job(as_operator, agent, sql)
    assert run["status"] == "succeeded", run
    work(agent, concurrency=1)
    assert query(agent, "SELECT who, login FROM owned_work") == [(name, "queued")]
    with pytest.raises(CallError):
        call(as_operator, "exec_async_unaudited", sql="SELECT 1", execution_order=None)
    _gained_nothing(agent, name)


def test_every_function_an_operator_may_call_resolves_names_in_pg_catalog_first_and_pg_temp_last(operator):  # noqa: F811
    """BLOCKED (migrations): every SECURITY DEFINER function of schema agent (they run with the
    agent's login's rights, called by operators) pins search_path to pg_catalog, pg_temp: a caller's
    temporary table or view can never stand in for a name the function resolves (pg_temp is
    searched FIRST for tables when it is not named), nor a function of public for one it calls."""
    _, _, agent = operator
    assert query(agent, "SELECT p.oid::regprocedure::text FROM pg_proc AS p WHERE p.pronamespace = 'agent'::regnamespace "
                        "AND p.prosecdef AND NOT COALESCE('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)") == []
    assert query(agent, "SELECT COUNT(*) FROM pg_proc WHERE pronamespace = 'agent'::regnamespace AND prosecdef")[0][0] >= 10


def test_dblink_an_admin_installed_never_connects_as_the_agent(operator):  # noqa: F811
    """BLOCKED (dblink's own rule): with dblink installed by an admin in the control database, a
    job's connection back to the server as the agent's login (trust authentication here, so no
    password would be asked) is refused: a non-superuser's dblink must authenticate with a password."""
    name, as_operator, agent = operator
    from tests.support.harness import admin_execute

    admin_execute(agent.target.location, "CREATE EXTENSION IF NOT EXISTS dblink")
    login = _agent_login(agent)
    run = _owned_job(as_operator, agent,
                     "SELECT * FROM dblink('host=127.0.0.1 port=5432 dbname=' || current_database() || "
                     f"' user={login}', 'ALTER ROLE \"{name}\" CREATEROLE') AS t(x text)")
    assert run["status"] == "failed", run
    assert "password is required" in run["last_error"] or "permission denied" in run["last_error"], run
    _gained_nothing(agent, name)
