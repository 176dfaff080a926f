"""The servers the agent takes its own credentials to (AGENT_FLEET_SERVERS, docs/fleet.md
"Credentials"): the control database's own, those a job in the settings names, and those the
setting lists. An operator who names any other server in a target (agent.add_scheduled_job
@targets, the monitor's job form) gets no connection to it: no password, no token. Checked with a
loopback listener that counts every connection it is offered, on real PostgreSQL."""

from __future__ import annotations

import re
import socket
import threading
import time
from datetime import datetime, timezone

import pytest

from shared.control.db import connector, resolve_database
from shared.errors import ConfigError
from shared.control.connection_strings import server_address
from shared.settings import load_settings
from tests.integration.test_fleet import pg_control  # noqa: F401  (a fresh PostgreSQL control database)
from tests.integration.test_monitor import scenario  # noqa: F401  (module-scoped: SQLite and PostgreSQL)
from tests.integration.test_monitor_actions import Client, servers  # noqa: F401
from tests.integration.test_monitor_jobform import NIGHTLY, define_fields
from tests.support.harness import make_agent, query, work

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


def test_one_address_whatever_its_spelling():
    assert server_address("MyServer.Database.Windows.NET.", "mssql") == "myserver.database.windows.net:1433"
    assert server_address("tcp:sql01,1433", "mssql") == server_address("SQL01", "mssql") == "sql01:1433"
    assert server_address("sql01,14330", "mssql") == "sql01:14330" != server_address("sql01", "mssql")
    assert server_address("10.0.0.5", "postgres") == server_address("10.0.0.5:5432", "postgres") == "10.0.0.5:5432"
    assert server_address("10.0.0.5:6432", "postgres") != server_address("10.0.0.5", "postgres")


SPELLINGS = {
    "postgres": ["10.0.0.5", "10.0.0.5:5432", "10.0.0.5:06543", "PG.Example.com.", " pg.example.com : 7000 "],
    "mssql": ["sql01", "sql01,1433", "tcp:SQL01,14330", "TCP:sql01", "myserver.database.windows.net.,01433"],
}
REFUSED = {
    # a ',' in a PostgreSQL host is a libpq host list (127.0.0.2 and 6543, both on 5432); 'tcp:'
    # would be a host named tcp; a ':' in a SQL Server host is no form every driver reads alike
    "postgres": ["127.0.0.2,6543", "tcp:127.0.0.1:5432", "a:b:c", "host:", "host:0", "host:70000", "[::1]:5432",
                 "a b", "host/x"],
    "mssql": ["host:1433", "tcp:host:1433", "host,", "host,x", "host,0", "a,b,c", "host\\inst"],
}


@pytest.mark.parametrize("dialect", ["postgres", "mssql"])
def test_what_the_allow_list_checks_is_what_the_connection_string_reaches(dialect):
    """One parser (split_server) for the check and for with_server: for every spelling accepted,
    the host and port the connection string names are the address the check compared, whatever
    the base string held (its own Port=, another server); every other spelling is refused."""
    from shared.control.connection_strings import odbc_pairs, split_server, with_server

    base = {"postgres": "Driver={PostgreSQL Unicode};Servername=control.example.com;Port=34195;Database=agent;"
                        "UID=agent;PWD=secret;",
            "mssql": "Driver={FreeTDS};Server=control.example.com;Port=34195;Database=agent;UID=agent;PWD=secret;"}[dialect]
    for spelling in SPELLINGS[dialect]:
        pairs = odbc_pairs(with_server(base, spelling, dialect))
        if dialect == "postgres":
            reached = f"{pairs['servername']}:{int(pairs['port'])}"
        else:
            assert "port" not in pairs, pairs             # FreeTDS would take Port= over the default
            host, _, port = pairs["server"].partition(",")
            reached = f"{host}:{int(port)}"
        assert reached == server_address(spelling, dialect), (spelling, pairs)
        assert split_server(spelling, dialect)[1] == int(reached.rpartition(":")[2])
    for spelling in REFUSED[dialect]:
        with pytest.raises(ConfigError):
            server_address(spelling, dialect)
        with pytest.raises(ConfigError):
            with_server(base, spelling, dialect)


def test_freetds_is_never_handed_a_value_with_a_closing_brace_and_its_port_setting_counts():
    """FreeTDS ends a braced value at its first '}' and reads the rest as keys: a database name a
    listing returns ('t};Server=elsewhere,1;') is refused, not quoted. The control database's own
    server is what FreeTDS reaches: Server plus its Port=."""
    from shared.control.connection_strings import odbc_pairs, with_database
    from shared.control.db import parse_database_url

    base = "Driver={FreeTDS};Server=127.0.0.3;Port=34195;Database=agent;UID=sa;PWD=secret;"
    for name in ("tenant_x};Port=1;", "tenant_x};Server=127.0.0.9,1;a={", "}"):
        with pytest.raises(ConfigError) as caught:
            with_database(base, name, "mssql")
        assert caught.value.setting == "Database" and "FreeTDS" in caught.value.expected
    # another SQL Server driver reads the doubled brace as ODBC says: carried exactly
    ms = "Driver={ODBC Driver 18 for SQL Server};Server=h;Database=agent;UID=sa;PWD=secret;"
    assert odbc_pairs(with_database(ms, "t};Port=1;", "mssql"))["database"] == "t};Port=1;"
    target = parse_database_url(base).with_fleet_servers(())
    assert target.own_server() == "127.0.0.3,34195" and target.fleet_servers == {"127.0.0.3:34195"}
    with pytest.raises(ConfigError):
        target.check_fleet_server("127.0.0.3")               # :1433, which nobody named
    with pytest.raises(ConfigError) as caught:
        parse_database_url(base).with_fleet_servers(("ok.example.com", "bad:1433"))
    assert caught.value.setting == "AGENT_FLEET_SERVERS" and caught.value.value == "bad:1433"


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
    assert settings.agent.fleet_servers == ("listed.example.com:5433",)
    assert settings.agent.job_servers == ("Named.Example.com", "other.example.com:6432")
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


def test_a_comma_port_on_postgresql_is_refused_not_sent_to_the_allowed_hosts_default_port(pg_control, listener):
    """The attack: AGENT_FLEET_SERVERS allows 127.0.0.2:<port>; an operator's target spells it
    '127.0.0.2,<port>', which libpq would read as two hosts on 5432. Refused in words; a listener
    on 127.0.0.2:5432 is offered no connection."""
    other = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    other.bind(("127.0.0.2", 5432))
    other.listen(4)
    other.settimeout(0.5)
    try:
        agent = make_agent(pg_control, AGENT_CONNECT_RETRY_SECONDS="0",
                           AGENT_FLEET_SERVERS=f"127.0.0.2:{listener.port}")
        for name, targets in {"comma_db": f"db:127.0.0.2,{listener.port}/app",
                              "comma_server": f"server:127.0.0.2,{listener.port}"}.items():
            _define(pg_control, name=name, sql="SELECT 1", schedule="0 0 3 * * *", targets=targets, max_attempts=1)
        agent.tick(datetime.now(UTC))
        # Refused when the job is planned, for that job alone (it was refused at every run before).
        jobs = {row["job_name"]: row for row in agent.store().execute("list_jobs").rows}
        for name in ("comma_db", "comma_server"):
            assert jobs[name]["valid"] == 0, jobs[name]
            assert "its server must be host or host:port (PostgreSQL)" in jobs[name]["config_error"], jobs[name]
        with pytest.raises(socket.timeout):
            other.accept()[0].close()
    finally:
        other.close()


def test_an_operators_job_naming_another_server_fails_its_step_without_connecting_until_the_deployer_lists_it(
        pg_control, listener):
    """agent.add_scheduled_job @targets naming the listener: every member kind (db:, a glob,
    server:) fails its run's step in one line naming the server and AGENT_FLEET_SERVERS, and the
    listener is offered no connection; the job stays defined and valid. Once the deployer lists the
    server, the same job's next run connects there (the listener is offered connections)."""
    elsewhere = f"127.0.0.1:{listener.port}"
    agent = make_agent(pg_control, AGENT_CONNECT_RETRY_SECONDS="1")
    members = {"plain": f"db:{elsewhere}/app", "glob": f"db:{elsewhere}/tenant_*", "whole": f"server:{elsewhere}"}
    for name, targets in {**members, "respelled": f"db:tcp:127.0.0.1,{listener.port}/app"}.items():
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
    # SQL Server's spelling on PostgreSQL: refused when the job is planned, for that job alone.
    assert jobs["respelled"]["valid"] == 0 and "its server must be host or host:port" in jobs["respelled"]["config_error"]

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
    assert f"server:127.0.0.1:{listener.port}" in page and "AGENT_FLEET_SERVERS" in page, re.findall(r"expected[^<]*", page)
    assert listener.accepted == 0


def test_a_listed_database_name_cannot_smuggle_keys_through_unixodbcs_8_bit_copy(pg_control):
    """The second attack: unixODBC reads the driver (and hands an ANSI driver the string) through a
    copy keeping each character's low byte, so U+013B reads as ';' and U+013D as '='. A tenant who
    can CREATE DATABASE names one 't' U+013B 'DRIVER' U+013D 'psqlodbca.so' U+013B 'Server' U+013D
    '127.0.0.9' ...: a glob lists it, and its execution connected to 127.0.0.9 with the agent's
    password. Now that execution fails alone, naming the character; the listener on 127.0.0.9 is
    offered nothing; the ordinary database of the same glob runs."""
    from shared.control.connection_strings import with_database
    from tests.support import tsql_caller
    from tests.support.harness import pg_admin_connection

    evil = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    evil.bind(("127.0.0.9", 0))
    evil.listen(4)
    evil.settimeout(0.5)
    prefix = f"f{int(time.time() * 1000) % 10**5:05d}"   # the name must fit 63 bytes
    hostile = f"{prefix}\u013bDRIVER\u013dpsqlodbca.so\u013bServer\u013d127.0.0.9\u013bPort\u013d{evil.getsockname()[1]}"
    plain = f"{prefix}_plain"
    admin = pg_admin_connection()
    admin.autocommit = True
    try:
        for name in (hostile, plain):
            admin.cursor().execute(f'CREATE DATABASE "{name}"')
        for bad in ("x\u013bPort\u013d1", "x\u017b", "x\u017d", "x\u0100"):
            with pytest.raises(ConfigError) as caught:
                with_database("Driver={PostgreSQL Unicode};Servername=h;", bad, "postgres")
            assert "low byte" in caught.value.expected
        with_database("Driver={PostgreSQL Unicode};Servername=h;", "数据库_é", "postgres")   # other Unicode: carried
        agent = make_agent(pg_control, AGENT_CONNECT_RETRY_SECONDS="0")
        connection = tsql_caller.connect(pg_control)
        try:
            tsql_caller.call(connection, "add_scheduled_job", name="tenants", sql="SELECT 1", schedule="0 0 3 * * *",
                             targets=f"db:{prefix}*", max_attempts=1)
            agent.tick(datetime.now(UTC))
            (started,) = tsql_caller.call(connection, "start_job", job_name="tenants")
        finally:
            connection.close()
        work(agent, concurrency=2, max_seconds=60)
        done = dict(query(agent, f"SELECT target_database, status FROM agent.runs WHERE parent_run_id = {started['run_id']}"))
        errors = dict(query(agent, f"SELECT target_database, last_error FROM agent.runs "
                                   f"WHERE parent_run_id = {started['run_id']}"))
        assert done == {hostile: "failed", plain: "succeeded"}, done
        assert "U+013B" in errors[hostile] and "low byte" in errors[hostile]
        with pytest.raises(socket.timeout):
            evil.accept()[0].close()
    finally:
        for name in (hostile, plain):
            admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
        evil.close()

