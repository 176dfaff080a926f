"""``doctor``: is this agent able to run here? One check after the other, stopping at the first
failure with what to fix:

1. driver          unixODBC loads and the ODBC driver is installed (ODBC databases)
2. connectivity    the database server (or the SQLite file's folder) can be reached
3. authentication  an Entra ID token is issued and accepted / the login is accepted
4. schema          the control schema is at the version this code needs
5. session         the agent session's options and the triggers on agent tables
6. permissions     a scratch run goes through the real named queries (insert, update, read,
                   delete) and is removed again, in one transaction
7. queue           the queue exists (or is created) and answers
8. targets         every fleet job's targets (JOB__<name>__TARGETS) resolve now and each
                   answers a SELECT 1 (tried once each, 8 at a time): one line per one that
                   does not, and per server or pool that cannot be listed

Works on all three dialects; nothing is left behind (a missing SQLite file is not created).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from shared.control.azure_sql import (
    DEFAULT_DRIVER,
    DEFAULT_PORT,
    SQL_SCOPE,
    build_connection_string,
    check_odbc_environment,
    explain_connect_error,
    shared_token_provider,
)
from shared.control.connection_strings import odbc_pairs
from shared.control.db import import_pyodbc
from shared.control.sqlerrors import classify, diagnostic_records
from shared.engine.fleet import fleet_steps, listing_text, resolve_fleet, target_text
from shared.errors import AgentError
from shared.jobs.run_model import RunStatus
from shared.jobs.targets import dialect_problem, needs_listing
from shared.ops.fleet import database_fleet_jobs, fast_target_store, probe_targets
from shared.telemetry.client import new_operation_id

__all__ = ["Check", "DoctorReport", "run_doctor", "CHECKS"]

CHECKS = ("driver", "connectivity", "authentication", "schema", "session", "permissions", "queue", "targets",
          "monitor")
INIT_DB = "sql-agent init-db"
GRANT_SQL = "sql-agent grant-sql --app-name <function app name> --apply"
GRANT_SQL_TARGETS = "sql-agent grant-sql --app-name <function app name> --targets <job>"
# The roles on the storage account that identity-based AzureWebJobsStorage needs for this app,
# exactly what infra/functionapp.bicep grants and docs/deploying.md lists (tests/repo/test_infra.py
# checks all three agree): host storage, the queue (trigger, dispatch, the host's poison queue)
# and the host's diagnostic events.
STORAGE_ROLES = ("Storage Blob Data Owner", "Storage Queue Data Contributor", "Storage Table Data Contributor")
QUEUE_ROLE = "Storage Queue Data Contributor"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None          # None: not run (an earlier check failed)
    detail: str
    fix: str = ""
    # More lines under the check (the targets that do not answer), printed indented.
    lines: tuple[str, ...] = ()


@dataclass
class DoctorReport:
    target: str
    checks: list[Check] = field(default_factory=list)
    # Invalid jobs (settings or agent.add_scheduled_job): each hurts only itself, so a warning
    # line, not a failed check.
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(check.ok for check in self.checks)

    @property
    def failed(self) -> Check | None:
        return next((check for check in self.checks if check.ok is False), None)

    def render(self) -> str:
        lines = [f"agent doctor: {self.target}"]
        width = max(len(name) for name in CHECKS)
        for check in self.checks:
            mark = {True: "[ OK ]", False: "[FAIL]", None: "[ -- ]"}[check.ok]
            lines.append(f"{mark} {check.name.ljust(width)}  {check.detail}")
            lines.extend(f"{' ' * 7}{' ' * width}  {line}" for line in check.lines)
            if check.fix:
                lines.append(f"{' ' * 7}{' ' * width}  fix: {check.fix}")
        for warning in self.warnings:
            lines.append(f"[WARN] {warning}")
        failed = self.failed
        lines.append("all checks passed" if self.ok else f"doctor found a problem: {failed.name if failed else '?'}")
        return "\n".join(lines)


class _Failed(Exception):
    def __init__(self, detail: str, fix: str = "", lines: tuple[str, ...] = ()) -> None:
        super().__init__(detail)
        self.detail = detail
        self.fix = fix
        self.lines = lines


class _Doctor:
    def __init__(self, agent: Any, tcp_timeout: float) -> None:
        self.agent = agent
        self.target = agent.target
        self.tcp_timeout = tcp_timeout
        self.sqlite_missing = False       # the SQLite file does not exist (yet)
        self.connect_error: BaseException | None = None
        self.notes: dict[str, list[str]] = {}   # lines under a check that passed

    # ------------------------------------------------------------ 1. driver

    def driver(self) -> str:
        target = self.target
        if target.dialect == "sqlite":
            return f"sqlite3 {sqlite3.sqlite_version} (Python standard library; no ODBC driver needed)"

        if target.uses_token:
            driver = DEFAULT_DRIVER
        else:
            driver = odbc_pairs(target.location).get("driver", "")
        try:
            if target.dialect == "mssql":
                check_odbc_environment(driver)

            pyodbc = import_pyodbc()
        except AgentError as exc:
            raise _Failed(str(exc)) from None
        installed = list(pyodbc.drivers())
        if driver not in installed:
            listed = ", ".join(repr(name) for name in installed) or "none"
            raise _Failed(f"ODBC driver {driver!r} is not installed (installed: {listed})",
                          "install it: `apt-get install odbc-postgresql` (PostgreSQL Unicode), or name an "
                          "installed driver in the connection string")
        return f"pyodbc {pyodbc.version}, unixODBC, driver {driver!r}"

    # ------------------------------------------------------------ 2. connectivity, 3. authentication

    def connectivity(self) -> str:
        target = self.target
        if target.dialect == "sqlite":
            return self._sqlite_file()
        if target.uses_token:
            return self._tcp_probe()
        # One login attempt answers both: a server that refuses the login was reached.
        try:
            self.agent.store().connection
        except Exception as exc:
            if _is_login_error(exc):
                self.connect_error = exc
                return f"{target.display}: the server answered (it refused the login, see authentication)"
            raise _Failed(self._connect_message(exc), self._connect_fix()) from None
        return f"connected to {target.display}{self._server()}"

    def _server(self) -> str:
        """What the server says it is (@@VERSION, version()): '; server: ...', or nothing when
        it cannot be read (the later checks report why)."""
        try:
            text = self.agent.store().execute("server_version").scalar()
        except Exception:  # noqa: BLE001 - a failed read is reported by the schema/session checks
            return ""
        return f"; server: {server_description(str(text or ''))}" if text else ""

    def authentication(self) -> str:
        target = self.target
        if target.dialect == "sqlite":
            return "not needed (SQLite: file permissions only)"
        if target.uses_token:
            return self._entra_login()
        if self.connect_error is not None:
            raise _Failed(self._connect_message(self.connect_error),
                          "check Uid/Pwd (or the role) in the connection string (--db / AGENT_DB)")
        return "login accepted"

    def _sqlite_file(self) -> str:
        path = self.target.location
        if path == ":memory:":
            return "in-memory SQLite database"
        file = Path(path).expanduser()
        folder = file.resolve().parent
        if not folder.is_dir():
            raise _Failed(f"folder {folder} does not exist",
                          "create it, or point AGENT_DB / --db at sqlite:///PATH in an existing folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise _Failed(f"folder {folder} is not writable (SQLite needs it for its journal)",
                          "make it writable for this user, or put the database elsewhere")
        if not file.exists():
            self.sqlite_missing = True
            return f"{file} does not exist yet (init-db creates it); folder {folder} is writable"
        if not os.access(file, os.R_OK | os.W_OK):
            raise _Failed(f"{file} is not readable and writable for this user",
                          "fix the file's permissions (the agent writes to it)")
        return f"{file} is readable and writable"

    def _tcp_probe(self) -> str:
        target = self.target
        try:
            server = odbc_pairs(build_connection_string(target.sql_server or "", target.sql_database or ""))["server"]
        except AgentError as exc:
            raise _Failed(str(exc)) from None
        host, _, port = server.removeprefix("tcp:").partition(",")
        port_number = int(port or DEFAULT_PORT)
        try:
            with socket.create_connection((host, port_number), timeout=self.tcp_timeout):
                pass
        except OSError as exc:
            raise _Failed(
                f"cannot reach {host} on TCP port {port_number}: {exc}",
                f"check AGENT_SQL_SERVER={target.sql_server!r}, that outbound TCP {port_number} is allowed, and "
                "the server's firewall / network settings (public access, private endpoint)") from None
        return f"{host}:{port_number} accepts TCP connections"

    def _entra_login(self) -> str:


        target = self.target
        server, database = target.sql_server or "", target.sql_database or ""
        provider = shared_token_provider(target.sql_client_id)
        try:
            provider.get_token()
        except Exception as exc:
            raise _Failed(explain_connect_error(exc, server, database)) from None
        expires = datetime.fromtimestamp(provider.expires_on, timezone.utc).strftime("%H:%M:%S UTC")
        try:
            self.agent.store().connection
        except Exception as exc:
            raise _Failed(explain_connect_error(_unwrap(exc), server, database)) from None
        who = f"user-assigned identity {target.sql_client_id}" if target.sql_client_id else "the default credential"
        return f"Entra ID token for {SQL_SCOPE} from {who} (valid until {expires}); logged in to {database!r}"

    def _connect_message(self, exc: BaseException) -> str:
        target = self.target
        if target.dialect == "mssql":
            pairs = odbc_pairs(target.location)
            return explain_connect_error(_unwrap(exc), pairs.get("server", "?"), pairs.get("database", "?"))
        return str(exc)

    def _connect_fix(self) -> str:
        if self.target.dialect == "postgres":
            return ("check that PostgreSQL runs and listens where Server= and Port= say "
                    "(--db / AGENT_DB), and that the database in Database= exists")
        return "check Server= in the connection string (--db / AGENT_DB) and the network path to it"

    # ------------------------------------------------------------ 4. schema

    def schema(self) -> str:
        latest = self.agent.store().latest_version()
        if self.sqlite_missing:
            raise _Failed(f"no agent schema: {self.target.location} does not exist (this code needs version {latest})",
                          f"run `{INIT_DB}` (it creates the file and the schema)")
        store = self.agent.store()
        try:
            version = store.schema_version()
        except Exception as exc:
            raise _Failed(f"cannot read the schema version: {_one_line(exc)}", self._grant_fix()) from None
        if version == 0:
            raise _Failed(f"no agent schema in {self.target.display} (this code needs version {latest})",
                          f"run `{INIT_DB}` as a user allowed to create tables"
                          + (" (e.g. the server's Entra admin)" if self.target.dialect == "mssql" else ""))
        if version < latest:
            raise _Failed(f"schema version {version}, this code needs {latest}", f"run `{INIT_DB}` to upgrade it")
        if version > latest:
            raise _Failed(f"schema version {version} is newer than this code ({latest})",
                          "deploy the agent version that matches the database")
        return f"version {version} (latest)"

    # ------------------------------------------------------------ 5. session

    def session(self) -> str:
        """The options the agent's own session runs with (the ones its correctness rests on:
        lock timeout, XACT_ABORT, QUOTED_IDENTIFIER and ANSI_NULLS for the filtered indexes) and
        the triggers on agent tables. AFTER triggers are fine (every T-SQL statement that returns
        rows uses OUTPUT ... INTO, error 334 cannot happen); an INSTEAD OF trigger replaces the
        agent's fenced writes, so the check fails on one."""
        store = self.agent.store()
        try:
            row = store.execute("doctor_session").one()
        except Exception as exc:
            raise _Failed(f"cannot read the session's options: {_one_line(exc)}", self._grant_fix()) from None
        assert row is not None
        triggers = row["triggers"] or "none"
        if int(row["instead_of_triggers"] or 0):
            raise _Failed(f"INSTEAD OF trigger(s) on agent tables: {triggers}",
                          "drop them: an INSTEAD OF trigger replaces the agent's fenced writes (an audit "
                          "trigger must be an AFTER trigger)")
        options = row["session_options"]
        if self.target.dialect == "mssql":
            off = [name for name in ("XACT_ABORT", "QUOTED_IDENTIFIER", "ANSI_NULLS") if f"{name} OFF" in options]
            if off:
                raise _Failed(f"{', '.join(off)} OFF in the agent's session ({options})",
                              "the agent sets them when it connects: report this")
        return (f"lock timeout {row['lock_timeout']}, isolation {row['isolation']}, {options}; "
                f"triggers on agent tables: {triggers}")

    def invalid_jobs(self) -> list[str]:
        """One line per invalid job, where it is defined and why (never a failure: the other
        jobs run)."""
        try:
            rows = self.agent.store().execute("list_jobs").rows
        except Exception as exc:  # noqa: BLE001 - the permissions check reports the cause
            return [f"jobs could not be listed: {_one_line(exc)}"]
        return [f"job {row['job_name']!r} ({'defined in the database' if row['source'] == 'database' else 'app settings'}) "
                f"is invalid and does not run: {row['config_error']}"
                for row in rows if row["configured"] and not row["valid"]]

    def connection_budget(self, processes: int) -> list[str]:
        """A warning when AGENT_MAX_CONNECTIONS x ``processes`` exceeds what the server lets the
        agent's login hold (named query connection_limit); none when it fits or is unknown."""
        cap = self.agent.settings.agent.max_connections
        try:
            row = self.agent.store().execute("connection_limit").one() or {}
        except Exception as exc:  # noqa: BLE001 - a warning, never a failed check
            return [f"the server's connection limit could not be read ({_one_line(exc)}): check that "
                    f"AGENT_MAX_CONNECTIONS={cap} x {processes} process(es) fits it"]
        allowed, why = connection_allowance(row)
        need = cap * processes
        if allowed is None or need <= allowed:
            return []
        return [f"AGENT_MAX_CONNECTIONS={cap} x {processes} processes = {need} connections, more than the server "
                f"allows: {allowed} ({why}); beyond it connections are refused and the agent slows down: lower "
                f"AGENT_MAX_CONNECTIONS or the number of processes (maximumInstanceCount), or raise the limit"]

    def identity_rights(self) -> list[str]:
        """A warning when the identity the agent connects as is more than the agent needs (a
        superuser, CREATEROLE, db_owner, ...: named query identity_rights): run as it, a job that
        escaped the principal it runs as would hold those rights. None when it is not, or unknown."""
        try:
            row = self.agent.store().execute("identity_rights").one() or {}
        except Exception as exc:  # noqa: BLE001 - a warning, never a failed check
            return [f"what the agent's identity may do could not be read ({_one_line(exc)})"]
        if not row.get("reaches"):
            return []
        fix = ("grant-sql --agent-login NAME, run by an admin" if self.target.dialect == "postgres"
               else "grant-sql --app-name NAME (or --agent-login NAME), run by the Entra admin")
        return [f"the agent connects as {row.get('login_name')!r}, which is or can become {row['reaches']}: run as it, "
                "a job that escaped the principal it runs as would hold those rights. Fine for an admin's own "
                f"command; give the agent itself a least-privilege identity: {fix} (docs/deploying.md, "
                "\"What the agent's identity can do\")"]

    # ------------------------------------------------------------ 6. permissions

    def permissions(self) -> str:
        store = self.agent.store()
        now = self.agent.clock()
        worker = f"doctor@{self.agent.settings.agent.worker_id}"[:200]
        try:
            # One transaction: no tick can see (and dispatch) the scratch run, and a failure
            # half-way leaves nothing behind.
            with store.transaction():
                row = store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None,
                                    max_attempts=1, timeout_seconds=1, lease_seconds=1, now=now,
                                    operation_id=new_operation_id()).one()
                if row is None:
                    raise _Failed("insert_task returned no row", "report this: the named query is broken")
                run_id = row["run_id"]
                # The start statement takes the start lock (its rights) and, with no token
                # issued, starts nothing.
                store.execute("start_run", run_id=run_id, token=0, now=now, worker=worker, dequeue_count=1,
                              max_concurrency=1, late_cutoff=now)
                if len(store.execute("cancel_run", run_id=run_id, now=now).rows) != 1:
                    raise _Failed(f"the scratch run {run_id} could not be completed (cancel_run changed no row)")
                run = store.execute("get_run", run_id=run_id).one()
                if run is None or run["status"] != RunStatus.CANCELLED:
                    raise _Failed(f"the scratch run {run_id} reads back as {run and run['status']!r}")
                store.execute("delete_run", run_id=run_id)
                if store.execute("get_run", run_id=run_id).one() is not None:
                    raise _Failed(f"delete_run left the scratch run {run_id} behind")
        except _Failed:
            raise
        except Exception as exc:
            raise _Failed(f"the agent's own queries fail: {_one_line(exc)}", self._grant_fix()) from None
        return "a scratch run was inserted, completed, read back and deleted (runs, attempts)"

    def _grant_fix(self) -> str:
        dialect = self.target.dialect
        if dialect == "mssql":
            return (f"grant the app's database user DML and EXECUTE on schema agent: `{GRANT_SQL}` "
                    "(run it as a Microsoft Entra admin of the server)")
        if dialect == "postgres":
            return ("make the agent's login the owner of schema agent and its objects: `sql-agent grant-sql "
                    "--agent-login <login> --apply`, run by an admin (docs/deploying.md)")
        return "make the SQLite file and its folder writable for this user"

    # ------------------------------------------------------------ 7. queue

    def queue(self) -> str:
        if not self.agent.queue_mode:
            return ("none configured: the local runner's workers claim straight from the runs table "
                    "(set AzureWebJobsStorage for a storage queue)")
        try:
            queue = self.agent.queue
            queue.ensure_exists()
            depth = queue.depth()
        except Exception as exc:
            raise _Failed(f"queue {self.agent.settings.agent.queue_name!r}: {_one_line(exc)}",
                          "check AzureWebJobsStorage (a connection string) or AzureWebJobsStorage__queueServiceUri, "
                          f"and that the identity in use has {QUEUE_ROLE} on the storage account (the function "
                          f"app's identity needs {', '.join(STORAGE_ROLES)})") from None
        return f"{queue.name!r}: {queue!r}, reachable, {depth} message(s) waiting"


    # ------------------------------------------------------------ 8. targets

    def targets(self) -> str:
        """Every valid fleet job's targets, resolved now as a run would (one listing per server
        or pool), each tried once with SELECT 1, PROBE_PARALLELISM at a time."""

        dialect = self.target.dialect
        steps, skipped = [], []
        settings_fleets = [(job.name, fleet_steps(job)) for job in self.agent.settings.jobs]
        # Jobs defined from T-SQL (agent.add_scheduled_job @targets) too, as the engine planned them.
        for name, job_steps in settings_fleets + sorted(database_fleet_jobs(self.agent).items()):
            if not job_steps:
                continue
            problem = dialect_problem([m for s in job_steps for m in s.members], dialect)
            if problem:
                skipped.append(f"job {name}: not checked: {problem}")
                continue
            steps.extend(job_steps)
        if not steps:
            self.notes["targets"] = skipped
            return ("no job has fleet targets (JOB__<name>__TARGETS, agent.add_scheduled_job @targets)" if not skipped else
                    f"no fleet job this control database can run ({len(skipped)} refused, see the lines below)")
        resolution = resolve_fleet(steps, dialect=dialect, control_store=self.agent.store,
                                   target_store=fast_target_store(self.agent), keep_going=True)
        answers = probe_targets(self.target, resolution.targets())
        lines = []
        for key, reason in resolution.listing_errors.items():
            needing = ", ".join(f"job {s.job} step {s.step}" for s in resolution.steps_needing(key))
            lines.append(f"cannot list {listing_text(key)} (for {needing}): {reason}")
        for step in resolution.steps:
            for target in step.targets:
                if answers.get(target) is not None:
                    lines.append(f"job {step.job} step {step.step}: {target_text(target)}: {answers[target]}")
        lines.extend(skipped)
        jobs = len({s.job for s in resolution.steps})
        reachable = sum(1 for answer in answers.values() if answer is None)
        empty = [f"job {s.job} step {s.step}: its targets ({', '.join(m.text() for m in s.members)}) "
                 "resolve to no database now" for s in resolution.steps if not s.targets
                 and not any(k in resolution.listing_errors for k in _needs(s))]
        if resolution.listing_errors or reachable < len(answers):
            down = len(answers) - reachable
            raise _Failed(
                f"{reachable} of {len(answers)} targets of {jobs} fleet job(s) reachable"
                + (f"; {down} unreachable" if down else "")
                + (f"; {len(resolution.listing_errors)} listing(s) failed" if resolution.listing_errors else ""),
                "check that each database exists, accepts connections and has a user for the app "
                f"(`{GRANT_SQL_TARGETS}` prints the scripts)",
                tuple(lines + empty))
        self.notes["targets"] = empty + skipped
        return f"{reachable} targets of {jobs} fleet job(s) reachable"


    # ------------------------------------------------------------ 9. monitor

    def monitor(self) -> str:
        """In Azure, the monitor's HTTP trigger trusts X-MS-CLIENT-PRINCIPAL only because App Service
        Authentication strips that header from client requests and sets it itself: without the
        platform's sign-in, required for every request, anyone could send the header."""
        return monitor_auth_detail(os.environ)


def monitor_auth_detail(env: Mapping[str, str]) -> str:
    """The monitor check on an environment (App Service exposes its authentication settings to
    the app as WEBSITE_AUTH_* variables). Raises _Failed when the monitor is open to a group but
    the platform does not require sign-in."""
    if not env.get("WEBSITE_SITE_NAME"):
        return ("not running in Azure App Service: App Service Authentication does not apply (the local monitor "
                "listens on 127.0.0.1 only and ignores X-MS-CLIENT-PRINCIPAL headers)")
    group = (env.get("AGENT_MONITOR_ALLOWED_GROUP") or "").strip()
    enabled = (env.get("WEBSITE_AUTH_ENABLED") or "").strip().lower() == "true"
    action = (env.get("WEBSITE_AUTH_UNAUTHENTICATED_ACTION") or "").strip()
    if not action and env.get("WEBSITE_AUTH_V2_CONFIG_JSON"):
        try:
            validation = json.loads(env["WEBSITE_AUTH_V2_CONFIG_JSON"]).get("globalValidation") or {}
        except (ValueError, AttributeError):
            validation = {}
        raw = validation.get("unauthenticatedClientAction")
        action = {0: "RedirectToLoginPage", 1: "AllowAnonymous", 2: "Return401", 3: "Return403"}.get(raw, str(raw or ""))
        if validation.get("requireAuthentication") is False and action != "AllowAnonymous":
            action = "AllowAnonymous"
    fix = ("deploy infra/ with monitorEntraClientId and monitorAllowedGroupObjectId (authsettingsV2: sign-in "
           "required, Entra ID only), or clear AGENT_MONITOR_ALLOWED_GROUP to close the monitor")
    if not group:
        return (f"the monitor is closed (AGENT_MONITOR_ALLOWED_GROUP is empty: every request is refused); "
                f"App Service Authentication {'on' if enabled else 'off'}")
    if not enabled:
        raise _Failed("App Service Authentication is off while AGENT_MONITOR_ALLOWED_GROUP opens the monitor: a "
                      "client could send its own X-MS-CLIENT-PRINCIPAL header", fix)
    if action.lower() == "allowanonymous":
        raise _Failed("App Service Authentication is on but not required (unauthenticated requests: AllowAnonymous): "
                      "a request that is not signed in would reach the monitor", fix)
    return (f"App Service Authentication on and required (unauthenticated requests: {action or 'refused'}); "
            f"the monitor admits the group {group}")


# Azure SQL Database's documented worker limits per service objective ("Resource limits for
# single databases using the DTU purchasing model" and "... vCore purchasing model"): the number
# of requests that may run at once; a connection past it that sends a request gets error 10928.
DTU_WORKER_LIMITS = {"Basic": 30, "S0": 60, "S1": 90, "S2": 120, "S3": 200, "S4": 400, "S6": 800, "S7": 1600,
                     "S9": 3200, "S12": 6000, "P1": 200, "P2": 400, "P4": 800, "P6": 1600, "P11": 2800, "P15": 6400}
# vCore service objectives: workers per vCore (serverless GP_S_Gen5_N: 75 N; provisioned General
# Purpose and Hyperscale on standard-series hardware GP_Gen5_N / HS_Gen5_N: 100 N).
VCORE_WORKERS_PER_CORE = {"GP_S_Gen5": 75, "GP_Gen5": 100, "HS_Gen5": 100}


def azure_worker_limit(service_objective: str | None) -> int | None:
    """The documented worker limit of an Azure SQL Database service objective (None: unknown)."""
    name = (service_objective or "").strip()
    if name in DTU_WORKER_LIMITS:
        return DTU_WORKER_LIMITS[name]
    prefix, _, cores = name.rpartition("_")
    if prefix in VCORE_WORKERS_PER_CORE and cores.isdigit():
        return VCORE_WORKERS_PER_CORE[prefix] * int(cores)
    return None


def connection_allowance(row: Mapping[str, Any]) -> tuple[int | None, str]:
    """From the connection_limit row: how many connections the server lets the agent's login
    hold, and why (None when there is no limit to check: SQLite, an unknown tier)."""
    objective = row.get("service_objective")
    if objective:
        workers = azure_worker_limit(objective)
        if workers is None:
            return None, f"service objective {objective}: no documented worker limit known"
        return workers, f"Azure SQL Database {objective}: {workers} concurrent workers"
    if row.get("max_connections") is None:
        return None, "no server limit"
    server = int(row["max_connections"]) - int(row.get("reserved_connections") or 0)
    reasons = [(server, f"max_connections {row['max_connections']}"
                        + (f" less {row['reserved_connections']} reserved" if row.get("reserved_connections") else ""))]
    if row.get("role_limit") is not None and int(row["role_limit"]) >= 0:
        reasons.append((int(row["role_limit"]), f"login {row.get('login_name')} has CONNECTION LIMIT {row['role_limit']}"))
    if row.get("database_limit") is not None and int(row["database_limit"]) >= 0:
        reasons.append((int(row["database_limit"]), f"the database has CONNECTION LIMIT {row['database_limit']}"))
    allowed, why = min(reasons, key=lambda item: item[0])
    if row.get("connections_now") is not None:
        why += f"; {row['connections_now']} client connections open on the server now"
    return allowed, why


def _needs(step: Any) -> list:

    return needs_listing(step.members)


def run_doctor(agent: Any, *, tcp_timeout: float = 10.0, processes: int = 1) -> DoctorReport:
    """Run the checks in order on ``agent`` (a shared.engine.agent.Agent); stop at the first failure.
    ``processes``: how many processes run the agent at once (Functions instances at most:
    maximumInstanceCount; local runners), for the connection budget's warning."""
    doctor = _Doctor(agent, tcp_timeout)
    report = DoctorReport(target=agent.target.display)
    steps: list[tuple[str, Callable[[], str]]] = [(name, getattr(doctor, name)) for name in CHECKS]
    for index, (name, step) in enumerate(steps):
        try:
            detail = step()
        except _Failed as failure:
            report.checks.append(Check(name, False, failure.detail, failure.fix, failure.lines))
            report.checks.extend(Check(rest, None, "not checked (fix the failure above first)")
                                 for rest, _ in steps[index + 1:])
            break
        except Exception as exc:  # a check that crashed is a failed check, never a traceback
            report.checks.append(Check(name, False, f"{type(exc).__name__}: {_one_line(exc)}"))
            report.checks.extend(Check(rest, None, "not checked (fix the failure above first)")
                                 for rest, _ in steps[index + 1:])
            break
        report.checks.append(Check(name, True, detail, lines=tuple(doctor.notes.pop(name, ()))))
        if name == "schema":
            report.warnings = doctor.invalid_jobs() + doctor.connection_budget(processes) + doctor.identity_rights()
    return report


def server_description(version: str) -> str:
    """One line from @@VERSION or version(): Babelfish for PostgreSQL is named as such (it answers
    T-SQL over TDS like SQL Server, but ignores table hints and its applocks are server-wide:
    docs/azure-sql.md), SQL Server and Azure SQL by their first line, PostgreSQL up to its build."""
    lines = [line.strip() for line in version.splitlines() if line.strip()]
    if not lines:
        return "unknown"
    if "babelfish" in version.lower():
        release = re.search(r"\(Babelfish ([0-9][^)]*)\)", version)
        postgres = re.search(r"PostgreSQL ([0-9][0-9.]*)", version)
        return ("Babelfish for PostgreSQL" + (f" {release.group(1)}" if release else "")
                + (f" (PostgreSQL {postgres.group(1)})" if postgres else "")
                + ": T-SQL over TDS; table hints are ignored and applocks are server-wide (see docs/azure-sql.md)")
    return lines[0].split(" on ", 1)[0] if lines[0].startswith("PostgreSQL") else lines[0]


def _unwrap(exc: BaseException) -> BaseException:
    """The driver error inside the engine's ConnectError, for explain_connect_error."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _one_line(exc: BaseException) -> str:

    info = classify(exc)
    code = f" [{info.number or info.sqlstate}]" if (info.number or info.sqlstate) else ""
    return f"{info.message}{code}"


def _is_login_error(exc: BaseException) -> bool:
    """The server was reached and refused the credentials (wrong user, password, role)."""

    records = diagnostic_records(exc)
    if any(r.sqlstate in ("28000", "28P01") or (r.trusted and r.native == 18456) for r in records):
        return True
    text = " ".join(r.text for r in records) or str(exc)
    lowered = text.lower()
    return any(marker in lowered for marker in (
        "password authentication failed", "login failed", "no pg_hba.conf entry",
        "authentication failed")) or ("role \"" in lowered and "does not exist" in lowered)
