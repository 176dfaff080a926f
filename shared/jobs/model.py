"""What a job is, as the engine reads it: JobDefinition, StepDefinition, InvalidJob and the
policies they take. Pure: no parsing of settings, no database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum

from shared.jobs.schedules import parse_schedule

JOB_SETTING_PREFIX = "JOB__"


MAX_STEPS = 100


NOTIFY_POLICIES = ("on_failure", "on_success", "on_completion", "never")


# Column sizes of agent.jobs (every dialect): a longer value is refused at validation.
MAX_SCHEDULE_LENGTH = 400


# A schedule must have a slot within this many years of now, or it never runs (e.g. 30 February).
SCHEDULE_HORIZON_YEARS = 50


SCHEDULE_HORIZON = timedelta(days=366 * SCHEDULE_HORIZON_YEARS)


MISFIRE_POLICIES = ("run-once", "skip")


OVERLAP_POLICIES = ("skip", "queue", "allow", "buffer-one", "cancel-previous")


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
    # TARGET_STAGGER_SECONDS: execution n of a run's fleet step starts no earlier than (n - 1) times
    # this after the step fanned out (0: as the window lets them in).
    target_stagger_seconds: int = 0

    def to_json(self) -> dict:
        entry = dict(self.__dict__)
        if not entry["target_stagger_seconds"]:
            # Left out when 0: the steps (and the definition hash) of every job that does not
            # stagger stay what they were, and a run's steps still read in an older version.
            del entry["target_stagger_seconds"]
        return entry


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
    # JOB__<name>__EXCLUDE / ONLY / ON_EXCLUDED: the calendars the job's slots avoid or keep to,
    # whole, as JSON (shared.jobs.calendars.CalendarRules); "" when it names none.
    calendars: str = ""
    # JOB__<name>__JITTER_SECONDS: each slot runs 0 to this many seconds late (schedules.jitter_offset).
    jitter_seconds: int = 0
    # JOB__<name>__CATCHUP_SECONDS: after downtime, every missed slot within this many seconds of
    # now runs, oldest first (0: none; the misfire policy decides the missed slots).
    catchup_seconds: int = 0
    # JOB__<name>__PARAMS__<k>__DEFAULT / __REQUIRED: the parameters the job declares, as the JSON
    # agent.jobs.params holds ({name: default or null}); "" when it declares none.
    params: str = ""
    # Alerts the agent raises itself (shared/engine/alerts.py); None: not asked for.
    # MAX_DURATION_SECONDS: a run still running past it is notified once; STOP_AFTER_SECONDS: it
    # is stopped (as `stop`); SLOWER_THAN: a run slower than this multiple of the job's recent p95
    # is notified once; DEADLINE_SECONDS: a slot without a success that long after it, once.
    max_duration_seconds: int | None = None
    stop_after_seconds: int | None = None
    slower_than: float | None = None
    deadline_seconds: int | None = None

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
