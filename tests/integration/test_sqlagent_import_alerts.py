"""import-sqlagent --apply and SQL Server Agent's alerts (issue 32 item 3): the alerts the importer
converts from sp_add_alert are defined with the T-SQL interface's own agent.add_alert, after the
jobs (an alert whose response starts a job finds it defined), each audited as the procedure audits
any caller; an alert --apply cannot define whole (its response job is not applied, a webhook of its
own) or that the procedure refuses is listed under not_applied with why, and the others stand; a
second --apply redefines. On SQLite (no procedures) --apply is refused whole, one 'import' row."""

from __future__ import annotations

import json
import os

import pytest

from shared.cli.commands import main as cli
from shared.jobs.alert_definitions import parse_alerts
from shared.ops.sqlagent_import import ConvertedAlert, alert_apply_calls
from tests.integration.test_sqlagent_import import schedule, ssms, step
from tests.support.harness import execute, make_agent, query

# Two jobs (one step, scheduled: applied; two steps and no schedule, on demand: printed as
# settings, not applied, agent.add_scheduled_job needing a schedule) and the alerts SQL Server
# Agent had on them.
SCRIPT = ssms("Nightly ETL", step(1, "EXEC dbo.etl"), schedule(start_time=20000)) + ssms(
    "Two steps", step(1, "SELECT 1", success=3) + "\n" + step(2, "SELECT 2"), "") + """
EXEC msdb.dbo.sp_add_alert @name = N'Deadlocks', @message_id = 1205, @delay_between_responses = 600,
     @job_name = N'Nightly ETL';
EXEC msdb.dbo.sp_add_notification @alert_name = N'Deadlocks', @operator_name = N'DBA Team', @notification_method = 1;
EXEC msdb.dbo.sp_add_alert @name = N'Sev 10', @severity = 10, @delay_between_responses = 60;
EXEC msdb.dbo.sp_add_notification @alert_name = N'Sev 10', @operator_name = N'DBA Team', @notification_method = 1;
EXEC msdb.dbo.sp_add_alert @name = N'Quiet one', @message_id = 50001, @enabled = 0;
EXEC msdb.dbo.sp_add_alert @name = N'Needs steps', @message_id = 208, @job_name = N'Two steps';
EXEC msdb.dbo.sp_add_alert @name = N'Log full', @performance_condition = N'SQLServer:Databases|Percent Log Used|_Total|>|90';
GO
"""
APPLIED_ALERTS = ["Deadlocks", "Quiet_one", "Sev_10"]
# What an alert is, whichever way it was defined (source and owner say which way).
DEFINITION_FIELDS = ("probe_query", "schedule", "timezone", "errors", "timeout_seconds", "delay_seconds", "notify",
                     "notify_webhook_url", "response_job", "enabled", "valid", "config_error", "state")


@pytest.fixture(autouse=True)
def no_agent_settings_from_the_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("AGENT_", "JOB__", "ALERT__")):
            monkeypatch.delenv(key)


def run(capsys, *args: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = cli(["--json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out or err)


def alerts_listed(capsys, db: str) -> dict[str, dict]:
    code, document = run(capsys, "--db", db, "alerts")
    assert code == 0, document
    return {a["alert_name"]: a for a in document["alerts"]}


def audit_rows(agent, since: int) -> list[tuple]:
    rows = query(agent, "SELECT audit_id, action, source, outcome, arguments, detail FROM "
                        + ("agent_audit" if agent.target.dialect == "sqlite" else "agent.audit")
                        + f" WHERE audit_id > {since} ORDER BY audit_id")
    return [(action, source, outcome, json.loads(arguments) if arguments else None, detail)
            for _, action, source, outcome, arguments, detail in rows]


def last_audit_id(agent) -> int:
    table = "agent_audit" if agent.target.dialect == "sqlite" else "agent.audit"
    return query(agent, f"SELECT COALESCE(MAX(audit_id), 0) FROM {table}")[0][0]


def test_apply_defines_the_alerts_after_their_jobs_as_the_settings_would(db_url, tmp_path, capsys):
    """The alerts come out of --apply as they would out of the printed settings: `sql-agent
    alerts --json` lists the same definitions (the settings' on another database, the procedure's
    here), source 'database'; the alert whose response job is not applied is listed, not defined;
    the one nothing here can fire is neither defined nor in the settings. On SQLite nothing is
    defined and the import is one refused row."""
    agent = make_agent(db_url)
    path = tmp_path / "agent.sql"
    path.write_text(SCRIPT, encoding="utf-8")
    # The dry run: the settings, and the same document --apply adds to.
    code, printed = run(capsys, "import-sqlagent", str(path), "--timezone", "UTC")
    assert code == 1 and "applied" not in printed and "not_applied" not in printed
    assert {a["alert"] for a in printed["alerts"] if a["emitted"]} == {*APPLIED_ALERTS, "Needs_steps"}
    before = last_audit_id(agent)
    code, document = run(capsys, "--db", db_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    if agent.target.dialect == "sqlite":
        assert code == 2 and "agent.add_alert" in document["error"] and "PostgreSQL or SQL Server" in document["error"]
        assert [(action, outcome) for action, _, outcome, _, _ in audit_rows(agent, before)] == [("import", "refused")]
        assert alerts_listed(capsys, db_url) == {}
        return
    assert code == 1, document                    # things were left out and not applied
    assert document["settings"] == printed["settings"] and document["alerts"] == printed["alerts"]
    assert document["applied"] == [{"job": "Nightly_ETL", "action": "defined"}] + [
        {"alert": name, "action": "defined"} for name in ("Deadlocks", "Sev_10", "Quiet_one")]
    not_applied = {item.get("job") or item.get("alert"): item["reason"] for item in document["not_applied"]}
    assert set(not_applied) == {"Two_steps", "Needs_steps"}
    assert "starts job 'Two_steps', which --apply does not define" in not_applied["Needs_steps"]
    # The procedure's own audit rows (source tsql), one per call, then the import's one row.
    rows = audit_rows(agent, before)
    assert [(action, source, outcome) for action, source, outcome, _, _ in rows] == [
        ("define", "tsql", "done")] + [("define-alert", "tsql", "done")] * 3 + [("import", "cli", "done")]
    assert [arguments["name"] for action, _, _, arguments, _ in rows if action == "define-alert"] == [
        "Deadlocks", "Sev_10", "Quiet_one"]
    assert rows[1][3]["errors"] == "1205" and rows[1][3]["response_job"] == "Nightly_ETL"
    assert rows[-1][3] == {"jobs": ["Nightly_ETL"], "alerts": ["Deadlocks", "Sev_10", "Quiet_one"]}
    assert rows[-1][4] == ("1 job(s) defined: Nightly_ETL (defined); 3 alert(s) defined: Deadlocks (defined), "
                           "Sev_10 (defined), Quiet_one (defined)")
    agent.tick()
    applied = alerts_listed(capsys, db_url)
    assert sorted(applied) == APPLIED_ALERTS
    # The same alerts from the printed settings, on a database of their own.
    settings_db = f"sqlite:///{tmp_path / 'settings.db'}"
    settings_agent = make_agent(settings_db, **printed["settings"])
    settings_agent.tick()
    from_settings = alerts_listed(capsys, settings_db)
    assert sorted(from_settings) == sorted([*APPLIED_ALERTS, "Needs_steps"])
    for name in APPLIED_ALERTS:
        assert applied[name]["source"] == "database" and from_settings[name]["source"] == "settings"
        assert {k: applied[name][k] for k in DEFINITION_FIELDS} == {k: from_settings[name][k] for k in DEFINITION_FIELDS}
    assert (applied["Deadlocks"]["errors"], applied["Deadlocks"]["delay_seconds"], applied["Deadlocks"]["notify"],
            applied["Deadlocks"]["response_job"], applied["Deadlocks"]["state"]) == ("1205", 600, True, "Nightly_ETL", "ok")
    assert applied["Sev_10"]["errors"] == "severity>=10" and applied["Sev_10"]["delay_seconds"] == 60
    assert applied["Quiet_one"]["enabled"] is False and applied["Quiet_one"]["notify"] is True


def test_an_alert_the_procedure_refuses_is_listed_and_the_others_are_defined(pg_url, tmp_path, capsys):
    """agent.add_alert refusing one alert (here a constraint of the database's refuses its row)
    lists that alert with the procedure's error; the jobs and the other alerts are defined, the
    refused one is not, half or whole; the import row says which."""
    agent = make_agent(pg_url)
    execute(agent, "ALTER TABLE agent.alerts ADD CONSTRAINT test_no_quiet CHECK (alert_name <> 'Quiet_one')")
    path = tmp_path / "agent.sql"
    path.write_text(SCRIPT, encoding="utf-8")
    before = last_audit_id(agent)
    code, document = run(capsys, "--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    assert code == 1
    assert document["applied"] == [{"job": "Nightly_ETL", "action": "defined"},
                                   {"alert": "Deadlocks", "action": "defined"}, {"alert": "Sev_10", "action": "defined"}]
    (refused,) = [item for item in document["not_applied"] if item.get("alert") == "Quiet_one"]
    assert refused["reason"].startswith("agent.add_alert refused it: ") and "test_no_quiet" in refused["reason"]
    assert "SQLSTATE 23514" in refused["reason"]
    assert sorted(alerts_listed(capsys, pg_url)) == ["Deadlocks", "Sev_10"]
    assert [j["job_name"] for j in agent.store().execute("list_jobs").rows] == ["Nightly_ETL"]
    rows = audit_rows(agent, before)
    # A refused call on PostgreSQL leaves no row of its own (its transaction rolled back).
    assert [(action, outcome) for action, _, outcome, _, _ in rows] == [
        ("define", "done"), ("define-alert", "done"), ("define-alert", "done"), ("import", "done")]
    assert rows[-1][3]["alerts"] == ["Deadlocks", "Sev_10", "Quiet_one"]
    assert "2 alert(s) defined: Deadlocks (defined), Sev_10 (defined); 1 alert(s) not defined: Quiet_one " \
           "(agent.add_alert refused it: " in rows[-1][4]
    # Without --json the JSON is printed too, and each thing not applied is one line on stderr.
    capsys.readouterr()
    assert cli(["--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply"]) == 1
    err = capsys.readouterr().err
    assert "not applied: alert Quiet_one: agent.add_alert refused it: " in err
    assert "not applied: job Two_steps: agent.add_scheduled_job needs @schedule or @run_at" in err


def test_apply_twice_redefines_the_jobs_and_the_alerts(pg_url, tmp_path, capsys):
    """A second --apply of the same script calls the procedures again: each job and alert is
    'redefined' (replaced whole, as agent.add_alert does for any caller: its counts start again),
    nothing is doubled, and each run is its own 'import' row."""
    agent = make_agent(pg_url)
    path = tmp_path / "agent.sql"
    path.write_text(SCRIPT, encoding="utf-8")
    code, first = run(capsys, "--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    assert code == 1 and {a["action"] for a in first["applied"]} == {"defined"}
    agent.tick()
    once = alerts_listed(capsys, pg_url)
    before = last_audit_id(agent)
    code, second = run(capsys, "--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    assert code == 1
    assert second["applied"] == [{**item, "action": "redefined"} for item in first["applied"]]
    assert second["not_applied"] == first["not_applied"]
    agent.tick()
    twice = alerts_listed(capsys, pg_url)
    assert sorted(twice) == APPLIED_ALERTS
    for name in APPLIED_ALERTS:
        assert {k: twice[name][k] for k in DEFINITION_FIELDS} == {k: once[name][k] for k in DEFINITION_FIELDS}
    assert [j["job_name"] for j in agent.store().execute("list_jobs").rows] == ["Nightly_ETL"]
    rows = audit_rows(agent, before)
    # The job redefined is then given no steps (a redefinition keeps those set before): 'set-steps'.
    assert [action for action, *_ in rows] == ["define", "set-steps", "define-alert", "define-alert", "define-alert",
                                               "import"]
    assert rows[1][3] == {"job_name": "Nightly_ETL"}              # @steps NULL: no steps in the row
    assert "Deadlocks (redefined)" in rows[-1][4]


def test_an_alert_with_a_webhook_of_its_own_is_not_applied_but_listed():
    """agent.add_alert takes every setting of an alert but NOTIFY_WEBHOOK_URL: such an alert is
    listed, never defined without its webhook; one whose response job is not applied neither."""
    def converted(name: str, **settings: str) -> ConvertedAlert:
        return ConvertedAlert(name, name, {f"ALERT__{name}__{k}": v for k, v in settings.items()}, True)

    alerts = [converted("hook", ERRORS="1205", NOTIFY_WEBHOOK_URL="https://hooks.example/x"),
              converted("starts", ERRORS="208", RESPONSE_JOB="other", NOTIFY="false"),
              converted("fine", ERRORS="208", RESPONSE_JOB="Loader", NOTIFY="false", DELAY_BETWEEN_RESPONSES_SECONDS="0"),
              ConvertedAlert("gone", "gone", {}, False)]
    calls, refused = alert_apply_calls(alerts, ["loader"])
    assert [c.name for c in calls] == ["fine"]
    assert calls[0] == parse_alerts(alerts[2].settings)[0][0]
    reasons = {r["alert"]: r["reason"] for r in refused}
    assert set(reasons) == {"hook", "starts"}
    assert "agent.add_alert has no @notify_webhook_url" in reasons["hook"]
    assert "starts job 'other', which --apply does not define" in reasons["starts"]


def test_a_connection_lost_during_add_alert_is_said_and_the_alerts_after_it_are_not_attempted(pg_url, tmp_path,
                                                                                              capsys):
    """The session ends inside agent.add_alert (here the server terminates it from a trigger): the
    jobs and the alerts before stay defined, that alert is listed as perhaps not defined (here it
    was not: its transaction died with the session), those after it as not attempted; nothing is
    retried behind the operator's back, and the output is still the whole document."""
    agent = make_agent(pg_url)
    execute(agent, "CREATE FUNCTION public.test_end_session() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                   "IF NEW.alert_name = 'Sev_10' THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF; "
                   "RETURN NEW; END $$; CREATE TRIGGER test_end_session BEFORE INSERT ON agent.alerts FOR EACH ROW "
                   "EXECUTE FUNCTION public.test_end_session()")
    path = tmp_path / "agent.sql"
    path.write_text(SCRIPT, encoding="utf-8")
    code, document = run(capsys, "--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    assert code == 1
    assert document["applied"] == [{"job": "Nightly_ETL", "action": "defined"}, {"alert": "Deadlocks", "action": "defined"}]
    reasons = {item["alert"]: item["reason"] for item in document["not_applied"] if "alert" in item}
    assert reasons["Sev_10"].startswith("the connection failed during agent.add_alert (")
    assert "whether it was defined is unknown" in reasons["Sev_10"]
    assert reasons["Quiet_one"].startswith("not attempted: the connection to the control database failed")
    assert sorted(alerts_listed(capsys, pg_url)) == ["Deadlocks"]


def test_a_job_the_procedure_refuses_is_listed_and_the_other_jobs_and_alerts_are_defined(pg_url, tmp_path, capsys):
    """One bad definition never stops the others: agent.add_scheduled_job refusing one job (a
    constraint of the database's refuses its row) lists that job with the procedure's error, and
    the jobs after it and the alerts are still defined; the import row names the refused job."""
    agent = make_agent(pg_url)
    execute(agent, "ALTER TABLE agent.jobs ADD CONSTRAINT test_no_first CHECK (job_name <> 'First_job')")
    script = ssms("First job", step(1, "SELECT 1"), schedule(start_time=10000)) + SCRIPT
    path = tmp_path / "agent.sql"
    path.write_text(script, encoding="utf-8")
    before = last_audit_id(agent)
    code, document = run(capsys, "--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply")
    assert code == 1
    (refused,) = [item for item in document["not_applied"] if item.get("job") == "First_job"]
    assert refused["reason"].startswith("agent.add_scheduled_job refused it: ") and "test_no_first" in refused["reason"]
    assert {"job": "Nightly_ETL", "action": "defined"} in document["applied"]
    assert {a["alert"] for a in document["applied"] if "alert" in a} == {"Deadlocks", "Sev_10", "Quiet_one"}
    assert [j["job_name"] for j in agent.store().execute("list_jobs").rows] == ["Nightly_ETL"]
    assert sorted(alerts_listed(capsys, pg_url)) == APPLIED_ALERTS
    rows = audit_rows(agent, before)
    assert rows[-1][0] == "import" and rows[-1][2] == "done"
    assert "1 job(s) not defined: First_job (agent.add_scheduled_job refused it: " in rows[-1][4]


def test_apply_defines_a_one_time_job_with_its_moment(db_url, tmp_path, capsys):
    """A one-time schedule (@freq_type 1) is applied with agent.add_scheduled_job's @run_at, a
    point in time: on T-SQL it is converted into a DATETIMEOFFSET variable before the EXEC (an
    EXEC argument cannot be an expression). SQLite refuses --apply whole."""
    agent = make_agent(db_url)
    path = tmp_path / "once.sql"
    path.write_text(ssms("Once only", step(1, "SELECT 1"), schedule(freq_type=1, start_date=20301231,
                                                                       start_time=233000)), encoding="utf-8")
    code, document = run(capsys, "--db", db_url, "import-sqlagent", str(path), "--timezone", "Europe/Paris", "--apply")
    if agent.target.dialect == "sqlite":
        assert code == 2 and "needs a PostgreSQL or SQL Server control database" in json.dumps(document)
        return
    assert code == 0, document
    assert document["applied"] == [{"job": "Once_only", "action": "defined"}]
    (job,) = [j for j in agent.store().execute("list_jobs").rows if j["job_name"] == "Once_only"]
    assert job["schedule"].startswith("@once 2030-12-31"), job["schedule"]
