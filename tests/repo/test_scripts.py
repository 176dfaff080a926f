"""The two quick-start commands on a machine without a suitable Python.

azure-functions installs on Python 3.10 to 3.13 only (1.26 below 3.13, 2.x on 3.13). scripts/test.sh and
scripts/run-local.sh must then stop in one line saying which Python is needed and how to point
them at one (PYTHON=...), before creating a virtual environment or running pip.

Hermetic: each test copies scripts/ into a temporary project, and runs it with a PATH holding only
fake interpreters (shell scripts that report a version and log every call) and `dirname`. The
real interpreters of this machine are out of sight, and nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASH = shutil.which("bash") or "/bin/bash"
SCRIPTS = ["scripts/test.sh", "scripts/run-local.sh"]


class Machine:
    """A temporary project (a copy of scripts/ and the requirement files) and a PATH of fakes."""

    def __init__(self, root: Path) -> None:
        self.project = root / "project"
        self.bin = root / "bin"
        self.log = root / "calls.log"
        shutil.copytree(REPO / "scripts", self.project / "scripts")
        for name in ("requirements.txt", "requirements-dev.txt", "requirements-checkov.txt", "local.settings.example.json"):
            shutil.copy(REPO / name, self.project / name)
        self.bin.mkdir()
        for tool in ("dirname",):                      # the only external command before the check
            os.symlink(shutil.which(tool), self.bin / tool)
        self.log.touch()

    def fake_python(self, path: Path, version: str) -> Path:
        """An interpreter that answers the version query with `version` and fails anything else
        (so a script that got past the check stops at once, and the log shows what it tried)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n"
                        f'echo "$0 $*" >> "{self.log}"\n'
                        'case "$*" in *sys.version_info*) '
                        f'echo "{version}"; exit 0;; esac\n'
                        "exit 97\n")
        path.chmod(0o755)
        return path

    def run(self, script: str, **environment: str) -> subprocess.CompletedProcess:
        env = {"PATH": str(self.bin), "HOME": str(self.project), **environment}
        return subprocess.run([BASH, script], cwd=self.project, env=env,    # as typed in the README
                              capture_output=True, text=True, timeout=30)

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def assert_one_line_naming_the_fix(result: subprocess.CompletedProcess, script: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert "3.10, 3.11, 3.12 or 3.13" in line and f"PYTHON=/path/to/python3.11 {script}" in line, line
    return line


@pytest.mark.parametrize("script", SCRIPTS)
def test_only_python_314_on_the_path_is_one_line_before_any_venv_or_pip(machine: Machine, script: str):
    machine.fake_python(machine.bin / "python3", "3.14")
    result = machine.run(script)
    line = assert_one_line_naming_the_fix(result, script)
    assert line.startswith(f"{script}: needs Python") and "python3 is 3.14" in line
    assert not (machine.project / ".venv").exists()
    assert all("sys.version_info" in call for call in machine.calls()), machine.calls()   # no venv, no pip


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_python_at_all_is_the_same_one_line(machine: Machine, script: str):
    result = machine.run(script)
    line = assert_one_line_naming_the_fix(result, script)
    assert "no python3 is on the PATH" in line


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_python_named_by_PYTHON_outside_the_range_is_refused(machine: Machine, script: str):
    machine.fake_python(machine.bin / "python3.11", "3.11")        # a good one the user did not pick
    chosen = machine.fake_python(machine.project / "py" / "python3.9", "3.9")
    result = machine.run(script, PYTHON=str(chosen))
    line = assert_one_line_naming_the_fix(result, script)
    assert f"PYTHON={chosen} is 3.9" in line
    assert not (machine.project / ".venv").exists()


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_first_supported_python_on_the_path_creates_the_venv(machine: Machine, script: str):
    machine.fake_python(machine.bin / "python3", "3.14")
    machine.fake_python(machine.bin / "python3.13", "3.13")
    machine.fake_python(machine.bin / "python3.12", "3.12")
    machine.fake_python(machine.bin / "python3.11", "3.11")
    result = machine.run(script)
    assert result.returncode == 97                                 # the fake refused to create it
    created = [call for call in machine.calls() if "-m venv" in call]
    assert created == [f"{machine.bin / 'python3.11'} -m venv .venv"], machine.calls()


@pytest.mark.parametrize("script", SCRIPTS)
def test_PYTHON_in_the_range_is_used(machine: Machine, script: str):
    chosen = machine.fake_python(machine.project / "py" / "python3.10", "3.10")
    result = machine.run(script, PYTHON=str(chosen))
    assert result.returncode == 97
    assert [call for call in machine.calls() if "-m venv" in call] == [f"{chosen} -m venv .venv"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_venv_made_with_an_unsupported_python_is_named(machine: Machine, script: str):
    machine.fake_python(machine.project / ".venv" / "bin" / "python", "3.14")
    machine.fake_python(machine.bin / "python3.11", "3.11")
    result = machine.run(script)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert ".venv was made with Python 3.14" in line and "rm -rf .venv" in line and "3.10, 3.11, 3.12 or 3.13" in line
    assert not [call for call in machine.calls() if "pip" in call or "-m venv" in call]


TEST_313 = "scripts/test-313.sh"


def test_the_313_leg_without_python_313_is_one_line_before_any_venv(machine: Machine):
    """scripts/test-313.sh (the unit tests and the worker-indexing test on Python 3.13) on a
    machine without 3.13: one line saying how to get one or point at one; CI fails on it."""
    machine.fake_python(machine.bin / "python3.11", "3.11")
    machine.fake_python(machine.bin / "python3.12", "3.12")
    result = machine.run(TEST_313)
    assert result.returncode == 2, (result.returncode, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{TEST_313}: needs Python 3.13") and f"PYTHON313=/path/to/python3.13 {TEST_313}" in line
    assert "pyenv install 3.13" in line and "no python3.13 is on the PATH" in line
    assert not (machine.project / ".venv313").exists() and not machine.calls()


def test_the_313_leg_finds_python313_on_the_path_or_in_pyenv(machine: Machine):
    pyenv = machine.fake_python(machine.project / ".pyenv" / "versions" / "3.13.5" / "bin" / "python3.13", "3.13")
    result = machine.run(TEST_313)                       # HOME is the project: ~/.pyenv is the fake
    assert result.returncode == 97
    assert [call for call in machine.calls() if "-m venv" in call] == [f"{pyenv} -m venv .venv313"]
    on_path = machine.fake_python(machine.bin / "python3.13", "3.13")
    (machine.log).write_text("")
    result = machine.run(TEST_313)
    assert result.returncode == 97
    assert [call for call in machine.calls() if "-m venv" in call] == [f"{on_path} -m venv .venv313"]


def test_PYTHON313_of_another_version_is_refused(machine: Machine):
    machine.fake_python(machine.bin / "python3.13", "3.13")          # a good one the user did not pick
    chosen = machine.fake_python(machine.project / "py" / "python3", "3.12")
    result = machine.run(TEST_313, PYTHON313=str(chosen))
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"PYTHON313={chosen} is 3.12" in line
    assert not (machine.project / ".venv313").exists()


def test_run_local_starts_the_monitor_beside_the_runner_and_ctrl_c_stops_both(tmp_path: Path):
    """The real script with this repository's .venv: it prints the monitor's URL, the monitor
    answers while the runner runs, and Ctrl-C (SIGINT to the terminal's process group) stops
    both, the monitor included (nothing listens on its port afterwards)."""
    import re
    import signal
    import socket
    import time
    import urllib.request

    if not (REPO / ".venv" / "bin" / "python").exists():
        from tests.support.harness import service_missing

        service_missing("the project's .venv", "scripts/test.sh creates it")
    env = {**os.environ, "MONITOR_PORT": "0", "AGENT_DB": f"sqlite:///{tmp_path / 'agent.db'}"}
    from tests.support.harness import as_from_a_terminal

    process = subprocess.Popen([BASH, "scripts/run-local.sh"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True,
                               preexec_fn=as_from_a_terminal)
    try:
        url = None
        deadline = time.monotonic() + 120
        lines = []
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"monitor: (http://127\.0\.0\.1:\d+/)", line)
            url = match.group(1) if match else None
        assert url, "".join(lines)
        for _ in range(100):                   # the runner's first tick syncs the sample jobs
            with urllib.request.urlopen(url + "?format=json", timeout=10) as response:
                jobs = {row["job_name"] for row in __import__("json").loads(response.read())}
            if "heartbeat" in jobs:
                break
            time.sleep(0.2)
        assert "heartbeat" in jobs
        os.killpg(process.pid, signal.SIGINT)
        assert process.wait(timeout=60) == 0
        rest = process.stderr.read()
        assert "agent stopped" in rest and "monitor stopped" in rest, rest
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.parametrize("installed, has_command, reinstalled", [
    ("this clone", True, False),          # the quick start ran here before: nothing to do
    ("another clone", True, True),        # a venv copied or shared from elsewhere: its sql-agent runs that code
    ("nothing", False, True),             # a fresh .venv
    ("this clone", False, True),          # the script was deleted
])
def test_install_cli_installs_this_clone_unless_the_venv_has_it(tmp_path: Path, installed: str, has_command: bool,
                                                                reinstalled: bool):
    """scripts/python-env.sh's install_cli: an editable install of this clone into .venv, skipped
    only when .venv's sql-agent-azure is already this very directory (its direct_url.json)."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "scripts", project / "scripts")
    log = tmp_path / "pip.log"
    url = {"this clone": f"file://{project.resolve()}", "another clone": "file:///elsewhere/sql-agent",
           "nothing": ""}[installed]
    python = project / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n"
                      f'case "$1 $2" in "-I -c") echo "{url}"; exit 0;; esac\n'
                      f'echo "$*" >> "{log}"\n')
    python.chmod(0o755)
    if has_command:
        (python.parent / "sql-agent").write_text("#!/bin/sh\n")
        (python.parent / "sql-agent").chmod(0o755)
    result = subprocess.run([BASH, "-c", ". scripts/python-env.sh && install_cli .venv"], cwd=project,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines() if log.exists() else []
    expected = ["-m pip install -q --disable-pip-version-check --no-deps -e ."] if reinstalled else []
    assert calls == expected
