"""The T-SQL interface in the control database (issue 14): the seeds' procedures, SQL Server
Agent's verbs, the history views and the agent_operator role.

Every procedure and view is called as a user would, through pyodbc on a connection of the user's
own (tests/support/tsql_caller.py), on PostgreSQL, the stand-in for SQL Server here, and on SQL Server
when AGENT_TEST_MSSQL is set (the conformance run). Each one is compared with the CLI command of
the same meaning on the rows it produces.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.cli.commands import main as cli
from shared.engine.runner import LocalRunner
from shared.messaging.memory import MemoryQueue
from tests.support.harness import MSSQL_BASE, execute, fresh_database, make_agent, pg_admin_connection, query, sql_for, tsql_delay, work
from tests.support.tsql_caller import CallError, call, connect, select

UTC = timezone.utc
RUN_COLUMNS = ("job_name", "kind", "status", "command", "target_database", "task_order", "overlap", "attempt",
               "max_attempts", "timeout_seconds", "lease_seconds", "token", "note", "failures", "lapses",
               "transient_errors", "worker", "last_error", "last_error_number")
# The error a procedure raises: SQLSTATE on PostgreSQL, THROW number on SQL Server.
BAD_ARGUMENT = {"postgres": "22023", "mssql": "51401"}
NOT_FOUND = {"postgres": "P0002", "mssql": "51404"}
DOES_NOT_FIT = {"postgres": "55000", "mssql": "51409"}


@pytest.fixture(params=["postgres"] + (["mssql"] if MSSQL_BASE else []))
def control_url(request):
    with fresh_database(request.param) as url:
        yield url


@pytest.fixture
def system(control_url):
    """An agent on the real clock (the procedures read the server's), the schema applied, and a
    user's own connection to the control database."""
    agents = []

    def build(jobs=None, **settings):
        agent = make_agent(control_url, jobs, **settings)
        agents.append(agent)
        return agent

    connection = connect(control_url)
    yield build, connection, control_url
    connection.close()
    for agent in agents:
        agent.close()


def dialect(url: str) -> str:
    return "postgres" if "postgres" in url.lower() else "mssql"


def run_row(agent, run_id: int) -> dict:
    return agent.store().execute("get_run", run_id=run_id).one()


def job_row(agent, name: str) -> dict | None:
    return next((r for r in agent.store().execute("list_jobs").rows if r["job_name"] == name), None)


def comparable(row: dict) -> dict:
    return {key: row[key] for key in RUN_COLUMNS if key in row}


def fingerprint(agent) -> str:
    """Everything a procedure could change: runs, attempts, jobs, job events, poison messages, state."""
    store = agent.new_store()
    try:
        parts = []
        for table in ("runs", "attempts", "jobs", "job_events", "poison_messages", "state"):
            cursor = store.connection.cursor()
            cursor.execute(f"SELECT * FROM agent.{table} ORDER BY 1")
            parts.append(repr([tuple(row) for row in cursor.fetchall()]))
            cursor.close()
        store.connection.commit()
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()
    finally:
        store.close()


def wait_until(condition, seconds: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def warm_up(agent, connection, table: str, workers: int) -> None:
    """Run once, untimed, every path a timed part takes: tasks queued by exec_async (``workers``
    of them at once, so each worker's connection runs a task), a job defined by
    add_scheduled_job that the poll plans and claims, and start_job. Babelfish compiles each
    batch at its first use on a connection (1-3 s, docs/azure-sql.md), so a timed part on cold
    connections would measure compilation, not the poll; PostgreSQL's cost is milliseconds.
    The rows say 'warm' in ``table``'s label column."""
    def warm_rows() -> int:
        return query(agent, f"SELECT COUNT(*) FROM {table} WHERE label = 'warm'")[0][0]

    for _ in range(workers):
        call(connection, "exec_async", sql=f"INSERT INTO {table} (label) VALUES ('warm')")
    call(connection, "add_scheduled_job", name="warm_up", run_at=datetime.now(UTC),
         sql=f"INSERT INTO {table} (label) VALUES ('warm')")
    assert wait_until(lambda: warm_rows() == workers + 1, 60), warm_rows()
    call(connection, "start_job", job_name="warm_up")
    assert wait_until(lambda: warm_rows() == workers + 2, 60), warm_rows()


def run_cli(url: str, *args: str, env: dict | None = None, capsys=None) -> str:
    code = cli(["--db", url, *args])
    out = capsys.readouterr().out if capsys is not None else ""
    assert code == 0, out
    return out


# ---------------------------------------------------------------- 1. exec_async


def test_exec_async_queues_exactly_the_row_submit_queues(system, capsys):
    build, connection, url = system
    agent = build()
    sql = "UPDATE nothing SET x = 'it''s' -- stored as given"
    run_cli(url, "submit", "--sql", sql, "--order", "3", "--max-attempts", "2", "--timeout-seconds", "90",
            capsys=capsys)
    submitted = max(agent.store().execute("list_history", job_name=None, limit=10).rows, key=lambda r: r["run_id"])
    (row,) = call(connection, "exec_async", sql=sql, execution_order=3, max_attempts=2, timeout_seconds=90)
    assert set(row) == {"run_id"} and row["run_id"] > submitted["run_id"]
    ours, theirs = run_row(agent, row["run_id"]), run_row(agent, submitted["run_id"])
    assert comparable(ours) == comparable(theirs)
    assert ours["command"] == sql                       # never run, never rewritten
    assert ours["scheduled_for"] == ours["runnable_at"] == ours["created_at"]
    assert len(ours["operation_id"]) == 32 and ours["operation_id"] != theirs["operation_id"]
    # The defaults: order 0, one attempt, 1800 s; NULL means no order at all.
    (default,) = call(connection, "exec_async", sql="SELECT 1")
    assert (run_row(agent, default["run_id"])["task_order"], run_row(agent, default["run_id"])["max_attempts"]) == (0, 1)
    (unordered,) = call(connection, "exec_async", sql="SELECT 1", execution_order=None)
    assert run_row(agent, unordered["run_id"])["task_order"] is None
    # @run_at (DATETIMEOFFSET / timestamptz): runnable at that instant, in UTC.
    later = datetime(2031, 5, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    (delayed,) = call(connection, "exec_async", sql="SELECT 1", run_at=later)
    assert run_row(agent, delayed["run_id"])["runnable_at"] == datetime(2031, 5, 1, 12, 0, tzinfo=UTC)


def test_sql_text_is_stored_never_run_by_the_procedures(system):
    build, connection, url = system
    agent = build()
    execute(agent, "CREATE TABLE victim (x INT)")
    hostile = "DROP TABLE victim; SELECT '; DROP TABLE victim; --' AS x"
    (row,) = call(connection, "exec_async", sql=hostile)
    call(connection, "add_scheduled_job", name="hostile", sql=hostile, schedule="0 0 3 * * *")
    assert query(agent, "SELECT COUNT(*) FROM victim") == [(0,)]    # still there
    assert run_row(agent, row["run_id"])["command"] == hostile
    stored = select(connection, "SELECT command FROM agent.jobs WHERE job_name = 'hostile'")
    assert stored == [{"command": hostile}]


# ---------------------------------------------------------------- 5. errors: one message, nothing changed


BAD_CALLS = [
    ("exec_async", {"sql": "  "}, BAD_ARGUMENT, "agent.exec_async: @sql = '  ': expected the SQL to run"),
    ("exec_async", {"sql": None}, BAD_ARGUMENT, "agent.exec_async: @sql = NULL: expected"),
    ("exec_async", {"sql": "SELECT 1", "execution_order": -1}, BAD_ARGUMENT, "@execution_order = -1: expected NULL"),
    ("exec_async", {"sql": "SELECT 1", "database": "x;y"}, BAD_ARGUMENT, "@database = 'x;y': expected NULL"),
    ("exec_async", {"sql": "SELECT 1", "max_attempts": 0}, BAD_ARGUMENT, "@max_attempts = 0: expected a whole number from 1 to 100"),
    ("exec_async", {"sql": "SELECT 1", "timeout_seconds": 0}, BAD_ARGUMENT, "@timeout_seconds = 0: expected"),
    ("add_scheduled_job", {"name": "bad name", "sql": "SELECT 1", "schedule": "0 * * * * *"}, BAD_ARGUMENT,
     "agent.add_scheduled_job: @name = 'bad name': expected a job name of 1 to 64"),
    ("add_scheduled_job", {"name": "x" * 65, "sql": "SELECT 1", "schedule": "0 * * * * *"}, BAD_ARGUMENT,
     "@name = 'xxxxxxxx"),
    ("add_scheduled_job", {"name": "j", "sql": "", "schedule": "0 * * * * *"}, BAD_ARGUMENT, "@sql = '': expected"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *",
                           "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, BAD_ARGUMENT, "expected NULL when @schedule is given"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "enabled": 2}, BAD_ARGUMENT,
     "@enabled = 2: expected 1 (enabled) or 0 (disabled)"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "overlap": "never"},
     BAD_ARGUMENT, "@overlap = 'never': expected skip, queue, allow, buffer-one or cancel-previous"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "misfire": "later"},
     BAD_ARGUMENT, "@misfire = 'later': expected run-once or skip"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "lease_seconds": 5},
     BAD_ARGUMENT, "@lease_seconds = 5: expected a whole number from 6 to 3600"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "grace_seconds": -1},
     BAD_ARGUMENT, "@grace_seconds = -1: expected"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "timezone": "a b"},
     BAD_ARGUMENT, "@timezone = 'a b': expected an IANA time zone name"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "timeout_seconds": 604801},
     BAD_ARGUMENT, "@timeout_seconds = 604801: expected"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "max_attempts": 101},
     BAD_ARGUMENT, "@max_attempts = 101: expected"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "targets": "  "},
     BAD_ARGUMENT, "@targets = '  ': expected NULL (one database) or a comma list"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "targets": "db:t_*",
                           "database": "other"}, BAD_ARGUMENT, "@database = 'other': expected NULL when @targets"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "targets": "db:t_*",
                           "target_parallelism": 0}, BAD_ARGUMENT, "@target_parallelism = 0: expected a whole number from 1 to 1000"),
    ("add_scheduled_job", {"name": "j", "sql": "SELECT 1", "schedule": "0 * * * * *", "target_parallelism": None},
     BAD_ARGUMENT, "@target_parallelism = NULL: expected"),
    ("add_scheduled_job", {"name": "settled", "sql": "SELECT 1", "schedule": "0 * * * * *"}, DOES_NOT_FIT,
     "this job is defined in the app settings (JOB__settled__*)"),
    ("add_scheduled_job", {"name": "SETTLED", "sql": "SELECT 1", "schedule": "0 * * * * *"}, DOES_NOT_FIT,
     "it differs only by case from job 'settled'"),
    ("remove_scheduled_job", {"name": None}, BAD_ARGUMENT, "@name = NULL: expected the name of a job defined by"),
    ("remove_scheduled_job", {"name": "ghost"}, NOT_FOUND, "@name = 'ghost': expected the name of a job defined by"),
    ("remove_scheduled_job", {"name": "settled"}, DOES_NOT_FIT, "(JOB__settled__*): remove it there"),
    ("enable_job", {"name": "dbjob", "enabled": 5}, BAD_ARGUMENT, "agent.enable_job: @enabled = 5: expected 1"),
    ("enable_job", {"name": "ghost", "enabled": 0}, NOT_FOUND, "@name = 'ghost'"),
    ("enable_job", {"name": "settled", "enabled": 0}, DOES_NOT_FIT, "set JOB__settled__ENABLED there"),
    ("start_job", {"job_name": "ghost"}, NOT_FOUND, "agent.start_job: @job_name = 'ghost': expected the name of a job"),
    ("start_job", {"job_name": None}, BAD_ARGUMENT, "@job_name = NULL"),
    ("start_job", {"job_name": "broken"}, DOES_NOT_FIT, "@job_name = 'broken': expected a valid job; it is invalid: JOB__broken__SCHEDULE"),
    ("stop_job", {"job_name": "ghost"}, NOT_FOUND, "agent.stop_job: @job_name = 'ghost'"),
    ("cancel_run", {"run_id": None}, BAD_ARGUMENT, "agent.cancel_run: @run_id = NULL"),
    ("cancel_run", {"run_id": 987654}, NOT_FOUND, "@run_id = 987654: expected the id of a run; there is no such run"),
    ("cancel_run", {"run_id": "finished"}, DOES_NOT_FIT, "expected a run not yet finished; it is already cancelled"),
    ("requeue_poison", {"poison_id": 987654}, NOT_FOUND, "@poison_id = 987654: expected the id of a poison message"),
    ("requeue_poison", {"poison_id": "malformed"}, DOES_NOT_FIT, "it belongs to no run (it was malformed"),
]


def test_every_procedure_refuses_bad_arguments_with_one_message_and_changes_nothing(system):
    build, connection, url = system
    agent = build({"settled": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"},
                   "broken": {"SCHEDULE": "not cron", "COMMAND": "SELECT 1"}})
    agent.tick()
    call(connection, "add_scheduled_job", name="dbjob", sql="SELECT 1", schedule="0 0 1 * * *")
    (finished,) = call(connection, "exec_async", sql="SELECT 1")
    call(connection, "cancel_run", run_id=finished["run_id"])
    agent.store().execute("insert_poison", run_id=None, message_id="m", body="garbage", dequeue_count=1,
                          reason="malformed message: not JSON", errors="[]", now=datetime.now(UTC))
    malformed = agent.store().execute("list_poison", limit=1).one()["poison_id"]
    aliases = {"finished": finished["run_id"], "malformed": malformed}
    kind = dialect(url)
    for procedure, arguments, codes, fragment in BAD_CALLS:
        arguments = {k: aliases.get(v, v) if isinstance(v, str) and k in ("run_id", "poison_id") else v
                     for k, v in arguments.items()}
        before = fingerprint(agent)
        with pytest.raises(CallError) as caught:
            call(connection, procedure, **arguments)
        error = caught.value
        assert error.code == codes[kind], (procedure, arguments, error)
        assert fragment in error.message, (procedure, arguments, error.message)
        assert error.message.startswith(f"agent.{procedure}: @"), error.message
        assert "\n" not in error.message, error.message                     # one line
        assert fingerprint(agent) == before, f"{procedure} {arguments} changed something"


def test_a_run_at_no_job_can_be_keyed_by_is_one_parameter_error(system):
    """PostgreSQL's timestamptz holds 'infinity' and years past 9999, which no slot can be: the
    procedures refuse them with the one-line parameter error, never a raw constraint error.
    SQL Server's DATETIMEOFFSET holds no such value: there the call is refused before the
    procedure runs (by the driver or the parameter's conversion), and nothing changes either."""
    build, connection, url = system
    agent = build()
    if dialect(url) != "postgres":
        for value in ("infinity", "10000-01-01 00:00:00+00"):
            before = fingerprint(agent)
            with pytest.raises(Exception):    # noqa: B017 - the driver's or the server's conversion error
                call(connection, "exec_async", sql="SELECT 1", run_at=value)
            assert fingerprint(agent) == before
        return
    for value in ("infinity", "-infinity", "10000-01-01 00:00:00+00"):
        for procedure, arguments in (("exec_async", {"sql": "SELECT 1"}),
                                     ("add_scheduled_job", {"name": "later", "sql": "SELECT 1"})):
            before = fingerprint(agent)
            with pytest.raises(CallError) as caught:
                call(connection, procedure, run_at=value, **arguments)
            message = caught.value.message
            assert message.startswith(f"agent.{procedure}: @run_at = ") and "\n" not in message, message
            assert "expected a date and time from 0001-01-01 to 9999-12-31" in message, message
            assert fingerprint(agent) == before


# ---------------------------------------------------------------- 2. jobs defined in the database


def test_database_jobs_are_planned_by_the_engine_and_an_invalid_one_hurts_only_itself(system, capsys):
    build, connection, url = system
    agent = build({"from_settings": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}})
    call(connection, "add_scheduled_job", name="good", sql="SELECT 1", schedule="0 30 2 * * *",
         timezone="Europe/Paris")
    call(connection, "add_scheduled_job", name="mars", sql="SELECT 1", schedule="0 0 * * * *", timezone="Mars/Olympus")
    call(connection, "add_scheduled_job", name="nocron", sql="SELECT 1", schedule="0 0 25 * * *")
    call(connection, "add_scheduled_job", name="feb30", sql="SELECT 1", schedule="0 0 0 30 2 *")
    call(connection, "add_scheduled_job", name="off", sql="SELECT 1", schedule="0 0 * * * *", enabled=0,
         timezone="Mars/Olympus")                           # checked though disabled
    activity = {r["job_name"]: r for r in select(connection, "SELECT * FROM agent.job_activity")}
    assert {activity[n]["state"] for n in ("good", "mars", "nocron", "feb30")} == {"planning"}
    report = agent.tick()
    assert not report.errors and len(report.planned) == 5
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    good = jobs["good"]
    assert good["valid"] == 1 and good["source"] == "database" and good["needs_planning"] == 0
    paris = good["next_due_at"].astimezone(ZoneInfo("Europe/Paris"))
    assert (paris.hour, paris.minute) == (2, 30)
    assert jobs["from_settings"]["valid"] == 1 and jobs["from_settings"]["source"] == "settings"
    assert jobs["mars"]["config_error"] == ("agent.add_scheduled_job @timezone='Mars/Olympus': expected an IANA time "
                                           "zone name such as UTC or Europe/Paris (a canonical name of the IANA "
                                           "database; not a host's own file such as localtime, posixrules, Factory, "
                                           "posix/... or right/...)")
    assert jobs["nocron"]["config_error"].startswith("agent.add_scheduled_job @schedule='0 0 25 * * *': expected a "
                                                     "six-field NCRONTAB")
    assert "agent.add_scheduled_job @schedule='0 0 0 30 2 *': expected a schedule with a slot within 50 years" in \
        jobs["feb30"]["config_error"]
    assert jobs["off"]["config_error"] == jobs["mars"]["config_error"]
    for name in ("mars", "nocron", "feb30", "off"):
        assert jobs[name]["valid"] == 0 and jobs[name]["next_due_at"] is None
        events = agent.store().execute("list_job_events", job_name=name, limit=10).rows
        assert [(e["kind"], e["detail"]) for e in events] == [("config_invalid", jobs[name]["config_error"])]
    activity = {r["job_name"]: r for r in select(connection, "SELECT * FROM agent.job_activity")}
    assert activity["mars"]["state"] == "invalid" and activity["good"]["state"] == "scheduled"
    assert activity["good"]["defined_in"] == "database" and activity["from_settings"]["defined_in"] == "settings"
    # doctor: one warning line per invalid job, and the doctor still passes.
    code = cli(["--db", url, "doctor"])
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("[WARN]") and "is invalid" in line]
    assert len(warnings) == 4 and any("'mars' (defined in the database)" in w and "Mars/Olympus" in w for w in warnings)
    assert code == 0
    # A second tick plans nothing again.
    assert agent.tick().planned == []


def test_the_extended_schedule_form_is_defined_from_tsql_and_checked_by_name(system):
    """agent.add_scheduled_job takes the extended form (L, W, #, clauses: issue 33); a bad clause is
    that job's error, naming the parameter, the value and what is expected."""
    build, connection, url = system
    agent = build()
    call(connection, "add_scheduled_job", name="month_end", sql="SELECT 1",
         schedule="0 0 22 * * MON-FRI#L ; every 2 months ; from 2026-01-01", timezone="Europe/Paris")
    call(connection, "add_scheduled_job", name="no_start", sql="SELECT 1", schedule="0 0 22 * * * ; every 2 weeks")
    agent.tick()
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    assert jobs["month_end"]["valid"] == 1, jobs["month_end"]["config_error"]
    due = jobs["month_end"]["next_due_at"].astimezone(ZoneInfo("Europe/Paris"))
    assert (due.hour, due.minute) == (22, 0) and due.weekday() < 5 and (due.month - 1) % 2 == 0
    following = due + timedelta(days=1)
    while following.month == due.month:
        assert following.weekday() >= 5, f"{due} is not the last weekday of its month"
        following += timedelta(days=1)
    assert jobs["no_start"]["valid"] == 0 and jobs["no_start"]["config_error"] == (
        "agent.add_scheduled_job @schedule='0 0 22 * * * ; every 2 weeks': expected a six-field NCRONTAB "
        "expression (seconds first), e.g. '0 0 2 * * *' ('every 2 weeks' counts from a start date: add "
        "'; from YYYY-MM-DD')")


def test_calendars_and_jitter_are_defined_from_tsql_and_checked_by_name(system):
    """agent.add_calendar, remove_calendar and set_job_calendars (issue 33): a database job avoids
    a calendar defined from T-SQL, with jitter; a bad calendar or name is that job's error, naming
    the procedure's parameter; redefining a calendar plans its jobs again."""
    build, connection, url = system
    agent = build()
    call(connection, "add_scheduled_job", name="nightly", sql="SELECT 1", schedule="0 0 2 * * *")
    call(connection, "add_scheduled_job", name="other", sql="SELECT 1", schedule="0 0 3 * * *")
    (row,) = call(connection, "add_calendar", name="Freeze", dates="2026-12-24..2026-12-26", weekly="SAT-SUN")
    assert (row["calendar_name"], row["action"], row["jobs_replanned"]) == ("Freeze", "defined", 0)
    (row,) = call(connection, "set_job_calendars", job_name="nightly", exclude_calendars="freeze",
                  on_excluded="next", jitter_seconds=120)
    assert (row["exclude_names"], row["excluded_policy"], row["jitter"]) == ("freeze", "next", 120)
    call(connection, "set_job_calendars", job_name="other", only_calendars="nowhere")
    agent.tick()
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    assert jobs["nightly"]["valid"] == 1, jobs["nightly"]["config_error"]
    assert json.loads(jobs["nightly"]["calendars"])["exclude"][0]["name"] == "Freeze"
    assert jobs["nightly"]["jitter_seconds"] == 120
    assert jobs["other"]["valid"] == 0 and jobs["other"]["config_error"] == (
        "agent.set_job_calendars @only_calendars='nowhere': expected names of calendars defined by "
        "agent.add_calendar, comma-separated (defined: Freeze)")
    # The slots the calendar removes, as next shows them (the job's row, planned from T-SQL).
    from shared.engine.views import upcoming_slots

    view = upcoming_slots(jobs["nightly"], datetime(2026, 12, 23, 12, tzinfo=UTC), 2)
    assert [(s["at"], s["calendar"]) for s in view["removed"]] == [
        (datetime(2026, 12, 24, 2, tzinfo=UTC), "calendar: Freeze"), (datetime(2026, 12, 25, 2, tzinfo=UTC), "calendar: Freeze")]
    # Moved past the weekend, and jittered as a slot of the schedule at that time would be (issue 33
    # hardening: every tick keys the moved run as the planner keys that slot).
    assert view["slots"][0]["at"] == datetime(2026, 12, 28, 0, 1, 7, tzinfo=UTC)
    assert view["slots"][0]["jitter_seconds"] == 67 and view["slots"][0]["moved"]
    # A bad calendar, redefined: its jobs are planned again and say so.
    (row,) = call(connection, "add_calendar", name="FREEZE", dates="2026-12-26..2026-12-24")
    assert (row["action"], row["jobs_replanned"]) == ("redefined", 1)
    agent.tick()
    nightly = job_row(agent, "nightly")
    assert nightly["valid"] == 0 and nightly["config_error"] == (
        "agent.set_job_calendars @exclude_calendars='freeze': expected valid calendars: 'freeze' is not "
        "(agent.add_calendar @dates='2026-12-26..2026-12-24': expected '2026-12-26..2026-12-24': the range ends "
        "before it starts (expected YYYY-MM-DD..a later YYYY-MM-DD))")
    (row,) = call(connection, "remove_calendar", name="freeze")
    assert row["jobs_replanned"] == 1
    # The procedures' own checks, one per argument.
    d = dialect(url)
    for procedure, arguments, expected in [
        ("add_calendar", dict(name="bad name"), "@name = 'bad name': expected a calendar name"),
        ("add_calendar", dict(name="x"), "@dates = NULL, @weekly = NULL: expected dates"),
        ("set_job_calendars", dict(job_name="nightly", exclude_calendars="a;DROP TABLE x"),
         "@exclude_calendars = 'a;DROP TABLE x': expected NULL or calendar names"),
        ("set_job_calendars", dict(job_name="nightly", on_excluded="later"), "@on_excluded = 'later': expected skip or next"),
        ("set_job_calendars", dict(job_name="nightly", jitter_seconds=86401), "@jitter_seconds = 86401: expected"),
        ("set_job_calendars", dict(job_name="ghost"), "@job_name = 'ghost': expected the name of a job defined by"),
        ("remove_calendar", dict(name="ghost"), "@name = 'ghost': expected the name of a calendar"),
    ]:
        with pytest.raises(CallError) as caught:
            call(connection, procedure, **arguments)
        assert caught.value.code in (BAD_ARGUMENT[d], NOT_FOUND[d]) and expected in caught.value.message, caught.value


def test_a_database_job_is_stored_as_the_same_settings_job_would_be(system):
    build, connection, url = system
    agent = build({"twin": {"SCHEDULE": "*/30 * * * * *", "COMMAND": "SELECT 42", "TIMEZONE": "Asia/Tokyo",
                            "MAX_ATTEMPTS": "4", "TIMEOUT_SECONDS": "99", "OVERLAP": "queue",
                            "MISFIRE": "skip", "GRACE_SECONDS": "77", "LEASE_SECONDS": "33"}})
    call(connection, "add_scheduled_job", name="dbtwin", sql="SELECT 42", schedule="*/30 * * * * *",
         timezone="Asia/Tokyo", max_attempts=4, timeout_seconds=99, overlap="QUEUE", misfire="skip",
         grace_seconds=77, lease_seconds=33)
    agent.tick()
    columns = ("schedule", "timezone", "command", "target_database", "enabled", "valid", "config_error",
               "max_attempts", "timeout_seconds", "lease_seconds", "misfire", "grace_seconds", "overlap", "configured")
    rows = {r["job_name"]: r for r in select(connection, "SELECT * FROM agent.jobs")}
    assert {c: rows["dbtwin"][c] for c in columns} == {c: rows["twin"][c] for c in columns}
    assert (rows["dbtwin"]["defined_in_database"], rows["twin"]["defined_in_database"]) == (1, 0)
    # A one-time job: @run_at is kept as the '@once' schedule the settings would hold.
    moment = datetime(2031, 3, 4, 5, 6, 7, tzinfo=UTC)
    call(connection, "add_scheduled_job", name="once", sql="SELECT 1", run_at=moment)
    agent.tick()
    assert job_row(agent, "once")["next_due_at"] == moment
    assert job_row(agent, "once")["schedule"].startswith("@once 2031-03-04T05:06:07")


@pytest.mark.parametrize("overlap", ["buffer-one", "Cancel-Previous"])
def test_the_new_overlap_policies_are_taken_from_the_procedure_as_from_the_settings(system, overlap):
    build, connection, url = system
    agent = build({"twin": {"SCHEDULE": "*/30 * * * * *", "COMMAND": "SELECT 42", "OVERLAP": overlap}})
    call(connection, "add_scheduled_job", name="dbtwin", sql="SELECT 42", schedule="*/30 * * * * *", overlap=overlap)
    agent.tick()
    rows = {r["job_name"]: r for r in select(connection, "SELECT * FROM agent.jobs")}
    assert rows["dbtwin"]["overlap"] == rows["twin"]["overlap"] == overlap.lower()
    assert rows["twin"]["valid"] == 1


def test_removing_a_database_job_mid_backfill_skips_its_backfill_runs(system):
    from datetime import timedelta as _td

    from shared.engine.operations import backfill
    build, connection, url = system
    agent = build()
    call(connection, "add_scheduled_job", name="dbjob", sql="SELECT 1", schedule="0 0 * * * *")
    agent.tick()
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    done = backfill(agent, "dbjob", now - _td(hours=5), now - _td(hours=1))
    assert len(done.made) == 5
    call(connection, "remove_scheduled_job", name="dbjob")
    rows = select(connection, "SELECT status, note FROM agent.runs WHERE job_name = 'dbjob' AND kind = 'backfill'")
    assert len(rows) == 5 and {r["status"] for r in rows} == {"skipped"}, rows


def test_a_fleet_job_defined_from_the_procedure_staggers_as_the_settings_one(system):
    build, connection, url = system
    agent = build({"twin": {"SCHEDULE": "0 0 2 * * *", "COMMAND": "SELECT 1", "TARGETS": "db:tenant_*",
                            "TARGET_PARALLELISM": "4", "TARGET_STAGGER_SECONDS": "30"}})
    call(connection, "add_scheduled_job", name="dbtwin", sql="SELECT 1", schedule="0 0 2 * * *",
         targets="db:tenant_*", target_parallelism=4, target_stagger_seconds=30)
    agent.tick()
    rows = {r["job_name"]: r for r in select(connection, "SELECT job_name, steps, valid FROM agent.jobs")}
    assert rows["dbtwin"]["valid"] == 1
    assert json.loads(rows["dbtwin"]["steps"]) == json.loads(rows["twin"]["steps"])
    assert json.loads(rows["dbtwin"]["steps"])[0]["target_stagger_seconds"] == 30
    for bad in (-1, 3601, None):
        with pytest.raises(CallError) as caught:
            call(connection, "add_scheduled_job", name="bad", sql="SELECT 1", schedule="0 0 2 * * *",
                 targets="db:tenant_*", target_stagger_seconds=bad)
        assert "@target_stagger_seconds = " in caught.value.message and "0 to 3600" in caught.value.message


def test_planning_costs_the_same_statements_for_1_or_40_jobs(system):
    build, connection, url = system
    agent = build()
    idle = agent.poll().statements
    assert idle == 1                                         # one indexed look when nothing waits
    for schedule in ("0 0 4 * * *", "not cron", "* * * * * *"):   # valid, invalid, claimed at once
        costs = {}
        for count in (1, 40):
            for index in range(count):
                call(connection, "add_scheduled_job", name=f"n{count}_{index}", sql="SELECT 1", schedule=schedule)
            report = agent.poll()
            assert len(report.planned) == count
            costs[count] = report.statements
        assert costs[1] == costs[40], (schedule, costs)


def test_a_name_taken_by_one_source_is_refused_by_the_other(system):
    build, connection, url = system
    build()
    call(connection, "add_scheduled_job", name="shared_name", sql="SELECT 'database'", schedule="0 0 5 * * *")
    agent = build({"Shared_Name": {"SCHEDULE": "0 0 6 * * *", "COMMAND": "SELECT 'settings'"},
                   "other": {"SCHEDULE": "0 0 6 * * *", "COMMAND": "SELECT 1"}})
    report = agent.tick()
    assert not report.errors
    rows = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    held = rows["shared_name"]
    assert (held["source"], held["valid"], held["schedule"]) == ("database", 1, "0 0 5 * * *")
    (stand_in,) = [r for n, r in rows.items() if n.startswith("Shared_Name~")]
    assert stand_in["valid"] == 0 and stand_in["config_error"].startswith(
        "JOB__Shared_Name__*: the job name 'Shared_Name' is taken by job 'shared_name', defined in the database")
    assert rows["other"]["valid"] == 1                       # the rest of the settings synced
    # Removing the database job lets the settings job have its name at the next tick.
    call(connection, "remove_scheduled_job", name="shared_name")
    agent.tick()
    rows = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    assert rows["Shared_Name"]["valid"] == 1 and rows["Shared_Name"]["source"] == "settings"
    assert rows[stand_in["job_name"]]["configured"] == 0


def test_a_settings_sync_never_touches_a_database_job(system):
    build, connection, url = system
    agent = build({"a": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}})
    call(connection, "add_scheduled_job", name="dbjob", sql="SELECT 1", schedule="* * * * * *")
    agent.tick()
    claimed = [r for r in agent.store().execute("list_history", job_name="dbjob", limit=1000).rows]
    assert claimed and all(r["status"] == "pending" for r in claimed)
    before = select(connection, "SELECT * FROM agent.jobs WHERE job_name = 'dbjob'")
    changed = build({"b": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 2"}})   # 'a' removed, 'b' added
    changed.tick()
    assert select(connection, "SELECT * FROM agent.jobs WHERE job_name = 'dbjob'")[0]["configured"] == 1
    after = agent.store().execute("list_history", job_name="dbjob", limit=1000).rows
    assert {r["run_id"]: r["status"] for r in after if r["run_id"] in {c["run_id"] for c in claimed}} == \
        {c["run_id"]: "pending" for c in claimed}
    assert before[0]["schedule"] == "* * * * * *"


def test_enable_job_and_redefinition_record_the_slots_claimed_ahead_skipped(system):
    build, connection, url = system
    agent = build()
    call(connection, "add_scheduled_job", name="often", sql="SELECT 1", schedule="*/2 * * * * *")
    agent.tick()
    pending = [r for r in agent.store().execute("list_history", job_name="often", limit=1000).rows
               if r["status"] == "pending"]
    assert pending
    (result,) = call(connection, "enable_job", name="often", enabled=0)
    assert result["skipped_runs"] == len(pending)
    notes = {r["note"] for r in agent.store().execute("list_history", job_name="often", limit=1000).rows}
    assert notes == {"skipped: the job was disabled by agent.enable_job after this slot was claimed"}
    assert agent.tick().claimed == []                        # disabled: nothing claimed
    assert call(connection, "enable_job", name="often", enabled=0)[0]["skipped_runs"] == 0   # already so
    call(connection, "enable_job", name="often", enabled=1)
    assert job_row(agent, "often")["needs_planning"] == 1
    agent.tick()
    # Planned again from now (the slots already recorded skipped are not claimed twice).
    assert job_row(agent, "often")["needs_planning"] == 0 and job_row(agent, "often")["next_due_at"] is not None
    call(connection, "add_scheduled_job", name="often", sql="SELECT 2", schedule="*/3 * * * * *")
    report = agent.tick()
    assert report.claimed and {r["status"] for r in report.claimed} == {"pending"}
    (redefined,) = call(connection, "add_scheduled_job", name="often", sql="SELECT 2", schedule="0 0 7 * * *")
    assert redefined == {"job_name": "often", "action": "redefined"}
    for run in report.claimed:
        row = run_row(agent, run["run_id"])
        assert (row["status"], row["note"]) == (
            "skipped", "skipped: the job was redefined by agent.add_scheduled_job after this slot was claimed")
    agent.tick()
    assert job_row(agent, "often")["schedule"] == "0 0 7 * * *"
    # Removed: history kept, the job stops.
    call(connection, "remove_scheduled_job", name="often")
    assert job_row(agent, "often")["configured"] == 0
    assert agent.store().execute("list_history", job_name="often", limit=1000).rows
    assert {r["state"] for r in select(connection, "SELECT state FROM agent.job_activity WHERE job_name = 'often'")} == {"removed"}


def test_concurrent_definitions_of_one_name_leave_one_job(system):
    """Eight sessions define the same job at once, in three spellings: the job-definitions lock
    lets one spelling win; the others are refused (case-insensitive names), none half-done."""
    build, connection, url = system
    build()
    spellings = ["race", "Race", "RACE", "race", "rAce", "race", "Race", "RACE"]
    barrier = threading.Barrier(len(spellings))
    outcomes: list[str] = []

    def define(name: str) -> None:
        own = connect(url)
        try:
            barrier.wait()
            call(own, "add_scheduled_job", name=name, sql=f"SELECT '{name}'", schedule="0 0 1 * * *")
            outcomes.append("ok:" + name)
        except CallError as exc:
            outcomes.append(f"refused:{exc.code}:{exc.message}")
        finally:
            own.close()

    threads = [threading.Thread(target=define, args=(name,)) for name in spellings]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    rows = [r for r in select(connection, "SELECT job_name, command FROM agent.jobs") if r["job_name"].lower() == "race"]
    assert len(rows) == 1, rows
    (winner,) = rows
    accepted = [o for o in outcomes if o.startswith("ok:")]
    assert accepted and {o[3:] for o in accepted} == {winner["job_name"]}
    refused = [o for o in outcomes if o.startswith("refused:")]
    assert len(accepted) + len(refused) == len(spellings)
    assert all(f"differs only by case from job '{winner['job_name']}'" in o for o in refused), refused


def test_a_settings_sync_racing_a_procedure_for_one_name_leaves_one_owner(system):
    build, connection, url = system
    build()
    for round_ in range(4):
        name = f"dup{round_}"
        agent = build({name: {"SCHEDULE": "0 0 1 * * *", "COMMAND": "SELECT 'settings'"}})
        barrier = threading.Barrier(2)
        procedure: list[str] = []

        def define() -> None:
            own = connect(url)
            try:
                barrier.wait()
                call(own, "add_scheduled_job", name=name, sql="SELECT 'database'", schedule="0 0 2 * * *")
                procedure.append("ok")
            except CallError as exc:
                procedure.append(exc.message)
            finally:
                own.close()

        thread = threading.Thread(target=define)
        thread.start()
        barrier.wait()
        report = agent.tick()
        thread.join(timeout=60)
        assert not report.errors, report.errors
        rows = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows
                if r["job_name"].lower().startswith(name) and r["configured"]}
        owners = [r for r in rows.values() if r["valid"]]
        assert len(owners) == 1, rows
        (owner,) = owners
        if procedure == ["ok"]:
            assert owner["source"] == "database" and owner["schedule"] == "0 0 2 * * *"
            (stand_in,) = [r for n, r in rows.items() if n.startswith(f"{name}~")]
            assert "is taken by job" in stand_in["config_error"]
        else:
            assert owner["source"] == "settings" and "JOB__" in procedure[0], procedure
            assert list(rows) == [name]


# ---------------------------------------------------------------- 3. SQL Server Agent's verbs


def test_start_job_makes_the_run_run_now_makes(system, capsys):
    build, connection, url = system
    agent = build({"nightly": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1", "OVERLAP": "skip"}})
    agent.tick()
    run_cli(url, "run-now", "nightly", capsys=capsys)
    (cli_run,) = [r for r in agent.store().execute("list_history", job_name="nightly", limit=10).rows]
    agent.store().execute("cancel_run", run_id=cli_run["run_id"], now=datetime.now(UTC))
    (started,) = call(connection, "start_job", job_name="nightly")
    assert started["status"] == "pending" and started["note"] == "run-now"
    assert comparable(run_row(agent, started["run_id"])) == comparable(
        {**run_row(agent, cli_run["run_id"]), "status": "pending", "token": 0, "note": "run-now"})
    # The overlap rule: a second start while the first is due is skipped, as run-now's would be.
    (second,) = call(connection, "start_job", job_name="nightly")
    assert second["status"] == "skipped" and second["note"].startswith("overlap:")
    # A database-defined job starts the same way.
    call(connection, "add_scheduled_job", name="dbjob", sql="SELECT 1", schedule="0 0 3 * * *")
    (db_started,) = call(connection, "start_job", job_name="dbjob")
    assert run_row(agent, db_started["run_id"])["kind"] == "manual"


def test_a_job_defined_without_schedule_is_on_demand_and_runs_when_started(system):
    build, connection, url = system
    agent = build()
    (defined,) = call(connection, "add_scheduled_job", name="adhoc", sql="SELECT 1")
    assert defined["action"] == "defined"
    for _ in range(2):
        agent.tick()
    row = job_row(agent, "adhoc")
    assert row["schedule"] == "" and row["valid"] == 1 and row["next_due_at"] is None, row
    assert agent.store().execute("list_history", job_name="adhoc", limit=10).rows == []
    (started,) = call(connection, "start_job", job_name="adhoc")
    assert started["status"] == "pending"
    work(agent, concurrency=1)
    assert run_row(agent, started["run_id"])["status"] == "succeeded"
    agent.tick()
    assert len(agent.store().execute("list_history", job_name="adhoc", limit=10).rows) == 1


def test_start_job_of_a_step_job_runs_its_steps_as_run_now_does(system, capsys):
    build, connection, url = system
    agent = build({"steps": {"SCHEDULE": "0 0 3 * * *", "STEPS__1__COMMAND": "SELECT 1",
                             "STEPS__2__COMMAND": "SELECT 2", "OVERLAP": "allow"}})
    agent.tick()
    run_cli(url, "run-now", "steps", capsys=capsys)
    (cli_run,) = agent.store().execute("list_history", job_name="steps", limit=10).rows
    (started,) = call(connection, "start_job", job_name="steps")
    assert run_row(agent, started["run_id"])["steps"] == run_row(agent, cli_run["run_id"])["steps"]
    assert run_row(agent, started["run_id"])["steps"]
    work(agent, concurrency=1)
    steps_run = [a["step"] for a in agent.store().execute("list_attempts", run_ids=[started["run_id"]]).rows]
    assert steps_run == [1, 2] and run_row(agent, started["run_id"])["status"] == "succeeded"


def test_stop_job_cancels_the_runs_in_flight_as_cancel_does_and_keeps_future_slots(system, capsys):
    build, connection, url = system
    agent = build()
    # A one-time job 25 s ahead: within every tick's claim horizon, and its slot has not come.
    call(connection, "add_scheduled_job", name="job", sql="SELECT 1",
         run_at=datetime.now(UTC) + timedelta(seconds=25))
    agent.tick()
    future = [r["run_id"] for r in agent.store().execute("list_history", job_name="job", limit=1000).rows
              if r["status"] == "pending"]
    assert len(future) == 1
    (due,) = call(connection, "start_job", job_name="job")
    twin = call(connection, "start_job", job_name="job")                 # skipped (overlap)
    assert twin[0]["status"] == "skipped"
    stopped = call(connection, "stop_job", job_name="job")
    assert [r["cancelled_run_id"] for r in stopped] == [due["run_id"]]
    # The same change `cancel` makes to a run of the same kind.
    (other,) = call(connection, "start_job", job_name="job")
    run_cli(url, "cancel", str(other["run_id"]), capsys=capsys)
    assert comparable(run_row(agent, due["run_id"])) == comparable(run_row(agent, other["run_id"]))
    assert run_row(agent, due["run_id"])["status"] == "cancelled"
    assert all(run_row(agent, run_id)["status"] == "pending" for run_id in future)
    assert call(connection, "stop_job", job_name="job") == []            # nothing in flight now


def test_cancel_run_and_requeue_poison_do_what_cancel_and_poison_requeue_do(system, capsys):
    build, connection, url = system
    agent = build()
    (a,) = call(connection, "exec_async", sql="SELECT 1", execution_order=None)
    (b,) = call(connection, "exec_async", sql="SELECT 1", execution_order=None)
    assert call(connection, "cancel_run", run_id=a["run_id"]) == [{"cancelled_run_id": a["run_id"]}]
    run_cli(url, "cancel", str(b["run_id"]), capsys=capsys)
    assert comparable(run_row(agent, a["run_id"])) == comparable(run_row(agent, b["run_id"]))
    # Two poisoned runs: one requeued by the procedure, one by the CLI.
    now = datetime.now(UTC)
    poisons = []
    for label in ("p1", "p2"):
        (run,) = call(connection, "exec_async", sql=f"SELECT '{label}'", execution_order=None)
        rows = agent.store().execute("claim_runs", now=now + timedelta(seconds=5), late_cutoff=now, batch=1,
                                     max_concurrency=10, worker="w").rows
        (claimed,) = [r for r in rows if r["decision"] == "start"]
        assert claimed["run_id"] == run["run_id"]
        agent.store().execute("poison_run", run_id=run["run_id"], token=claimed["token"], now=now, reason="boom",
                              error_number=50000, error_sqlstate="42000", error_message="boom")
        poisons.append(agent.store().execute("insert_poison", run_id=run["run_id"], message_id=label, body="{}",
                                             dequeue_count=5, reason="boom", errors="[]", now=now).one()["poison_id"])
    listed = {r["poison_id"]: r for r in select(connection, "SELECT * FROM agent.poison_list")}
    assert set(listed) == set(poisons) and {r["run_status"] for r in listed.values()} == {"poisoned"}
    (requeued,) = call(connection, "requeue_poison", poison_id=poisons[0])
    run_cli(url, "poison", "requeue", str(poisons[1]), capsys=capsys)
    first, second = (run_row(agent, listed[p]["run_id"]) for p in poisons)
    assert requeued["requeued_run_id"] == first["run_id"]
    assert {**comparable(first), "command": "-"} == {**comparable(second), "command": "-"}
    assert first["status"] == "pending"
    listed = {r["poison_id"]: r for r in select(connection, "SELECT * FROM agent.poison_list")}
    assert all(listed[p]["requeued_at"] is not None for p in poisons)
    with pytest.raises(CallError, match="expected a poisoned or failed run; run .* is pending"):
        call(connection, "requeue_poison", poison_id=poisons[0])


def test_stuck_runs_is_the_reconciliation_stuck_makes(system, capsys):
    build, connection, url = system
    build()
    (old,) = call(connection, "exec_async", sql="SELECT 1", execution_order=None,
                  run_at=datetime.now(UTC) - timedelta(seconds=900))
    call(connection, "exec_async", sql="SELECT 1", execution_order=None,
         run_at=datetime.now(UTC) - timedelta(seconds=60))               # waiting, not for long
    out = run_cli(url, "stuck", "--json", capsys=capsys)
    expected = sorted(r["run_id"] for r in json.loads(out))
    viewed = select(connection, "SELECT * FROM agent.stuck_runs ORDER BY run_id")
    assert [r["run_id"] for r in viewed] == expected == [old["run_id"]]
    assert viewed[0]["reason"] == "waiting over 600 s"


# ---------------------------------------------------------------- 4. the seeds, from the procedures


def test_the_seed_examples_run_from_the_procedures_with_no_minute_tick(control_url):
    """Seed 002 and 003 as their users write them: a one-time job a few seconds ahead, a daily
    job, a failing script, async tasks in three execution orders. The local runner ticks once
    at start (AGENT_TICK_SCHEDULE far away); the poll does the rest."""
    kind = dialect(control_url)
    agent = make_agent(control_url, AGENT_POLL_SECONDS="1", AGENT_TICK_SCHEDULE="0 0 0 1 1 *",
                       AGENT_MAX_CONCURRENCY="4")
    connection = connect(control_url)
    execute(agent, sql_for(control_url, "", "CREATE TABLE seed_log (label VARCHAR(40), at TIMESTAMP DEFAULT clock_timestamp())",
                           "CREATE TABLE seed_log (label NVARCHAR(40), at DATETIME2(6) DEFAULT SYSUTCDATETIME())"))
    runner = LocalRunner(agent, concurrency=4)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.5)                                               # the start tick is done
        warm_up(agent, connection, "seed_log", workers=4)
        slot = (datetime.now(UTC) + timedelta(seconds=4)).replace(microsecond=0)
        call(connection, "add_scheduled_job", name="once_ahead", run_at=slot,
             sql="INSERT INTO seed_log (label) VALUES ('once')")
        call(connection, "add_scheduled_job", name="daily", schedule="0 0 2 * * *",
             sql="INSERT INTO seed_log (label) VALUES ('daily')")
        call(connection, "add_scheduled_job", name="failing", run_at=datetime.now(UTC), max_attempts=1,
             sql=sql_for(control_url, "", "SELECT 1/0", "SELECT 1/0"))
        delay = sql_for(control_url, "", "SELECT pg_sleep(0.3)", tsql_delay(0.3))
        for order in (2, 1, 0):                                        # queued in reverse order
            for copy in range(2):
                call(connection, "exec_async", execution_order=order,
                     sql=f"{delay}; INSERT INTO seed_log (label) VALUES ('order{order}')")
        assert wait_until(lambda: len(query(agent, "SELECT label FROM seed_log WHERE label LIKE 'order%'")) == 6, 20)
        assert wait_until(lambda: query(agent, "SELECT COUNT(*) FROM seed_log WHERE label = 'once'") == [(1,)], 15)
        assert wait_until(lambda: any(r["job_name"] == "failing" and r["outcome"] == "failed"
                                      for r in select(connection, "SELECT * FROM agent.job_history")), 15)
    finally:
        runner.stop()
        thread.join(timeout=30)
    # Orders by the times the tasks recorded: every order-0 task ended before an order-1 one began.
    rows = query(agent, "SELECT label, at FROM seed_log WHERE label LIKE 'order%' ORDER BY at")
    assert [label for label, _ in rows] == ["order0"] * 2 + ["order1"] * 2 + ["order2"] * 2
    history = select(connection, "SELECT * FROM agent.job_history")
    (once,) = [r for r in history if r["job_name"] == "once_ahead"]
    started = once["started_at"].replace(tzinfo=UTC) if once["started_at"].tzinfo is None else once["started_at"]
    assert slot <= started <= slot + timedelta(seconds=2.5), (slot, started)     # on its slot, no tick
    assert once["outcome"] == "succeeded" and once["duration_ms"] is not None
    (failed,) = [r for r in history if r["job_name"] == "failing"]
    assert failed["outcome"] == "failed" and failed["error_message"]
    assert failed["error_sqlstate"] == ("22012" if kind == "postgres" else failed["error_sqlstate"])
    daily = [r for r in select(connection, "SELECT * FROM agent.job_activity") if r["job_name"] == "daily"][0]
    assert daily["state"] == "scheduled" and daily["next_run_at"] is not None
    assert (daily["next_run_at"].hour, daily["next_run_at"].minute) == (2, 0)
    connection.close()
    agent.close()


def test_work_queued_by_procedures_starts_within_the_poll_interval(control_url):
    agent = make_agent(control_url, AGENT_POLL_SECONDS="1", AGENT_TICK_SCHEDULE="0 0 0 1 1 *")
    connection = connect(control_url)
    execute(agent, "CREATE TABLE prompt (label VARCHAR(20))")
    runner = LocalRunner(agent, concurrency=2)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.5)
        warm_up(agent, connection, "prompt", workers=2)
        queued = time.monotonic()
        call(connection, "exec_async", sql="INSERT INTO prompt (label) VALUES ('task')")
        assert wait_until(lambda: query(agent, "SELECT COUNT(*) FROM prompt WHERE label = 'task'") == [(1,)], 10)
        assert time.monotonic() - queued < 2.0
        defined = time.monotonic()
        # overlap 'allow': with the default 'skip', a start_job that lands while one of the
        # every-second slots is in flight is (rightly) recorded skipped; here only promptness counts.
        call(connection, "add_scheduled_job", name="every_second", schedule="* * * * * *",
             sql="INSERT INTO prompt (label) VALUES ('job')", overlap="allow")
        assert wait_until(lambda: query(agent, "SELECT COUNT(*) FROM prompt WHERE label = 'job'") != [(0,)], 10)
        assert time.monotonic() - defined < 1 + 1 + 1.0      # the poll, the first slot, a little
        stopped = time.monotonic()
        (started,) = call(connection, "start_job", job_name="every_second")
        assert started["status"] == "pending", started
        assert wait_until(lambda: any(r["job_name"] == "every_second" and r["kind"] == "manual"
                                      and r["outcome"] == "succeeded"
                                      for r in select(connection, "SELECT * FROM agent.job_history")), 10)
        assert time.monotonic() - stopped < 2.0
    finally:
        runner.stop()
        thread.join(timeout=30)
        connection.close()
        agent.close()


def test_a_doorbell_plans_and_dispatches_a_procedure_defined_job(control_url):
    queue = MemoryQueue()
    agent = make_agent(control_url, queue=queue)
    connection = connect(control_url)
    try:
        execute(agent, "CREATE TABLE rung (x INT)")
        call(connection, "add_scheduled_job", name="soon", run_at=datetime.now(UTC),
             sql="INSERT INTO rung (x) VALUES (1)")
        assert queue.run_messages() == 0
        from shared.messaging.messages import DoorbellMessage

        result = agent.handle_message(DoorbellMessage(period=1).to_json(), 1, "bell")
        assert result.outcome == "doorbell" and queue.run_messages() == 1
        assert job_row(agent, "soon")["needs_planning"] == 0
        work(agent)
        assert query(agent, "SELECT x FROM rung") == [(1,)]
    finally:
        connection.close()
        agent.close()


def test_a_running_run_stopped_by_stop_job_ends_at_its_workers_next_lease_renewal(pg_url):
    agent = make_agent(pg_url, AGENT_POLL_SECONDS="1", AGENT_TICK_SCHEDULE="0 0 0 1 1 *")
    connection = connect(pg_url)
    runner = LocalRunner(agent, concurrency=1)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        call(connection, "add_scheduled_job", name="slow", run_at=datetime.now(UTC), lease_seconds=6,
             sql="SELECT pg_sleep(60)")
        assert wait_until(lambda: any(r["running_run_id"] for r in select(
            connection, "SELECT * FROM agent.job_activity WHERE job_name = 'slow'")), 10)
        (activity,) = select(connection, "SELECT * FROM agent.job_activity WHERE job_name = 'slow'")
        assert activity["state"] == "running" and activity["running_worker"] and activity["running_since"]
        stopped = time.monotonic()
        (cancelled,) = call(connection, "stop_job", job_name="slow")
        assert cancelled["cancelled_run_id"] == activity["running_run_id"]
        # The renewal (every third of the 6 s lease) finds the run gone and stops the work.
        assert wait_until(lambda: [r["outcome"] for r in select(
            connection, f"SELECT outcome FROM agent.job_history WHERE run_id = {activity['running_run_id']}")]
            not in ([], ["running"]), 10)
        assert time.monotonic() - stopped < 2 + 2.0
        assert run_row(agent, activity["running_run_id"])["status"] == "cancelled"
    finally:
        runner.stop()
        thread.join(timeout=30)
        connection.close()
        agent.close()


# ---------------------------------------------------------------- 7. least privilege (PostgreSQL roles)


def test_an_operator_calls_every_procedure_reads_every_view_and_touches_no_table(pg_url, capsys):
    import pyodbc

    agent = make_agent(pg_url)
    operator = f"op_{uuid.uuid4().hex[:10]}"
    outsider = f"out_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{operator}" LOGIN')
    admin.cursor().execute(f'CREATE ROLE "{outsider}" LOGIN')
    try:
        run_cli(pg_url, "grant-sql", "--operator", operator, "--apply", capsys=capsys)
        as_operator = pyodbc.connect(pg_url.replace("Uid=root;", f"Uid={operator};"), autocommit=True, timeout=10)
        (task,) = call(as_operator, "exec_async", sql="SELECT 1", execution_order=None)
        call(as_operator, "add_scheduled_job", name="opjob", sql="SELECT 1", schedule="0 0 4 * * *")
        call(as_operator, "enable_job", name="opjob", enabled=0)
        call(as_operator, "enable_job", name="opjob", enabled=1)
        (started,) = call(as_operator, "start_job", job_name="opjob")
        assert call(as_operator, "stop_job", job_name="opjob") == [{"cancelled_run_id": started["run_id"]}]
        call(as_operator, "cancel_run", run_id=task["run_id"])
        now = datetime.now(UTC)
        (poisoned,) = call(as_operator, "exec_async", sql="SELECT 2", execution_order=None)
        claimed = [r for r in agent.store().execute("claim_runs", now=now + timedelta(seconds=5), late_cutoff=now,
                                                    batch=1, max_concurrency=5, worker="w").rows
                   if r["decision"] == "start"][0]
        agent.store().execute("poison_run", run_id=poisoned["run_id"], token=claimed["token"], now=now, reason="x",
                              error_number=None, error_sqlstate=None, error_message="x")
        poison_id = agent.store().execute("insert_poison", run_id=poisoned["run_id"], message_id="m", body="{}",
                                          dequeue_count=5, reason="x", errors="[]", now=now).one()["poison_id"]
        assert call(as_operator, "requeue_poison", poison_id=poison_id) == [{"requeued_run_id": poisoned["run_id"]}]
        call(as_operator, "remove_scheduled_job", name="opjob")
        for view in ("job_activity", "job_history", "poison_list", "stuck_runs"):
            select(as_operator, f"SELECT * FROM agent.{view}")
        for statement in ("SELECT * FROM agent.runs", "INSERT INTO agent.jobs (job_name) VALUES ('x')",
                          "UPDATE agent.runs SET status = 'cancelled'", "DELETE FROM agent.attempts",
                          "SELECT * FROM agent.claim_runs(now()::timestamp, now()::timestamp, 1, 1, 'w')"):
            with pytest.raises(CallError) as caught:
                select(as_operator, statement)
            assert caught.value.code == "42501", (statement, caught.value)        # insufficient privilege
        as_operator.close()
        as_outsider = pyodbc.connect(pg_url.replace("Uid=root;", f"Uid={outsider};"), autocommit=True, timeout=10)
        with pytest.raises(CallError) as caught:
            call(as_outsider, "exec_async", sql="SELECT 1")
        assert caught.value.code == "42501"
        with pytest.raises(CallError):
            select(as_outsider, "SELECT * FROM agent.job_activity")
        as_outsider.close()
    finally:
        agent.close()
        admin.close()
        # The roles' grants live in the test database, which pg_url drops after the test; the
        # roles (cluster-wide) go at the end of the module.
        _drop_roles_later.extend([operator, outsider])


_drop_roles_later: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _drop_login_roles():
    yield
    if not _drop_roles_later:
        return
    admin = pg_admin_connection()
    try:
        for role in _drop_roles_later:
            admin.cursor().execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        admin.close()


# ---------------------------------------------------------------- no database: the two dialects agree


def _migration_text(dialect: str) -> str:
    """The interface as it stands: its migration, then each later statement that redefines,
    drops, grants or revokes one of its procedures (0006 gave agent.add_scheduled_job @targets;
    a later definition follows the earlier one, so the last one read wins)."""
    import re

    from shared.control.queries import load_migrations

    migrations = load_migrations(dialect)
    (first,) = [i for i, m in enumerate(migrations) if m.path.name.endswith("_tsql_interface.sql")]
    texts = [migrations[first].path.read_text(encoding="utf-8")]
    interface = re.compile(r"^(?:(?:CREATE (?:OR (?:REPLACE|ALTER) )?|ALTER )(?:FUNCTION|PROCEDURE|VIEW)|DROP FUNCTION"
                           r"|GRANT|REVOKE)\b[^(]*?\bagent\.(\w+)", re.M)
    for migration in migrations[first + 1:]:
        for statement in migration.statements():
            code = "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))
            match = interface.search(code)
            if match and match.group(1) in PROCEDURES | VIEWS:
                # A T-SQL module runs to the next GO line (shared/control/queries.py).
                whole_batch = code.rstrip().endswith("END") or code.lstrip().startswith("CREATE VIEW")
                texts.append(code + "\nGO" if dialect == "mssql" and whole_batch else code)
    return "\n\n".join(texts)


def _normal_default(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    if text.upper() == "NULL":
        return "NULL"
    if text.upper().startswith("N'"):
        text = text[1:]
    return text.strip("'")


def postgres_functions() -> dict[str, dict]:
    """{name: {"parameters": [(name, default)], "columns": [...]}} of the migration's functions."""
    import re

    found = {}
    pattern = re.compile(r"CREATE (?:OR REPLACE )?FUNCTION agent\.(\w+)\((.*?)\)\s*RETURNS TABLE \((.*?)\)", re.S)
    for name, params, columns in pattern.findall(_migration_text("postgres")):
        parameters = []
        for param in [p.strip() for p in params.split(",") if p.strip()]:
            head, _, default = param.partition(" DEFAULT ")
            parameters.append((head.split()[0].strip('"'), _normal_default(default) if default else None))
        found[name] = {"parameters": parameters, "columns": [c.split()[0] for c in columns.split(",")]}
    return found


def tsql_procedures() -> dict[str, dict]:
    import re

    from shared.control.queries import split_statements

    found = {}
    for statement in split_statements(_migration_text("mssql"), tsql=True):
        match = re.search(r"(?:CREATE|ALTER) PROCEDURE agent\.(\w+)\s*(.*?)\nAS\nBEGIN\n(.*)\nEND$", statement, re.S)
        if not match:
            continue
        name, params, body = match.groups()
        parameters = []
        for param in [p.strip() for p in params.split(",\n") if p.strip()]:
            if param.endswith(" OUTPUT"):
                continue                      # @run_id OUTPUT: SQL Server only (documented)
            head, _, default = param.partition(" = ")
            parameters.append((head.split()[0].lstrip("@"), _normal_default(default) if default else None))
        if f"EXEC agent.{name}_unaudited " in body:
            # The audit's wrapper (migration 0019): the result is its unaudited procedure's, passed on.
            found[name] = {"parameters": parameters, "columns": found[name]["columns"]}
            continue
        last_select = body.rsplit("\n    SELECT ", 1)[1].split(";")[0].split(" FROM ")[0]
        columns = [item.split(" AS ")[-1].split(".")[-1].strip() for item in last_select.split(",")]
        found[name] = {"parameters": parameters, "columns": columns}
    return found


PROCEDURES = {"exec_async", "add_scheduled_job", "remove_scheduled_job", "enable_job", "start_job", "stop_job",
              "cancel_run", "requeue_poison", "pause_job", "resume_job"}
VIEWS = {"job_activity", "job_history", "poison_list", "stuck_runs"}


def test_procedures_have_the_same_names_parameters_defaults_and_results_in_both_dialects():
    postgres, tsql = postgres_functions(), tsql_procedures()
    assert set(postgres) == set(tsql) == PROCEDURES
    for name in PROCEDURES:
        assert postgres[name] == tsql[name], name
    assert postgres["exec_async"]["parameters"][:4] == [("sql", None), ("execution_order", "0"),
                                                        ("database", "NULL"), ("run_at", "NULL")]


def _view_columns(dialect: str) -> dict[str, list[str]]:
    import sqlglot
    from sqlglot import exp

    from shared.control.queries import split_statements

    read = {"postgres": "postgres", "mssql": "tsql"}[dialect]
    views = {}
    for statement in split_statements(_migration_text(dialect), tsql=dialect == "mssql"):
        code = "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))
        if "VIEW agent." not in code:
            continue
        tree = sqlglot.parse_one(code, read=read)
        assert isinstance(tree, exp.Create) and tree.kind == "VIEW", code
        select = tree.expression
        while isinstance(select, exp.Union):
            select = select.this
        views[tree.this.name] = [column.alias_or_name.lower() for column in select.selects]
    return views


def test_views_have_the_same_columns_in_both_dialects():
    postgres, tsql = _view_columns("postgres"), _view_columns("mssql")
    assert set(postgres) == VIEWS
    assert postgres == tsql
    assert {"job_name", "defined_in", "state", "next_run_at", "running_since", "running_worker", "last_outcome",
            "last_finished_at"} <= set(postgres["job_activity"])
    assert {"run_id", "attempt", "job_name", "scheduled_for", "started_at", "finished_at", "duration_ms", "outcome",
            "error_number", "error_message"} <= set(postgres["job_history"])


def test_the_operator_role_gets_execute_on_every_procedure_select_on_every_view_and_nothing_else():
    import re

    for dialect in ("postgres", "mssql"):
        text = _migration_text(dialect)
        grants = re.findall(r"^GRANT (.+) TO agent_operator;$", text, re.M)
        executes = {re.search(r"agent\.(\w+)", g).group(1) for g in grants if g.startswith("EXECUTE")}
        selects = {re.search(r"agent\.(\w+)", g).group(1) for g in grants if g.startswith("SELECT")}
        others = [g for g in grants if not g.startswith(("EXECUTE", "SELECT"))]
        assert executes == PROCEDURES and selects == VIEWS, dialect
        assert others == (["USAGE ON SCHEMA agent"] if dialect == "postgres" else []), (dialect, others)
        assert not re.search(r"ALTER ROLE|GRANT .* ON SCHEMA::|INSERT|db_owner", "\n".join(grants))
    postgres = _migration_text("postgres")
    revoked = set(re.findall(r"^REVOKE ALL ON FUNCTION agent\.(\w+)\(.*\) FROM PUBLIC;$", postgres, re.M))
    assert revoked == PROCEDURES
    # Every function runs as its owner with a pinned search_path; none builds SQL from text.
    latest = dict(re.findall(r"CREATE (?:OR REPLACE )?FUNCTION agent\.(\w+)(\(.*?\n\$\$;)", postgres, re.S))
    assert set(latest) == PROCEDURES
    for definition in latest.values():
        assert "SECURITY DEFINER SET search_path = pg_catalog, pg_temp" in definition
        assert "EXECUTE " not in definition.upper().replace("GRANT EXECUTE", "")
    tsql = _migration_text("mssql")
    assert "sp_executesql" not in tsql and "EXEC (" not in tsql and "EXEC(" not in tsql


def test_tsql_modules_are_whole_batches_and_sqlfluff_catches_a_broken_one():
    import re

    from sqlfluff.core import FluffConfig, Linter

    from shared.control.queries import split_statements

    module = re.compile(r"^(?:CREATE|ALTER) (?:PROCEDURE|VIEW) agent\.(\w+)", re.M)
    modules = [s for s in split_statements(_migration_text("mssql"), tsql=True) if module.search(s)]
    # One batch per module (a procedure redefined by a later migration is a batch of its own too,
    # with ALTER PROCEDURE: Babelfish refuses CREATE OR ALTER).
    names = [module.search(m).group(1) for m in modules]
    assert set(names) == PROCEDURES | VIEWS and all(len(module.findall(s)) == 1 for s in modules)
    assert not any("OR ALTER" in m for m in modules)
    linter = Linter(config=FluffConfig(overrides={"dialect": "tsql", "large_file_skip_byte_limit": 0}))

    def parses(sql: str) -> bool:
        parsed = linter.parse_string(sql)
        return not parsed.violations and parsed.tree is not None and "unparsable" not in parsed.tree.stringify()

    # The body (the audit's wrapper of migration 0019, which calls it, is checked in test_audit.py).
    procedure = [m for m in modules if "PROCEDURE agent.add_scheduled_job" in m and "_unaudited" not in m][-1]
    assert procedure.rstrip().endswith("END") and procedure.count("THROW 514") >= 18
    assert parses(procedure)
    assert not parses(procedure.replace("IF @enabled IS NULL OR", "IF @enabled IS NULL OR OR", 1))
    assert not parses(procedure.replace("    COMMIT TRANSACTION;", "    COMMIT TRANSACTION;\n    END;", 1))


def test_the_splitter_keeps_a_tsql_module_whole_until_go():
    from shared.control.queries import split_statements

    text = ("-- a comment\nCREATE OR ALTER PROCEDURE agent.p @a INT = 0\nAS\nBEGIN\n    SELECT 1;\n    SELECT 2;\nEND\n"
            "GO\n-- only a comment\nGO\nCREATE OR ALTER VIEW agent.v AS\nSELECT 1 AS one\nGO\n"
            "SELECT 3;\nCREATE VIEW agent.w AS SELECT 4 AS four;\nSELECT 5;\n")
    statements = split_statements(text)
    assert statements == [
        "-- a comment\nCREATE OR ALTER PROCEDURE agent.p @a INT = 0\nAS\nBEGIN\n    SELECT 1;\n    SELECT 2;\nEND",
        "CREATE OR ALTER VIEW agent.v AS\nSELECT 1 AS one",
        "SELECT 3;", "CREATE VIEW agent.w AS SELECT 4 AS four;", "SELECT 5;"]
    # In T-SQL text a plain CREATE or ALTER of a module starts one too (what Babelfish accepts);
    # elsewhere it is an ordinary statement.
    tsql = "CREATE PROCEDURE agent.p\nAS\nBEGIN\n    SELECT 1;\nEND\nGO\nALTER PROCEDURE agent.p\nAS\nBEGIN\n    SELECT 2;\nEND\nGO\nSELECT 3;\n"
    assert split_statements(tsql, tsql=True) == [
        "CREATE PROCEDURE agent.p\nAS\nBEGIN\n    SELECT 1;\nEND", "ALTER PROCEDURE agent.p\nAS\nBEGIN\n    SELECT 2;\nEND",
        "SELECT 3;"]
    assert split_statements("CREATE VIEW v AS SELECT 1;\nSELECT 2;", tsql=False) == ["CREATE VIEW v AS SELECT 1;", "SELECT 2;"]
    # PostgreSQL's $$ bodies are untouched by the rule.
    assert len(split_statements("CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $$\nSELECT 1;\n$$;\nSELECT 2;")) == 2


def test_sqlite_gets_the_same_migration_and_no_procedures():
    from shared.control.queries import load_migrations

    numbers = {d: [m.version for m in load_migrations(d) if m.path.name.endswith("_tsql_interface.sql")]
               for d in ("sqlite", "postgres", "mssql")}
    assert numbers["sqlite"] == numbers["postgres"] == numbers["mssql"] and len(numbers["sqlite"]) == 1
    text = _migration_text("sqlite").upper()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    assert "PROCEDURE" not in code and "FUNCTION" not in code and "VIEW" not in code and "ROLE" not in code


TRICKY_PRINCIPALS = ["ops-team", 'a"b; DROP ROLE x; --', "c]; DROP USER y; --", "it's", "Ünïcode 名前", "z" * 128]


def _check_postgres_operator_grants(principal: str) -> None:
    """PostgreSQL's two GRANTs name the principal as one quoted identifier; the rest of the script
    (one transaction, the role's check) is the same for every name but its one E'' literal."""
    from sqlglot.dialects.postgres import Postgres

    from shared.ops.grants import operator_sql, quote_pg_literal

    code = [line for line in operator_sql(principal, dialect="postgres").splitlines() if not line.startswith("--")]
    grants = [line for line in code if line.startswith("GRANT ")]
    assert len(grants) == 2 and code[0] == "BEGIN;" and code[-1] == "COMMIT;", code
    assert f"SELECT set_config('agent.grant_login', {quote_pg_literal(principal)}, true);" in code
    tokens = [(t.token_type.name, t.text) for t in Postgres().tokenize(grants[0])]
    assert [t[1].upper() for t in tokens[:3]] == ["GRANT", "AGENT_OPERATOR", "TO"]
    assert tokens[3:] == [("IDENTIFIER", principal), ("SEMICOLON", ";")]
    # The agent's login becomes a member of the operator's role (it runs the operator's jobs as it).
    tokens = [(t.token_type.name, t.text) for t in Postgres().tokenize(grants[1])]
    assert tokens[:2] == [("GRANT", "GRANT"), ("IDENTIFIER", principal)] and tokens[2][1].upper() == "TO"
    assert tokens[3][1].upper() == "SESSION_USER" and tokens[4:] == [("SEMICOLON", ";")]
    app_grants = [line for line in operator_sql(principal, dialect="postgres", app=principal).splitlines()
                  if line.startswith("GRANT ")]
    assert [(t.token_type.name, t.text) for t in Postgres().tokenize(app_grants[1])][3:] == [
        ("IDENTIFIER", principal), ("SEMICOLON", ";")]


@pytest.mark.parametrize("principal", TRICKY_PRINCIPALS)
def test_grant_sql_operator_quotes_every_name(principal):
    from sqlglot.dialects.tsql import TSQL

    from shared.errors import UsageError
    from shared.ops.grants import operator_sql

    if len(principal.encode("utf-8")) > 63:      # PostgreSQL would cut it to another role's name
        with pytest.raises(UsageError, match="63 bytes"):
            operator_sql(principal, dialect="postgres")
    else:
        _check_postgres_operator_grants(principal)
    app_code = [line for line in operator_sql(principal, dialect="mssql", app=principal).splitlines()
                if not line.startswith("--")]
    tokens = [(t.token_type.name, t.text) for t in TSQL().tokenize(app_code[2])]
    assert [t[1].upper() for t in tokens[:3]] == ["GRANT", "IMPERSONATE", "ON"]
    assert [t for t in tokens if t[0] == "IDENTIFIER"][-2:] == [("IDENTIFIER", principal), ("IDENTIFIER", principal)]
    code = [line for line in operator_sql(principal, dialect="mssql").splitlines() if not line.startswith("--")]
    assert len(code) == 2
    tokens = [(t.token_type.name, t.text) for t in TSQL().tokenize(code[1])]
    assert [t[1].upper() for t in tokens[:5]] == ["ALTER", "ROLE", "AGENT_OPERATOR", "ADD", "MEMBER"]
    assert tokens[5:] == [("IDENTIFIER", principal), ("SEMICOLON", ";")]
    tokens = [(t.token_type.name, t.text) for t in TSQL().tokenize(code[0])]
    assert [t for t in tokens if t[0] in ("IDENTIFIER", "NATIONAL_STRING")] == [
        ("NATIONAL_STRING", principal), ("IDENTIFIER", principal)]
    assert [t[1].upper() for t in tokens[-4:]] == ["FROM", "EXTERNAL", "PROVIDER", ";"]


def test_grant_sql_operator_prints_the_warning_and_refuses_to_apply_to_sqlite(tmp_path, capsys):
    from shared.ops.grants import OPERATOR_WARNING

    code = cli(["--db", f"sqlite:///{tmp_path / 'a.db'}", "grant-sql", "--operator", "ops"])
    captured = capsys.readouterr()
    assert code == 0 and "ALTER ROLE [agent_operator] ADD MEMBER [ops];" in captured.out
    assert OPERATOR_WARNING in captured.err and "AGENT_JOB_PRINCIPAL" in captured.err
    code = cli(["--db", f"sqlite:///{tmp_path / 'a.db'}", "grant-sql", "--operator", "ops", "--apply"])
    captured = capsys.readouterr()
    assert code != 0 and "SQLite has no roles or procedures" in captured.err
    code = cli(["--db", f"sqlite:///{tmp_path / 'a.db'}", "grant-sql", "--operator", "ops", "--job-principal", "j"])
    captured = capsys.readouterr()
    assert code == 2 and "takes no --job-database" in captured.err and not captured.out
    code = cli(["--db", f"sqlite:///{tmp_path / 'a.db'}", "grant-sql", "--operator", "ops", "--app-name", "app"])
    captured = capsys.readouterr()
    assert code == 0 and "GRANT IMPERSONATE ON USER::[ops] TO [app];" in captured.out


def test_catchup_seconds_from_the_procedure_is_stored_shown_and_audited_as_the_setting(system, capsys):
    """agent.add_scheduled_job's @catchup_seconds (migration 0024) is JOB__<name>__CATCHUP_SECONDS:
    stored on the job, audited with the call, shown by `jobs`, `jobs --json` and the monitor's
    JSON; a redefinition without it removes the window."""
    build, connection, url = system
    agent = build({"twin": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1", "CATCHUP_SECONDS": "3600",
                            "OVERLAP": "queue"}})
    call(connection, "add_scheduled_job", name="dbtwin", sql="SELECT 1", schedule="0 0 * * * *",
         overlap="queue", catchup_seconds=3600)
    agent.tick()
    rows = {r["job_name"]: r for r in select(connection, "SELECT job_name, catchup_seconds, valid FROM agent.jobs")}
    assert rows["dbtwin"]["catchup_seconds"] == rows["twin"]["catchup_seconds"] == 3600
    assert rows["dbtwin"]["valid"] == 1
    (audited,) = [r for r in select(connection, "SELECT job_name, action, arguments FROM agent.audit")
                  if r["job_name"] == "dbtwin" and r["action"] == "define"]
    arguments = audited["arguments"] if isinstance(audited["arguments"], dict) else json.loads(audited["arguments"])
    assert arguments["catchup_seconds"] == 3600
    code = cli(["--db", url, "--json", "jobs"])
    shown = {r["job_name"]: r for r in json.loads(capsys.readouterr().out)}
    assert code == 0 and shown["dbtwin"]["catchup_seconds"] == shown["twin"]["catchup_seconds"] == 3600
    code = cli(["--db", url, "jobs"])
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if line.startswith("dbtwin "))
    assert code == 0 and "catch-up 3600 s" in line, table
    # The monitor: the jobs page and the job page under the schedule, and both JSON twins.
    import contextlib

    from shared.web.app import Monitor, MonitorSettings

    @contextlib.contextmanager
    def lend():
        store = agent.new_store()
        try:
            yield store
        finally:
            store.close()

    monitor = Monitor(lend, clock=lambda: datetime.now(UTC), settings=lambda: MonitorSettings())
    listing = monitor.handle("GET", "/jobs", "", "").body.decode()
    row = listing[listing.index('id="job-dbtwin"'):]
    assert '<div class="catchup">catch-up 3600 s</div>' in row[:row.index("</tr>")]
    assert '<div class="catchup">catch-up 3600 s</div>' in monitor.handle("GET", "/jobs/dbtwin", "", "").body.decode()
    document = json.loads(monitor.handle("GET", "/jobs/dbtwin", "format=json", "").body)
    assert document["job"]["catchup_seconds"] == 3600
    listed = {r["job_name"]: r for r in json.loads(monitor.handle("GET", "/jobs", "format=json", "").body)}
    assert listed["dbtwin"]["catchup_seconds"] == 3600
    # Redefined without it: no window, and `jobs` says nothing of one.
    call(connection, "add_scheduled_job", name="dbtwin", sql="SELECT 1", schedule="0 0 * * * *", overlap="queue")
    assert select(connection, "SELECT catchup_seconds FROM agent.jobs WHERE job_name = 'dbtwin'")[0]["catchup_seconds"] == 0
    cli(["--db", url, "jobs"])
    table = capsys.readouterr().out
    line = next(line for line in table.splitlines() if line.startswith("dbtwin "))
    assert "catch-up" not in line, table
    assert 'class="catchup"' not in monitor.handle("GET", "/jobs/dbtwin", "", "").body.decode()


@pytest.mark.parametrize("arguments, expected", [
    ({"catchup_seconds": -1}, "@catchup_seconds = -1: expected a whole number from 0 to 31622400"),
    ({"catchup_seconds": 31622401, "grace_seconds": 31622400},
     "@catchup_seconds = 31622401: expected a whole number from 0 to 31622400"),
    ({"catchup_seconds": None}, "@catchup_seconds = NULL: expected a whole number from 0 to 31622400"),
    ({"catchup_seconds": 3600, "schedule": None}, "@catchup_seconds = 3600: expected 0 for a job without a @schedule"),
    ({"catchup_seconds": 3600, "misfire": "Skip"}, "@catchup_seconds = 3600 and @misfire = 'skip' conflict"),
    ({"catchup_seconds": 7200, "grace_seconds": 3600}, "@catchup_seconds = 7200: expected at most @grace_seconds = 3600"),
    ({"catchup_seconds": 3600, "overlap": None}, "@overlap = NULL: expected skip, queue"),
    ({"catchup_seconds": 3600, "overlap": "skip"}, "@catchup_seconds = 3600 and @overlap = 'skip' conflict"),
    ({"catchup_seconds": 3600, "overlap": "Cancel-Previous"},
     "@catchup_seconds = 3600 and @overlap = 'cancel-previous' conflict"),
])
def test_bad_catchup_seconds_from_the_procedure_is_refused_naming_the_arguments(system, arguments, expected):
    build, connection, url = system
    build()
    given = {"name": "bad", "sql": "SELECT 1", "schedule": "0 0 * * * *", "overlap": "queue", **arguments}
    if given["schedule"] is None:
        del given["schedule"]
    with pytest.raises(CallError) as caught:
        call(connection, "add_scheduled_job", **given)
    assert caught.value.code == BAD_ARGUMENT[dialect(url)]
    assert expected in caught.value.message, caught.value.message
    assert select(connection, "SELECT job_name FROM agent.jobs WHERE job_name = 'bad'") == []


@pytest.mark.parametrize("overlap", ["queue", "allow", "buffer-one"])
def test_catchup_seconds_from_the_procedure_accepts_the_overlaps_that_run_every_slot(system, overlap):
    build, connection, url = system
    build()
    call(connection, "add_scheduled_job", name="ok", sql="SELECT 1", schedule="0 0 * * * *", overlap=overlap,
         catchup_seconds=86400, grace_seconds=86400)
    assert select(connection, "SELECT catchup_seconds FROM agent.jobs WHERE job_name = 'ok'")[0]["catchup_seconds"] == 86400
