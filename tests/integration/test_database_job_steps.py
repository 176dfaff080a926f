"""Steps for the jobs defined in the database (issue 32 item 6; SQL Server Agent's sp_add_jobstep):
agent.set_job_steps @job_name, @steps (migration 0028) records a database job's steps as a JSON
array; the engine's planning checks them with the rules of JOB__<name>__STEPS__<n>__* and writes
agent.jobs.steps exactly as the settings sync writes the same steps, so the executor runs them
unchanged; a bad @steps makes that job alone invalid in words naming the parameter, the step and
the field. Only the job's owner (a member of the owner's role, a superuser) may set its steps. The
monitor's job form has a "Steps (JSON)" field, saved in the define's transaction (one audit row).

On PostgreSQL (the procedures' stand-in for SQL Server here); the T-SQL procedures are parsed."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timezone

import pytest

from tests.support.harness import execute, make_agent, pg_admin_connection, query, work
from tests.support.tsql_caller import CallError, call, connect

UTC = timezone.utc
PROCEDURE = "agent.set_job_steps @steps"


def mark(label: str) -> str:
    return f"INSERT INTO public.step_marks (label) VALUES ('{label}')"


FAILS = "SELECT * FROM public.no_such_table"


@pytest.fixture
def system(pg_url):
    agent = make_agent(pg_url)
    execute(agent, "CREATE TABLE public.step_marks (id SERIAL PRIMARY KEY, label VARCHAR(20))")
    connection = connect(pg_url)
    try:
        yield agent, connection, pg_url
    finally:
        connection.close()
        agent.close()


def job(agent, name: str) -> dict:
    return agent.store().execute("get_job_definition", job_name=name).one()


def job_steps(agent, name: str) -> str | None:
    return dict(query(agent, "SELECT job_name, steps FROM agent.jobs"))[name]


def marks(agent) -> list[str]:
    return [label for (label,) in query(agent, "SELECT label FROM public.step_marks ORDER BY id")]


def test_three_steps_set_from_tsql_run_with_their_flow(system):
    """Step 1 succeeds and goes to step 3, which fails and goes to step 2, which quits with
    success: the run follows the flow, each step attempt its own row; step 3's failure is the
    run's history, and the run succeeded."""
    agent, connection, _ = system
    assert call(connection, "add_scheduled_job", name="three", sql="SELECT 'not run: the steps are'") == [
        {"job_name": "three", "action": "defined"}]
    steps = [{"sql": mark("one"), "on_success": "goto:3"},
             {"sql": mark("two"), "on_success": "quit_success"},
             {"sql": FAILS, "max_attempts": 1, "on_failure": "goto:2"}]
    (row,) = call(connection, "set_job_steps", job_name="three", steps=json.dumps(steps))
    assert row == {"job": "three", "requested_steps": json.dumps(steps)}
    assert job(agent, "three")["requested_steps"] == json.dumps(steps)
    agent.tick(datetime.now(UTC))
    defined = job(agent, "three")
    assert defined["valid"] == 1 and defined["config_error"] is None
    planned = json.loads(job_steps(agent, "three"))
    assert [(s["step"], s["on_success"], s["on_failure"], s["max_attempts"]) for s in planned] == [
        (1, "goto:3", "quit_failure", 3), (2, "quit_success", "quit_failure", 3), (3, "quit_success", "goto:2", 1)]
    (started,) = call(connection, "start_job", job_name="three")
    assert started["status"] == "pending"
    work(agent, concurrency=1, max_seconds=60)
    run = agent.store().execute("get_run", run_id=started["run_id"]).one()
    assert run["status"] == "succeeded", run
    assert marks(agent) == ["one", "two"]
    attempts = agent.store().execute("list_attempts", run_ids=[started["run_id"]]).rows
    assert [(a["step"], a["outcome"]) for a in attempts] == [(1, "succeeded"), (3, "failed"), (2, "succeeded")]
    assert "no_such_table" in attempts[1]["error_message"]


def test_a_job_defined_both_ways_has_the_same_steps_json(system):
    """The same steps in the app settings and through agent.set_job_steps (with the job's own
    max attempts, timeout and database as the steps' defaults, a fleet step, a retry interval):
    agent.jobs.steps is the same text, so the executor runs them the same way."""
    agent, connection, url = system
    settings = {"MAX_ATTEMPTS": "2", "TIMEOUT_SECONDS": "600", "DATABASE": "reports",
                "STEPS__1__COMMAND": "EXEC load", "STEPS__1__RETRY_INTERVAL_SECONDS": "30",
                "STEPS__1__ON_FAILURE": "goto:3",
                "STEPS__2__COMMAND": "EXEC fan_out", "STEPS__2__TARGETS": "db:tenant_*, -db:tenant_9",
                "STEPS__2__TARGET_PARALLELISM": "3", "STEPS__2__TARGET_STAGGER_SECONDS": "5",
                "STEPS__2__ON_SUCCESS": "quit_success",
                "STEPS__3__COMMAND": "EXEC report", "STEPS__3__DATABASE": "audit", "STEPS__3__MAX_ATTEMPTS": "1",
                "STEPS__3__TIMEOUT_SECONDS": "60", "STEPS__3__ON_SUCCESS": "quit_failure"}
    agent.close()
    agent = make_agent(url, {"from_settings": settings})
    try:
        call(connection, "add_scheduled_job", name="from_tsql", sql="EXEC load", max_attempts=2, timeout_seconds=600,
             database="reports")
        call(connection, "set_job_steps", job_name="from_tsql", steps=json.dumps([
            {"sql": "EXEC load", "retry_interval_seconds": 30, "on_failure": "goto:3"},
            {"sql": "EXEC fan_out", "targets": "db:tenant_*, -db:tenant_9", "target_parallelism": "3",
             "target_stagger_seconds": 5, "on_success": "quit_success"},
            {"sql": "EXEC report", "database": "audit", "max_attempts": 1, "timeout_seconds": 60,
             "on_success": "quit_failure", "on_failure": None}]))
        agent.tick(datetime.now(UTC))
        assert job(agent, "from_tsql")["valid"] == 1, job(agent, "from_tsql")["config_error"]
        assert job(agent, "from_settings")["valid"] == 1, job(agent, "from_settings")["config_error"]
        both = job_steps(agent, "from_tsql")
        assert both is not None and both == job_steps(agent, "from_settings")
        assert [s["database"] for s in json.loads(both)] == ["reports", None, "audit"]

        # A redefinition keeps the steps (as it keeps calendars and parameters)...
        call(connection, "add_scheduled_job", name="from_tsql", sql="EXEC load", max_attempts=2,
             timeout_seconds=600, database="reports", schedule="0 0 3 * * *")
        agent.tick(datetime.now(UTC))
        assert job_steps(agent, "from_tsql") == both and job(agent, "from_tsql")["requested_steps"] is not None
        # ... with the job's new defaults: a step without max_attempts takes the job's.
        call(connection, "add_scheduled_job", name="from_tsql", sql="EXEC load", max_attempts=5,
             timeout_seconds=600, database="reports", schedule="0 0 3 * * *")
        agent.tick(datetime.now(UTC))
        assert [s["max_attempts"] for s in json.loads(job_steps(agent, "from_tsql"))] == [5, 5, 1]
        # NULL or [] clears them: a one-step job again, running its @sql.
        for cleared in ("[ ]", None):
            call(connection, "set_job_steps", job_name="from_tsql", steps=json.dumps([{"sql": "SELECT 1"}]))
            agent.tick(datetime.now(UTC))
            assert job_steps(agent, "from_tsql") is not None
            (row,) = call(connection, "set_job_steps", job_name="from_tsql", steps=cleared)
            assert row["requested_steps"] is None
            agent.tick(datetime.now(UTC))
            assert job_steps(agent, "from_tsql") is None and job(agent, "from_tsql")["valid"] == 1
    finally:
        agent.close()


BAD_STEPS = {
    "not_json": ("[{sql: 1}", f"{PROCEDURE}='[{{sql: 1}}': expected a JSON array of steps"),
    "not_array": ('{"sql": "SELECT 1"}', f"{PROCEDURE}='{{\"sql\": \"SELECT 1\"}}': expected a JSON array of steps "
                                          "(found a JSON object)"),
    "not_object": ('["SELECT 1"]', f"{PROCEDURE} step 1='\"SELECT 1\"': expected a JSON object"),
    "unknown_field": ('[{"sql": "SELECT 1"}, {"sql": "SELECT 2", "on_error": "goto:1"}]',
                      f"{PROCEDURE} step 2: unknown field 'on_error'; expected one of sql, database, on_success"),
    "bad_goto": ('[{"sql": "SELECT 1", "on_success": "goto:7"}, {"sql": "SELECT 2"}]',
                 f"{PROCEDURE} step 1 on_success='goto:7': expected a goto to an existing step (this job has steps 1 "
                 "to 2; there is no step 7)"),
    "bad_action": ('[{"sql": "SELECT 1", "on_failure": "retry"}]',
                   f"{PROCEDURE} step 1 on_failure='retry': expected next or quit_success or quit_failure or goto:<n>"),
    "no_sql": ('[{"sql": "SELECT 1"}, {"database": "x"}]', f"{PROCEDURE} step 2 sql='': expected the SQL this step runs"),
    "bad_number": ('[{"sql": "SELECT 1", "max_attempts": 0}]',
                   f"{PROCEDURE} step 1 max_attempts='0': expected a whole number from 1 to 100"),
    "not_a_number": ('[{"sql": "SELECT 1", "timeout_seconds": [60]}]',
                     f"{PROCEDURE} step 1 timeout_seconds='[60]': expected a JSON string or whole number"),
    "too_many": (json.dumps([{"sql": "SELECT 1"}] * 101), "expected at most 100 steps (found 101)"),
    "loop": ('[{"sql": "SELECT 1", "on_success": "goto:2", "on_failure": "goto:2"}, '
             '{"sql": "SELECT 2", "on_success": "goto:1", "on_failure": "goto:1"}]',
             f"{PROCEDURE} step <n> on_success/on_failure: a loop that can never end: from step(s) 1, 2"),
    "bad_targets": ('[{"sql": "SELECT 1", "targets": "tenant_1"}]', f"{PROCEDURE} step 1 targets='tenant_1': expected"),
    "pool_targets": ('[{"sql": "SELECT 1", "targets": "pool:srv/pool1"}]',
                     "elastic pools exist only on Azure SQL Database"),
}


def test_bad_steps_make_that_job_alone_invalid_in_words_naming_the_parameter(system):
    agent, connection, _ = system
    for name, (steps, _) in BAD_STEPS.items():
        call(connection, "add_scheduled_job", name=name, sql="SELECT 1", schedule="0 0 3 * * *")
        call(connection, "set_job_steps", job_name=name, steps=steps)
    # Steps and job-level @targets: refused as JOB__<name>__TARGETS with steps is.
    call(connection, "add_scheduled_job", name="with_targets", sql="SELECT 1", targets="db:tenant_*")
    call(connection, "set_job_steps", job_name="with_targets", steps='[{"sql": "SELECT 1"}]')
    call(connection, "add_scheduled_job", name="good", sql="SELECT 1", schedule="0 0 3 * * *")
    call(connection, "set_job_steps", job_name="good", steps=f'[{{"sql": "{mark("good")}"}}, {{"sql": "SELECT 2"}}]')
    agent.tick(datetime.now(UTC))
    for name, (_, words) in BAD_STEPS.items():
        bad = job(agent, name)
        assert bad["valid"] == 0 and words in bad["config_error"], (name, bad["config_error"])
        assert job_steps(agent, name) is None
    targets = job(agent, "with_targets")
    assert targets["valid"] == 0 and targets["config_error"] == (
        "agent.add_scheduled_job @targets='db:tenant_*': expected NULL for a job with steps (agent.set_job_steps "
        "@steps): each step gives its own targets (a step without them runs in one database)")
    assert job(agent, "good")["valid"] == 1 and len(json.loads(job_steps(agent, "good"))) == 2
    events = query(agent, "SELECT job_name, detail FROM agent.job_events WHERE kind = 'config_invalid'")
    assert {n for n, _ in events} == set(BAD_STEPS) | {"with_targets"}
    # Fixed: valid again, the others untouched.
    call(connection, "set_job_steps", job_name="bad_goto", steps='[{"sql": "SELECT 1", "on_success": "goto:2"}, '
                                                                 '{"sql": "SELECT 2"}]')
    agent.tick(datetime.now(UTC))
    assert job(agent, "bad_goto")["valid"] == 1 and job(agent, "loop")["valid"] == 0
    (started,) = call(connection, "start_job", job_name="good")
    work(agent, concurrency=1, max_seconds=60)
    assert agent.store().execute("get_run", run_id=started["run_id"]).one()["status"] == "succeeded"
    assert marks(agent) == ["good"]


def test_the_procedure_refuses_what_is_not_a_database_job_and_steps_too_long(system):
    agent, connection, _ = system
    agent.close()
    settings_agent = make_agent(system[2], {"in_settings": {"COMMAND": "SELECT 1"}})
    try:
        for name in ("in_settings", "ghost", None):
            with pytest.raises(CallError) as caught:
                call(connection, "set_job_steps", job_name=name, steps='[{"sql": "SELECT 1"}]')
            assert caught.value.code == "P0002"
            assert caught.value.message.startswith(f"agent.set_job_steps: @job_name = {repr(name) if name else 'NULL'}: "
                                                   "expected the name of a job defined by agent.add_scheduled_job "
                                                   "(a job of the settings takes JOB__<name>__STEPS__<n>__*)")
        call(connection, "add_scheduled_job", name="long", sql="SELECT 1")
        with pytest.raises(CallError) as caught:
            call(connection, "set_job_steps", job_name="long", steps="[" + " " * 1000000 + "]")
        assert caught.value.code == "22023" and "expected a JSON array of steps of at most 1000000 characters" in \
            caught.value.message
    finally:
        settings_agent.close()


def _audit(agent) -> list[dict]:
    rows = agent.store().execute("list_audit", job_name=None, since=None, limit=1000).rows
    return [{**row, "arguments": json.loads(row["arguments"]) if isinstance(row["arguments"], str) else row["arguments"]}
            for row in rows]


def test_only_the_owner_a_member_of_its_role_or_a_superuser_sets_a_jobs_steps(pg_url):
    import pyodbc

    agent = make_agent(pg_url)
    admin = pg_admin_connection()
    names = {key: f"op_{key}_{uuid.uuid4().hex[:8]}" for key in "abc"}
    connections = {}
    try:
        for name in names.values():
            admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
            execute(agent, f'GRANT agent_operator TO "{name}"')
        admin.cursor().execute(f'GRANT "{names["a"]}" TO "{names["c"]}"')
        connections = {key: pyodbc.connect(pg_url.replace("Uid=root;", f"Uid={name};"), autocommit=True, timeout=10)
                       for key, name in names.items()}
        a, b, c = (connections[k] for k in "abc")
        call(a, "add_scheduled_job", name="owned", sql="SELECT 1")
        assert job(agent, "owned")["owner"] == names["a"]
        before = len(_audit(agent))
        with pytest.raises(CallError) as caught:
            call(b, "set_job_steps", job_name="owned", steps='[{"sql": "DROP TABLE public.secrets"}]')
        assert caught.value.code == "42501"
        assert caught.value.message.startswith(
            f"agent.set_job_steps: @job_name = 'owned': expected a job you own; this job runs as '{names['a']}' and "
            "its steps would run as it: only its owner, a member of its owner's role or a superuser may set them")
        assert job(agent, "owned")["requested_steps"] is None
        # A refused call leaves no row on PostgreSQL (its transaction rolls back; SQL Server's
        # wrapper records it 'refused' after the rollback: parsed below).
        assert len(_audit(agent)) == before
        # The owner, a member of the owner's role, and a superuser (the agent's root here) may.
        for key, connection in (("a", a), ("c", c)):
            (row,) = call(connection, "set_job_steps", job_name="owned", steps=f'[{{"sql": "SELECT \'{key}\'"}}]')
            assert row["requested_steps"] == f'[{{"sql": "SELECT \'{key}\'"}}]'
            latest = _audit(agent)[0]
            assert (latest["action"], latest["outcome"], latest["source"], latest["principal"], latest["job_name"]) == (
                "set-steps", "done", "tsql", names[key], "owned")
            assert latest["arguments"] == {"job_name": "owned", "steps": f'[{{"sql": "SELECT \'{key}\'"}}]'}
        root = connect(pg_url)
        try:
            call(root, "set_job_steps", job_name="owned", steps=None)
        finally:
            root.close()
        assert len(_audit(agent)) == before + 3
        # Anyone may redefine the job: it then runs as them, and so may they set its steps.
        call(b, "add_scheduled_job", name="owned", sql="SELECT 1")
        assert job(agent, "owned")["owner"] == names["b"]
        call(b, "set_job_steps", job_name="owned", steps='[{"sql": "SELECT 1"}]')
        with pytest.raises(CallError):
            call(a, "set_job_steps", job_name="owned", steps='[{"sql": "SELECT 2"}]')
        # The body is the agent's own: an operator cannot call it.
        with pytest.raises(pyodbc.Error) as refused:
            b.cursor().execute("SELECT * FROM agent.set_job_steps_unaudited('owned', NULL)")
        assert "42501" in str(refused.value)
    finally:
        for connection in connections.values():
            connection.close()
        agent.close()
        for name in names.values():
            with_admin = admin.cursor()
            with_admin.execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


def test_the_tsql_procedures_parse_check_the_owner_first_and_audit_both_outcomes():
    """SQL Server is not available here: the modules of 0028 parse with sqlfluff; the wrapper
    checks the owner before the body, passes every parameter on, audits 'set-steps' done and
    refused, and rethrows."""
    from sqlfluff.core import FluffConfig, Linter

    from shared.control.queries import load_migrations, split_statements

    (migration,) = [m for m in load_migrations("mssql") if m.version == 28]
    modules = [s for s in split_statements(migration.path.read_text(encoding="utf-8"), tsql=True)
               if re.search(r"^CREATE PROCEDURE agent\.", s, re.M)]
    assert len(modules) == 2
    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql", "large_file_skip_byte_limit": 0}))
    for module in modules:
        parsed = linter.parse_string(module)
        assert not parsed.violations and "unparsable" not in parsed.tree.stringify(), module[:200]
    body, wrapper = modules
    assert "CREATE PROCEDURE agent.set_job_steps_unaudited" in body and "needs_planning = 1" in body
    owner_check = wrapper.index("THROW 51403")
    assert owner_check < wrapper.index("EXEC agent.set_job_steps_unaudited @job_name = @job_name, @steps = @steps;")
    assert wrapper.count("EXEC agent.audit_procedure_call") == 2 and "@outcome = N'refused'" in wrapper
    assert "N'set-steps'" in wrapper and wrapper.rstrip().endswith("THROW;\n    END CATCH;\nEND")
    postgres = [m for m in load_migrations("postgres") if m.version == 28][0].path.read_text(encoding="utf-8")
    assert postgres.count("SECURITY DEFINER SET search_path = pg_catalog, pg_temp") == 2


# ---------------------------------------------------------------- the monitor's job form

from tests.integration.test_monitor import scenario  # noqa: E402,F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import Client, audit_rows, servers  # noqa: E402,F401
from tests.integration.test_monitor_jobform import NIGHTLY, define_fields, is_sqlite, job_row  # noqa: E402


def steps_typed(page: str) -> str:
    match = re.search(r'<textarea name="steps"[^>]*>\n?(.*?)</textarea>', page, re.S)
    assert match, page[:500]
    import html

    return html.unescape(match.group(1))


def test_the_job_form_defines_a_job_with_steps_in_one_audited_define(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    assert steps_typed(page) == ""
    before = len(audit_rows(scenario))
    bad = '[{"sql": "SELECT 1", "on_success": "goto:5"}]'
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_steps", "steps": bad,
                                             "intent": "save"})
    assert status == 400, page
    assert ("Steps (JSON) (@steps) = &#x27;[{&quot;sql&quot;: &quot;SELECT 1&quot;, &quot;on_success&quot;: "
            "&quot;goto:5&quot;}]&#x27;: expected steps agent.set_job_steps accepts: @steps step 1 "
            "on_success=&#x27;goto:5&#x27;: expected a goto to an existing step") in page, page
    assert steps_typed(page) == bad                                   # what was typed is kept
    rows = audit_rows(scenario)
    assert len(rows) == before + 1 and (rows[0]["action"], rows[0]["outcome"]) == ("define", "refused")
    # Steps and fleet targets: the targets field is refused, as JOB__<name>__TARGETS with steps is.
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_steps",
                                             "steps": '[{"sql": "SELECT 1"}]', "targets": "db:tenant_*",
                                             "intent": "save"})
    assert status == 400 and "nothing for a job with steps: each step gives its own targets" in page, page

    steps = json.dumps([{"sql": "SELECT 1", "on_failure": "goto:2"}, {"sql": "SELECT 2", "max_attempts": 1}])
    before = len(audit_rows(scenario))
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_steps", "steps": steps,
                                             "intent": "save"})
    rows = audit_rows(scenario)
    assert len(rows) == before + 1                                    # one row for the save, whatever it did
    if is_sqlite(scenario):
        assert status == 409 and "needs a PostgreSQL or SQL Server control database" in page, page
        assert steps_typed(page) == steps and job_row(scenario, "web_steps") is None
        return
    assert status == 200, page
    (row,) = rows[:1]
    arguments = json.loads(row["arguments"]) if isinstance(row["arguments"], str) else row["arguments"]
    assert (row["action"], row["outcome"], row["source"], row["job_name"]) == ("define", "done", "monitor", "web_steps")
    assert arguments["steps"] == steps
    assert job_row(scenario, "web_steps")["requested_steps"] == steps
    assert steps_typed(page) == steps                                 # the edit form shows them
    scenario.agent.tick(datetime.now(UTC))
    defined = job_row(scenario, "web_steps")
    assert defined["valid"] == 1, defined["config_error"]
    stored = query(scenario.agent, "SELECT steps FROM agent.jobs WHERE job_name = 'web_steps'")[0][0]
    assert [(s["step"], s["on_failure"], s["max_attempts"]) for s in json.loads(stored)] == [
        (1, "goto:2", 3), (2, "quit_failure", 1)]
    # An edit that empties the field clears the steps (what the form shows is what the job has).
    page = client.get("/define?job=web_steps")[2]
    assert steps_typed(page) == steps
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "web_steps", "steps": "",
                                             "intent": "save"})
    assert status == 200 and "redefined" in page, page
    assert job_row(scenario, "web_steps")["requested_steps"] is None
    scenario.agent.tick(datetime.now(UTC))
    assert query(scenario.agent, "SELECT steps FROM agent.jobs WHERE job_name = 'web_steps'")[0][0] is None


def test_the_job_form_refuses_a_steps_server_the_deployer_did_not_allow(scenario, servers):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    steps = json.dumps([{"sql": "SELECT 1"}, {"sql": "SELECT 2", "targets": "db:app, server:127.0.0.1:1"}])
    status, _, page = client.post("define", {**define_fields(page), **NIGHTLY, "name": "elsewhere_steps",
                                             "steps": steps, "intent": "preview"})
    assert status == 400, page
    assert "Steps (JSON) (@steps)" in page and "&#x27;127.0.0.1:1&#x27; is not one" in page, re.findall(r"<li>(.*?)</li>", page)
    assert "AGENT_FLEET_SERVERS" in page


def test_slots_claimed_ahead_with_the_old_steps_are_claimed_again_in_place_with_the_new(system):
    """As a redefinition does: set_job_steps records the job's runs claimed ahead skipped (their
    note says why); once planned, the claim takes each slot still to come back in place, the same
    run with the new steps."""
    agent, connection, _ = system
    call(connection, "add_scheduled_job", name="often", sql="SELECT 1", schedule="*/5 * * * * *")
    agent.tick(datetime.now(UTC))
    ahead = query(agent, "SELECT run_id, scheduled_for FROM agent.runs WHERE job_name = 'often' AND status = 'pending' "
                         "ORDER BY scheduled_for")
    assert len(ahead) >= 2, ahead
    steps = '[{"sql": "SELECT 1", "on_failure": "goto:2"}, {"sql": "SELECT 2"}]'
    call(connection, "set_job_steps", job_name="often", steps=steps)
    (changed_at,) = query(agent, "SELECT updated_at FROM agent.jobs WHERE job_name = 'often'")[0]
    skipped = query(agent, "SELECT run_id, note FROM agent.runs WHERE job_name = 'often' AND status = 'skipped'")
    assert {run_id for run_id, _ in skipped} == {run_id for run_id, _ in ahead}
    assert {note for _, note in skipped} == {
        "skipped: the job's steps were changed by agent.set_job_steps after this slot was claimed"}
    agent.tick(datetime.now(UTC))
    planned = job_steps(agent, "often")
    assert planned is not None and [s["step"] for s in json.loads(planned)] == [1, 2]
    again = query(agent, "SELECT run_id, steps FROM agent.runs WHERE job_name = 'often' AND status = 'pending'")
    kept = {run_id for run_id, slot in ahead if slot > changed_at}
    assert kept and kept <= {run_id for run_id, _ in again}
    assert all(run_steps == planned for run_id, run_steps in again)


def test_steps_never_pass_to_another_owner_redefining_or_reusing_the_name(pg_url):
    """The attack: operator A set steps on its job; B redefined it (B's @sql), or A removed it and B
    defined a job of that name: A's steps stayed and ran as B, reading B's table for A. The steps
    are the owner's: a change of owner or a removal drops them (a trigger on agent.jobs: every path
    that writes the owner), the job is planned again and runs B's own @sql; the same owner
    redefining keeps them, as documented."""
    import pyodbc

    agent = make_agent(pg_url)
    admin = pg_admin_connection()
    names = {key: f"op_{key}_{uuid.uuid4().hex[:8]}" for key in "ab"}
    connections = {}
    try:
        for name in names.values():
            admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
            execute(agent, f'GRANT agent_operator TO "{name}"')
        connections = {key: pyodbc.connect(pg_url.replace("Uid=root;", f"Uid={name};"), autocommit=True, timeout=10)
                       for key, name in names.items()}
        a, b = connections["a"], connections["b"]
        planted = '[{"sql": "SELECT \'planted by a\'"}]'
        for path in ("redefined", "removed"):
            name = f"nightly_{path}"
            call(a, "add_scheduled_job", name=name, sql="SELECT 'a'")
            call(a, "set_job_steps", job_name=name, steps=planted)
            call(a, "add_scheduled_job", name=name, sql="SELECT 'a again'")        # the same owner: kept
            agent.tick()
            assert job(agent, name)["requested_steps"] == planted and job_steps(agent, name) is not None
            if path == "removed":
                call(a, "remove_scheduled_job", name=name)
                assert job(agent, name)["requested_steps"] is None
            (row,) = call(b, "add_scheduled_job", name=name, sql="SELECT 'b'")
            assert row["action"] == ("defined" if path == "removed" else "redefined")
            row = job(agent, name)
            assert (row["owner"], row["requested_steps"]) == (names["b"], None), row
            agent.tick()
            row = job(agent, name)
            assert row["valid"] == 1 and job_steps(agent, name) is None, row
            assert row["command"] == "SELECT 'b'"
    finally:
        for connection in connections.values():
            connection.close()
        agent.close()
        for name in names.values():
            admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


def test_steps_nested_too_deeply_make_that_job_alone_invalid(system):
    """6,000 characters of nested brackets made json.loads raise RecursionError, which stopped the
    planning of every database job at every tick. Now that job alone is invalid, in words."""
    agent, connection, _ = system
    call(connection, "add_scheduled_job", name="deep", sql="SELECT 1", schedule="0 0 3 * * *")
    call(connection, "set_job_steps", job_name="deep", steps="[" * 3000 + "]" * 3000)
    call(connection, "add_scheduled_job", name="later", sql="SELECT 1", schedule="0 0 3 * * *")
    agent.tick()
    deep, later = job(agent, "deep"), job(agent, "later")
    assert deep["valid"] == 0 and "nested too deeply" in deep["config_error"], deep
    assert later["valid"] == 1 and later["config_error"] is None
