"""Jobs defined in the database (agent.add_scheduled_job and friends, issue 14).

A procedure cannot read NCRONTAB or an IANA time zone, so it stores the job with no next slot
and ``needs_planning = 1``. The engine plans them: each tick, and between ticks each doorbell
(Azure) or local-runner poll, finds them with one indexed query; Python validates each as it
validates a job setting (the schedule parser and ``config.schedule_problem``, a fleet job's
``@targets`` with ``targets.parse_targets``, written as its one fleet step, and the steps
agent.set_job_steps requested with ``steps.parse_steps``, as JOB__<name>__STEPS__<n>__* are); ONE statement
records every verdict and first slot, fenced on the definition it planned (updated_at,
schedule, time zone, enabled), and at most one more records an event for each invalid job. The
statement count is the same for 1 or 40 jobs. The first slot is the first after the moment the
job was defined (its updated_at, the server's clock).

A job the engine rejects is reported like an invalid setting, in words naming the procedure's
parameter: ``agent.add_scheduled_job @timezone='Mars/Olympus': expected an IANA time zone
name ...`` (config_error, a config_invalid job event, the log, a JobConfigInvalid event); it
hurts only itself.

The other direction, the settings sync, lives in the scheduler: it refuses a settings job whose
name a database job holds (``settings_rows_for``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from shared.control.store import Store
from shared.errors import ConfigError
from shared.jobs.calendars import MAX_CALENDARS_PER_JOB, Calendar, CalendarRules, parse_dates, parse_weekly
from shared.jobs.from_settings import schedule_problem
from shared.jobs.model import JOB_SETTING_PREFIX
from shared.jobs.schedules import TIMEZONE_EXPECTED, is_one_time, parse_schedule, validate_timezone
from shared.jobs.steps import one_fleet_step, parse_steps_json
from shared.jobs.targets import DEFAULT_PARALLELISM, describe_members, dialect_problem, parse_targets
from shared.values import printable

log = logging.getLogger(__name__)
UTC = timezone.utc
PROCEDURE = "agent.add_scheduled_job"


@dataclass
class PlanReport:
    planned: list[dict[str, Any]] = field(default_factory=list)

    @property
    def invalid(self) -> list[dict[str, Any]]:
        return [job for job in self.planned if not job["valid"]]

    @property
    def scheduled(self) -> list[dict[str, Any]]:
        return [job for job in self.planned if job["valid"] and job["next_due_at"] is not None]


def fleet_step(job: dict[str, Any], dialect: str) -> tuple[str | None, str | None]:
    """(error, steps JSON) of a database job's @targets: its one fleet step, as the settings sync
    stores a job with JOB__<name>__TARGETS (None, None: a job that runs in one database)."""
    raw = job.get("requested_targets")
    if raw is None:
        return None, None

    parameter = f"{PROCEDURE} @targets"
    try:
        members = parse_targets(parameter, raw)
    except ConfigError as exc:
        return str(exc), None
    problem = dialect_problem(members, dialect)
    if problem:
        return str(ConfigError(parameter, raw, problem)), None
    step = one_fleet_step(job["command"], max_attempts=job["max_attempts"], timeout_seconds=job["timeout_seconds"],
                          targets=describe_members(members),
                          parallelism=job.get("requested_target_parallelism") or DEFAULT_PARALLELISM,
                          stagger_seconds=int(job.get("requested_target_stagger_seconds") or 0))
    return None, json.dumps([step.to_json()])


STEPS_PROCEDURE = "agent.set_job_steps"


def database_steps(job: dict[str, Any], dialect: str) -> tuple[str | None, str | None]:
    """(error, steps JSON) of a database job's agent.set_job_steps @steps: checked by the rules of
    JOB__<name>__STEPS__<n>__* (shared/jobs/steps.py, parse_steps, the job's own @max_attempts,
    @timeout_seconds, @database, @target_parallelism and @target_stagger_seconds the steps'
    defaults, as the job's settings are), written as the settings sync writes the same steps; a
    fleet step's targets also as @targets is checked. (None, None): the job has no steps."""
    raw = job.get("requested_steps")
    if raw is None or not raw.strip():
        return None, None
    parameter = f"{STEPS_PROCEDURE} @steps"
    errors, steps, names = parse_steps_json(
        job["job_name"], raw, parameter, default_max_attempts=job["max_attempts"],
        default_timeout_seconds=job["timeout_seconds"], default_database=job.get("target_database"),
        default_parallelism=job.get("requested_target_parallelism") or DEFAULT_PARALLELISM,
        default_stagger_seconds=int(job.get("requested_target_stagger_seconds") or 0))
    if errors:
        return "; ".join(errors), None
    if not steps:
        return fleet_step(job, dialect)
    if job.get("requested_targets") is not None:
        return (f"{PROCEDURE} @targets={printable(job['requested_targets'])!r}: expected NULL for a job with steps "
                f"({parameter}): each step gives its own targets (a step without them runs in one database)"), None
    for step in steps:
        if step.targets:
            problem = dialect_problem(parse_targets(names(step.step, "TARGETS"), step.targets), dialect)
            if problem:
                errors.append(str(ConfigError(names(step.step, "TARGETS"), step.targets, problem)))
    if errors:
        return "; ".join(errors), None
    return None, (json.dumps([step.to_json() for step in steps]) if steps else None)


def verdict(job: dict[str, Any]) -> tuple[str | None, datetime | None]:
    """(error, first slot) of one database job: the error names the procedure's parameter."""
    zone = job["timezone"]
    try:
        validate_timezone(zone)
    except ValueError:
        return str(ConfigError(f"{PROCEDURE} @timezone", zone, TIMEZONE_EXPECTED)), None
    text = job["schedule"]
    parameter = "@run_at" if is_one_time(text) else "@schedule"
    try:
        schedule = parse_schedule(text, zone)
    except (ValueError, OverflowError) as exc:
        expected = ("one date and time (with its UTC offset where the job's time zone has two), e.g. "
                    "'2026-12-31T23:00:00+01:00'" if parameter == "@run_at" else
                    "a six-field NCRONTAB expression (seconds first), e.g. '0 0 2 * * *'")
        return str(ConfigError(f"{PROCEDURE} {parameter}", text, f"{expected} ({exc})")), None
    problem = schedule_problem(schedule)
    if problem:
        return str(ConfigError(f"{PROCEDURE} {parameter}", text, problem)), None
    if not job["enabled"]:
        return None, None
    defined = job["updated_at"]
    defined = defined.replace(tzinfo=UTC) if defined.tzinfo is None else defined.astimezone(UTC)
    try:
        return None, schedule.initial_due(defined)
    except (ValueError, OverflowError) as exc:
        return str(ConfigError(f"{PROCEDURE} {parameter}", text, f"a schedule with a next slot ({exc})")), None


CALENDAR_PROCEDURE = "agent.set_job_calendars"


def database_calendars(rows: list[dict[str, Any]]) -> dict[str, Calendar | str]:
    """The calendars agent.add_calendar defined (list_calendars' rows), by folded name: each a
    Calendar, or why it is not one (naming the procedure's parameter and the value)."""
    out: dict[str, Calendar | str] = {}
    for row in rows:
        try:
            dates = parse_dates(row["dates"]) if (row.get("dates") or "").strip() else ()
        except ValueError as exc:
            out[row["name"].lower()] = str(ConfigError("agent.add_calendar @dates", printable(row["dates"])[:200], str(exc)))
            continue
        try:
            weekly = parse_weekly(row["weekly"]) if (row.get("weekly") or "").strip() else ()
        except ValueError as exc:
            out[row["name"].lower()] = str(ConfigError("agent.add_calendar @weekly", printable(row["weekly"])[:200], str(exc)))
            continue
        out[row["name"].lower()] = Calendar(name=row["name"], dates=dates, weekly=weekly)
    return out


def calendar_verdict(job: dict[str, Any], calendars: dict[str, Calendar | str]) -> tuple[str | None, str | None]:
    """(error, agent.jobs.calendars JSON) of a database job's agent.set_job_calendars: the names
    resolved against the calendars agent.add_calendar defined (None, None: it names none)."""
    chosen: dict[str, tuple[Calendar, ...]] = {}
    known = ", ".join(sorted(c.name for c in calendars.values() if isinstance(c, Calendar))) or "none is defined"
    for parameter, raw in (("@exclude_calendars", job.get("requested_exclude")), ("@only_calendars", job.get("requested_only"))):
        if not raw:
            continue
        found: list[Calendar] = []
        for name in (part for part in raw.split(",") if part):
            entry = calendars.get(name.lower())
            if entry is None:
                return str(ConfigError(f"{CALENDAR_PROCEDURE} {parameter}", raw, "names of calendars defined by "
                                       f"agent.add_calendar, comma-separated (defined: {known})")), None
            if isinstance(entry, str):
                return str(ConfigError(f"{CALENDAR_PROCEDURE} {parameter}", raw,
                                       f"valid calendars: {name!r} is not ({entry})")), None
            if entry not in found:
                found.append(entry)
        if len(found) > MAX_CALENDARS_PER_JOB:
            return str(ConfigError(f"{CALENDAR_PROCEDURE} {parameter}", raw[:200], f"at most {MAX_CALENDARS_PER_JOB} "
                                   f"calendar names, comma-separated (this names {len(found)})")), None
        chosen[parameter] = tuple(found)
    rules = CalendarRules(exclude=chosen.get("@exclude_calendars", ()), only=chosen.get("@only_calendars", ()),
                          on_excluded=job.get("requested_on_excluded") or "skip")
    return None, (rules.as_json() if rules else None)


def plan_database_jobs(store: Store, now: datetime, telemetry: Any) -> PlanReport:
    """Plan every job a procedure defined or changed since the last planning (see the module
    docstring). One statement when there is none."""
    report = PlanReport()
    # Read outside the transaction: when nothing waits (every poll, nearly always) this one
    # statement is the whole cost, on SQL Server too (a transaction there is a COMMIT more). What
    # is read may be redefined before it is planned: plan_jobs is fenced on the definition read.
    jobs = store.execute("select_unplanned_jobs").rows
    if not jobs:
        return report
    with store.transaction():
        plans = []
        replan: set[str] = set()
        # One query more, only when a planned job names calendars (agent.set_job_calendars).
        named = any(job.get("requested_exclude") or job.get("requested_only") for job in jobs)
        calendars = database_calendars(store.execute("list_calendars").rows) if named else {}
        for job in jobs:
            first = None
            rules = None
            try:
                error, steps = (database_steps(job, store.dialect) if job.get("requested_steps")
                                else fleet_step(job, store.dialect))
                if error is None:
                    error, first = verdict(job)
                if error is None:
                    error, rules = calendar_verdict(job, calendars)
            except Exception as exc:  # noqa: BLE001 - one job's definition never stops the planning of the others
                log.exception("planning job %s", printable(job["job_name"]))
                error, steps, first, rules = (f"{PROCEDURE}: the engine could not check this job's definition "
                                              f"({type(exc).__name__}: {printable(str(exc), 200)})"), None, None, None
            resolved = None if error else rules
            plans.append({"job_name": job["job_name"], "schedule": job["schedule"], "timezone": job["timezone"],
                          "enabled": int(job["enabled"]), "updated_at": store.json_time(job["updated_at"]),
                          "valid": 0 if error else 1, "config_error": error,
                          "next_due_at": store.json_time(first), "steps": None if error else steps,
                          "calendars": resolved})
            # Its calendars or jitter changed (agent.set_job_calendars set replan_runs; a calendar
            # redefined or removed changes what the names resolve to): its runs claimed ahead
            # were keyed and decided under the old rules.
            if job.get("replan_runs") or (job.get("calendars") or None) != resolved:
                replan.add(job["job_name"])
        report.planned = store.execute("plan_jobs", plans=plans, now=now).rows
        # The never-started runs of those planned (plan_jobs' fence held) keyed from the new first
        # slot on: recorded skipped, planned again by the claim (a run keyed as before is taken
        # back in place). A run keyed before that slot stands for an earlier slot and stays.
        # A job with no next slot left (a one-time job, a schedule past its `until`): only its runs
        # not yet due, and not held by a pause, are decided again (settle_replanned_jobs), from
        # their slot or from now; one whose slot has a run standing for it keeps no slot, so it
        # never runs twice and a slot skipped for good stays skipped. A run a calendar moved,
        # keyed before the new first slot, is decided again from now.
        defined = {job["job_name"]: job for job in jobs}
        again, settle = [], []
        for job in report.planned:
            if job["job_name"] not in replan:
                continue
            source = defined.get(job["job_name"]) or {}
            if not (job["valid"] and source.get("enabled")):
                again.append({"job_name": job["job_name"], "since": store.json_time(now)})
            elif is_one_time(source.get("schedule")) or job["next_due_at"] is None:
                again.append({"job_name": job["job_name"], "since": store.json_time(now), "open_only": 1})
                settle.append({"job_name": job["job_name"], "open_only": 1})
            else:
                again.append({"job_name": job["job_name"], "since": store.json_time(_aware(job["next_due_at"]))})
                settle.append({"job_name": job["job_name"]})
        if again:
            store.execute("skip_replanned_runs", jobs=again, now=now)
        if settle:
            # The slot each is decided again from (settle_replanned_jobs): one statement more,
            # only in a planning after a change of calendars or jitter.
            store.execute("settle_replanned_jobs", jobs=settle, now=now)
        events = [{"job_name": job["job_name"], "kind": "config_invalid", "detail": job["config_error"]}
                  for job in report.invalid]
        if events:
            store.execute("insert_job_events", events=events, now=now)
    for job in report.invalid:
        log.error("job %s (defined in the database) is invalid and will not run: %s", job["job_name"],
                  job["config_error"])
        telemetry.event("JobConfigInvalid", {"job": job["job_name"], "outcome": "invalid",
                                             "error_message": job["config_error"]})
    return report


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def stand_in_name(name: str) -> str:
    """The name a settings job is recorded under while a database job holds its own: unique,
    storable, and pointing back at the real name."""
    digest = hashlib.sha1(name.encode("utf-8", errors="surrogatepass")).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:40] or 'job'}~{digest}"


def refused_settings_job_error(name: str, holder: str) -> str:
    return (f"{JOB_SETTING_PREFIX}{name}__*: the job name {name!r} is taken by job {holder!r}, defined in the "
            f"database by agent.add_scheduled_job (names are compared case-insensitively); rename this job, or "
            f"remove that one with agent.remove_scheduled_job")
