"""Condition alerts' definitions (issue 32 item 3): the ALERT__<name>__* settings, checked one alert
at a time (one bad alert never stops the others), and the ERRORS list's syntax. What the tick does
with them: shared/engine/condition_alerts.py."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Mapping

from shared.errors import ConfigError
from shared.jobs.schedules import TIMEZONE_EXPECTED, parse_schedule, validate_timezone
from shared.values import parse_int, printable

ALERT_SETTING_PREFIX = "ALERT__"
ALERT_SETTING_SUFFIXES = ("QUERY", "SCHEDULE", "TIMEZONE", "ERRORS", "DELAY_BETWEEN_RESPONSES_SECONDS", "NOTIFY",
                          "NOTIFY_WEBHOOK_URL", "RESPONSE_JOB", "TIMEOUT_SECONDS", "ENABLED")
ALERT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
CONDITION_KINDS = ("condition", "errors", "alert_error")

DEFAULT_DELAY_SECONDS = 300
MAX_DELAY_SECONDS = 31_536_000          # a year
DEFAULT_TIMEOUT_SECONDS = 30
MAX_TIMEOUT_SECONDS = 600
MAX_QUERY_CHARS = 40_000
MAX_ERRORS_CHARS = 400
# What a notification carries of a probe's rows, and of one value.
MAX_PAYLOAD_ROWS = 100
MAX_PAYLOAD_BYTES = 65_536
MAX_ROW_CHARS = 8_000
# Failed attempts one tick reads for the ERRORS alerts (the rest: the next tick).
MAX_FAILURES_READ = 1000
MAX_FAILURES_CARRIED = 50
# Severities: the drivers do not pass an error's severity on; every failure the agent records is
# an error that ended a batch, which it counts as severity 16 (what RAISERROR and most errors
# raise). severity>=N with N up to 16 therefore matches every failure; above 16 is refused.
KNOWN_SEVERITY = 16


# ------------------------------------------------------------------ definitions


@dataclass(frozen=True)
class AlertDefinition:
    name: str
    query: str | None = None
    schedule: str | None = None
    timezone: str = "UTC"
    errors: str | None = None
    delay_seconds: int = DEFAULT_DELAY_SECONDS
    notify: bool = True
    notify_webhook_url: str | None = None
    response_job: str | None = None
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    enabled: bool = True


@dataclass(frozen=True)
class InvalidAlert:
    name: str
    key: str
    errors: tuple[str, ...]

    @property
    def message(self) -> str:
        return "; ".join(self.errors)


@dataclass(frozen=True)
class ErrorSpec:
    numbers: frozenset[int] = frozenset()
    sqlstates: frozenset[str] = frozenset()
    min_severity: int | None = None

    def matches(self, failure: Mapping[str, Any]) -> bool:
        if self.min_severity is not None:
            return True          # every recorded failure counts as severity KNOWN_SEVERITY (>= min)
        number = failure.get("error_number")
        if number is not None and int(number) in self.numbers:
            return True
        state = failure.get("error_sqlstate")
        return bool(state) and str(state).upper() in self.sqlstates


ERRORS_EXPECTED = ("a comma-separated list of error numbers (50000, 1205), SQLSTATEs (sqlstate=40P01) and "
                   f"severities (severity>=N, N from 1 to {KNOWN_SEVERITY}), e.g. '50000,1205,severity>=16'")


def parse_errors(setting: str, text: str) -> ErrorSpec:
    """``50000,1205,sqlstate=40P01,severity>=16``. Raises ConfigError naming ``setting``."""
    if len(text) > MAX_ERRORS_CHARS:
        raise ConfigError(setting, printable(text), f"at most {MAX_ERRORS_CHARS} characters: {ERRORS_EXPECTED}")
    numbers: set[int] = set()
    states: set[str] = set()
    severity: int | None = None
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ConfigError(setting, text, ERRORS_EXPECTED)
    for item in items:
        lowered = item.lower().replace(" ", "")
        if re.fullmatch(r"\d{1,10}", item) and 1 <= int(item) <= 2_147_483_647:
            numbers.add(int(item))
        elif m := re.fullmatch(r"sqlstate=([0-9a-z]{5})", lowered):
            states.add(m.group(1).upper())
        elif m := re.fullmatch(r"severity(>=|=)(\d{1,2})", lowered):
            level = int(m.group(2))
            if not 1 <= level <= 25:
                raise ConfigError(setting, item, f"a severity from 1 to 25 in {ERRORS_EXPECTED}")
            if level > KNOWN_SEVERITY or (m.group(1) == "=" and level != KNOWN_SEVERITY):
                raise ConfigError(setting, item, (
                    f"severity>=N with N at most {KNOWN_SEVERITY}: the drivers do not report an error's severity, and "
                    f"the agent counts every failure it records as severity {KNOWN_SEVERITY}, so {item!r} would "
                    "never fire; name the error numbers instead"))
            severity = min(level, severity or level)
        else:
            raise ConfigError(setting, printable(item), ERRORS_EXPECTED)
    return ErrorSpec(frozenset(numbers), frozenset(states), severity)


def check_definition(row: Mapping[str, Any], now: datetime) -> tuple[str | None, datetime | None]:
    """(why the alert cannot run, or None; its first check). Shared by the settings and the
    procedures' alerts (agent.add_alert checks only the shape: the tick checks the rest)."""
    name = row["alert_name"]
    prefix = f"{ALERT_SETTING_PREFIX}{name}__" if row.get("source") == "settings" else "agent.add_alert @"
    suffix = (lambda s: prefix + s) if row.get("source") == "settings" else (lambda s: prefix + s.lower())
    if row.get("config_error"):
        return row["config_error"], None
    query, errors = row.get("probe_query"), row.get("errors")
    if errors:
        try:
            parse_errors(suffix("ERRORS"), errors)
        except ConfigError as exc:
            return str(exc), None
        return None, now
    if not query:
        return f"{suffix('QUERY')}: expected a probe query or {suffix('ERRORS')}", None
    try:
        validate_timezone(row.get("timezone") or "UTC")
    except ValueError:
        return str(ConfigError(suffix("TIMEZONE"), row.get("timezone"), TIMEZONE_EXPECTED)), None
    try:
        schedule = parse_schedule(row.get("schedule") or "", row.get("timezone") or "UTC")
        first = schedule.initial_due(now)
    except (ValueError, OverflowError) as exc:
        return str(ConfigError(suffix("SCHEDULE"), row.get("schedule"), f"a schedule as a job's ({exc})")), None
    if first is None:
        return str(ConfigError(suffix("SCHEDULE"), row.get("schedule"), "a schedule with a slot to come")), None
    return None, first


def _storage_key(name: str) -> str:
    if ALERT_NAME.match(name):
        return name
    digest = hashlib.sha256(name.encode("utf-8", errors="surrogatepass")).hexdigest()[:8]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:46]      # "invalid-" + 46 + "-" + 8: 63 characters
    return f"invalid-{safe}-{digest}"


def parse_alerts(env: Mapping[str, str]) -> tuple[tuple[AlertDefinition, ...], tuple[InvalidAlert, ...]]:
    """Group ``ALERT__<name>__<SUFFIX>`` settings by alert and check each alone: one bad alert is
    reported invalid (naming the setting, the value and what is expected) and the others stand."""
    raw: dict[str, dict[str, tuple[str, str]]] = {}
    stray: dict[str, list[str]] = {}
    for key, value in env.items():
        if key[:len(ALERT_SETTING_PREFIX)].upper() != ALERT_SETTING_PREFIX:
            continue
        rest = key[len(ALERT_SETTING_PREFIX):]
        name, sep, suffix = rest.rpartition("__")
        if not sep or not name or suffix.upper() not in ALERT_SETTING_SUFFIXES:
            stray.setdefault(name or rest or key, []).append(
                f"{printable(key)}: expected ALERT__<name>__<SETTING> with SETTING one of {', '.join(ALERT_SETTING_SUFFIXES)}")
            continue
        raw.setdefault(name, {})[suffix.upper()] = (key, value)
    valid: list[AlertDefinition] = []
    invalid: list[InvalidAlert] = []
    folded: dict[str, list[str]] = {}
    for name in raw.keys() | stray.keys():
        folded.setdefault(name.casefold(), []).append(name)
    for name in sorted(raw.keys() | stray.keys()):
        errors = list(stray.get(name, []))
        twins = [other for other in folded[name.casefold()] if other != name]
        if twins:
            errors.append(f"{ALERT_SETTING_PREFIX}{printable(name)}__*: alert name {printable(name)!r} differs only by case "
                          f"from {', '.join(repr(printable(t)) for t in twins)}; alert names are compared "
                          "case-insensitively: rename one of them")
        alert = _parse_alert(name, raw.get(name, {}), errors)
        if errors or alert is None:
            invalid.append(InvalidAlert(name=name, key=_storage_key(name), errors=tuple(errors)))
        else:
            valid.append(alert)
    return tuple(valid), tuple(invalid)


def _parse_alert(name: str, values: dict[str, tuple[str, str]], errors: list[str]) -> AlertDefinition | None:
    def setting(suffix: str) -> str:
        return values[suffix][0] if suffix in values else f"{ALERT_SETTING_PREFIX}{name}__{suffix}"

    given = {suffix: value.strip() for suffix, (_, value) in values.items() if value is not None and value.strip()}
    if not ALERT_NAME.match(name):
        errors.append(f"{ALERT_SETTING_PREFIX}{printable(name)}__*: alert name {printable(name)!r}: expected 1 to 64 "
                      "letters, digits, '_', '.' or '-'")
    query, errors_text = given.get("QUERY"), given.get("ERRORS")
    if bool(query) == bool(errors_text):
        errors.append(f"{ALERT_SETTING_PREFIX}{printable(name)}__QUERY / __ERRORS: expected exactly one of them (a probe "
                      f"query whose rows are the alert, with a SCHEDULE; or {ERRORS_EXPECTED})")
    if query and len(query) > MAX_QUERY_CHARS:
        errors.append(str(ConfigError(setting("QUERY"), printable(query), f"a query of at most {MAX_QUERY_CHARS} characters")))
    schedule = given.get("SCHEDULE")
    zone = given.get("TIMEZONE", "UTC")
    if schedule is not None and len(schedule) > 400:
        errors.append(str(ConfigError(setting("SCHEDULE"), printable(schedule), "a schedule of at most 400 characters")))
        schedule = None
    if len(zone) > 64:
        errors.append(str(ConfigError(setting("TIMEZONE"), printable(zone), "an IANA time zone name of at most 64 "
                                      "characters")))
        zone = "UTC"
    else:
        try:
            validate_timezone(zone)
        except ValueError:
            errors.append(str(ConfigError(setting("TIMEZONE"), printable(zone), TIMEZONE_EXPECTED)))
            zone = "UTC"
    if query and not schedule:
        errors.append(str(ConfigError(setting("SCHEDULE"), None, "a schedule, as a job's (e.g. '0 */5 * * * *'): "
                                      "when the probe runs")))
    if errors_text and schedule:
        errors.append(str(ConfigError(setting("SCHEDULE"), schedule, "no schedule for an ERRORS alert (it is checked "
                                      "at every tick)")))
    if schedule and query:
        try:
            parse_schedule(schedule, zone)
        except (ValueError, OverflowError) as exc:
            errors.append(str(ConfigError(setting("SCHEDULE"), printable(schedule), f"a schedule as a job's ({exc})")))
    if errors_text:
        try:
            parse_errors(setting("ERRORS"), errors_text)
        except ConfigError as exc:
            errors.append(str(exc))
    delay, timeout = DEFAULT_DELAY_SECONDS, DEFAULT_TIMEOUT_SECONDS
    try:
        if "DELAY_BETWEEN_RESPONSES_SECONDS" in given:
            delay = parse_int(setting("DELAY_BETWEEN_RESPONSES_SECONDS"), given["DELAY_BETWEEN_RESPONSES_SECONDS"], 0,
                              MAX_DELAY_SECONDS)
    except ConfigError as exc:
        errors.append(str(exc))
    try:
        if "TIMEOUT_SECONDS" in given:
            timeout = parse_int(setting("TIMEOUT_SECONDS"), given["TIMEOUT_SECONDS"], 1, MAX_TIMEOUT_SECONDS)
    except ConfigError as exc:
        errors.append(str(exc))
    notify = _flag(given, "NOTIFY", setting, errors, True)
    enabled = _flag(given, "ENABLED", setting, errors, True)
    response_job = given.get("RESPONSE_JOB")
    if response_job is not None and len(response_job) > 64:
        errors.append(str(ConfigError(setting("RESPONSE_JOB"), printable(response_job), "a job name of at most 64 characters")))
    if not notify and not response_job:
        errors.append(f"{setting('NOTIFY')}=false and no {setting('RESPONSE_JOB')}: expected a response (notify, a job "
                      "to start, or both)")
    url = given.get("NOTIFY_WEBHOOK_URL")
    if url is not None and (len(url) > 2000 or not re.match(r"^https?://", url)):
        errors.append(str(ConfigError(setting("NOTIFY_WEBHOOK_URL"), printable(url.split("?")[0]),
                                      "an http(s) URL of at most 2000 characters")))
    if errors:
        return None
    return AlertDefinition(name=name, query=query, schedule=schedule if query else None, timezone=zone,
                           errors=errors_text, delay_seconds=delay, notify=notify, notify_webhook_url=url,
                           response_job=response_job, timeout_seconds=timeout, enabled=enabled)


def _flag(given: dict[str, str], suffix: str, setting: Callable[[str], str], errors: list[str], default: bool) -> bool:
    raw = given.get(suffix)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    errors.append(str(ConfigError(setting(suffix), printable(raw), "true or false")))
    return default


def alerts_hash(alerts: tuple[AlertDefinition, ...], invalid: tuple[InvalidAlert, ...]) -> str:
    """A digest of the alert settings ('' when there are none: a settings hash without alerts
    is what it was before them)."""
    if not alerts and not invalid:
        return ""
    text = repr(sorted((a.name, repr(a)) for a in alerts)) + repr(sorted((i.key, i.errors) for i in invalid))
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()
