"""Jobs from app settings: JOB__<name>__<SUFFIX> (and __STEPS__<n>__<SUFFIX>) parsed into
JobDefinitions, each bad job an InvalidJob with every problem named (one bad job never stops the
others), and the hash that says whether the jobs changed."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import operator
import re
from datetime import datetime, timezone
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from shared.errors import ConfigError
from shared.jobs.chains import find_cycles, run_order, show_chain
from shared.jobs.model import (
    AFTER_OUTCOMES,
    JOB_SETTING_PREFIX,
    MAX_SCHEDULE_LENGTH,
    MISFIRE_POLICIES,
    NOTIFY_POLICIES,
    OVERLAP_POLICIES,
    SCHEDULE_HORIZON,
    SCHEDULE_HORIZON_YEARS,
    AfterOutcome,
    InvalidJob,
    JobDefinition,
    StepDefinition,
)
from shared.jobs.calendars import (MAX_CALENDARS_PER_JOB, ON_EXCLUDED_POLICIES, Calendar, CalendarRules,
                                   CalendarSettings, parse_calendars)
from shared.jobs.params import MAX_PARAMS, NAME_EXPECTED, declarations_json, name_problem, value_problem
from shared.jobs.schedules import MAX_JITTER_SECONDS, TIMEZONE_EXPECTED, parse_schedule, validate_timezone
from shared.jobs.steps import one_fleet_step, parse_steps
from shared.jobs.targets import (DEFAULT_PARALLELISM, MAX_PARALLELISM, MAX_STAGGER_SECONDS, describe_members,
                                 parse_targets)
from shared.values import DATABASE_NAME_PATTERN, JOB_NAME_PATTERN, parse_bool, parse_int, printable, storable_problem

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
    "TARGET_STAGGER_SECONDS",
    "AFTER",
    "AFTER_OUTCOME",
    "EXCLUDE",
    "ONLY",
    "ON_EXCLUDED",
    "JITTER_SECONDS",
    "CATCHUP_SECONDS",
    "MAX_DURATION_SECONDS",
    "STOP_AFTER_SECONDS",
    "SLOWER_THAN",
    "DEADLINE_SECONDS",
)

# Alerts the agent raises itself (issue 32 items 1-2; shared/engine/alerts.py): a week at most
# (longer than the longest TIMEOUT_SECONDS), SLOWER_THAN a multiple of the recent p95 in (1, 100].
MAX_ALERT_SECONDS = 7 * 86400
MAX_SLOWER_THAN = 100.0


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
    "TARGET_STAGGER_SECONDS",
)


# JOB__<name>__PARAMS__<k>__DEFAULT / __REQUIRED: a parameter the job declares (shared/jobs/params.py).
PARAM_SETTING_PATTERN = re.compile(r"^(?P<name>.+?)__PARAMS__(?P<param>.*)__(?P<suffix>[A-Za-z]+)\Z", re.IGNORECASE)
PARAM_SETTING_SUFFIXES = ("DEFAULT", "REQUIRED")
STEP_SETTING_PATTERN = re.compile(r"^(?P<name>.+?)__STEPS__(?P<number>[^_]*)__(?P<suffix>[A-Za-z_]+)\Z", re.IGNORECASE)


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
        param = PARAM_SETTING_PATTERN.match(rest) if "__params__" in rest.lower() else None
        if param:
            # The parameter's name as written (it is how the job's SQL reads it).
            raw.setdefault(param["name"], {})[f"PARAMS__{param['param']}__{param['suffix'].upper()}"] = (key, value)
            continue
        name, sep, suffix = rest.rpartition("__")
        if not sep or not name:
            stray.setdefault(rest or key, []).append(
                f"{key}: expected JOB__<name>__<SETTING> with SETTING one of {', '.join(JOB_SETTING_SUFFIXES)}")
            continue
        raw.setdefault(name, {})[suffix.upper()] = (key, value)
    calendars = parse_calendars(env)
    parsed: list[tuple[str, str, JobDefinition | None, list[str]]] = []
    # One verdict per distinct (schedule, time zone) for this parse: 10,000 jobs share a few
    # dozen schedules.
    verdicts: dict[tuple[str, str], str | None] = {}
    # Azure SQL compares names case-insensitively (its default collation): 'Backup' and 'backup'
    # would be one key there. Such names are refused on every dialect, so all behave alike.
    by_fold: dict[str, list[str]] = {}
    for name in sorted(raw.keys() | stray.keys()):
        errors = list(stray[name]) if name in stray else []
        job = _parse_job(name, raw.get(name, {}), errors, verdicts, calendars)
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
            errors.append(f"{JOB_SETTING_PREFIX}{printable(name)}__*: job name {printable(name)!r} differs only by "
                          f"case from {', '.join(repr(printable(t)) for t in twins)}; job names are compared "
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
    in_cycle = find_cycles(follows)
    for name, _, job, errors in parsed:
        cycle = in_cycle.get(name)
        if cycle is None:
            continue
        shown = show_chain(run_order(cycle, name))
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
    if {"DATABASE", "NOTIFY_WEBHOOK_URL", "TARGETS", "TARGET_PARALLELISM", "TARGET_STAGGER_SECONDS"} & JOB_DEFAULTS.keys():
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
               verdicts: dict[tuple[str, str], str | None] | None = None,
               calendars: CalendarSettings | None = None) -> JobDefinition | None:
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
        errors.append(f"{JOB_SETTING_PREFIX}{printable(name)}__*: job name {printable(name)!r} must be 1-64 "
                      "letters, digits, '_', '.' or '-'")
    unstorable: set[str] = set()
    has_steps = False
    for suffix, (key, raw) in values.items():
        if suffix.startswith("STEPS__"):
            has_steps = True
            if suffix.rpartition("__")[2] not in _STEP_SUFFIXES:
                errors.append(f"{printable(key)}={printable(raw)!r}: unknown step setting "
                              f"{printable(suffix.rpartition('__')[2])!r}; expected one of {', '.join(STEP_SETTING_SUFFIXES)}")
                continue
        elif suffix.startswith("PARAMS__"):
            pass                    # _param_settings
        elif suffix not in _JOB_SUFFIXES:
            errors.append(f"{printable(key)}={printable(raw)!r}: unknown job setting {printable(suffix)!r}; "
                          f"expected one of {', '.join(JOB_SETTING_SUFFIXES)}")
            continue
        problem = storable_problem(raw)
        if problem:
            unstorable.add(suffix)
            errors.append(str(ConfigError(printable(key), printable(raw),
                                          f"text the database can store (found {problem})")))
    if unstorable:
        return None

    timezone = given.get("TIMEZONE") or _DEFAULT_TIMEZONE
    if "TIMEZONE" in given:
        try:
            validate_timezone(timezone)
        except ValueError:
            fail("TIMEZONE", timezone, TIMEZONE_EXPECTED)
            timezone = "UTC"

    schedule = value("SCHEDULE")
    if not schedule:
        pass        # no schedule: an on-demand job, run only when started (run-now, agent.start_job)
    elif len(schedule) > MAX_SCHEDULE_LENGTH:
        fail("SCHEDULE", printable(schedule), f"at most {MAX_SCHEDULE_LENGTH} characters (it has {len(schedule)})")
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
        errors.append(f"{setting('COMMAND')} and {JOB_SETTING_PREFIX}{printable(name)}__STEPS__<n>__COMMAND are both "
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
        calendar_rules = ""
        jitter_seconds = 0
        catchup_seconds = 0
        params = ""
        alert_limits: dict[str, Any] = dict(NO_ALERT_LIMITS)
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
                webhook = webhook_setting(setting("NOTIFY_WEBHOOK_URL"), value("NOTIFY_WEBHOOK_URL"))
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
                              f"JOB__{printable(name)}__STEPS__<n>__TARGETS (a step without one runs in one database)")
            if database is not None:
                errors.append(f"{setting('TARGETS')} and {setting('DATABASE')} are both set: a job runs in its "
                              "TARGETS or in one DATABASE, not both")
        parallelism = DEFAULT_PARALLELISM
        if ("TARGET_PARALLELISM" in given or "TARGET_PARALLELISM" in JOB_DEFAULTS) and value("TARGET_PARALLELISM") is not None:
            parallelism = int_value("TARGET_PARALLELISM", 1, MAX_PARALLELISM)
        stagger_seconds = 0
        if ("TARGET_STAGGER_SECONDS" in given or "TARGET_STAGGER_SECONDS" in JOB_DEFAULTS) \
                and value("TARGET_STAGGER_SECONDS") is not None:
            stagger_seconds = int_value("TARGET_STAGGER_SECONDS", 0, MAX_STAGGER_SECONDS)
        after, after_outcome = _after_settings(name, given, setting, errors)
        calendar_rules = _calendar_settings(given, setting, errors, calendars or CalendarSettings({}, {}))
        jitter_seconds = int_value("JITTER_SECONDS", 0, MAX_JITTER_SECONDS) if "JITTER_SECONDS" in given else 0
        catchup_seconds = 0
        if "CATCHUP_SECONDS" in given:
            catchup_seconds = int_value("CATCHUP_SECONDS", 0, MAX_CATCHUP_SECONDS)
            _check_catchup(catchup_seconds, misfire, overlap, grace_seconds, schedule, setting, errors)
        params = _param_settings(values, errors)
        alert_limits = _alert_settings(given, setting, errors)
        steps: tuple[StepDefinition, ...] = ()
        if has_steps and "COMMAND" not in values:
            steps = parse_steps(name, values, errors, default_max_attempts=max_attempts,
                                default_timeout_seconds=timeout_seconds, default_database=database,
                                default_parallelism=parallelism, default_stagger_seconds=stagger_seconds)
    if errors:
        return None
    if targets is not None:
        # A one-step fleet job is a job of one fleet step (the executor runs fleets as steps).
        steps = (one_fleet_step(command, max_attempts=max_attempts, timeout_seconds=timeout_seconds,
                                targets=targets, parallelism=parallelism, stagger_seconds=stagger_seconds),)
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
        targets=targets, after=after, after_outcome=after_outcome, calendars=calendar_rules,
        jitter_seconds=jitter_seconds, params=params, catchup_seconds=catchup_seconds, **alert_limits,
    )



# JOB__<name>__CATCHUP_SECONDS: a year at most (GRACE_SECONDS' own bound; the window may not
# exceed the job's GRACE_SECONDS anyway).
MAX_CATCHUP_SECONDS = 366 * 86400


def _check_catchup(catchup_seconds: int, misfire: str, overlap: str, grace_seconds: int, schedule: str | None,
                   setting, errors: list[str]) -> None:
    """CATCHUP_SECONDS beside the misfire and overlap policies: the combinations that would
    run none or only one of the missed slots it asks to run are refused, naming both settings."""
    if not catchup_seconds:
        return
    key = setting("CATCHUP_SECONDS")
    if not schedule:
        errors.append(f"{key}={catchup_seconds}: expected 0 for a job without a SCHEDULE (it has no slot to miss)")
    if misfire == "skip":
        errors.append(f"{key}={catchup_seconds} and {setting('MISFIRE')}=skip conflict: skip records every missed "
                      "slot skipped, the catch-up window runs them; expected MISFIRE=run-once (the default) with a "
                      "catch-up window, or no CATCHUP_SECONDS")
    if catchup_seconds > grace_seconds:
        errors.append(f"{key}={catchup_seconds}: expected at most {setting('GRACE_SECONDS')}={grace_seconds} (a slot "
                      "older than the grace period never runs)")
    if overlap in ("skip", "cancel-previous"):
        errors.append(f"{key}={catchup_seconds} and {setting('OVERLAP')}={overlap} conflict: the missed slots are due "
                      f"together, and {overlap} would run only one of them; expected OVERLAP=queue (one after "
                      "another, oldest first), allow (side by side, up to AGENT_MAX_CONCURRENCY) or buffer-one "
                      "(the oldest and one more)")

def _param_settings(values: dict[str, tuple[str, str]], errors: list[str]) -> str:
    """JOB__<name>__PARAMS__<k>__DEFAULT (the default, as written: a value is data, an empty one
    too) and __REQUIRED=true (no default: every run must be given one): the parameters the job
    declares, as the JSON agent.jobs.params holds ("" when it declares none)."""
    declared: dict[str, str | None] = {}
    keys: dict[str, str] = {}
    for suffix, (key, raw) in sorted(values.items()):
        if not suffix.startswith("PARAMS__"):
            continue
        name, _, kind = suffix[len("PARAMS__"):].rpartition("__")
        if kind not in PARAM_SETTING_SUFFIXES:
            errors.append(str(ConfigError(key, raw, f"JOB__<name>__PARAMS__<parameter>__DEFAULT or __REQUIRED "
                                                    f"(found {kind!r})")))
            continue
        if name_problem(name):
            errors.append(str(ConfigError(key, raw, f"a setting whose <parameter> is {NAME_EXPECTED} "
                                                    f"(found {name!r})")))
            continue
        if kind == "REQUIRED":
            try:
                required = parse_bool(key, raw)
            except ConfigError:
                errors.append(str(ConfigError(key, raw, "true (the parameter has no default: every run is given "
                                                        "one) or false")))
                continue
            if not required:
                continue
            default = None
        else:
            default = raw
            problem = value_problem(raw)
            if problem:
                # As agent.set_job_params refuses it; shown cut (a value may be a megabyte).
                errors.append(str(ConfigError(key, printable(raw), f"a default that is {problem}")))
                continue
        other = keys.get(name.casefold())
        if other is not None:
            errors.append(f"{key} and {other}: one parameter declared twice (a default and REQUIRED, or two "
                          "spellings: names ignore letter case)")
            continue
        keys[name.casefold()] = key
        declared[name] = default
    if len(declared) > MAX_PARAMS:
        errors.append(f"JOB__<name>__PARAMS__*: {len(declared)} parameters; expected at most {MAX_PARAMS}")
    return declarations_json(declared) or ""


NO_ALERT_LIMITS: Mapping[str, Any] = {"max_duration_seconds": None, "stop_after_seconds": None,
                                      "slower_than": None, "deadline_seconds": None}


def _alert_settings(given: dict[str, str], setting: Callable[[str], str], errors: list[str]) -> dict[str, Any]:
    """MAX_DURATION_SECONDS, STOP_AFTER_SECONDS, DEADLINE_SECONDS (whole seconds, 1 to a week)
    and SLOWER_THAN (a number above 1: a multiple of the job's recent p95) of one job; unset or
    empty: no such alert. A bad value is an error of this job alone."""
    limits = dict(NO_ALERT_LIMITS)
    for suffix in ("MAX_DURATION_SECONDS", "STOP_AFTER_SECONDS", "DEADLINE_SECONDS"):
        raw = given.get(suffix)
        if raw is None or not raw.strip():
            continue
        try:
            limits[suffix.lower()] = parse_int(setting(suffix), raw, 1, MAX_ALERT_SECONDS)
        except ConfigError as exc:
            errors.append(str(exc))
    raw = given.get("SLOWER_THAN")
    if raw is not None and raw.strip():
        try:
            factor = float(raw.strip())
        except ValueError:
            factor = float("nan")
        if not (1.0 < factor <= MAX_SLOWER_THAN):   # also NaN and inf
            errors.append(str(ConfigError(setting("SLOWER_THAN"), raw,
                                          f"a number above 1 and at most {MAX_SLOWER_THAN:g} (a multiple of the job's "
                                          "p95 duration over its recent successful runs, e.g. 2)")))
        else:
            limits["slower_than"] = factor
    return limits


def _calendar_settings(given: dict[str, str], setting: Callable[[str], str], errors: list[str],
                       calendars: CalendarSettings) -> str:
    """JOB__<name>__EXCLUDE, ONLY and ON_EXCLUDED of one job: the calendars they name, whole, as
    the JSON agent.jobs.calendars holds ("" when the job names none)."""
    chosen: dict[str, tuple[Calendar, ...]] = {}
    known = ", ".join(sorted(c.name for c in calendars.calendars.values())) or "none is defined"
    for suffix in ("EXCLUDE", "ONLY"):
        raw = given.get(suffix)
        if raw is None:
            continue
        names = [part.strip() for part in raw.split(",")]
        distinct = {name.lower() for name in names}
        if len(distinct) > MAX_CALENDARS_PER_JOB:
            errors.append(str(ConfigError(setting(suffix), raw[:200], f"at most {MAX_CALENDARS_PER_JOB} calendar names, "
                                          f"comma-separated (this names {len(distinct)})")))
            chosen[suffix] = ()
            continue
        found: list[Calendar] = []
        for part in names:
            folded = part.lower()
            if folded in calendars.invalid:
                errors.append(str(ConfigError(setting(suffix), raw, f"valid calendars: {part!r} is not ("
                                              + "; ".join(calendars.invalid[folded]) + ")")))
            elif folded in calendars.calendars:
                if calendars.calendars[folded] not in found:
                    found.append(calendars.calendars[folded])
            else:
                errors.append(str(ConfigError(setting(suffix), raw, "names of calendars defined by CALENDAR__<name>__DATES, "
                                              f"WEEKLY or ICS, comma-separated (defined: {known})")))
        chosen[suffix] = tuple(found)
    policy = (given.get("ON_EXCLUDED") or "skip").lower()
    if policy not in ON_EXCLUDED_POLICIES:
        errors.append(str(ConfigError(setting("ON_EXCLUDED"), given.get("ON_EXCLUDED"),
                                      "skip (an excluded slot is recorded skipped) or next (it runs at the next "
                                      "allowed time)")))
    elif "ON_EXCLUDED" in given and not chosen:
        errors.append(str(ConfigError(setting("ON_EXCLUDED"), given.get("ON_EXCLUDED"),
                                      f"a job with {setting('EXCLUDE')} or {setting('ONLY')} (this one has neither)")))
    rules = CalendarRules(exclude=chosen.get("EXCLUDE", ()), only=chosen.get("ONLY", ()), on_excluded=policy)
    return rules.as_json() if rules else ""


def _after_settings(name: str, given: dict[str, str], setting: Callable[[str], str],
                    errors: list[str]) -> tuple[str | None, AfterOutcome]:
    """JOB__<name>__AFTER and AFTER_OUTCOME of one job, each checked on its own (whether AFTER
    names a job of these settings, and cycles, are parse_jobs' checks over all jobs)."""
    after = given.get("AFTER")
    if after is not None and not JOB_NAME_PATTERN.match(after):
        errors.append(str(ConfigError(setting("AFTER"), printable(after),
                                      "the name of another job of these settings (1-64 letters, digits, '_', '.' or '-')")))
    outcome = AfterOutcome.SUCCEEDED
    raw = given.get("AFTER_OUTCOME")
    if raw is not None:
        if raw.lower() not in AFTER_OUTCOMES:
            errors.append(str(ConfigError(setting("AFTER_OUTCOME"), printable(raw), " or ".join(AFTER_OUTCOMES))))
        elif after is None:
            errors.append(f"{setting('AFTER_OUTCOME')}={printable(raw)!r}: set without {setting('AFTER')}; expected "
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


def webhook_setting(setting: str, raw: str | None) -> str | None:
    """A webhook URL: HTTPS, or plain HTTP to a loopback address only (a local receiver)."""
    if raw is None:
        return None

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


def webhook_secret(setting: str, raw: str | None) -> bytes | None:
    """A Standard Webhooks secret: 'whsec_' then base64 of 24 to 64 bytes; returns the key bytes.
    The value is never echoed in the error (it is a secret): only its length and what is wrong."""
    if raw is None:
        return None

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
    if first is None and getattr(schedule, "ends", None) is not None:
        return None     # its ``until`` has passed: a job with no more slots, as a past @once
    if first is None or first > now + SCHEDULE_HORIZON:
        return f"a schedule with a slot within {SCHEDULE_HORIZON_YEARS} years (this one has none)"
    return None


def config_hash(jobs: tuple[JobDefinition, ...], invalid: tuple[InvalidJob, ...]) -> str:
    """What the tick compares to skip an unchanged sync: a digest of every job's every field
    and every invalid job's errors. The fields' reprs (str, int, bool, None, and the steps'
    dataclass reprs, which name each field), built by the interpreter in one pass: the JSON
    encoder with sorted keys cost a quarter of a 10,000-job settings parse. The field names
    head the document, so a field added, removed or renamed changes every hash."""
    names = tuple(field.name for field in dataclasses.fields(JobDefinition))
    values = operator.attrgetter(*names)
    document = (names, [values(job) for job in jobs], [(bad.name, bad.errors) for bad in invalid])
    return hashlib.sha256(repr(document).encode("utf-8", errors="surrogatepass")).hexdigest()
