"""The audit trail (issue 32 item 4): every operator action is exactly one row of agent.audit —
who, from where, when, what, its arguments, done or refused — on SQLite and PostgreSQL (the real
CLI through `main`, the real procedures through pyodbc as an operator's login).

* each command-line action writes one row 'done' with the connection's principal (PostgreSQL:
  session_user; SQLite: the operating system's user), source 'cli', its job or run; each refused
  action (unknown job or run, a bad argument, the wrong state) exactly one row 'refused' with the
  error;
* the row is written in the action's own transaction: when writing it fails, the action is
  rolled back with it (and recorded refused);
* each procedure of the T-SQL interface (PostgreSQL) writes one row 'tsql' naming the caller's
  login; the operator can neither call the unaudited bodies nor touch the table;
* two CLI processes acting at once write two rows; `audit --json` is one document with the
  filters applied; the purge takes rows older than the history's retention; the monitor's audit
  page escapes hostile principals, job names and arguments.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from shared.cli.commands import main
from shared.cli.output import EXIT_OK, EXIT_USAGE
from shared.engine import views
from shared.engine.audit import MAX_ARGUMENTS_LENGTH, Audit, bounded_arguments
from shared.engine.operations import pause_job
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import (
    ROOT,
    Clock,
    admin_execute,
    grant_operator_args,
    make_agent,
    pg_admin_connection,
    query,
    runs_table,
    url_as,
    work,
)
from tests.support.tsql_caller import CallError, call

UTC = timezone.utc
SAMPLE_SCRIPT = ROOT / "tests" / "integration" / "sqlagent" / "several_jobs.sql"


@pytest.fixture
def cli(db_url, tmp_path, monkeypatch):
    """The control database with the job `hello` synced (one tick), a poisoned task with its
    poison message, and `run(*args)`: the CLI with --json, its exit code and document."""
    for key in list(os.environ):
        if key.startswith(("AGENT_", "JOB__")):
            monkeypatch.delenv(key)
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {
        "JOB__hello__SCHEDULE": "0 0 3 * * *", "JOB__hello__COMMAND": "SELECT 1"}}))
    base = ["--db", db_url, "--settings", str(settings)]
    assert main([*base, "init-db"]) == EXIT_OK
    assert main([*base, "tick"]) == EXIT_OK
    agent = make_agent(db_url)
    store = agent.store()
    run_id = store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None, max_attempts=1,
                           timeout_seconds=60, lease_seconds=60, now=agent.clock(), operation_id="op").one()["run_id"]
    with store.transaction():
        store.execute("poison_run", run_id=run_id, token=0, now=agent.clock(), reason="test: poisoned",
                      error_number=None, error_sqlstate=None, error_message=None)
        poison_id = store.execute("insert_poison", run_id=run_id, message_id="m", body="{}", dequeue_count=6,
                                  reason="test", errors="[]", now=agent.clock()).one()["poison_id"]
    principal = getpass.getuser() if agent.target.dialect == "sqlite" else \
        query(agent, "SELECT CAST(session_user AS text)")[0][0]

    def run(capsys, *args: str) -> tuple[int, object]:
        capsys.readouterr()
        code = main([*base, "--json", *args])
        out, err = capsys.readouterr()
        return code, json.loads(out if code == EXIT_OK else err)

    return {"run": run, "agent": agent, "poison_id": poison_id, "poisoned_run": run_id, "principal": principal,
            "base": base, "url": db_url}


def trail(agent) -> list[dict]:
    return views.audit_view(agent.store(), limit=10000)


def test_each_cli_action_writes_exactly_one_row_and_each_refusal_one_refused_row(cli, capsys):
    run, agent = cli["run"], cli["agent"]
    host_part = f"@{os.uname().nodename} (sql-agent, pid {os.getpid()})"
    submitted: dict = {}

    def step(args, action, outcome, *, job=None, run_id=None, detail=None, arguments=None, code=None):
        before = trail(agent)
        got_code, document = run(capsys, *args)
        assert got_code == (code if code is not None else (EXIT_OK if outcome == "done" else EXIT_USAGE)), document
        after = trail(agent)
        assert len(after) == len(before) + 1, (args, after[: len(after) - len(before)])
        row = after[0]
        assert row["audit_id"] > (before[0]["audit_id"] if before else 0)
        assert (row["action"], row["outcome"], row["source"]) == (action, outcome, "cli"), (args, row)
        assert row["principal"] == cli["principal"] and row["client"].endswith(host_part), row
        assert row["job_name"] == job, row
        if run_id is not None:
            assert row["run_id"] == (run_id(document) if callable(run_id) else run_id), row
        if detail is not None:
            assert detail in (row["detail"] or ""), row
        if arguments is not None:
            assert row["arguments"] == arguments, row
        if outcome == "refused":
            assert document["error"].split(":")[0] in row["detail"], (document, row)
        return document

    # Done, one row each.
    task = step(["submit", "--sql", "SELECT 'it''s'", "--order", "2"], "submit", "done",
                run_id=lambda d: d["run_id"], arguments={"sql": "SELECT 'it''s'", "order": 2, "max_attempts": 1,
                                                           "timeout_seconds": 1800})
    submitted["task"] = task["run_id"]
    manual = step(["run-now", "hello"], "run-now", "done", job="hello", run_id=lambda d: d["run_id"],
                  detail="pending")
    step(["stop", "hello"], "stop", "done", job="hello", detail=f"1 run(s) cancelled: {manual['run_id']}")
    step(["cancel", str(submitted["task"])], "cancel", "done", run_id=submitted["task"])
    step(["pause", "hello", "--reason", "maintenance <b>"], "pause", "done", job="hello",
         detail="claimed slot(s) skipped")
    assert trail(agent)[0]["arguments"]["reason"] == "maintenance <b>"
    step(["resume", "hello"], "resume", "done", job="hello", detail="caught up")
    step(["poison", "requeue", str(cli["poison_id"])], "requeue", "done", run_id=cli["poisoned_run"])
    # Refused, one row each, after the rollback: nothing of the action stays.
    step(["submit", "--sql", "   "], "submit", "refused", detail="non-empty")
    step(["run-now", "ghost"], "run-now", "refused", job="ghost", detail="no job named 'ghost'")
    step(["stop", "ghost"], "stop", "refused", job="ghost", detail="no job named 'ghost'")
    step(["cancel", "999999"], "cancel", "refused", run_id=999999, detail="no run with id 999999")
    step(["cancel", str(submitted["task"])], "cancel", "refused", run_id=submitted["task"], detail="already cancelled")
    step(["pause", "ghost"], "pause", "refused", job="ghost")
    step(["pause", "hello", "--until", "2000-01-01T00:00:00Z"], "pause", "refused", job="hello",
         detail="expected a time after now")
    step(["resume", "hello"], "resume", "refused", job="hello", detail="is not paused")
    step(["poison", "requeue", "999999"], "requeue", "refused", detail="no poison message with id 999999")
    step(["poison", "requeue", str(cli["poison_id"])], "requeue", "refused", run_id=cli["poisoned_run"],
         detail="only a poisoned or failed run can be requeued")
    # Reading is no action: no row.
    before = len(trail(agent))
    for args in (["jobs"], ["history"], ["audit"], ["next", "hello"], ["stuck"], ["poison", "list"]):
        assert run(capsys, *args)[0] == EXIT_OK
    # A command line that does not parse is no action either.
    with pytest.raises(SystemExit) as parsed:
        main([*cli["base"], "cancel", "x"])
    assert parsed.value.code == EXIT_USAGE
    assert len(trail(agent)) == before
    # Every row's times are the database's clock, in order.
    times = [row["acted_at"] for row in reversed(trail(agent))]
    assert times == sorted(times)


def test_the_row_commits_with_the_action_or_not_at_all(cli, capsys, monkeypatch):
    """Writing the row fails after its INSERT ran: the pause it belongs to is rolled back with it,
    and the action is recorded refused (one row)."""
    agent = cli["agent"]
    original = Audit.write

    def write_then_fail(self):
        original(self)
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(Audit, "write", write_then_fail)
    before = len(trail(agent))
    with pytest.raises(RuntimeError, match="the disk is full"):
        pause_job(agent.store(), "hello", now=agent.clock(), reason="x")
    monkeypatch.setattr(Audit, "write", original)
    rows = trail(agent)
    assert len(rows) == before + 1 and (rows[0]["action"], rows[0]["outcome"]) == ("pause", "refused")
    assert "the disk is full" in rows[0]["detail"]
    (job,) = [row for row in views.jobs_view(agent.store(), agent.clock()) if row["job_name"] == "hello"]
    assert not job["paused"], "the pause committed without its audit row"
    assert not [e for e in views.history_view(agent.store(), "hello", 50)["job_events"] if e["kind"] == "paused"]


def test_import_is_one_row_and_refused_on_sqlite(cli, capsys):
    agent = cli["agent"]
    before = len(trail(agent))
    capsys.readouterr()
    code = main([*cli["base"], "--json", "import-sqlagent", str(SAMPLE_SCRIPT), "--timezone", "UTC", "--apply"])
    out, err = capsys.readouterr()
    rows = trail(agent)[: len(trail(agent)) - before]
    if agent.target.dialect == "sqlite":
        assert code == EXIT_USAGE and "PostgreSQL or SQL Server" in json.loads(err)["error"]
        assert [(r["action"], r["outcome"]) for r in rows] == [("import", "refused")]
        return
    assert code in (0, 1), err                  # 1: something of the script was not carried over
    applied = [item["job"] for item in json.loads(out)["applied"]]
    assert applied
    # One 'define' row per procedure call (the procedure's own, source tsql), then the import's.
    assert [(r["action"], r["source"]) for r in reversed(rows)] == [("define", "tsql")] * len(applied) + [
        ("import", "cli")]
    assert rows[0]["arguments"] == {"jobs": applied} and rows[0]["outcome"] == "done"
    assert {r["job_name"] for r in rows[1:]} == set(applied)
    assert all(r["principal"] == cli["principal"] for r in rows)


def test_two_cli_processes_acting_at_once_write_two_rows(cli):
    """Two `sql-agent submit` processes started together: both done, two rows, each naming its
    own process."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AGENT_", "JOB__"))}
    processes = [subprocess.Popen([sys.executable, "-m", "shared.cli", *cli["base"], "--json", "submit", "--sql",
                                   f"SELECT {n}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for n in (1, 2)]
    outputs = [process.communicate(timeout=120) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs
    run_ids = sorted(json.loads(out)["run_id"] for out, _ in outputs)
    rows = [r for r in trail(cli["agent"]) if r["action"] == "submit"]
    assert sorted(r["run_id"] for r in rows) == run_ids
    assert {r["client"].rsplit("pid ", 1)[1].rstrip(")") for r in rows} == {str(p.pid) for p in processes}


def test_audit_json_is_one_document_with_the_filters_applied(cli, capsys):
    run = cli["run"]
    assert run(capsys, "run-now", "hello")[0] == EXIT_OK
    assert run(capsys, "submit", "--sql", "SELECT 1")[0] == EXIT_OK
    assert run(capsys, "stop", "ghost")[0] == EXIT_USAGE
    code, everything = run(capsys, "audit")
    assert code == EXIT_OK and [r["action"] for r in everything] == ["stop", "submit", "run-now"]
    assert set(everything[0]) == {"audit_id", "acted_at", "principal", "client", "source", "action", "job_name",
                                  "run_id", "arguments", "outcome", "detail"}
    assert run(capsys, "audit", "--job", "hello")[1] == [everything[2]]
    assert run(capsys, "audit", "--limit", "1")[1] == [everything[0]]
    assert run(capsys, "audit", "--since", "2999-01-01T00:00:00Z")[1] == []
    assert len(run(capsys, "audit", "--since", everything[2]["acted_at"])[1]) == 3
    capsys.readouterr()
    assert main([*cli["base"], "audit"]) == EXIT_OK       # the table
    table = capsys.readouterr().out
    assert "refused" in table and "job ghost" in table and cli["principal"] in table


def test_the_purge_takes_audit_rows_as_old_as_the_history_it_purges(db_url):
    clock = Clock(datetime(2026, 3, 1, tzinfo=UTC))
    agent = make_agent(db_url, {"a": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}, clock=clock,
                       AGENT_HISTORY_RETENTION_DAYS="30")
    agent.tick(clock.now)
    pause_job(agent.store(), "a", now=clock.now)                               # 2026-03-01
    clock.advance(40 * 86400)
    pause_job(agent.store(), "a", now=clock.now, reason="again")              # 2026-04-10
    assert len(trail(agent)) == 2
    agent.tick(clock.now)
    (kept,) = trail(agent)
    assert kept["arguments"]["reason"] == "again"
    keep = make_agent(db_url, clock=clock, AGENT_HISTORY_RETENTION_DAYS="0")     # 0: kept forever
    clock.advance(4000 * 86400)
    keep.tick(clock.now)
    assert len(trail(keep)) == 1


def test_the_hot_path_writes_no_row(db_url):
    """Ticks, claims, starts and ends of runs (scheduled, a follow-up, a task) are the agent's own
    work, not an operator's action: no row."""
    agent = make_agent(db_url, {"often": {"SCHEDULE": "*/1 * * * * *", "COMMAND": "SELECT 1"},
                                "after": {"AFTER": "often", "COMMAND": "SELECT 2"}}, simulated_time=False)
    agent.store().execute("insert_task", command="SELECT 3", target_database=None, task_order=None, max_attempts=1,
                          timeout_seconds=60, lease_seconds=60, now=agent.clock(), operation_id="op")
    agent.tick()
    work(agent, concurrency=2, max_seconds=20)
    agent.tick()
    statuses = {row[0] for row in query(agent, f"SELECT status FROM {runs_table(agent)}")}
    assert "succeeded" in statuses, statuses
    assert trail(agent) == []


HOSTILE = ["it's \"quoted\"", "<script>alert('x')</script>", "\u202egnp.exe", "a&amp;b", "</td></tr><tr><td>"]


def test_the_monitor_page_shows_every_row_escaped(cli):
    agent = cli["agent"]
    store = agent.store()
    for n, text in enumerate(HOSTILE):
        store.execute("insert_audit", now=agent.clock(), principal=text, fallback_principal="x", client=text,
                      source="monitor", action="pause", job_name=text, run_id=n + 1,
                      arguments=json.dumps({"reason": text}), audit_outcome="refused", detail=text)
    monitor = Monitor(lambda: contextlib.nullcontext(agent.new_store()), clock=lambda: datetime.now(UTC),
                      settings=lambda: MonitorSettings())
    response = monitor.handle("GET", "/audit", "", "text/html")
    assert response.status == 200
    page = response.body.decode()
    assert "<script>" not in page and "</td></tr><tr><td>" not in page and "it's \"quoted\"" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page and "a&amp;amp;b" in page
    # The right-to-left override is shown, not obeyed: "\u202egnp.exe" cannot pass for "exe.png".
    assert "\u202e" not in page
    assert '<bdi><span class="control">&lt;U+202E&gt;</span>gnp.exe</bdi>' in page
    assert page.count('<span class="audit-refused">refused</span>') == len(HOSTILE)
    twin = json.loads(monitor.handle("GET", "/audit", "format=json&limit=2", "").body)
    assert [row["principal"] for row in twin] == HOSTILE[::-1][:2]
    assert monitor.handle("GET", "/audit", "since=yesterday", "").status == 400
    assert monitor.handle("GET", "/audit", "limit=0", "").status == 400
    job_only = json.loads(monitor.handle("GET", "/audit", f"format=json&job={HOSTILE[1]}", "").body)
    assert [row["job_name"] for row in job_only] == [HOSTILE[1]]


def test_arguments_stay_one_valid_json_document_within_the_bound():
    for value in ("x" * 100000, "\u202e\"<>" * 5000, "\x00\x01" * 3000):
        text = bounded_arguments({"sql": value, "reason": value[:5000], "n": 3, "none": None,
                                  "at": datetime(2026, 1, 1, tzinfo=UTC)})
        assert len(text) <= MAX_ARGUMENTS_LENGTH
        document = json.loads(text)
        assert document["n"] == 3 and "none" not in document and document["at"] == "2026-01-01T00:00:00+00:00"
        assert document["sql"].endswith("…")
    assert json.loads(bounded_arguments({"a": 1})) == {"a": 1}


# ---------------------------------------------------------------- the procedures (PostgreSQL)


@pytest.fixture
def operator(pg_url):
    """A login role, member of agent_operator only (made so by `grant-sql --operator --apply`,
    itself audited), its connection, the agent."""
    import pyodbc

    agent = make_agent(pg_url, {"hello": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}})
    agent.tick()
    name = f"op_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
    assert main(grant_operator_args(pg_url, name)) == EXIT_OK
    connection = pyodbc.connect(url_as(pg_url, name), autocommit=True, timeout=10)
    try:
        yield name, connection, agent
    finally:
        connection.close()
        admin_execute(pg_url, f'DROP OWNED BY "{name}"')
        agent.close()
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


def test_each_procedure_writes_one_row_naming_its_caller(operator):
    name, connection, agent = operator
    (grant,) = trail(agent)
    assert (grant["action"], grant["outcome"], grant["source"]) == ("grant", "done", "cli")
    assert grant["arguments"]["operator"] == name and "agent_operator" in grant["detail"]
    now = datetime.now(UTC)
    done: list[tuple[str, str | None]] = []

    def step(procedure, action, *, job=None, **arguments):
        before = len(trail(agent))
        result = call(connection, procedure, **arguments)
        rows = trail(agent)
        assert len(rows) == before + 1, (procedure, rows[: len(rows) - before])
        row = rows[0]
        assert (row["action"], row["outcome"], row["source"], row["principal"]) == (action, "done", "tsql", name), row
        assert row["job_name"] == job and row["client"].endswith("from 127.0.0.1"), row
        done.append((action, job))
        return result, row

    (task,), row = step("exec_async", "submit", sql="SELECT 'x'", execution_order=None)
    assert row["run_id"] == task["run_id"] and row["arguments"] == {"sql": "SELECT 'x'", "max_attempts": 1,
                                                                     "timeout_seconds": 1800}
    step("add_scheduled_job", "define", job="opjob", name="opjob", sql="SELECT 1", schedule="0 0 4 * * *")
    step("enable_job", "disable", job="opjob", name="opjob", enabled=0)
    step("enable_job", "enable", job="opjob", name="opjob", enabled=1)
    (started,), row = step("start_job", "run-now", job="opjob", job_name="opjob")
    assert row["run_id"] == started["run_id"] and row["detail"].startswith(started["status"])
    _, row = step("stop_job", "stop", job="opjob", job_name="opjob")
    assert row["detail"] == "1 row(s)"
    step("cancel_run", "cancel", run_id=task["run_id"])
    step("pause_job", "pause", job="hello", job_name="hello", until=now + timedelta(days=1), reason="r")
    step("resume_job", "resume", job="hello", job_name="hello")
    step("add_calendar", "define-calendar", name="holidays", dates="2026-12-25")
    step("set_job_calendars", "set-calendars", job="opjob", job_name="opjob", exclude_calendars="holidays")
    step("remove_calendar", "remove-calendar", name="holidays")
    (poisoned,) = call(connection, "exec_async", sql="SELECT 2", execution_order=None)
    claimed = [r for r in agent.store().execute("claim_runs", now=now + timedelta(seconds=5), late_cutoff=now,
                                                batch=5, max_concurrency=5, worker="w").rows
               if r["run_id"] == poisoned["run_id"]][0]
    agent.store().execute("poison_run", run_id=poisoned["run_id"], token=claimed["token"], now=now, reason="x",
                          error_number=None, error_sqlstate=None, error_message="x")
    poison_id = agent.store().execute("insert_poison", run_id=poisoned["run_id"], message_id="m", body="{}",
                                      dequeue_count=5, reason="x", errors="[]", now=now).one()["poison_id"]
    _, row = step("requeue_poison", "requeue", poison_id=poison_id)
    assert row["run_id"] == poisoned["run_id"]
    step("remove_scheduled_job", "remove", job="opjob", name="opjob")
    assert {action for action, _ in done} == {"submit", "define", "disable", "enable", "run-now", "stop", "cancel",
                                              "pause", "resume", "define-calendar", "set-calendars",
                                              "remove-calendar", "requeue", "remove"}
    # A refused call: its transaction rolls back, and a PostgreSQL function cannot commit apart
    # from it: the caller gets the error and no row is left (documented).
    before = len(trail(agent))
    with pytest.raises(CallError):
        call(connection, "stop_job", job_name="ghost")
    assert len(trail(agent)) == before


def test_an_operator_can_neither_skip_the_audit_nor_touch_the_table(operator):
    name, connection, agent = operator
    cursor = connection.cursor()
    for statement in ("SELECT * FROM agent.exec_async_unaudited('SELECT 1')",
                      "SELECT * FROM agent.stop_job_unaudited('hello')",
                      "SELECT * FROM agent.audit",
                      "DELETE FROM agent.audit",
                      "UPDATE agent.audit SET principal = 'someone else'",
                      "INSERT INTO agent.audit (acted_at, principal, source, action, outcome) "
                      "VALUES (now(), 'x', 'cli', 'stop', 'done')",
                      "SELECT agent.audit_procedure_call('stop', 'hello', NULL, '{}'::jsonb, NULL)"):
        import pyodbc

        with pytest.raises(pyodbc.Error) as caught:
            cursor.execute(statement)
        assert "42501" in str(caught.value), (statement, caught.value)     # insufficient privilege
    assert [r["action"] for r in trail(agent)] == ["grant"]


def test_an_action_interrupted_before_its_commit_is_one_refused_row(cli, monkeypatch):
    agent = cli["agent"]

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Audit, "write", interrupted)
    before = len(trail(agent))
    with pytest.raises(KeyboardInterrupt):
        pause_job(agent.store(), "hello", now=agent.clock())
    monkeypatch.undo()
    rows = trail(agent)
    assert len(rows) == before + 1 and (rows[0]["action"], rows[0]["outcome"]) == ("pause", "refused")
    assert rows[0]["detail"] == "interrupted before it committed (Ctrl-C)"
    assert not [row for row in views.jobs_view(agent.store(), agent.clock()) if row["paused"]]


# ---------------------------------------------------------------- SQL Server (parsed, not run here)


def test_the_tsql_wrappers_parse_and_pass_every_parameter_on():
    """SQL Server is not available here: each module of the audit migration parses with sqlfluff
    (a broken one does not), and each wrapper passes every parameter of its procedure on by name
    (OUTPUT ones as OUTPUT), audits with its action in both outcomes, and rethrows."""
    import re

    from sqlfluff.core import FluffConfig, Linter

    from shared.control.queries import load_migrations, split_statements

    (migration,) = [m for m in load_migrations("mssql") if m.description == "audit"]
    modules = [s for s in split_statements(migration.path.read_text(encoding="utf-8"), tsql=True)
               if re.search(r"^CREATE PROCEDURE agent\.", s, re.M)]
    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql", "large_file_skip_byte_limit": 0}))

    def parses(sql: str) -> bool:
        parsed = linter.parse_string(sql)
        return not parsed.violations and parsed.tree is not None and "unparsable" not in parsed.tree.stringify()

    wrappers = [m for m in modules if "_unaudited" in m]
    assert len(wrappers) == 13 and len(modules) == 14
    for module in modules:
        assert parses(module), module[:200]
    for wrapper in wrappers:
        name = re.search(r"CREATE PROCEDURE agent\.(\w+)", wrapper).group(1)
        head = wrapper.split("\nAS\n", 1)[0]
        parameters = re.findall(r"^    @(\w+) [^\n]*?( OUTPUT)?,?$", head, re.M)
        call = re.search(rf"EXEC agent\.{name}_unaudited (.*?);", wrapper).group(1)
        assert call == ", ".join(f"@{p} = @{p}{output}" for p, output in parameters), (name, call)
        assert wrapper.count("EXEC agent.audit_procedure_call") == 2 and "@outcome = N'refused'" in wrapper
        assert wrapper.rstrip().endswith("THROW;\n    END CATCH;\nEND")
    assert not parses(wrappers[0].replace("        COMMIT TRANSACTION;", "        COMMIT TRANSACTION;\n    END;", 1))


def test_grant_and_import_refused_before_they_ran_are_one_refused_row_each(cli, capsys, tmp_path):
    run, agent = cli["run"], cli["agent"]
    cases = [(["grant-sql", "--app-name", "app", "--apply"], "grant", "needs an Azure SQL"),
             (["grant-sql", "--operator", "ops", "--targets", "x", "--apply"], "grant", "takes no"),
             (["import-sqlagent", str(tmp_path / "missing.sql"), "--apply"], "import", "cannot read"),
             (["import-sqlagent", str(SAMPLE_SCRIPT), "--timezone", "Mars/Olympus", "--apply"], "import", "Mars")]
    if agent.target.dialect == "sqlite":
        cases.append((["grant-sql", "--operator", "ops", "--apply"], "grant", "SQLite has no roles"))
    for args, action, said in cases:
        before = len(trail(agent))
        code, error = run(capsys, *args)
        assert code == EXIT_USAGE and said in error["error"], (args, error)
        rows = trail(agent)
        assert len(rows) == before + 1, (args, rows[: len(rows) - before])
        assert (rows[0]["action"], rows[0]["outcome"], rows[0]["source"]) == (action, "refused", "cli")
        assert said in rows[0]["detail"], rows[0]
    # Without --apply nothing is done: no row.
    before = len(trail(agent))
    assert run(capsys, "grant-sql", "--app-name", "app")[0] == EXIT_OK
    assert len(trail(agent)) == before
