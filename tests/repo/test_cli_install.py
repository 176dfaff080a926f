"""Every `sql-agent` command works where `pip install .` (or `pipx install .`) installed it, with
nothing else: no clone on the path, no development requirements.

A virtual environment is made with its own pip, and `pip install .` runs in it on a copy of the
files pyproject.toml reads, with no index: the wheels come from .wheelhouse, which scripts/test.sh
fills from the same pins (requirements.txt, requirements-cli.txt, the build backend) before the
tests run. Then, from a folder outside the clone, every command and sub-command the parser defines
(enumerated from shared/cli/parser.py, so a new one cannot escape) prints its --help, and each
runs once for real against a new SQLite control database: the invocation table below must name
every one of them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from shared.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".wheelhouse"
SQLAGENT_SCRIPT = ROOT / "tests" / "integration" / "sqlagent" / "nightly_maintenance.sql"


def command_paths(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command the parser accepts, as argument tuples: ('init-db',), ('poison', 'list'), ..."""
    paths: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                nested = command_paths(subparser, prefix + (name,))
                paths += nested or [prefix + (name,)]
    return paths


COMMANDS = command_paths(build_parser())


@pytest.fixture(scope="module")
def sql_agent(tmp_path_factory) -> Path:
    """The `sql-agent` of a fresh virtual environment made by `pip install .` alone."""
    if not (WHEELHOUSE / "KEY").is_file():
        message = "no .wheelhouse: scripts/test.sh makes it (the wheels pip install . needs, for an offline install)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "requirements.txt", "requirements-cli.txt", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "shared", source / "shared", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    venv = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-index", "--find-links",
                                str(WHEELHOUSE), "--disable-pip-version-check", "-q", str(source)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-3000:]
    return venv / "bin" / "sql-agent"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder outside the clone, with a settings file naming a new SQLite control database and one job."""
    folder = tmp_path_factory.mktemp("operator")
    values = {"AGENT_DB": f"sqlite:///{folder / 'agent.db'}", "AGENT_QUEUE_NAME": "agent-tasks",
              "JOB__hello__SCHEDULE": "0 0 3 * * *", "JOB__hello__COMMAND": "SELECT 1"}
    (folder / "local.settings.json").write_text(json.dumps({"Values": values}), encoding="utf-8")
    shutil.copy(SQLAGENT_SCRIPT, folder / SQLAGENT_SCRIPT.name)
    return folder


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if not key.startswith(("AGENT_", "JOB__", "PYTHONPATH"))}


def run(sql_agent: Path, workdir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(sql_agent), "--settings", "local.settings.json", *args], cwd=workdir, env=_environment(),
                          capture_output=True, text=True, timeout=timeout)


def test_the_parser_has_the_commands_this_test_knows():
    assert ("init-db",) in COMMANDS and ("poison", "list") in COMMANDS and ("poison",) not in COMMANDS
    assert set(COMMANDS) == set(INVOCATIONS), (
        f"commands without a real invocation here: {sorted(set(COMMANDS) - set(INVOCATIONS))}; "
        f"invocations of commands that no longer exist: {sorted(set(INVOCATIONS) - set(COMMANDS))}")


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_prints_its_help(sql_agent: Path, workdir: Path, command: tuple[str, ...]):
    result = run(sql_agent, workdir, *command, "--help", timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: sql-agent"), result.stdout[:300]
    assert " ".join(command) in result.stdout.splitlines()[0]


# ------------------------------------------------------------------ one real invocation each
#
# In this order, on one database: each runs its command with --json (completion: the script) and
# checks what it did; `state` carries ids from one to the next.

def _json(result: subprocess.CompletedProcess) -> object:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def _first_document(process: subprocess.Popen) -> dict:
    """The JSON document a long-running command prints when it has started (indented: several lines)."""
    text = ""
    while True:
        line = process.stdout.readline()
        assert line, (text, process.stderr.read() if process.poll() is not None else "")
        text += line
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            continue


def _until_stopped(sql_agent: Path, workdir: Path, *args: str) -> tuple[dict, str, int]:
    """Start a command that runs until Ctrl-C, wait for the document it prints once started, then
    send SIGINT (Ctrl-C): its document, its stderr and its exit code."""
    process = subprocess.Popen([str(sql_agent), "--settings", "local.settings.json", *args], cwd=workdir,
                               env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = _first_document(process)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return started, stderr, process.returncode


def check_init_db(sql_agent, workdir, state):
    document = _json(run(sql_agent, workdir, "--json", "init-db"))
    assert document["upgraded"] and document["schema_version"] >= 8, document


def check_tick(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "tick")
    assert result.returncode == 0, result.stderr
    _json(result)


def check_jobs(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "jobs")
    assert result.returncode == 0, result.stderr
    assert [job["job_name"] for job in _json(result)] == ["hello"]


def check_next(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "next", "hello", "--count", "2")
    assert result.returncode == 0, result.stderr
    assert _json(result)["job_name"] == "hello" and len(_json(result)["slots"]) == 2


def check_run_now(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "run-now", "hello")
    assert result.returncode == 0, result.stderr
    state["run_now"] = _json(result)["run_id"]


def check_work(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "work", "--until-idle", "--max-seconds", "60")
    assert result.returncode == 0, result.stderr
    assert _json(result) == {"processed": 1, "unit": "runs"}


def check_history(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "history", "--job", "hello")
    assert result.returncode == 0, result.stderr
    runs = {run["run_id"]: run for run in _json(result)["runs"]}
    assert runs[state["run_now"]]["status"] == "succeeded", runs


def check_submit(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "submit", "--sql", "SELECT 1", "--order", "1")
    assert result.returncode == 0, result.stderr
    state["submitted"] = _json(result)["run_id"]


def check_cancel(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "cancel", str(state["submitted"]))
    assert result.returncode == 0, result.stderr
    _json(result)


def check_pause(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "pause", "hello", "--reason", "install test")
    assert result.returncode == 0, result.stderr
    assert _json(result)["reason"] == "install test"


def check_resume(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "resume", "hello")
    assert result.returncode == 0, result.stderr
    assert _json(result)["resumed_at"]


def check_stop(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "stop", "hello")
    assert result.returncode == 0, result.stderr
    _json(result)


def check_audit(sql_agent, workdir, state):
    """The actions the invocations before it took on `hello`, newest first: stop last."""
    result = run(sql_agent, workdir, "--json", "audit", "--job", "hello")
    assert result.returncode == 0, result.stderr
    rows = _json(result)
    assert rows and (rows[0]["action"], rows[0]["outcome"], rows[0]["source"]) == ("stop", "done", "cli"), rows
    assert {"run-now", "pause", "resume", "stop"} <= {row["action"] for row in rows}, rows


def check_alerts(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "alerts")
    assert result.returncode == 0, result.stderr
    assert _json(result) == {"alerts": [], "firings": []}


def check_stuck(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "stuck")
    assert result.returncode == 0, result.stderr
    assert _json(result) == []


def check_poison_list(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "poison", "list")
    assert result.returncode == 0, result.stderr
    assert _json(result) == []


def check_poison_requeue(sql_agent, workdir, state):
    # No poison message exists: the documented not_found error, from the database's answer.
    result = run(sql_agent, workdir, "--json", "poison", "requeue", "424242")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert json.loads(result.stderr)["kind"] == "not_found", result.stderr


def check_doctor(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "doctor")
    document = _json(result)
    assert result.returncode == 0 and document["ok"] is True, result.stdout[-2000:]


def check_grant_sql(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "grant-sql", "--app-name", "sqlagent-func")
    assert result.returncode == 0, result.stderr
    assert "sqlagent-func" in json.dumps(_json(result))


def check_import_sqlagent(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "--json", "import-sqlagent", SQLAGENT_SCRIPT.name, "--timezone", "UTC")
    assert result.returncode == 0, result.stderr
    settings = _json(result)["settings"]
    assert any(name.startswith("JOB__") and name.endswith("__STEPS__1__COMMAND") for name in settings), settings


def check_completion(sql_agent, workdir, state):
    result = run(sql_agent, workdir, "completion", "bash")
    assert result.returncode == 0, result.stderr
    assert "import-sqlagent" in result.stdout and "complete" in result.stdout


def check_run(sql_agent, workdir, state):
    started, stderr, code = _until_stopped(sql_agent, workdir, "--json", "run", "--concurrency", "1")
    assert code == 0 and started, stderr


def check_monitor(sql_agent, workdir, state):
    process = subprocess.Popen([str(sql_agent), "--settings", "local.settings.json", "--json", "monitor", "--port", "0"],
                               cwd=workdir, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        started = _first_document(process)
        with urllib.request.urlopen(started["monitor"], timeout=30) as response:
            assert response.status == 200 and b"hello" in response.read()
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=60)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


INVOCATIONS = {
    ("init-db",): check_init_db,
    ("tick",): check_tick,
    ("jobs",): check_jobs,
    ("next",): check_next,
    ("run-now",): check_run_now,
    ("work",): check_work,
    ("history",): check_history,
    ("submit",): check_submit,
    ("cancel",): check_cancel,
    ("pause",): check_pause,
    ("resume",): check_resume,
    ("stop",): check_stop,
    ("audit",): check_audit,
    ("alerts",): check_alerts,
    ("stuck",): check_stuck,
    ("poison", "list"): check_poison_list,
    ("poison", "requeue"): check_poison_requeue,
    ("doctor",): check_doctor,
    ("grant-sql",): check_grant_sql,
    ("import-sqlagent",): check_import_sqlagent,
    ("completion",): check_completion,
    ("run",): check_run,
    ("monitor",): check_monitor,
}


def test_every_command_runs_for_real_from_the_installed_environment(sql_agent: Path, workdir: Path):
    started = time.monotonic()
    state: dict[str, object] = {}
    for command, check in INVOCATIONS.items():
        try:
            check(sql_agent, workdir, state)
        except AssertionError as failure:
            raise AssertionError(f"sql-agent {' '.join(command)}: {failure}") from None
    assert time.monotonic() - started < 120
