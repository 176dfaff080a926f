"""import-sqlagent on the scripts people actually have: the faults of issue 34 (item 8), each as
the command sees it (bytes in, one JSON document and an exit code out)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from shared.cli.commands import main as cli

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def run(tmp_path, capsys, content, *arguments: str, name: str = "job.sql"):
    """import-sqlagent on one file (text is written as UTF-8, bytes as they are) with --json:
    (exit code, the document or None, stderr)."""
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8", newline="")
    else:
        path.write_bytes(content)
    code = cli(["import-sqlagent", str(path), "--timezone", "UTC", "--json", *arguments])
    captured = capsys.readouterr()
    document = json.loads(captured.out) if captured.out.strip() else None
    return code, document, captured.err


def job(document, name):
    (found,) = [j for j in document["jobs"] if j["sql_agent_name"] == name]
    return found


def settings_of(document, setting_name):
    return {k[len(f"JOB__{setting_name}__"):]: v for k, v in document["settings"].items()
            if k.startswith(f"JOB__{setting_name}__")}


def reasons(item) -> str:
    return " | ".join(f"{n['what']}: {n['reason']}" for n in item["not_carried"])


# A minimal complete job, hand-written: every property that matters is given, so nothing but
# what a test adds is "not carried".
def plain_job(name="j", command="SELECT 1", *, proc="msdb.dbo.sp_add_job", extra=""):
    name = name.replace("'", "''")
    return f"""EXEC {proc} @job_name = N'{name}', @notify_level_eventlog = 0
EXEC msdb.dbo.sp_add_jobstep @job_name = N'{name}', @step_name = N's1', @database_name = N'sales',
    @command = N'{command.replace("'", "''")}'
EXEC msdb.dbo.sp_add_jobschedule @job_name = N'{name}', @name = N'daily', @freq_type = 4, @freq_interval = 1,
    @active_start_time = 20000
EXEC msdb.dbo.sp_add_jobserver @job_name = N'{name}'
{extra}"""


# ---------------------------------------------------------------- every way T-SQL calls msdb


@pytest.mark.parametrize("proc", ["msdb..sp_add_job", "[msdb]..[sp_add_job]", "MSDB.DBO.SP_ADD_JOB",
                                  "[msdb].[dbo].[sp_add_job]", '"msdb"."dbo"."sp_add_job"'])
def test_every_spelling_of_the_procedure_name_creates_the_job(tmp_path, capsys, proc):
    code, document, err = run(tmp_path, capsys, plain_job(proc=proc))
    assert code == EXIT_OK, err
    assert settings_of(document, "j")["SCHEDULE"] == "0 0 2 * * *"


@pytest.mark.parametrize("proc", ["master.dbo.sp_add_job", "tempdb..sp_add_job", "msdb.sys.sp_add_job"])
def test_a_job_procedure_called_outside_msdb_fails_as_on_sql_server(tmp_path, capsys, proc):
    code, document, err = run(tmp_path, capsys, f"EXEC {proc} @job_name = N'j'\n")
    assert code == EXIT_FAILURE and document["jobs"] == []
    assert "Could not find stored procedure" in document["not_carried"][0]["reason"]
    code, document, err = run(tmp_path, capsys, "USE [master]\nGO\nEXEC sp_add_job @job_name = N'j'\n")
    assert document["jobs"] == [] and "in database 'master'" in document["not_carried"][0]["reason"]


def test_a_command_built_in_a_variable_is_carried_whole(tmp_path, capsys):
    text = """DECLARE @cmd nvarchar(max) = N'EXEC dbo.purge'
SET @cmd = @cmd + N' @days = ' + CAST(30 AS nvarchar(10)) + N';' + CHAR(13) + CHAR(10)
SET @cmd += N'PRINT ''done'';'
EXEC msdb.dbo.sp_add_job @job_name = N'p', @notify_level_eventlog = 0
EXEC msdb.dbo.sp_add_jobstep @job_name = N'p', @step_name = N's', @database_name = N'sales', @command = @cmd
EXEC msdb.dbo.sp_add_jobserver @job_name = N'p'
"""
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_OK, err
    assert settings_of(document, "p")["COMMAND"] == "EXEC dbo.purge @days = 30;\r\nPRINT 'done';"


def test_updates_and_deletes_after_creation_are_applied_in_script_order(tmp_path, capsys):
    text = """EXEC msdb.dbo.sp_add_job @job_name = N'u', @notify_level_eventlog = 0
EXEC msdb.dbo.sp_add_jobstep @job_name = N'u', @step_name = N'one', @database_name = N'sales', @command = N'SELECT 1',
    @on_success_action = 3
EXEC msdb.dbo.sp_add_jobstep @job_name = N'u', @step_name = N'two', @database_name = N'sales', @command = N'SELECT 2',
    @on_success_action = 3
EXEC msdb.dbo.sp_add_jobstep @job_name = N'u', @step_name = N'three', @database_name = N'sales', @command = N'SELECT 3'
EXEC msdb.dbo.sp_delete_jobstep @job_name = N'u', @step_id = 2
EXEC msdb.dbo.sp_update_jobstep @job_name = N'u', @step_id = 2, @command = N'SELECT 33'
EXEC msdb.dbo.sp_add_schedule @schedule_name = N'hourly', @freq_type = 4, @freq_interval = 1, @freq_subday_type = 8,
    @freq_subday_interval = 1
EXEC msdb.dbo.sp_attach_schedule @job_name = N'u', @schedule_name = N'hourly'
EXEC msdb.dbo.sp_add_jobschedule @job_name = N'u', @name = N'nightly', @freq_type = 4, @freq_interval = 1,
    @active_start_time = 30000
EXEC msdb.dbo.sp_update_jobschedule @job_name = N'u', @name = N'nightly', @active_start_time = 40000
EXEC msdb.dbo.sp_detach_schedule @job_name = N'u', @schedule_name = N'hourly'
EXEC msdb.dbo.sp_add_jobserver @job_name = N'u'
EXEC msdb.dbo.sp_update_job @job_name = N'u', @new_name = N'renamed', @enabled = 0
"""
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_OK, err
    s = settings_of(document, "renamed")
    assert (s["STEPS__1__COMMAND"], s["STEPS__2__COMMAND"]) == ("SELECT 1", "SELECT 33")
    assert "STEPS__3__COMMAND" not in s
    assert s["SCHEDULE"] == "0 0 4 * * *" and s["ENABLED"] == "false"


def test_a_schedule_disabled_by_sp_update_schedule_stays_disabled(tmp_path, capsys):
    text = plain_job(extra="EXEC msdb.dbo.sp_update_schedule @name = N'daily', @enabled = 0")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    assert "SCHEDULE" not in settings_of(document, "j")
    assert "disabled" in reasons(job(document, "j"))


def test_a_duplicate_step_id_inserts_before_and_renumbers_as_sql_agent_does(tmp_path, capsys):
    text = """EXEC msdb.dbo.sp_add_job @job_name = N'd', @notify_level_eventlog = 0
EXEC msdb.dbo.sp_add_jobstep @job_name = N'd', @step_id = 1, @step_name = N'a', @database_name = N'sales',
    @command = N'SELECT ''a''', @on_success_action = 3
EXEC msdb.dbo.sp_add_jobstep @job_name = N'd', @step_id = 1, @step_name = N'b', @database_name = N'sales',
    @command = N'SELECT ''b''', @on_success_action = 3
EXEC msdb.dbo.sp_add_jobserver @job_name = N'd'
"""
    code, document, err = run(tmp_path, capsys, text)
    s = settings_of(document, "d")
    assert (s["STEPS__1__COMMAND"], s["STEPS__2__COMMAND"]) == ("SELECT 'b'", "SELECT 'a'")


# ---------------------------------------------------------------- encodings


SCRIPT_E = plain_job(name="Sauvegarde générale", command="PRINT 'déjà'")


def test_a_windows_1252_file_is_read_as_windows_1252_with_a_warning(tmp_path, capsys):
    code, document, err = run(tmp_path, capsys, SCRIPT_E.encode("cp1252"))
    assert code == EXIT_OK, err
    assert document["settings"]["JOB__Sauvegarde_generale__COMMAND"] == "PRINT 'déjà'"
    assert any("Windows-1252" in w for w in document["warnings"])


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_without_a_byte_order_mark_is_read(tmp_path, capsys, encoding):
    code, document, err = run(tmp_path, capsys, SCRIPT_E.encode(encoding))
    assert code == EXIT_OK, err
    assert document["settings"]["JOB__Sauvegarde_generale__COMMAND"] == "PRINT 'déjà'"


def test_odd_length_utf16_is_a_clear_error(tmp_path, capsys):
    code, document, err = run(tmp_path, capsys, SCRIPT_E.encode("utf-16") + b"\x00")
    assert code == EXIT_USAGE and document is None
    error = json.loads(err)
    assert error["kind"] == "usage" and "odd number of bytes" in error["error"], error


def test_an_empty_file_is_nothing_to_import(tmp_path, capsys):
    for content in (b"", b"  \r\n\t\n", "\ufeff".encode("utf-8"), b"-- nothing here\r\nGO\r\n"):
        code, document, err = run(tmp_path, capsys, content)
        assert code == EXIT_FAILURE, (content, err)
        assert document["complete"] is False and document["jobs"] == []
        assert "nothing to import" in json.dumps(document["not_carried"])


# ---------------------------------------------------------------- tokens and GO in steps


def test_tokens_are_translated_where_known_and_listed_where_not(tmp_path, capsys):
    text = plain_job(name="O'Brien", command="PRINT N'$(ESCAPE_SQUOTE(JOBNAME)) step $(ESCAPE_NONE(STEPID))'")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_OK, err
    assert document["settings"]["JOB__O_Brien__COMMAND"] == "PRINT N'O''Brien step 1'"
    # A run-time token is carried as written: the step's run replaces it (shared/jobs/tokens.py).
    text = plain_job(name="t", command="BACKUP DATABASE x TO DISK = N'x_$(ESCAPE_SQUOTE(DATE)).bak'")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_OK, err
    assert document["settings"]["JOB__t__COMMAND"] == "BACKUP DATABASE x TO DISK = N'x_$(ESCAPE_SQUOTE(DATE)).bak'"
    # One with no equivalent here (the server's name) is listed, and the job is not emitted.
    text = plain_job(name="s", command="PRINT N'$(ESCAPE_SQUOTE(SRVR))'")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    assert "$(ESCAPE_SQUOTE(SRVR))" in reasons(job(document, "s"))
    assert not any("$(" in value for value in document["settings"].values())



def test_a_name_holding_a_token_is_not_pasted_to_be_replaced_again(tmp_path, capsys):
    """SQL Agent replaces tokens once: a job named 'nightly $(ESCAPE_NONE(DATE))' prints that
    name. Pasted into the command at import, the name's own token would be replaced again when the
    step runs (an attack: the date was printed). The job is listed, not emitted; a name with a
    token the command does not use is imported."""
    text = plain_job(name="nightly $(ESCAPE_NONE(DATE))", command="PRINT N'$(ESCAPE_SQUOTE(JOBNAME))'")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE, err
    listed = job(document, "nightly $(ESCAPE_NONE(DATE))")
    assert not listed["emitted"] and "would replace again when the step runs" in reasons(listed)
    assert not document["settings"]
    code, document, err = run(tmp_path, capsys, plain_job(name="nightly $(ESCAPE_NONE(DATE))", command="SELECT 1"))
    assert code == EXIT_OK, err
    assert [v for k, v in document["settings"].items() if k.endswith("__COMMAND")] == ["SELECT 1"]

@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_go_inside_a_step_becomes_one_step_per_batch(tmp_path, capsys, newline):
    """Whatever ends the lines: SSMS writes CRLF, and a CRLF command was taken for one batch, its GO
    sent to the server on every run (an attack)."""
    text = plain_job(name="g", command=newline.join(["EXEC dbo.a", "GO", "EXEC dbo.b", ""]))
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_OK, err
    s = settings_of(document, "g")
    assert (s["STEPS__1__COMMAND"].strip(), s["STEPS__2__COMMAND"].strip()) == ("EXEC dbo.a", "EXEC dbo.b")
    assert not any(value.strip().upper().endswith("GO") for value in document["settings"].values())


# ---------------------------------------------------------------- schedules


def test_a_one_time_schedule_earlier_today_is_not_run_at_once(tmp_path, capsys):
    earlier = datetime.now(ZoneInfo("UTC")) - timedelta(minutes=5)
    if earlier.date() != datetime.now(ZoneInfo("UTC")).date():
        earlier = earlier.replace(hour=0, minute=0, second=0)
    text = plain_job().replace(
        "@freq_type = 4, @freq_interval = 1,\n    @active_start_time = 20000",
        f"@freq_type = 1, @active_start_date = {earlier:%Y%m%d}, @active_start_time = {earlier:%H%M%S}")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    assert "SCHEDULE" not in settings_of(document, "j")
    assert "already past" in reasons(job(document, "j"))


@pytest.mark.parametrize("change, property_", [
    ("@active_start_time = 250000", "@active_start_time"),
    ("@active_start_time = 6000", "@active_start_time"),       # 00:60:00
    ("@freq_interval = 0", "@freq_interval"),
])
def test_out_of_range_schedule_values_are_refused_as_sql_server_does_never_clamped(tmp_path, capsys, change,
                                                                                     property_):
    text = plain_job().replace("@freq_interval = 1,\n    @active_start_time = 20000", change if
                               change.startswith("@freq") else "@freq_interval = 1, " + change)
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    assert "SCHEDULE" not in settings_of(document, "j")
    assert property_ in json.dumps(document), document


# ---------------------------------------------------------------- attacks on the importer itself


def test_a_variable_used_before_any_declare_makes_sql_server_refuse_the_whole_batch(tmp_path, capsys):
    text = plain_job(name="declared") + "GO\n" + plain_job(name="in the refused batch") + \
        "EXEC msdb.dbo.sp_update_job @job_id = @never_declared, @enabled = 0\n"
    code, document, err = run(tmp_path, capsys, text)
    assert [j["sql_agent_name"] for j in document["jobs"]] == ["declared"]
    ((entry),) = document["not_carried"]
    assert entry["line"] == 14 and "@never_declared is used but not declared" in entry["reason"]
    assert "error 137" in entry["reason"] and code == EXIT_FAILURE


def test_loops_that_never_end_are_stopped_and_said(tmp_path, capsys):
    text = plain_job(name="before") + """GO
DECLARE @i int = 0
again:
SET @i += 1
GOTO again
GO
WHILE 1 = 1 SET @i = 1
GO
DECLARE @i int = 0
WHILE 1 = 1 BEGIN SET @i += 1 END
GO
SELECT 1
GO 100000
""" + plain_job(name="after")
    code, document, err = run(tmp_path, capsys, text)
    assert [j["sql_agent_name"] for j in document["jobs"]] == ["before", "after"]
    whats = [(entry["line"], entry["what"]) for entry in document["not_carried"]]
    assert whats == [(11, "GOTO again"), (13, "batch"), (16, "WHILE"), (19, "GO 100000")]
    reasons = [entry["reason"] for entry in document["not_carried"]]
    assert "jumps back more than 10,000 times" in reasons[0] and "@i is used but not declared" in reasons[1]
    assert "has not ended after 10,000 turns" in reasons[2] and "runs the batch 100,000 times" in reasons[3]


def test_what_sql_server_refuses_to_compile_is_one_finding_never_a_crash(tmp_path, capsys):
    for text, message in [
        ("GOTO 5", "a label is a name"),
        ("DECLARE @x nvarchar(10) = REPLACE(N'a', N'b')\nEXEC msdb.dbo.sp_add_job @job_name = @x",
         "replace function was given 2 argument(s)"),
        ("EXEC msdb.dbo.sp_add_job @job_name = N'a' +", "'+' after the value"),
        ("BEGIN\nEXEC msdb.dbo.sp_add_job @job_name = N'a'", "BEGIN without its END"),
        ("IF 1 = 1", "IF without a statement after it"),
        ("EXEC", "EXEC without a procedure"),
        ("DECLARE @x int = " + "(" * 300 + "1" + ")" * 300, "nested too deeply"),
        # A file cut after a comma, or an argument left out: the job was imported (an attack).
        ("EXEC msdb.dbo.sp_add_job @job_name = N'a',", "an argument list that ends with ','"),
        ("EXEC msdb.dbo.sp_add_job @job_name = N'a',\nEXEC msdb.dbo.sp_add_jobserver @job_name = N'a'",
         "incorrect syntax near ','"),
    ]:
        code, document, err = run(tmp_path, capsys, text)
        assert code == EXIT_FAILURE and document is not None, (text, err)
        assert message in json.dumps(document["not_carried"]), (text, document["not_carried"])
    # A long sum is not deep nesting: 1 + 1 + ... (5001 terms) is computed, as SQL Server does.
    code, document, err = run(tmp_path, capsys, "DECLARE @x int = 1" + " + 1" * 5000 +
                              "\nEXEC msdb.dbo.sp_add_job @job_name = @x")
    assert [j["sql_agent_name"] for j in document["jobs"]] == ["5001"]


def test_return_and_goto_inside_an_undecided_if_are_said_not_guessed(tmp_path, capsys):
    text = plain_job(name="kept") + """GO
IF @@SERVERNAME = N'PROD' RETURN
EXEC msdb.dbo.sp_add_job @job_name = N'after the undecided RETURN', @notify_level_eventlog = 0
"""
    code, document, err = run(tmp_path, capsys, text)
    names = [j["sql_agent_name"] for j in document["jobs"]]
    assert names == ["kept", "after the undecided RETURN"]
    (entry,) = document["not_carried"]
    assert entry["line"] == 8 and "one way leaves the statement" in entry["reason"]
    assert "follows the way that does not" in entry["reason"]


def test_human_output_keeps_one_line_per_finding_whatever_the_names(tmp_path, capsys):
    text = "DECLARE @n nvarchar(100) = N'x' + CHAR(10) + N'not carried: forged' + NCHAR(8238)\n" \
           "EXEC msdb.dbo.sp_add_job @job_name = @n\n"
    path = tmp_path / "job.sql"
    path.write_text(text, encoding="utf-8")
    assert cli(["import-sqlagent", str(path), "--timezone", "UTC"]) == EXIT_FAILURE
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("not carried: ") for line in lines), lines
    assert any("x\\nnot carried: forged\\u202e" in line for line in lines), lines


def test_a_sqlcmd_mode_script_is_said_not_silently_taken_literally(tmp_path, capsys):
    text = ":setvar JobName \"Nightly\"\r\n" + plain_job(name="$(JobName)")
    code, document, err = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    (entry,) = document["not_carried"]
    assert (entry["line"], entry["what"]) == (1, ":setvar") and "SQLCMD mode" in entry["reason"]


def test_old_mac_line_ends_and_go_are_read_as_lines(tmp_path, capsys):
    text = (plain_job(name="first") + "GO\n" + plain_job(name="second")).replace("\n", "\r")
    code, document, err = run(tmp_path, capsys, text.encode("utf-8"))
    assert code == EXIT_OK, document
    assert [j["sql_agent_name"] for j in document["jobs"]] == ["first", "second"]
    assert document["sources"][0]["batches"] == 2


def test_a_utf8_file_with_a_byte_order_mark_and_a_broken_byte_is_an_error_naming_the_byte(tmp_path, capsys):
    code, document, err = run(tmp_path, capsys, b"\xef\xbb\xbf" + plain_job().encode("utf-8") + b"-- \xff\n")
    assert code == EXIT_USAGE and document is None
    assert "not valid UTF-8 (byte order mark) at byte" in json.loads(err)["error"]


def test_files_run_in_order_over_one_msdb_and_a_file_given_twice_is_said(tmp_path, capsys):
    (tmp_path / "create.sql").write_text(plain_job(name="shared"), encoding="utf-8")
    (tmp_path / "change.sql").write_text("EXEC msdb.dbo.sp_update_job @job_name = N'shared', @enabled = 0\n",
                                         encoding="utf-8")
    create, change = str(tmp_path / "create.sql"), str(tmp_path / "change.sql")
    assert cli(["import-sqlagent", create, change, "--timezone", "UTC", "--json"]) == EXIT_OK
    document = json.loads(capsys.readouterr().out)
    assert document["settings"]["JOB__shared__ENABLED"] == "false"
    # The other order: the change comes first and finds no job (as it would on SQL Server).
    assert cli(["import-sqlagent", change, create, "--timezone", "UTC", "--json"]) == EXIT_FAILURE
    document = json.loads(capsys.readouterr().out)
    assert document["settings"]["JOB__shared__ENABLED"] == "true"
    assert "error 14262" in document["not_carried"][0]["reason"]
    # The same script twice: its second run cannot add the job again.
    assert cli(["import-sqlagent", create, create, "--timezone", "UTC", "--json"]) == EXIT_FAILURE
    document = json.loads(capsys.readouterr().out)
    assert len(document["jobs"]) == 1
    assert any("error 14261" in entry["reason"] for entry in document["jobs"][0]["not_carried"])


# ---------------------------------------------------------------- what the importer does not run is said


@pytest.mark.parametrize("tail, what, needle", [
    ("CREATE SYNONYM dbo.addstep FOR msdb.dbo.sp_add_jobstep;\nGO\n"
     "EXEC dbo.addstep @job_name = N'j', @step_name = N's2', @command = N'DELETE FROM dbo.important';",
     "EXEC dbo.addstep", "not a procedure this script creates nor one of msdb's"),
    ("EXEC sp_MSforeachdb N'IF ''?'' = ''msdb'' EXEC msdb.dbo.sp_update_job @job_name = N''j'', @enabled = 0';",
     "EXEC sp_MSforeachdb", "its arguments hold SQL calling sp_update_job"),
    ("EXEC master..xp_cmdshell N'sqlcmd -E -Q \"EXEC msdb.dbo.sp_update_job @job_name = N''j'', @enabled = 0\"';",
     "EXEC master..xp_cmdshell", "its arguments hold SQL calling sp_update_job"),
    ("SELECT * FROM OPENROWSET('SQLNCLI', 'Server=(local);Trusted_Connection=yes;', "
     "'EXEC msdb.dbo.sp_update_job @job_name = N''j'', @enabled = 0; SELECT 1 AS x');",
     "SELECT naming sp_update_job", "is not run by the importer"),
    ("EXEC dbo.usp_setup_jobs @enabled = 0;", "EXEC dbo.usp_setup_jobs", "what it does is not known"),
])
def test_a_call_the_importer_cannot_follow_is_listed_never_dropped(tmp_path, capsys, tail, what, needle):
    """Synonyms, procedures that run SQL given as text, procedures the script does not create:
    SQL Server may change jobs through them; the import lists them (exit 1)."""
    code, document, _ = run(tmp_path, capsys, plain_job() + "GO\n" + tail + "\n")
    assert code == EXIT_FAILURE and document["complete"] is False
    listed = {entry["what"]: entry["reason"] for entry in document["not_carried"]}
    assert what in listed and needle in listed[what], listed
    assert job(document, "j") is not None


@pytest.mark.parametrize("failing, enabled", [
    ("DECLARE @x int = CAST('abc' AS int);", "true"),    # 245 in TRY: the CATCH rolls back
    ("DECLARE @x int = 1 / 0;", "true"),                  # 8134
    ("DECLARE @t tinyint = 300;", "true"),                # 220 on assignment
])
def test_a_run_time_error_inside_try_goes_to_the_catch(tmp_path, capsys, failing, enabled):
    text = plain_job() + f"""GO
BEGIN TRY
  BEGIN TRAN;
  EXEC msdb.dbo.sp_update_job @job_name = N'j', @enabled = 0;
  {failing}
  COMMIT;
END TRY BEGIN CATCH ROLLBACK; END CATCH
"""
    _, document, _ = run(tmp_path, capsys, text)
    assert document["settings"]["JOB__j__ENABLED"] == enabled


def test_xact_abort_rolls_back_and_ends_the_batch_on_a_run_time_error(tmp_path, capsys):
    text = plain_job() + """GO
SET XACT_ABORT ON;
BEGIN TRAN;
EXEC msdb.dbo.sp_update_job @job_name = N'j', @enabled = 0;
DECLARE @z int = 1 / 0;
COMMIT;
GO
"""
    _, document, _ = run(tmp_path, capsys, text)
    assert document["settings"]["JOB__j__ENABLED"] == "true"


def test_without_try_a_failing_statement_does_nothing_and_the_batch_goes_on(tmp_path, capsys):
    text = plain_job() + """GO
DECLARE @z int = 1 / 0;
EXEC msdb.dbo.sp_update_job @job_name = N'j', @enabled = 0;
GO
"""
    code, document, _ = run(tmp_path, capsys, text)
    assert document["settings"]["JOB__j__ENABLED"] == "false" and code == 0
    assert any("Divide by zero" in note for note in document["notes"])


def test_a_conversion_error_outside_try_ends_the_batch(tmp_path, capsys):
    text = plain_job() + """GO
DECLARE @x int = CAST(N'abc' AS int);
EXEC msdb.dbo.sp_update_job @job_name = N'j', @enabled = 0;
GO
"""
    _, document, _ = run(tmp_path, capsys, text)
    assert document["settings"]["JOB__j__ENABLED"] == "true"       # the batch ended before the update


def test_a_statement_not_run_inside_try_is_listed(tmp_path, capsys):
    text = plain_job() + """GO
BEGIN TRY
  BEGIN TRAN;
  EXEC msdb.dbo.sp_update_job @job_name = N'j', @enabled = 0;
  SELECT 1 / 0;
  COMMIT;
END TRY BEGIN CATCH ROLLBACK; END CATCH
"""
    code, document, _ = run(tmp_path, capsys, text)
    assert code == EXIT_FAILURE
    assert any(entry["what"] == "SELECT" and "taken as succeeding" in entry["reason"] for entry in document["not_carried"])


def test_a_binary_value_given_for_a_unicode_parameter_is_read_as_utf16(tmp_path, capsys):
    """0x6A00 as @job_name (sysname) is N'j' on SQL Server (UTF-16 LE), not 'j\\x00'."""
    code, document, _ = run(tmp_path, capsys, plain_job() + "GO\nEXEC msdb.dbo.sp_update_job @job_name = 0x6A00, "
                                                           "@enabled = 0;\n")
    assert code == 0 and document["settings"]["JOB__j__ENABLED"] == "false"
