"""The servers the agent takes its own credentials to (AGENT_FLEET_SERVERS, docs/fleet.md
"Credentials"): the control database's own, those a job in the settings names, and those the
setting lists. An operator who names any other server in a target (agent.add_scheduled_job
@targets, the monitor's job form) gets no connection to it: no password, no token. Checked with a
loopback listener that counts every connection it is offered, on real PostgreSQL."""

from __future__ import annotations

import socket
import threading
import time
from datetime import datetime, timezone

import pytest

from shared.control.db import connector, resolve_database
from shared.errors import ConfigError
from shared.jobs.targets import server_address
from shared.settings import load_settings
from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import Client, servers  # noqa: F401
from tests.integration.test_monitor_jobform import NIGHTLY, define_fields
from tests.support.harness import fresh_database, make_agent, work

UTC = timezone.utc


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections offered to it and closes each at
    once (a server that is not what the agent expects). Bounded: it stops with the test."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        deadline = time.monotonic() + 300
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener():
    listening = Listener()
    try:
        yield listening
    finally:
        listening.close()


@pytest.fixture
def pg_control(tmp_path):
    with fresh_database("postgres", tmp_path) as url:
        yield url


def test_one_address_whatever_its_spelling():
    assert server_address("MyServer.Database.Windows.NET.", "mssql") == "myserver.database.windows.net:1433"
    assert server_address("tcp:sql01,1433", "mssql") == server_address("SQL01", "mssql") == "sql01:1433"
    assert server_address("sql01,14330", "mssql") == "sql01:14330" != server_address("sql01", "mssql")
    assert server_address("10.0.0.5", "postgres") == server_address("10.0.0.5:5432", "postgres") == "10.0.0.5:5432"
    assert server_address("10.0.0.5:6432", "postgres") != server_address("10.0.0.5", "postgres")


def test_the_setting_names_itself_when_it_is_bad_and_the_settings_jobs_servers_are_allowed():
    with pytest.raises(ConfigError) as caught:
        load_settings({"AGENT_FLEET_SERVERS": "good.example.com, bad/server"})
    assert caught.value.setting == "AGENT_FLEET_SERVERS" and "bad/server" in str(caught.value)
    settings = load_settings({
        "AGENT_DB": "Driver={PostgreSQL Unicode};Servername=127.0.0.1;Port=5432;Database=x;",
        "AGENT_FLEET_SERVERS": "listed.example.com:5433",
        "JOB__fleet__SCHEDULE": "0 0 3 * * *", "JOB__fleet__COMMAND": "SELECT 1",
        "JOB__fleet__TARGETS": "db:Named.Example.com/app, server:other.example.com:6432",
        "JOB__bad__SCHEDULE": "never", "JOB__bad__COMMAND": "SELECT 1",
        "JOB__bad__TARGETS": "server:invalid-job.example.com"})
    assert settings.agent.fleet_servers == ("listed.example.com:5433", "Named.Example.com", "other.example.com:6432")
    target = resolve_database(settings.agent)
    assert target.fleet_servers == {"listed.example.com:5433", "named.example.com:5432", "other.example.com:6432",
                                    "127.0.0.1:5432"}
    target.check_fleet_server("named.example.com:5432")
    with pytest.raises(ConfigError) as caught:            # an invalid job's server is not the deployer's word
        target.check_fleet_server("invalid-job.example.com")
    assert caught.value.setting == "AGENT_FLEET_SERVERS" and "listed.example.com:5433" in caught.value.expected


def test_no_connection_is_opened_to_a_server_nobody_allowed(pg_control, listener):
    agent = make_agent(pg_control)
    with pytest.raises(ConfigError) as caught:
        connector(agent.target, "postgres", f"127.0.0.1:{listener.port}")
    assert caught.value.setting == "AGENT_FLEET_SERVERS" and caught.value.value == f"127.0.0.1:{listener.port}"
    # the control database's own server, spelled as a target would, is reached
    connection = connector(agent.target, "postgres", "127.0.0.1")()
    connection.close()
    time.sleep(0.3)
    assert listener.accepted == 0


def _define(control: str, **arguments) -> list[dict]:
    from tests.support import tsql_caller

    connection = tsql_caller.connect(control)
    try:
        return tsql_caller.call(connection, "add_scheduled_job", **arguments)
    finally:
        connection.close()


def _start(control: str, name: str) -> int:
    from tests.support import tsql_caller

    connection = tsql_caller.connect(control)
    try:
        (started,) = tsql_caller.call(connection, "start_job", job_name=name)
    finally:
        connection.close()
    return started["run_id"]


def test_an_operators_job_naming_another_server_fails_its_step_without_connecting_until_the_deployer_lists_it(
        pg_control, listener):
    """agent.add_scheduled_job @targets naming the listener: every member kind (db:, a glob,
    server:) fails its run's step in one line naming the server and AGENT_FLEET_SERVERS, and the
    listener is offered no connection; the job stays defined and valid. Once the deployer lists the
    server, the same job's next run connects there (the listener is offered connections)."""
    elsewhere = f"127.0.0.1:{listener.port}"
    agent = make_agent(pg_control, AGENT_CONNECT_RETRY_SECONDS="1")
    members = {"plain": f"db:{elsewhere}/app", "glob": f"db:{elsewhere}/tenant_*", "whole": f"server:{elsewhere}",
               "respelled": f"db:tcp:127.0.0.1,{listener.port}/app"}
    for name, targets in members.items():
        _define(pg_control, name=name, sql="SELECT 1", schedule="0 0 3 * * *", targets=targets, max_attempts=1)
    agent.tick(datetime.now(UTC))
    runs = {name: _start(pg_control, name) for name in members}
    work(agent, concurrency=2, max_seconds=60)
    for name, run_id in runs.items():
        run = agent.store().execute("get_run", run_id=run_id).one()
        assert run["status"] == "failed", (name, run)
        assert "AGENT_FLEET_SERVERS" in run["last_error"] and str(listener.port) in run["last_error"], run
    assert listener.accepted == 0
    jobs = {row["job_name"]: row for row in agent.store().execute("list_jobs").rows}
    assert all(jobs[name]["valid"] == 1 for name in members)

    allowed = make_agent(pg_control, AGENT_CONNECT_RETRY_SECONDS="0", AGENT_FLEET_SERVERS=f"localhost:1, {elsewhere}")
    run_id = _start(pg_control, "plain")
    work(allowed, concurrency=2, max_seconds=60)
    assert listener.accepted >= 1
    run = allowed.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "failed" and "AGENT_FLEET_SERVERS" not in (run["last_error"] or "")


def test_the_job_form_refuses_a_server_the_deployer_did_not_allow(scenario, servers, listener):  # noqa: F811
    client = Client(servers["operator"])
    page = client.get("/define")[2]
    fields = {**define_fields(page), **NIGHTLY, "name": "elsewhere", "intent": "preview",
              "targets": f"db:app, server:127.0.0.1:{listener.port}"}
    status, _, page = client.post("define", fields)
    assert status == 400, page
    assert f"server:127.0.0.1:{listener.port}" in page and "AGENT_FLEET_SERVERS" in page
    assert listener.accepted == 0
