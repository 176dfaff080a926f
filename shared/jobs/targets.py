"""Fleet targets (Elastic Jobs' target groups): which databases a step runs in.

``JOB__<name>__TARGETS`` (or ``JOB__<name>__STEPS__<n>__TARGETS``) is a comma list of members:

* ``db:<name>``: a database on the agent's own server; ``db:<server>/<name>``: on another one;
* ``server:<server>``: every user database of that server, listed at run time (SQL Server /
  Azure SQL: ``sys.databases`` in its ``master``, ``master`` itself excluded; PostgreSQL:
  ``pg_database``, templates excluded);
* ``pool:<server>/<elastic pool>``: the members of an Azure SQL elastic pool
  (``sys.database_service_objectives``), listed at run time;
* a glob (``*``, ``?``, ``[...]``) in a ``db:`` name (``db:tenant_*``) matches the databases the
  server has at run time; a ``db:`` name without one is always tried (a database that does not
  exist fails its execution, with the error);
* a leading ``-`` excludes what the member matches (``-db:tenant_test``, ``-server:x``).

The list is resolved again at every run, so a new tenant database is included without editing
the job. Parsing happens at sync (one line naming the bad member); resolution at run time, with
one query per server or pool to list (never one per database).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Callable, Iterable

from shared.errors import ConfigError
from shared.values import server_address

MEMBER_KINDS = ("db", "server", "pool")
MAX_MEMBERS = 200
DEFAULT_PARALLELISM = 8
MAX_PARALLELISM = 1000
# TARGET_STAGGER_SECONDS: at most an hour between two executions' starts.
MAX_STAGGER_SECONDS = 3600
# A database name (or pattern) and a server name as a member may spell them.
_DB_PATTERN = re.compile(r"^[A-Za-z0-9_\-*?\[\]!]{1,128}\Z")
_SERVER_PATTERN = re.compile(r"^[A-Za-z0-9_.\-:,]{1,253}\Z")
_POOL_PATTERN = re.compile(r"^[A-Za-z0-9_.\- ]{1,128}\Z")
# Members are separated by commas, but a SQL Server address has one too (host,port or
# tcp:host,port): a comma followed by a port number (then '/', another comma or the end) belongs
# to the server, since no member starts with a digit.
_MEMBER_SEPARATOR = re.compile(r",(?!\s*\d+\s*(?:/|,|$))")
EXPECTED = ("a comma list of db:<name>, db:<server>/<name>, server:<server> or pool:<server>/<pool> "
            "(globs * ? [..] in db names; a leading - excludes)")
# Databases a server: member never includes (the system databases of SQL Server).
SQL_SERVER_SYSTEM_DATABASES = frozenset({"master", "tempdb", "model", "msdb"})


@dataclass(frozen=True)
class TargetMember:
    kind: str                # db | server | pool
    server: str | None       # None: the agent's own server
    name: str | None         # the database (or pattern) for db:, the pool for pool:, None for server:
    exclude: bool = False

    @property
    def is_pattern(self) -> bool:
        return self.kind == "db" and any(ch in (self.name or "") for ch in "*?[")

    def text(self) -> str:
        sign = "-" if self.exclude else ""
        if self.kind == "server":
            return f"{sign}server:{self.server}"
        where = f"{self.server}/" if self.server else ""
        return f"{sign}{self.kind}:{where}{self.name}"


@dataclass(frozen=True, order=True)
class Target:
    """One database a fleet step runs in; ``server`` None is the agent's own server."""

    server: str | None
    database: str

    def text(self) -> str:
        return f"{self.server}/{self.database}" if self.server else self.database


def parse_targets(setting: str, raw: str) -> tuple[TargetMember, ...]:
    """The members of a TARGETS setting; ConfigError naming the first bad member."""
    items = [re.sub(r"\s*,\s*", ",", item.strip()) for item in _MEMBER_SEPARATOR.split(raw)]
    if not any(items):
        raise ConfigError(setting, raw, EXPECTED)
    members: list[TargetMember] = []
    for item in items:
        if not item:
            raise ConfigError(setting, raw, f"{EXPECTED}; found an empty member (two commas in a row?)")
        members.append(_parse_member(setting, item))
    if len(members) > MAX_MEMBERS:
        raise ConfigError(setting, raw[:80] + "...", f"at most {MAX_MEMBERS} members (found {len(members)})")
    if not any(not m.exclude for m in members):
        raise ConfigError(setting, raw, "at least one member that is not an exclusion (a leading - excludes)")
    return tuple(members)


def _parse_member(setting: str, item: str) -> TargetMember:
    exclude = item.startswith("-")
    body = item[1:].strip() if exclude else item
    kind, sep, rest = body.partition(":")
    kind = kind.strip().lower()

    def bad(expected: str) -> ConfigError:
        return ConfigError(setting, item, expected)

    if not sep or kind not in MEMBER_KINDS:
        return _raise(bad(f"a member db:<name>, db:<server>/<name>, server:<server> or pool:<server>/<pool> "
                          f"(member {item!r} has no known kind)"))
    rest = rest.strip()
    if kind == "server":
        if not _SERVER_PATTERN.match(rest):
            _raise(bad("server:<server>, a server name such as myserver.database.windows.net or 127.0.0.1:5432"))
        return TargetMember("server", rest, None, exclude)
    server, slash, name = rest.rpartition("/")
    server = server.strip() if slash else None
    name = name.strip()
    if slash and not _SERVER_PATTERN.match(server or ""):
        _raise(bad(f"{kind}:<server>/<name> with a server name such as myserver.database.windows.net "
                   "or 127.0.0.1:5432"))
    if kind == "pool":
        if server is None:
            _raise(bad("pool:<server>/<elastic pool> (the pool's server is required)"))
        if not _POOL_PATTERN.match(name):
            _raise(bad("pool:<server>/<elastic pool>, a pool name of letters, digits, '_', '.', '-' or spaces"))
        return TargetMember("pool", server, name, exclude)
    if not _DB_PATTERN.match(name):
        _raise(bad("db:<name> or db:<server>/<name>, a database name of letters, digits, '_' or '-' "
                   "(or a glob with * ? [..])"))
    if "[" in name and not re.fullmatch(r"(?:[^\[\]]|\[!?\]?[^\]]*\])*", name):
        _raise(bad("a glob whose [..] brackets are closed (a set such as [0-9])"))
    return TargetMember("db", server, name, exclude)


def _raise(exc: ConfigError):
    raise exc


def dialect_problem(members: Iterable[TargetMember], dialect: str) -> str | None:
    """Why this control database cannot run these targets, or None."""
    if dialect == "sqlite":
        return ("fleet targets need a database server (Azure SQL, SQL Server or PostgreSQL); the embedded "
                "SQLite database has no other databases to run in")
    members = tuple(members)
    if dialect == "postgres":
        pools = [m.text() for m in members if m.kind == "pool"]
        if pools:
            return (f"{pools[0]}: elastic pools exist only on Azure SQL Database; on PostgreSQL list the "
                    "databases with db: (globs allowed) or take a whole server with server:")
    for member in members:
        # The spelling the connection will read (split_server): refused now, for this job alone,
        # not at every run (127.0.0.1,5432 on PostgreSQL, a port 0 or 99999).
        if member.server is not None:
            try:
                server_address(member.server, dialect)
            except ConfigError as exc:
                return f"{member.text()}: its server must be {exc.expected}"
    return None


def needs_listing(members: Iterable[TargetMember]) -> list[tuple[str, str | None, str | None]]:
    """The listings resolution needs: ('server', server, None) or ('pool', server, pool), each
    once, in a stable order (server None: the agent's own)."""
    wanted: list[tuple[str, str | None, str | None]] = []
    for member in members:
        if member.kind == "db" and not member.is_pattern:
            continue
        if member.exclude and member.kind != "pool":
            continue     # it filters what the others name; only a pool's members must be listed
        key = ("pool", member.server, member.name) if member.kind == "pool" else ("server", member.server, None)
        if key not in wanted:
            wanted.append(key)
    return wanted


def resolve(members: Iterable[TargetMember], listings: dict[tuple[str, str | None, str | None], list[str]], *,
            dialect: str, own_server: str | None = None) -> list[Target]:
    """The databases the members name now, given the listings ``needs_listing`` asked for:
    includes minus exclusions, each database once, sorted. Names compare case-insensitively on
    SQL Server (its default collation) and exactly on PostgreSQL; servers as the addresses they
    are (``server_address``: letter case, a trailing dot, the default port, and ``own_server``, the
    control database's, the same as no server written), so one database is one execution however
    its server is spelled."""
    members = tuple(members)
    fold = (lambda text: text.casefold()) if dialect == "mssql" else (lambda text: text)
    own = _address(own_server, dialect) if own_server else None

    def server_key(server: str | None) -> str:
        if not server:
            return ""
        address = _address(server, dialect)
        return "" if address is not None and address == own else (address or server.casefold())

    pools = {key: {fold(name) for name in names} for key, names in listings.items() if key[0] == "pool"}

    def matches(member: TargetMember, target: Target) -> bool:
        if server_key(member.server) != server_key(target.server):
            return False
        if member.kind == "server":
            return True
        if member.kind == "pool":
            return fold(target.database) in pools.get(("pool", member.server, member.name), set())
        return fnmatch.fnmatchcase(fold(target.database), fold(member.name or ""))

    chosen: dict[tuple[str, str], Target] = {}
    for member in members:
        if member.exclude:
            continue
        if member.kind == "db" and not member.is_pattern:
            candidates = [member.name or ""]
        elif member.kind == "pool":
            candidates = listings.get(("pool", member.server, member.name), [])
        else:
            listed = listings.get(("server", member.server, None), [])
            candidates = [name for name in listed
                          if member.kind == "server" or fnmatch.fnmatchcase(fold(name), fold(member.name or ""))]
        for name in candidates:
            target = Target(member.server, name)
            chosen.setdefault((server_key(member.server), fold(name)), target)
    excluded = [m for m in members if m.exclude]
    result = [t for t in chosen.values() if not any(matches(m, t) for m in excluded)]
    return sorted(result, key=lambda t: (t.server or "", t.database))


def _address(server: str, dialect: str) -> str | None:
    """``host:port`` of a server as the connection reads it, or None for a spelling it refuses
    (that member fails alone when its execution connects)."""
    if dialect not in ("postgres", "mssql"):
        return server.casefold()
    try:
        return server_address(server, dialect)
    except ConfigError:
        return None


def user_databases(names: Iterable[str], dialect: str) -> list[str]:
    """A server's listing without what server: never includes."""
    if dialect == "mssql":
        return [n for n in names if n.casefold() not in SQL_SERVER_SYSTEM_DATABASES]
    return list(names)


# Fleet servers (AGENT_FLEET_SERVERS): the servers the agent may take its own credentials to
# (compared as connection_strings.server_address spells them).
FLEET_SERVERS_SETTING = "AGENT_FLEET_SERVERS"
FLEET_SERVERS_EXPECTED = ("a comma list of servers fleet targets may name, as a target names them "
                          "(myserver.database.windows.net, 10.0.0.5:5432, tcp:host,1433)")


def parse_server_list(setting: str, raw: str | None) -> tuple[str, ...]:
    """The servers of AGENT_FLEET_SERVERS as written (ConfigError naming the first bad one)."""
    if raw is None or not raw.strip():
        return ()
    servers = []
    for item in (part.strip() for part in _MEMBER_SEPARATOR.split(raw)):
        item = re.sub(r"\s*,\s*", ",", item)
        if not item or not _SERVER_PATTERN.match(item) or ":" in item.removeprefix("tcp:") and "," in item:
            raise ConfigError(setting, raw, f"{FLEET_SERVERS_EXPECTED}; found {item!r}")
        servers.append(item)
    return tuple(servers)


def member_servers(members: Iterable[TargetMember]) -> set[str]:
    """The servers members name (other than the agent's own), as written."""
    return {m.server for m in members if m.server is not None}


def describe_members(members: Iterable[TargetMember]) -> str:
    return ", ".join(m.text() for m in members)


ListFunction = Callable[[str, str | None, str | None], list[str]]
