"""Values every layer parses the same way: integers and booleans in range, names the agent accepts,
servers as the addresses they are, text made printable for an error message. Imports only
shared.errors and the standard library."""

from __future__ import annotations

import re

from shared.errors import ConfigError

# The widest whole numbers the control database stores, on every dialect: ids (runs, poison
# messages) are BIGINT, counts, orders and seconds INT (SQLite's INTEGER holds both).
BIGINT_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


# A "runnable for longer than" age beyond a century would push the cut-off before year 1 (an
# overflow, not a question): stuck --older-than and the monitor's older_than stop there.
MAX_STUCK_AGE_SECONDS = 100 * 366 * 86400


JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}\Z")


DATABASE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_\-]{1,128}\Z")


# A whole number as a person writes one: ASCII digits, an optional sign. Python's int() also takes
# "1_000", full-width and other scripts' digits ("５", "٣"), which no database or person reads as
# the same number.
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,30}")


def parse_int(setting: str, raw: str | None, low: int, high: int) -> int:
    text = str(raw).strip()
    if isinstance(raw, bool) or not _WHOLE_NUMBER.fullmatch(text):
        raise ConfigError(setting, raw, f"a whole number from {low} to {high}")
    value = int(text)
    if not low <= value <= high:
        raise ConfigError(setting, raw, f"a whole number from {low} to {high}")
    return value


def parse_bool(setting: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ConfigError(setting, raw, "true or false")


PRINCIPAL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}\Z")


def printable(text: str, limit: int = 80) -> str:
    """A value as it can be shown in a message: NULs and unencodable characters escaped, cut."""
    shown = text.encode("utf-8", errors="backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def storable_problem(value: str) -> str | None:
    """Why the database would refuse this text, or None: a NUL character (PostgreSQL refuses
    it, SQLite cuts the value there) or a character that is not valid UTF-8 text (a byte that
    is not UTF-8 in an environment variable arrives as a lone surrogate)."""
    if "\x00" in value:
        return f"a NUL character at position {value.index(chr(0))}"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a byte that is not UTF-8 text at position {exc.start}"
    return None


# A server as a fleet target or AGENT_FLEET_SERVERS names it: the host (a DNS name or an IPv4
# address: letters, digits, '.', '-', '_') and its port. PostgreSQL writes ``host[:port]``; SQL
# Server ``host[,port]``, ``tcp:`` before it allowed. Nothing else: a ',' in a PostgreSQL host
# would be a libpq host list, a ':' in a SQL Server one a driver-specific form.
_HOST = re.compile(r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*\.?")
DEFAULT_PORTS = {"postgres": 5432, "mssql": 1433}
SERVER_EXPECTED = {"postgres": "host or host:port (PostgreSQL), e.g. 10.0.0.5:5432 or pg.example.com",
                   "mssql": "host, host,port or tcp:host,port (SQL Server), e.g. myserver.database.windows.net "
                            "or tcp:sql01,1433"}


def split_server(server: str, dialect: str, *, setting: str = "server") -> tuple[str, int]:
    """(host, port) of a server as a target names it: THE parser both the allow-list check
    (``server_address``) and the connection (``with_server``) use, so what is checked is what is
    reached. The host lowercased without a trailing dot; the dialect's default port when none is
    written. ConfigError for any other spelling."""
    expected = SERVER_EXPECTED.get(dialect, SERVER_EXPECTED["mssql"])
    text = server.strip()
    if dialect == "postgres":
        host, sep, port_text = text.partition(":")
    else:
        if text[:4].lower() == "tcp:":
            text = text[4:]
        host, sep, port_text = text.partition(",")
    host, port_text = host.strip(), port_text.strip()
    if not _HOST.fullmatch(host) or (sep and not port_text.isdigit()) or len(host) > 253:
        raise ConfigError(setting, server, expected)
    port = int(port_text) if sep else DEFAULT_PORTS.get(dialect, 1433)
    if not 0 < port < 65536:
        raise ConfigError(setting, server, f"{expected}; a port from 1 to 65535")
    return host.rstrip(".").lower(), port


def server_address(server: str, dialect: str) -> str:
    """One spelling of a server's address, ``host:port`` (see ``split_server``)."""
    host, port = split_server(server, dialect)
    return f"{host}:{port}"
