"""The tick — the safety net, not what makes work prompt.

Every minute (AGENT_TICK_SCHEDULE) a tick:

1. reads the database's clock (the agent's one clock, see shared/control/clock.py); a tick at a time
   further from it than AGENT_MAX_CLOCK_SKEW_SECONDS, either way (an operator's `--now`, an
   explicit clock), changes nothing and says so; the state a clock far ahead left behind (an
   older version's tick on a runaway instance clock) is undone, against the database's clock;
2. syncs the job settings, when they changed: a job whose schedule changed or that was disabled
   gets its slots claimed ahead recorded skipped, one whose other settings changed gets them
   into its slots claimed ahead, one whose settings stand is left as it is;
3. expires leases whose holder stopped renewing them (a lapse, not a failure);
4. claims every slot up to the next tick plus AGENT_LOOKAHEAD_MARGIN_SECONDS, one run per
   (job, slot): each becomes runnable at its slot, never before; slots missed while the agent
   was down are recorded (skipped, or caught up once, per the job's misfire policy); a slot a
   change of the job's definition had recorded skipped is claimed again, in place, when the
   definition now in force plans it (enabled again, added back, a schedule with the same slot);
4b. when a job asks for alerts (MAX_DURATION_SECONDS, STOP_AFTER_SECONDS, SLOWER_THAN,
   DEADLINE_SECONDS), stops the runs past their STOP_AFTER_SECONDS and writes each alert due once
   to the notification outbox (shared/engine/alerts.py);
5. in queue mode, dispatches (due runs up to the cap, and every run due within the lookahead
   as a message delayed until its slot) and leaves a chain of doorbells until the next tick.

Every step is a small constant number of set-based statements, whatever the number of jobs;
Python computes slots only for the jobs that have one before the horizon. Statements that lock
several rows lock them in one order (by key), and a step that loses a race for locks anyway
(a deadlock victim, SQLite busy) is run again within the tick: ticks racing each other all end
well, with one run per (job, slot).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from shared.control.sqlerrors import classify, describe, is_lock_conflict
from shared.control.store import Store
from shared.engine.alerts import alert_columns, has_alerts, raise_alerts
from shared.engine.condition_alerts import check_condition_alerts, settings_rows
from shared.engine.dispatch import claim_horizon, dispatch, ring_doorbells, run_properties
from shared.engine.fleet import fleet_steps, report_moved_runs
from shared.engine.follow import ending_calls, follow_up_rows, report_follow_ups
from shared.engine.operations import start_for_alert
from shared.engine.liveness import LAST_TICK_KEY, tick_period_seconds, tick_record
from shared.engine.slots import SlotPlan, apply_calendars, calendar_rules, with_jitter
from shared.engine.planning import plan_database_jobs, refused_settings_job_error, stand_in_name
from shared.errors import AgentError, ClockSkewError, PartialDispatchError, QueueError
from shared.jobs.chains import find_cycles, run_order, show_chain
from shared.jobs.model import JOB_SETTING_PREFIX
from shared.jobs.run_model import RunStatus
from shared.jobs.schedules import CronSchedule, parse_schedule, validate_timezone
from shared.jobs.targets import describe_members, dialect_problem
from shared.settings import Settings
from shared.values import printable

log = logging.getLogger(__name__)
UTC = timezone.utc
CONFIG_HASH_KEY = "job_config_hash"
# Slots a job may claim per tick: a per-second job claims ~90 per minute tick; the rest of a
# larger window waits for the next tick (the job's next slot stays where it stopped).
MAX_SLOTS_PER_JOB = 1000
# Missed slots (the agent was down) recorded one by one per job and tick; beyond this the
# last recorded one says how many more were missed, and the scan stops after MAX_MISSED_SCAN.
MAX_MISSED_RECORDED = 100
MAX_MISSED_SCAN = 100_000
# Retention: rows of each kind (runs with their attempts, job events, poison messages) one tick
# purges at most, so a backlog (retention shortened, or a first upgrade) is worked off over many
# ticks at a bounded cost each: 1,440 ticks a day purge far more than a minutely job adds.
PURGE_BATCH = 1000
# A step that lost a race for locks (deadlock victim, lock timeout, SQLite busy) runs again, up
# to this many times in all, after a short random pause (the racers fall out of step).
STEP_ATTEMPTS = 6

NOTE_MISFIRE_SKIP = "misfire: slot missed by more than AGENT_MISFIRE_THRESHOLD_SECONDS; policy skip"
NOTE_MISFIRE_GRACE = "misfire: slot older than the job's GRACE_SECONDS; skipped"
NOTE_MISFIRE_SUPERSEDED = "misfire: slot missed while the agent was down; caught up once, with the latest missed slot"
NOTE_CATCH_UP = "misfire: caught up late, once"
# CATCHUP_SECONDS: a missed slot within the window runs (a claim never skips it as a misfire: the
# note's prefix "catch-up:" says so to dispatch_runs, claim_runs and start_run); one before it is skipped.
NOTE_CATCHUP_WINDOW = "catch-up: missed slot within CATCHUP_SECONDS={seconds}; run late, oldest first"
NOTE_CATCHUP_OLDER = "misfire: slot missed before the job's CATCHUP_SECONDS window; skipped"
# At most this many missed slots of one catch-up window run (the latest of them, found from the
# window's end however large it is); the older ones are counted up to MAX_DROPPED_COUNTED (past
# it, the note and the warning say "at least").
MAX_CATCHUP_SLOTS = 1000
MAX_DROPPED_COUNTED = 10_000
# A slot that came while its job was paused (sql-agent pause, agent.pause_job).
NOTE_PAUSED = "paused"
# One slot's decision: (slot, status, note, runnable_at); runnable_at None: at the slot itself.
# A slot a calendar excludes (JOB__<name>__EXCLUDE / ONLY): "calendar: <name>", "calendar: not in <names>".
NOTE_CALENDAR = "calendar:"


@dataclass
class TickReport:
    now: datetime
    # The database's clock as the tick read it, and the tick's time minus it (seconds).
    reference: datetime | None = None
    skew_seconds: float = 0.0
    # True when the tick changed nothing because its time was too far from the database's.
    refused: bool = False
    lock_retries: int = 0
    synced: bool = False
    expired: list[dict[str, Any]] = field(default_factory=list)
    due_jobs: int = 0
    claimed: list[dict[str, Any]] = field(default_factory=list)
    dispatched: list[dict[str, Any]] = field(default_factory=list)
    skipped_at_start: list[dict[str, Any]] = field(default_factory=list)
    recovered: list[dict[str, Any]] = field(default_factory=list)
    planned: list[dict[str, Any]] = field(default_factory=list)
    # Runs STOP_AFTER_SECONDS stopped, and the alerts this tick wrote (shared/engine/alerts.py).
    stopped: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[dict[str, Any]] = field(default_factory=list)
    # Condition alerts (shared/engine/condition_alerts.py): those checked, and what they answered.
    condition_alerts_checked: list[str] = field(default_factory=list)
    condition_alerts: list[dict[str, Any]] = field(default_factory=list)
    doorbells: int = 0
    purged: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    statements: int = 0
    duration_ms: float = 0.0

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return [run for run in self.claimed if run["status"] == RunStatus.SKIPPED]

    def summary(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "database_now": self.reference.isoformat() if self.reference else None,
            "clock_skew_seconds": round(self.skew_seconds, 3),
            "refused": self.refused,
            "lock_retries": self.lock_retries,
            "synced_settings": self.synced,
            "leases_expired": len(self.expired),
            "jobs_due": self.due_jobs,
            "runs_claimed": len([r for r in self.claimed if r["status"] != RunStatus.SKIPPED]),
            "runs_skipped": len(self.skipped) + len(self.skipped_at_start),
            "runs_dispatched": len(self.dispatched),
            "doorbells": self.doorbells,
            "clock_recovered": len(self.recovered),
            "history_purged": sum(self.purged.values()),
            "database_jobs_planned": len(self.planned),
            "runs_stopped": len(self.stopped),
            "alerts_raised": len(self.alerts),
            "condition_alerts_checked": len(self.condition_alerts_checked),
            "condition_alerts_raised": len(self.condition_alerts),
            "statements": self.statements,
            "duration_ms": round(self.duration_ms, 1),
            "errors": self.errors,
            "warnings": self.warnings,
        }


class Scheduler:
    def __init__(self, store: Store, queue: Any, settings: Settings, telemetry: Any,
                 clock: Callable[[], datetime] | None = None,
                 reference_clock: Callable[[], datetime] | None = None) -> None:
        """``queue`` is None in the local runner's direct mode (workers claim from agent.runs);
        ``reference_clock`` is what the tick's time is checked against: the database's clock,
        read at the tick (or the explicit test clock the agent was given)."""
        self.store = store
        self.queue = queue
        self.settings = settings
        self.telemetry = telemetry
        self.clock = clock or (lambda: datetime.now(UTC))
        # None: simulated time (tests): a tick's own time is taken as the truth, unchecked.
        self.reference_clock = reference_clock

    def tick(self, now: datetime | None = None) -> TickReport:
        """One tick at ``now`` (by default the agent's clock: the database's). A ``now`` further
        from the database's clock than AGENT_MAX_CLOCK_SKEW_SECONDS, either way, changes
        nothing: the report is ``refused`` with one line saying why."""
        started = time.perf_counter()
        statements_before = self.store.statements_executed
        try:
            reference = (self.reference_clock() if self.reference_clock is not None
                         else (now or self.clock())).astimezone(UTC)
        except Exception as exc:
            # Without the database's time the tick cannot know what is due: nothing changes.
            report = TickReport(now=(now or datetime(1970, 1, 1, tzinfo=UTC)).astimezone(UTC))
            report.errors.append(f"check_clock: {describe(exc)}")
            log.error("tick: cannot read the database's clock: %s", describe(exc))
            report.duration_ms = (time.perf_counter() - started) * 1000
            return report
        now = (now or self.clock()).astimezone(UTC)
        report = TickReport(now=now, reference=reference, skew_seconds=(now - reference).total_seconds())
        # The tick's time is only checked (check_clock): every other step decides on the database's
        # clock (design invariant 11), so a time within the skew, ahead or behind, can make no slot
        # look missed before it is, no live lease look lapsed, no job start from a slot before it
        # was defined (issue 34 item 7). Without a reference (simulated time) the time given is it.
        decided_at = reference if self.reference_clock is not None else now
        steps = [self.check_clock, self.sync_jobs, self.plan_database_jobs, self.expire_leases,
                 self.progress_fleets, self.recover_clock_jumps, self.claim_slots]
        if has_alerts(self.settings):
            steps.append(self.raise_alerts)
        steps.append(self.check_condition_alerts)
        if self.queue is not None:
            steps += [self.dispatch_runs, self.ring_doorbells]
        steps.append(self.purge_history)
        for step in steps:
            try:
                self._run_step(step, now if step == self.check_clock else decided_at, report)
            except ClockSkewError as exc:
                report.errors.append(str(exc))
                report.refused = True
                log.info("%s", exc)   # said once by the caller: the CLI's error line, the timer's log
                break
            except QueueError as exc:
                report.errors.append(str(exc))
                log.error("tick %s: %s", step.__name__, describe(exc))
            except Exception as exc:
                # A failed step must not hide the others' work; the caller sees the errors.
                message = f"{step.__name__}: {describe(exc)}"
                report.errors.append(message)
                log.error("tick %s", message)
                if step == self.sync_jobs and isinstance(exc, AgentError):
                    raise
        report.duration_ms = (time.perf_counter() - started) * 1000
        report.statements = self.store.statements_executed - statements_before
        self._report_metrics(report)
        return report

    def _run_step(self, step: Callable[[datetime, TickReport], None], now: datetime, report: TickReport) -> None:
        """Run one step; a step that lost a race for locks (its transaction was rolled back,
        nothing done) runs again after a short random pause, up to STEP_ATTEMPTS in all."""
        for attempt in range(1, STEP_ATTEMPTS + 1):
            try:
                step(now, report)
                return
            except (ClockSkewError, QueueError, PartialDispatchError):
                raise
            except Exception as exc:
                if attempt == STEP_ATTEMPTS or not is_lock_conflict(exc):
                    raise
                report.lock_retries += 1
                pause = random.uniform(0.01, 0.05 * 2 ** attempt)
                log.info("tick %s lost a race for locks (%s); running it again in %.2f s (attempt %d of %d)",
                         step.__name__, describe(exc), pause, attempt + 1, STEP_ATTEMPTS)
                time.sleep(pause)

    # ------------------------------------------------------------ 0. the clock

    def check_clock(self, now: datetime, report: TickReport) -> None:
        """A tick whose time is further from the database's clock than the allowed skew changes
        nothing. Ahead, it would claim slots that have not come and move jobs out of reach;
        behind, it would take state other ticks wrote at the right time (claimed slots, jobs
        moved on) for the work of a runaway clock, and record false misfires."""
        skew = self.settings.agent.max_clock_skew_seconds
        reference = report.reference or now
        off = (now - reference).total_seconds()
        if abs(off) > skew:
            way = "ahead of" if off > 0 else "behind"
            message = (f"tick refused: its time {now.isoformat()} is {_span(abs(off))} {way} the database's clock "
                       f"({reference.isoformat()}), more than AGENT_MAX_CLOCK_SKEW_SECONDS={skew}; nothing was "
                       "changed (give --now a time within the skew, or fix the clock that supplied it)")
            self.telemetry.event("ClockSkewDetected", {"outcome": "refused", "skew_seconds": round(off, 3),
                                                       "error_message": message})
            raise ClockSkewError(message)

    def recover_clock_jumps(self, now: datetime, report: TickReport) -> None:
        """Undo what a tick whose clock ran far ahead of the database's did (an older version's
        tick; this one refuses such a time): jobs it moved past their next real slot start again
        from now; the slots it claimed that have not come are removed (they are claimed again
        when their time comes); leases it set far ahead are shortened. "Far" is measured from
        the database's clock, so state written at the right time is never touched, and a second
        pass finds nothing (what it fixed is no longer ahead)."""
        store = self.store
        agent = self.settings.agent
        reference = max(now, report.reference or now)
        far = reference + timedelta(seconds=agent.max_clock_skew_seconds)
        far_lease = far + timedelta(seconds=max(3600, agent.dispatch_lease_seconds) + self._lookahead_span(reference))
        with store.transaction():
            jobs = store.execute("select_runaway_jobs", far=far).rows
            advances, events = [], []
            for job in jobs:
                try:
                    following = parse_schedule(job["schedule"], job["timezone"]).initial_due(now)
                except (ValueError, OverflowError):
                    following = None
                advances.append({"schedule": job["schedule"], "timezone": job["timezone"],
                                 "from_due": store.json_time(job["next_due_at"]),
                                 "next_due_at": store.json_time(following)})
                events.append({"job_name": job["job_name"], "kind": "clock_recovered",
                               "detail": f"a tick at {_iso(job['advanced_at'])} (ahead of this one at {now.isoformat()} "
                                         f"by more than AGENT_MAX_CLOCK_SKEW_SECONDS) had moved the next slot to "
                                         f"{_iso(job['next_due_at'])}; it starts again from {_iso(following)}"})
            if advances:
                store.execute("advance_jobs", advances=advances, now=now)
            runs = store.execute("recover_runaway_runs", far=far, far_lease=far_lease, now=now).rows
            for run in runs:
                if run["job_name"]:
                    events.append({"job_name": run["job_name"], "kind": "clock_recovered",
                                   "detail": f"run {run['run_id']} for slot {_iso(run['scheduled_for'])}, created by a "
                                             f"tick whose clock ran ahead: {run['action']}"})
            if events:
                store.execute("insert_job_events", events=events, now=now)
        report.recovered = jobs + runs
        if report.recovered:
            message = (f"clock recovery: {len(jobs)} job(s) whose next slot a clock far ahead had moved, "
                       f"{len(runs)} run(s) it had created or leased")
            report.warnings.append(message)
            log.warning(message)
            self.telemetry.event("ClockSkewDetected", {"outcome": "recovered", "error_message": message})

    # ------------------------------------------------------------ 1. settings → jobs

    def sync_jobs(self, now: datetime, report: TickReport) -> None:
        store = self.store
        current = store.execute("get_state", state_key=CONFIG_HASH_KEY).scalar()
        if current == self.settings.config_hash:
            return
        rows: list[dict[str, Any]] = []
        refused_here: list[tuple[str, str]] = []
        for job in self.settings.jobs:
            problem = fleet_problem(job, store.target.dialect)
            if problem:
                # Only the database knows its dialect: a fleet it cannot run makes this job alone invalid.
                rows.append(_invalid_row(job.name, problem))
                refused_here.append((job.name, problem))
                continue
            rows.append({
                "job_name": job.name, "schedule": job.schedule, "timezone": job.timezone,
                "command": job.command, "target_database": job.database,
                "enabled": int(job.enabled), "valid": 1, "config_error": None,
                "max_attempts": job.max_attempts, "timeout_seconds": job.timeout_seconds,
                "lease_seconds": job.lease_seconds, "misfire": job.misfire,
                "grace_seconds": job.grace_seconds, "overlap": job.overlap,
                "steps": job.steps_json(), "notify": job.notify, "notify_webhook_url": job.notify_webhook_url,
                "after_job": job.after, "after_outcome": job.after_outcome.value if job.after else None,
                "calendars": job.calendars or None, "jitter_seconds": job.jitter_seconds,
                **alert_columns(job),
                # Only when set: the definition hash of every other job stays what it was.
                **({"catchup_seconds": job.catchup_seconds} if job.catchup_seconds else {}),
                "next_due_at": store.json_time(_initial_due(job.schedule, job.timezone, now)) if job.enabled else None,
                # Only when declared: the definition hash of every other job stays what it was.
                **({"params": job.params} if job.params else {}),
            })
        for bad in self.settings.invalid_jobs:
            rows.append(_invalid_row(bad.key or bad.name, bad.message))
        try:
            self._write_jobs(rows, now)
        except Exception as exc:
            info = classify(exc)
            if info.kind == "transient" or info.connection_lost:
                raise
            # A value the validation did not foresee: find the job(s) the database refuses and
            # record them invalid with its own words, so every other job still syncs.
            log.error("settings sync: the database refused the jobs as a whole (%s); syncing them one by one",
                      describe(exc))
            rows = self._isolate_refused_jobs(rows, now)
            self._write_jobs(rows, now)
        report.synced = True
        for name, message in refused_here:
            log.error("job %s is invalid and will not run: %s", name, message)
            self.telemetry.event("JobConfigInvalid", {"job": name, "outcome": "invalid", "error_message": message})
        for bad in self.settings.invalid_jobs:
            log.error("job %s is invalid and will not run: %s", bad.key or bad.name, bad.message)
            self.telemetry.event("JobConfigInvalid", {"job": bad.key or bad.name, "outcome": "invalid",
                                                      "error_message": bad.message})

    def _write_jobs(self, rows: list[dict[str, Any]], now: datetime) -> None:
        store = self.store
        with store.transaction():
            # Under the job-definitions lock the procedures take too: a name is held by one source.
            store.execute("lock_job_definitions")
            database_jobs = store.execute("list_database_job_names").rows
            held = {row["job_name"].casefold(): row["job_name"] for row in database_jobs}
            refused = []
            if held:
                for index, row in enumerate(rows):
                    holder = held.get(row["job_name"].casefold())
                    if holder is not None:
                        message = refused_settings_job_error(row["job_name"], holder)
                        rows[index] = _invalid_row(stand_in_name(row["job_name"]), message)
                        refused.append((row["job_name"], message))
                refused += _refuse_cycles_through_database_jobs(rows, database_jobs)
            rows = _spell_followed_jobs_as_defined(rows, held)
            rows = [_with_definition_hash(row) for row in rows]
            # Each statement takes the jobs in batches of at most SYNC_BATCH_BYTES of JSON (one
            # batch for all but huge settings: the same statements as ever): a job's calendars
            # travel whole with it, and a thousand jobs naming big calendars would be one
            # statement over what the server takes (PostgreSQL's 1 GB message, SQLite's string).
            batches = sync_batches(rows)
            for batch in batches:
                store.execute("record_config_events", jobs=batch, now=now)
            # Slots claimed ahead: skipped when the job stops running them (disabled, invalid,
            # removed, another schedule), given the new settings when it still runs them; the
            # claim that follows takes back those the new definition runs (claim_slots).
            for batch in batches:
                store.chain(("skip_runs_of_changed_jobs", {"jobs": batch, "now": now}),
                            ("refresh_runs_of_changed_jobs", {"jobs": batch}))
            for batch in batches:
                store.execute("upsert_jobs", jobs=batch, now=now)
            store.execute("unconfigure_missing_jobs", jobs=rows if len(batches) == 1 else
                          [{"job_name": row["job_name"]} for row in rows], now=now)
            # The settings' condition alerts, with the jobs (an ALERT__ change changes the hash).
            held_alerts = store.execute("sync_settings_alerts", alerts=settings_rows(self.settings), now=now).rows
            store.execute("set_state", state_key=CONFIG_HASH_KEY, state_value=self.settings.config_hash, now=now)
        for name, message in refused:
            log.error("job %s is invalid and will not run: %s", name, message)
            self.telemetry.event("JobConfigInvalid", {"job": name, "outcome": "invalid", "error_message": message})
        for row in held_alerts:
            log.error("alert %s of the settings (ALERT__%s__*) is not in force: an alert of that name was defined with "
                      "agent.add_alert, which holds the name", row["alert_name"], row["alert_name"])
        for bad in getattr(self.settings, "invalid_alerts", ()):
            log.error("alert %s is invalid and will not run: %s", printable(bad.name), bad.message)

    def _isolate_refused_jobs(self, rows: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
        """Only after the bulk write failed: try each job alone (rolled back) and turn those the
        database refuses into invalid jobs carrying the database's message."""
        store = self.store
        result = []
        for row in rows:
            try:
                with store.transaction():
                    store.execute("upsert_jobs", jobs=[row], now=now)
                    raise _Probe()
            except _Probe:
                result.append(row)
            except Exception as exc:
                info = classify(exc)
                if info.kind == "transient" or info.connection_lost:
                    raise
                message = f"JOB__{row['job_name']}__*: the database refused this job's settings: {describe(exc)}"
                log.error("%s", message)
                result.append(_invalid_row(row["job_name"][:64], message))
        return result

    # ------------------------------------------------------------ 1b. jobs defined in the database

    def plan_database_jobs(self, now: datetime, report: TickReport) -> None:
        report.planned = plan_database_jobs(self.store, now, self.telemetry).planned

    def poll(self, now: datetime | None = None) -> TickReport:
        """Between ticks (each doorbell, each local-runner poll): plan the jobs the procedures
        defined, and claim their slots up to the next tick, so a job defined a few seconds before
        its slot does not wait for the minute timer. One statement when nothing waits."""
        now = (now or self.clock()).astimezone(UTC)
        report = TickReport(now=now)
        statements_before = self.store.statements_executed
        self.plan_database_jobs(now, report)
        if any(job["valid"] and job["next_due_at"] is not None for job in report.planned):
            self.claim_slots(now, report)
        report.statements = self.store.statements_executed - statements_before
        return report

    # ------------------------------------------------------------ 2. leases

    def expire_leases(self, now: datetime, report: TickReport) -> None:
        store = self.store
        followed: list[dict[str, Any]] = []
        with store.transaction():
            expired = store.execute("expire_leases", now=now, max_lapses=self.settings.agent.max_lapses).rows
            if expired:
                store.execute("close_dead_attempts", now=now)
                if any(run["status"] == RunStatus.FAILED for run in expired):
                    # A run failed by its last lapse is notified, and starts its followers, like any failed run.
                    for name, params in ending_calls(self.settings, now):
                        followed += follow_up_rows([(name, params)], [store.execute(name, **params)])
        report.expired = expired
        report_follow_ups(followed, self.telemetry)
        for run in expired:
            if not run.get("was_running"):
                continue
            log.warning("run %s (%s): lease lapsed (%s of AGENT_MAX_LAPSES=%s); now %s", run["run_id"],
                        run["job_name"] or "task", run["lapses"], self.settings.agent.max_lapses, run["status"])
            self.telemetry.event("LeaseExpired", run_properties(run, outcome=run["status"]),
                                 operation_id=run.get("operation_id"))

    # ------------------------------------------------------------ retention

    def progress_fleets(self, now: datetime, report: TickReport) -> None:
        """The safety net of fleet steps: executions of runs that no longer wait for them
        (cancelled, stopped) are cancelled, waiting ones let in, and runs whose executions all
        ended (one lapsed for good, or was poisoned unread) move on — one statement, whatever
        the number of fleets; their outcomes are notified in the same transaction."""
        store = self.store
        followed: list[dict[str, Any]] = []
        with store.transaction():
            moved = store.execute("progress_fleets", parent_run_id=None, run_id=None, token=None, now=now).rows
            if any(row["status"] in (RunStatus.SUCCEEDED, RunStatus.FAILED) for row in moved):
                for name, params in ending_calls(self.settings, now):
                    followed += follow_up_rows([(name, params)], [store.execute(name, **params)])
        report_moved_runs(moved, self.telemetry)
        report_follow_ups(followed, self.telemetry)

    def purge_history(self, now: datetime, report: TickReport) -> None:
        """Purge history older than AGENT_HISTORY_RETENTION_DAYS (poison older than
        AGENT_POISON_RETENTION_DAYS), at most PURGE_BATCH rows of each kind per tick, in one
        statement batch. 0 days keeps that kind forever."""
        agent = self.settings.agent
        # The tick's liveness record (shared/engine/liveness.py) rides in this step's batch: on
        # PostgreSQL no round trip of its own.
        record = ("set_state", {"state_key": LAST_TICK_KEY, "now": now, "state_value": tick_record(
            now, tick_period_seconds(agent.tick_schedule, agent.quiet_max_minutes, now))})
        if not agent.history_retention_days and not agent.poison_retention_days:
            self.store.execute(record[0], **record[1])
            return
        # A retention of 0 is "forever": a cut-off no row can be older than.
        forever = datetime(1900, 1, 1, tzinfo=UTC)
        history_before = now - timedelta(days=agent.history_retention_days) if agent.history_retention_days else forever
        poison_before = now - timedelta(days=agent.poison_retention_days) if agent.poison_retention_days else forever
        with self.store.transaction():
            results = self.store.chain(
                ("purge_history", {"history_before": history_before, "poison_before": poison_before,
                                   "batch": PURGE_BATCH}),
                ("purge_notifications", {"history_before": history_before, "batch": PURGE_BATCH}),
                record)
            rows = [row for result in results[:2] for row in result.rows]
        purged: dict[str, int] = {}
        for row in rows:
            purged[row["purged"]] = purged.get(row["purged"], 0) + int(row["rows_purged"])
        report.purged = {kind: count for kind, count in purged.items() if count}
        if report.purged:
            log.info("retention: purged %s", ", ".join(f"{count} {kind}" for kind, count in report.purged.items()))

    # ------------------------------------------------------------ 3. claims

    def _lookahead_span(self, now: datetime) -> float:
        return (claim_horizon(self.settings, now) - now).total_seconds()

    def claim_slots(self, now: datetime, report: TickReport) -> None:
        store = self.store
        agent = self.settings.agent
        horizon = claim_horizon(self.settings, now)
        late_cutoff = now - timedelta(seconds=agent.misfire_threshold_seconds)
        # Claim and advance commit together: a crash in between cannot leave a job claimed
        # but not moved on. The claim is idempotent (the unique key), so a concurrent tick
        # computing the same slots inserts nothing twice.
        with store.transaction():
            jobs = store.execute("select_due_jobs", horizon=horizon, now=now).rows
            if not jobs:
                return
            # Slots depend only on (schedule, time zone, next slot, misfire policy, grace, pause):
            # computed once per distinct one, then listed for each job.
            plans: dict[tuple, tuple[list[SlotPlan], datetime | None]] = {}
            slots = []
            advances: dict[tuple, dict[str, Any]] = {}
            for job in jobs:
                key = (job["schedule"], job["timezone"], job["next_due_at"], job["misfire"], job["grace_seconds"],
                       bool(job["paused"]), job["paused_at"], job["paused_until"], job.get("calendars"),
                       job.get("catchup_seconds"))
                if key not in plans:
                    plans[key] = _plan_slots(job, now, horizon, late_cutoff)
                planned, following = plans[key]
                if job.get("jitter_seconds"):
                    planned = with_jitter(planned, job)
                slots += [{"job_name": job["job_name"], "scheduled_for": store.json_time(slot),
                           "status": status, "note": note, "runnable_at": store.json_time(runnable)}
                          for slot, status, note, runnable in planned]
                # advance_jobs moves every job of one (schedule, time zone, next slot) together; a
                # paused job moves alone: its next slot depends on its pause (run-once holds the
                # last slot of a pause back while the pause's end is beyond the horizon).
                paused = int(bool(job["paused"]))
                advance = {"schedule": job["schedule"], "timezone": job["timezone"],
                           "from_due": store.json_time(job["next_due_at"]), "next_due_at": store.json_time(following),
                           "paused": paused}
                if paused:
                    advances[("job", job["job_name"])] = {**advance, "job_name": job["job_name"]}
                else:
                    advances[key[:3]] = advance
            claimed = store.execute("claim_slots", slots=slots, now=now).rows if slots else []
            store.execute("advance_jobs", advances=list(advances.values()), now=now)
        report.due_jobs = len(jobs)
        report.claimed = claimed
        if not self.telemetry.enabled:
            return  # per-run events cost Python time even as no-ops; skip the loop
        for run in claimed:
            properties = run_properties(run, outcome=run["status"])
            if run["status"] == RunStatus.SKIPPED:
                log.info("job %s slot %s skipped: %s", run["job_name"], run["scheduled_for"], run.get("note"))
                # A slot of a paused job is not a misfire: its pause was told once (JobPaused); nor is
                # one a calendar excludes (its note says which).
                if not str(run.get("note") or "").startswith((NOTE_PAUSED, NOTE_CALENDAR)):
                    self.telemetry.event("MisfireSkipped", properties, operation_id=run.get("operation_id"))
            else:
                self.telemetry.event("RunClaimed", properties, operation_id=run.get("operation_id"))

    # ------------------------------------------------------------ 4b. alerts

    def raise_alerts(self, now: datetime, report: TickReport) -> None:
        """Stop the runs past STOP_AFTER_SECONDS and write the alerts due (three statements,
        whatever the number of jobs); tell telemetry of those this tick wrote (another tick
        racing wrote the others, and tells them)."""
        stopped, raised = raise_alerts(self.store, now, self.settings.agent.notify_webhook_url)
        report.stopped, report.alerts = stopped, raised
        for run in stopped:
            log.warning("run %s (%s): %s", run["run_id"], run["job_name"], run["note"])
        for alert in raised:
            log.warning("alert %s: run %s (%s): %s", alert["kind"], alert["run_id"], alert["job_name"],
                        alert["detail"])
            self.telemetry.event("AlertRaised", {"job": alert["job_name"], "run_id": alert["run_id"],
                                                 "alert": alert["kind"], "outcome": alert["outcome"],
                                                 "error_message": alert["detail"]})

    # ------------------------------------------------------------ 4c. condition alerts

    def check_condition_alerts(self, now: datetime, report: TickReport) -> None:
        """Condition alerts (shared/engine/condition_alerts.py): one statement when none is due;
        a probe's failure is the alert's (a warning of the tick), never the tick's."""
        store = self.store

        def start_job(job_name: str, alert_name: str, firing_id: int) -> dict[str, Any]:
            return start_for_alert(store, now, job_name, alert_name, firing_id)

        outcome = check_condition_alerts(store, self._probe_store, now,
                                         default_url=self.settings.agent.notify_webhook_url,
                                         job_principal=self.settings.agent.job_principal, start_job=start_job)
        report.condition_alerts_checked = outcome.checked
        report.condition_alerts = outcome.firings
        for name, problem in outcome.invalid:
            log.error("alert %s is invalid and will not run: %s", printable(name), printable(problem, 2000))
        for message in outcome.probe_errors:
            report.warnings.append(message)
            log.warning("%s", message)
        for firing in outcome.firings:
            body = firing["body"]
            words = {"condition": f"{body.get('row_count', 0)} row(s)", "errors": f"{body.get('failure_count', 0)} "
                     "failure(s) of the ERRORS list", "alert_error": f"its probe failed: {body.get('error')}"}[firing["kind"]]
            if firing.get("response_run_id"):
                words += f"; started {body.get('response_job')} (run {firing['response_run_id']})"
            if firing.get("response_error"):
                words += f"; RESPONSE_JOB {body.get('response_job')}: {firing['response_error']}"
            log.warning("condition alert %s (%s): %s", firing["alert_name"], firing["kind"], words)
            self.telemetry.event("AlertRaised", {"job": body.get("response_job"), "alert": firing["kind"],
                                                 "alert_name": firing["alert_name"], "firing_id": firing["firing_id"],
                                                 "run_id": firing.get("response_run_id"), "outcome": "raised",
                                                 "error_message": words})

    def _probe_store(self) -> Store:
        """A store for the probes: its own connection, closed after each owned probe."""
        store = self.store
        return Store(store.target, store._connect, job_principal=store.job_principal, pool=store.pool)

    # ------------------------------------------------------------ 4. queue mode

    def dispatch_runs(self, now: datetime, report: TickReport) -> None:
        try:
            outcome = dispatch(self.store, self.queue, self.settings, now, self.telemetry)
        except PartialDispatchError as exc:
            report.dispatched = exc.dispatched  # those messages did go out
            raise
        report.dispatched = outcome.queued
        report.skipped_at_start = outcome.skipped

    def ring_doorbells(self, now: datetime, report: TickReport) -> None:
        report.doorbells = ring_doorbells(self.store, self.queue, self.settings, now)

    def _report_metrics(self, report: TickReport) -> None:
        telemetry = self.telemetry
        telemetry.metric("TickDurationMs", report.duration_ms)
        telemetry.metric("RunsDue", report.due_jobs)
        telemetry.metric("RunsClaimed", len([r for r in report.claimed if r["status"] != RunStatus.SKIPPED]))
        telemetry.metric("RunsDispatched", len(report.dispatched))


class _Probe(Exception):
    """Rolls back a trial write that succeeded."""


def _with_definition_hash(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``definition_hash``: a digest of every setting the sync writes for the job
    (not its next slot, which the sync only proposes). upsert_jobs leaves a job whose digest is
    the one stored as it is, so its updated_at is the time its definition last changed."""
    definition = sorted((key, value) for key, value in row.items() if key not in _NOT_DEFINITION)
    digest = hashlib.sha256(repr(definition).encode("utf-8", errors="surrogatepass")).hexdigest()
    return {**row, "definition_hash": digest}


_NOT_DEFINITION = frozenset({"next_due_at", "definition_hash"})


# The most JSON one statement of the settings sync carries (see Scheduler._write_jobs).
SYNC_BATCH_BYTES = 8 * 1024 * 1024


def sync_batches(rows: list[dict[str, Any]], limit: int | None = None) -> list[list[dict[str, Any]]]:
    """The rows in order, cut into batches whose JSON stays under ``limit`` bytes (default
    SYNC_BATCH_BYTES; a row larger than that alone in its batch); one batch when they all fit."""
    limit = SYNC_BATCH_BYTES if limit is None else limit
    batches: list[list[dict[str, Any]]] = [[]]
    size = 0
    for row in rows:
        length = len(json.dumps(row, default=str))
        if batches[-1] and size + length > limit:
            batches.append([])
            size = 0
        batches[-1].append(row)
        size += length + 1
    return batches


def _invalid_row(key: str, message: str) -> dict[str, Any]:
    return {
        "job_name": key, "schedule": "", "timezone": "UTC", "command": "",
        "target_database": None, "enabled": 0, "valid": 0, "config_error": message,
        "max_attempts": 1, "timeout_seconds": 1, "lease_seconds": 60, "misfire": "skip",
        "grace_seconds": 0, "overlap": "skip", "next_due_at": None,
        "steps": None, "notify": "never", "notify_webhook_url": None, "after_job": None, "after_outcome": None,
        "calendars": None, "jitter_seconds": 0,
    }


def _spell_followed_jobs_as_defined(rows: list[dict[str, Any]], held: dict[str, str]) -> list[dict[str, Any]]:
    """Each AFTER spelt as the job it names is: names compare case-insensitively (the cycle
    check, the stand-in for a name a database job holds), but the run-time join of follow-ups
    compares exactly, on its index; ``AFTER=T`` with the database's ``t`` would pass every check
    and never fire. ``held``: the database jobs' names by casefold; a database job holds its
    name against settings twins, so it is looked up first."""
    spelt = {row["job_name"].casefold(): row["job_name"] for row in rows if row["valid"]}
    spelt.update(held)
    out = []
    for row in rows:
        after = row.get("after_job")
        if after and spelt.get(after.casefold(), after) != after:
            row = {**row, "after_job": spelt[after.casefold()]}
        out.append(row)
    return out


def _refuse_cycles_through_database_jobs(rows: list[dict[str, Any]],
                                         database_jobs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Settings jobs whose AFTER closes a cycle through jobs defined in the database (issue 34
    item 3): the settings were checked as a whole without the database (from_settings), and a
    procedure checks each definition against every job, so a cycle that appears now goes
    through this sync's AFTERs. Every settings job of such a cycle is made invalid (its own
    config_error names the cycle); the sync goes on for the others, and the database's jobs
    are left as they are. Names compare case-insensitively, as Azure SQL compares them. Runs
    under the job-definitions lock the procedures take: one check sees both sources."""
    follows: dict[str, str] = {}
    shown: dict[str, str] = {}
    for job in database_jobs:
        shown[job["job_name"].casefold()] = job["job_name"]
        if job.get("after_job"):
            follows[job["job_name"].casefold()] = job["after_job"].casefold()
    settings_jobs: dict[str, int] = {}
    for index, row in enumerate(rows):
        if row["valid"] and row.get("after_job"):
            key = row["job_name"].casefold()
            settings_jobs[key] = index
            shown[key] = row["job_name"]
            follows[key] = row["after_job"].casefold()
    refused: list[tuple[str, str]] = []
    for key, cycle in find_cycles(follows).items():
        index = settings_jobs.get(key)
        if index is None:
            continue
        row = rows[index]
        order = show_chain([shown.get(member, member) for member in run_order(cycle, key)])
        defined_there = sorted(shown.get(member, member) for member in cycle if member not in settings_jobs)
        message = (f"{JOB_SETTING_PREFIX}{row['job_name']}__AFTER={row['after_job']!r}: a cycle of jobs that follow "
                   f"each other ({order}: a run of each would start the next, forever), through "
                   f"{', '.join(defined_there)} (defined with agent.add_scheduled_job @after); expected a chain "
                   "that ends: remove AFTER from one of them")
        rows[index] = _invalid_row(row["job_name"], message)
        refused.append((row["job_name"], message))
    return refused


def fleet_problem(job, dialect: str) -> str | None:
    """Why this control database cannot run the job's fleet steps (one line naming the
    setting), or None."""

    for step in fleet_steps(job):
        problem = dialect_problem(step.members, dialect)
        if problem:
            return f"{step.setting}={describe_members(step.members)!r}: {problem}"
    return None


def _initial_due(schedule: str, timezone_name: str, now: datetime) -> datetime | None:
    try:
        return parse_schedule(schedule, timezone_name).initial_due(now)
    except (ValueError, OverflowError):
        return None


def _plan_slots(job: dict[str, Any], now: datetime, horizon: datetime,
                late_cutoff: datetime) -> tuple[list[SlotPlan], datetime | None]:
    """The slots of one job from its next_due_at up to the horizon, each with its decision, and
    the job's next slot after them.

    * Missed slots (older than the misfire threshold) are skipped, or — misfire run-once — the
      latest one within the grace period is caught up once; the rest are pending, each runnable
      at its own slot.
    * A pause (select_due_jobs' paused, paused_at, paused_until) holds the slots that would run
      inside it: while it is in force, every slot before its end (up to the horizon, recorded
      ahead as `pause_job` records what was claimed before it), and after it ended, the slots
      that fell inside it. Each is recorded skipped "paused". Slots after its end are claimed as
      any other, runnable at their time: a pause with --until ends on the second, not at the
      next tick (issue 34 item 6). When its end is known, the misfire policy decides what it
      held: under run-once the last slot before the end is caught up once, runnable at the end,
      if within GRACE_SECONDS and no slot falls at the end itself. A pause ended by `resume` is
      decided by `resume` (settle_paused_runs), which also brings back the slots claimed ahead
      that it no longer holds (item 5)."""
    try:
        schedule = parse_schedule(job["schedule"], job["timezone"])
    except (ValueError, OverflowError) as exc:
        log.error("job %s: schedule %r (%s) cannot be read (%s); it stops until fixed",
                  job["job_name"], job["schedule"], job["timezone"], describe(exc))
        return [], None

    def following(slot: datetime) -> datetime | None:
        try:
            return schedule.next_after(slot)
        except Exception as exc:  # noqa: BLE001 - a schedule that ran out of slots
            log.error("job %s: no slot after %s (%s); it stops until its schedule is changed", job["job_name"],
                      slot.isoformat(), describe(exc))
            return None

    pause_end: datetime | None = job.get("paused_until")
    in_force = bool(job.get("paused"))

    def held(slot: datetime) -> bool:
        """Whether the pause holds the slot: in force, every slot before its end (one that came
        before the pause would start now, inside it); ended, the slots inside it."""
        if in_force:
            return pause_end is None or slot < pause_end
        return _inside_pause(job, slot)

    slot: datetime | None = job["next_due_at"]
    planned: list[SlotPlan] = []
    missed: list[datetime] = []
    scanned = 0
    latest_missed: datetime | None = None
    # CATCHUP_SECONDS: the missed slots from here on are each run (planned below, after the misfire
    # policy decided the older ones); None: the misfire policy decides every missed slot.
    catchup = int(job.get("catchup_seconds") or 0)
    window_start = now - timedelta(seconds=catchup) if catchup > 0 else None
    missed_end = late_cutoff if window_start is None else min(late_cutoff, window_start)
    while slot is not None and slot < missed_end and scanned < MAX_MISSED_SCAN:
        scanned += 1
        latest_missed = slot
        if len(missed) < MAX_MISSED_RECORDED - 1:
            missed.append(slot)
        slot = following(slot)
    scan_cut = slot is not None and slot < missed_end
    if scan_cut:  # more missed than worth scanning: the count below is a lower bound
        slot = following(missed_end - timedelta(microseconds=1))
    window: list[datetime] = []
    dropped = 0
    dropped_at_least = False
    if window_start is not None and slot is not None and slot < late_cutoff:
        # The missed slots of the window, oldest first; past MAX_CATCHUP_SLOTS only the newest
        # that many (a huge window of a frequent schedule is not a flood of runs), found from the
        # window's right end when it holds more (bounded work, whatever its size).
        window, dropped, dropped_at_least, slot = _catch_up_window(slot, late_cutoff, following)
        if dropped:
            log.warning("job %s: %s%d missed slot(s) of its CATCHUP_SECONDS=%d window before %s are not run: at most "
                        "%d are caught up, the newest", job["job_name"], "at least " if dropped_at_least else "",
                        dropped, catchup, window[0].isoformat(), MAX_CATCHUP_SLOTS)
    caught_up_missed = False
    if latest_missed is not None:
        if latest_missed not in missed:
            missed.append(latest_missed)
        unrecorded = scanned - len(missed)
        grace = timedelta(seconds=int(job["grace_seconds"]))
        free = [moment for moment in missed if not held(moment)]
        for index, moment in enumerate(missed):
            last = index == len(missed) - 1
            if held(moment):
                status, note = RunStatus.SKIPPED, NOTE_PAUSED
            elif window_start is not None:
                status, note = RunStatus.SKIPPED, NOTE_CATCHUP_OLDER
            elif job["misfire"] == "skip":
                status, note = RunStatus.SKIPPED, NOTE_MISFIRE_SKIP
            elif moment != free[-1]:
                status, note = RunStatus.SKIPPED, NOTE_MISFIRE_SUPERSEDED
            elif moment + grace < now:
                status, note = RunStatus.SKIPPED, NOTE_MISFIRE_GRACE
            else:
                status, note = RunStatus.PENDING, NOTE_CATCH_UP
                caught_up_missed = True
            if status == RunStatus.SKIPPED and _inside_pause(job, moment):
                note = NOTE_PAUSED     # missed while its pause held (it ended by itself since)
            if last and (unrecorded > 0 or scan_cut):
                note += (f" ({'at least ' if scan_cut else ''}{unrecorded} earlier missed slot(s) since "
                         f"{_iso(job['next_due_at'])} not recorded one by one)")
            planned.append((moment, status, note, None))
    for index, moment in enumerate(window):
        if held(moment):
            planned.append((moment, RunStatus.SKIPPED, NOTE_PAUSED, None))
            continue
        note = NOTE_CATCHUP_WINDOW.format(seconds=catchup)
        if index == 0 and dropped:
            note += (f" ({'at least ' if dropped_at_least else ''}{dropped} older slot(s) of the window not run: at most "
                     f"{MAX_CATCHUP_SLOTS} are caught up, the newest)")
        planned.append((moment, RunStatus.PENDING, note, None))
        caught_up_missed = True
    ahead = 0
    while slot is not None and slot <= horizon and ahead < MAX_SLOTS_PER_JOB:
        if held(slot):
            planned.append((slot, RunStatus.SKIPPED, NOTE_PAUSED, None))
        else:
            planned.append((slot, RunStatus.PENDING, None, None))
        ahead += 1
        slot = following(slot)
    planned, beyond = _catch_up_the_pause(job, planned, slot, following, now, horizon, caught_up_missed)
    rules = calendar_rules(job.get("calendars"))
    if rules:
        try:
            planned = apply_calendars(planned, rules, validate_timezone(job["timezone"]))
        except (ValueError, OverflowError) as exc:   # validated at sync: one job's surprise, not the tick's
            log.error("job %s: its calendars cannot be applied (%s); its slots run as the schedule has them",
                      job["job_name"], describe(exc))
    return planned, beyond


def _catch_up_window(first: datetime, end: datetime, following: Callable[[datetime], datetime | None]
                     ) -> tuple[list[datetime], int, bool, datetime | None]:
    """The missed slots of a CATCHUP_SECONDS window, from its first slot ``first`` to ``end``
    (the misfire cut-off, excluded): (the newest MAX_CATCHUP_SLOTS of them, oldest first; how
    many older ones are not run; whether that count is a lower bound; the job's next slot after
    the window). A window of at most MAX_CATCHUP_SLOTS slots is walked once; a larger one is
    found from its right end (_newest_slots: spans doubling back from ``end``), whatever its
    size, and the older slots are counted up to MAX_DROPPED_COUNTED (past it, "at least"):
    bounded work, and the slots that run are always the window's newest."""
    window: list[datetime] = []
    slot: datetime | None = first
    while slot is not None and slot < end and len(window) <= MAX_CATCHUP_SLOTS:
        window.append(slot)
        slot = following(slot)
    if len(window) <= MAX_CATCHUP_SLOTS:
        return window, 0, False, slot
    newest = _newest_slots(first, end, following)
    after = following(newest[-1]) if newest else following(end - timedelta(microseconds=1))
    if not newest:          # a schedule walked back to nothing: the left walk's slots
        return window[:MAX_CATCHUP_SLOTS], 1, True, after
    dropped = 0
    slot = first
    while slot is not None and slot < newest[0] and dropped < MAX_DROPPED_COUNTED:
        dropped += 1
        slot = following(slot)
    return newest, dropped, slot is not None and slot < newest[0], after


def _newest_slots(floor: datetime, end: datetime, following: Callable[[datetime], datetime | None]) -> list[datetime]:
    """The newest MAX_CATCHUP_SLOTS slots from ``floor`` to before ``end``, oldest first: a span
    back from ``end`` doubles until it holds more than that many (each count stops past it),
    then that span is walked once (at most 4 x MAX_CATCHUP_SLOTS slots; past it, the previous
    span's, fewer but the newest)."""
    span = timedelta(seconds=1)
    previous: list[datetime] = []
    for _ in range(64):
        start = max(end - span, floor)
        found: list[datetime] = []
        slot = following(start - timedelta(microseconds=1))
        while slot is not None and slot < end and len(found) <= MAX_CATCHUP_SLOTS:
            found.append(slot)
            slot = following(slot)
        if len(found) <= MAX_CATCHUP_SLOTS and start > floor:
            previous, span = found, span * 2
            continue
        if len(found) <= MAX_CATCHUP_SLOTS:
            return found
        window: deque[datetime] = deque(maxlen=MAX_CATCHUP_SLOTS)
        walked = 0
        slot = following(start - timedelta(microseconds=1))
        while slot is not None and slot < end and walked < 4 * MAX_CATCHUP_SLOTS:
            walked += 1
            window.append(slot)
            slot = following(slot)
        return list(window) if slot is None or slot >= end else previous
    return previous


def _catch_up_the_pause(job: dict[str, Any], planned: list[SlotPlan], beyond: datetime | None,
                        following: Callable[[datetime], datetime | None], now: datetime, horizon: datetime,
                        caught_up_missed: bool) -> tuple[list[SlotPlan], datetime | None]:
    """Under misfire run-once, the last slot a pause held is caught up once when the pause's end
    is known and this plan reaches that slot (the slot after it is planned too, or is
    ``beyond``): runnable at the end (now, if it has passed), within GRACE_SECONDS of its slot.
    Not when a slot falls at the end itself (it runs then), nor when a later missed slot is
    caught up. While the end lies beyond the horizon the slot is held back, unclaimed (it stays
    the job's next slot): a run pending for hours would hold back a queued overlap and show as
    the job's next run; the tick whose horizon reaches the end claims it. Returns the plan and
    the job's next slot."""
    end: datetime | None = job.get("paused_until")
    if job["misfire"] != "run-once" or end is None or job.get("paused_at") is None or caught_up_missed:
        return planned, beyond
    held = [index for index, (_, status, note, _) in enumerate(planned)
            if status == RunStatus.SKIPPED and note is not None and note.startswith(NOTE_PAUSED)]
    if not held:
        return planned, beyond
    index = held[-1]
    moment = planned[index][0]
    after = planned[index + 1][0] if index + 1 < len(planned) else beyond
    if after is None:
        after = following(moment)
    if after is not None and after < end:
        return planned, beyond          # the pause holds more slots than this plan reaches
    if after == end:
        return planned, beyond          # the slot at the end runs at the end
    runnable = max(end, now)
    if runnable > horizon:
        return planned[:index], moment  # held back until a tick's horizon reaches the end
    if runnable - moment > timedelta(seconds=int(job["grace_seconds"])):
        return planned, beyond
    planned[index] = (moment, RunStatus.PENDING, NOTE_CATCH_UP, runnable)
    return planned, beyond


def _inside_pause(job: dict[str, Any], moment: datetime) -> bool:
    """Whether ``moment`` fell inside the job's last pause (select_due_jobs' paused_at/paused_until)."""
    start, end = job.get("paused_at"), job.get("paused_until")
    return start is not None and start <= moment and (end is None or moment < end)


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def tick_schedule(settings: Settings) -> CronSchedule:
    return CronSchedule(settings.agent.tick_schedule, "UTC")
