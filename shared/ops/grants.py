"""T-SQL that gives the function app's managed identity least-privilege access (and, for a
PostgreSQL control database, the script for the agent's login role: agent_login_postgres).

The app needs to read and write the rows of the control schema and run its procedures and
functions, nothing more: SELECT, INSERT, UPDATE, DELETE and EXECUTE on schema ``agent`` (every
object the migrations create there, now and later), and no fixed role that is more (db_owner,
db_securityadmin, db_accessadmin: the script takes the user out of them). It never creates or
alters tables: ``init-db`` is run by a deployer. Azure SQL Database knows
an Entra identity only once a database user exists for it, created from the identity's name
(the function app's name for its system-assigned identity, the identity resource's name for a
user-assigned one) with ``CREATE USER [name] FROM EXTERNAL PROVIDER``, which only a Microsoft
Entra principal (the server's Entra admin) may run.

Job commands run as this same user. A job in the control database (the default target) can do
what these grants allow and nothing else; give it what it needs (EXECUTE on a schema of stored
procedures via ``execute_schemas``, or a role such as db_ddladmin for index maintenance). A job
with ``JOB__<name>__DATABASE`` runs in that database, where the identity needs a user of its own:
each such database gets its own script (Azure SQL Database has no USE: connect to it).

Names are quoted with SQL Server's QUOTENAME rules (in brackets, ``]`` doubled) and string
literals as N'...' with ``'`` doubled, so no name can end the identifier and inject SQL.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Iterable, Sequence

from shared.errors import ConfigError, UsageError

__all__ = ["GrantScript", "grant_scripts", "grant_sql", "render", "quote_name", "quote_string",
           "agent_login_postgres", "agent_login_tsql",
           "fleet_grant_scripts", "fleet_postgres_scripts"]

SYSNAME_MAX = 128       # sysname: nvarchar(128); QUOTENAME returns NULL beyond it
AGENT_DML = ("SELECT", "INSERT", "UPDATE", "DELETE")
# Fixed database roles that make the agent's user more than the agent: db_owner is everything;
# db_securityadmin and db_accessadmin grant rights and users, so a member can give itself any.
TSQL_ROLES_REMOVED = ("db_owner", "db_securityadmin", "db_accessadmin")


@dataclass(frozen=True)
class GrantScript:
    """The statements to run in one database; ``database`` None means the control database."""

    database: str | None
    statements: tuple[str, ...]
    comment: str
    # A fleet target's (or its master's) server; None: the agent's own server.
    server: str | None = None

    @property
    def sql(self) -> str:
        return self.comment + "\n" + "\n".join(self.statements) + "\n"


def _check_name(value: object, setting: str, what: str) -> str:
    expected = (f"{what}: 1 to {SYSNAME_MAX} characters, no control characters "
                "and no leading or trailing spaces")
    if not isinstance(value, str) or not value or len(value) > SYSNAME_MAX \
            or value != value.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        _refuse(setting, value, expected)
    return value


def _refuse(setting: str, value: object, expected: str) -> None:
    """A bad name: a command-line argument's is a usage error (exit 2, kind usage), a setting's
    (AGENT_JOB_PRINCIPAL, a job's TARGETS) a configuration error."""
    if setting.startswith("--"):
        raise UsageError(str(ConfigError(setting, value, expected)), setting=setting, value=value, expected=expected)
    raise ConfigError(setting, value, expected)


def name_problem(value: str) -> str | None:
    """Why a database name found at run time (a glob, server:, pool:) cannot go into a script,
    or None: control characters (a line break would end a comment), or beyond sysname."""
    try:
        _check_name(value, "TARGETS", "a database name")
    except ConfigError as exc:
        return exc.expected
    return None


def quote_name(name: str) -> str:
    """``name`` as a T-SQL delimited identifier, as QUOTENAME(name) does: [name] with ] doubled."""
    return "[" + name.replace("]", "]]") + "]"


def quote_string(text: str) -> str:
    """``text`` as a T-SQL Unicode string literal: N'text' with ' doubled."""
    return "N'" + text.replace("'", "''") + "'"


def _create_user(app: str) -> str:
    # Idempotent: re-running the script after adding a job database changes nothing else.
    return (f"IF DATABASE_PRINCIPAL_ID({quote_string(app)}) IS NULL "
            f"CREATE USER {quote_name(app)} FROM EXTERNAL PROVIDER;")


def _agent_user_statements(app: str, schema: str) -> tuple[str, ...]:
    """The agent's own user in the control database: created from the Entra identity when
    missing; the rows of the control schema and its procedures and functions (EXECUTE: the
    agent's queries call agent.json_text, its pause settles runs with agent.settle_paused_runs);
    out of every fixed role that is more than that (TSQL_ROLES_REMOVED)."""
    user = quote_name(app)
    return (
        _create_user(app),
        f"GRANT {', '.join(AGENT_DML)}, EXECUTE ON SCHEMA::{quote_name(schema)} TO {user};",
        *(f"IF IS_ROLEMEMBER({quote_string(role)}, {quote_string(app)}) = 1 "
          f"ALTER ROLE {quote_name(role)} DROP MEMBER {user};" for role in TSQL_ROLES_REMOVED),
    )


def _job_principal(app: str, principal: str, schema: str | None) -> tuple[str, ...]:
    """The user jobs run as (AGENT_JOB_PRINCIPAL): no login, impersonated by the app with
    EXECUTE AS USER; in the control database denied every right on the agent's schema."""
    user = quote_name(principal)
    statements = [f"IF DATABASE_PRINCIPAL_ID({quote_string(principal)}) IS NULL CREATE USER {user} WITHOUT LOGIN;"]
    if schema is not None:
        statements.append(f"DENY SELECT, INSERT, UPDATE, DELETE, EXECUTE, ALTER, REFERENCES, VIEW DEFINITION "
                          f"ON SCHEMA::{quote_name(schema)} TO {user};")
    statements.append(f"GRANT IMPERSONATE ON USER::{user} TO {quote_name(app)};")
    return tuple(statements)


def grant_scripts(app_name: str, *, schema: str = "agent", job_databases: Iterable[str] = (),
                  execute_schemas: Sequence[str] = (), job_principal: str | None = None) -> list[GrantScript]:
    """One script for the control database, then one per job database (sorted, no duplicates).
    With ``job_principal`` (AGENT_JOB_PRINCIPAL) jobs run as that user, and the grants for the
    jobs' own work go to it instead of the app."""
    app = _check_name(app_name, "--app-name",
                      "the function app's name (its system-assigned managed identity) or the name of "
                      "its user-assigned identity")
    schema = _check_name(schema, "schema", "the control schema name")
    executes = [_check_name(s, "--execute-schema", "a schema whose procedures jobs execute")
                for s in execute_schemas]
    databases = sorted({_check_name(d, "--job-database", "a database named by JOB__<name>__DATABASE")
                        for d in job_databases})
    principal = (_check_name(job_principal, "AGENT_JOB_PRINCIPAL", "the database user jobs run as")
                 if job_principal else None)
    user = quote_name(app)
    runs_jobs = quote_name(principal) if principal else user
    execute_grants = tuple(f"GRANT EXECUTE ON SCHEMA::{quote_name(s)} TO {runs_jobs};" for s in executes)

    control = GrantScript(
        database=None,
        statements=(
            *_agent_user_statements(app, schema),
            *(_job_principal(app, principal, schema) if principal else ()),
            *execute_grants,
        ),
        comment=(
            "-- In the CONTROL database (not master), as a Microsoft Entra admin of the server.\n"
            f"-- The app reads and writes the rows of schema {quote_name(schema)} and runs its procedures and\n"
            "-- functions; it is in no role that is more (db_owner, db_securityadmin, db_accessadmin).\n"
            "-- init-db, run by a deployer, made the schema (dbo owns it).\n"
            + (f"-- Job commands run as {runs_jobs} (AGENT_JOB_PRINCIPAL), which the app\n"
               "-- impersonates and which has no right on the agent's schema: a job cannot rewrite the\n"
               "-- agent's bookkeeping. Grant it what your jobs need, e.g.\n"
               if principal else
               "-- Job commands run as this user: a job in the control database can do\n"
               "-- only what is granted here (set AGENT_JOB_PRINCIPAL and --job-principal to keep jobs away\n"
               "-- from the agent's own tables). Grant what your jobs need, e.g.\n")
            + f"--   GRANT EXECUTE ON SCHEMA::[dbo] TO {runs_jobs};   (stored procedures; or --execute-schema dbo)\n"
            f"--   ALTER ROLE db_ddladmin ADD MEMBER {runs_jobs};    (index and statistics maintenance)"
        ),
    )
    scripts = [control]
    for database in databases:
        scripts.append(GrantScript(
            database=database,
            statements=_job_database_statements(app, principal, execute_grants),
            comment=(
                f"-- In database {quote_name(database)} (a JOB__<name>__DATABASE target; connect to it:\n"
                "-- Azure SQL Database has no USE). The agent itself needs nothing here; its jobs run as\n"
                "-- this user and need the rights their commands use (work here is at-least-once)."
            ),
        ))
    return scripts


def _job_database_statements(app: str, principal: str | None, execute_grants: tuple[str, ...]) -> tuple[str, ...]:
    """What a database jobs run in (JOB__<name>__DATABASE, or a fleet target) needs: the app's
    user, the job principal when there is one, and the EXECUTE grants."""
    return (_create_user(app), *(_job_principal(app, principal, None) if principal else ()), *execute_grants)


def grant_sql(app_name: str, *, schema: str = "agent", job_databases: Iterable[str] = (),
              execute_schemas: Sequence[str] = (), job_principal: str | None = None) -> str:
    """The T-SQL creating the app's managed-identity user with least privilege, for every database
    it touches, as one printable script (a GO line between databases)."""
    return render(grant_scripts(app_name, schema=schema, job_databases=job_databases,
                                execute_schemas=execute_schemas, job_principal=job_principal))


def render(scripts: Sequence[GrantScript]) -> str:
    """Scripts as one printable text, a GO line between databases."""
    return "GO\n".join(script.sql for script in scripts)


# ---------------------------------------------------------------- fleet targets (grant-sql --targets)

# Listing an elastic pool's members reads sys.database_service_objectives in master, which
# "requires dbManager permission on the master database" (its documentation): membership in
# master's dbmanager role, which also lets the user create databases on the server.
POOL_LISTING_ROLE = "dbmanager"


def _server_label(server: str | None) -> str:
    return f"server {server}" if server else "the agent's own server"


def fleet_grant_scripts(app_name: str, targets: Iterable[tuple[str | None, str]],
                        listed: Iterable[tuple[str, str | None, str | None]] = (), *,
                        execute_schemas: Sequence[str] = (), job_principal: str | None = None,
                        job_name: str = "") -> list[GrantScript]:
    """The T-SQL for a fleet job's targets, grouped by server (the agent's own first, then by
    name): for each server whose databases are listed at run time (``listed``: the
    ``needs_listing`` keys, ('server' | 'pool', server, pool)), a script for its ``master``;
    then one script per target database (``targets``: (server, database)), with the same
    statements a JOB__<name>__DATABASE gets (grant_scripts)."""
    app = _check_name(app_name, "--app-name",
                      "the function app's name (its system-assigned managed identity) or the name of "
                      "its user-assigned identity")
    executes = [_check_name(s, "--execute-schema", "a schema whose procedures jobs execute")
                for s in execute_schemas]
    principal = (_check_name(job_principal, "AGENT_JOB_PRINCIPAL", "the database user jobs run as")
                 if job_principal else None)
    runs_jobs = quote_name(principal) if principal else quote_name(app)
    execute_grants = tuple(f"GRANT EXECUTE ON SCHEMA::{quote_name(s)} TO {runs_jobs};" for s in executes)
    where = f"job {job_name!r}" if job_name else "the job"

    by_server: dict[str | None, dict[str, object]] = {}
    for kind, server, _pool in listed:
        entry = by_server.setdefault(server, {"pools": False, "listed": False, "databases": set()})
        entry["listed"] = True
        if kind == "pool":
            entry["pools"] = True
    for server, database in targets:
        entry = by_server.setdefault(server, {"pools": False, "listed": False, "databases": set()})
        entry["databases"].add(_check_name(database, "TARGETS", "a database name"))  # type: ignore[union-attr]

    scripts: list[GrantScript] = []
    for server in sorted(by_server, key=lambda s: (s is not None, (s or "").casefold())):
        entry = by_server[server]
        label = _server_label(server)
        if entry["listed"]:
            statements = [_create_user(app)]
            comment = (f"-- In database [master] of {label}, as a Microsoft Entra admin of that server.\n"
                       f"-- {where} lists this server's databases at every run (server: members, db: globs):\n"
                       "-- the app reads sys.databases in master, where it needs a user of its own. A database\n"
                       "-- it does not own shows there only with VIEW ANY DATABASE (public's by default on SQL\n"
                       "-- Server) or CREATE DATABASE in master: check those if a listing comes back short.")
            if entry["pools"]:
                statements.append(f"ALTER ROLE {quote_name(POOL_LISTING_ROLE)} ADD MEMBER {quote_name(app)};")
                comment += ("\n-- pool: members read sys.database_service_objectives, which requires dbmanager in\n"
                            "-- master: a member of it may also create databases on this server.")
            scripts.append(GrantScript(database="master", server=server, statements=tuple(statements),
                                       comment=comment))
        for database in sorted(entry["databases"], key=str.casefold):  # type: ignore[arg-type]
            scripts.append(GrantScript(
                database=database, server=server,
                statements=_job_database_statements(app, principal, execute_grants),
                comment=(f"-- In database {quote_name(database)} on {label} (a fleet target of {where}; connect\n"
                         "-- to it: Azure SQL Database has no USE). Its executions run as this user and need the\n"
                         "-- rights their commands use (work here is at-least-once)."),
            ))
    return scripts


def fleet_postgres_scripts(app_name: str, targets: Iterable[tuple[str | None, str]], *,
                           job_name: str = "") -> list[GrantScript]:
    """PostgreSQL's equivalent for a fleet job: CONNECT on each target database for the app's
    login role, one script per server (a database-level GRANT runs from any database of the
    server, so also for a database that refuses connections now). Listing needs nothing there:
    pg_database is readable by every role. ``database`` None: run it in the control database
    (the agent's own server); 'postgres' on another server."""
    role = _check_pg_name(app_name, "--app-name", "the app's PostgreSQL login role")
    where = f"job {job_name!r}" if job_name else "the job"
    by_server: dict[str | None, set[str]] = {}
    for server, database in targets:
        by_server.setdefault(server, set()).add(_check_name(database, "TARGETS", "a database name"))
    scripts = []
    for server in sorted(by_server, key=lambda s: (s is not None, s or "")):
        scripts.append(GrantScript(
            database=None if server is None else "postgres", server=server,
            statements=tuple(f"GRANT CONNECT ON DATABASE {quote_pg_name(db)} TO {quote_pg_name(role)};"
                             for db in sorted(by_server[server])),
            comment=(f"-- On {_server_label(server)} (any database; as the databases' owner or a superuser): the\n"
                     f"-- fleet targets of {where}. Listing needs nothing (pg_database is readable by every role);\n"
                     "-- grant what the jobs' commands use inside each database yourself."),
        ))
    return scripts


def render_fleet(scripts: Sequence[GrantScript], *, separator: str = "GO\n") -> str:
    """Fleet scripts as one printable text: a header line naming each script's server and
    database, ``separator`` (T-SQL's GO line) between scripts."""
    parts = []
    for script in scripts:
        place = script.database if script.database is not None else "the control database"
        parts.append(f"-- ===== {_server_label(script.server)}: {place}\n" + script.sql)
    return separator.join(parts)


# ---------------------------------------------------------------- the T-SQL interface's operators

OPERATOR_ROLE = "agent_operator"
OPERATOR_WARNING = (
    "SQL queued through agent.exec_async and agent.add_scheduled_job runs as the operator who queued it (its "
    "owner, recorded by the procedure), with that principal's rights and no more, as SQL Server Agent runs a job "
    "of a non-sysadmin owner: the agent must be able to act as it (PostgreSQL: a member of the operator's role; "
    "SQL Server: IMPERSONATE on its user). Jobs from the app settings run as the app's user or AGENT_JOB_PRINCIPAL.")


def quote_pg_name(name: str) -> str:
    """``name`` as a PostgreSQL quoted identifier: "name" with " doubled."""
    return '"' + name.replace('"', '""') + '"'


def operator_sql(principal: str, *, dialect: str, app: str | None = None) -> str:
    """The membership in agent_operator for ``principal``: T-SQL for Azure SQL / SQL Server (the
    database user is created from the Entra principal's name when missing), or the PostgreSQL
    GRANT (the login role must exist). The role itself, with EXECUTE on the procedures and SELECT
    on the views, is created by init-db (migration tsql_interface)."""
    who = _check_name(principal, "--operator", "a database user or role (an Entra user, group or app name on "
                      "Azure SQL; a login role on PostgreSQL)")
    warning = "".join(f"-- {line}\n" for line in _wrap(OPERATOR_WARNING))
    runner = _check_name(app, "--app-name", "the app's database user or login role") if app else None
    if dialect == "postgres":
        # The agent runs the operator's jobs in a function owned by the operator's role: making it
        # the owner needs the agent's login to be a member (SESSION_USER: the login running this,
        # the agent's own with --apply). A superuser login needs nothing.
        who = _check_pg_name(who, "--operator", "the operator's PostgreSQL login role")
        runner = _check_pg_name(runner, "--app-name", "the agent's PostgreSQL login role") if runner else None
        member = quote_pg_name(runner) if runner else "SESSION_USER"
        # One transaction that ends with the operator role's check (PG_CHECK_LOGIN): the agent's
        # login becomes a member of it, so it would reach whatever privileged role the operator
        # reaches (a superuser operator would make the agent one).
        return (f"-- On the PostgreSQL control database: {who!r} calls the agent's functions and reads its views;\n"
                f"-- the agent's login ({runner or 'SESSION_USER: run this as that login, or pass --app-name'}) "
                "becomes a member of it, to run its jobs as it;\n"
                "-- refused (nothing changes) when the operator's role is or reaches a privileged role.\n"
                + warning + "BEGIN;\n"
                + f"SELECT set_config('agent.grant_login', {quote_pg_literal(who)}, true);\n"
                + f"GRANT {OPERATOR_ROLE} TO {quote_pg_name(who)};\n"
                + f"GRANT {quote_pg_name(who)} TO {member};\n"
                + PG_CHECK_LOGIN + "\nCOMMIT;\n")
    impersonate = (f"GRANT IMPERSONATE ON USER::{quote_name(who)} TO {quote_name(runner)};\n" if runner else
                   "-- Then, so the agent can run this operator's jobs as it: GRANT IMPERSONATE ON USER::<operator>\n"
                   "-- TO <the app's user> (grant-sql --operator PRINCIPAL --app-name APP prints it).\n")
    return ("-- In the CONTROL database (not master), as a Microsoft Entra admin of the server:\n"
            f"-- {quote_name(who)} executes the procedures and reads the views of schema [agent], nothing else.\n"
            + warning
            + f"IF DATABASE_PRINCIPAL_ID({quote_string(who)}) IS NULL CREATE USER {quote_name(who)} FROM EXTERNAL PROVIDER;\n"
            + f"ALTER ROLE {quote_name(OPERATOR_ROLE)} ADD MEMBER {quote_name(who)};\n" + impersonate)


def _wrap(text: str, width: int = 96) -> list[str]:

    return textwrap.wrap(text, width)


# ---------------------------------------------------------------- the agent's own identity (--agent-login)

# PostgreSQL truncates an identifier longer than NAMEDATALEN - 1 bytes (a NOTICE only): a longer
# name would silently name another role.
PG_NAME_MAX_BYTES = 63


def _check_pg_name(value: object, setting: str, what: str) -> str:
    expected = (f"{what}: 1 to {PG_NAME_MAX_BYTES} bytes (UTF-8), no control characters and no leading "
                "or trailing spaces (PostgreSQL would cut a longer name to another role's)")
    if not isinstance(value, str) or not value or len(value.encode("utf-8")) > PG_NAME_MAX_BYTES \
            or value != value.strip() or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        _refuse(setting, value, expected)
    return value


def quote_pg_literal(text: str) -> str:
    """``text`` as a PostgreSQL escape-string literal, E'...' with ' and \\ doubled: the same
    value whatever standard_conforming_strings says."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


# What a least-privilege agent login must not reach, checked by the PostgreSQL scripts: a role the
# login can SET ROLE to (any role it is a member of, with or without INHERIT) that is a superuser
# or may create roles or databases, replicate or bypass row security, or a predefined pg_* role
# (pg_database_owner included: the login must not own the database).
# The name to check is in the transaction's setting agent.grant_login (set_config), so the
# body below is fixed text with no name spliced into it.
PG_CHECK_LOGIN = (
    "DO $agent_grant$\n"
    "DECLARE\n"
    "    login text := current_setting('agent.grant_login');\n"
    "    reached text;\n"
    "BEGIN\n"
    "    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = login) THEN\n"
    "        RAISE EXCEPTION 'role % does not exist: create the agent''s login first (CREATE ROLE ... LOGIN, or on "
    "Azure Database for PostgreSQL pgaadauth_create_principal)', quote_ident(login);\n"
    "    END IF;\n"
    "    SELECT string_agg(quote_ident(r.rolname), ', ' ORDER BY r.rolname) INTO reached\n"
    "    FROM pg_catalog.pg_roles AS r\n"
    "    WHERE pg_catalog.pg_has_role(login, r.oid, 'MEMBER')\n"
    "      AND (r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolreplication OR r.rolbypassrls\n"
    "           OR r.rolname LIKE 'pg\\_%');\n"
    "    IF reached IS NOT NULL THEN\n"
    "        RAISE EXCEPTION 'role % reaches % (itself, or a role it can SET ROLE to): a superuser, CREATEROLE, "
    "CREATEDB, REPLICATION, BYPASSRLS or predefined role, which the agent''s login would hold (it is that role, "
    "or becomes a member of it) and so would a job that escaped. Remove that membership or attribute (as a "
    "superuser: ALTER ROLE ... NOSUPERUSER; REVOKE ... FROM ...)', quote_ident(login), reached;\n"
    "    END IF;\n"
    "END\n"
    "$agent_grant$;"
)

# Every object in schema agent handed to the agent's login (a schema init-db made as another role,
# e.g. a superuser, before the login existed). A sequence that belongs to a column moves with its
# table (ALTER SEQUENCE OWNER refuses it).
PG_HAND_OVER_SCHEMA = (
    "DO $agent_grant$\n"
    "DECLARE\n"
    "    login text := current_setting('agent.grant_login');\n"
    "    item record;\n"
    "BEGIN\n"
    "    EXECUTE format('ALTER SCHEMA agent OWNER TO %I', login);\n"
    "    FOR item IN\n"
    "        SELECT CASE c.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' WHEN 'S' THEN 'SEQUENCE'\n"
    "                              ELSE 'TABLE' END AS kind, c.oid::regclass::text AS name\n"
    "        FROM pg_catalog.pg_class AS c\n"
    "        WHERE c.relnamespace = 'agent'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'S')\n"
    "          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS d WHERE d.classid = 'pg_class'::regclass\n"
    "                          AND d.objid = c.oid AND d.deptype IN ('a', 'i'))\n"
    "          AND pg_catalog.pg_get_userbyid(c.relowner) <> login\n"
    "        UNION ALL\n"
    "        SELECT CASE p.prokind WHEN 'p' THEN 'PROCEDURE' WHEN 'a' THEN 'AGGREGATE' ELSE 'FUNCTION' END,\n"
    "               p.oid::regprocedure::text\n"
    "        FROM pg_catalog.pg_proc AS p\n"
    "        WHERE p.pronamespace = 'agent'::regnamespace AND pg_catalog.pg_get_userbyid(p.proowner) <> login\n"
    "    LOOP\n"
    "        EXECUTE format('ALTER %s %s OWNER TO %I', item.kind, item.name, login);\n"
    "    END LOOP;\n"
    "END\n"
    "$agent_grant$;"
)

PG_CREATE_OPERATOR_ROLE = (
    "DO $agent_grant$\n"
    "BEGIN\n"
    "    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'agent_operator') THEN\n"
    "        CREATE ROLE agent_operator NOLOGIN;\n"
    "    END IF;\n"
    "END\n"
    "$agent_grant$;"
)

PG_GRANT_DATABASE = (
    "DO $agent_grant$\n"
    "BEGIN\n"
    "    EXECUTE format('GRANT CONNECT, TEMPORARY ON DATABASE %I TO %I', current_database(),\n"
    "                   current_setting('agent.grant_login'));\n"
    "END\n"
    "$agent_grant$;"
)


def agent_login_postgres(login: str, *, job_principal: str | None = None,
                         principal_setting: str = "--job-principal") -> str:
    """The PostgreSQL script that makes ``login`` the agent's least-privilege login, run once
    on the control database by an admin (a superuser, or a CREATEROLE role that is a member of
    ``login``), before the first init-db and again after any change; idempotent.

    The login owns schema ``agent`` and everything in it, so it runs init-db itself (every
    migration: only agent_operator, a role, needs CREATEROLE, and the script creates it). It
    keeps no attribute beyond LOGIN and INHERIT and reaches no privileged role; it gets CONNECT
    and TEMPORARY on the database (the owner's temporary function lives in pg_temp) and, per job
    owner, membership of that owner's role (grant-sql --operator ... --app-name LOGIN; here only
    AGENT_JOB_PRINCIPAL's). INHERIT: the agent drops the owner's temporary function after the
    job, which needs the owner's rights (NOINHERIT would narrow nothing an escape reaches: a
    member can SET ROLE to the role either way)."""
    who = _check_pg_name(login, "--agent-login", "the agent's PostgreSQL login role")
    principal = (_check_pg_name(job_principal, principal_setting, "the role AGENT_JOB_PRINCIPAL's jobs run as")
                 if job_principal else None)
    role = quote_pg_name(who)
    lines = [
        "-- On the PostgreSQL CONTROL database, as a superuser or a CREATEROLE admin that is a member of",
        f"-- {role} (Azure Database for PostgreSQL's admin: GRANT {role} TO <admin> first), once before the",
        "-- first init-db and again after a change. The login must exist (CREATE ROLE ... LOGIN PASSWORD ..., or",
        "-- Entra: pgaadauth_create_principal). It owns schema agent and its objects, runs init-db itself, and",
        "-- holds nothing else: no SUPERUSER, CREATEROLE, CREATEDB, REPLICATION or BYPASSRLS, no predefined role.",
        "-- Each operator whose jobs it runs: grant-sql --operator ROLE --app-name " + who.replace("\n", " "),
        "BEGIN;",
        f"SELECT set_config('agent.grant_login', {quote_pg_literal(who)}, true);",
        f"ALTER ROLE {role} NOCREATEDB NOCREATEROLE INHERIT;",
        PG_CREATE_OPERATOR_ROLE,
        f"CREATE SCHEMA IF NOT EXISTS agent AUTHORIZATION {role};",
        PG_HAND_OVER_SCHEMA,
        PG_GRANT_DATABASE,
    ]
    if principal:
        lines.append(f"GRANT {quote_pg_name(principal)} TO {role};")
    lines += [PG_CHECK_LOGIN, "COMMIT;"]
    return "\n".join(lines) + "\n"


def agent_login_tsql(app_name: str, *, schema: str = "agent", job_principal: str | None = None,
                     principal_setting: str = "--job-principal") -> GrantScript:
    """The T-SQL that makes the app's database user the agent's least-privilege identity on the
    control database (Azure SQL / SQL Server): the rows of schema agent (SELECT, INSERT, UPDATE,
    DELETE) and its procedures and functions (EXECUTE; the agent's queries call agent.json_text
    and agent.settle_paused_runs), IMPERSONATE on AGENT_JOB_PRINCIPAL's user, and out of the
    fixed roles that are more than that (db_owner; db_securityadmin and db_accessadmin, which
    could grant it anything). Nothing in master, nothing server-level; init-db is run by the
    Entra admin (dbo owns the schema)."""
    app = _check_name(app_name, "--agent-login",
                      "the agent's database user: the function app's name (its system-assigned managed identity) "
                      "or the name of its user-assigned identity")
    schema = _check_name(schema, "schema", "the control schema name")
    principal = (_check_name(job_principal, principal_setting, "the database user jobs run as")
                 if job_principal else None)
    statements = [
        *_agent_user_statements(app, schema),
        *(_job_principal(app, principal, schema) if principal else ()),
    ]
    comment = (
        "-- In the CONTROL database (not master), as a Microsoft Entra admin of the server, after init-db\n"
        "-- (which the admin runs: dbo owns schema [agent]). The agent's identity: the rows, procedures and\n"
        f"-- functions of schema {quote_name(schema)}, IMPERSONATE on the users whose jobs it runs, nothing else\n"
        "-- (no db_owner, no DDL, nothing in master or on the server). Each operator whose jobs it runs:\n"
        f"--   grant-sql --operator PRINCIPAL --app-name {app.replace(chr(10), ' ')}   (IMPERSONATE on that user)"
    )
    return GrantScript(database=None, statements=tuple(statements), comment=comment)
