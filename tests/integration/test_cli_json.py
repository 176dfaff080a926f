"""`--json` on every command and sub-command, and errors as one JSON object on stderr.

Each command runs in-process (shared.cli.commands.main) on a SQLite control database with --json before
or after the command: its stdout is one JSON document (nothing else), its stderr empty, its exit
code the documented one. Each error case gives nothing on stdout and one line of stderr holding
one JSON object with `error`, `kind` and, where the command line knows them, `setting`, `value`
and `expected`, the exit code being 2 for usage, configuration and not-found errors and 1 for
failures. A command added to the parser without a case here fails
test_every_command_has_a_json_case. The shell completion script is checked by bash itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from shared.cli.commands import COMMANDS, main
from shared.cli.output import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from shared.cli.parser import build_parser
from tests.support.harness import ROOT, make_agent

SAMPLE_SCRIPT = ROOT / "tests" / "integration" / "sqlagent" / "nightly_maintenance.sql"


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """A control database with the job `hello`, known to the agent (one tick ran), a failed task
    with a poison message, and a settings file; the process environment holds no agent setting."""
    for key in list(os.environ):
        if key.startswith(("AGENT_", "JOB__")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    settings = tmp_path / "local.settings.json"
    settings.write_text(json.dumps({"IsEncrypted": False, "Values": {
        "JOB__hello__SCHEDULE": "0 0 3 * * *", "JOB__hello__COMMAND": "SELECT 1",
        "JOB__hello__PARAMS__who__DEFAULT": "world"}}))
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    base = ["--db", db, "--settings", str(settings)]
    assert main([*base, "init-db"]) == EXIT_OK
    assert main([*base, "tick"]) == EXIT_OK
    agent = make_agent(db)
    store = agent.store()
    run_id = store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None, max_attempts=1,
                           timeout_seconds=60, lease_seconds=60, now=agent.clock(), operation_id="op").one()["run_id"]
    with store.transaction():
        store.execute("poison_run", run_id=run_id, token=0, now=agent.clock(), reason="test: poisoned",
                      error_number=None, error_sqlstate=None, error_message=None)
        poison_id = store.execute("insert_poison", run_id=run_id, message_id="m", body="{}", dequeue_count=6,
                                  reason="test", errors="[]", now=agent.clock()).one()["poison_id"]
    agent.close()
    return {"base": base, "db": db, "tmp": tmp_path, "poison_id": poison_id, "poisoned_run": run_id}


def call(capsys, argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def one_document(out: str):
    """stdout is exactly one JSON document."""
    decoder = json.JSONDecoder()
    value, end = decoder.raw_decode(out.strip())
    assert end == len(out.strip()), f"more than one JSON document on stdout: {out[:400]!r}"
    return value


def one_error(err: str) -> dict:
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"stderr is not one line: {err!r}"
    document = json.loads(lines[0])
    assert isinstance(document, dict) and isinstance(document.get("error"), str) and document["error"], document
    assert document["kind"] in ("usage", "config", "not_found", "failure", "interrupted"), document
    return document


# Each command with --json: (arguments, check of the document). `{poison_id}` etc. are filled in.
SUCCESS = {
    "init-db": (["init-db"], lambda d: d["schema_version"] >= 8 and d["upgraded"] is False and d["dialect"] == "sqlite"),
    "tick": (["tick"], lambda d: d["refused"] is False and "runs_claimed" in d),
    "work": (["work", "--until-idle", "--max-seconds", "20"], lambda d: d["unit"] == "runs" and d["processed"] >= 0),
    "jobs": (["jobs"], lambda d: [row["job_name"] for row in d] == ["hello"]),
    "history": (["history", "--limit", "5"], lambda d: {"runs", "job_events"} <= set(d)),
    "stuck": (["stuck"], lambda d: isinstance(d, list)),
    "audit": (["audit", "--since", "2000-01-01T00:00:00Z", "--limit", "5"], lambda d: isinstance(d, list)),
    "alerts": (["alerts", "--limit", "5"], lambda d: d == {"alerts": [], "firings": []}),
    "next": (["next", "hello", "--count", "3", "--from", "2026-01-01T00:00:00Z"],
             lambda d: [s["at"] for s in d["slots"]] == ["2026-01-01T03:00:00+00:00", "2026-01-02T03:00:00+00:00",
                                                         "2026-01-03T03:00:00+00:00"] and d["note"] is None),
    "poison list": (["poison", "list"], lambda d: [row["poison_id"] for row in d] == [1]),
    "poison requeue": (["poison", "requeue", "{poison_id}"],
                       lambda d: d["requeued"] is True and d["run_id"] >= 1 and d["dispatched"] is None),
    "run-now": (["run-now", "hello"], lambda d: d["job_name"] == "hello" and d["run_id"] >= 1
                and d["params"] == {"who": "world"}),
    "pause": (["pause", "hello", "--until", "2999-01-01T00:00:00Z", "--reason", "maintenance"],
              lambda d: d["job_name"] == "hello" and d["paused"] is True and d["reason"] == "maintenance"
              and d["paused_until"].startswith("2999-01-01") and d["runs_skipped"] >= 0),
    "resume": (["resume", "{paused_job}"], lambda d: d["job_name"] == "hello" and d["paused"] is False
               and d["resumed_at"] >= d["paused_at"]),
    "submit": (["submit", "--sql", "SELECT 2", "--order", "3"],
               lambda d: d["run_id"] >= 1 and d["order"] == 3 and d["submitted"] is True),
    "cancel": (["cancel", "{pending_run}"], lambda d: d["status"] == "cancelled"),
    "backfill": (["backfill", "hello", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-03T12:00:00Z"],
                 lambda d: d["job_name"] == "hello" and d["slots"] == 3 and len(d["runs"]) + d["already_run"] == 3
                 and all(r["action"] in ("inserted", "rerun") for r in d["runs"])),
    "stop": (["stop", "hello"], lambda d: d["job_name"] == "hello" and isinstance(d["cancelled_run_ids"], list)),
    "doctor": (["doctor"], lambda d: d["ok"] is True and d["failed"] is None
               and [c["name"] for c in d["checks"]][:2] == ["driver", "connectivity"]),
    "grant-sql": (["grant-sql", "--app-name", "my-app"],
                  lambda d: d["applied"] is False and d["scripts"][0]["database"] is None
                  and any("CREATE USER [my-app] FROM EXTERNAL PROVIDER" in s for s in d["scripts"][0]["statements"])),
    "grant-sql --operator": (["grant-sql", "--operator", "ops"],
                             lambda d: "agent_operator" in d["sql"] and d["applied"] is False and d["warnings"]),
    "import-sqlagent": (["import-sqlagent", str(SAMPLE_SCRIPT), "--timezone", "UTC"],
                        lambda d: d["jobs"] and d["warnings"] == []),
    "completion": (["completion", "bash"], lambda d: d["shell"] == "bash" and "_shtab_sql_agent" in d["script"]),
}
EXIT_CODES = {"import-sqlagent": None}       # 0, or 1 when something was not carried over (a finding)


def fill(arguments: list[str], setup: dict, capsys) -> list[str]:
    values = {"poison_id": setup["poison_id"]}
    if any("{pending_run}" in a for a in arguments):
        code, out, _ = call(capsys, [*setup["base"], "submit", "--sql", "SELECT 1", "--json"])
        values["pending_run"] = one_document(out)["run_id"]
    if any("{paused_job}" in a for a in arguments):
        code, out, _ = call(capsys, [*setup["base"], "pause", "hello", "--json"])
        values["paused_job"] = one_document(out)["job_name"]
    return [a.format(**values) for a in arguments]


@pytest.mark.parametrize("position", ["after", "before"])
@pytest.mark.parametrize("case", sorted(SUCCESS))
def test_each_command_prints_one_json_document(setup, capsys, case, position):
    arguments, check = SUCCESS[case]
    arguments = fill(arguments, setup, capsys)
    argv = [*setup["base"], *arguments, "--json"] if position == "after" else [*setup["base"], "--json", *arguments]
    code, out, err = call(capsys, argv)
    expected = EXIT_CODES.get(case, EXIT_OK)
    assert expected is None or code == expected, (code, err)
    assert err == "", err
    document = one_document(out)
    assert check(document), document
    if case == "import-sqlagent":
        assert code == (EXIT_OK if document["complete"] else EXIT_FAILURE)


def test_every_command_has_a_json_case():
    commands = {case.split()[0] for case in SUCCESS}
    assert set(COMMANDS) - {"run", "monitor"} <= commands, sorted(set(COMMANDS) - commands)
    assert "poison requeue" in SUCCESS and "poison list" in SUCCESS


def test_every_command_and_sub_command_accepts_json_before_and_after():
    import argparse

    def walk(parser, path):
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])

    checked = 0
    for path, parser in walk(build_parser(), []):
        assert "--json" in parser._option_string_actions, f"{' '.join(path) or 'sql-agent'} has no --json"
        checked += 1
    assert checked >= 19


ERRORS = [
    # (arguments, settings values, exit code, kind, setting, value, expected contains)
    (["run-now", "ghost"], {}, EXIT_USAGE, "not_found", "NAME", "ghost", "hello"),
    (["run-now", "hello", "--param", "nobody=1"], {}, EXIT_USAGE, "usage", "--param nobody", "1",
     "a parameter job 'hello' declares (who)"),
    (["run-now", "hello", "--param", "who"], {}, EXIT_USAGE, "usage", "--param", "who", "NAME=VALUE"),
    (["run-now", "hello", "--param", "who=a", "--param", "Who=b"], {}, EXIT_USAGE, "usage", "--param", "Who=b",
     "each parameter given once"),
    (["stop", "ghost"], {}, EXIT_USAGE, "not_found", "JOB", "ghost", "hello"),
    (["backfill", "ghost", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"], {}, EXIT_USAGE,
     "not_found", "JOB", "ghost", "hello"),
    (["backfill", "hello", "--from", "2026-01-02T00:00:00Z", "--to", "2026-01-01T00:00:00Z"], {}, EXIT_USAGE,
     "usage", "--from", "2026-01-02T00:00:00+00:00", "a time before --to"),
    (["backfill", "hello", "--from", "2026-01-01T00:00:00Z", "--to", "2999-01-01T00:00:00Z"], {}, EXIT_USAGE,
     "usage", "--to", "2999-01-01T00:00:00+00:00", "at or before now"),
    (["pause", "ghost"], {}, EXIT_USAGE, "not_found", "JOB", "ghost", "hello"),
    (["pause", "hello", "--until", "2000-01-01T00:00:00Z"], {}, EXIT_USAGE, "usage", "--until",
     "2000-01-01T00:00:00+00:00", "a time after"),
    (["pause", "hello", "--until", "soon"], {}, EXIT_USAGE, "usage", "--until", "soon", "ISO-8601"),
    (["resume", "ghost"], {}, EXIT_USAGE, "not_found", "JOB", "ghost", "hello"),
    (["history", "--job", "ghost"], {}, EXIT_USAGE, "not_found", "--job", "ghost", "hello"),
    (["grant-sql", "--app-name", "app", "--targets", "ghost"], {}, EXIT_USAGE, "not_found", "--targets", "ghost",
     "fleet targets"),
    (["history", "--limit", "1e20"], {}, EXIT_USAGE, "usage", "--limit", "1e20", "from 1 to 2147483647"),
    (["cancel", "9223372036854775808"], {}, EXIT_USAGE, "usage", "RUN_ID", "9223372036854775808",
     "from 1 to 9223372036854775807"),
    (["monitor", "--port", "99999"], {}, EXIT_USAGE, "usage", "--port", "99999", "from 0 to 65535"),
    (["cancel", "999"], {}, EXIT_USAGE, "not_found", "RUN_ID", 999, "history"),
    (["cancel", "{poisoned_run}"], {}, EXIT_USAGE, "usage", "RUN_ID", None, "not finished"),
    (["poison", "requeue", "999"], {}, EXIT_USAGE, "not_found", "ID", 999, "poison"),
    (["poison", "requeue", "x"], {}, EXIT_USAGE, "usage", "ID", "x", "whole number"),
    (["submit", "--sql", "  "], {}, EXIT_USAGE, "usage", "--sql", "  ", "non-empty"),
    (["submit"], {}, EXIT_USAGE, "usage", "--sql", None, None),
    (["history", "--limit", "0"], {}, EXIT_USAGE, "usage", "--limit", "0", "from 1 to 2147483647"),
    (["audit", "--limit", "0"], {}, EXIT_USAGE, "usage", "--limit", "0", "from 1 to 2147483647"),
    (["audit", "--since", "soon"], {}, EXIT_USAGE, "usage", "--since", "soon", "ISO-8601"),
    (["next", "ghost"], {}, EXIT_USAGE, "not_found", "JOB", "ghost", "hello"),
    (["next", "hello", "--count", "0"], {}, EXIT_USAGE, "usage", "--count", "0", "from 1 to 1000"),
    (["next", "hello", "--count", "1001"], {}, EXIT_USAGE, "usage", "--count", "1001", "from 1 to 1000"),
    (["next", "hello", "--count", "1e3"], {}, EXIT_USAGE, "usage", "--count", "1e3", "whole number"),
    (["next", "hello", "--from", "soon"], {}, EXIT_USAGE, "usage", "--from", "soon", "ISO-8601"),
    (["tick", "--now", "yesterday"], {}, EXIT_USAGE, "usage", "--now", "yesterday", "ISO-8601"),
    (["init-db"], {"AGENT_MAX_DEQUEUE_COUNT": "zero"}, EXIT_USAGE, "config", "AGENT_MAX_DEQUEUE_COUNT", "zero",
     "whole number"),
    (["jobs"], {"JOB__bad__SCHEDULE": "0 0 3 * * *", "AGENT_TICK_SCHEDULE": "every now and then"}, EXIT_USAGE,
     "config", "AGENT_TICK_SCHEDULE", "every now and then", None),
    (["grant-sql"], {}, EXIT_USAGE, "usage", None, None, None),
    (["grant-sql", "--operator", "ops", "--apply"], {}, EXIT_USAGE, "usage", "--db", None, "PostgreSQL"),
    (["import-sqlagent", "missing.sql"], {}, EXIT_USAGE, "usage", "FILE.sql", "missing.sql", "readable"),
    (["import-sqlagent", str(SAMPLE_SCRIPT), "--timezone", "Mars/Olympus"], {}, EXIT_USAGE, "usage", "--timezone",
     "Mars/Olympus", "IANA"),
    (["completion", "fish"], {}, EXIT_USAGE, "usage", "shell", "fish", "bash"),
    (["no-such-command"], {}, EXIT_USAGE, "usage", "COMMAND", "no-such-command", "init-db"),
    (["monitor", "--port", "-1"], {}, EXIT_USAGE, "usage", "--port", "-1", "from 0 to 65535"),
    (["work"], {}, EXIT_USAGE, "usage", None, None, None),
]


@pytest.mark.parametrize("position", ["after", "before"])
@pytest.mark.parametrize("case", ERRORS, ids=[" ".join(c[0][:2]) + (" +settings" if c[1] else "") for c in ERRORS])
def test_errors_are_one_json_object_on_stderr(setup, capsys, case, position):
    arguments, values, exit_code, kind, setting, value, expected = case
    base = list(setup["base"])
    if values:
        settings = setup["tmp"] / "bad.settings.json"
        settings.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
        base[base.index("--settings") + 1] = str(settings)
    arguments = [a.format(poisoned_run=setup["poisoned_run"]) for a in arguments]
    argv = [*base, *arguments, "--json"] if position == "after" else [*base, "--json", *arguments]
    try:
        code = main(argv)
    except SystemExit as exit:          # argparse's errors leave through SystemExit
        code = exit.code
    out, err = capsys.readouterr()
    assert out == "", out
    error = one_error(err)
    assert code == exit_code, (code, error)
    assert error["kind"] == kind, error
    if setting is not None:
        assert error["setting"] == setting, error
    if value is not None:
        assert error["value"] == value, error
    if expected is not None:
        assert expected in error["expected"], error
    assert set(error) <= {"error", "kind", "setting", "value", "expected", "number", "sqlstate"}, error


def test_a_failure_is_exit_1_and_a_json_error(tmp_path, capsys, monkeypatch):
    """No schema yet: a runtime failure (exit 1), not a usage error."""
    monkeypatch.chdir(tmp_path)
    code, out, err = call(capsys, ["--db", f"sqlite:///{tmp_path / 'empty.db'}", "jobs", "--json"])
    assert (code, out) == (EXIT_FAILURE, "")
    error = one_error(err)
    assert error["kind"] == "failure" and "init-db" in error["error"], error


def test_without_json_errors_stay_one_text_line(setup, capsys):
    code, out, err = call(capsys, [*setup["base"], "run-now", "ghost"])
    assert code == EXIT_USAGE and out == "" and err.startswith("error: no job named 'ghost'") and len(
        err.strip().splitlines()) == 1


def test_version(capsys):
    import shared

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.startswith(f"sql-agent {shared.__version__} (Python ")
    with pytest.raises(SystemExit):
        main(["--version", "--json"])
    assert json.loads(capsys.readouterr().out) == {
        "name": "sql-agent-azure", "version": shared.__version__, "python": "%d.%d.%d" % sys.version_info[:3]}


def test_the_bash_completion_script_is_valid_bash_and_names_every_command(capsys, tmp_path):
    code, script, err = call(capsys, ["completion", "bash"])
    assert code == 0 and err == ""
    path = tmp_path / "sql-agent.bash"
    path.write_text(script)
    bash = shutil.which("bash") or "/bin/bash"
    checked = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    for name in COMMANDS:
        assert f"'{name}'" in script, name
    assert "'requeue'" in script and "--json" in script and "complete -o filenames -F _shtab_sql_agent sql-agent" in script
    # Sourced in bash, completing `sql-agent po` offers `poison`, and `sql-agent poison ` its actions.
    probe = (f"source {path}; COMP_WORDS=(sql-agent po); COMP_CWORD=1; COMP_LINE='sql-agent po'; COMP_POINT=12; "
             "_shtab_sql_agent sql-agent po sql-agent; echo \"${COMPREPLY[@]}\"; "
             "COMP_WORDS=(sql-agent poison ''); COMP_CWORD=2; COMP_LINE='sql-agent poison '; COMP_POINT=17; "
             "_shtab_sql_agent sql-agent '' poison; echo \"${COMPREPLY[@]}\"")
    completed = subprocess.run([bash, "-c", probe], capture_output=True, text=True, timeout=30)
    first, second = completed.stdout.splitlines()[:2]
    assert first.split() == ["poison"], completed
    assert set(second.split()) >= {"list", "requeue"}, completed


@pytest.mark.parametrize("command", ["run", "monitor"])
def test_the_long_running_commands_print_one_json_document_at_start(tmp_path, command):
    """run and monitor: the document says where they run (the monitor's port when --port 0),
    then SIGINT stops them with exit 0 and nothing more on stdout."""
    from tests.support.harness import as_from_a_terminal

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    subprocess.run([sys.executable, "-m", "shared.cli", "--db", db, "init-db"], cwd=tmp_path, env=env, check=True,
                   capture_output=True, timeout=60)
    extra = ["--port", "0"] if command == "monitor" else ["--concurrency", "1"]
    process = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", db, "--json", command, *extra],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=as_from_a_terminal)
    try:
        line = process.stdout.readline()
        document = json.loads(line)
        if command == "monitor":
            assert document["port"] > 0 and document["monitor"] == f"http://127.0.0.1:{document['port']}/"
        else:
            assert document["running"] is True and document["mode"] == "direct" and document["concurrency"] == 1
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out == ""
        for log_line in err.splitlines():        # under --json, log records are JSON objects too
            assert json.loads(log_line)["level"], log_line
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_reader_that_goes_away_ends_the_command_quietly(setup):
    """`sql-agent history --json | head`: the pipe closes before the document is written; the
    command stops with 141 and says nothing (no traceback, no error line)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen([sys.executable, "-m", "shared.cli", *setup["base"], "--json", "history"],
                               cwd=setup["tmp"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()              # the reader is gone before the command writes
    _, err = process.communicate(timeout=60)
    assert process.returncode == 141, err
    assert err == b""


def test_the_ends_of_every_range_reach_the_database(db_url, tmp_path, capsys, monkeypatch):
    """The largest id, limit, age, order, attempts and timeout the command line takes are what
    the control database takes too (issue 34, item 9): a run or poison id at the BIGINT top is
    "no such run" (exit 2, not_found), not a driver's overflow (exit 1); the INT-wide limits and
    ages list, the task takes its values."""
    from shared.values import BIGINT_MAX, INT_MAX, MAX_STUCK_AGE_SECONDS

    for key in list(os.environ):
        if key.startswith(("AGENT_", "JOB__")):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)
    base = ["--db", db_url, "--json"]
    assert call(capsys, [*base, "init-db"])[0] == EXIT_OK
    for arguments in (["cancel", str(BIGINT_MAX)], ["poison", "requeue", str(BIGINT_MAX)]):
        code, out, err = call(capsys, [*base, *arguments])
        error = one_error(err)
        assert (code, out, error["kind"], error["value"]) == (EXIT_USAGE, "", "not_found", BIGINT_MAX), error
    code, out, err = call(capsys, [*base, "submit", "--sql", "SELECT 1", "--order", str(INT_MAX), "--max-attempts",
                                   "100", "--timeout-seconds", str(7 * 86400)])
    assert (code, err) == (EXIT_OK, ""), err
    submitted = one_document(out)
    for arguments in (["history", "--limit", str(INT_MAX)], ["stuck", "--limit", str(INT_MAX), "--older-than",
                                                            str(MAX_STUCK_AGE_SECONDS)], ["poison", "list", "--limit", str(INT_MAX)]):
        code, out, err = call(capsys, [*base, *arguments])
        assert (code, err) == (EXIT_OK, ""), (arguments, err)
        one_document(out)
    code, out, err = call(capsys, [*base, "history", "--limit", str(INT_MAX)])
    (run,) = one_document(out)["runs"]
    assert (run["run_id"], run["max_attempts"]) == (submitted["run_id"], 100), run
