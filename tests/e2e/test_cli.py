"""The command line as a user meets it: the embedded default without unixODBC, the local
runner stopped with Ctrl-C, exit codes and one-line errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from tests.support.harness import ROOT, as_from_a_terminal


def cli(*args: str, cwd: Path, env_extra: dict | None = None, block_pyodbc: bool = False,
        timeout: float = 60) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    env.update(env_extra or {})
    prelude = "import sys; sys.modules['pyodbc'] = None; " if block_pyodbc else "import sys; "
    code = prelude + "from shared.cli.commands import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def settings_file(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "local.settings.json"
    path.write_text(json.dumps({"IsEncrypted": False, "Values": values}))
    return path


def test_embedded_default_needs_no_unixodbc(tmp_path):
    """pyodbc cannot even be imported, yet init-db, tick, work and history run on SQLite."""
    settings = settings_file(tmp_path, {
        "JOB__hello__SCHEDULE": "@once " + datetime.now(timezone.utc).isoformat(),
        "JOB__hello__COMMAND": "CREATE TABLE hello (x INT); INSERT INTO hello VALUES (1);"})
    for args in (["init-db"], ["tick"], ["work", "--until-idle"], ["history", "--json"]):
        result = cli("--settings", str(settings), *args, cwd=tmp_path, block_pyodbc=True)
        assert result.returncode == 0, (args, result.stderr)
    history = json.loads(result.stdout)
    assert [r["status"] for r in history["runs"]] == ["succeeded"]
    assert (tmp_path / "agent.db").exists()


def test_usage_and_configuration_errors_exit_2_with_one_line(tmp_path):
    cases = [
        (["tick", "--now", "yesterday"], {}, "ISO-8601"),
        (["init-db"], {"AGENT_MAX_DEQUEUE_COUNT": "zero"}, "AGENT_MAX_DEQUEUE_COUNT='zero'"),
        (["--db", "mysql://x", "init-db"], {}, "--db"),
        (["submit", "--sql", "SELECT 1", "--order", "-1"], {}, "expected a whole number from 0 to 2147483647"),
        (["run-now", "ghost"], {}, "no job named 'ghost'"),
    ]
    cli("init-db", cwd=tmp_path)
    for args, env, expected in cases:
        result = cli(*args, cwd=tmp_path, env_extra=env)
        assert result.returncode == 2, (args, result.stderr)
        assert expected in result.stderr
        assert "Traceback" not in result.stderr
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


def test_runtime_failures_exit_1_with_one_line(tmp_path):
    unreachable = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=1;Database=x;Uid=root;"
    result = cli("--db", unreachable, "jobs", cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert result.stderr.startswith("error: ")
    # --json: the driver's SQLSTATE as a field too, not only in the text (an attack found it missing).
    as_json = cli("--db", unreachable, "--json", "jobs", cwd=tmp_path, env_extra={"AGENT_CONNECT_RETRY_SECONDS": "0"})
    (document,) = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert as_json.returncode == 1 and document["kind"] == "failure" and document["sqlstate"] == "08001", document
    no_schema = cli("--db", f"sqlite:///{tmp_path / 'empty.db'}", "history", cwd=tmp_path)
    assert no_schema.returncode == 1 and "init-db" in no_schema.stderr


def test_local_runner_runs_jobs_and_stops_cleanly_on_ctrl_c(tmp_path):
    settings = settings_file(tmp_path, {
        "AGENT_TICK_SCHEDULE": "*/1 * * * * *",
        "JOB__beat__SCHEDULE": "* * * * * *",
        "JOB__beat__COMMAND": "CREATE TABLE IF NOT EXISTS beats (x INT); INSERT INTO beats VALUES (1);"})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    process = subprocess.Popen([sys.executable, "-m", "shared.cli", "--settings", str(settings), "run",
                                "--concurrency", "2"], cwd=tmp_path, env=env, preexec_fn=as_from_a_terminal,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        succeeded = 0
        while time.monotonic() < deadline and succeeded < 2:
            time.sleep(0.5)
            result = cli("history", "--json", cwd=tmp_path)
            if result.returncode == 0:
                succeeded = sum(r["status"] == "succeeded" for r in json.loads(result.stdout)["runs"])
        assert succeeded >= 2
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "agent stopped" in err and "Traceback" not in err


def test_run_now_with_params_binds_them_and_history_shows_them(tmp_path):
    """run-now --param through a real process: the value reaches the job's SQL as a bound value
    (quotes and a statement in it are data), and history (text and --json) shows it."""
    value = "x'); DROP TABLE seen; -- \"ü\""
    settings = settings_file(tmp_path, {
        "JOB__p__COMMAND": "CREATE TABLE IF NOT EXISTS seen (v TEXT); INSERT INTO seen VALUES (@who);",
        "JOB__p__PARAMS__who__REQUIRED": "true"})
    for args in (["init-db"], ["tick"], ["run-now", "p", "--param", f"who={value}"], ["work", "--until-idle"]):
        result = cli("--settings", str(settings), *args, cwd=tmp_path)
        assert result.returncode == 0, (args, result.stderr)
    history = json.loads(cli("--settings", str(settings), "history", "--json", cwd=tmp_path).stdout)
    (run,) = history["runs"]
    assert (run["status"], run["params"]) == ("succeeded", {"who": value})
    text = cli("--settings", str(settings), "history", cwd=tmp_path).stdout
    assert "PARAMETERS" in text and repr(value) in text
    import sqlite3
    with sqlite3.connect(tmp_path / "agent.db") as db:
        assert db.execute("SELECT v FROM seen").fetchall() == [(value,)]
    missing = cli("--settings", str(settings), "run-now", "p", cwd=tmp_path)
    assert missing.returncode == 2 and "declares 'who' without a default" in missing.stderr
