"""Connecting to Azure SQL Database with pyodbc, Microsoft ODBC Driver 18 and an Entra ID token.

No password anywhere: the function app's managed identity (or, locally, the developer's
``az login``) gets an access token for ``https://database.windows.net/.default`` from
azure-identity, and the token goes to the driver before connecting as connection attribute
1256 (SQL_COPT_SS_ACCESS_TOKEN). A token is checked at login only: a connection opened with it
stays usable after the token expires, new connections need a fresh one, so the provider caches
the token and refreshes it a few minutes before it expires.

pyodbc and azure-identity are imported lazily (``import function_app`` stays light).
"""

from __future__ import annotations

import re
import struct
import threading
import time
from typing import Any, Callable, Protocol

from shared.control.connection_strings import build_connection_string as build  # the one builder
from shared.control.pool import is_refusal
from shared.control.sqlerrors import SqlErrorInfo, classify, diagnostic_records, retry_connect
from shared.errors import ConfigError

__all__ = [
    "SQL_COPT_SS_ACCESS_TOKEN",
    "SQL_SCOPE",
    "DEFAULT_DRIVER",
    "AZURE_SQL_SUFFIX",
    "pack_access_token",
    "AccessTokenProvider",
    "shared_token_provider",
    "build_connection_string",
    "connect_azure_sql",
    "check_odbc_environment",
    "explain_connect_error",
]

SQL_COPT_SS_ACCESS_TOKEN = 1256  # msodbcsql.h: pass an Entra ID access token before connecting
SQL_SCOPE = "https://database.windows.net/.default"
DEFAULT_DRIVER = "ODBC Driver 18 for SQL Server"
AZURE_SQL_SUFFIX = ".database.windows.net"
DEFAULT_PORT = 1433
DRIVER_INSTALL_HINT = (
    "install Microsoft ODBC Driver 18 for SQL Server: on Debian/Ubuntu add Microsoft's package "
    "repository (https://packages.microsoft.com/config/<distro>/<version>/packages-microsoft-prod.deb, "
    "`dpkg -i` it, `apt-get update`) then `ACCEPT_EULA=Y apt-get install -y msodbcsql18`; see "
    "https://learn.microsoft.com/sql/connect/odbc/linux-mac/installing-the-microsoft-odbc-driver-for-sql-server "
    "(the Azure Functions Python images already include it)"
)


class TokenCredentialLike(Protocol):
    """What azure.core.credentials.TokenCredential offers and we use."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:  # returns azure.core.credentials.AccessToken
        ...


def pack_access_token(token: str) -> bytes:
    """The token in the layout the Microsoft driver reads for attribute 1256: its UTF-16-LE bytes
    prefixed by their length as a 4-byte little-endian unsigned int."""
    if not isinstance(token, str) or not token:
        raise ValueError(f"access token={token!r}: expected a non-empty string")
    encoded = token.encode("utf-16-le")
    return struct.pack("<I", len(encoded)) + encoded


class AccessTokenProvider:
    """Caches an Entra ID access token for Azure SQL and refreshes it before it expires.

    ``credential``: any azure.core TokenCredential; by default ``DefaultAzureCredential`` (managed
    identity in Azure, environment / workload identity / Azure CLI / azd locally), created at the
    first token request. ``client_id`` selects a user-assigned managed identity
    (AGENT_SQL_CLIENT_ID) and is ignored when a credential is given.

    A token is reused until fewer than ``refresh_margin`` seconds remain. Thread-safe: concurrent
    callers needing a refresh wait for a single request to Entra ID.
    """

    def __init__(
        self,
        credential: TokenCredentialLike | None = None,
        *,
        client_id: str | None = None,
        scope: str = SQL_SCOPE,
        refresh_margin: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if refresh_margin < 0:
            raise ValueError(f"refresh_margin={refresh_margin!r}: expected seconds >= 0")
        self._credential = credential
        self._client_id = client_id or None
        self.scope = scope
        self.refresh_margin = float(refresh_margin)
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_on = 0.0
        self.refreshes = 0  # tokens fetched so far (for diagnostics and tests)

    @property
    def credential(self) -> TokenCredentialLike:
        with self._lock:
            return self._credential_locked()

    def _credential_locked(self) -> TokenCredentialLike:
        if self._credential is None:
            # azure-identity loads on first use (cold start): only Entra ID needs it
            from azure.identity import DefaultAzureCredential

            if self._client_id:
                self._credential = DefaultAzureCredential(managed_identity_client_id=self._client_id)
            else:
                # Without a client id DefaultAzureCredential still honours AZURE_CLIENT_ID.
                self._credential = DefaultAzureCredential()
        return self._credential

    @property
    def expires_on(self) -> float:
        """Expiry (epoch seconds) of the cached token; 0 before the first one."""
        return self._expires_on

    def get_token(self) -> str:
        """A token valid for at least ``refresh_margin`` more seconds (when Entra ID issues them
        that long)."""
        with self._lock:
            if self._token is None or self._expires_on - self._clock() < self.refresh_margin:
                access = self._credential_locked().get_token(self.scope)
                self._token = access.token
                self._expires_on = float(access.expires_on)
                self.refreshes += 1
            return self._token

    def packed_token(self) -> bytes:
        return pack_access_token(self.get_token())


_shared_providers: dict[str | None, AccessTokenProvider] = {}
_shared_lock = threading.Lock()


def shared_token_provider(client_id: str | None = None) -> AccessTokenProvider:
    """One provider per identity for the whole process, so every connection (control database,
    job target databases, heartbeat connections) shares one cached token."""
    key = client_id or None
    with _shared_lock:
        provider = _shared_providers.get(key)
        if provider is None:
            provider = _shared_providers[key] = AccessTokenProvider(client_id=key)
        return provider


_HOST_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\Z")


def _split_server(server: str) -> tuple[str, int]:
    """``name``, ``name.database.windows.net``, ``tcp:name.database.windows.net,1433`` → (host, port)."""
    expected = ("a server name such as 'myserver' or 'myserver.database.windows.net' "
                "(optionally 'tcp:' before it and ',1433' after it)")
    text = (server or "").strip()
    if text.lower().startswith("tcp:"):
        text = text[4:]
    host, _, port_text = text.partition(",")
    host = host.strip()
    if not host or not _HOST_RE.match(host):
        raise ConfigError("AGENT_SQL_SERVER", server, expected)
    port = DEFAULT_PORT
    if port_text.strip():
        if not port_text.strip().isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError("AGENT_SQL_SERVER", server, expected + "; the port must be a number from 1 to 65535")
        port = int(port_text)
    if "." not in host:
        host += AZURE_SQL_SUFFIX
    return host, port


def build_connection_string(
    server: str, database: str, *, driver: str = DEFAULT_DRIVER, timeout: int = 30
) -> str:
    """The ODBC connection string for Azure SQL Database with token authentication (no user,
    no password: the token goes in separately as attribute 1256)."""
    host, port = _split_server(server)
    if not isinstance(database, str) or not database.strip():
        raise ConfigError("AGENT_SQL_DATABASE", database, "the database name on the Azure SQL server")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 1:
        raise ConfigError("connection timeout", timeout, "a whole number of seconds >= 1")
    return build(None, "mssql", [
        ("Driver", driver), ("Server", f"tcp:{host},{port}"), ("Database", database),
        ("Encrypt", "yes"), ("TrustServerCertificate", "no"), ("Connection Timeout", str(timeout)),
    ]).rstrip(";")


def check_odbc_environment(driver_name: str = DEFAULT_DRIVER) -> None:
    """Raise ConfigError (one line, how to fix it) unless pyodbc, unixODBC and ``driver_name``
    are all usable."""
    try:
        # pyodbc loads on first use: not at import (cold start), and not at all on SQLite
        import pyodbc
    except ImportError as exc:
        text = str(exc)
        if "libodbc" in text or "cannot open shared object file" in text:
            raise ConfigError(
                "unixODBC (libodbc.so.2)", None,
                f"the unixODBC driver manager, which pyodbc could not load ({text}): "
                "install unixODBC: apt-get install unixodbc",
            ) from exc
        raise ConfigError("pyodbc", None, f"pyodbc installed ({text}): pip install -r requirements.txt") from exc
    installed = list(pyodbc.drivers())
    if driver_name not in installed:
        listed = ", ".join(repr(name) for name in installed) or "none"
        raise ConfigError(
            "ODBC driver", driver_name,
            f"an installed ODBC driver (installed: {listed}); {DRIVER_INSTALL_HINT}",
        )


def connect_azure_sql(
    server: str,
    database: str,
    *,
    token_provider: AccessTokenProvider,
    autocommit: bool = False,
    timeout: int = 30,
    driver: str = DEFAULT_DRIVER,
    retry_seconds: float = 90.0,
    control_database: bool = True,
    retry_refusals: bool = True,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> Any:
    """A pyodbc connection to ``database`` on ``server``, authenticated with an Entra ID token.

    Transient failures (a serverless database resuming answers 40613 or a login timeout, a
    failover 40197, throttling 40501, dropped sockets) are retried for up to ``retry_seconds``
    (AGENT_CONNECT_RETRY_SECONDS), each wait at least as long as the error asks for (10 s after
    40613, 40501, 10928, 10929); each attempt asks the provider for the token, so a retry after
    expiry gets a fresh one. "Cannot open database" (4060) is retried for the control database
    only (``control_database``): for a job's DATABASE it is most often a wrong name. Environment
    problems (no unixODBC, no driver) raise ConfigError before any token is requested. Other
    errors are the driver's own exception; :func:`explain_connect_error` turns them into a
    one-line fix.
    """

    check_odbc_environment(driver)
    connection_string = build_connection_string(server, database, driver=driver, timeout=timeout)
    # pyodbc loads on first use: not at import (cold start), and not at all on SQLite
    import pyodbc

    host, _port = _split_server(server)

    def attempt() -> Any:
        return pyodbc.connect(
            connection_string,
            attrs_before={SQL_COPT_SS_ACCESS_TOKEN: token_provider.packed_token()},
            autocommit=autocommit,
            timeout=timeout,  # login timeout
        )

    def judge(exc: BaseException) -> SqlErrorInfo:
        info = classify(exc)
        if info.number == 4060 and not control_database:
            return SqlErrorInfo("permanent", info.number, info.sqlstate, info.message, info.connection_lost)
        if not retry_refusals and is_refusal(exc):
            # The process's connection pool paces refusals itself (shared.control.pool).
            return SqlErrorInfo("permanent", info.number, info.sqlstate, info.message, info.connection_lost)
        return info

    return retry_connect(
        attempt, what=f"connecting to Azure SQL database {database!r} on {host}",
        budget_seconds=retry_seconds, classify_error=judge, sleep=sleep, monotonic=monotonic,
    )


# Native errors and texts explain_connect_error recognises.
_UNREACHABLE_NUMBERS = frozenset({10060, 10061, 10065, 11001, 11004, 53, 2, 258, 10053, 10054, 64, 233, 20})
_UNAVAILABLE_NUMBERS = frozenset({40613, 40197, 40501, 40540, 40143, 49918, 49919, 49920, 10928, 10929, 4221})


def explain_connect_error(exc: BaseException, server: str, database: str) -> str:
    """One line saying what to fix after connecting to ``database`` on ``server`` failed."""
    if _is_named(exc, "ConfigError") or (_is_named(exc, "AgentError") and _wrapped(exc) is None):
        return str(exc)
    if _is_named(exc, "ClientAuthenticationError", "CredentialUnavailableError"):
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            f"no Microsoft Entra ID token for {SQL_SCOPE} ({first_line}): in Azure give the function app a "
            "managed identity (for a user-assigned one set AGENT_SQL_CLIENT_ID to its client id); "
            "locally run `az login`"
        )
    info = classify(exc)
    records = diagnostic_records(exc)
    numbers = {r.native for r in records if r.trusted and r.native}
    states = {r.sqlstate for r in records if r.sqlstate}
    text = " ".join(r.text for r in records) or info.message
    where = f"database {database!r} on server {server!r}"

    if "Can't open lib" in text or "Data source name not found" in text or "IM002" in states:
        return f"cannot connect to {where}: the ODBC driver is not installed; {DRIVER_INSTALL_HINT}"
    if 40615 in numbers or "is not allowed to access the server" in text:
        return (
            f"server {server!r} refused this client's IP address (error 40615): add a firewall rule for it, "
            "or allow Azure services / use a private endpoint for the function app"
        )
    if 47073 in numbers or "Deny Public Network Access" in text:
        return (
            f"server {server!r} has public network access disabled (error 47073): connect through its "
            "private endpoint (VNet integration for the function app) or enable public access with firewall rules"
        )
    if 4060 in numbers:
        return (
            f"cannot open {where} (error 4060): check AGENT_SQL_DATABASE={database!r} names an existing "
            "database, and that the app's identity has a user in it "
            f"(in {database!r}: CREATE USER [<app or identity name>] FROM EXTERNAL PROVIDER; then grant roles)"
        )
    if 18456 in numbers or "Login failed" in text or "28000" in states:
        not_accepted = "not currently configured to accept this token" in text
        reason = ("the server does not accept this token (wrong tenant or audience: the scope must be "
                  f"{SQL_SCOPE} and the server's Entra admin must be in the token's tenant)"
                  if not_accepted else "the login was rejected (error 18456)")
        return (
            f"cannot log in to {where}: {reason}; make sure the server has a Microsoft Entra admin, "
            f"that the app's identity has a user in {database!r} "
            "(CREATE USER [<app or identity name>] FROM EXTERNAL PROVIDER; then grant roles), and that "
            "AGENT_SQL_CLIENT_ID names that identity (empty for the system-assigned one)"
        )
    unavailable = sorted(numbers & _UNAVAILABLE_NUMBERS)
    if unavailable:
        return (
            f"{where} is temporarily unavailable (error {unavailable[0]}: a paused serverless database "
            "resuming, a failover or throttling): it usually clears within a minute; the agent retries "
            "connections on its own, so only a persistent error needs attention"
        )
    if (numbers & _UNREACHABLE_NUMBERS or any(s.startswith("08") for s in states)
            or states & {"HYT00", "HYT01"} or _is_named(exc, "ConnectionError", "TimeoutError", "gaierror")):
        return (
            f"cannot reach server {server!r} on TCP port {DEFAULT_PORT} ({info.message}): check "
            f"AGENT_SQL_SERVER={server!r} is the server's name, that outbound TCP {DEFAULT_PORT} is allowed, "
            "and that the server's firewall / network settings let this app in (a paused serverless "
            "database can also time out the login while it resumes: try again in a minute)"
        )
    return f"cannot connect to {where}: {info.message}"


def _is_named(exc: BaseException, *names: str) -> bool:
    return any(cls.__name__ in names for cls in type(exc).__mro__)


def _wrapped(exc: BaseException) -> BaseException | None:
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):
        return inner
    return exc.__cause__

