"""ODBC connection strings built from parts: every value quoted by the ODBC rules (braces, doubled
closing braces), so a database or server name the agent finds at run time can never add a key
(;Database=other) or cut the string. The one builder every path uses: the control database,
a job's DATABASE, fleet targets, doctor, grant-sql, the monitor, Entra ID connections."""

from __future__ import annotations

import re
from typing import Iterable

from shared.errors import ConfigError
# The server parser lives with the other values every layer reads alike (fleet targets resolve with it).
from shared.values import DEFAULT_PORTS, SERVER_EXPECTED, server_address, split_server  # noqa: F401


def is_freetds(driver: str) -> bool:
    """Whether an ODBC driver name (or library path) is FreeTDS's (Debian's tdsodbc registers
    ``FreeTDS``, the library is libtdsodbc.so)."""
    lowered = driver.lower()
    return "freetds" in lowered or "tdsodbc" in lowered


# key = value; the value either in braces (``;`` and ``}}`` inside) or bare up to the next ``;``,
# spaces included (psqlODBC keeps a bare value's spaces; a database name may have them).
_SEGMENT = re.compile(r"\s*([^=;]+?)\s*=(\s*\{(?:[^}]|\}\})*\}\s*(?=;|$)|[^;]*)(?:;|$)")


def _segments(connection_string: str) -> list[tuple[str, str]]:
    """``key=value`` segments of an ODBC connection string as (key, value exactly as written):
    a value in braces may hold ``;`` and ``}}`` (ODBC's quoting rules)."""
    return [(m.group(1).strip(), m.group(2)) for m in _SEGMENT.finditer(connection_string)
            if m.group(1).strip()]


def odbc_pairs(connection_string: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for key, val in _segments(connection_string):
        val = val.strip()
        if val.startswith("{") and val.endswith("}"):
            val = val[1:-1].replace("}}", "}")
        pairs[key.lower()] = val
    return pairs


# Keys naming the same thing, so a value set from parts replaces every spelling in the base.
_ALIASES = {
    "database": ("database", "initial catalog"),
    "server": ("server", "servername", "addr", "address", "data source"),
    "servername": ("server", "servername", "addr", "address", "data source"),
}


def repeated_server_keys(connection_string: str) -> list[str]:
    """The keys by which ``connection_string`` names its server (or port) more than once, as
    written (empty: once or not at all)."""
    keys = [key for key, _ in _segments(connection_string)]
    servers = [key for key in keys if key.lower() in _ALIASES["server"]]
    ports = [key for key in keys if key.lower() == "port"]
    return (servers if len(servers) > 1 else []) + (ports if len(ports) > 1 else [])


PSQLODBC_EXPECTED = (
    "a name the PostgreSQL ODBC driver can carry in a connection string: no ';' and no NUL, not "
    "starting with '{' (after any spaces; psqlODBC keeps the braces of a quoted value, so such a value cannot be quoted); "
    "nothing is opened for it, never another database or server")


# Characters that end a value or start a key, for unixODBC's 8-bit copy of a connection string
# (it picks the driver and the DSN from it): a character above U+00FF whose low byte is one of
# these reads as that byte there (U+013B 'Ļ' as ';', U+013D 'Ľ' as '=', U+017B 'Ż' as '{', U+0100
# as NUL), so a database name a listing returned could name a driver library, or keys.
_ODBC_SYNTAX = frozenset(";={}\x00")


def odbc_value(value: str, *, dialect: str, key: str) -> str:
    """``value`` as it must be written after ``key=`` in a connection string for ``dialect``'s
    driver, or ConfigError when that driver cannot carry it exactly.

    SQL Server's drivers follow the ODBC rule: a value in braces, ``}`` doubled, is taken
    literally (``;``, ``=``, spaces and all). psqlODBC does not (13.02, tested by
    tests/integration/test_connection_strings.py): it honours the braces when splitting the string but keeps
    them in every value but the password, so ``Database={a;b}`` asks the server for a database
    named ``{a;b}``. Its bare values are carried exactly up to the first ``;`` (quotes, spaces,
    ``=``, ``}`` and any Unicode character included), except one starting with ``{`` (spaces
    before it included: the driver would read on to a closing brace, over the keys after it). So on
    PostgreSQL a value is written bare, and a value with ``;`` or a leading ``{`` is refused
    instead of reaching another database or server."""
    if not isinstance(value, str) or "\x00" in value:
        raise ConfigError(key, value, "a value without NUL characters (no connection string can carry one)")
    disguised = next((ch for ch in value if ord(ch) > 0xFF and chr(ord(ch) & 0xFF) in _ODBC_SYNTAX), None)
    if disguised is not None:
        raise ConfigError(key, value, f"a value without {disguised!r} (U+{ord(disguised):04X}): unixODBC reads the "
                                      "connection string through a copy keeping each character's low byte, where it "
                                      f"is {chr(ord(disguised) & 0xFF)!r}: it would end the value or start a key")
    if dialect == "postgres":
        if ";" in value or value.lstrip().startswith("{"):
            raise ConfigError(key, value, PSQLODBC_EXPECTED)
        return value
    if value != value.strip() or not value or any(ch in value for ch in ";{}=") :
        return "{" + value.replace("}", "}}") + "}"
    return value


def build_connection_string(base: str | None, dialect: str, parts: Iterable[tuple[str, str]] = (), *,
                            drop: Iterable[str] = ()) -> str:
    """THE way the agent makes an ODBC connection string: ``base`` (a connection string from the
    settings, kept as written: driver, credentials, options) with ``parts`` (key, raw value) set
    over it: every spelling of each part's key dropped from ``base``, then each part's value
    quoted by :func:`odbc_value` for ``dialect`` (``driver`` values always in braces); keys in
    ``drop`` are left out too. A value
    that cannot be carried exactly raises ConfigError before anything is opened."""
    parts = list(parts)
    if dialect == "mssql" and is_freetds(odbc_pairs(base or "").get("driver", "")):
        # FreeTDS ends a braced value at its first '}' (doubling or not: traced with TDSDUMP,
        # FreeTDS 1.3) and reads the rest as keys: a database named 'x};Server=elsewhere;' would
        # move the connection. Such a value is refused instead (that execution fails alone).
        for key, val in parts:
            if key.lower() != "driver" and "}" in (val or ""):
                raise ConfigError(key, val, "a value without '}' (FreeTDS cannot carry one in a connection string)")
    dropped = {key.lower() for key in drop}
    for key, _ in parts:
        dropped.update(_ALIASES.get(key.lower(), (key.lower(),)))
    segments = [f"{key}={val}" for key, val in _segments(base or "") if key.lower() not in dropped]
    for key, val in parts:
        if key.lower() == "driver":
            if not val or "}" in val:
                raise ConfigError("ODBC driver", val, "an installed ODBC driver name such as 'ODBC Driver 18 for SQL Server'")
            segments.append(f"{key}={{{val}}}")
        else:
            segments.append(f"{key}={odbc_value(val, dialect=dialect, key=key)}")
    return ";".join(segments) + ";"


def with_database(connection_string: str, database: str, dialect: str = "mssql") -> str:
    """The same ODBC connection string pointing at another database on the same server."""
    return build_connection_string(connection_string, dialect, [("Database", database)])


def with_server(connection_string: str, server: str, dialect: str) -> str:
    """The same ODBC connection string (driver, credentials, options) pointing at another
    server, written as ``split_server`` reads it: exactly the host and port the allow-list
    checked (PostgreSQL: Servername and Port; SQL Server: Server=host,port, any Port= dropped)."""
    host, port = split_server(server, dialect)
    if dialect == "postgres":
        return build_connection_string(connection_string, dialect, [("Servername", host), ("Port", str(port))],
                                       drop=("port",))
    return build_connection_string(connection_string, dialect, [("Server", f"{host},{port}")], drop=("port",))


def redact(connection_string: str) -> str:
    return re.sub(r"(?i)((?:pwd|password)\s*=\s*)(\{(?:[^}]|\}\})*\}|[^;]*)", r"\1***", connection_string)


# psqlODBC's defaults cost 4-5 round trips per statement (a server-side prepare on every new
# cursor, then a DEALLOCATE inside a savepoint; a savepoint around every statement; BEGIN as a
# message of its own). With these, a statement is one simple-protocol message, BEGIN rides on
# the first one, and a batch of statements is one round trip. The Store already rolls back the
# whole transaction on any error, so statement-level rollback buys nothing. A connection
# string that sets either option keeps its own value.
POSTGRES_DEFAULTS = (("UseServerSidePrepare", "0"), ("Protocol", "7.4-1"))


# FreeTDS speaks the protocol version it is told (freetds.conf, else its build default, often
# 7.3 or "auto"): 7.4 is what SQL Server 2012 and later, Azure SQL and Babelfish speak, and 7.3 or
# later is needed for DATETIME2 to travel as a date and time (older versions send it as text).
FREETDS_DEFAULTS = (("TDS_Version", "7.4"),)


def with_freetds_defaults(connection_string: str) -> str:
    return _with_defaults(connection_string, FREETDS_DEFAULTS, "mssql")


# Every PostgreSQL session of the agent's (the control database, a job's database, fleet targets)
# starts with search_path and role pinned in the connection's startup packet (libpq's options,
# psqlODBC's pqopt): settings given by the client there outrank every database and role setting
# (ALTER DATABASE/ROLE ... SET, which the owner of a job's database may make), and RESET ALL
# returns to them. So no name the agent writes unqualified (a function, an operator, a type, a
# table) resolves anywhere but in pg_catalog (functions and operators are never looked up in
# pg_temp), whatever an operator creates in public or in a schema of its own, and the agent's
# statements run as its login. The job's own SQL gets the search_path the database's and role's
# settings give (store.JOB_SEARCH_PATH), in its transaction only. docs/tsql.md, "The owner
# boundary".
PINNED_SEARCH_PATH = "pg_catalog,pg_temp"
PINNED_SESSION_OPTIONS = f"-c search_path={PINNED_SEARCH_PATH} -c role=none"


def with_postgres_defaults(connection_string: str) -> str:
    connection_string = _with_defaults(connection_string, POSTGRES_DEFAULTS, "postgres")
    present = odbc_pairs(connection_string).get("pqopt")
    if present is not None and PINNED_SESSION_OPTIONS not in present:
        if re.search(r"(?i)\boptions\s*=", present):
            raise ConfigError("pqopt", present, "libpq options without 'options=': the agent sets the server "
                              f"options of its sessions itself ({PINNED_SESSION_OPTIONS}); keep other keys "
                              "(keepalives=1, sslmode=...)")
        segments = [f"{key}={val}" for key, val in _segments(connection_string) if key.lower() != "pqopt"]
        return ";".join(segments + [f"pqopt={{{present} options='{PINNED_SESSION_OPTIONS}'}}"]) + ";"
    if present is not None:
        return connection_string
    return connection_string.rstrip(";") + f";pqopt={{options='{PINNED_SESSION_OPTIONS}'}};"


def _with_defaults(connection_string: str, defaults: tuple[tuple[str, str], ...], dialect: str) -> str:
    present = odbc_pairs(connection_string)
    extra = [(key, value) for key, value in defaults if key.lower() not in present]
    if not extra:
        return connection_string
    return build_connection_string(connection_string, dialect, extra)
