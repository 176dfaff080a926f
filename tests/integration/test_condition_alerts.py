"""Condition alerts (issue 32 item 3), as sp_add_alert, on SQLite and PostgreSQL in simulated time:
a probe (ALERT__<name>__QUERY on its own schedule) whose rows are the alert, and an ERRORS alert
(error numbers / SQLSTATEs / severities of any run's failure since the last check); each answers
once per DELAY_BETWEEN_RESPONSES_SECONDS however often the tick comes, by a notification through
the outbox and/or a run of RESPONSE_JOB (run-now, audited); a probe that fails is an alert error
(notified once, never the tick's error); a bad alert stops only itself; removal; the quiet horizon."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import jsonschema
import pytest

from shared.engine import quiet
from shared.jobs.alert_definitions import parse_alerts
from shared.messaging.memory import MemoryQueue
from tests.integration.test_alerts import deliver, fail, start
from tests.integration.test_notifications import Receiver, Silent, notifications_table
from tests.support.harness import at, execute, query

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/notification.schema.json").read_text())
HOURLY = "0 0 * * * *"
EVERY_MINUTE = "0 * * * * *"
T0 = at("2026-03-02T10:00:30")


@pytest.fixture
def receiver():
    server = Receiver()
    yield server
    server.close()


def build(agent_factory, receiver, alerts, jobs=None, **settings):
    env = {f"ALERT__{name}__{key}": value for name, alert in alerts.items() for key, value in alert.items()}
    jobs = {name: {"LEASE_SECONDS": "3600", **job} for name, job in (jobs or {}).items()}
    agent = agent_factory(jobs, queue=MemoryQueue(), AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok", **env, **settings)
    agent._notifier = Silent()
    return agent


def table(agent, name):
    return f"agent_{name}" if agent.target.dialect == "sqlite" else f"agent.{name}"


def condition_notifications(agent):
    rows = query(agent, f"SELECT run_id, job_name, kind, outcome, detail, status FROM {notifications_table(agent)} "
                        "WHERE kind IN ('condition', 'errors', 'alert_error') ORDER BY notification_id")
    return [(job, kind, status, json.loads(detail)) for _, job, kind, _, detail, status in rows]


def tick_every_minute(agent, start_at, minutes):
    reports = []
    for minute in range(minutes):
        report = agent.tick(start_at + timedelta(minutes=minute))
        assert not report.errors, report.errors
        reports.append(report)
    return reports


def test_a_probe_fires_once_per_delay_window_with_its_rows(agent_factory, db_url, receiver):
    agent = build(agent_factory, receiver, {
        "backlog": {"QUERY": "SELECT id, state FROM alert_src WHERE state = 'stuck' ORDER BY id",
                    "SCHEDULE": EVERY_MINUTE, "DELAY_BETWEEN_RESPONSES_SECONDS": "600"}})
    execute(agent, "CREATE TABLE alert_src (id INT, state VARCHAR(20))")
    # No row: no alert, however often it is checked.
    reports = tick_every_minute(agent, T0, 5)
    assert sum(len(r.condition_alerts_checked) for r in reports) == 4      # its first slot, then each minute
    assert not condition_notifications(agent)
    execute(agent, "INSERT INTO alert_src VALUES (1, 'stuck'), (2, 'fine'), (3, 'stuck')")
    reports = tick_every_minute(agent, T0 + timedelta(minutes=5), 15)        # 15 checks, a 10-minute delay
    raised = [f for r in reports for f in r.condition_alerts]
    assert [(f["alert_name"], f["kind"]) for f in raised] == [("backlog", "condition"), ("backlog", "condition")]
    sent = condition_notifications(agent)
    assert [(job, kind, status) for job, kind, status, _ in sent] == [("backlog", "condition", "pending")] * 2
    body = sent[0][3]
    assert body["rows"] == [{"id": 1, "state": "stuck"}, {"id": 3, "state": "stuck"}]
    assert body["row_count"] == 2 and body["rows_cut"] is None and body["alert"] == "backlog"
    (state,) = [r for r in agent.store().execute("list_alerts").rows]
    assert state["occurrences"] == 15 and state["responses"] == 2 and state["valid"] == 1
    # The webhook gets the body, and it matches the schema.
    deliver(agent, T0 + timedelta(hours=1))
    assert len(receiver.received) == 2
    for _, posted in receiver.received:
        jsonschema.validate(posted, SCHEMA)
        assert posted["kind"] == "condition" and posted["firing_id"] >= 1


def test_errors_alert_fires_on_a_matching_failure_once_per_window(agent_factory, db_url, receiver):
    slot = at("2026-03-02T10:00:00")
    agent = build(agent_factory, receiver,
                  {"bad_table": {"ERRORS": "208, 1205", "DELAY_BETWEEN_RESPONSES_SECONDS": "3600"},
                   "deadlocks": {"ERRORS": "sqlstate=40P01"},
                   "everything": {"ERRORS": "severity>=16", "DELAY_BETWEEN_RESPONSES_SECONDS": "0"}},
                  jobs={"etl": {"SCHEDULE": "0 */10 * * * *", "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1"}})
    agent.tick(slot - timedelta(seconds=30))
    raised = []
    for minute in range(0, 30, 10):          # three slots, each failing with error 208 (42P01)
        moment = slot + timedelta(minutes=minute)
        agent.tick(moment - timedelta(seconds=5))
        start(agent, "etl", moment)
        fail(agent, "etl", moment, moment + timedelta(seconds=2))
        for seconds in (10, 70, 130):
            report = agent.tick(moment + timedelta(seconds=seconds))
            assert not report.errors, report.errors
            raised += [(f["alert_name"], f["kind"]) for f in report.condition_alerts]
    # 208 once in the hour's window; severity>=16 (delay 0) at each failure; 40P01 never.
    assert raised == [("bad_table", "errors"), ("everything", "errors"), ("everything", "errors"),
                      ("everything", "errors")]
    bodies = [body for job, _, _, body in condition_notifications(agent) if job == "bad_table"]
    (body,) = bodies
    assert body["failures"][0]["job"] == "etl" and body["failures"][0]["error_number"] == 208
    assert body["failure_count"] == 1 and body["condition"] == "208, 1205"
    jsonschema.validate({**body, "firing_id": 1}, SCHEMA)


def test_a_response_job_runs_audited_and_its_own_failure_does_not_start_it_again(
        agent_factory, db_url, receiver):
    # The response job fails with the very error the alert watches: the delay bounds the loop.
    agent = build(agent_factory, receiver,
                  {"fix": {"ERRORS": "208", "RESPONSE_JOB": "repair", "NOTIFY": "false",
                           "DELAY_BETWEEN_RESPONSES_SECONDS": "0"}},
                  jobs={"repair": {"SCHEDULE": "", "COMMAND": "SELECT * FROM no_such_table", "MAX_ATTEMPTS": "1"},
                        "etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1"}})
    slot = at("2026-03-02T10:00:00")
    agent.tick(slot - timedelta(seconds=30))
    start(agent, "etl", slot)
    fail(agent, "etl", slot, slot + timedelta(seconds=1))
    started = []
    for minute in range(1, 21):
        now = slot + timedelta(minutes=minute)
        report = agent.tick(now)
        assert not report.errors, report.errors
        started += [f["response_run_id"] for f in report.condition_alerts if f["response_run_id"]]
        # Each response run fails at once with error 208, as the repair job would.
        for run in agent.store().execute("list_history", job_name="repair", limit=100).rows:
            if run["status"] in ("pending", "queued"):
                (row,) = agent.store().execute("start_run", run_id=run["run_id"], token=run["token"], now=now,
                                               worker="w", dequeue_count=1, max_concurrency=100,
                                               late_cutoff=now - timedelta(seconds=120)).rows
                agent.store().execute("fail_run", run_id=run["run_id"], token=run["token"], now=now, retry_at=now,
                                      outcome="failed", error_number=208, error_sqlstate="42P01",
                                      error_message="no_such_table")
    # Even with no delay, its own response's failure does not trigger it again: one run, not one a tick.
    assert len(started) == 1
    # Another failure of the job it watches does.
    moment = slot + timedelta(hours=1)
    agent.tick(moment - timedelta(seconds=5))
    start(agent, "etl", moment)
    fail(agent, "etl", moment, moment + timedelta(seconds=1))
    report = agent.tick(moment + timedelta(minutes=1))
    started += [f["response_run_id"] for f in report.condition_alerts if f["response_run_id"]]
    assert len(started) == 2
    audit = query(agent, f"SELECT source, action, job_name, principal, outcome FROM {table(agent, 'audit')} "
                         "ORDER BY audit_id")
    assert audit == [("alert", "run-now", "repair", "alert:fix", "done")] * 2
    assert not condition_notifications(agent)          # NOTIFY=false: a job only


def test_a_probe_that_fails_is_an_alert_error_once_and_never_the_ticks(agent_factory, db_url, receiver):
    agent = build(agent_factory, receiver, {
        "broken": {"QUERY": "SELECT * FROM no_such_table", "SCHEDULE": EVERY_MINUTE},
        "fine": {"QUERY": "SELECT 1 AS one", "SCHEDULE": EVERY_MINUTE, "DELAY_BETWEEN_RESPONSES_SECONDS": "0"}},
        jobs={"etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1"}})
    reports = tick_every_minute(agent, T0, 6)
    warnings = [w for r in reports for w in r.warnings]
    assert len(warnings) == 5 and all("alert broken: its probe failed" in w for w in warnings)
    kinds = [(job, kind) for job, kind, _, _ in condition_notifications(agent)]
    assert kinds.count(("broken", "alert_error")) == 1            # told once, when it starts failing
    assert kinds.count(("fine", "condition")) == 5                # the other alert is unaffected
    (broken,) = [a for a in agent.store().execute("list_alerts").rows if a["alert_name"] == "broken"]
    assert "no_such_table" in broken["last_error"]
    # Fixed: the error clears; broken again later: told again.
    execute(agent, "CREATE TABLE no_such_table (x INT)")
    tick_every_minute(agent, T0 + timedelta(minutes=6), 2)
    (broken,) = [a for a in agent.store().execute("list_alerts").rows if a["alert_name"] == "broken"]
    assert broken["last_error"] is None
    execute(agent, "DROP TABLE no_such_table")
    tick_every_minute(agent, T0 + timedelta(minutes=8), 2)
    kinds = [(job, kind) for job, kind, _, _ in condition_notifications(agent)]
    assert kinds.count(("broken", "alert_error")) == 2


def test_probes_that_write_commit_or_return_a_million_rows(agent_factory, db_url, receiver):
    pg = not db_url.startswith("sqlite")
    agent = build(agent_factory, receiver, {
        "writer": {"QUERY": "DELETE FROM alert_src RETURNING id" if pg else "DELETE FROM alert_src",
                   "SCHEDULE": EVERY_MINUTE},
        "committer": {"QUERY": "SELECT 1; COMMIT; DELETE FROM alert_src", "SCHEDULE": EVERY_MINUTE},
        "million": {"QUERY": ("SELECT g AS n, repeat('x', 2000) AS pad FROM generate_series(1, 1000000) AS g" if pg else
                              "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1000000) "
                              "SELECT n, printf('%.2000c', 'x') AS pad FROM c"),
                    "SCHEDULE": EVERY_MINUTE},
        "wide": {"QUERY": ("SELECT repeat('y', 100000) AS big" if pg else "SELECT printf('%.100000c', 'y') AS big"),
                 "SCHEDULE": EVERY_MINUTE}})
    execute(agent, "CREATE TABLE alert_src (id INT)")
    execute(agent, "INSERT INTO alert_src VALUES (1), (2)")
    reports = tick_every_minute(agent, T0, 2)
    assert query(agent, "SELECT COUNT(*) FROM alert_src") == [(2,)]          # nothing written stays
    warnings = " | ".join(w for r in reports for w in r.warnings)
    assert "alert writer: its probe failed" in warnings and "alert committer: its probe failed" in warnings
    firings = {f["alert_name"]: f for r in reports for f in r.condition_alerts}
    million = firings["million"]["body"]
    assert million["row_count"] <= 100 and "more than 100 rows" in million["rows_cut"]
    assert len(json.dumps(million).encode()) <= 70_000
    assert "bytes" in million["rows_cut"]
    wide = firings["wide"]["body"]
    assert wide["rows"][0]["_cut"].startswith("a row of more than")


def test_a_probe_that_runs_forever_is_cancelled_at_its_timeout(agent_factory, db_url, receiver):
    pg = not db_url.startswith("sqlite")
    agent = build(agent_factory, receiver, {
        "forever": {"QUERY": ("SELECT pg_sleep(30)" if pg else
                              "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT max(n) FROM c"),
                    "SCHEDULE": EVERY_MINUTE, "TIMEOUT_SECONDS": "1"}})
    import time
    agent.tick(T0)
    began = time.monotonic()
    report = agent.tick(T0 + timedelta(minutes=1))
    assert time.monotonic() - began < 10
    assert not report.errors
    assert any("TIMEOUT_SECONDS=1" in w or "timeout" in w.lower() for w in report.warnings), report.warnings


def test_removal_and_a_bad_alert_stop_only_themselves(agent_factory, db_url, receiver):
    agent = build(agent_factory, receiver, {
        "good": {"QUERY": "SELECT 1 AS one", "SCHEDULE": EVERY_MINUTE},
        "bad": {"QUERY": "SELECT 1", "SCHEDULE": "every now and then"},
        "x'; DROP TABLE agent_runs; --": {"ERRORS": "1205"},
        "long_zone": {"QUERY": "SELECT 1", "SCHEDULE": EVERY_MINUTE, "TIMEZONE": "Z" * 100,
                      "NOTIFY_WEBHOOK_URL": "https://example.invalid/" + "p" * 3000}},
        jobs={"etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1", "MAX_ATTEMPTS": "1"}})
    reports = tick_every_minute(agent, T0, 3)
    assert [f["alert_name"] for r in reports for f in r.condition_alerts] == ["good"]
    listed = {a["alert_name"]: a for a in agent.store().execute("list_alerts").rows}
    assert listed["bad"]["valid"] == 0 and "ALERT__bad__SCHEDULE='every now and then'" in listed["bad"]["config_error"]
    (hostile,) = [a for name, a in listed.items() if name.startswith("invalid-")]
    assert hostile["valid"] == 0 and "expected 1 to 64 letters" in hostile["config_error"]
    assert listed["long_zone"]["valid"] == 0 and "TIMEZONE" in listed["long_zone"]["config_error"]
    assert agent.store().execute("list_jobs").rows          # the jobs stand
    # Removed from the settings: gone at the next sync.
    again = build(agent_factory, receiver, {}, jobs={"etl": {"SCHEDULE": HOURLY, "COMMAND": "SELECT 1",
                                                             "MAX_ATTEMPTS": "1"}})
    report = again.tick(T0 + timedelta(minutes=3))
    assert not report.errors and report.synced
    assert again.store().execute("list_alerts").rows == []
    report = again.tick(T0 + timedelta(minutes=4))
    assert not report.condition_alerts


def test_the_quiet_horizon_wakes_for_the_next_probe(agent_factory, db_url, receiver):
    agent = build(agent_factory, receiver, {"nightly": {"QUERY": "SELECT 1 AS one", "SCHEDULE": "0 0 3 * * *"}},
                  AGENT_QUIET_MAX_MINUTES="1440")
    report = agent.tick(T0)
    assert not report.errors
    wake_at, why = quiet.horizon(agent.store(), agent.settings, T0)
    assert why == "next_condition_alert_at"
    assert at("2026-03-03T02:57:00") <= wake_at <= at("2026-03-03T03:00:00")


@pytest.mark.parametrize("settings, expected", [
    ({"ALERT__a__QUERY": "SELECT 1"}, "ALERT__a__SCHEDULE=<missing>: expected a schedule"),
    ({"ALERT__a__ERRORS": "50000,severity>=17"}, "ALERT__a__ERRORS='severity>=17': expected severity>=N with N at most 16"),
    ({"ALERT__a__ERRORS": "fifty"}, "ALERT__a__ERRORS='fifty': expected a comma-separated list"),
    ({"ALERT__a__ERRORS": "1205", "ALERT__a__DELAY_BETWEEN_RESPONSES_SECONDS": "99999999999"},
     "ALERT__a__DELAY_BETWEEN_RESPONSES_SECONDS='99999999999': expected a whole number from 0 to 31536000"),
    ({"ALERT__a__ERRORS": "1205", "ALERT__a__DELAY_BETWEEN_RESPONSES_SECONDS": "-1"},
     "expected a whole number from 0 to 31536000"),
    ({"ALERT__a__ERRORS": "1205", "ALERT__a__NOTIFY": "false"}, "expected a response"),
    ({"ALERT__a__QUERY": "SELECT 1", "ALERT__a__ERRORS": "1"}, "expected exactly one of them"),
    ({"ALERT__a__QUERY": "SELECT 1", "ALERT__a__SCHEDULE": HOURLY, "ALERT__a__TIMEOUT_SECONDS": "0"},
     "ALERT__a__TIMEOUT_SECONDS='0': expected a whole number from 1 to 600"),
    ({"ALERT__a__ERRORS": "1", "ALERT__a__COLOUR": "red"}, "ALERT__a__COLOUR: expected ALERT__<name>__<SETTING>"),
    ({"ALERT__a__QUERY": "SELECT 1", "ALERT__a__SCHEDULE": HOURLY, "ALERT__a__TIMEZONE": "X" * 100},
     "expected an IANA time zone name of at most 64 characters"),
    ({"ALERT__a__QUERY": "SELECT 1", "ALERT__a__SCHEDULE": "0 " * 300}, "expected a schedule of at most 400 characters"),
    ({"ALERT__" + "n" * 300 + "__ERRORS": "1"}, "expected 1 to 64 letters"),
])
def test_a_bad_alert_setting_names_the_setting(settings, expected):
    good = {"ALERT__b__ERRORS": "1205"}
    alerts, invalid = parse_alerts({**settings, **good})
    assert [a.name for a in alerts] == ["b"]
    (bad,) = invalid
    assert expected in bad.message, bad.message
    assert len(bad.key) <= 64            # what the database stores it under fits


def test_import_sqlagent_carries_sp_add_alert_and_lists_what_it_cannot():
    from shared.ops.sqlagent_import import convert_script, report
    from shared.settings import load_settings

    script = """
EXEC msdb.dbo.sp_add_job @job_name = N'Nightly ETL';
EXEC msdb.dbo.sp_add_jobstep @job_name = N'Nightly ETL', @step_name = N'run', @command = N'EXEC dbo.etl';
EXEC msdb.dbo.sp_add_jobserver @job_name = N'Nightly ETL';
GO
EXEC msdb.dbo.sp_add_alert @name = N'Deadlocks', @message_id = 1205, @delay_between_responses = 600,
     @job_name = N'Nightly ETL';
EXEC msdb.dbo.sp_add_notification @alert_name = N'Deadlocks', @operator_name = N'DBA Team', @notification_method = 1;
EXEC msdb.dbo.sp_add_alert @name = N'Quiet one', @message_id = 50001, @enabled = 0;
EXEC msdb.dbo.sp_add_alert @name = N'Sev 19', @severity = 19;
EXEC msdb.dbo.sp_add_alert @name = N'Log full', @performance_condition = N'SQLServer:Databases|Percent Log Used|_Total|>|90';
EXEC msdb.dbo.sp_add_alert @name = N'Dropped', @message_id = 9002;
EXEC msdb.dbo.sp_delete_alert @name = N'Dropped';
"""
    result = report(convert_script([("alerts.sql", script)], "UTC"), "UTC")
    alerts = {a["sql_agent_name"]: a for a in result["alerts"]}
    assert set(alerts) == {"Deadlocks", "Quiet one", "Sev 19", "Log full"}
    assert alerts["Deadlocks"]["settings"] == {
        "ALERT__Deadlocks__ERRORS": "1205", "ALERT__Deadlocks__DELAY_BETWEEN_RESPONSES_SECONDS": "600",
        "ALERT__Deadlocks__RESPONSE_JOB": "Nightly_ETL", "ALERT__Deadlocks__NOTIFY": "true"}
    assert alerts["Deadlocks"]["not_carried"] == []
    assert alerts["Quiet_one" if False else "Quiet one"]["settings"]["ALERT__Quiet_one__ENABLED"] == "false"
    for name, what in (("Sev 19", "@severity"), ("Log full", "@performance_condition")):
        assert not alerts[name]["emitted"] and [m["what"] for m in alerts[name]["not_carried"]] == [what]
    assert result["complete"] is False            # the CLI exits 1
    # What it emits is read by the agent as valid alerts and jobs.
    settings = load_settings(result["settings"])
    assert sorted(a.name for a in settings.alerts) == ["Deadlocks", "Quiet_one"] and not settings.invalid_alerts


def test_add_alert_runs_its_probe_as_its_owner_and_remove_alert_removes_it_both_audited(pg_url, receiver):
    """PostgreSQL: agent.add_alert by an operator (a login in agent_operator only): its probe runs
    with the operator's rights (a table it may not read is an alert error naming the permission; its
    own table is read; current_user is the operator, not the agent), a bad schedule is recorded
    invalid by the tick, agent.remove_alert removes it; each call is one audit row."""
    import contextlib
    import uuid

    import pyodbc

    from tests.integration.test_job_owner import _exists
    from tests.support.harness import make_agent, pg_admin_connection
    from tests.support.tsql_caller import CallError, call

    agent = make_agent(pg_url, queue=MemoryQueue(), AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok")
    agent._notifier = Silent()
    name = f"op_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{name}" LOGIN')
    execute(agent, f'GRANT agent_operator TO "{name}"; CREATE TABLE mine (x int); GRANT SELECT ON mine TO "{name}"; '
                   f'CREATE TABLE secret (x int); INSERT INTO secret VALUES (42); INSERT INTO mine VALUES (7)')
    operator = pyodbc.connect(pg_url.replace("Uid=root;", f"Uid={name};"), autocommit=True, timeout=10)
    try:
        call(operator, "add_alert", name="mine_rows", query="SELECT x, current_user AS who FROM mine",
             schedule=EVERY_MINUTE, delay_between_responses_seconds=0)
        call(operator, "add_alert", name="peek", query="SELECT x FROM secret", schedule=EVERY_MINUTE)
        call(operator, "add_alert", name="broken", query="SELECT 1", schedule="whenever")
        with pytest.raises(CallError, match="expected exactly one of them"):
            call(operator, "add_alert", name="neither")
        with pytest.raises(CallError, match="delay_between_responses_seconds = -5"):
            call(operator, "add_alert", name="neg", errors="1205", delay_between_responses_seconds=-5)
        reports = tick_every_minute(agent, T0, 3)
        firings = [f for r in reports for f in r.condition_alerts]
        mine = [f["body"] for f in firings if f["alert_name"] == "mine_rows"]
        assert len(mine) == 2 and mine[0]["rows"] == [{"x": 7, "who": name}] and mine[0]["owner"] == name
        assert mine[0]["source"] == "database"
        (peek,) = [f["body"] for f in firings if f["alert_name"] == "peek"]
        assert peek["kind"] == "alert_error" and "permission denied" in peek["error"]
        listed = {a["alert_name"]: a for a in agent.store().execute("list_alerts").rows}
        assert listed["broken"]["valid"] == 0 and "agent.add_alert @schedule='whenever'" in listed["broken"]["config_error"]
        assert listed["mine_rows"]["owner"] == name
        call(operator, "remove_alert", name="peek")
        with pytest.raises(CallError, match="no alert of that name"):
            call(operator, "remove_alert", name="peek")
        assert "peek" not in {a["alert_name"] for a in agent.store().execute("list_alerts").rows}
        audit = query(agent, "SELECT action, principal, outcome FROM agent.audit WHERE action LIKE '%alert' "
                             "ORDER BY audit_id")
        assert audit == [("define-alert", name, "done")] * 3 + [("remove-alert", name, "done")]
    finally:
        with contextlib.suppress(Exception):
            operator.close()
        if _exists(admin, name):
            execute(agent, f'DROP OWNED BY "{name}"')
        agent.close()
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


def test_the_monitor_and_the_cli_show_the_alerts_and_their_responses(agent_factory, db_url, receiver, capsys):
    import contextlib

    from jsonschema import Draft202012Validator

    from shared.cli.commands import main
    from shared.web.app import Monitor, MonitorSettings

    agent = build(agent_factory, receiver, {
        "backlog": {"QUERY": "SELECT 1 AS one", "SCHEDULE": EVERY_MINUTE},
        "bad<b>": {"ERRORS": "1205"}})
    tick_every_minute(agent, T0, 2)
    store = agent.new_store()
    monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: T0, settings=lambda: MonitorSettings())
    page = monitor.handle("GET", "/alerts", "", "")
    assert page.status == 200
    html = page.body.decode()
    assert "backlog" in html and "<b>" not in html and "1 row(s)" in html
    document = json.loads(monitor.handle("GET", "/alerts", "format=json", "").body)
    schema = json.loads((Path(__file__).resolve().parents[2] / "docs/schemas/monitor-alerts.schema.json").read_text())
    assert not list(Draft202012Validator(schema).iter_errors(document))
    assert {a["alert_name"]: a["state"] for a in document["alerts"]}["backlog"] == "ok"
    assert [f["kind"] for f in document["firings"]] == ["condition"]
    store.close()
    assert main(["--db", db_url, "--json", "alerts"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [a["alert_name"] for a in listed["alerts"]][0] == "backlog"
    assert main(["--db", db_url, "alerts"]) == 0
    text = capsys.readouterr().out
    assert "backlog" in text and "invalid" in text


def test_probes_that_run_forever_cannot_hold_the_tick_past_its_probe_budget(agent_factory, db_url, receiver,
                                                                               monkeypatch):
    import time

    from shared.engine import condition_alerts

    monkeypatch.setattr(condition_alerts, "PROBE_BUDGET_SECONDS", 2)
    pg = not db_url.startswith("sqlite")
    forever = ("SELECT pg_sleep(60)" if pg else
               "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c) SELECT max(n) FROM c")
    agent = build(agent_factory, receiver, {
        "a_forever": {"QUERY": forever, "SCHEDULE": EVERY_MINUTE, "TIMEOUT_SECONDS": "600"},
        "b_forever": {"QUERY": forever, "SCHEDULE": EVERY_MINUTE, "TIMEOUT_SECONDS": "600"}})
    agent.tick(T0)
    began = time.monotonic()
    report = agent.tick(T0 + timedelta(minutes=1))
    assert time.monotonic() - began < 15
    assert not report.errors
    (first,) = [w for w in report.warnings if "a_forever" in w]
    (second,) = [w for w in report.warnings if "b_forever" in w]
    assert "TIMEOUT_SECONDS=2" in first or "cancel" in first.lower(), first
    assert "not run at this check" in second


def test_each_response_is_one_alert_raised_event(agent_factory, db_url, receiver):
    from shared.telemetry.client import Telemetry

    class Recorder(Telemetry):
        def __init__(self):
            self.events = []

        def event(self, name, properties=None, *, operation_id=None):
            super().event(name, properties, operation_id=operation_id)      # the names and dimensions check
            self.events.append((name, dict(properties or {})))

    agent = build(agent_factory, receiver, {
        "backlog": {"QUERY": "SELECT 1 AS one", "SCHEDULE": EVERY_MINUTE, "DELAY_BETWEEN_RESPONSES_SECONDS": "120"},
        "broken": {"QUERY": "SELECT * FROM nowhere_at_all", "SCHEDULE": EVERY_MINUTE}})
    recorder = Recorder()
    agent._telemetry = recorder
    tick_every_minute(agent, T0, 6)
    raised = [(p["alert_name"], p["alert"]) for name, p in recorder.events if name == "AlertRaised"]
    # Checks at 10:01 .. 10:05: a response at 10:01, 10:03, 10:05 (a 2-minute delay); the probe error once.
    assert raised.count(("backlog", "condition")) == 3
    assert raised.count(("broken", "alert_error")) == 1 and len(raised) == 4
