"""A job as agent.add_scheduled_job defines it, from the fields of a form (the monitor's job form,
issue 32 item 6): every argument of the procedure, typed, and validated as the procedure and the
engine validate it — the procedure's own checks (migration 0024: names, lengths, ranges, the
choices, @catchup_seconds' rules) and what the engine checks when it plans the job
(shared/engine/planning.py: an IANA time zone, an NCRONTAB schedule with a slot to come,
shared/jobs/from_settings.py's schedule_problem; a fleet's @targets). Each refusal names the field,
the value and what is expected; every bad field is reported at once. What only the database can
decide (a job of the same name in the app settings, a name that differs only by case, @after
naming no job or closing a cycle) is the procedure's, and comes back in its words.

No query here: the engine calls the procedure (shared/engine/operations.py, define_job)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping

from shared.errors import ConfigError
from shared.jobs.from_settings import schedule_problem
from shared.jobs.schedules import TIMEZONE_EXPECTED, needs_offset, parse_schedule, validate_timezone
from shared.jobs.steps import parse_steps_json
from shared.jobs.targets import parse_targets

UTC = timezone.utc

# The procedure's own patterns and bounds (migration 0024, agent.add_scheduled_job_unaudited).
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
TIMEZONE_PATTERN = re.compile(r"[A-Za-z0-9_+/-]{1,64}")
DATABASE_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_SCHEDULE_LENGTH = 400
MAX_TARGETS_LENGTH = 4000
# The form's command may be long (a field of the form holds at most this much; the body 64 KiB).
MAX_SQL_LENGTH = 60000
OVERLAPS = ("skip", "queue", "allow", "buffer-one", "cancel-previous")
MISFIRES = ("run-once", "skip")
AFTER_OUTCOMES = ("succeeded", "failed", "completed")


@dataclass(frozen=True)
class Field:
    """One field of the form: one argument of agent.add_scheduled_job."""
    name: str           # the form field, and the procedure's @parameter
    label: str
    default: str
    expected: str
    low: int | None = None
    high: int | None = None
    choices: tuple[str, ...] = ()

    @property
    def parameter(self) -> str:
        return f"@{self.name}"


FIELDS: tuple[Field, ...] = (
    Field("name", "Name", "", "a job name of 1 to 64 letters, digits, '_', '.' or '-'"),
    Field("sql", "Command (SQL)", "", f"the SQL to run (non-empty, at most {MAX_SQL_LENGTH} characters)"),
    Field("schedule", "Schedule (NCRONTAB, seconds first)", "",
          f"a six-field NCRONTAB expression (seconds first) of at most {MAX_SCHEDULE_LENGTH} characters, e.g. "
          "'0 0 2 * * *', or nothing (a one-time job: run at; neither: on demand)"),
    Field("run_at", "Run at (one-time job, in its time zone)", "",
          "a date and time in the job's time zone, e.g. 2026-12-31 23:00 (with the zone's UTC offset, e.g. "
          "2026-10-25 01:30+01:00, for a time that happens twice when the clocks go back; or in UTC, ending in Z), "
          "or nothing"),
    Field("timezone", "Time zone", "UTC", TIMEZONE_EXPECTED),
    Field("enabled", "Enabled", "1", "1 (enabled) or 0 (disabled)", choices=("1", "0")),
    Field("after", "After (the job whose runs start this one)", "",
          "nothing (a job that follows no job) or the name of the job whose runs start this one"),
    Field("after_outcome", "After outcome", "succeeded", "succeeded, failed or completed", choices=AFTER_OUTCOMES),
    Field("max_attempts", "Max attempts", "3", "a whole number from 1 to 100", 1, 100),
    Field("timeout_seconds", "Timeout (s)", "1800", "a whole number from 1 to 604800", 1, 604800),
    Field("overlap", "Overlap", "skip", "skip, queue, allow, buffer-one or cancel-previous", choices=OVERLAPS),
    Field("misfire", "Misfire", "run-once", "run-once or skip", choices=MISFIRES),
    Field("grace_seconds", "Grace (s)", "86400", "a whole number from 0 to 31622400", 0, 31622400),
    Field("catchup_seconds", "Catch-up window (s)", "0",
          "a whole number from 0 to 31622400 (after downtime, every missed slot within this many seconds of now "
          "runs, oldest first; 0: none)", 0, 31622400),
    Field("lease_seconds", "Lease (s)", "60", "a whole number from 6 to 3600", 6, 3600),
    Field("database", "Database", "",
          "nothing (the control database) or a database name of 1 to 128 letters, digits, '_' or '-'"),
    Field("targets", "Fleet targets", "",
          f"nothing (one database) or a comma list of at most {MAX_TARGETS_LENGTH} characters of members such as "
          "db:tenant_*, server:<server> or -db:<name>"),
    Field("target_parallelism", "Target parallelism", "8",
          "a whole number from 1 to 1000 (how many target databases of one run at once)", 1, 1000),
    Field("target_stagger_seconds", "Target stagger (s)", "0", "a whole number from 0 to 3600", 0, 3600),
    # agent.set_job_steps @steps (migration 0028), saved in the transaction of the define.
    Field("steps", "Steps (JSON)", "",
          'nothing (the job runs its command) or a JSON array of steps, e.g. [{"sql": "EXEC dbo.load", '
          '"on_failure": "goto:3"}, {"sql": "EXEC dbo.report"}, {"sql": "EXEC dbo.alert"}]: fields sql, database, '
          "on_success, on_failure, max_attempts, retry_interval_seconds, timeout_seconds, targets, "
          "target_parallelism, target_stagger_seconds, as JOB__<name>__STEPS__<n>__* (docs/steps.md); with steps, "
          "they run and the command does not"),
)
BY_NAME = {field.name: field for field in FIELDS}


@dataclass(frozen=True)
class FieldError:
    """One bad field: its name, the value as typed and what is expected."""
    field: str
    value: str
    expected: str

    @property
    def message(self) -> str:
        label = BY_NAME[self.field].label if self.field in BY_NAME else self.field
        shown = self.value if len(self.value) <= 200 else self.value[:200] + "…"
        return f"{label} (@{self.field}) = {shown!r}: expected {self.expected}"


@dataclass(frozen=True)
class JobDefinition:
    """Every argument of one agent.add_scheduled_job call, validated."""
    name: str
    sql: str
    schedule: str | None            # NCRONTAB (or None: a one-time or on-demand job)
    run_at: datetime | None         # a one-time job's slot, in UTC
    timezone: str
    enabled: int
    max_attempts: int
    timeout_seconds: int
    overlap: str
    database: str | None
    misfire: str
    grace_seconds: int
    lease_seconds: int
    targets: str | None
    target_parallelism: int
    after: str | None
    after_outcome: str
    target_stagger_seconds: int
    catchup_seconds: int
    # agent.set_job_steps @steps (the JSON array as typed, checked), None: no steps.
    steps: str | None = None

    def arguments(self) -> dict[str, Any]:
        """The define_job query's parameters (the procedure's, by name)."""
        return {"job_name": self.name, "sql": self.sql, "schedule": self.schedule,
                "run_at": self.run_at.isoformat() if self.run_at else None, "timezone": self.timezone,
                "enabled": self.enabled, "max_attempts": self.max_attempts, "timeout_seconds": self.timeout_seconds,
                "overlap": self.overlap, "database": self.database, "misfire": self.misfire,
                "grace_seconds": self.grace_seconds, "lease_seconds": self.lease_seconds, "targets": self.targets,
                "target_parallelism": self.target_parallelism, "after": self.after,
                "after_outcome": self.after_outcome, "target_stagger_seconds": self.target_stagger_seconds,
                "catchup_seconds": self.catchup_seconds}

    @property
    def schedule_text(self) -> str:
        """The schedule as the job's row holds it (a one-time job: '@once <UTC>'; on demand: '')."""
        if self.schedule:
            return self.schedule
        return f"@once {self.run_at.isoformat()}" if self.run_at else ""

    def preview_row(self, existing: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A job row as views.upcoming_slots reads it (the next slots, as `sql-agent next`): this
        definition, with the calendars and jitter a job of the name keeps across a redefinition."""
        existing = existing or {}
        return {"job_name": self.name, "schedule": self.schedule_text, "timezone": self.timezone, "valid": 1,
                "configured": 1, "enabled": self.enabled, "needs_planning": 0,
                "calendars": existing.get("calendars"), "jitter_seconds": existing.get("jitter_seconds")}


def blank_form() -> dict[str, str]:
    return {field.name: field.default for field in FIELDS}


def form_of(row: Mapping[str, Any]) -> dict[str, str]:
    """The form's fields of a defined job (a get_job_definition row): an edit starts from them."""
    schedule = row.get("schedule") or ""
    run_at = ""
    if schedule.lower().startswith("@once"):
        try:
            zone = row.get("timezone") or "UTC"
            moment = parse_schedule(schedule, zone).at   # type: ignore[union-attr]
            local = moment.astimezone(validate_timezone(zone))
            # A time the clocks go back over happens twice: shown with its offset, or the form
            # saved unchanged would name two instants (and be refused).
            run_at = local.isoformat(" ", "seconds") if needs_offset(moment, zone) \
                else local.replace(tzinfo=None).isoformat(" ", "seconds")
        except (ValueError, OverflowError):
            run_at = schedule[len("@once"):].strip()
        schedule = ""

    def text(value: Any, default: str = "") -> str:
        return default if value is None else str(value)

    return {"name": text(row.get("job_name")), "sql": text(row.get("command")), "schedule": schedule,
            "run_at": run_at, "timezone": text(row.get("timezone"), "UTC"), "enabled": "1" if row.get("enabled") else "0",
            "after": text(row.get("after_job")), "after_outcome": text(row.get("after_outcome"), "succeeded"),
            "max_attempts": text(row.get("max_attempts"), "3"), "timeout_seconds": text(row.get("timeout_seconds"), "1800"),
            "overlap": text(row.get("overlap"), "skip"), "misfire": text(row.get("misfire"), "run-once"),
            "grace_seconds": text(row.get("grace_seconds"), "86400"),
            "catchup_seconds": text(row.get("catchup_seconds"), "0"), "lease_seconds": text(row.get("lease_seconds"), "60"),
            "database": text(row.get("target_database")), "targets": text(row.get("requested_targets")),
            "target_parallelism": text(row.get("requested_target_parallelism"), "8"),
            "target_stagger_seconds": text(row.get("requested_target_stagger_seconds"), "0"),
            "steps": text(row.get("requested_steps"))}


def offset_problem(text: str, moment: datetime, zone: str) -> str | None:
    """The form's run at is in the job's time zone: an offset typed with it must be the zone's at
    that time (else the date was changed and the offset kept, or the zone changed: the job would
    run at another hour than the one shown). 'Z' says UTC, whatever the zone."""
    if text.upper().endswith("Z"):
        return None
    typed = datetime.fromisoformat(text)
    if typed.tzinfo is None:
        return None
    local = moment.astimezone(validate_timezone(zone))
    if local.replace(tzinfo=None) == typed.replace(tzinfo=None):
        return None
    shown = typed.isoformat(" ", "seconds")
    return (f"{shown[len(shown) - 6:]} is not the offset of {zone} at {typed.replace(tzinfo=None).isoformat(' ', 'seconds')} "
            f"(that instant is {local.isoformat(' ', 'seconds')} there): give the time without an offset, with "
            "the zone's offset, or in UTC ending in Z")


def parse_definition(form: Mapping[str, str]) -> tuple[JobDefinition | None, list[FieldError]]:
    """The definition the form's fields give, or every bad field (then None)."""
    errors: list[FieldError] = []
    raw = {field.name: form.get(field.name, field.default) for field in FIELDS}

    def bad(name: str, expected: str | None = None) -> None:
        errors.append(FieldError(name, raw[name], expected or BY_NAME[name].expected))

    def pattern(name: str, regex: re.Pattern[str]) -> str | None:
        value = raw[name]
        if value == "":
            return None
        if not regex.fullmatch(value):
            bad(name)
        return value

    def whole(name: str) -> int:
        field, value = BY_NAME[name], raw[name].strip()
        if not (value.isascii() and value.isdigit() and len(value) <= 10) \
                or not field.low <= int(value) <= field.high:          # type: ignore[operator]
            bad(name)
            return field.low or 0                                         # type: ignore[return-value]
        return int(value)

    def choice(name: str) -> str:
        value = raw[name].strip().lower()
        if value not in BY_NAME[name].choices:
            bad(name)
        return value

    name = raw["name"]
    if not NAME_PATTERN.fullmatch(name):
        bad("name")
    sql = raw["sql"]
    if not sql.strip() or len(sql) > MAX_SQL_LENGTH:
        bad("sql")
    zone = raw["timezone"]
    zone_ok = bool(TIMEZONE_PATTERN.fullmatch(zone))
    if zone_ok:
        try:
            validate_timezone(zone)
        except ValueError:
            zone_ok = False
    if not zone_ok:
        bad("timezone")
    schedule = raw["schedule"].strip() or None
    run_at: datetime | None = None
    if schedule is not None:
        if len(raw["schedule"]) > MAX_SCHEDULE_LENGTH:
            bad("schedule")
        elif zone_ok:
            try:
                parsed = parse_schedule(schedule, zone)
                problem = schedule_problem(parsed)
                if problem:
                    bad("schedule", problem)
            except (ValueError, OverflowError) as exc:
                bad("schedule", f"{BY_NAME['schedule'].expected} ({exc})")
    if raw["run_at"].strip():
        if schedule is not None:
            bad("run_at", "nothing when a schedule is given (one or the other)")
        elif zone_ok:
            text = raw["run_at"].strip()
            try:
                run_at = parse_schedule("@once " + text, zone).at        # type: ignore[union-attr]
                problem = offset_problem(text, run_at, zone)
                if problem:
                    run_at = None
                    bad("run_at", f"{BY_NAME['run_at'].expected} ({problem})")
            except (ValueError, OverflowError) as exc:
                bad("run_at", f"{BY_NAME['run_at'].expected} ({exc})")
    enabled = 1 if raw["enabled"].strip() == "1" else 0
    if raw["enabled"].strip() not in ("0", "1"):
        bad("enabled")
    after = pattern("after", NAME_PATTERN)
    if after is not None and NAME_PATTERN.fullmatch(name) and after.lower() == name.lower():
        bad("after", f"a chain that ends; this one is a cycle of jobs that follow each other ({name} -> {name}: "
                     "a run of each would start the next, forever)")
    after_outcome = choice("after_outcome")
    max_attempts = whole("max_attempts")
    timeout_seconds = whole("timeout_seconds")
    overlap = choice("overlap")
    misfire = choice("misfire")
    grace_seconds = whole("grace_seconds")
    catchup_seconds = whole("catchup_seconds")
    lease_seconds = whole("lease_seconds")
    database = pattern("database", DATABASE_PATTERN)
    targets = raw["targets"].strip() or None
    if targets is not None:
        if len(raw["targets"]) > MAX_TARGETS_LENGTH:
            bad("targets")
        else:
            try:
                parse_targets("targets", targets)
            except ConfigError as exc:
                bad("targets", exc.expected)
        if database is not None:
            bad("database", "nothing when fleet targets are given (a job runs in its targets or in one database, "
                            "not both)")
    target_parallelism = whole("target_parallelism")
    target_stagger_seconds = whole("target_stagger_seconds")
    # @catchup_seconds as the procedure (and JOB__<name>__CATCHUP_SECONDS) checks it.
    if catchup_seconds > 0 and not errors:
        if schedule is None:
            bad("catchup_seconds", "0 for a job without a schedule (it has no slot to miss)")
        elif misfire == "skip":
            bad("catchup_seconds", "0 with misfire skip (skip records every missed slot skipped, the catch-up "
                                   "window runs them), or misfire run-once")
        elif catchup_seconds > grace_seconds:
            bad("catchup_seconds", f"at most the grace period ({grace_seconds} s): a slot older than it never runs")
        elif overlap in ("skip", "cancel-previous"):
            bad("catchup_seconds", f"0 with overlap {overlap} (the missed slots are due together and {overlap} would "
                                   "run only one of them), or overlap queue, allow or buffer-one")
    steps = _steps_field(raw, name, max_attempts, timeout_seconds, database, target_parallelism,
                         target_stagger_seconds, targets, errors)
    if errors:
        return None, errors
    return JobDefinition(name=name, sql=sql, schedule=schedule, run_at=run_at, timezone=zone, enabled=enabled,
                         max_attempts=max_attempts, timeout_seconds=timeout_seconds, overlap=overlap,
                         database=database, misfire=misfire, grace_seconds=grace_seconds, lease_seconds=lease_seconds,
                         targets=targets, target_parallelism=target_parallelism, after=after,
                         after_outcome=after_outcome, target_stagger_seconds=target_stagger_seconds,
                         catchup_seconds=catchup_seconds, steps=steps), []


# The form's steps: at most this many characters (agent.set_job_steps takes 1000000; the body 64 KiB).
MAX_STEPS_LENGTH = 60000


def _steps_field(raw: Mapping[str, str], name: str, max_attempts: int, timeout_seconds: int, database: str | None,
                 parallelism: int, stagger_seconds: int, targets: str | None, errors: list[FieldError]) -> str | None:
    """The steps field checked as the engine's planning checks agent.set_job_steps @steps (the
    rules of JOB__<name>__STEPS__<n>__*, the job's fields the steps' defaults): the text, or None."""
    text = (raw.get("steps") or "").strip()
    if not text or text.replace(" ", "") == "[]":
        return None
    if len(text) > MAX_STEPS_LENGTH:
        errors.append(FieldError("steps", text, f"at most {MAX_STEPS_LENGTH} characters of JSON"))
        return None
    problems, steps, _ = parse_steps_json(name, text, "@steps", default_max_attempts=max_attempts,
                                          default_timeout_seconds=timeout_seconds, default_database=database,
                                          default_parallelism=parallelism, default_stagger_seconds=stagger_seconds)
    if problems:
        errors.append(FieldError("steps", text, "steps agent.set_job_steps accepts: " + "; ".join(problems)))
        return None
    if steps and targets is not None:
        errors.append(FieldError("targets", targets, "nothing for a job with steps: each step gives its own targets "
                                                     "(a step without them runs in one database)"))
    return text if steps else None
