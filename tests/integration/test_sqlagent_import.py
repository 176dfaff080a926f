"""import-sqlagent: SSMS's "Script Job as -> CREATE To" scripts turned into JOB__<name>__*
settings, every emitted job checked by the engine's own settings validation, and --apply on a
real PostgreSQL control database."""

from __future__ import annotations

import json
import uuid
from datetime import date, datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from shared.cli.commands import main as cli
from shared.engine.operations import apply_import
from shared.jobs.from_settings import parse_jobs
from shared.jobs.schedules import parse_schedule
from shared.ops.sqlagent_import import ScriptError, convert_script, report, setting_name
from tests.support.harness import create_pg_database, drop_pg_database, make_agent, query

HERE = Path(__file__).parent / "sqlagent"
TODAY = date(2026, 11, 25)
UTC = timezone.utc


def convert(*names: str, tz: str = "Europe/Paris"):
    return convert_script([(n, (HERE / n).read_text(encoding="utf-8")) for n in names], tz, today=TODAY)


def assert_engine_accepts(settings: dict[str, str]) -> None:
    valid, invalid = parse_jobs(settings)
    assert invalid == (), [e for bad in invalid for e in bad.errors]
    assert valid


# An SSMS script around one job, as SSMS writes it (the wrapper is what matters to the reader).
def ssms(job: str, steps: str, schedules: str, *, enabled: int = 1, extra_job: str = "") -> str:
    return f"""USE [msdb]
GO

/****** Object:  Job [{job}]    Script Date: 11/24/2026 10:14:02 AM ******/
BEGIN TRANSACTION
DECLARE @ReturnCode INT
SELECT @ReturnCode = 0
IF NOT EXISTS (SELECT name FROM msdb.dbo.syscategories WHERE name=N'[Uncategorized (Local)]' AND category_class=1)
BEGIN
EXEC @ReturnCode = msdb.dbo.sp_add_category @class=N'JOB', @type=N'LOCAL', @name=N'[Uncategorized (Local)]'
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback

END

DECLARE @jobId BINARY(16)
EXEC @ReturnCode =  msdb.dbo.sp_add_job @job_name=N'{job.replace("'", "''")}',
		@enabled={enabled},
		@notify_level_eventlog=0,
		@notify_level_email=0,
		@notify_level_netsend=0,
		@notify_level_page=0,
		@delete_level=0,
		@description=N'No description available.',
		@category_name=N'[Uncategorized (Local)]',
		@owner_login_name=N'sa'{extra_job}, @job_id = @jobId OUTPUT
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback
{steps}
EXEC @ReturnCode = msdb.dbo.sp_update_job @job_id = @jobId, @start_step_id = 1
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback
{schedules}
EXEC @ReturnCode = msdb.dbo.sp_add_jobserver @job_id = @jobId, @server_name = N'(local)'
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback
COMMIT TRANSACTION
GOTO EndSave
QuitWithRollback:
    IF (@@TRANCOUNT > 0) ROLLBACK TRANSACTION
EndSave:
GO
"""


def step(number: int, command: str, *, subsystem: str = "TSQL", database: str = "sales", success: int = 1,
         fail: int = 2, retries: int = 0, interval: int = 0) -> str:
    return f"""/****** Object:  Step [step {number}]    Script Date: 11/24/2026 10:14:02 AM ******/
EXEC @ReturnCode = msdb.dbo.sp_add_jobstep @job_id=@jobId, @step_name=N'step {number}',
		@step_id={number},
		@cmdexec_success_code=0,
		@on_success_action={success},
		@on_success_step_id=0,
		@on_fail_action={fail},
		@on_fail_step_id=0,
		@retry_attempts={retries},
		@retry_interval={interval},
		@os_run_priority=0, @subsystem=N'{subsystem}',
		@command=N'{command.replace("'", "''")}',
		@database_name=N'{database}',
		@flags=0
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback"""


def schedule(name: str = "s", *, freq_type: int = 4, interval: int = 1, subday_type: int = 1, subday_interval: int = 0,
             relative: int = 0, factor: int = 0, start_date: int = 20260101, end_date: int = 99991231,
             start_time: int = 0, end_time: int = 235959, enabled: int = 1) -> str:
    # SSMS writes each schedule's own schedule_uid: one shared by two calls is one schedule (the
    # second sp_add_jobschedule updates it, as SQL Server does), so every schedule here gets its own.
    uid = uuid.uuid5(uuid.NAMESPACE_OID, repr(sorted(locals().items())))
    return f"""EXEC @ReturnCode = msdb.dbo.sp_add_jobschedule @job_id=@jobId, @name=N'{name}',
		@enabled={enabled},
		@freq_type={freq_type},
		@freq_interval={interval},
		@freq_subday_type={subday_type},
		@freq_subday_interval={subday_interval},
		@freq_relative_interval={relative},
		@freq_recurrence_factor={factor},
		@active_start_date={start_date},
		@active_end_date={end_date},
		@active_start_time={start_time},
		@active_end_time={end_time},
		@schedule_uid=N'{uid}'
IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback"""


def one(text: str, tz: str = "UTC"):
    converted = convert_script([("job.sql", text)], tz, today=TODAY)
    return converted


# ---------------------------------------------------------------- the SSMS fixtures


def test_a_multi_step_job_with_its_flow_retries_and_two_schedules_merged_into_one_and_a_third_as_a_job():
    converted = convert("nightly_maintenance.sql")
    assert [c.job for c in converted] == ["Nightly_maintenance_O_Brien_s_DB", "Nightly_maintenance_O_Brien_s_DB_2"]
    first, second = converted
    p = "JOB__Nightly_maintenance_O_Brien_s_DB__"
    s = first.settings
    # N'...' with doubled quotes, a comment and a GO inside the string are the step's text.
    assert s[p + "STEPS__1__COMMAND"] == ("ALTER INDEX ALL ON dbo.orders REBUILD;\n-- a comment with a quote: it's "
                                         "here, and a GO inside a string:\nPRINT N'GO';")
    assert (s[p + "STEPS__1__ON_SUCCESS"], s[p + "STEPS__1__ON_FAILURE"]) == ("next", "goto:3")
    assert (s[p + "STEPS__1__MAX_ATTEMPTS"], s[p + "STEPS__1__RETRY_INTERVAL_SECONDS"]) == ("3", "300")
    assert (s[p + "STEPS__2__ON_SUCCESS"], s[p + "STEPS__2__ON_FAILURE"]) == ("quit_success", "quit_failure")
    assert s[p + "STEPS__3__ON_SUCCESS"] == "quit_failure" and s[p + "STEPS__3__DATABASE"] == "sales"
    assert p + "STEPS__2__RETRY_INTERVAL_SECONDS" not in s and s[p + "STEPS__2__MAX_ATTEMPTS"] == "1"
    assert (s[p + "TIMEZONE"], s[p + "ENABLED"]) == ("Europe/Paris", "true")
    # 02:30 and 22:30 daily share one NCRONTAB; Sundays every 15 minutes 08:00-11:59 cannot.
    assert s[p + "SCHEDULE"] == "0 30 2,22 * * *"
    assert second.settings["JOB__Nightly_maintenance_O_Brien_s_DB_2__SCHEDULE"] == "0 */15 8-11 * * 0"
    assert second.settings["JOB__Nightly_maintenance_O_Brien_s_DB_2__STEPS__1__ON_FAILURE"] == "goto:3"
    assert any("became job JOB__Nightly_maintenance_O_Brien_s_DB_2__*" in note for note in first.notes)
    assert first.not_carried == [] and first.emitted and second.emitted
    merged = report(converted, "Europe/Paris")
    assert merged["complete"] is True
    assert_engine_accepts(merged["settings"])
    # The slots are those SQL Agent ran: 02:30 and 22:30 Paris time; Sundays 08:00 ... 11:45.
    paris = ZoneInfo("Europe/Paris")
    daily = parse_schedule(s[p + "SCHEDULE"], "Europe/Paris")
    slot = daily.next_after(datetime(2026, 11, 25, 12, 0, tzinfo=UTC)).astimezone(paris)
    assert (slot.day, slot.hour, slot.minute) == (25, 22, 30)
    sunday = parse_schedule("0 */15 8-11 * * 0", "Europe/Paris")
    slots = [sunday.next_after(datetime(2026, 11, 28, 12, 0, tzinfo=UTC))]
    for _ in range(15):
        slots.append(sunday.next_after(slots[-1]))
    local = [t.astimezone(paris) for t in slots]
    assert local[0].strftime("%a %H:%M") == "Sun 08:00" and local[15].strftime("%a %H:%M") == "Sun 11:45"
    assert len({t.date() for t in local}) == 1


def test_several_jobs_in_one_file_and_what_is_not_carried_is_listed_per_job():
    everything = convert("several_jobs.sql")
    assert [(c.sql_agent_name, c.job) for c in everything] == [
        ("purge audit", "purge_audit"), ("purge audit", "purge_audit_2"), ("Month-end close", "Month_end_close")]
    purge, purge_fortnightly, close = everything
    common = {"COMMAND": "DELETE TOP (5000) FROM dbo.audit_log WHERE logged_at < DATEADD(day, -90, SYSUTCDATETIME());",
              "MAX_ATTEMPTS": "4", "DATABASE": "audit", "TIMEZONE": "Europe/Paris", "MISFIRE": "skip", "ENABLED": "false",
              "NOTIFY": "on_failure"}          # @notify_level_email=2: when it fails
    assert purge.settings == {**{f"JOB__purge_audit__{k}": v for k, v in common.items()},
                              "JOB__purge_audit__SCHEDULE": "0 */5 1-6 * * *"}
    # Its schedule 'every 2 weeks' (Mondays, @freq_recurrence_factor=2) is a job of its own.
    assert purge_fortnightly.settings == {**{f"JOB__purge_audit_2__{k}": v for k, v in common.items()},
                                          "JOB__purge_audit_2__SCHEDULE": "0 0 0 * * 1 ; every 2 weeks ; from 2025-03-01"}
    reasons = {item["what"]: item["reason"] for item in purge.not_carried}
    assert "operators are not carried" in reasons["@notify_level_email=2 to operator 'DBA team'"]
    assert reasons["step 2 ('export')"].startswith("subsystem PowerShell: only T-SQL steps")
    assert "schedule 'every 2 weeks'" not in reasons
    # sp_add_schedule + sp_attach_schedule; every 3 months from January: a fixed set of months.
    assert close.settings["JOB__Month_end_close__SCHEDULE"] == "0 0 6 1 1,4,7,10 *"
    assert close.settings["JOB__Month_end_close__MAX_ATTEMPTS"] == "2"
    result = report(everything, "Europe/Paris")
    assert result["complete"] is False
    assert_engine_accepts(result["settings"])


def test_the_command_prints_json_and_exits_1_when_anything_was_left_out(capsys):
    assert cli(["import-sqlagent", str(HERE / "nightly_maintenance.sql"), "--timezone", "Europe/Paris"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["settings"]["JOB__Nightly_maintenance_O_Brien_s_DB__SCHEDULE"] == "0 30 2,22 * * *"
    assert captured.err == ""
    code = cli(["import-sqlagent", str(HERE / "nightly_maintenance.sql"), str(HERE / "several_jobs.sql")])
    captured = capsys.readouterr()
    assert code == 1
    out = json.loads(captured.out)
    assert out["timezone"] == "UTC" and "warning: no --timezone" in captured.err
    assert "not carried: purge audit: step 2 ('export'): subsystem PowerShell" in captured.err
    assert {job["job"] for job in out["jobs"]} == {"Nightly_maintenance_O_Brien_s_DB",
                                                   "Nightly_maintenance_O_Brien_s_DB_2", "purge_audit",
                                                   "purge_audit_2", "Month_end_close"}
    # Bad input: one line naming what is wrong.
    assert cli(["import-sqlagent", str(HERE / "missing.sql")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli(["import-sqlagent", str(HERE / "several_jobs.sql"), "--timezone", "Mars/Olympus"]) == 2
    assert "Mars/Olympus" in capsys.readouterr().err


def test_a_script_saved_as_utf16_by_ssms_is_read(tmp_path, capsys):
    path = tmp_path / "job.sql"
    path.write_bytes((HERE / "nightly_maintenance.sql").read_text(encoding="utf-8").encode("utf-16"))
    assert cli(["import-sqlagent", str(path), "--timezone", "UTC"]) == 0
    assert "JOB__Nightly_maintenance_O_Brien_s_DB__SCHEDULE" in json.loads(capsys.readouterr().out)["settings"]


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize("arguments, expected", [
    (dict(freq_type=4, start_time=23000), "0 30 2 * * *"),
    (dict(freq_type=4, subday_type=8, subday_interval=6), "0 0 0-18/6 * * *"),     # never */n: once in the repeated hour
    (dict(freq_type=4, subday_type=8, subday_interval=2, start_time=10000, end_time=170000), "0 0 1-17/2 * * *"),
    (dict(freq_type=4, subday_type=2, subday_interval=10), "*/10 * * * * *"),
    # SQL Agent starts again at @active_start_time each day: every 7 hours is 00, 07, 14 and 21 h.
    (dict(freq_type=4, subday_type=8, subday_interval=7), "0 0 0-21/7 * * *"),
    (dict(freq_type=4, subday_type=4, subday_interval=20, start_time=80000, end_time=175959), "0 */20 8-17 * * *"),
    (dict(freq_type=8, interval=2 | 8 | 32, factor=1, start_time=63000), "0 30 6 * * 1,3,5"),
    (dict(freq_type=8, interval=1 | 64, factor=1, start_time=120000), "0 0 12 * * 0,6"),
    (dict(freq_type=16, interval=15, factor=1, start_time=10000), "0 0 1 15 * *"),
    (dict(freq_type=16, interval=1, factor=6, start_date=20260301), "0 0 0 1 3,9 *"),
    (dict(freq_type=32, interval=8, relative=2, factor=1, start_time=40000), "0 0 4 2 * *"),
    (dict(freq_type=1, start_date=20270115, start_time=213000), "@once 2027-01-15T21:30:00"),
    # Beyond one NCRONTAB: the schedule grammar's clauses (shared/jobs/schedules.py), checked slot
    # by slot against SQL Agent's semantics in tests/unit/test_schedules_sqlagent.py.
    (dict(freq_type=4, interval=2), "0 0 0 * * * ; every 2 days ; from 2026-01-01"),
    (dict(freq_type=8, interval=2, factor=2), "0 0 0 * * 1 ; every 2 weeks ; from 2026-01-01"),
    (dict(freq_type=4, subday_type=4, subday_interval=15, start_time=80000, end_time=170000),
     "* * 8-17 * * * ; every 15 minutes ; between 08:00:00 and 17:00:00"),
    (dict(freq_type=4, subday_type=4, subday_interval=7), "* * * * * * ; every 7 minutes ; between 00:00:00 and 23:59:59"),
    (dict(freq_type=16, interval=1, factor=5), "0 0 0 1 * * ; every 5 months ; from 2026-01-01"),
    (dict(freq_type=32, interval=2, relative=1, factor=1), "0 0 0 * * MON#1"),
    (dict(freq_type=32, interval=8, relative=16, factor=1), "0 0 0 L * *"),
    (dict(freq_type=32, interval=9, relative=1, factor=1), "0 0 0 * * MON-FRI#1"),
    (dict(freq_type=16, interval=31, factor=1, end_date=20271231), "0 0 0 31 * * ; until 2027-12-31"),
])
def test_schedules_ncrontab_expresses_exactly(arguments, expected):
    converted = one(ssms("j", step(1, "SELECT 1"), schedule(**arguments)), "America/New_York")
    assert converted[0].settings["JOB__j__SCHEDULE"] == expected
    assert converted[0].not_carried == [] and converted[0].emitted
    assert_engine_accepts(converted[0].settings)


def test_every_two_hours_runs_once_in_the_hour_the_fall_back_repeats():
    """SQL Agent runs "every 2 hours" once at 02:00 on the night Paris's clocks go back; the
    importer wrote */2, which the engine runs in both passes of that hour (an attack)."""
    from datetime import datetime, timezone

    from shared.jobs.schedules import CronSchedule

    converted = one(ssms("j", step(1, "SELECT 1"), schedule(freq_type=4, subday_type=8, subday_interval=2)),
                    "Europe/Paris")
    expression = converted[0].settings["JOB__j__SCHEDULE"]
    cron = CronSchedule(expression=expression, timezone="Europe/Paris")
    at, slots = datetime(2027, 10, 30, 22, 30, tzinfo=timezone.utc), []
    for _ in range(4):
        at = cron.next_after(at)
        slots.append(at)
    local = [slot.astimezone(ZoneInfo("Europe/Paris")).strftime("%H:%M%z") for slot in slots]
    assert local == ["02:00+0200", "04:00+0100", "06:00+0100", "08:00+0100"], (expression, local)   # not 02:00+0100 too


@pytest.mark.parametrize("arguments, reason", [
    (dict(freq_type=64), "when SQL Server Agent starts"),
    (dict(freq_type=1, start_date=20250101, start_time=10000), "already past"),
    (dict(freq_type=128), "when the CPU is idle"),
    (dict(freq_type=4, enabled=0), "disabled in SQL Agent"),
    (dict(freq_type=4, start_date=20240101, end_date=20250101), "is past: the schedule has ended"),
    (dict(freq_type=4, subday_type=4, subday_interval=30, start_time=220000, end_time=20000), "across midnight"),
])
def test_schedules_ncrontab_cannot_express_are_listed_and_the_job_becomes_on_demand(arguments, reason, capsys,
                                                                                     tmp_path):
    converted = one(ssms("j", step(1, "SELECT 1"), schedule("only", **arguments)))
    assert len(converted) == 1 and converted[0].emitted and converted[0].on_demand
    whats = [(item["what"], item["reason"]) for item in converted[0].not_carried]
    assert whats and all(what == "schedule 'only'" for what, _ in whats) and reason in whats[0][1], whats
    settings = report(converted, "UTC")["settings"]
    assert "JOB__j__SCHEDULE" not in settings and settings["JOB__j__COMMAND"] == "SELECT 1"
    assert_engine_accepts(settings)
    assert any("on-demand job" in note for note in converted[0].notes)
    path = tmp_path / "j.sql"
    path.write_text(ssms("j", step(1, "SELECT 1"), schedule("only", **arguments)))
    assert cli(["import-sqlagent", str(path), "--timezone", "UTC"]) == 1
    capsys.readouterr()


def test_schedules_of_one_job_share_an_ncrontab_where_they_can_and_clauses_get_a_job_of_their_own():
    text = ssms("j", step(1, "SELECT 1"), schedule("a", start_time=10000) + "\n" +
                schedule("b", freq_type=4, interval=3) + "\n" + schedule("c", freq_type=8, interval=1, factor=1,
                                                                             start_time=10000) + "\n" +
                schedule("d", freq_type=4, start_time=20000))
    converted = one(text)
    assert [c.settings[f"JOB__{c.job}__SCHEDULE"] for c in converted] == [
        "0 0 1,2 * * *", "0 0 0 * * * ; every 3 days ; from 2026-01-01", "0 0 1 * * 0"]
    assert all(c.not_carried == [] and c.emitted for c in converted)
    assert_engine_accepts(report(converted, "UTC")["settings"])


def test_a_schedule_nothing_here_runs_is_listed_and_the_others_are_kept():
    converted = one(ssms("j", step(1, "SELECT 1"), schedule("a", start_time=10000) + "\n" +
                         schedule("idle", freq_type=128)))
    assert [c.settings[f"JOB__{c.job}__SCHEDULE"] for c in converted] == ["0 0 1 * * *"]
    assert [item["what"] for item in converted[0].not_carried] == ["schedule 'idle'"]


# ---------------------------------------------------------------- steps, names, the reader


def test_flow_actions_goto_and_steps_left_out_are_renumbered():
    steps = "\n".join([
        step(1, "SELECT 1", success=3, fail=4),
        step(2, "dir C:\\", subsystem="CmdExec"),
        step(3, "SELECT 3", success=4, fail=2, retries=150, interval=2000),
    ]).replace("@on_fail_step_id=0,\n\t\t@retry_attempts=0,\n\t\t@retry_interval=0,\n\t\t@os_run_priority=0, "
               "@subsystem=N'TSQL',\n\t\t@command=N'SELECT 1'", "@on_fail_step_id=3,\n\t\t@retry_attempts=0,\n\t\t"
               "@retry_interval=0,\n\t\t@os_run_priority=0, @subsystem=N'TSQL',\n\t\t@command=N'SELECT 1'")
    steps = steps.replace("@on_success_action=4,\n\t\t@on_success_step_id=0", "@on_success_action=4,\n\t\t"
                          "@on_success_step_id=1")
    converted = one(ssms("flow", steps, schedule()))[0]
    s = converted.settings
    assert (s["JOB__flow__STEPS__1__ON_SUCCESS"], s["JOB__flow__STEPS__1__ON_FAILURE"]) == ("next", "goto:2")
    assert s["JOB__flow__STEPS__2__COMMAND"] == "SELECT 3" and s["JOB__flow__STEPS__2__ON_SUCCESS"] == "goto:1"
    assert s["JOB__flow__STEPS__2__MAX_ATTEMPTS"] == "100" and s["JOB__flow__STEPS__2__RETRY_INTERVAL_SECONDS"] == "86400"
    whats = [item["what"] for item in converted.not_carried]
    assert whats == ["step 2 ('step 2')", "step 3 @retry_attempts=150", "step 3 @retry_interval=2000"]
    assert any("3->2" in note for note in converted.notes)
    assert_engine_accepts(s)


def test_a_goto_to_a_step_left_out_quits_with_failure_and_is_listed():
    steps = step(1, "SELECT 1", fail=4).replace("@on_fail_step_id=0", "@on_fail_step_id=2") + "\n" + \
        step(2, "Get-Date", subsystem="PowerShell")
    converted = one(ssms("g", steps, schedule()))[0]
    assert converted.settings["JOB__g__COMMAND"] == "SELECT 1"          # one step left: a one-step job
    assert any(item["what"] == "step 1 @on_fail_action=4" for item in converted.not_carried)


def test_system_databases_and_bad_database_names_are_listed_not_emitted_as_database():
    steps = step(1, "SELECT 1", database="master") + "\n" + step(2, "SELECT 2", database="My Db", success=1)
    steps = steps.replace("@on_success_action=1,\n\t\t@on_success_step_id=0,\n\t\t@on_fail_action=2,\n\t\t"
                          "@on_fail_step_id=0,\n\t\t@retry_attempts=0,\n\t\t@retry_interval=0,\n\t\t@os_run_priority=0, "
                          "@subsystem=N'TSQL',\n\t\t@command=N'SELECT 1'",
                          "@on_success_action=3,\n\t\t@on_success_step_id=0,\n\t\t@on_fail_action=2,\n\t\t"
                          "@on_fail_step_id=0,\n\t\t@retry_attempts=0,\n\t\t@retry_interval=0,\n\t\t@os_run_priority=0, "
                          "@subsystem=N'TSQL',\n\t\t@command=N'SELECT 1'")
    converted = one(ssms("d", steps, schedule()))[0]
    assert not any(key.endswith("DATABASE") for key in converted.settings)
    whats = [item["what"] for item in converted.not_carried]
    assert whats == ["step 1 @database_name='master'", "step 2 @database_name='My Db'"]
    assert_engine_accepts(converted.settings)


def test_job_names_become_setting_names_valid_everywhere_and_unique():
    taken: set[str] = set()
    assert setting_name("Sauvegarde générale (nuit)", taken) == "Sauvegarde_generale_nuit"
    assert setting_name("a__b", taken) == "a_b"
    assert setting_name("A  B", taken) == "A_B_2"                 # a_b is taken (names compare case-insensitively)
    assert setting_name("a b", taken) == "a_b_3"
    assert setting_name("__", taken) == "job"
    assert setting_name("x" * 100, taken) == "x" * 64
    assert setting_name("x" * 100, taken) == "x" * 62 + "_2"
    assert setting_name("日本語", taken) == "job_2"
    for name in taken:
        assert parse_jobs({f"JOB__{name}__SCHEDULE": "0 0 0 * * *", f"JOB__{name}__COMMAND": "SELECT 1"})[1] == ()


def test_variables_bracketed_names_and_shared_schedules_by_name():
    text = """
DECLARE @db sysname = N'ledger', @cmd nvarchar(max)
SET @cmd = N'EXEC dbo.post_entries @note = N''it''''s done'';'
DECLARE @jobId uniqueidentifier
EXECUTE [msdb].[dbo].[sp_add_job] @job_name = N'Post entries', @enabled = 1, @job_id = @jobId OUTPUT;
EXEC msdb.dbo.sp_add_jobstep @job_name = N'Post entries', @step_id = 1, @step_name = N'post',
    @subsystem = N'TSQL', @database_name = @db, @command = @cmd, @retry_attempts = 2, @retry_interval = 1
GO
EXEC msdb.dbo.sp_add_schedule @schedule_name = N'Hourly at :05', @freq_type = 4, @freq_interval = 1,
    @freq_subday_type = 8, @freq_subday_interval = 1, @active_start_time = 500
GO
EXEC msdb.dbo.sp_attach_schedule @job_name = N'Post entries', @schedule_name = N'Hourly at :05'
EXEC msdb.dbo.sp_attach_schedule @job_name = N'Post entries', @schedule_name = N'Not in this script'
EXEC msdb.dbo.sp_add_jobserver @job_name = N'Post entries', @server_name = N'OTHERSERVER'
"""
    converted = one(text)[0]
    p = "JOB__Post_entries__"
    assert converted.settings[p + "STEPS__1__COMMAND"] == "EXEC dbo.post_entries @note = N'it''s done';"
    assert converted.settings[p + "STEPS__1__DATABASE"] == "ledger"
    assert converted.settings[p + "STEPS__1__RETRY_INTERVAL_SECONDS"] == "60"
    assert converted.settings[p + "SCHEDULE"] == "0 5 * * * *"
    listed = {item["what"]: item["reason"] for item in converted.not_carried}
    assert list(listed) == ["sp_attach_schedule", "target server 'OTHERSERVER'", "@notify_level_eventlog=2"]
    # SQL Server refuses to attach a schedule msdb does not have; the import says so, at its line.
    assert "error 14262" in listed["sp_attach_schedule"] and "'Not in this script'" in listed["sp_attach_schedule"]
    assert [item.get("line") for item in converted.not_carried][0] == 13
    assert "sp_add_job's default" in listed["@notify_level_eventlog=2"]
    assert_engine_accepts(converted.settings)


def test_the_reader_uses_a_tokenizer_so_strings_and_comments_hide_nothing_and_invent_nothing():
    text = """/* EXEC msdb.dbo.sp_add_job @job_name=N'commented out' /* nested */ still a comment */
-- EXEC msdb.dbo.sp_add_job @job_name=N'also commented out'
DECLARE @j uniqueidentifier
EXEC msdb.dbo.sp_add_job @job_name=N'real', @job_id = @j OUTPUT
EXEC msdb.dbo.sp_add_jobstep @job_id=@j, @step_id=1, @step_name=N's', @database_name=N'sales',
    @command=N'EXEC msdb.dbo.sp_add_job @job_name=N''inside a string''
GO
SELECT 1'
"""
    converted = convert_script([("x.sql", text)], "UTC", today=TODAY)
    assert [c.sql_agent_name for c in converted] == ["real"]
    settings = converted[0].settings
    # The GO inside the string is the step's: SQL Agent runs its two batches (here two steps).
    assert (settings["JOB__real__STEPS__1__COMMAND"], settings["JOB__real__STEPS__2__COMMAND"]) == (
        "EXEC msdb.dbo.sp_add_job @job_name=N'inside a string'", "SELECT 1")
    # A job the script does not create: the call fails on SQL Server (nothing to carry), and says so.
    missing = convert_script([("x.sql", "EXEC msdb.dbo.sp_add_jobstep @job_name=N'nope', @step_name=N's', "
                                        "@command=N'SELECT 1'")], "UTC", today=TODAY)
    assert list(missing) == [] and "error 14262" in missing.not_carried[0]["reason"]
    # An expression as an argument: SQL Server refuses to compile the batch; none of it runs.
    refused = convert_script([("x.sql", "EXEC msdb.dbo.sp_add_job @job_name=N'j'\n"
                                        "EXEC msdb.dbo.sp_add_jobstep @job_name=N'j', @step_name=N's', "
                                        "@command=N'SELECT ' + N'1'")], "UTC", today=TODAY)
    assert list(refused) == []
    finding, nothing = refused.not_carried
    assert (finding["line"], finding["what"]) == (2, "batch") and "'+' after the value" in finding["reason"]
    assert "nothing to import" in nothing["reason"]
    with pytest.raises(ScriptError, match=r"x.sql, line 1, column 36: unterminated string"):
        convert_script([("x.sql", "EXEC msdb.dbo.sp_add_job @job_name=N'unterminated")], "UTC")


def test_a_job_with_no_t_sql_step_is_listed_not_emitted_and_one_with_no_schedule_is_on_demand():
    converted = one(ssms("ps", step(1, "Get-Date", subsystem="PowerShell"), schedule()))[0]
    assert not converted.emitted and any(item["what"] == "steps" for item in converted.not_carried)
    converted = one(ssms("adhoc", step(1, "SELECT 1"), ""))
    assert [c.on_demand for c in converted] == [True] and converted[0].not_carried == []
    assert converted[0].settings == {"JOB__adhoc__COMMAND": "SELECT 1", "JOB__adhoc__MAX_ATTEMPTS": "1",
                                     "JOB__adhoc__DATABASE": "sales", "JOB__adhoc__TIMEZONE": "UTC", "JOB__adhoc__MISFIRE": "skip",
                                     "JOB__adhoc__ENABLED": "true"}
    assert report(converted, "UTC")["complete"] is True
    assert_engine_accepts(converted[0].settings)


# ---------------------------------------------------------------- --apply


def test_apply_defines_the_scheduled_jobs_with_add_scheduled_job_on_postgres(pg_url, tmp_path, capsys):
    agent = make_agent(pg_url)
    text = (HERE / "several_jobs.sql").read_text(encoding="utf-8") + ssms(
        "one time", step(1, "SELECT 42", database="reports"), schedule(freq_type=1, start_date=20310304,
                                                                        start_time=50607)) + ssms(
        "two steps", step(1, "SELECT 1", success=3) + "\n" + step(2, "SELECT 2"), schedule(start_time=10000)) + ssms(
        "by hand", step(1, "SELECT 7"), "")
    path = tmp_path / "jobs.sql"
    path.write_text(text, encoding="utf-8")
    code = cli(["--db", pg_url, "import-sqlagent", str(path), "--timezone", "Europe/Paris", "--apply"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1                                      # things were left out, and one job was not applied
    assert sorted(a["job"] for a in out["applied"]) == ["Month_end_close", "one_time", "purge_audit", "purge_audit_2",
                                                        "two_steps"]
    assert {r["job"]: r["reason"][:40] for r in out["not_applied"]} == {
        "by_hand": "agent.add_scheduled_job needs @schedule ",
        # Defined, and what the procedure has no parameter for is said (@notify_level_email=2).
        "purge_audit": "defined without JOB__purge_audit__NOTIFY",
        "purge_audit_2": "defined without JOB__purge_audit_2__NOTI"}
    assert all("agent.add_scheduled_job has no @notify" in r["reason"] for r in out["not_applied"] if r["job"] != "by_hand")
    assert "JOB__by_hand__SCHEDULE" not in out["settings"] and "JOB__by_hand__COMMAND" in out["settings"]
    assert "JOB__two_steps__STEPS__2__COMMAND" in out["settings"]
    agent.tick()
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    databases = dict(query(agent, "SELECT job_name, target_database FROM agent.jobs"))
    purge = jobs["purge_audit"]
    assert (purge["schedule"], purge["timezone"], purge["enabled"], purge["max_attempts"],
            databases["purge_audit"], purge["valid"], purge["source"]) == (
        "0 */5 1-6 * * *", "Europe/Paris", 0, 4, "audit", 1, "database")
    close = jobs["Month_end_close"]
    assert close["valid"] == 1 and close["next_due_at"].astimezone(ZoneInfo("Europe/Paris")).hour == 6
    once = jobs["one_time"]
    assert once["valid"] == 1 and databases["one_time"] == "reports"
    assert once["next_due_at"] == datetime(2031, 3, 4, 5, 6, 7, tzinfo=ZoneInfo("Europe/Paris")).astimezone(UTC)
    assert jobs["two_steps"]["valid"] == 1 and "by_hand" not in jobs


def steps_script() -> str:
    """Jobs with steps of every kind the importer writes: several steps with a flow, retries and a
    retry interval, cut into two jobs by their schedules (nightly_maintenance.sql); batches cut at
    GO; one step with a retry interval; a one-time job with steps; and a one-step job (no steps)."""
    return (HERE / "nightly_maintenance.sql").read_text(encoding="utf-8") + ssms(
        "batches", step(1, "SELECT 1;\nGO\nUSE reports;\nGO\nSELECT 2;", database="sales") + "\n"
        + step(2, "SELECT 3", database="master"), schedule(start_time=30000)) + ssms(
        "retry later", step(1, "EXEC dbo.flaky", retries=2, interval=7), schedule(start_time=40000)) + ssms(
        "once with steps", step(1, "SELECT 'a'", success=3, fail=3) + "\n" + step(2, "SELECT 'b'", database="x y"),
        schedule(freq_type=1, start_date=20310304, start_time=50607)) + ssms(
        "plain", step(1, "SELECT 42"), schedule(start_time=60000))


def planned_steps(agent) -> dict[str, object]:
    """agent.jobs.steps (as the engine planned or synced them) by job, read back as JSON."""
    return {name: None if steps is None else json.loads(steps)
            for name, steps in query(agent, "SELECT job_name, steps FROM agent.jobs WHERE configured = 1")}


def test_apply_gives_a_job_with_steps_the_steps_its_printed_settings_give_it(pg_url, tmp_path, capsys):
    """--apply defines each job with steps by agent.add_scheduled_job and agent.set_job_steps:
    once the engine planned them, agent.jobs.steps are, job by job, what the settings sync writes
    for the printed JOB__<name>__STEPS__<n>__* of the same script on another control database."""
    path = tmp_path / "jobs.sql"
    path.write_text(steps_script(), encoding="utf-8")
    applied = make_agent(pg_url)
    code = cli(["--db", pg_url, "import-sqlagent", str(path), "--timezone", "Europe/Paris", "--apply"])
    out = json.loads(capsys.readouterr().out)
    names = ["Nightly_maintenance_O_Brien_s_DB", "Nightly_maintenance_O_Brien_s_DB_2", "batches", "once_with_steps",
             "plain", "retry_later"]
    assert sorted(a["job"] for a in out["applied"]) == names and out["not_applied"] == [], out["not_applied"]
    assert code == 1                          # the system database and the bad name are listed
    settings = out["settings"]
    assert "JOB__retry_later__STEPS__1__RETRY_INTERVAL_SECONDS" in settings and "JOB__batches__STEPS__3__COMMAND" in \
        settings and "JOB__plain__COMMAND" in settings
    applied.tick()
    from_procedures = planned_steps(applied)
    name, url = create_pg_database()
    try:
        synced = make_agent(url, **settings)
        synced.tick()
        from_settings = planned_steps(synced)
        synced.close()
    finally:
        drop_pg_database(name)
    assert sorted(from_procedures) == sorted(from_settings) == names
    assert from_procedures == from_settings
    assert from_procedures["plain"] is None and len(from_procedures["Nightly_maintenance_O_Brien_s_DB"]) == 3
    assert [(s["command"], s["database"]) for s in from_procedures["batches"]] == [
        ("SELECT 1;", "sales"), ("SELECT 2;", "reports"), ("SELECT 3", None)]      # USE: the next batch's database
    (retried,) = from_procedures["retry_later"]
    assert (retried["max_attempts"], retried["retry_interval_seconds"]) == (3, 420)
    jobs = {r["job_name"]: r for r in applied.store().execute("list_jobs").rows}
    assert all(jobs[n]["valid"] == 1 and jobs[n]["source"] == "database" for n in names), \
        {n: jobs[n]["config_error"] for n in names}
    assert jobs["once_with_steps"]["next_due_at"] == datetime(2031, 3, 4, 5, 6, 7,
                                                              tzinfo=ZoneInfo("Europe/Paris")).astimezone(UTC)
    # Each job with steps: its define and its set-steps rows (the procedures'), then the import's.
    trail = query(applied, "SELECT action, job_name FROM agent.audit ORDER BY audit_id")
    assert sorted(job for action, job in trail if action == "set-steps") == [n for n in names if n != "plain"]
    assert sorted(job for action, job in trail if action == "define") == names


def test_apply_again_redefines_a_job_and_its_steps_follow_the_script(pg_url, tmp_path, capsys):
    """A second --apply of a changed script: a job with steps gets its new steps; a job that has
    one command now has none (a redefinition keeps the steps set before: --apply clears them)."""
    agent = make_agent(pg_url)
    path = tmp_path / "jobs.sql"

    def apply(text: str) -> dict:
        path.write_text(text, encoding="utf-8")
        code = cli(["--db", pg_url, "import-sqlagent", str(path), "--timezone", "UTC", "--apply"])
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and out["not_applied"] == [], out
        agent.tick()
        return {a["job"]: a["action"] for a in out["applied"]}

    two = step(1, "SELECT 1", success=3) + "\n" + step(2, "SELECT 2")
    assert apply(ssms("a", two, schedule()) + ssms("b", two, schedule())) == {"a": "defined", "b": "defined"}
    assert [len(planned_steps(agent)[n]) for n in "ab"] == [2, 2]
    three = step(1, "SELECT 1", success=3) + "\n" + step(2, "SELECT 2", success=3) + "\n" + step(3, "SELECT 3")
    assert apply(ssms("a", three, schedule()) + ssms("b", step(1, "SELECT 9"), schedule())) == {
        "a": "redefined", "b": "redefined"}
    steps = planned_steps(agent)
    assert [s["command"] for s in steps["a"]] == ["SELECT 1", "SELECT 2", "SELECT 3"] and steps["b"] is None
    (command,) = query(agent, "SELECT command FROM agent.jobs WHERE job_name = 'b'")[0]
    assert command == "SELECT 9"


def test_apply_of_a_job_whose_steps_the_procedure_refuses_keeps_nothing_of_it(pg_url):
    """The job and its steps are one transaction: agent.set_job_steps refusing the steps (more
    than it takes) leaves no job behind (not a one-command job running its first step), and the
    job after it is defined."""
    agent = make_agent(pg_url)
    steps = json.dumps([{"sql": "SELECT 1"}, {"sql": "SELECT 2"}])
    calls = [{"name": name, "sql": "SELECT 1", "schedule": "0 0 1 * * *", "timezone": "UTC", "misfire": "skip",
              "steps": steps + (" " * 1000000 if name == "bad" else "")} for name in ("bad", "good")]
    applied = apply_import(agent.target, calls)
    assert [job.job for job in applied.jobs] == ["good"]
    (refused,) = applied.jobs_not_added
    assert refused.job == "bad" and refused.reason.startswith("agent.set_job_steps refused it: agent.set_job_steps: "
                                                              "@steps = ")
    assert "rolled back with its agent.add_scheduled_job: the job is as it was before" in refused.reason
    agent.tick()
    steps = planned_steps(agent)
    assert set(steps) == {"good"} and [s["command"] for s in steps["good"]] == ["SELECT 1", "SELECT 2"]


def test_settings_the_agent_refuses_are_not_emitted_but_listed_with_the_agents_own_error():
    text = ("DECLARE @j uniqueidentifier, @k uniqueidentifier\n"
            "EXEC msdb.dbo.sp_add_job @job_name=N'n', @notify_level_eventlog=0, @job_id=@j OUTPUT\n"
            "EXEC msdb.dbo.sp_add_jobstep @job_id=@j, @step_id=1, @step_name=N's', @database_name=N'd', "
            "@command=N'SELECT 1\x00'\n"
            "EXEC msdb.dbo.sp_add_jobschedule @job_id=@j, @name=N's', @freq_type=4, @freq_interval=1\n"
            "EXEC msdb.dbo.sp_add_jobserver @job_id=@j\n"
            "EXEC msdb.dbo.sp_add_job @job_name=N'ok', @notify_level_eventlog=0, @job_id=@k OUTPUT\n"
            "EXEC msdb.dbo.sp_add_jobstep @job_id=@k, @step_id=1, @step_name=N's', @database_name=N'd', "
            "@command=N'SELECT 2'\n"
            "EXEC msdb.dbo.sp_add_jobserver @job_id=@k\n")
    converted = {c.job: c for c in one(text)}
    assert not converted["n"].emitted
    (item,) = converted["n"].not_carried
    assert item["what"] == "job n" and "NUL character" in item["reason"]
    settings = report(list(converted.values()), "UTC")["settings"]
    assert set(settings) == {"JOB__ok__COMMAND", "JOB__ok__MAX_ATTEMPTS", "JOB__ok__TIMEZONE", "JOB__ok__MISFIRE", "JOB__ok__ENABLED",
                             "JOB__ok__DATABASE"}


def test_apply_on_sqlite_is_refused_with_one_line(tmp_path, capsys):
    code = cli(["--db", f"sqlite:///{tmp_path / 'agent.db'}", "import-sqlagent", str(HERE / "several_jobs.sql"),
                "--timezone", "UTC", "--apply"])
    assert code == 2
    err = capsys.readouterr().err
    assert "import-sqlagent --apply needs a PostgreSQL or SQL Server control database" in err


@pytest.mark.parametrize("levels, notify", [
    ("@notify_level_page=1, @notify_page_operator_name=N'on call'", "on_success"),
    ("@notify_level_netsend=3, @notify_netsend_operator_name=N'ops'", "on_completion"),
    ("@notify_level_page=1, @notify_page_operator_name=N'a', @notify_level_netsend=2, "
     "@notify_netsend_operator_name=N'b'", "on_completion"),
])
def test_operator_notification_levels_become_notify(levels, notify):
    text = ssms("n", step(1, "SELECT 1"), schedule(), extra_job=", " + levels)
    # SSMS writes each level once: these replace the template's zeros.
    text = text.replace("\t\t@notify_level_netsend=0,\n", "").replace("\t\t@notify_level_page=0,\n", "")
    assert text.count("@notify_level_page") <= 1 and text.count("@notify_level_netsend") <= 1
    (converted,) = one(text)
    assert converted.settings["JOB__n__NOTIFY"] == notify
    assert all("operators are not carried" in item["reason"] for item in converted.not_carried)
    assert_engine_accepts(converted.settings)


def test_a_step_that_starts_another_job_is_listed_with_the_after_that_replaces_it():
    """SQL Agent chains with EXEC msdb.dbo.sp_start_job in a step: there is no msdb in Azure SQL
    Database, so the step is listed with what replaces it here (the started job's AFTER)."""
    steps = "\n".join([
        step(1, "EXEC etl.load_day;", success=3),
        step(2, "EXEC msdb.dbo.sp_start_job @job_name = N'O''Brien rebuild';", success=1),
        step(3, "exec @rc = [msdb].[dbo].[sp_start_job] N'report'", success=1),
        step(4, "DECLARE @j SYSNAME = N'x'; EXECUTE msdb..sp_start_job @job_name = @j;", success=1),
    ])
    converted = one(ssms("load", steps, schedule()))[0]
    listed = {item["what"]: item["reason"] for item in converted.not_carried}
    assert "make job \"O'Brien rebuild\" follow this one instead, JOB__<its name>__AFTER=load" in \
        listed["step 2 ('step 2') EXEC sp_start_job"]
    assert "make job 'report' follow this one" in listed["step 3 ('step 3') EXEC sp_start_job"]
    assert "make the job it starts follow this one" in listed["step 4 ('step 4') EXEC sp_start_job"]
    assert converted.settings["JOB__load__STEPS__2__COMMAND"].startswith("EXEC msdb.dbo.sp_start_job")  # still copied
    untouched = one(ssms("plain", step(1, "SELECT 'EXEC of sp_start_job is only words here'"), schedule()))[0]
    assert untouched.not_carried == []


def test_an_imported_job_never_runs_a_slot_it_missed_as_sql_agent_never_does(tmp_path):
    """SQL Server Agent does not run a slot it missed (stopped, or a one-time moment already past
    when the job reaches the server): the imported jobs say MISFIRE=skip, in the settings and
    through --apply. Deployed after its moment, the one-time job is recorded skipped, not run."""
    converted = one(ssms("j", step(1, "SELECT 1"), schedule(freq_type=1, start_date=20270115, start_time=150000)))
    settings = converted[0].settings
    assert settings["JOB__j__MISFIRE"] == "skip" and converted[0].apply["misfire"] == "skip"
    (job,), invalid = parse_jobs(settings)
    assert invalid == () and job.misfire == "skip"
    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}", {"j": {k[len("JOB__j__"):]: v for k, v in settings.items()}})
    agent.tick(datetime(2027, 1, 15, 16, 0, tzinfo=UTC))       # an hour after the moment
    (run,) = agent.store().execute("list_history", job_name="j", limit=5).rows
    assert run["status"] == "skipped"
