"""The Azure Developer CLI template, checked with what runs here (no azd, no Azure, no network):

- azure.yaml against azd's published JSON Schema, vendored as data in
  tests/repo/data/azd-azure.yaml.schema.json: Azure/azure-dev, schemas/v1.0/azure.yaml.json at commit
  48865ed5ca1601e0d003198dcc04f1255f187094 (MIT License, Copyright (c) Microsoft Corporation).
  The schema refers to a few other schemas by URL (azd extensions' hosts); the validator here
  retrieves nothing, so a reference it would follow fails the test instead of reaching out.
- the postprovision hook (scripts/azd/postprovision.sh) run for real: the operator CLI's
  init-db and grant-sql against a stand-in control database (SQLite, PostgreSQL), while `az` is a
  shim on PATH that records each call. The record shows the order (firewall opened, init-db,
  grant-sql, firewall closed) and that the firewall is closed on every failure and on SIGTERM.
- the PowerShell variant (postprovision.ps1) cannot run here (no pwsh): it is checked for the
  same az calls, CLI commands and settings as the POSIX one, with the close in a finally block.

The Bicep side (outputs the hook reads, parameters azd fills) is in tests/repo/test_infra.py.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest
import referencing
import yaml

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "tests" / "repo" / "data" / "azd-azure.yaml.schema.json"
HOOK_SH = REPO / "scripts" / "azd" / "postprovision.sh"
HOOK_PS1 = REPO / "scripts" / "azd" / "postprovision.ps1"
DEPLOYER_IP = "203.0.113.7"          # TEST-NET-3: never a real address
RESOURCE_GROUP = "rg-sqlagent-test"
SQL_SERVER = "sqlagent-sql-abcd1234"
APP_USER = "sqlagent-id-abcd1234"
HOOK_TIMEOUT = 120


# ------------------------------------------------------------------ azure.yaml


def _no_network(uri: str):
    raise LookupError(f"the vendored azd schema refers to {uri}; this test retrieves nothing")


def _validator() -> jsonschema.Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["$id"] == "https://raw.githubusercontent.com/Azure/azure-dev/main/schemas/v1.0/azure.yaml.json"
    cls = jsonschema.validators.validator_for(schema)
    assert cls is jsonschema.Draft201909Validator
    cls.check_schema(schema)
    return cls(schema, registry=referencing.Registry(retrieve=_no_network))


def _azure_yaml() -> dict:
    return yaml.safe_load((REPO / "azure.yaml").read_text(encoding="utf-8"))


def test_azure_yaml_is_valid_against_azds_published_schema():
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(_azure_yaml())]
    assert errors == []


def test_azure_yaml_declares_the_function_app_service_and_the_hooks():
    document = _azure_yaml()
    assert document["services"] == {"agent": {"project": ".", "language": "python", "host": "function"}}
    assert document["infra"] == {"provider": "bicep", "path": "infra", "module": "main"}
    assert (REPO / "infra" / "main.bicep").is_file() and (REPO / "infra" / "main.parameters.json").is_file()
    hook = document["hooks"]["postprovision"]
    assert hook["posix"]["shell"] == "sh" and hook["windows"]["shell"] == "pwsh"
    assert (REPO / hook["posix"]["run"]) == HOOK_SH and (REPO / hook["windows"]["run"]) == HOOK_PS1
    assert not hook["posix"].get("continueOnError") and not hook["windows"].get("continueOnError")
    assert os.access(HOOK_SH, os.X_OK)
    mode = subprocess.run(["git", "ls-files", "-s", str(HOOK_SH.relative_to(REPO))], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    assert mode.startswith("100755"), f"scripts/azd/postprovision.sh is not executable in git: {mode!r}"


@pytest.mark.parametrize("change, complaint", [
    (lambda d: d.update(name="SQL Agent"), "does not match"),
    (lambda d: d["services"]["agent"].update(remoteBuild="yes"), "is not of type 'boolean'"),
    (lambda d: d["hooks"]["postprovision"]["posix"].update(shell="bash"), "is not valid"),
    (lambda d: d["hooks"].update(postprovison={"shell": "sh", "run": "x.sh"}), "'postprovison' was unexpected"),
    (lambda d: d["hooks"]["postprovision"].update(run="x.sh"), "is not valid"),
    (lambda d: d["infra"].update(provider="Bicep!"), "does not match"),
])
def test_the_schema_check_catches_mistakes(change, complaint):
    """The validation above can fail: each mistake azd itself would reject is reported."""
    document = copy.deepcopy(_azure_yaml())
    change(document)
    messages = [error.message for error in _validator().iter_errors(document)]
    assert any(complaint in message for message in messages), messages


# ------------------------------------------------------------------ the hook, run


@pytest.fixture
def shims(tmp_path: Path) -> dict[str, Path]:
    """bin/az records its arguments and exits with AZ_CREATE_EXIT / AZ_DELETE_EXIT; bin/python
    records its arguments, optionally sleeps (HOOK_SLOW_INIT_DB, for the SIGTERM test), then runs
    the real interpreter (HOOK_RECORD_ONLY: it does not, for the Azure SQL mode, which has no
    stand-in here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    az = bin_dir / "az"
    az.write_text(
        "#!/bin/sh\n"
        'printf "az %s\\n" "$*" >> "$HOOK_LOG"\n'
        'case "$*" in\n'
        '  "sql server firewall-rule create "*) exit "${AZ_CREATE_EXIT:-0}" ;;\n'
        '  "sql server firewall-rule delete "*) exit "${AZ_DELETE_EXIT:-0}" ;;\n'
        "esac\n"
        'echo "az shim: unexpected call: $*" >&2\n'
        "exit 2\n", encoding="utf-8")
    python = bin_dir / "python"
    python.write_text(
        "#!/bin/sh\n"
        'printf "python %s\\n" "$*" >> "$HOOK_LOG"\n'
        'if [ -n "${HOOK_SLOW_INIT_DB:-}" ] && [ "$3" = init-db ]; then sleep 60; fi\n'
        'if [ -n "${HOOK_RECORD_ONLY:-}" ]; then exit 0; fi\n'
        f'exec "{sys.executable}" "$@"\n', encoding="utf-8")
    for path in (az, python):
        path.chmod(0o755)
    return {"bin": bin_dir, "log": log, "python": python}


def _environment(shims: dict[str, Path], **overrides: str | None) -> dict[str, str]:
    """The hook's environment as azd gives it, with the stand-ins: no AGENT_SQL_SERVER (the CLI
    then uses AGENT_DB), az and the CLI's interpreter from the shims."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("AGENT_", "JOB__", "AZURE", "AzureWebJobs", "APPLICATIONINSIGHTS"))}
    env.update({
        "PATH": f"{shims['bin']}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        "HOOK_LOG": str(shims["log"]),
        "AZURE_RESOURCE_GROUP": RESOURCE_GROUP,
        "AZURE_SQL_SERVER_NAME": SQL_SERVER,
        "AGENT_DATABASE_USER": APP_USER,
        "AGENT_DEPLOYER_IP": DEPLOYER_IP,
        "AGENT_PYTHON": str(shims["python"]),
    })
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run_hook(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(HOOK_SH)], cwd="/", env=env, capture_output=True, text=True,
                          timeout=HOOK_TIMEOUT, check=False)


def _calls(shims: dict[str, Path]) -> list[str]:
    return shims["log"].read_text(encoding="utf-8").splitlines() if shims["log"].exists() else []


OPEN = (f"az sql server firewall-rule create --resource-group {RESOURCE_GROUP} --server {SQL_SERVER} "
        f"--name azd-postprovision --start-ip-address {DEPLOYER_IP} --end-ip-address {DEPLOYER_IP} --only-show-errors")
CLOSE = (f"az sql server firewall-rule delete --resource-group {RESOURCE_GROUP} --server {SQL_SERVER} "
         "--name azd-postprovision --only-show-errors")
INIT_DB = "python -m shared.cli init-db"
GRANT = f"python -m shared.cli grant-sql --app-name {APP_USER}"


def _agent_tables_postgres(url: str) -> set[str]:
    import pyodbc

    connection = pyodbc.connect(url, autocommit=True, timeout=5)
    try:
        rows = connection.cursor().execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'agent'").fetchall()
    finally:
        connection.close()
    return {row[0] for row in rows}


def _agent_tables_sqlite(path: Path) -> set[str]:
    import sqlite3

    connection = sqlite3.connect(path)
    try:
        return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        connection.close()


def _assert_grant_script(stdout: str) -> None:
    assert f"CREATE USER [{APP_USER}] FROM EXTERNAL PROVIDER;" in stdout
    assert f"ON SCHEMA::[agent] TO [{APP_USER}];" in stdout


def test_hook_on_postgres_opens_the_firewall_runs_init_db_and_grant_sql_then_closes_it(shims, pg_url):
    # pg_url (tests/conftest.py): a fresh PostgreSQL database; fails in CI when PostgreSQL is missing.
    result = _run_hook(_environment(shims, AGENT_DB=pg_url))
    assert result.returncode == 0, result.stderr
    assert _calls(shims) == [OPEN, INIT_DB, GRANT, CLOSE]
    tables = _agent_tables_postgres(pg_url)
    assert {"runs", "schema_version"} <= tables, tables      # init-db ran on the stand-in
    _assert_grant_script(result.stdout)                       # grant-sql ran (printing: not Azure SQL)
    assert "grant-sql prints the T-SQL" in result.stdout


def test_hook_on_sqlite_too(shims, tmp_path):
    database = tmp_path / "agent.db"
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{database}"))
    assert result.returncode == 0, result.stderr
    assert _calls(shims) == [OPEN, INIT_DB, GRANT, CLOSE]
    assert {"agent_runs", "agent_schema_version"} <= _agent_tables_sqlite(database)
    _assert_grant_script(result.stdout)


def test_init_db_failing_still_closes_the_firewall_and_fails_the_hook(shims, tmp_path):
    missing = tmp_path / "no-such-folder" / "agent.db"
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{missing}"))
    assert result.returncode == 2, (result.returncode, result.stderr)   # init-db's own exit code, passed on
    assert _calls(shims) == [OPEN, INIT_DB, CLOSE]                      # no grant-sql after a failed init-db
    assert "does not exist" in result.stderr and "closing the SQL firewall" in result.stdout


def test_grant_sql_failing_still_closes_the_firewall(shims, tmp_path):
    bad_user = "x" * 129                                                # beyond sysname: refused
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", AGENT_DATABASE_USER=bad_user))
    assert result.returncode != 0
    assert _calls(shims) == [OPEN, INIT_DB, GRANT.replace(APP_USER, bad_user), CLOSE]
    assert "--app-name" in result.stderr


def test_private_network_profile_makes_no_firewall_rule(shims, tmp_path):
    """networkProfile private (output AGENT_NETWORK_PROFILE): the server takes no firewall rule, so
    the hook makes none and runs init-db and grant-sql directly (through the private endpoint)."""
    database = tmp_path / "agent.db"
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{database}", AGENT_NETWORK_PROFILE="private",
                                    AGENT_DEPLOYER_IP=None))
    assert result.returncode == 0, result.stderr
    assert _calls(shims) == [INIT_DB, GRANT]
    assert "private endpoint" in result.stdout and "firewall" not in " ".join(_calls(shims))
    assert {"agent_runs", "agent_schema_version"} <= _agent_tables_sqlite(database)
    failing = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'none' / 'agent.db'}",
                                     AGENT_NETWORK_PROFILE="private"))
    assert failing.returncode == 2                                   # init-db's failure fails the hook


def test_an_unknown_network_profile_is_refused_naming_it(shims, tmp_path):
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", AGENT_NETWORK_PROFILE="Private "))
    assert result.returncode == 1 and _calls(shims) == []
    assert "AGENT_NETWORK_PROFILE=Private : expected public or private" in result.stderr


def test_a_failed_open_runs_nothing_and_still_removes_the_rule(shims, tmp_path):
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", AZ_CREATE_EXIT="3"))
    assert result.returncode == 3
    assert _calls(shims) == [OPEN, CLOSE]


def test_a_failed_close_fails_the_hook_and_says_how_to_close_it(shims, tmp_path):
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", AZ_DELETE_EXIT="1"))
    assert result.returncode == 1
    assert _calls(shims) == [OPEN, INIT_DB, GRANT, CLOSE]
    assert (f"az sql server firewall-rule delete --resource-group {RESOURCE_GROUP} --server {SQL_SERVER} "
            "--name azd-postprovision") in result.stderr


def test_sigterm_during_init_db_still_closes_the_firewall(shims, tmp_path):
    env = _environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", HOOK_SLOW_INIT_DB="1")
    process = subprocess.Popen(["sh", str(HOOK_SH)], cwd="/", env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while INIT_DB not in _calls(shims):
            assert time.monotonic() < deadline and process.poll() is None, "the hook never reached init-db"
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGTERM)     # what a closed terminal or a CI cancel sends
        process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    assert process.returncode == 143
    assert _calls(shims) == [OPEN, INIT_DB, CLOSE]


@pytest.mark.parametrize("unset, named", [
    ("AZURE_RESOURCE_GROUP", "AZURE_RESOURCE_GROUP"),
    ("AZURE_SQL_SERVER_NAME", "AZURE_SQL_SERVER_NAME"),
    ("AGENT_DATABASE_USER", "AGENT_DATABASE_USER"),
    ("AGENT_DB", "AGENT_SQL_SERVER"),
])
def test_missing_settings_are_named_before_anything_runs(shims, tmp_path, unset, named):
    env = _environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}")
    env.pop(unset)
    result = _run_hook(env)
    assert result.returncode == 1
    assert named in result.stderr and "expected" in result.stderr
    assert _calls(shims) == []


def test_azure_sql_mode_applies_the_grants_and_needs_the_database(shims):
    """With the template's outputs (AGENT_SQL_SERVER, AGENT_SQL_DATABASE) the hook runs grant-sql
    with --apply; the CLI itself is not run here (no Azure SQL), only recorded. Without
    AGENT_SQL_DATABASE it stops before opening anything."""
    server = f"{SQL_SERVER}.database.windows.net"
    result = _run_hook(_environment(shims, AGENT_SQL_SERVER=server, AGENT_SQL_DATABASE="sqlagent", HOOK_RECORD_ONLY="1"))
    assert result.returncode == 0, result.stderr
    assert _calls(shims) == [OPEN, INIT_DB, GRANT + " --apply", CLOSE]
    shims["log"].unlink()
    result = _run_hook(_environment(shims, AGENT_SQL_SERVER=server, HOOK_RECORD_ONLY="1"))
    assert result.returncode == 1 and "AGENT_SQL_DATABASE is not set" in result.stderr
    assert _calls(shims) == []


@pytest.mark.parametrize("address", ["2001:db8::1", "203.0.113", "local host"])
def test_a_bad_deployer_address_is_refused_naming_the_setting(shims, tmp_path, address):
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}", AGENT_DEPLOYER_IP=address))
    assert result.returncode == 1
    assert f"AGENT_DEPLOYER_IP={address}: expected an IPv4 address" in result.stderr
    assert _calls(shims) == []


def test_a_missing_interpreter_is_refused_with_the_way_to_create_it(shims, tmp_path):
    result = _run_hook(_environment(shims, AGENT_DB=f"sqlite:///{tmp_path / 'agent.db'}",
                                    AGENT_PYTHON=str(tmp_path / "no-venv" / "python")))
    assert result.returncode == 1 and "requirements.txt" in result.stderr and "AGENT_PYTHON" in result.stderr
    assert _calls(shims) == []


# ------------------------------------------------------------------ the PowerShell twin


def _az_calls(text: str) -> list[str]:
    """The az sub-commands and their options, in order, with line continuations joined."""
    joined = re.sub(r"\s*(`|\\)\n\s*", " ", text)
    return [" ".join(re.findall(r"(?<!\S)(--[a-z-]+|firewall-rule \w+)", line))
            for line in joined.splitlines() if re.match(r"\s*(if ! )?az sql ", line)]


def test_the_powershell_hook_makes_the_same_calls_and_closes_in_finally():
    sh, ps1 = HOOK_SH.read_text(encoding="utf-8"), HOOK_PS1.read_text(encoding="utf-8")
    assert _az_calls(ps1) == [
        "firewall-rule create --resource-group --server --name --start-ip-address --end-ip-address --only-show-errors",
        "firewall-rule delete --resource-group --server --name --only-show-errors"]
    assert sorted(_az_calls(ps1)) == sorted(_az_calls(sh))
    body = ps1.split("\ntry {", 1)[1]
    attempt, rest = body.split("\ncatch {", 1)
    handler, cleanup = rest.split("\nfinally {", 1)
    assert "firewall-rule create" in attempt and "-m shared.cli init-db" in attempt
    assert attempt.index("firewall-rule create") < attempt.index("init-db") < attempt.index("grant-sql")
    assert "firewall-rule delete" in cleanup and "firewall-rule delete" not in attempt
    for name in ("AZURE_RESOURCE_GROUP", "AZURE_SQL_SERVER_NAME", "AGENT_DATABASE_USER", "AGENT_SQL_SERVER",
                 "AGENT_SQL_DATABASE", "AGENT_DB", "AGENT_PYTHON", "AGENT_DEPLOYER_IP", "AGENT_FIREWALL_RULE",
                 "AGENT_NETWORK_PROFILE"):
        assert f"$env:{name}" in ps1 and f"{name}" in sh, name
    assert "'azd-postprovision'" in ps1 and "azd-postprovision}" in sh
    assert "@('--apply')" in ps1
