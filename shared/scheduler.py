"""The tick: sync job settings, expire stale leases, claim due occurrences, dispatch.

Every step is a small constant number of set-based statements, whatever the number of
jobs: the claim is one INSERT … SELECT over the jobs that are due, and Python computes the
next slot only for the jobs that just came due, written back in one statement.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

from .config import Settings
from .errors import AgentError, QueueError
from .messages import RunMessage
from .schedules import parse_schedule
from .store import Store

log = logging.getLogger("shared.scheduler")
UTC = timezone.utc
CONFIG_HASH_KEY = "job_config_hash"


@dataclass
class TickReport:
    now: datetime
    synced: bool = False
    expired: list[dict[str, Any]] = field(default_factory=list)
    due_jobs: int = 0
    claimed: list[dict[str, Any]] = field(default_factory=list)
    dispatched: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    statements: int = 0
    duration_ms: float = 0.0

    @property
    def skipped(self) -> list[dict[str, Any]]:
        return [run for run in self.claimed if run["status"] == "skipped"]

    def summary(self) -> dict[str, Any]:
        return {
            "now": self.now.isoformat(),
            "synced_settings": self.synced,
            "leases_expired": len(self.expired),
            "jobs_due": self.due_jobs,
            "runs_claimed": len([r for r in self.claimed if r["status"] != "skipped"]),
            "runs_skipped": len(self.skipped),
            "runs_dispatched": len(self.dispatched),
            "statements": self.statements,
            "duration_ms": round(self.duration_ms, 1),
            "errors": self.errors,
        }


class Scheduler:
    def __init__(self, store: Store, queue: Any, settings: Settings, telemetry: Any,
                 clock: Callable[[], datetime] | None = None) -> None:
        self.store = store
        self.queue = queue
        self.settings = settings
        self.telemetry = telemetry
        self.clock = clock or (lambda: datetime.now(UTC))

    def tick(self, now: datetime | None = None) -> TickReport:
        now = (now or self.clock()).astimezone(UTC)
        report = TickReport(now=now)
        started = time.perf_counter()
        statements_before = self.store.statements_executed
        steps = (self.sync_jobs, self.expire_leases, self.claim_due_runs, self.dispatch_runs)
        for step in steps:
            try:
                step(now, report)
            except QueueError as exc:
                report.errors.append(str(exc))
                log.error("tick %s: %s", step.__name__, exc)
            except Exception as exc:
                # A failed step must not hide the others' work; the caller sees the errors.
                from .sqlerrors import classify

                info = classify(exc)
                message = f"{step.__name__}: {info.message}"
                report.errors.append(message)
                log.error("tick %s", message)
                if step is self.sync_jobs and isinstance(exc, AgentError):
                    raise
        report.duration_ms = (time.perf_counter() - started) * 1000
        report.statements = self.store.statements_executed - statements_before
        self._report_metrics(report)
        return report

    # ------------------------------------------------------------ 1. settings → jobs

    def sync_jobs(self, now: datetime, report: TickReport) -> None:
        store = self.store
        current = store.execute("get_state", state_key=CONFIG_HASH_KEY).scalar()
        if current == self.settings.config_hash:
            return
        rows: list[dict[str, Any]] = []
        for job in self.settings.jobs:
            schedule = parse_schedule(job.schedule, job.timezone)
            rows.append({
                "job_name": job.name, "schedule": job.schedule, "timezone": job.timezone,
                "command": job.command, "target_database": job.database,
                "enabled": int(job.enabled), "valid": 1, "config_error": None,
                "max_attempts": job.max_attempts, "timeout_seconds": job.timeout_seconds,
                "lease_seconds": job.lease_seconds, "misfire": job.misfire,
                "grace_seconds": job.grace_seconds, "overlap": job.overlap,
                "next_due_at": store.json_time(schedule.initial_due(now)) if job.enabled else None,
            })
        for bad in self.settings.invalid_jobs:
            rows.append({
                "job_name": bad.name[:64], "schedule": "", "timezone": "UTC", "command": "",
                "target_database": None, "enabled": 0, "valid": 0, "config_error": bad.message,
                "max_attempts": 1, "timeout_seconds": 1, "lease_seconds": 60, "misfire": "skip",
                "grace_seconds": 0, "overlap": "skip", "next_due_at": None,
            })
        with store.transaction():
            store.execute("record_config_events", jobs=rows, now=now)
            store.execute("upsert_jobs", jobs=rows, now=now)
            store.execute("unconfigure_missing_jobs", jobs=rows, now=now)
            store.execute("set_state", state_key=CONFIG_HASH_KEY, state_value=self.settings.config_hash, now=now)
        report.synced = True
        for bad in self.settings.invalid_jobs:
            log.error("job %s is invalid and will not run: %s", bad.name, bad.message)
            self.telemetry.event("JobConfigInvalid", {"job": bad.name, "outcome": "invalid",
                                                      "error_message": bad.message})

    # ------------------------------------------------------------ 2. leases

    def expire_leases(self, now: datetime, report: TickReport) -> None:
        store = self.store
        with store.transaction():
            expired = store.execute("expire_leases", now=now).rows
            if expired:
                store.execute("close_dead_attempts", now=now)
        report.expired = expired
        for run in expired:
            if not run.get("was_running"):
                continue
            log.warning("run %s (%s): lease expired; now %s", run["run_id"], run["job_name"] or "task", run["status"])
            self.telemetry.event("LeaseExpired", _run_properties(run, outcome=run["status"]),
                                 operation_id=run.get("operation_id"))

    # ------------------------------------------------------------ 3. claims

    def claim_due_runs(self, now: datetime, report: TickReport) -> None:
        store = self.store
        late_cutoff = now - timedelta(seconds=self.settings.agent.misfire_threshold_seconds)
        # Claim and advance commit together: a crash in between cannot leave a job
        # claimed but not moved on (its next slot would otherwise wait for a later tick).
        with store.transaction():
            claimed = store.execute("claim_due_runs", now=now, late_cutoff=late_cutoff).rows
            # Every due job moves to its next slot, including jobs whose run a concurrent
            # tick inserted: the claim is idempotent, this makes progress. The next slot
            # depends only on (schedule, time zone, now): computed once per schedule.
            schedules = store.execute("select_due_schedules", now=now).rows
            advances = []
            for row in schedules:
                try:
                    following = parse_schedule(row["schedule"], row["timezone"]).next_after(now)
                except (ValueError, OverflowError) as exc:
                    # Settings were validated before sync; a row edited by hand must not stop the others.
                    log.error("schedule %r (%s): cannot compute the next slot (%s); its jobs stop until fixed",
                              row["schedule"], row["timezone"], exc)
                    following = None
                advances.append({"schedule": row["schedule"], "timezone": row["timezone"],
                                 "next_due_at": store.json_time(following)})
            if advances:
                report.due_jobs = store.execute("advance_due_jobs", advances=advances, now=now).rowcount
        report.claimed = claimed
        if not self.telemetry.enabled:
            return  # per-run events cost Python time even as no-ops; skip the loop
        for run in claimed:
            properties = _run_properties(run, outcome=run["status"])
            note = run.get("note") or ""
            if run["status"] == "skipped":
                name = "OverlapSkipped" if note.startswith("overlap") else "MisfireSkipped"
                log.info("job %s slot %s skipped: %s", run["job_name"], run["scheduled_for"], note)
                self.telemetry.event(name, properties, operation_id=run.get("operation_id"))
            else:
                self.telemetry.event("RunClaimed", properties, operation_id=run.get("operation_id"))

    # ------------------------------------------------------------ 4. dispatch

    def dispatch_runs(self, now: datetime, report: TickReport) -> None:
        try:
            report.dispatched = dispatch(self.store, self.queue, self.settings, now, self.telemetry)
        except PartialDispatchError as exc:
            report.dispatched = exc.dispatched  # those messages did go out
            raise

    def _report_metrics(self, report: TickReport) -> None:
        telemetry = self.telemetry
        telemetry.metric("TickDurationMs", report.duration_ms)
        telemetry.metric("RunsDue", report.due_jobs)
        telemetry.metric("RunsClaimed", len([r for r in report.claimed if r["status"] != "skipped"]))
        telemetry.metric("RunsDispatched", len(report.dispatched))


class PartialDispatchError(QueueError):
    """The queue refused some of a dispatch: ``dispatched`` holds the runs whose messages went out."""

    def __init__(self, message: str, dispatched: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.dispatched = dispatched


def dispatch(store: Store, queue: Any, settings: Settings, now: datetime, telemetry: Any) -> list[dict[str, Any]]:
    """Mark runnable runs queued (new token each) and send their messages. A message that
    cannot be sent puts its run back to pending; if even that fails, the dispatch lease
    expires and a later tick dispatches it again. Nothing is lost either way."""
    lease_until = now + timedelta(seconds=settings.agent.dispatch_lease_seconds)
    runs = store.execute("dispatch_runs", now=now, lease_until=lease_until,
                         max_in_flight=settings.agent.max_concurrency).rows
    if not runs:
        return []
    runs.sort(key=lambda r: r["run_id"])
    bodies = [RunMessage(run_id=r["run_id"], token=r["token"], operation_id=r["operation_id"]).to_json()
              for r in runs]
    try:
        queue.send_many(bodies)
    except QueueError as exc:
        sent = max(0, int(getattr(exc, "sent", 0) or 0))
        unsent = runs[sent:]
        try:
            store.execute("release_dispatch", runs=[{"run_id": r["run_id"], "token": r["token"]} for r in unsent])
        except Exception as release_error:  # the dispatch lease covers this case
            log.error("could not put back %d undispatched runs (their lease will): %s", len(unsent), release_error)
        for run in runs[:sent] if telemetry.enabled else ():
            _dispatched_event(telemetry, run)
        raise PartialDispatchError(f"{exc} ({len(unsent)} run(s) left pending for the next tick)",
                                   runs[:sent]) from exc
    for run in runs if telemetry.enabled else ():
        _dispatched_event(telemetry, run)
    return runs


def _dispatched_event(telemetry: Any, run: dict[str, Any]) -> None:
    telemetry.event("RunDispatched", _run_properties(run, outcome="queued"), operation_id=run.get("operation_id"))


def _run_properties(run: dict[str, Any], **extra: Any) -> dict[str, Any]:
    properties = {
        "job": run.get("job_name") or "(task)",
        "run_id": run.get("run_id"),
        "attempt": run.get("attempt"),
        "scheduled_for": run.get("scheduled_for"),
        "token": run.get("token"),
        "kind": run.get("kind"),
    }
    properties.update(extra)
    return properties
