"""Azure SQL connection layer: token packing, the token provider, the connection string, the
ODBC environment checks and the one-line explanations of connect errors.

Azure SQL cannot be reached from here and Microsoft ODBC Driver 18 is not installed on our
machines, so: the provider is driven by a real TokenCredential-shaped object returning real
azure.core AccessToken values; the environment checks use the real pyodbc.drivers() and a real
dynamic-loader failure; the explanations are checked on errors produced for real (psqlodbc,
unixODBC, azure-identity) and on verbatim Microsoft-driver texts quoted in public issues.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

try:
    import pyodbc
except ImportError as exc:  # unixODBC missing: a CI failure, a skip elsewhere
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip(f"pyodbc cannot be imported ({exc}): apt-get install unixodbc", allow_module_level=True)

from azure.core.credentials import AccessToken

from shared.control.azure_sql import (
    DEFAULT_DRIVER,
    SQL_COPT_SS_ACCESS_TOKEN,
    SQL_SCOPE,
    AccessTokenProvider,
    build_connection_string,
    check_odbc_environment,
    connect_azure_sql,
    explain_connect_error,
    pack_access_token,
    shared_token_provider,
)
from shared.errors import AgentError, ConfigError

ROOT = Path(__file__).resolve().parents[2]
DRIVER_18_INSTALLED = DEFAULT_DRIVER in pyodbc.drivers()


def raised(operation) -> BaseException:
    try:
        operation()
    except BaseException as exc:  # noqa: BLE001 - capture whatever the library raises
        return exc
    pytest.fail("expected the operation to raise")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------ token packing


def test_token_attribute_number_and_scope():
    assert SQL_COPT_SS_ACCESS_TOKEN == 1256
    assert SQL_SCOPE == "https://database.windows.net/.default"


def test_pack_access_token_is_byte_exact():
    assert pack_access_token("ab") == b"\x04\x00\x00\x00a\x00b\x00"
    token = "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwczovL2RhdGFiYXNlLndpbmRvd3MubmV0LyJ9.c2ln"
    encoded = token.encode("utf-16-le")
    assert pack_access_token(token) == struct.pack("<I", len(encoded)) + encoded
    long_token = "x" * 2000  # real tokens are 1-3 kB: the length needs more than one byte
    assert pack_access_token(long_token)[:4] == b"\xa0\x0f\x00\x00"  # 4000 little-endian
    assert len(pack_access_token(long_token)) == 4 + 4000


def test_pack_access_token_rejects_empty_tokens():
    with pytest.raises(ValueError, match="access token"):
        pack_access_token("")


# ---------------------------------------------------------------------------- token provider


class ShortLivedCredential:
    """A TokenCredential (azure.core protocol: get_token(*scopes, **kwargs) -> AccessToken) issuing
    tokens that expire ``lifetime`` seconds after issue, as Entra ID does after ~1 h."""

    def __init__(self, lifetime: int = 2, latency: float = 0.0) -> None:
        self.lifetime = lifetime
        self.latency = latency
        self.scopes: list[tuple[str, ...]] = []
        self._lock = threading.Lock()

    def get_token(self, *scopes: str, **kwargs) -> AccessToken:
        with self._lock:
            self.scopes.append(scopes)
            serial = len(self.scopes)
        time.sleep(self.latency)  # a network round trip: lets concurrent callers pile up
        return AccessToken(f"token-{serial}", int(time.time()) + self.lifetime)

    @property
    def calls(self) -> int:
        return len(self.scopes)


def sleep_until(deadline: float) -> None:
    while time.time() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.time())))


def test_provider_reuses_the_token_until_the_margin_then_refreshes():
    credential = ShortLivedCredential(lifetime=2)
    provider = AccessTokenProvider(credential, refresh_margin=0.5)
    assert provider.get_token() == "token-1"
    assert provider.get_token() == "token-1"
    assert provider.packed_token() == pack_access_token("token-1")
    assert credential.calls == 1 and credential.scopes == [(SQL_SCOPE,)]
    # Still more than the margin left: reused.
    refresh_at = provider.expires_on - 0.5
    assert refresh_at > time.time()
    assert provider.get_token() == "token-1" and credential.calls == 1
    # Past expiry minus margin: a new token.
    sleep_until(refresh_at + 0.05)
    assert provider.get_token() == "token-2"
    assert credential.calls == 2 and provider.refreshes == 2
    assert provider.get_token() == "token-2" and credential.calls == 2


def test_concurrent_callers_trigger_one_refresh():
    credential = ShortLivedCredential(lifetime=2, latency=0.2)
    provider = AccessTokenProvider(credential, refresh_margin=0.5)

    def burst(n: int = 16) -> list[str]:
        barrier = threading.Barrier(n)
        results: list[str] = []
        lock = threading.Lock()

        def call():
            barrier.wait()
            token = provider.get_token()
            with lock:
                results.append(token)

        threads = [threading.Thread(target=call) for _ in range(n)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        return results

    assert burst() == ["token-1"] * 16
    assert credential.calls == 1
    sleep_until(provider.expires_on - 0.5 + 0.05)
    assert burst() == ["token-2"] * 16
    assert credential.calls == 2


def test_provider_defaults_to_default_azure_credential_for_a_client_id():
    from azure.identity import DefaultAzureCredential

    provider = AccessTokenProvider(client_id="00000000-0000-0000-0000-000000000001")
    assert isinstance(provider.credential, DefaultAzureCredential)
    assert provider.credential is provider.credential  # created once
    assert shared_token_provider(None) is shared_token_provider(None)
    assert shared_token_provider("client-a") is shared_token_provider("client-a")
    assert shared_token_provider("client-a") is not shared_token_provider("client-b")


def test_provider_passes_credential_failures_through(monkeypatch):
    from azure.identity import AzureCliCredential

    monkeypatch.setenv("PATH", "")  # no `az` on the path: azure-identity's real "not found" error
    provider = AccessTokenProvider(AzureCliCredential())
    error = raised(provider.get_token)
    assert type(error).__name__ == "CredentialUnavailableError"
    assert provider.refreshes == 0
    explanation = explain_connect_error(error, "myserver", "agentdb")
    assert explanation.startswith(f"no Microsoft Entra ID token for {SQL_SCOPE} (Azure CLI not found on path)")
    assert "AGENT_SQL_CLIENT_ID" in explanation and "az login" in explanation


# ------------------------------------------------------------------------- connection string


def test_build_connection_string_short_name():
    assert build_connection_string("myserver", "agentdb") == (
        "Driver={ODBC Driver 18 for SQL Server};Server=tcp:myserver.database.windows.net,1433;"
        "Database=agentdb;Encrypt=yes;TrustServerCertificate=no;Connection Timeout=30"
    )


@pytest.mark.parametrize("server", [
    "myserver.database.windows.net",
    "tcp:myserver.database.windows.net,1433",
    " TCP:myserver.database.windows.net ",
])
def test_build_connection_string_full_names(server):
    assert build_connection_string(server, "agentdb").startswith(
        "Driver={ODBC Driver 18 for SQL Server};Server=tcp:myserver.database.windows.net,1433;Database=agentdb;")


def test_build_connection_string_other_clouds_driver_timeout_and_odd_database_names():
    built = build_connection_string("srv.database.usgovcloudapi.net", "my db;x={y}", driver="ODBC Driver 17 for SQL Server", timeout=60)
    assert built == (
        "Driver={ODBC Driver 17 for SQL Server};Server=tcp:srv.database.usgovcloudapi.net,1433;"
        "Database={my db;x={y}}};Encrypt=yes;TrustServerCertificate=no;Connection Timeout=60"
    )


@pytest.mark.parametrize(("server", "database", "timeout", "setting"), [
    ("", "agentdb", 30, "AGENT_SQL_SERVER"),
    ("my server", "agentdb", 30, "AGENT_SQL_SERVER"),
    ("myserver;Uid=sa", "agentdb", 30, "AGENT_SQL_SERVER"),
    ("myserver,port", "agentdb", 30, "AGENT_SQL_SERVER"),
    ("myserver", "  ", 30, "AGENT_SQL_DATABASE"),
    ("myserver", "agentdb", 0, "connection timeout"),
])
def test_build_connection_string_rejects_bad_values_naming_the_setting(server, database, timeout, setting):
    with pytest.raises(ConfigError) as caught:
        build_connection_string(server, database, timeout=timeout)
    assert caught.value.setting == setting
    assert str(caught.value).startswith(f"{setting}=")
    assert "expected" in str(caught.value)


# ------------------------------------------------------------------------- ODBC environment


def test_check_odbc_environment_with_the_real_driver_list():
    installed = pyodbc.drivers()
    if DRIVER_18_INSTALLED:
        check_odbc_environment(DEFAULT_DRIVER)
    else:
        error = raised(lambda: check_odbc_environment(DEFAULT_DRIVER))
        assert isinstance(error, ConfigError)
        text = str(error)
        assert text.startswith("ODBC driver='ODBC Driver 18 for SQL Server': expected an installed ODBC driver (installed: ")
        assert all(repr(name) in text for name in installed)
        assert "ACCEPT_EULA=Y apt-get install -y msodbcsql18" in text
        assert "Azure Functions Python images already include it" in text
        assert "\n" not in text


def test_check_odbc_environment_accepts_an_installed_driver():
    if not pyodbc.drivers():
        pytest.fail("no ODBC driver installed at all: the PostgreSQL ODBC driver (odbc-postgresql) is expected")
    check_odbc_environment(pyodbc.drivers()[0])


def test_check_odbc_environment_when_unixodbc_cannot_be_loaded(tmp_path):
    # A copy of the real pyodbc extension whose dependency on libodbc.so.2 names a version that
    # does not exist, so the dynamic loader fails exactly as it does on a machine without unixODBC.
    original = Path(pyodbc.__file__)
    binary = original.read_bytes()
    assert binary.count(b"libodbc.so.2") == 1, "pyodbc's binary changed layout: update this test"
    (tmp_path / original.name).write_bytes(binary.replace(b"libodbc.so.2", b"libodbc.so.9"))
    script = (
        "from shared.control.azure_sql import check_odbc_environment\n"
        "try:\n    check_odbc_environment()\n"
        "except Exception as exc:\n    print(type(exc).__name__)\n    print(exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.strip().split("\n", 1)
    assert kind == "ConfigError"
    assert message.startswith("unixODBC (libodbc.so.2)=<missing>: expected the unixODBC driver manager")
    assert "libodbc.so.9: cannot open shared object file" in message
    assert message.endswith("install unixODBC: apt-get install unixodbc")


def test_importing_the_modules_stays_light():
    script = ("import sys, shared.control.azure_sql, shared.control.sqlerrors\n"
              "print(sorted(m for m in ('pyodbc', 'azure.identity', 'azure.core') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------------- connecting


def test_connect_without_driver_18_fails_clearly_before_asking_for_a_token():
    credential = ShortLivedCredential()
    provider = AccessTokenProvider(credential)
    sleeps: list[float] = []
    if DRIVER_18_INSTALLED:
        # With the driver present: a real login attempt against a closed local port, retried.
        clock = [0.0]

        def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            clock[0] += seconds

        error = raised(lambda: connect_azure_sql(f"127.0.0.1,{closed_port()}", "agentdb", token_provider=provider,
                                                 timeout=3, retry_seconds=2, sleep=sleep, monotonic=lambda: clock[0]))
        assert isinstance(error, pyodbc.OperationalError) and sleeps and sum(sleeps) <= 2
        assert "cannot reach server" in explain_connect_error(error, "127.0.0.1", "agentdb")
        return
    error = raised(lambda: connect_azure_sql("myserver", "agentdb", token_provider=provider, sleep=sleeps.append))
    assert isinstance(error, ConfigError)
    assert str(error).startswith("ODBC driver='ODBC Driver 18 for SQL Server': expected an installed ODBC driver")
    assert "msodbcsql18" in str(error)
    assert credential.calls == 0 and sleeps == []  # no token requested, nothing retried
    assert explain_connect_error(error, "myserver", "agentdb") == str(error)


def test_connect_rejects_bad_settings_before_connecting():
    credential = ShortLivedCredential()
    driver = pyodbc.drivers()[0]  # an installed driver, so the environment check passes
    error = raised(lambda: connect_azure_sql("bad server", "agentdb", token_provider=AccessTokenProvider(credential),
                                             driver=driver))
    assert isinstance(error, ConfigError) and error.setting == "AGENT_SQL_SERVER"
    assert credential.calls == 0


# ------------------------------------------------------------------------ explain_connect_error

TOKEN_PRINCIPAL_REJECTED = pyodbc.InterfaceError(
    "28000",
    "[28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]Login failed for user "
    "'<token-identified principal>'. (18456) (SQLDriverConnect)",
)  # verbatim from https://github.com/Azure/azure-sdk-for-python/issues/29336

TOKEN_NOT_ACCEPTED = pyodbc.InterfaceError(
    "28000",
    "[28000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Login failed for user "
    "'<token-identified principal>'. The server is not currently configured to accept this token. "
    "(18456) (SQLDriverConnect)",
)  # server text from https://github.com/Azure/azure-sdk-for-python/issues/45216 (its title), in pyodbc's layout

DATABASE_MISSING = pyodbc.InterfaceError(
    "28000",
    "[28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]用户 'sa' 登录失败。 (18456) "
    "(SQLDriverConnect); [28000] [Microsoft][ODBC Driver 17 for SQL Server][SQL Server]无法打开登录所请求的数据库 "
    "\"qq\"。登录失败。 (4060)",
)  # verbatim (first two of four records) from https://github.com/yehoshuadimarsky/bcpandas/issues/28

PAUSED = pyodbc.Error(
    "HY000",
    "[HY000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Database 'databasename' on server "
    "'servername.database.windows.net' is not currently available.  Please retry the connection later.  "
    "If the problem persists, contact customer support, and provide them the session tracing ID of "
    "'{3B6C6E7D-744D-49D5-B152-8418ADA28174}'. (40613) (SQLDriverConnect)",
)  # verbatim from the Azure GPT-RAG troubleshooting guide ("SQL Database is Unavailable or Autopaused")

FIREWALL = pyodbc.ProgrammingError(
    "42000",
    "[42000] [Microsoft][ODBC Driver 18 for SQL Server][SQL Server]Cannot open server 'databasename' "
    "requested by the login. Client with IP address '999.999.999.999' is not allowed to access the server.  "
    "To enable access, use the Azure Management Portal or run sp_set_firewall_rule on the master database "
    "to create a firewall rule for this IP address or address range.  It may take up to five minutes for "
    "this change to take effect. (40615) (SQLDriverConnect)",
)  # verbatim from the same guide ("Client IP Address Not Allowed by SQL Database Firewall")

LOGIN_TIMEOUT = pyodbc.OperationalError(
    "HYT00", "[HYT00] [Microsoft][ODBC Driver 17 for SQL Server]Login timeout expired (0) (SQLDriverConnect)",
)  # verbatim from https://github.com/jeancochrane/pytest-flask-sqlalchemy/issues/58


def test_explain_rejected_token_login():
    text = explain_connect_error(TOKEN_PRINCIPAL_REJECTED, "myserver", "agentdb")
    assert text.startswith("cannot log in to database 'agentdb' on server 'myserver': the login was rejected (error 18456)")
    assert "CREATE USER [<app or identity name>] FROM EXTERNAL PROVIDER" in text
    assert "AGENT_SQL_CLIENT_ID" in text and "Microsoft Entra admin" in text
    not_accepted = explain_connect_error(TOKEN_NOT_ACCEPTED, "myserver", "agentdb")
    assert "the server does not accept this token (wrong tenant or audience" in not_accepted


def test_explain_missing_database():
    text = explain_connect_error(DATABASE_MISSING, "myserver", "qq")
    assert text.startswith("cannot open database 'qq' on server 'myserver' (error 4060): check AGENT_SQL_DATABASE='qq'")


def test_explain_paused_or_failing_over_database():
    text = explain_connect_error(PAUSED, "servername", "databasename")
    assert text.startswith("database 'databasename' on server 'servername' is temporarily unavailable (error 40613")


def test_explain_firewall():
    text = explain_connect_error(FIREWALL, "myserver", "agentdb")
    assert text.startswith("server 'myserver' refused this client's IP address (error 40615): add a firewall rule")


def test_explain_unreachable_server_on_real_and_quoted_errors():
    real = raised(lambda: pyodbc.connect(
        f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={closed_port()};Database=postgres;Uid=root;", timeout=3))
    for error in (real, LOGIN_TIMEOUT):
        text = explain_connect_error(error, "myserver", "agentdb")
        assert text.startswith("cannot reach server 'myserver' on TCP port 1433 (")
        assert "AGENT_SQL_SERVER='myserver'" in text and "\n" not in text
    assert "Connection refused" in explain_connect_error(real, "myserver", "agentdb")
    assert "(Login timeout expired)" in explain_connect_error(LOGIN_TIMEOUT, "myserver", "agentdb")


def test_explain_missing_driver_from_the_real_driver_manager_error():
    error = raised(lambda: pyodbc.connect("Driver={ODBC Driver 99 for SQL Server};Server=tcp:x.database.windows.net,1433;"))
    assert "Can't open lib" in error.args[1]  # unixODBC's own text
    text = explain_connect_error(error, "x", "agentdb")
    assert text.startswith("cannot connect to database 'agentdb' on server 'x': the ODBC driver is not installed;")
    assert "msodbcsql18" in text


def test_explain_looks_inside_wrappers_and_passes_config_errors_through():
    try:
        raise AgentError("cannot connect to the control database") from TOKEN_PRINCIPAL_REJECTED
    except AgentError as wrapper:
        assert explain_connect_error(wrapper, "myserver", "agentdb").startswith("cannot log in to database 'agentdb'")
    config = ConfigError("AGENT_SQL_SERVER", "", "a server name")
    assert explain_connect_error(config, "", "agentdb") == str(config)
    assert explain_connect_error(AgentError("schema too new"), "s", "d") == "schema too new"


def test_explain_anything_else_keeps_the_driver_message(tmp_path):
    import sqlite3

    error = raised(lambda: sqlite3.connect(tmp_path / "no-such-folder" / "agent.db"))
    assert explain_connect_error(error, "s", "d") == "cannot connect to database 'd' on server 's': unable to open database file"
