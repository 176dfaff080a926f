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

import dataclasses
import gc
import hashlib
import json
import operator
import os
import re
import socket
from dataclasses import dataclass, field
from enum import Enum
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Mapping

from shared.errors import ConfigError
from shared.telemetry.exporters import parse_exporter
from shared.jobs.schedules import parse_ncrontab, parse_schedule, validate_timezone
from shared.jobs.targets import DEFAULT_PARALLELISM, MAX_PARALLELISM, describe_members, parse_targets

JOB_SETTING_PREFIX = "JOB__"
JOB_SETTING_SUFFIXES = (
    "SCHEDULE",
    "COMMAND",
    "TIMEZONE",
    "ENABLED",
    "MAX_ATTEMPTS",
    "TIMEOUT_SECONDS",
    "LEASE_SECONDS",
    "MISFIRE",
    "GRACE_SECONDS",
    "OVERLAP",
    "DATABASE",
    "NOTIFY",
    "NOTIFY_WEBHOOK_URL",
    "TARGETS",
    "TARGET_PARALLELISM",
    "AFTER",
    "AFTER_OUTCOME",
)
# JOB__<name>__STEPS__<n>__<SUFFIX>: one step of a multi-step job (SQL Agent's job steps).
STEP_SETTING_SUFFIXES = (
    "COMMAND",
    "DATABASE",
    "MAX_ATTEMPTS",
    "RETRY_INTERVAL_SECONDS",
    "TIMEOUT_SECONDS",
    "ON_SUCCESS",
    "ON_FAILURE",
    "TARGETS",
    "TARGET_PARALLELISM",
)
STEP_SETTING_PATTERN = re.compile(r"^(?P<name>.+?)__STEPS__(?P<number>[^_]*)__(?P<suffix>[A-Za-z_]+)$", re.IGNORECASE)
MAX_STEPS = 100
NOTIFY_POLICIES = ("on_failure", "on_success", "on_completion", "never")
JOB_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
DATABASE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_\-]{1,128}$")
# Column sizes of agent.jobs (every dialect): a longer value is refused at validation.
MAX_SCHEDULE_LENGTH = 400
# A schedule must have a slot within this many years of now, or it never runs (e.g. 30 February).
SCHEDULE_HORIZON_YEARS = 50
_SCHEDULE_HORIZON = timedelta(days=366 * SCHEDULE_HORIZON_YEARS)
MISFIRE_POLICIES = ("run-once", "skip")
OVERLAP_POLICIES = ("skip", "queue", "allow")
QUEUE_ENCODINGS = ("base64", "none")
DEFAULT_TICK_SCHEDULE = "0 */1 * * * *"


class AfterOutcome(str, Enum):
    """JOB__<name>__AFTER_OUTCOME: which ends of a run of the job it follows start a run of this
    one (SQL Agent's on-success / on-failure / either). A run ends succeeded, or failed (poisoned
    counts as failed: its SQL never completed); a skipped slot or a cancelled (stopped) run did
    not run to an end, and starts nothing."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    COMPLETED = "completed"

    def __repr__(self) -> str:   # the config hash reprs every field: the value, stable across versions
        return repr(self.value)


AFTER_OUTCOMES = tuple(outcome.value for outcome in AfterOutcome)


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
    SettingSpec("AGENT_MAX_LAPSES", "3",
                "Lease lapses a run survives (its worker died or lost the database); they do not "
                "spend MAX_ATTEMPTS. One more lapse ends the run failed.", "optional"),
    SettingSpec("AGENT_JOB_PRINCIPAL", None,
                "The database principal jobs run as (SQL Server: a user the app impersonates with "
                "EXECUTE AS USER; PostgreSQL: a role it SETs): one without rights on schema agent, "
                "so a job cannot rewrite the agent's bookkeeping. grant-sql creates it. Unset: jobs "
                "run as the agent itself.", "optional"),
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
    # The monitor's (issue 17): read by shared/web/monitor.py alone, at each request, so a bad value
    # breaks the monitor's pages (naming the setting), never the scheduler or the executor.
    SettingSpec("AGENT_MONITOR_REFRESH_SECONDS", "30",
                "The Job Activity Monitor's pages reload themselves this often (a meta refresh); "
                "`0`: never.", "optional"),
    SettingSpec("AGENT_MONITOR_ALLOWED_GROUP", None,
                "Object id of the Entra group whose members may open the monitor in Azure (the "
                "Bicep's monitorAllowedGroupObjectId); empty: the monitor refuses everyone.",
                "required"),
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

# Per-job defaults, used by the README table and by parsing.
JOB_DEFAULTS: Mapping[str, str] = {
    "TIMEZONE": "UTC",
    "ENABLED": "true",
    "MAX_ATTEMPTS": "3",
    "TIMEOUT_SECONDS": "1800",
    "LEASE_SECONDS": "60",
    "MISFIRE": "run-once",
    "GRACE_SECONDS": "86400",
    "OVERLAP": "skip",
    "NOTIFY": "on_failure",
}


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

    @property
    def uses_azure_queue(self) -> bool:
        return bool(self.storage_connection or self.storage_queue_service_uri)


@dataclass(frozen=True)
class StepDefinition:
    """One step of a job. ``on_success`` / ``on_failure`` are resolved: ``quit_success``,
    ``quit_failure`` or ``goto:<n>`` (a ``next`` becomes the goto of the following step, or
    the quit SQL Agent takes after the last step)."""

    step: int
    command: str
    database: str | None
    max_attempts: int
    retry_interval_seconds: int | None
    timeout_seconds: int
    on_success: str
    on_failure: str
    # A fleet step (shared/jobs/targets.py): its TARGETS as normalised members, and how many of one
    # run's target executions run at once. None: the step runs in one database.
    targets: str | None = None
    target_parallelism: int = 8

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class JobDefinition:
    name: str
    schedule: str
    command: str
    timezone: str = "UTC"
    enabled: bool = True
    max_attempts: int = 3
    timeout_seconds: int = 1800
    lease_seconds: int = 60
    misfire: str = "run-once"
    grace_seconds: int = 86400
    overlap: str = "skip"
    database: str | None = None
    # Several steps (JOB__<name>__STEPS__<n>__*); empty: a one-step job running COMMAND.
    steps: tuple[StepDefinition, ...] = ()
    notify: str = "on_failure"
    notify_webhook_url: str | None = None
    # JOB__<name>__TARGETS of a one-step fleet job (held as its one step's targets too).
    targets: str | None = None
    # JOB__<name>__AFTER: the job a run of which, ending with AFTER_OUTCOME, starts a run of this
    # one (in the transaction that ends it). None: this job follows no job.
    after: str | None = None
    after_outcome: AfterOutcome = AfterOutcome.SUCCEEDED

    def steps_json(self) -> str | None:
        """What agent.jobs.steps holds: None for a one-step job (today's rows, unchanged)."""
        return json.dumps([step.to_json() for step in self.steps]) if self.steps else None

    def schedule_object(self):
        return parse_schedule(self.schedule, self.timezone)


@dataclass(frozen=True)
class InvalidJob:
    """A job whose settings do not parse. It is recorded (jobs output, history) and skipped;
    the other jobs run. ``key`` is the name it is recorded under: its own name when the
    database can hold it, else a unique, storable stand-in (the error names the real one)."""

    name: str
    errors: tuple[str, ...]
    key: str = ""

    @property
    def message(self) -> str:
        return "; ".join(self.errors)


@dataclass(frozen=True)
class Settings:
    agent: AgentSettings
    jobs: tuple[JobDefinition, ...] = ()
    invalid_jobs: tuple[InvalidJob, ...] = ()
    config_hash: str = field(default="")

    def job(self, name: str) -> JobDefinition | None:
        return next((job for job in self.jobs if job.name == name), None)


# ---------------------------------------------------------------- loading


def read_local_settings(path: str | os.PathLike[str]) -> dict[str, str]:
    """The ``Values`` object of a local.settings.json file, as strings."""
    file = Path(path)
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError("--settings", str(path), "an existing local.settings.json file") from None
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
        config_hash = _config_hash(jobs, invalid)
    finally:
        if collecting:
            gc.enable()
    return Settings(agent=agent, jobs=jobs, invalid_jobs=invalid, config_hash=config_hash)


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        spec = next((s for s in ENGINE_SETTINGS if s.name == name), None)
        return spec.default if spec else None
    return value.strip()


def _int_setting(env: Mapping[str, str], name: str, low: int, high: int) -> int:
    raw = _get(env, name)
    return parse_int(name, raw, low, high)


def parse_int(setting: str, raw: str | None, low: int, high: int) -> int:
    try:
        value = int(str(raw).strip())
    except (TypeError, ValueError):
        raise ConfigError(setting, raw, f"a whole number from {low} to {high}") from None
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


def _parse_agent(env: Mapping[str, str]) -> AgentSettings:
    tick = _get(env, "AGENT_TICK_SCHEDULE") or DEFAULT_TICK_SCHEDULE
    try:
        parse_ncrontab(tick)
    except ValueError as exc:
        raise ConfigError("AGENT_TICK_SCHEDULE", tick, f"a six-field NCRONTAB expression ({exc})") from None
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
        notify_webhook_url=_webhook_setting("AGENT_NOTIFY_WEBHOOK_URL", _get(env, "AGENT_NOTIFY_WEBHOOK_URL")),
        notify_webhook_secret=_webhook_secret("AGENT_NOTIFY_WEBHOOK_SECRET", _get(env, "AGENT_NOTIFY_WEBHOOK_SECRET")),
        storage_connection=_get(env, "AzureWebJobsStorage"),
        storage_queue_service_uri=_get(env, "AzureWebJobsStorage__queueServiceUri"),
        storage_client_id=_get(env, "AzureWebJobsStorage__clientId"),
        appinsights_connection_string=_get(env, "APPLICATIONINSIGHTS_CONNECTION_STRING"),
        worker_id=worker,
        appinsights_authentication_string=_get(env, "APPLICATIONINSIGHTS_AUTHENTICATION_STRING"),
        telemetry_exporter=_telemetry_exporter(_get(env, "AGENT_TELEMETRY_EXPORTER")),
    )


def _telemetry_exporter(value: str | None) -> str:
    return parse_exporter(value)


PRINCIPAL_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")


def _principal_setting(env: Mapping[str, str]) -> str | None:
    value = _get(env, "AGENT_JOB_PRINCIPAL")
    if value is not None and not PRINCIPAL_PATTERN.match(value):
        raise ConfigError("AGENT_JOB_PRINCIPAL", value, "a database user or role name: a letter or '_', then up to "
                          "127 letters, digits, '_', '.' or '-'")
    return value


def parse_jobs(env: Mapping[str, str]) -> tuple[tuple[JobDefinition, ...], tuple[InvalidJob, ...]]:
    """Group ``JOB__<name>__<SUFFIX>`` settings by job and validate each job on its own."""
    raw: dict[str, dict[str, tuple[str, str]]] = {}
    stray: dict[str, list[str]] = {}
    prefix = len(JOB_SETTING_PREFIX)
    for key, value in env.items():
        if key[:prefix].upper() != JOB_SETTING_PREFIX:
            continue
        rest = key[len(JOB_SETTING_PREFIX):]
        # The step pattern only for a key that can be one (a regex per key is most of this loop).
        step = STEP_SETTING_PATTERN.match(rest) if "__steps__" in rest.lower() else None
        if step:
            raw.setdefault(step["name"], {})[f"STEPS__{step['number']}__{step['suffix'].upper()}"] = (key, value)
            continue
        name, sep, suffix = rest.rpartition("__")
        if not sep or not name:
            stray.setdefault(rest or key, []).append(
                f"{key}: expected JOB__<name>__<SETTING> with SETTING one of {', '.join(JOB_SETTING_SUFFIXES)}")
            continue
        raw.setdefault(name, {})[suffix.upper()] = (key, value)
    parsed: list[tuple[str, str, JobDefinition | None, list[str]]] = []
    # One verdict per distinct (schedule, time zone) for this parse: 10,000 jobs share a few
    # dozen schedules.
    verdicts: dict[tuple[str, str], str | None] = {}
    # Azure SQL compares names case-insensitively (its default collation): 'Backup' and 'backup'
    # would be one key there. Such names are refused on every dialect, so all behave alike.
    by_fold: dict[str, list[str]] = {}
    for name in sorted(raw.keys() | stray.keys()):
        errors = list(stray[name]) if name in stray else []
        job = _parse_job(name, raw.get(name, {}), errors, verdicts)
        folded = name.casefold()
        parsed.append((name, folded, job, errors))
        by_fold.setdefault(folded, []).append(name)
    _check_followers(parsed)
    valid: list[JobDefinition] = []
    invalid: list[InvalidJob] = []
    taken: set[str] = set()
    for name, folded, job, errors in parsed:
        same = by_fold[folded]
        twins = [other for other in same if other != name] if len(same) > 1 else ()
        if twins:
            errors.append(f"{JOB_SETTING_PREFIX}{_printable(name)}__*: job name {_printable(name)!r} differs only by "
                          f"case from {', '.join(repr(_printable(t)) for t in twins)}; job names are compared "
                          "case-insensitively (as Azure SQL does): rename one of them")
        if errors or job is None:
            invalid.append(InvalidJob(name=name, errors=tuple(errors), key=_storage_key(name, taken)))
        else:
            taken.add(folded)
            valid.append(job)
    return tuple(valid), tuple(invalid)


def _check_followers(parsed: list[tuple[str, str, JobDefinition | None, list[str]]]) -> None:
    """JOB__<name>__AFTER over all jobs of the settings: it names a job of these settings (valid
    or not: a job whose settings are wrong still exists, and its runs start this one once it is
    fixed), written as that job's name is; and no job follows itself, directly or through
    others (a cycle would run forever once started). Every job of a cycle gets the error naming
    the whole cycle; the jobs that follow into a cycle keep running (their AFTER names a job).
    A job of the settings follows jobs of the settings only: the settings are checked as a
    whole here, without the database (a job defined with agent.add_scheduled_job may follow
    either kind; the procedure checks it against the database)."""
    names = {folded: name for name, folded, _, _ in parsed}
    follows: dict[str, str] = {}
    for name, _, job, errors in parsed:
        if job is None or job.after is None:
            continue
        leader = names.get(job.after.casefold())
        if leader is None:
            errors.append(str(ConfigError(f"{JOB_SETTING_PREFIX}{name}__AFTER", job.after,
                                          "the name of another job of these settings (a job from the settings "
                                          "follows jobs from the settings; a job defined with "
                                          "agent.add_scheduled_job @after can follow either)")))
        elif leader != job.after:
            errors.append(str(ConfigError(f"{JOB_SETTING_PREFIX}{name}__AFTER", job.after,
                                          f"the job's name as it is written: {leader!r}")))
        else:
            follows[name] = leader
    # Each job follows at most one: walking from every job finds each cycle once, in order.
    in_cycle: dict[str, list[str]] = {}
    done: set[str] = set()
    for start in follows:
        path: list[str] = []
        position: dict[str, int] = {}
        current: str | None = start
        while current is not None and current not in done and current not in position:
            position[current] = len(path)
            path.append(current)
            current = follows.get(current)
        if current is not None and current in position:
            cycle = path[position[current]:]
            for member in cycle:
                in_cycle[member] = cycle
        done.update(path)
    for name, _, job, errors in parsed:
        cycle = in_cycle.get(name)
        if cycle is None:
            continue
        order = cycle[::-1]        # the order runs start each other in: a job's run starts its follower
        at = order.index(name)
        shown = " -> ".join(order[at:] + order[:at] + [name])
        errors.append(f"{JOB_SETTING_PREFIX}{name}__AFTER={follows[name]!r}: a cycle of jobs that follow each other "
                      f"({shown}: a run of each would start the next, forever); expected a chain that ends: remove "
                      "AFTER from one of them")


def _storage_key(name: str, taken: set[str]) -> str:
    """The name an invalid job is recorded under: unique (case-insensitively) and storable."""
    key = name
    if not JOB_NAME_PATTERN.match(name) or name.casefold() in taken:
        digest = hashlib.sha1(name.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
        key = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:40] or 'job'}~{digest}"
    taken.add(key.casefold())
    return key


def _printable(text: str, limit: int = 80) -> str:
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


# Job settings that were not set (or set blank) take JOB_DEFAULTS, parsed and validated once per
# process here, not once per job: most jobs set two or three of their settings, and parsing
# every default again for each of 10,000 jobs was most of a tick's settings cost. A job's own
# value is validated exactly as before.
_DEFAULT_INTS: dict[str, int] = {suffix: int(raw) for suffix, raw in JOB_DEFAULTS.items()
                                 if suffix.endswith(("_ATTEMPTS", "_SECONDS")) and raw.strip().isdigit()}
_DEFAULT_ENABLED = parse_bool("JOB__<name>__ENABLED", JOB_DEFAULTS.get("ENABLED") or "true")
_DEFAULT_TIMEZONE = JOB_DEFAULTS.get("TIMEZONE") or "UTC"
_JOB_SUFFIXES = frozenset(JOB_SETTING_SUFFIXES)
_PLAIN_SUFFIXES = frozenset({"SCHEDULE", "COMMAND", "TIMEZONE"})


def _plain_defaults() -> tuple | None:
    """Every field but name, schedule, command and time zone of a job that sets nothing else,
    in _parse_job's order; None when a default would need a job's own validation (then every
    job takes the general path)."""
    if {"DATABASE", "NOTIFY_WEBHOOK_URL", "TARGETS", "TARGET_PARALLELISM"} & JOB_DEFAULTS.keys():
        return None
    try:
        ints = [_DEFAULT_INTS[s] for s in ("MAX_ATTEMPTS", "TIMEOUT_SECONDS", "LEASE_SECONDS", "GRACE_SECONDS")]
    except KeyError:
        return None
    choices = [(JOB_DEFAULTS.get(s), options) for s, options in
               (("MISFIRE", MISFIRE_POLICIES), ("OVERLAP", OVERLAP_POLICIES), ("NOTIFY", NOTIFY_POLICIES))]
    if any(value not in options for value, options in choices):
        return None
    misfire, overlap, notify = (value for value, _ in choices)
    return (_DEFAULT_ENABLED, ints[0], ints[1], ints[2], misfire, ints[3], overlap, None, notify, None, None,
            DEFAULT_PARALLELISM)


_PLAIN_DEFAULTS = _plain_defaults()
_STEP_SUFFIXES = frozenset(STEP_SETTING_SUFFIXES)


def _parse_job(name: str, values: dict[str, tuple[str, str]], errors: list[str],
               verdicts: dict[tuple[str, str], str | None] | None = None) -> JobDefinition | None:
    """One job from its ``JOB__<name>__*`` settings (``values``: suffix -> (key, raw value)),
    or None with ``errors`` filled. ``verdicts``: schedule_problem's answers already found in
    this parse, by (schedule, time zone)."""
    def setting(suffix: str) -> str:
        return values.get(suffix, (f"{JOB_SETTING_PREFIX}{name}__{suffix}", ""))[0]

    # The settings this job sets (not blank), stripped: only these are validated; the others
    # take the defaults parsed once above.
    given = {suffix: raw.strip() for suffix, (_, raw) in values.items() if raw and not raw.isspace()}

    def value(suffix: str) -> str | None:
        found = given.get(suffix)
        return JOB_DEFAULTS.get(suffix) if found is None else found

    def fail(suffix: str, raw: object, expected: str) -> None:
        errors.append(str(ConfigError(setting(suffix), raw, expected)))

    if not JOB_NAME_PATTERN.match(name):
        errors.append(f"{JOB_SETTING_PREFIX}{_printable(name)}__*: job name {_printable(name)!r} must be 1-64 "
                      "letters, digits, '_', '.' or '-'")
    unstorable: set[str] = set()
    has_steps = False
    for suffix, (key, raw) in values.items():
        if suffix.startswith("STEPS__"):
            has_steps = True
            if suffix.rpartition("__")[2] not in _STEP_SUFFIXES:
                errors.append(f"{_printable(key)}={_printable(raw)!r}: unknown step setting "
                              f"{_printable(suffix.rpartition('__')[2])!r}; expected one of {', '.join(STEP_SETTING_SUFFIXES)}")
                continue
        elif suffix not in _JOB_SUFFIXES:
            errors.append(f"{_printable(key)}={_printable(raw)!r}: unknown job setting {_printable(suffix)!r}; "
                          f"expected one of {', '.join(JOB_SETTING_SUFFIXES)}")
            continue
        problem = storable_problem(raw)
        if problem:
            unstorable.add(suffix)
            errors.append(str(ConfigError(_printable(key), _printable(raw),
                                          f"text the database can store (found {problem})")))
    if unstorable:
        return None

    timezone = given.get("TIMEZONE") or _DEFAULT_TIMEZONE
    if "TIMEZONE" in given:
        try:
            validate_timezone(timezone)
        except ValueError:
            fail("TIMEZONE", timezone, "an IANA time zone name such as UTC or Europe/Paris")
            timezone = "UTC"

    schedule = value("SCHEDULE")
    if not schedule:
        pass        # no schedule: an on-demand job, run only when started (run-now, agent.start_job)
    elif len(schedule) > MAX_SCHEDULE_LENGTH:
        fail("SCHEDULE", _printable(schedule), f"at most {MAX_SCHEDULE_LENGTH} characters (it has {len(schedule)})")
    else:
        known = verdicts is not None and (schedule, timezone) in verdicts
        try:
            problem = verdicts[(schedule, timezone)] if known else schedule_problem(parse_schedule(schedule, timezone))
        except (ValueError, OverflowError) as exc:
            fail("SCHEDULE", schedule,
                 f"a six-field NCRONTAB expression (seconds first) or '@once <ISO-8601 datetime>' ({exc})")
        else:
            if verdicts is not None and not known:
                verdicts[(schedule, timezone)] = problem
            if problem:
                fail("SCHEDULE", schedule, problem)

    command = values.get("COMMAND", ("", ""))[1]
    if has_steps and "COMMAND" in values:
        errors.append(f"{setting('COMMAND')} and {JOB_SETTING_PREFIX}{_printable(name)}__STEPS__<n>__COMMAND are both "
                      "set: a job has either one COMMAND or STEPS, not both")
    elif not has_steps and not command.strip():
        fail("COMMAND", None if "COMMAND" not in values else command,
             "the SQL to run (non-empty), or steps in JOB__<name>__STEPS__<n>__COMMAND")

    if _PLAIN_DEFAULTS is not None and values.keys() <= _PLAIN_SUFFIXES:
        # Nothing but SCHEDULE, COMMAND and TIMEZONE (most jobs): every other field is its
        # default, validated once per process.
        (enabled, max_attempts, timeout_seconds, lease_seconds, misfire, grace_seconds, overlap, database,
         notify, webhook, targets, parallelism) = _PLAIN_DEFAULTS
        steps: tuple[StepDefinition, ...] = ()
        after, after_outcome = None, AfterOutcome.SUCCEEDED
    else:
        def int_value(suffix: str, low: int, high: int) -> int:
            if suffix not in given and suffix in _DEFAULT_INTS:
                return _DEFAULT_INTS[suffix]  # the default, parsed once per process
            raw = value(suffix)
            try:
                return parse_int(setting(suffix), raw, low, high)
            except ConfigError as exc:
                errors.append(str(exc))
                return 0

        def choice(suffix: str, options: tuple[str, ...]) -> str:
            if suffix not in given and JOB_DEFAULTS.get(suffix) in options:
                return JOB_DEFAULTS[suffix]
            raw = (value(suffix) or "").lower()
            if raw not in options:
                fail(suffix, value(suffix), " or ".join(options))
            return raw

        enabled = _DEFAULT_ENABLED
        if "ENABLED" in given:
            try:
                enabled = parse_bool(setting("ENABLED"), given["ENABLED"])
            except ConfigError as exc:
                errors.append(str(exc))
        max_attempts = int_value("MAX_ATTEMPTS", 1, 100)
        timeout_seconds = int_value("TIMEOUT_SECONDS", 1, 7 * 86400)
        lease_seconds = int_value("LEASE_SECONDS", 6, 3600)
        misfire = choice("MISFIRE", MISFIRE_POLICIES)
        grace_seconds = int_value("GRACE_SECONDS", 0, 366 * 86400)
        overlap = choice("OVERLAP", OVERLAP_POLICIES)
        database = value("DATABASE") if "DATABASE" in given else JOB_DEFAULTS.get("DATABASE")
        if database is not None and not DATABASE_NAME_PATTERN.match(database):
            fail("DATABASE", database, "a database name of letters, digits, '_' or '-'")
        notify = choice("NOTIFY", NOTIFY_POLICIES)
        webhook = None
        if ("NOTIFY_WEBHOOK_URL" in given or "NOTIFY_WEBHOOK_URL" in JOB_DEFAULTS) and value("NOTIFY_WEBHOOK_URL") is not None:
            try:
                webhook = _webhook_setting(setting("NOTIFY_WEBHOOK_URL"), value("NOTIFY_WEBHOOK_URL"))
            except ConfigError as exc:
                errors.append(str(exc))
        targets = None
        if ("TARGETS" in given or "TARGETS" in JOB_DEFAULTS) and value("TARGETS") is not None:
            try:
                targets = describe_members(parse_targets(setting("TARGETS"), value("TARGETS")))
            except ConfigError as exc:
                errors.append(str(exc))
            if has_steps:
                errors.append(f"{setting('TARGETS')}: a job with steps gives each step its own "
                              f"JOB__{_printable(name)}__STEPS__<n>__TARGETS (a step without one runs in one database)")
            if database is not None:
                errors.append(f"{setting('TARGETS')} and {setting('DATABASE')} are both set: a job runs in its "
                              "TARGETS or in one DATABASE, not both")
        parallelism = DEFAULT_PARALLELISM
        if ("TARGET_PARALLELISM" in given or "TARGET_PARALLELISM" in JOB_DEFAULTS) and value("TARGET_PARALLELISM") is not None:
            parallelism = int_value("TARGET_PARALLELISM", 1, MAX_PARALLELISM)
        after, after_outcome = _after_settings(name, given, setting, errors)
        steps: tuple[StepDefinition, ...] = ()
        if has_steps and "COMMAND" not in values:
            from shared.jobs.steps import parse_steps

            steps = parse_steps(name, values, errors, default_max_attempts=max_attempts,
                                default_timeout_seconds=timeout_seconds, default_database=database,
                                default_parallelism=parallelism)
    if errors:
        return None
    if targets is not None:
        # A one-step fleet job is a job of one fleet step (the executor runs fleets as steps).
        from shared.jobs.steps import one_fleet_step

        steps = (one_fleet_step(command, max_attempts=max_attempts, timeout_seconds=timeout_seconds,
                                targets=targets, parallelism=parallelism),)
    if steps:
        # The job's own columns describe its first step (what `jobs` shows and what a run's
        # columns hold before its first step starts).
        command = steps[0].command
        database = steps[0].database
    return _job(
        name=name, schedule=schedule or "", command=command.strip(), timezone=timezone,
        enabled=enabled, max_attempts=max_attempts, timeout_seconds=timeout_seconds,
        lease_seconds=lease_seconds, misfire=misfire, grace_seconds=grace_seconds,
        overlap=overlap, database=database, steps=steps, notify=notify, notify_webhook_url=webhook,
        targets=targets, after=after, after_outcome=after_outcome,
    )


def _after_settings(name: str, given: dict[str, str], setting: Callable[[str], str],
                    errors: list[str]) -> tuple[str | None, AfterOutcome]:
    """JOB__<name>__AFTER and AFTER_OUTCOME of one job, each checked on its own (whether AFTER
    names a job of these settings, and cycles, are parse_jobs' checks over all jobs)."""
    after = given.get("AFTER")
    if after is not None and not JOB_NAME_PATTERN.match(after):
        errors.append(str(ConfigError(setting("AFTER"), _printable(after),
                                      "the name of another job of these settings (1-64 letters, digits, '_', '.' or '-')")))
    outcome = AfterOutcome.SUCCEEDED
    raw = given.get("AFTER_OUTCOME")
    if raw is not None:
        if raw.lower() not in AFTER_OUTCOMES:
            errors.append(str(ConfigError(setting("AFTER_OUTCOME"), _printable(raw), " or ".join(AFTER_OUTCOMES))))
        elif after is None:
            errors.append(f"{setting('AFTER_OUTCOME')}={_printable(raw)!r}: set without {setting('AFTER')}; expected "
                          f"{setting('AFTER')} too (the job whose runs start this one), or no AFTER_OUTCOME")
        else:
            outcome = AfterOutcome(raw.lower())
    return after, outcome


def _job(**fields: Any) -> JobDefinition:
    """``JobDefinition(**fields)`` with every field given, built without the frozen dataclass's
    ``object.__setattr__`` per field (a sixth of a 10,000-job parse): an equal object, as frozen
    (tests/unit/test_config.py checks both ways agree)."""
    job = object.__new__(JobDefinition)
    job.__dict__.update(fields)
    return job


def _webhook_setting(setting: str, raw: str | None) -> str | None:
    """A webhook URL: HTTPS, or plain HTTP to a loopback address only (a local receiver)."""
    if raw is None:
        return None
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(raw)
        host = (parts.hostname or "").lower()
    except ValueError:
        parts, host = None, ""
    loopback = host in ("127.0.0.1", "::1", "localhost")
    if parts is None or not host or parts.scheme not in ("https", "http") or (parts.scheme == "http" and not loopback):
        raise ConfigError(setting, raw, "an https:// URL (http:// only to 127.0.0.1, ::1 or localhost)")
    if len(raw) > 2000:
        raise ConfigError(setting, raw[:80] + "...", f"a URL of at most 2000 characters (it has {len(raw)})")
    return raw


def _webhook_secret(setting: str, raw: str | None) -> bytes | None:
    """A Standard Webhooks secret: 'whsec_' then base64 of 24 to 64 bytes; returns the key bytes.
    The value is never echoed in the error (it is a secret): only its length and what is wrong."""
    if raw is None:
        return None
    import base64
    import binascii

    expected = "'whsec_' followed by the base64 of 24 to 64 random bytes (e.g. from `openssl rand -base64 32`)"
    shown = f"<{len(raw)} characters, not shown>"
    if not raw.startswith("whsec_"):
        raise ConfigError(setting, shown, expected)
    try:
        encoded = raw[len("whsec_"):]
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)   # padding optional
    except (binascii.Error, ValueError):
        raise ConfigError(setting, shown, expected + " (the part after 'whsec_' is not base64)") from None
    if not 24 <= len(key) <= 64:
        raise ConfigError(setting, shown, expected + f" (it decodes to {len(key)} bytes)")
    return key


def schedule_problem(schedule) -> str | None:
    """Why a parsed schedule can never run, or None. A cron expression croniter accepts may
    still have no slot at all (day 30 of February) or none for decades: the scheduler would
    find no next slot, so it is refused here, for this job alone. The next slot comes from the
    cache planning uses too (CronSchedule.next_after): one croniter walk per distinct schedule."""
    if getattr(schedule, "is_once", False) or getattr(schedule, "is_on_demand", False):
        return None
    now = datetime.now(timezone.utc)
    try:
        first = schedule.next_after(now)
    except Exception as exc:  # croniter's "failed to find next date" and friends
        return f"a schedule with a slot within {SCHEDULE_HORIZON_YEARS} years (none found: {exc})"
    if first is None or first > now + _SCHEDULE_HORIZON:
        return f"a schedule with a slot within {SCHEDULE_HORIZON_YEARS} years (this one has none)"
    return None


def _config_hash(jobs: tuple[JobDefinition, ...], invalid: tuple[InvalidJob, ...]) -> str:
    """What the tick compares to skip an unchanged sync: a digest of every job's every field
    and every invalid job's errors. The fields' reprs (str, int, bool, None, and the steps'
    dataclass reprs, which name each field), built by the interpreter in one pass: the JSON
    encoder with sorted keys cost a quarter of a 10,000-job settings parse. The field names
    head the document, so a field added, removed or renamed changes every hash."""
    names = tuple(field.name for field in dataclasses.fields(JobDefinition))
    values = operator.attrgetter(*names)
    document = (names, [values(job) for job in jobs], [(bad.name, bad.errors) for bad in invalid])
    return hashlib.sha256(repr(document).encode("utf-8", errors="surrogatepass")).hexdigest()
