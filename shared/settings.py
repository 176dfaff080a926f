"""App settings → typed settings, with validation that names the setting, the value and
what is expected.

Settings come from the process environment (Azure app settings) and, for local runs, from
the ``Values`` object of a ``local.settings.json`` file; environment variables win, as in
the Functions Core Tools. Per-job settings use the double underscore as hierarchy
separator, as Azure app settings do: ``JOB__<name>__<SUFFIX>``.

An invalid engine-wide setting raises :class:`ConfigError` (the agent cannot run at all).
An invalid job setting never raises: the job is reported in ``Settings.invalid_jobs`` and
every other job keeps running (invariant 7).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from shared.errors import ConfigError
from shared.jobs.from_settings import config_hash, parse_jobs, schedule_problem, webhook_secret, webhook_setting
from shared.jobs.model import InvalidJob, JobDefinition
from shared.jobs.schedules import CronSchedule, parse_ncrontab
from shared.jobs.targets import FLEET_SERVERS_SETTING, member_servers, parse_server_list, parse_targets
from shared.telemetry.exporters import parse_exporter
from shared.values import PRINCIPAL_PATTERN, parse_int

QUEUE_ENCODINGS = ("base64", "none")


DEFAULT_TICK_SCHEDULE = "0 */1 * * * *"


@dataclass(frozen=True)
class SettingSpec:
    """One engine-wide app setting. ``azure`` says what the Bicep deployment does with it:
    "required" (it must set it), "optional" (it may), "local" (local runs only; never set
    in Azure)."""

    name: str
    default: str | None
    description: str
    azure: str = "optional"


ENGINE_SETTINGS: tuple[SettingSpec, ...] = (
    SettingSpec("AGENT_DB", "sqlite:///agent.db",
                "Control database: `sqlite:///PATH` (embedded default) or an ODBC connection "
                "string (PostgreSQL, or SQL Server with SQL authentication). Ignored when "
                "AGENT_SQL_SERVER is set.", "optional"),
    SettingSpec("AGENT_SQL_SERVER", None,
                "Azure SQL logical server (`name` or `name.database.windows.net`); with "
                "AGENT_SQL_DATABASE, connects with an Entra ID token.", "required"),
    SettingSpec("AGENT_SQL_DATABASE", None, "Azure SQL database holding the control schema.",
                "required"),
    SettingSpec("AGENT_SQL_CLIENT_ID", None,
                "Client id of a user-assigned managed identity for the SQL token "
                "(system-assigned identity or developer credentials when unset).", "optional"),
    SettingSpec("AGENT_QUEUE_NAME", "agent-tasks",
                "Storage queue the timer dispatches to and the queue trigger reads.", "required"),
    SettingSpec("AGENT_QUEUE_ENCODING", "base64",
                "`base64` or `none`; must equal host.json extensions.queues.messageEncoding.",
                "optional"),
    SettingSpec("AGENT_TICK_SCHEDULE", DEFAULT_TICK_SCHEDULE,
                "Six-field NCRONTAB of the timer trigger (and of the local runner's tick).",
                "required"),
    SettingSpec("AGENT_MAX_DEQUEUE_COUNT", "5",
                "Deliveries after which the app moves a message to the poison table; keep it "
                "at or below host.json maxDequeueCount.", "optional"),
    SettingSpec("AGENT_MAX_CONCURRENCY", "8",
                "Most runs executing at once, whoever starts them (ticks, completions, "
                "submissions, several instances); the rest wait, held, and start as places free.",
                "optional"),
    SettingSpec("AGENT_MAX_CONNECTIONS", "10",
                "Most connections one process (a Functions instance, a local runner, a command) holds "
                "to the control database at once: its workers, tick, notifier and monitor share all "
                "but two, kept for lease renewal and the clock. Opened when there is work, closed "
                "after a minute idle; a refusal by the server (too many clients, 10928/10936) "
                "pauses opening with jitter. Keep it times the processes below the server's limit "
                "(Azure SQL Basic: 30 workers, S0: 60, GP_S_Gen5_1: 75; `doctor --processes N` "
                "checks). From 3.", "optional"),
    SettingSpec("AGENT_POLL_SECONDS", "10",
                "Work inserted behind the agent's back (another process, the T-SQL procedures) "
                "starts within this many seconds: the local runner's idle workers look this "
                "often (with a storage queue they poll it as the Functions host does instead, "
                "backing off up to host.json's maxPollingInterval); in Azure each tick leaves a "
                "chain of delayed doorbell messages this far apart.", "optional"),
    SettingSpec("AGENT_LOOKAHEAD_MARGIN_SECONDS", "30",
                "Each tick claims every slot up to the next tick plus this margin, and sends "
                "each one's message delayed until its slot.", "optional"),
    SettingSpec("AGENT_QUIET_MAX_MINUTES", "0",
                "Quiet ticks (docs/cost.md): 0 (off) or 1-1440. When on, a timer tick does not connect to "
                "the control database while nothing can be due; work submitted from T-SQL then waits at "
                "most this many minutes.", "optional"),
    SettingSpec("AGENT_MAX_LAPSES", "3",
                "Lease lapses a run survives (its worker died or lost the database); they do not "
                "spend MAX_ATTEMPTS. One more lapse ends the run failed.", "optional"),
    SettingSpec("AGENT_JOB_PRINCIPAL", None,
                "The database principal jobs run as (SQL Server: a user the app impersonates with "
                "EXECUTE AS USER; PostgreSQL: a role it SETs): one without rights on schema agent, "
                "so a job cannot rewrite the agent's bookkeeping. grant-sql creates it. Unset: jobs "
                "run as the agent itself.", "optional"),
    SettingSpec("AGENT_FLEET_SERVERS", None,
                "Servers (besides the control database's own) that fleet targets may name: a comma "
                "list, spelled as targets spell them (myserver.database.windows.net, 10.0.0.5:5432, "
                "tcp:host,1433). The agent reaches them with its own credentials (its identity's "
                "token, its login's password), so a target naming any other server is refused "
                "before a connection is opened. Servers the settings' own jobs name are allowed "
                "too; this setting is for jobs operators define (agent.add_scheduled_job "
                "@targets, the monitor's job form).", "optional"),
    SettingSpec("AGENT_CONNECT_RETRY_SECONDS", "90",
                "How long connecting to a database keeps retrying transient errors (a paused "
                "serverless database takes up to a minute to resume), each wait at least as long "
                "as the error asks for.", "optional"),
    SettingSpec("AGENT_MAX_CLOCK_SKEW_SECONDS", "300",
                "The agent's time is the control database's clock (read at every tick and at least every "
                "minute, carried forward by the monotonic clock), never the instance's. A tick at a time "
                "further from it than this, either way (`tick --now`), changes nothing: it says so in one "
                "line, emits ClockSkewDetected and exits non-zero; state a clock that far ahead left behind "
                "is undone by the next tick.",
                "optional"),
    SettingSpec("AGENT_HISTORY_RETENTION_DAYS", "45",
                "Finished runs (with their attempts) and job events older than this many days are "
                "purged by the ticks, a bounded batch per tick (the latest run of each job always "
                "stays); 0 keeps them forever. Elastic Jobs keeps 45 days.", "optional"),
    SettingSpec("AGENT_POISON_RETENTION_DAYS", "180",
                "Poison messages older than this many days are purged by the ticks; a run with a "
                "poison message not yet requeued is kept as long as the message. 0 keeps them "
                "forever.", "optional"),
    SettingSpec("AGENT_DISPATCH_LEASE_SECONDS", "300",
                "How long a dispatched run may wait on the queue before a tick presumes the "
                "message lost and dispatches it again (with a new token).", "optional"),
    SettingSpec("AGENT_MISFIRE_THRESHOLD_SECONDS", "120",
                "A slot that has not started this long after its time counts as a misfire.", "optional"),
    SettingSpec("AGENT_RETRY_BACKOFF_SECONDS", "30",
                "First retry delay after a failed attempt; doubles per attempt, capped at 1 h.",
                "optional"),
    # The monitor's (issue 17): read by shared/web/app.py alone, at each request, so a bad value
    # breaks the monitor's pages (naming the setting), never the scheduler or the executor.
    SettingSpec("AGENT_MONITOR_REFRESH_SECONDS", "30",
                "The Job Activity Monitor's pages reload themselves this often (a meta refresh); "
                "`0`: never.", "optional"),
    SettingSpec("AGENT_MONITOR_ALLOWED_GROUP", None,
                "Object id of the Entra group whose members may open the monitor in Azure (the "
                "Bicep's monitorAllowedGroupObjectId); empty: the monitor refuses everyone.",
                "required"),
    SettingSpec("AGENT_MONITOR_OPERATOR_GROUP", None,
                "Object id of the Entra group whose members may also act from the monitor in Azure "
                "(start, stop, pause, resume, cancel, requeue; the Bicep's monitorOperatorGroupObjectId); "
                "empty: nobody acts.", "optional"),
    SettingSpec("AGENT_STEP_OUTPUT_MAX_BYTES", "65536",
                "Most bytes of a step attempt's output (messages such as PRINT, RAISERROR below 11 "
                "and PostgreSQL notices, and rows affected) kept in the history; longer output is "
                "cut, with a note saying so.", "optional"),
    SettingSpec("AGENT_NOTIFY_WEBHOOK_URL", None,
                "Where run outcomes are POSTed as JSON (per JOB__<name>__NOTIFY); HTTPS, or HTTP on "
                "loopback only. Unset: no webhook (Azure Monitor alerts still fire).", "optional"),
    SettingSpec("AGENT_NOTIFY_WEBHOOK_SECRET", None,
                "The Standard Webhooks signing secret ('whsec_' and base64 of 24 to 64 random bytes): every "
                "notification carries webhook-id, webhook-timestamp and webhook-signature (HMAC-SHA256) "
                "headers a receiver checks. In Azure a Key Vault reference. Unset: notifications unsigned.",
                "optional"),
    SettingSpec("AzureWebJobsStorage", None,
                "Storage connection string (locally `UseDevelopmentStorage=true` for Azurite). "
                "Unset with no queueServiceUri: no queue; the local runner's workers claim straight from the runs table.", "local"),
    SettingSpec("AzureWebJobsStorage__queueServiceUri", None,
                "Identity-based queue endpoint `https://<account>.queue.core.windows.net`.",
                "required"),
    SettingSpec("AzureWebJobsStorage__credential", None,
                "`managedidentity` for identity-based connections.", "required"),
    SettingSpec("AzureWebJobsStorage__clientId", None,
                "Client id of a user-assigned identity for the storage connection.", "optional"),
    SettingSpec("APPLICATIONINSIGHTS_CONNECTION_STRING", None,
                "Application Insights connection string; telemetry is off when unset.", "required"),
    SettingSpec("APPLICATIONINSIGHTS_AUTHENTICATION_STRING", None,
                "`Authorization=AAD` (optionally `;ClientId=<guid>` of a user-assigned identity): "
                "telemetry ingestion with an Entra ID token (the managed identity needs Monitoring "
                "Metrics Publisher), so the Application Insights resource can disable local auth.",
                "optional"),
    SettingSpec("AGENT_TELEMETRY_EXPORTER", "opentelemetry",
                "`opentelemetry` (azure-monitor-opentelemetry-exporter) or `opencensus` (the retired "
                "opencensus-ext-azure); both write customEvents, customMetrics and dependencies.",
                "optional"),
)


def app_setting_names() -> tuple[str, ...]:
    return tuple(spec.name for spec in ENGINE_SETTINGS)


@dataclass(frozen=True)
class AgentSettings:
    db: str
    sql_server: str | None
    sql_database: str | None
    sql_client_id: str | None
    queue_name: str
    queue_encoding: str
    tick_schedule: str
    max_dequeue_count: int
    max_concurrency: int
    poll_seconds: int
    lookahead_margin_seconds: int
    max_lapses: int
    max_clock_skew_seconds: int
    connect_retry_seconds: int
    job_principal: str | None
    history_retention_days: int
    poison_retention_days: int
    dispatch_lease_seconds: int
    misfire_threshold_seconds: int
    retry_backoff_seconds: int
    step_output_max_bytes: int
    notify_webhook_url: str | None
    notify_webhook_secret: bytes | None
    storage_connection: str | None
    storage_queue_service_uri: str | None
    storage_client_id: str | None
    appinsights_connection_string: str | None
    worker_id: str
    appinsights_authentication_string: str | None = None
    telemetry_exporter: str = "opentelemetry"
    max_connections: int = 10
    quiet_max_minutes: int = 0
    # The servers fleet targets may name (as written): AGENT_FLEET_SERVERS, and those the settings'
    # own valid jobs name (load_settings adds them).
    fleet_servers: tuple[str, ...] = ()
    job_servers: tuple[str, ...] = ()

    @property
    def uses_azure_queue(self) -> bool:
        return bool(self.storage_connection or self.storage_queue_service_uri)


@dataclass(frozen=True)
class Settings:
    agent: AgentSettings
    jobs: tuple[JobDefinition, ...] = ()
    invalid_jobs: tuple[InvalidJob, ...] = ()
    config_hash: str = field(default="")
    # Condition alerts (ALERT__<name>__*, shared/engine/condition_alerts.py), synced with the jobs.
    alerts: tuple[Any, ...] = ()
    invalid_alerts: tuple[Any, ...] = ()

    def job(self, name: str) -> JobDefinition | None:
        return next((job for job in self.jobs if job.name == name), None)


def _settings_text(data: bytes) -> str:
    """The file's text as the Functions host reads it (.NET: a byte order mark says UTF-8 or UTF-16,
    none means UTF-8). Notepad's "Unicode" is UTF-16 with one."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8")
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    return data.decode("utf-8")


def read_local_settings(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``Values`` object of a local.settings.json file, as strings."""
    file = Path(path)
    try:
        document = json.loads(_settings_text(file.read_bytes()))
    except FileNotFoundError:
        raise ConfigError("--settings", str(path), "an existing local.settings.json file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("--settings", str(path), "a JSON file in UTF-8, or in UTF-8 or UTF-16 with a byte order "
                                                   f"mark, as the Functions host reads it (byte {exc.start}: {exc.reason})"
                          ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("--settings", str(path), f"a readable JSON file ({exc})") from None
    values = document.get("Values") if isinstance(document, dict) else None
    if not isinstance(values, dict):
        raise ConfigError("--settings", str(path), 'a JSON object with a "Values" object')
    result: dict[str, str] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{path}: Values.{key}", value, "a string, number or boolean")
        result[str(key)] = str(value)
    return result


def merged_environment(settings_file: str | None = None,
                       environ: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if environ is None else environ)
    if settings_file:
        values = read_local_settings(settings_file)
        values.update(env)  # environment variables win, as with the Core Tools
        env = values
    return env


def load_settings(environ: Mapping[str, str] | None = None, *,
                  settings_file: str | None = None) -> Settings:
    env = merged_environment(settings_file, environ)
    agent = _parse_agent(env)
    # Parsing 10,000 jobs allocates a few hundred thousand small objects and no reference cycle:
    # the cyclic collector, run every 700 allocations, would walk the growing heap again and
    # again (measured: more than half of a cold parse). Reference counting frees them as usual.
    collecting = gc.isenabled()
    gc.disable()
    try:
        jobs, invalid = parse_jobs(env)
        hashed = config_hash(jobs, invalid)
    finally:
        if collecting:
            gc.enable()
    agent = replace(agent, job_servers=_job_servers(jobs))
    from shared.jobs.alert_definitions import alerts_hash, parse_alerts

    alerts, invalid_alerts = parse_alerts(env)
    alerts_digest = alerts_hash(alerts, invalid_alerts)
    if alerts_digest:   # settings without alerts keep the hash they had
        hashed = hashlib.sha256(f"{hashed}|{alerts_digest}".encode()).hexdigest()
    return Settings(agent=agent, jobs=jobs, invalid_jobs=invalid, config_hash=hashed, alerts=alerts,
                    invalid_alerts=invalid_alerts)


def _job_servers(jobs: tuple[JobDefinition, ...]) -> tuple[str, ...]:
    """The servers the settings' valid jobs name in their targets: the deployer wrote them, so
    the agent's credentials may go there, as to AGENT_FLEET_SERVERS (and nowhere else)."""
    named: set[str] = set()
    for job in jobs:
        for step in job.steps:
            if step.targets:
                named |= member_servers(parse_targets("TARGETS", step.targets))
    return tuple(sorted(named))


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        spec = next((s for s in ENGINE_SETTINGS if s.name == name), None)
        return spec.default if spec else None
    return value.strip()


def _int_setting(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = _get(env, name)
    return parse_int(name, raw, low, high)


def _fleet_server_setting(env: Mapping[str, str]) -> tuple[str, ...]:
    return parse_server_list(FLEET_SERVERS_SETTING, _get(env, FLEET_SERVERS_SETTING))


def _parse_agent(env: Mapping[str, str]) -> AgentSettings:
    tick = _get(env, "AGENT_TICK_SCHEDULE") or DEFAULT_TICK_SCHEDULE
    try:
        expression = parse_ncrontab(tick)
    except ValueError as exc:
        raise ConfigError("AGENT_TICK_SCHEDULE", tick, f"a six-field NCRONTAB expression ({exc})") from None
    # Croniter takes day 30 of February; the tick would then never come, and no job with it.
    never = schedule_problem(CronSchedule(expression=expression, timezone="UTC"))
    if never is not None:
        raise ConfigError("AGENT_TICK_SCHEDULE", tick,
                          f"a six-field NCRONTAB expression {never.removeprefix('a schedule ')}")
    encoding = (_get(env, "AGENT_QUEUE_ENCODING") or "base64").lower()
    if encoding not in QUEUE_ENCODINGS:
        raise ConfigError("AGENT_QUEUE_ENCODING", encoding, "base64 or none (as host.json messageEncoding)")
    queue_name = _get(env, "AGENT_QUEUE_NAME") or "agent-tasks"
    # Azure Storage queue names: 3-63 chars, lowercase letters, digits and single hyphens.
    if not re.fullmatch(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,55}", queue_name):
        raise ConfigError("AGENT_QUEUE_NAME", queue_name,
                          "3-56 lowercase letters, digits and single hyphens (an Azure Storage queue name; 56 leaves room for the -poison queue)")
    sql_server = _get(env, "AGENT_SQL_SERVER")
    sql_database = _get(env, "AGENT_SQL_DATABASE")
    if bool(sql_server) != bool(sql_database):
        missing = "AGENT_SQL_DATABASE" if sql_server else "AGENT_SQL_SERVER"
        raise ConfigError(missing, None, "set together with "
                          + ("AGENT_SQL_SERVER" if sql_server else "AGENT_SQL_DATABASE"))
    db = _get(env, "AGENT_DB") or "sqlite:///agent.db"
    # Recorded on runs and attempts: which instance and process held the lease.
    worker = f"{socket.gethostname()}:{os.getpid()}"
    return AgentSettings(
        db=db,
        sql_server=sql_server,
        sql_database=sql_database,
        sql_client_id=_get(env, "AGENT_SQL_CLIENT_ID"),
        queue_name=queue_name,
        queue_encoding=encoding,
        tick_schedule=tick,
        max_dequeue_count=_int_setting(env, "AGENT_MAX_DEQUEUE_COUNT", 1, 100),
        max_concurrency=_int_setting(env, "AGENT_MAX_CONCURRENCY", 1, 10000),
        poll_seconds=_int_setting(env, "AGENT_POLL_SECONDS", 1, 300),
        max_connections=_int_setting(env, "AGENT_MAX_CONNECTIONS", 3, 10000),
        fleet_servers=_fleet_server_setting(env),
        lookahead_margin_seconds=_int_setting(env, "AGENT_LOOKAHEAD_MARGIN_SECONDS", 0, 3600),
        max_lapses=_int_setting(env, "AGENT_MAX_LAPSES", 1, 100),
        max_clock_skew_seconds=_int_setting(env, "AGENT_MAX_CLOCK_SKEW_SECONDS", 5, 86400),
        connect_retry_seconds=_int_setting(env, "AGENT_CONNECT_RETRY_SECONDS", 0, 3600),
        job_principal=_principal_setting(env),
        history_retention_days=_int_setting(env, "AGENT_HISTORY_RETENTION_DAYS", 0, 36500),
        poison_retention_days=_int_setting(env, "AGENT_POISON_RETENTION_DAYS", 0, 36500),
        dispatch_lease_seconds=_int_setting(env, "AGENT_DISPATCH_LEASE_SECONDS", 10, 86400),
        misfire_threshold_seconds=_int_setting(env, "AGENT_MISFIRE_THRESHOLD_SECONDS", 1, 86400),
        retry_backoff_seconds=_int_setting(env, "AGENT_RETRY_BACKOFF_SECONDS", 0, 86400),
        step_output_max_bytes=_int_setting(env, "AGENT_STEP_OUTPUT_MAX_BYTES", 0, 16 * 1024 * 1024),
        notify_webhook_url=webhook_setting("AGENT_NOTIFY_WEBHOOK_URL", _get(env, "AGENT_NOTIFY_WEBHOOK_URL")),
        notify_webhook_secret=webhook_secret("AGENT_NOTIFY_WEBHOOK_SECRET", _get(env, "AGENT_NOTIFY_WEBHOOK_SECRET")),
        storage_connection=_get(env, "AzureWebJobsStorage"),
        storage_queue_service_uri=_get(env, "AzureWebJobsStorage__queueServiceUri"),
        storage_client_id=_get(env, "AzureWebJobsStorage__clientId"),
        appinsights_connection_string=_get(env, "APPLICATIONINSIGHTS_CONNECTION_STRING"),
        worker_id=worker,
        appinsights_authentication_string=_get(env, "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"),
        telemetry_exporter=_telemetry_exporter(_get(env, "AGENT_TELEMETRY_EXPORTER")),
        quiet_max_minutes=_int_setting(env, "AGENT_QUIET_MAX_MINUTES", 0, 1440),
    )


def _telemetry_exporter(value: str | None) -> str:
    return parse_exporter(value)


def _principal_setting(env: Mapping[str, str]) -> str | None:
    value = _get(env, "AGENT_JOB_PRINCIPAL")
    if value is not None and not PRINCIPAL_PATTERN.match(value):
        raise ConfigError("AGENT_JOB_PRINCIPAL", value, "a database user or role name: a letter or '_', then up to "
                          "127 letters, digits, '_', '.' or '-'")
    return value
