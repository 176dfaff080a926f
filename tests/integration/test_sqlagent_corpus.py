"""import-sqlagent on a corpus of real-shaped scripts (tests/integration/sqlagent/corpus): SSMS's
scripts of several SQL Server versions, a dbatools export, installers that build their jobs in
variables or from a table, scripts written from the documentation, and hostile ones (names,
control flow, step commands, schedules, every encoding). Each file's outcome is asserted: what
is imported, and what is listed as not carried, with its line."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from shared.cli.commands import main as cli
from shared.jobs.from_settings import parse_jobs
from shared.ops.sqlagent.source import decode_script
from shared.ops.sqlagent_import import convert_script, report

CORPUS = Path(__file__).parent / "sqlagent" / "corpus"
NOW = datetime(2026, 11, 25, 12, 0, 0)


def imported(*names: str):
    texts = [(name, decode_script((CORPUS / name).read_bytes(), name).text) for name in names]
    converted = convert_script(texts, "UTC", now=NOW)
    document = report(converted, "UTC")
    valid, invalid = parse_jobs(document["settings"])
    assert invalid == (), [e for bad in invalid for e in bad.errors]    # every emitted job runs here
    return document


def jobs(document) -> dict:
    out = {}
    for item in document["jobs"]:
        out.setdefault(item["sql_agent_name"], []).append(item)
    return {name: items[0] if len(items) == 1 else items for name, items in out.items()}


def short(item) -> dict[str, str]:
    prefix = f"JOB__{item['job']}__"
    return {key[len(prefix):]: value for key, value in item["settings"].items()}


def listed(item) -> dict[str, str]:
    return {entry["what"]: entry["reason"] for entry in item["not_carried"]}


def script_level(document) -> list[tuple[int, str, str]]:
    return [(entry["line"], entry["what"], entry["reason"]) for entry in document["not_carried"]]


# ---------------------------------------------------------------- SSMS, dbatools


def test_ssms_2008r2_drop_and_create():
    document = imported("ssms_2008r2_drop_and_create.sql")
    # The DROP half finds no such job in msdb (this import starts from an empty one): no call.
    assert script_level(document) == []
    job = jobs(document)["DBA - Backup FULL"]
    assert short(job) == {
        "STEPS__1__COMMAND": "EXECUTE [dbo].[DatabaseBackup] @Databases = 'USER_DATABASES', @BackupType = 'FULL'",
        "STEPS__1__MAX_ATTEMPTS": "2", "STEPS__1__RETRY_INTERVAL_SECONDS": "600", "STEPS__1__DATABASE": "DBA",
        "STEPS__1__ON_SUCCESS": "next", "STEPS__1__ON_FAILURE": "quit_failure", "TIMEZONE": "UTC", "MISFIRE": "skip",
        "NOTIFY": "on_failure", "ENABLED": "true", "SCHEDULE": "0 0 23 * * *"}
    assert list(listed(job)) == [
        "@notify_level_email=2 to operator 'DBA Team'", "@notify_level_eventlog=2",
        "step 1 ('Backup') @output_file_name=" + repr("$(ESCAPE_SQUOTE(SQLDIR))\\Log\\Backup_$(ESCAPE_SQUOTE(JOBID))_"
                                                 "$(ESCAPE_SQUOTE(STEPID))_$(ESCAPE_SQUOTE(STRTDT))_"
                                                 "$(ESCAPE_SQUOTE(STRTTM)).txt"),
        "step 2 ('Copy to share')"]
    assert listed(job)["step 2 ('Copy to share')"].startswith("subsystem CmdExec")
    assert document["complete"] is False


def test_ssms_2016_two_jobs_share_a_schedule_and_tokens_are_replaced():
    document = imported("ssms_2016_two_jobs_share_a_schedule.sql")
    load, publish = jobs(document)["ETL - load"], jobs(document)["ETL - publish"]
    s = short(load)
    assert s["STEPS__1__COMMAND"] == "EXEC etl.stage @run = N'ETL - load / stage';"
    assert s["STEPS__3__COMMAND"] == "INSERT etl.failures (job, step) VALUES (N'ETL - load', 3);"
    assert (s["STEPS__1__ON_FAILURE"], s["STEPS__2__ON_FAILURE"], s["STEPS__3__ON_SUCCESS"]) == (
        "goto:3", "next", "quit_failure")
    assert s["SCHEDULE"] == short(publish)["SCHEDULE"] == "0 0 6 * * 1,2,3,4,5"
    assert any("shared in SQL Agent with 'ETL - publish'" in note for note in load["notes"])
    assert (short(publish)["STEPS__1__MAX_ATTEMPTS"], short(publish)["STEPS__1__RETRY_INTERVAL_SECONDS"]) == ("4", "60")
    assert document["complete"] is True


def test_ssms_2022_schedules_one_time_disabled_and_last_friday():
    document = imported("ssms_2022_schedules.sql")
    recurring, last_friday, once = jobs(document)["Reports: month-end"]
    assert short(recurring)["SCHEDULE"] == "0 0 0-20/4 * * *"
    assert short(last_friday)["SCHEDULE"] == "0 0 18 * * FRI#L"     # a job of its own: its own NCRONTAB
    assert short(once)["SCHEDULE"] == "@once 2031-12-31T22:00:00"
    reasons = listed(recurring)
    assert "schedule 'Last Friday of the month'" not in reasons
    assert reasons["schedule 'Paused for the audit'"].startswith("disabled in SQL Agent")
    assert script_level(document) == []


def test_dbatools_export():
    document = imported("dbatools_export.sql")
    collect, purge = jobs(document)["Collect wait stats"], jobs(document)["Purge wait stats"]
    assert short(collect)["SCHEDULE"] == "0 */10 * * * *"
    assert (short(purge)["SCHEDULE"], short(purge)["ENABLED"]) == ("0 15 4 * * 0", "false")
    assert document["complete"] is True


# ---------------------------------------------------------------- installers and hand-written scripts


def test_an_installer_building_its_jobs_in_variables():
    document = imported("ola_style_installer.sql")
    found = jobs(document)
    assert list(found) == ["DatabaseBackup - USER_DATABASES - FULL", "IndexOptimize - USER_DATABASES",
                           "sp_purge_jobhistory"]            # the second IF NOT EXISTS finds the job: no duplicate
    backup = short(found["DatabaseBackup - USER_DATABASES - FULL"])
    assert backup["COMMAND"] == ("EXECUTE [dbo].[DatabaseBackup]\r\n@Databases = 'USER_DATABASES',\r\n"
                                 "@Directory = N'\\\\backup01\\sql',\r\n@BackupType = 'FULL',\r\n@CleanupTime = 168,"
                                 "\r\n@LogToTable = 'Y'")
    assert (backup["DATABASE"], backup["SCHEDULE"]) == ("dba", "0 0 1 * * *")
    (output,) = listed(found["DatabaseBackup - USER_DATABASES - FULL"])
    assert output.endswith("@output_file_name=" + repr("$(ESCAPE_SQUOTE(SQLLOGDIR))\\$(ESCAPE_SQUOTE(JOBNAME))_"
                                                        "$(ESCAPE_SQUOTE(STEPID))_$(ESCAPE_SQUOTE(DATE))_"
                                                        "$(ESCAPE_SQUOTE(TIME)).txt"))
    index = short(found["IndexOptimize - USER_DATABASES"])
    assert index["STEPS__1__COMMAND"] == ("EXECUTE [dbo].[IndexOptimize] @Databases = 'USER_DATABASES', @LogToTable = "
                                          "'Y';\r\nPRINT N'IndexOptimize - USER_DATABASES done';")
    assert (index["SCHEDULE"], index["STEPS__1__MAX_ATTEMPTS"]) == ("0 30 3 * * 0", "3")
    assert list(listed(found["sp_purge_jobhistory"])) == ["step 1 @database_name='msdb'"]


def test_an_installer_whose_jobs_come_from_a_table_is_listed_call_by_call():
    document = imported("table_driven_installer.sql")
    assert document["jobs"] == [] and document["complete"] is False
    assert [(line, what) for line, what, _ in script_level(document)] == [
        (36, "sp_add_job"), (37, "sp_add_jobstep"), (39, "sp_add_jobserver")]
    assert all("@job_name is not known before the script runs (a value read from a table or view at line 29)"
               in reason for _, _, reason in script_level(document))


def test_a_script_written_from_the_documentation():
    document = imported("hand_written_docs_style.sql")
    job = jobs(document)["Weekly Sales Data Backup"]
    assert short(job) == {
        "STEPS__1__COMMAND": "ALTER DATABASE Sales SET READ_ONLY", "STEPS__1__MAX_ATTEMPTS": "6",
        "STEPS__1__RETRY_INTERVAL_SECONDS": "300", "STEPS__1__DATABASE": "Sales", "STEPS__1__ON_SUCCESS": "next",
        "STEPS__1__ON_FAILURE": "quit_failure",
        "STEPS__2__COMMAND": "BACKUP DATABASE Sales TO DISK = N'D:\\Backup\\Sales.bak' WITH INIT",
        "STEPS__2__MAX_ATTEMPTS": "1", "STEPS__2__DATABASE": "Sales", "STEPS__2__ON_SUCCESS": "quit_success",
        "STEPS__2__ON_FAILURE": "quit_failure", "TIMEZONE": "UTC", "MISFIRE": "skip", "ENABLED": "true", "SCHEDULE": "0 30 23 * * *"}
    assert document["complete"] is True


def test_updates_and_deletes_after_creation():
    document = imported("updates_after_creation.sql")
    found = jobs(document)
    assert list(found) == ["nightly", "weekly report", "new name", "old name"]     # 'temporary' was deleted
    nightly = short(found["nightly"])
    # Inserted at 2, then the step at 3 deleted: extract, validate, load, alert; the gotos follow.
    assert [nightly[f"STEPS__{n}__COMMAND"] for n in range(1, 5)] == [
        "EXEC etl.extract @full = 1;", "EXEC etl.validate;", "EXEC etl.load;", "EXEC etl.alert;"]
    assert (nightly["STEPS__1__MAX_ATTEMPTS"], nightly["STEPS__3__ON_FAILURE"]) == ("3", "goto:4")
    assert nightly["SCHEDULE"] == "0 30 1 * * *"          # updated to 01:30; 'hourly' detached
    weekly = found["weekly report"]
    assert short(weekly)["ENABLED"] == "false" and "SCHEDULE" not in short(weekly)
    assert listed(weekly)["schedule 'Mondays'"].startswith("disabled in SQL Agent")
    assert (short(found["new name"])["COMMAND"], short(found["old name"])["COMMAND"]) == ("SELECT 1", "SELECT 2")
    # sp_delete_job took the schedule only 'temporary' used: sp_delete_schedule then finds none.
    ((line, what, reason),) = script_level(document)
    assert (line, what) == (45, "sp_delete_schedule") and "error 14262" in reason


# ---------------------------------------------------------------- hostile scripts


def test_hostile_control_flow():
    document = imported("hostile_flow.sql")
    found = jobs(document)
    assert list(found) == ["loop 1", "loop 2", "loop 3", "dynamic", "made one", "made two", "only on PROD01"]
    assert short(found["dynamic"])["COMMAND"] == "EXEC dbo.nightly;"
    assert short(found["made two"])["ENABLED"] == "false"          # the OUTPUT job_id came back from the procedure
    undecided = found["only on PROD01"]
    assert undecided["emitted"] is False
    assert "known only when the script runs (@@SERVERNAME)" in listed(undecided)["IF @@SERVERNAME = N'PROD01'"]
    assert [(line, what) for line, what, _ in script_level(document)] == [
        (8, "job 'rolled back'"), (14, "sp_add_job"), (18, "job 'caught'"), (73, "UPDATE on msdb's sysjobs"),
        (76, "RAISERROR")]
    names = {item["sql_agent_name"] for item in document["jobs"]}
    assert not names & {"skipped by GOTO", "not executed", "after the disconnect", "rolled back", "caught"}


def test_hostile_names():
    document = imported("hostile_names.sql")
    found = {item["sql_agent_name"]: item["job"] for item in document["jobs"]}
    assert found == {
        "quote's; DROP TABLE x; -- /* and */": "quote_s_DROP_TABLE_x_and",
        '[brackets]]] and "double" quotes': "brackets_and_double_quotes",
        "Sauvegarde générale — 夜間": "Sauvegarde_generale",
        "שלום \u202eright-to-left": "right_to_left",
        "combining e\u0301": "combining_e",
        "padded": "padded",                                  # msdb trims the name
        "SELECT": "SELECT",
        "NoQuotesAtAll": "NoQuotesAtAll",                    # an unquoted word is a string argument
        "x" * 128: "x" * 64,                                 # @job_name is sysname: 128 characters
    }
    lines = script_level(document)
    assert lines[0][:2] == (9, "sp_add_job") and "error 14261" in lines[0][2] and "PADDED" in lines[0][2]
    assert all("without N holding characters outside Windows-1252" in reason for _, _, reason in lines[1:4])
    assert lines[4][:2] == (30, "batch") and "not an expression" in lines[4][2]
    assert len(lines) == 5


def test_hostile_step_commands():
    document = imported("hostile_steps.sql")
    found = jobs(document)
    batches = short(found["batches"])
    assert [(batches[f"STEPS__{n}__COMMAND"], batches[f"STEPS__{n}__DATABASE"]) for n in range(1, 5)] == [
        ("EXEC dbo.one;", "sales"), ("EXEC dbo.two;", "archive"), ("EXEC dbo.three;", "archive"),
        ("EXEC dbo.after;", "sales")]
    assert batches["STEPS__4__ON_FAILURE"] == "goto:1"
    assert short(found["not separators"])["STEPS__1__COMMAND"] == "PRINT '\nGO\n';\n/*\nGO\n*/\nSELECT 1;"
    assert short(found["token ok"])["STEPS__1__COMMAND"] == "PRINT N'token ok / first / 1';"
    assert found["old syntax"]["emitted"] is True
    expected = {
        "temp table": "the temporary object #work is used in batches 1 and 2",
        "set option": "batch 1 sets a session option (SET XACT_ABORT ON)",
        "transaction": "batch 1 has BEGIN TRANSACTION",
        "go twice": "GO 2 (line 2)",
        "retried batches": "SQL Agent retries the whole command from its first batch",
        "token no macro": "a token without an escape macro",
        "token case": "not a SQL Agent token (tokens are case-sensitive",
        "token wmi": "a WMI event's property",
        "sqlcmd variable": "'Variable MyVariable not found'",
    }
    for name, reason in expected.items():
        assert found[name]["emitted"] is False, name
        assert any(reason in text for text in listed(found[name]).values()), (name, listed(found[name]))
    # The run-time tokens are carried, left for the step's run to replace (shared/jobs/tokens.py).
    assert found["token date"]["emitted"] is True
    assert short(found["token date"])["STEPS__1__COMMAND"] == (
        "BACKUP LOG x TO DISK = N'x_$(ESCAPE_SQUOTE(DATE))_$(ESCAPE_SQUOTE(TIME)).trn';")
    chain = listed(found["chain"])
    assert "make job 'batches' follow this one instead" in chain["step 1 ('first') EXEC sp_start_job"]
    left = [value for value in document["settings"].values() if "$(" in value]
    assert left == [short(found["token date"])["STEPS__1__COMMAND"]], left


def test_hostile_schedules():
    document = imported("hostile_schedules.sql")
    found = jobs(document)
    refused = {
        "hour 25": "error 14266: The specified '@active_start_time' (250000) is invalid",
        "minute 60": "error 14287: The specified '@active_start_time' (6000) is invalid: the minute is above 59",
        "every 5 seconds": "seconds must be 10 or more",
        "weekly without a factor": "@freq_recurrence_factor (0) must be at least 1",
        "February 30": "'@active_start_date' (20270230) is invalid",
        "on demand (2)": "error 14295",
    }
    for name, reason in refused.items():
        assert "SCHEDULE" not in short(found[name]), name
        assert reason in listed(found[name])["sp_add_jobschedule"], name
    assert script_level(document) == [(30, "sp_add_schedule", script_level(document)[0][2])]
    assert "'@freq_type' (0) is invalid" in script_level(document)[0][2]
    not_here = {
        "once, in the past": "already past",
        "once, no date": "@freq_type=1 (once) on 2026-11-25T00:00:00: already past",
        "across midnight": "a window across midnight",
        "at agent start": "when SQL Server Agent starts",
    }
    for name, reason in not_here.items():
        assert "SCHEDULE" not in short(found[name]) and reason in listed(found[name])["schedule 's'"], name
    assert short(found["every 15 minutes in business hours"])["SCHEDULE"] == "0 */15 8-17 * * 1,2,3,4,5"
    # @active_start_date NULL: SQL Agent's is the day the schedule is made, the import's day here.
    assert short(found["every 3 days"])["SCHEDULE"] == "0 0 0 * * * ; every 3 days ; from 2026-11-25"
    assert short(found["end time 0 is 23:59:59"])["SCHEDULE"] == "0 0 0-18/6 * * *"


# ---------------------------------------------------------------- encodings


SOURCE = CORPUS / "encodings" / "source.sql"


@pytest.mark.parametrize("name, encoding", [
    ("utf8.sql", "UTF-8"),
    ("utf8_bom_crlf.sql", "UTF-8 (byte order mark)"),
    ("utf16le_bom_crlf.sql", "UTF-16 LE (byte order mark)"),
    ("utf16be_bom.sql", "UTF-16 BE (byte order mark)"),
    ("utf16le_no_bom.sql", "UTF-16 LE (no byte order mark)"),
    ("utf16be_no_bom.sql", "UTF-16 BE (no byte order mark)"),
    ("utf32le_bom.sql", "UTF-32 LE (byte order mark)"),
    ("utf32be_no_bom.sql", "UTF-32 BE (no byte order mark)"),
    ("windows1252_crlf.sql", "Windows-1252"),
])
def test_every_encoding_gives_the_same_job(name, encoding, capsys):
    assert (CORPUS / "encodings" / name).read_bytes() != SOURCE.read_bytes() or name == "utf8.sql"
    code = cli(["import-sqlagent", str(CORPUS / "encodings" / name), "--timezone", "UTC", "--json"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0, document
    assert document["sources"][0]["encoding"] == encoding
    settings = {key: value.replace("\r\n", "\n") for key, value in document["settings"].items()}
    assert settings["JOB__Sauvegarde_generale__COMMAND"] == "PRINT N'déjà vu — « ok »';\n-- a comment in the command"
    assert settings["JOB__Sauvegarde_generale__SCHEDULE"] == "0 30 2 * * *"
    assert settings["JOB__Sauvegarde_generale__DATABASE"] == "ventes"
    warned = [w for w in document["warnings"] if "Windows-1252" in w]
    assert bool(warned) == (encoding == "Windows-1252")
    if warned:
        assert "not UTF-8 (byte 0xe9 at line 7, column 52)" in warned[0]


def test_an_encoding_given_with_encoding_is_used_and_an_unknown_one_is_a_usage_error(capsys):
    path = str(CORPUS / "encodings" / "windows1252_crlf.sql")
    assert cli(["import-sqlagent", path, "--timezone", "UTC", "--encoding", "cp1252", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["warnings"] == [] and document["sources"][0]["encoding"] == "cp1252"
    for bad in ("klingon", "base64", ""):
        assert cli(["import-sqlagent", path, "--encoding", bad, "--json"]) == 2
        captured = capsys.readouterr()
        error = json.loads(captured.err)
        assert captured.out == "" and error["kind"] == "usage" and error["setting"] == "--encoding", error
    # The wrong encoding given for a file: the place where it stops decoding is named.
    assert cli(["import-sqlagent", str(CORPUS / "encodings" / "utf16le_bom_crlf.sql"), "--encoding", "utf-8",
                "--json"]) == 2
    assert "not utf-8 at line 1, column 1 (byte 0xff)" in json.loads(capsys.readouterr().err)["error"]


@pytest.mark.parametrize("name, message", [
    ("broken_odd_utf16.sql", "UTF-16 LE (byte order mark) with an odd number of bytes (1557)"),
    ("broken_truncated.sql", "line 9, column 26: unterminated string"),
])
def test_a_broken_file_is_one_clear_error(name, message, capsys):
    assert cli(["import-sqlagent", str(CORPUS / "encodings" / name), "--timezone", "UTC", "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)
    assert error["kind"] == "usage" and message in error["error"], error


@pytest.mark.parametrize("name", ["empty.sql", "only_comments_and_go.sql"])
def test_a_file_with_nothing_to_import_exits_1_with_one_document(name, capsys):
    assert cli(["import-sqlagent", str(CORPUS / "encodings" / name), "--timezone", "UTC", "--json"]) == 1
    document = json.loads(capsys.readouterr().out)
    assert document["jobs"] == [] and document["complete"] is False
    (entry,) = document["not_carried"]
    assert "nothing to import" in entry["reason"]
    assert cli(["import-sqlagent", str(CORPUS / "encodings" / name), "--timezone", "UTC"]) == 1
    assert "nothing to import" in capsys.readouterr().err


def test_the_corpus_files_are_ssms_shaped_where_they_say_so():
    """The SSMS fixtures keep SSMS's own wrapper (so the tests above test that shape)."""
    for name in ("ssms_2008r2_drop_and_create.sql", "ssms_2016_two_jobs_share_a_schedule.sql",
                 "ssms_2022_schedules.sql", "dbatools_export.sql"):
        text = (CORPUS / name).read_text(encoding="utf-8")
        assert "IF (@@ERROR <> 0 OR @ReturnCode <> 0) GOTO QuitWithRollback" in text
        assert "@job_id = @jobId OUTPUT" in text and "QuitWithRollback:" in text
