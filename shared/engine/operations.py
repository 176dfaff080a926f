"""Operator actions, in one place: what `sql-agent submit`, `cancel`, `stop`, `poison requeue`,
`run-now`, `pause`, `resume`, `grant-sql --apply` and `import-sqlagent --apply` do to the control
database.

Each action is one transaction (or one chain of statements) and returns a typed result; the
front ends (the command line, and any other that acts for an operator) parse their arguments,
call one of these and print or render the result. An action that cannot be done raises the
engine's errors (NotFoundError, UsageError, ConfigError) naming the argument, the bad value and
what is expected. In queue mode an action that makes a run ready hands it to the queue at once
(:func:`dispatch_now`), so it need not wait for a doorbell or the next tick.

Every action writes one row of the audit trail (shared/engine/audit.py) in its own transaction,
or one row 'refused' when it was refused; ``actor`` says who acts from where (None: the command
line's user on this host).

This module imports no front end (the import contract in pyproject.toml says so); it takes the
:class:`shared.engine.agent.Agent` it acts through as an argument, and the agent's run-now
(:meth:`Agent.request_run_now`) is :func:`request_run_now` here.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

from shared.control.db import DatabaseTarget, connector
from shared.control.queries import split_statements
from shared.control.sqlerrors import classify, describe, is_unique_violation
from shared.engine.audit import (Actor, Audit, AuditAction, AuditSource, audit_trail_exists, audited,
                                 audited_if_installed)
from shared.engine.dispatch import dispatch
from shared.engine.fleet import report_moved_runs
from shared.engine.follow import ending_calls, follow_up_rows, report_follow_ups
from shared.engine.notify import notifications_enabled
from shared.engine.slots import apply_calendars, calendar_rules, run_offset
from shared.engine.views import unknown_job
from shared.errors import ConfigError, NotFoundError, UsageError
from shared.jobs.alert_definitions import AlertDefinition
from shared.jobs.params import ParamError, parse_assignment, read_json, resolve
from shared.jobs.run_model import RunStatus
from shared.jobs.schedules import parse_schedule
from shared.telemetry.client import new_operation_id

if TYPE_CHECKING:       # the agent calls request_run_now from here: a type only, no import cycle
    from shared.control.store import Store
    from shared.engine.agent import Agent

# run-now requests at the same millisecond: how many next milliseconds a request tries.
RUN_NOW_KEY_TRIES = 16
# agent.job_pauses.reason, agent.job_pauses.paused_by: their column sizes.
MAX_REASON_LENGTH = 400
MAX_PAUSED_BY_LENGTH = 256


# --- results -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Submitted:
    """An ad-hoc task run (submit). ``dispatched``: runs queued at once (None: direct mode, the
    local runner's workers claim it)."""
    run_id: int
    order: int | None
    dispatched: int | None


@dataclass(frozen=True)
class Cancelled:
    """A cancelled run, with the fleet runs the cancel moved on and the follow-up runs their
    ends started."""
    run_id: int
    runs_moved: int
    follow_ups_started: int
    dispatched: int | None


@dataclass(frozen=True)
class Stopped:
    """A job's runs in flight, cancelled (stop); empty when none was in flight."""
    job_name: str
    cancelled_run_ids: tuple[int, ...]


@dataclass(frozen=True)
class Requeued:
    """A poisoned or failed run given one more attempt (poison requeue)."""
    poison_id: int
    run_id: int
    dispatched: int | None


@dataclass(frozen=True)
class RunNowResult:
    """A run of a job started by hand: created (``status`` pending or the like), or recorded
    skipped by its overlap policy (``note`` says why; then nothing is dispatched)."""
    run_id: int
    job_name: str
    status: str
    note: str | None
    dispatched: int | None
    # The values the run starts with (agent.runs.params), None: the job has no parameters.
    params: dict[str, str] | None = None

    @property
    def skipped(self) -> bool:
        return self.status == RunStatus.SKIPPED


@dataclass(frozen=True)
class Pause:
    job_name: str
    paused_at: datetime
    paused_until: datetime | None
    paused_by: str | None
    reason: str | None
    # Slots claimed ahead inside the pause, recorded skipped "paused" by this pause.
    runs_skipped: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "paused": True, "paused_at": self.paused_at,
                "paused_until": self.paused_until, "paused_by": self.paused_by, "reason": self.reason,
                "runs_skipped": self.runs_skipped}


@dataclass(frozen=True)
class Resume:
    job_name: str
    paused_at: datetime
    resumed_at: datetime
    # Slots the pause had recorded skipped ahead that run at their time again, and the catch-up
    # of the last slot it held (misfire run-once): 0 or 1.
    runs_resumed: int = 0
    runs_caught_up: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "paused": False, "paused_at": self.paused_at,
                "resumed_at": self.resumed_at, "runs_resumed": self.runs_resumed,
                "runs_caught_up": self.runs_caught_up}


@dataclass(frozen=True)
class Backfilled:
    """The runs `backfill` made for the slots of a past window: ``made`` (run_id, slot, how:
    inserted, or rerun — a slot recorded skipped that never started), the slots left alone
    because they already have a run that ran, runs or waits (``already``), and those the job's
    calendars exclude (``excluded``)."""
    job_name: str
    start: datetime
    end: datetime
    slots: int
    made: tuple[dict[str, Any], ...]
    already: int
    excluded: int
    dispatched: int | None

    def as_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "from": self.start, "to": self.end, "slots": self.slots,
                "runs": [dict(row) for row in self.made], "already_run": self.already,
                "excluded_by_calendar": self.excluded, "dispatched": self.dispatched}


# --- runs and tasks --------------------------------------------------------------------------

def dispatch_now(agent: Agent) -> int | None:
    """Queue mode: dispatch at once (the new run need not wait for a doorbell or the tick): the
    runs queued. Direct mode (None): the local runner's workers pick it up themselves (within
    AGENT_POLL_SECONDS)."""
    if not agent.queue_mode:
        return None
    outcome = dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)
    return len(outcome.queued)


def submit(agent: Agent, sql: str, *, order: int | None, max_attempts: int, timeout_seconds: int,
           operation_id: str | None = None, actor: Actor | None = None) -> Submitted:
    """An ad-hoc task run of ``sql`` on the control database, dispatched at once in queue mode."""
    blank = None if sql.strip() else UsageError("--sql: expected the SQL to run (non-empty)", setting="--sql",
                                                   value=sql, expected="the SQL to run (non-empty)")
    store = agent.store()
    if blank is not None and not audit_trail_exists(store):
        raise blank             # a bad --sql is a usage error, schema or not
    store.require_schema()
    now = agent.clock()
    with audited(store, actor, AuditAction.SUBMIT, now=now,
                 arguments={"sql": sql, "order": order, "max_attempts": max_attempts,
                            "timeout_seconds": timeout_seconds}) as audit:
        if blank is not None:
            raise blank         # refused, and recorded so
        with audit.transaction():
            row = store.execute("insert_task", command=sql, target_database=None, task_order=order,
                                max_attempts=max_attempts, timeout_seconds=timeout_seconds, lease_seconds=60,
                                now=now, operation_id=operation_id or new_operation_id()).one()
            audit.run_id = row["run_id"]
    return Submitted(run_id=row["run_id"], order=order, dispatched=dispatch_now(agent))


def cancel(agent: Agent, run_id: int, *, actor: Actor | None = None) -> Cancelled:
    """Cancel a run that has not finished. In the same transaction, the run's fleet: a run
    waiting for its targets ends with its executions; for one of a fleet's executions, its run
    lets the next waiting one in or, when this was the last, moves on (its outcome notified and
    its followers started) at once, not at the next tick."""
    store = agent.store()
    now = agent.clock()
    with audited(store, actor, AuditAction.CANCEL, now=now, arguments={"run_id": run_id}, run_id=run_id) as audit:
        return _cancel(agent, store, audit, run_id, now)


def _cancel(agent: Agent, store: Store, audit: Audit, run_id: int, now: datetime) -> Cancelled:
    run = store.execute("get_run", run_id=run_id).one()
    if run is None:
        raise NotFoundError(f"no run with id {run_id}", setting="RUN_ID", value=run_id,
                            expected="the id of a run (history)")
    audit.job_name = run.get("job_name")
    with audit.transaction():
        if not store.execute("cancel_run", run_id=run_id, now=now).rows:
            status = store.execute("get_run", run_id=run_id).one()["status"]
            raise UsageError(f"run {run_id} is already {status}", setting="RUN_ID", value=run_id,
                             expected="a run that has not finished")
        moved = store.execute("progress_fleets", parent_run_id=run.get("parent_run_id") or run_id,
                              run_id=None, token=None, now=now).rows
        followed: list[dict[str, Any]] = []
        if any(row["status"] in (RunStatus.SUCCEEDED, RunStatus.FAILED) for row in moved):
            for name, params in ending_calls(agent.settings, now):
                followed += follow_up_rows([(name, params)], [store.execute(name, **params)])
    if report_moved_runs(moved, agent.telemetry) and notifications_enabled(agent.settings):
        agent.notifier.wake()
    report_follow_ups(followed, agent.telemetry)
    # A fleet run the cancel ended started its followers: on the queue now.
    dispatched = dispatch_now(agent) if followed else None
    return Cancelled(run_id=run_id, runs_moved=len(moved), follow_ups_started=len(followed), dispatched=dispatched)


def stop(agent: Agent, job_name: str, *, actor: Actor | None = None) -> Stopped:
    """Cancel the job's runs in flight; their fleet target executions are cancelled with them
    (the NULL progress: every run no longer waiting for its targets). A running step notices at
    its worker's next lease renewal (every LEASE_SECONDS / 3)."""
    store = agent.store()
    now = agent.clock()
    with audited(store, actor, AuditAction.STOP, now=now, arguments={"job_name": job_name},
                 job_name=job_name) as audit:
        with audit.transaction():
            rows = store.chain(("stop_job", {"job_name": job_name, "now": now}),
                               ("progress_fleets", {"parent_run_id": None, "run_id": None, "token": None,
                                                    "now": now}))[0].rows
            if not rows:
                jobs = {r["job_name"] for r in store.execute("list_jobs").rows}
                if job_name not in jobs:
                    known = ", ".join(sorted(jobs)) or "none"
                    raise NotFoundError(f"no job named {job_name!r} (jobs the agent knows: {known})",
                                        setting="JOB", value=job_name,
                                        expected=f"one of the jobs the agent knows: {known}")
            audit.detail = f"{len(rows)} run(s) cancelled" + (
                f": {', '.join(str(row['run_id']) for row in rows)}" if rows else "")
    return Stopped(job_name=job_name, cancelled_run_ids=tuple(row["run_id"] for row in rows))


def requeue(agent: Agent, poison_id: int, *, actor: Actor | None = None) -> Requeued:
    """One more attempt for the run of a poison message, when the run is poisoned or failed."""
    store = agent.store()
    with audited(store, actor, AuditAction.REQUEUE, now=agent.clock(), arguments={"poison_id": poison_id}) as audit:
        requeued = _requeue(agent, store, audit, poison_id)
    return replace(requeued, dispatched=dispatch_now(agent))


def _requeue(agent: Agent, store: Store, audit: Audit, poison_id: int) -> Requeued:
    poison = store.execute("get_poison", poison_id=poison_id).one()
    if poison is None:
        raise NotFoundError(f"no poison message with id {poison_id}", setting="ID", value=poison_id,
                            expected="the id of a poison message (poison list)")
    if poison["run_id"] is None:
        raise UsageError(f"poison message {poison_id} belongs to no run (it was malformed: {poison['reason']}); "
                         "nothing to requeue", setting="ID", value=poison_id,
                         expected="a poison message of a run")
    now = audit.now
    audit.run_id = poison["run_id"]
    with audit.transaction():
        changed = bool(store.execute("requeue_run", run_id=poison["run_id"], now=now).rows)
        if not changed:
            run = store.execute("get_run", run_id=poison["run_id"]).one()
            status = run["status"] if run else "gone"
            raise UsageError(f"run {poison['run_id']} is {status}; only a poisoned or failed run can be requeued",
                             setting="ID", value=poison_id, expected="a poison message of a poisoned or failed run")
        store.execute("mark_poison_requeued", poison_id=poison_id, now=now)
    return Requeued(poison_id=poison_id, run_id=poison["run_id"], dispatched=None)


def request_run_now(agent: Agent, job_name: str, *, operation_id: str | None = None,
                    audit: Audit | None = None, params: str | None = None) -> dict[str, Any] | None:
    """A run of the job right away, keyed by the request time, its overlap policy decided under
    the start lock (None: no such valid job). Two requests at the same millisecond (SQLite's
    resolution; two operators, or a script) would share the key: the later one takes the next
    millisecond and meets the overlap policy like any other request. ``audit`` (run-now's): its
    row is written in the transaction that made the run, when one was made. ``params``: the run's
    parameters as agent.runs.params holds them (JSON, checked and completed by resolve_run_params;
    None: none given)."""
    store = agent.store()
    now = agent.clock()
    operation_id = operation_id or new_operation_id()
    for nudge in range(RUN_NOW_KEY_TRIES):
        try:
            with store.transaction():
                row = store.execute("insert_manual_run", job_name=job_name, params=params,
                                    now=now + timedelta(milliseconds=nudge), operation_id=operation_id).one()
                if audit is not None and row is not None:
                    audit.run_id = row["run_id"]
                    audit.detail = row["status"] + (f": {row['note']}" if row.get("note") else "")
                    audit.write()
            if audit is not None and row is not None:
                audit.recorded = True
            return row
        except Exception as exc:
            if not is_unique_violation(exc) or nudge == RUN_NOW_KEY_TRIES - 1:
                raise
            if audit is not None:
                audit.rewind()      # that transaction, and its row, rolled back: the next try writes it
    return None


# sql-agent backfill: at most this many slots in one window (each becomes a run, all runnable at
# once: a bigger window is a flood for the queue and the cap; backfill it in parts).
MAX_BACKFILL_SLOTS = 1000
# Slots before this are not backfilled (the agent keeps no run of them, and the drivers write years
# before 1000 in forms they do not read back).
EARLIEST_BACKFILL = datetime(2000, 1, 1, tzinfo=timezone.utc)


def backfill_slots(job: dict[str, Any], start: datetime, end: datetime,
                   now: datetime) -> tuple[list[datetime], int]:
    """The slots of ``job`` (a list_jobs row) from ``start`` to ``end`` (both included), keyed as
    the planner keys them (its calendars applied, excluded slots left out and counted, a slot
    moved by ON_EXCLUDED=next kept at its new time when inside the window; its jitter applied), oldest first.
    Raises UsageError past MAX_BACKFILL_SLOTS slots."""
    planned, excluded = backfill_plan(job, start, end, now)
    return [key for key, _, _ in planned], excluded


def backfill_plan(job: dict[str, Any], start: datetime, end: datetime,
                  now: datetime) -> tuple[list[tuple[datetime, datetime, datetime | None]], int]:
    """backfill_slots with each slot's span: (key, its time, the schedule's next slot after that
    time; None: none). A run of the slot, whatever jitter keyed it (the job's JITTER_SECONDS of
    the day it was claimed, 0 for one recorded before jitter applied to it, or a moved run), lies
    in that span: a jittered run always stays before the job's next slot (schedules.jitter_offset)."""
    from shared.jobs.schedules import validate_timezone
    name = job["job_name"]
    try:
        schedule = parse_schedule(job["schedule"], job["timezone"])
    except (ValueError, OverflowError) as exc:
        raise UsageError(f"job {name!r}: its schedule {job['schedule']!r} cannot be read ({exc})", setting="JOB",
                         value=name, expected="a job with a schedule the agent reads") from None
    raw: list[datetime] = []
    # From the window's start (a slot at it included), and from EARLIEST_BACKFILL at the earliest.
    moment: datetime | None = max(start, EARLIEST_BACKFILL) - timedelta(microseconds=1)
    while True:
        try:
            moment = schedule.next_after(moment) if moment is not None else None
        except (ValueError, OverflowError):
            moment = None
        if moment is None or moment > end:
            break
        raw.append(moment)
        if len(raw) > MAX_BACKFILL_SLOTS:
            raise UsageError(
                f"the window {start.isoformat()} to {end.isoformat()} holds more than {MAX_BACKFILL_SLOTS} slots of "
                f"job {name!r} (its schedule {job['schedule']!r}); backfill it in parts of at most "
                f"{MAX_BACKFILL_SLOTS} slots", setting="--to", value=end.isoformat(),
                expected=f"a window of at most {MAX_BACKFILL_SLOTS} slots of the job")
    planned = [(slot, RunStatus.PENDING, None, None) for slot in raw]
    jitter = int(job.get("jitter_seconds") or 0)
    try:
        rules = calendar_rules(job.get("calendars"))
        zone = validate_timezone(job["timezone"])
        if rules:
            planned = apply_calendars(planned, rules, zone)
        out: list[tuple[datetime, datetime, datetime | None]] = []
        excluded = 0
        for moment, status, _, _ in planned:
            if status != RunStatus.PENDING:
                excluded += 1
                continue
            key = moment + timedelta(seconds=run_offset(name, moment, schedule, jitter, rules, zone))
            # A slot its jitter or a calendar moved later stays the run of its slot (keyed by the
            # moved time, as the planner keys it), when that time has come by ``now``.
            if start <= key <= now:
                try:
                    following = schedule.next_after(moment)
                except (ValueError, OverflowError):
                    following = None
                out.append((key, moment, following))
    except (ValueError, OverflowError) as exc:
        raise UsageError(f"job {name!r}: the slots of the window {start.isoformat()} to {end.isoformat()} cannot be "
                         f"computed ({exc})", setting="--from", value=start.isoformat(),
                         expected="a window of times the job's schedule and calendars reach") from None
    return sorted(out), excluded


def _backfill_payload(store: Store, job_name: str, planned: list[tuple[datetime, datetime, datetime | None]],
                      now: datetime) -> list[dict[str, Any]]:
    """The slots backfill_runs is given: a slot that has a scheduled or backfill run in its span
    (any key: another jitter, a moved run) that ran, runs or waits is left out; one whose run in
    its span was recorded skipped and never started is given by that run's key (rerun in place);
    any other by its key (a run inserted). One query for the whole window."""
    if not planned:
        return []
    last = max((following or key) for key, _, following in planned)
    rows = store.execute("list_slot_runs", job_name=job_name, since=store.json_time(planned[0][1]),
                         horizon=store.json_time(last + timedelta(microseconds=1))).rows
    runs = sorted(((_aware(row["scheduled_for"]), row) for row in rows), key=lambda item: item[0])
    times = [at for at, _ in runs]
    payload: list[dict[str, Any]] = []
    for key, moment, following in planned:
        low = bisect_left(times, moment)
        high = bisect_left(times, following) if following is not None else bisect_right(times, key)
        inside = [(at, row) for at, row in runs[low:high] if following is not None or at == key]
        if any(not (row["status"] == RunStatus.SKIPPED and int(row["attempt"]) == 0) for _, row in inside):
            continue        # a run of this slot ran, runs or waits
        if inside:
            key = next((at for at, _ in inside if at == key), inside[0][0])
        payload.append({"scheduled_for": store.json_time(key),
                        "runnable_at": store.json_time(now + timedelta(microseconds=len(payload)))})
    return payload


def backfill(agent: Agent, job_name: str, start: datetime, end: datetime, *,
             actor: Actor | None = None) -> Backfilled:
    """`sql-agent backfill JOB --from --to`: each slot of the job's schedule in the past window
    becomes a recorded run of its slot (kind 'backfill'), runnable at once, oldest first; a slot
    that already ran (or runs, or waits) is not run twice: the unique (job, slot) key decides,
    so two backfills at once make each run once. A slot recorded skipped that never started
    (a misfire, an overlap skip, a pause) is run now. The runs wait for each other (overlap
    queue; side by side up to the cap when the job's OVERLAP is allow). Audited."""
    store = agent.store()
    now = agent.clock()
    arguments = {"job_name": job_name, "from": start.isoformat(), "to": end.isoformat()}
    with audited(store, actor, AuditAction.BACKFILL, now=now, arguments=arguments, job_name=job_name) as audit:
        if not start < end:
            raise UsageError(f"--from {start.isoformat()} is not before --to {end.isoformat()}", setting="--from",
                             value=start.isoformat(), expected="a time before --to")
        if end > now:
            raise UsageError(f"--to {end.isoformat()} is in the future (now is {now.isoformat()}): backfill runs the "
                             "slots of a past window; the schedule runs the slots to come", setting="--to",
                             value=end.isoformat(), expected=f"a time at or before now ({now.isoformat()})")
        job = next((r for r in store.execute("list_jobs").rows if r["job_name"] == job_name and r["configured"]), None)
        if job is None:
            raise unknown_job(store, job_name)
        if not job["valid"]:
            raise UsageError(f"job {job_name!r} is invalid ({job['config_error']}): fix its definition first",
                             setting="JOB", value=job_name, expected="a valid job")
        if not job["schedule"]:
            raise UsageError(f"job {job_name!r} runs on demand (no schedule): it has no slots to backfill; use run-now",
                             setting="JOB", value=job_name, expected="a job with a schedule")
        if not job["enabled"]:
            raise UsageError(f"job {job_name!r} is disabled: backfill runs the slots of an enabled job (a disabled job "
                             "runs nothing, and its runs not yet started are recorded skipped); enable it first "
                             "(agent.enable_job, or JOB__<name>__ENABLED=true)", setting="JOB", value=job_name,
                             expected="an enabled job")
        planned, excluded = backfill_plan(job, start, end, now)
        slots = [key for key, _, _ in planned]
        operation_id = new_operation_id()
        note = f"backfill: slot of {start.isoformat()} to {end.isoformat()} run by sql-agent backfill"
        made: list[dict[str, Any]] = []
        with audit.transaction():
            # Runnable at once, a microsecond apart in slot order: the claims take them oldest
            # first. A slot with a run of it under any key (another jitter) is not run again.
            payload = _backfill_payload(store, job_name, planned, now)
            if payload:
                made = [dict(row) for row in store.execute("backfill_runs", job_name=job_name, now=now,
                                                           slots=payload, note=note, operation_id=operation_id).rows]
            made.sort(key=lambda row: _aware(row["scheduled_for"]))
            audit.detail = (f"{len(slots)} slot(s): {sum(1 for r in made if r['action'] == 'inserted')} run(s) made, "
                            f"{sum(1 for r in made if r['action'] == 'rerun')} skipped slot(s) rerun, "
                            f"{len(slots) - len(made)} already run or in flight, {excluded} excluded by a calendar")
    dispatched = dispatch_now(agent) if made else None
    for row in made:
        row["scheduled_for"] = _aware(row["scheduled_for"])
    return Backfilled(job_name=job_name, start=start, end=end, slots=len(slots), made=tuple(made),
                      already=len(slots) - len(made), excluded=excluded, dispatched=dispatched)


def _aware(value: Any) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def start_for_alert(store: Store, now: datetime, job_name: str, alert_name: str, firing_id: int) -> dict[str, Any]:
    """A condition alert's response (RESPONSE_JOB): a run of the job right away with run-now's
    semantics (its overlap policy decides; a paused job starts, as SQL Server Agent starts a
    disabled one), audited as run-now from source 'alert', principal ``alert:<name>``; the job's
    declared parameters take their defaults. Raises NotFoundError (audited 'refused') when the
    job cannot run."""
    actor = Actor(source=AuditSource.ALERT, client=f"condition alert {alert_name} (firing {firing_id})"[:400],
                  os_user=f"alert:{alert_name}", principal=f"alert:{alert_name}")
    with audited(store, actor, AuditAction.RUN_NOW, now=now, job_name=job_name,
                 arguments={"job_name": job_name, "alert": alert_name, "firing_id": firing_id}) as audit:
        params = None
        job = store.execute("get_job", job_name=job_name).one()
        declared = read_json(job.get("params")) if job else None
        if declared:
            try:
                params = json.dumps(resolve(declared, {}, job=job_name), ensure_ascii=False)
            except ParamError as exc:
                raise UsageError(str(exc), setting=exc.setting, value=exc.value, expected=exc.expected) from None
        row = None
        for nudge in range(RUN_NOW_KEY_TRIES):
            try:
                with store.transaction():
                    row = store.execute("insert_manual_run", job_name=job_name, params=params,
                                        now=now + timedelta(milliseconds=nudge), operation_id=new_operation_id()).one()
                    if row is not None:
                        audit.run_id = row["run_id"]
                        audit.detail = row["status"] + (f": {row['note']}" if row.get("note") else "")
                        audit.write()
                if row is not None:
                    audit.recorded = True
                break
            except Exception as exc:
                if not is_unique_violation(exc) or nudge == RUN_NOW_KEY_TRIES - 1:
                    raise
                audit.rewind()
        if row is None:
            raise NotFoundError(f"RESPONSE_JOB {job_name!r} of alert {alert_name!r}: no valid job of that name (it is "
                                "unknown, invalid, or removed from the settings)", setting="RESPONSE_JOB",
                                value=job_name, expected="a valid job the agent knows")
    return row


def resolve_run_params(agent: Agent, job_name: str, given: Sequence[str] | Mapping[str, str] | None) -> str | None:
    """The parameters a run of the job starts with, as agent.runs.params holds them: ``given``
    (``k=v`` texts of run-now --param, or a mapping) checked against what the job declares as
    the agent last synced it, its defaults filled in. None: the job declares none and none was
    given (the run's row as before). A name the job does not declare, a bad ``k=v``, a declared
    parameter without a default and without a value: a UsageError naming it. One indexed read
    of the job (run-now is an operator's command; the runs' own path is unchanged)."""
    pairs: dict[str, str] = {}
    try:
        if isinstance(given, Mapping):
            pairs = dict(given)
        else:
            for text in given or ():
                name, value = parse_assignment(text)
                if name.casefold() in {k.casefold() for k in pairs}:
                    raise ParamError("--param", text, f"each parameter given once ({name!r} is given twice)")
                pairs[name] = value
        row = agent.store().execute("get_job", job_name=job_name).one()
        if row is None:
            return json.dumps(pairs, ensure_ascii=False) if pairs else None   # the insert finds no job: its error
        declared = read_json(row.get("params"))
        if not declared and not pairs:
            return None
        return json.dumps(resolve(declared, pairs, job=job_name), ensure_ascii=False)
    except ParamError as exc:
        raise UsageError(str(exc), setting=exc.setting, value=exc.value, expected=exc.expected) from None


def run_now(agent: Agent, job_name: str, *, operation_id: str | None = None, actor: Actor | None = None,
            params: Sequence[str] | Mapping[str, str] | None = None) -> RunNowResult:
    """run-now: :func:`request_run_now`, dispatched at once unless its overlap policy skipped it;
    when no run could be made, an error saying why (invalid, removed, or unknown). The job is as
    the agent last synced it: the caller's own settings are not read. ``params``: run-now
    --param's ``k=v`` (resolve_run_params; refused ones are audited as refused, as any error)."""
    arguments: dict[str, Any] = {"job_name": job_name}
    if params:
        arguments["params"] = dict(params) if isinstance(params, Mapping) else list(params)
    with audited(agent.store(), actor, AuditAction.RUN_NOW, now=agent.clock(), arguments=arguments,
                 job_name=job_name) as audit:
        values = resolve_run_params(agent, job_name, params)
        row = request_run_now(agent, job_name, operation_id=operation_id or new_operation_id(), audit=audit,
                              params=values)
        if row is None:
            _no_run_made(agent, job_name)
    skipped = row["status"] == RunStatus.SKIPPED
    return RunNowResult(run_id=row["run_id"], job_name=job_name, status=row["status"], note=row.get("note"),
                        dispatched=None if skipped else dispatch_now(agent),
                        params=json.loads(values) if values else None)


def _no_run_made(agent: Agent, job_name: str) -> None:
    """Why run-now made no run: an error naming the job (invalid, removed, or unknown)."""
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    job = jobs.get(job_name)
    if job is not None and not job["valid"]:
        raise ConfigError(f"JOB__{job_name}__*", job_name, f"a valid job; it is invalid: {job['config_error']}")
    if job is not None:
        raise UsageError(f"job {job_name!r} was removed from the settings; it cannot run", setting="NAME",
                         value=job_name, expected="a job in the settings")
    known = ", ".join(name for name, r in jobs.items() if r["valid"] and r["configured"]) or "none"
    raise NotFoundError(f"no job named {job_name!r} (jobs the agent knows: {known}; a job added to the "
                        "settings is known after the agent's next tick)", setting="NAME", value=job_name,
                        expected=f"one of the jobs the agent knows: {known}")


# --- pause and resume (issue 27, issue 34 items 5 and 6) ------------------------------------
# The pause is a row of agent.job_pauses, state of its own that the settings sync never touches;
# the tick reads it (select_due_jobs) and records each slot the pause holds as a run skipped
# "paused", ahead up to the claim horizon as for any job (shared/engine/scheduler.py, _plan_slots),
# and claims the slots after a known end (--until) runnable at their time. Every change of a
# pause (pause, a new --until, resume) decides again, in the same transaction, the job's slots
# that never started (settle_paused_runs): held ones are skipped "paused", those the pause no
# longer holds come back, and the misfire policy's catch-up waits for the end. agent.pause_job
# and agent.resume_job (migrations 0009, 0012) do the same from T-SQL. Every time is the
# database's clock (the caller passes the agent's clock, which is it). Starting a paused job by
# hand (run-now, agent.start_job) is allowed, as SQL Server Agent starts a disabled job.

def pause_job(store: Store, name: str, *, now: datetime, until: datetime | None = None,
              paused_by: str | None = None, reason: str | None = None, telemetry: Any = None,
              actor: Actor | None = None) -> Pause:
    """Pause ``name`` from ``now`` until ``until`` (None: until resumed). Pausing a paused job
    keeps its start and takes the new end and reason. The slots it had claimed inside the pause
    are recorded skipped "paused" in the same transaction, under the pauses lock a tick's claim
    holds shared: once this returns, no slot inside the pause is claimed; slots a longer pause
    had skipped that this one no longer holds run at their time again."""
    with audited(store, actor, AuditAction.PAUSE, now=now, job_name=name,
                 arguments={"job_name": name, "until": until, "reason": reason, "paused_by": paused_by}) as audit:
        pause = _pause(store, audit, name, now, until, paused_by, reason)
    if telemetry is not None:
        telemetry.event("JobPaused", {"job": name, "outcome": "paused", "paused_until": pause.paused_until,
                                      "paused_by": pause.paused_by, "reason": pause.reason,
                                      "runs_skipped": pause.runs_skipped})
    return pause


def _pause(store: Store, audit: Audit, name: str, now: datetime, until: datetime | None, paused_by: str | None,
           reason: str | None) -> Pause:
    if until is not None and until <= now:
        raise UsageError(f"--until {until.isoformat()}: expected a time after now (the database's clock: "
                         f"{now.isoformat()})", setting="--until", value=until.isoformat(),
                         expected=f"a time after {now.isoformat()} (the database's clock)")
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise UsageError(f"--reason: {len(reason)} characters; expected at most {MAX_REASON_LENGTH}",
                         setting="--reason", value=reason[:80], expected=f"at most {MAX_REASON_LENGTH} characters")
    paused_by = paused_by[:MAX_PAUSED_BY_LENGTH] if paused_by else None
    with audit.transaction():
        store.execute("lock_job_pauses")
        row = store.execute("pause_job", job_name=name, now=now, paused_until=until, paused_by=paused_by,
                            reason=reason).one()
        if row is None:
            raise unknown_job(store, name)
        settled = store.execute("settle_paused_runs", job_name=name, now=now, pause_start=row["paused_at"],
                                pause_end=row["paused_until"]).one()
        skipped = int(settled["runs_skipped"])
        pause = Pause(job_name=name, paused_at=row["paused_at"], paused_until=row["paused_until"],
                      paused_by=row["paused_by"], reason=row["reason"], runs_skipped=skipped)
        store.execute("insert_job_events", now=now, events=[{
            "job_name": name, "kind": "paused",
            "detail": (f"paused by {paused_by or '?'} (sql-agent pause) "
                       f"{'until ' + _iso(until) if until else 'until resumed'}"
                       f"{': ' + reason if reason else ''}; {skipped} claimed slot(s) skipped")}])
        audit.detail = f"{skipped} claimed slot(s) skipped"
    return pause


def resume_job(store: Store, name: str, *, now: datetime, resumed_by: str | None = None,
               telemetry: Any = None, actor: Actor | None = None) -> Resume:
    """End the pause of ``name`` now, in one transaction: the slots it had recorded skipped ahead
    (from now on) are pending again, runnable at their time, with no tick in between; the slots
    it held are the misfire policy's: under run-once the last one is caught up once, now, within
    GRACE_SECONDS; under skip none runs. A job that is not paused is an error (exit code 2)."""
    with audited(store, actor, AuditAction.RESUME, now=now, job_name=name,
                 arguments={"job_name": name, "resumed_by": resumed_by}) as audit:
        resumed = _resume(store, audit, name, now, resumed_by)
    if telemetry is not None:
        telemetry.event("JobResumed", {"job": name, "outcome": "resumed", "paused_by": resumed_by})
    return resumed


def _resume(store: Store, audit: Audit, name: str, now: datetime, resumed_by: str | None) -> Resume:
    with audit.transaction():
        store.execute("lock_job_pauses")
        row = store.execute("resume_job", job_name=name, now=now).one()
        if row is None or not row["in_force"]:
            if store.execute("get_job", job_name=name).one() is None:
                raise unknown_job(store, name)
            ended = f" (its pause ended by itself at {_iso(row['paused_until'])})" if row is not None else ""
            raise UsageError(f"job {name!r} is not paused{ended}", setting="JOB", value=name,
                             expected="a paused job (sql-agent jobs shows them)")
        settled = store.execute("settle_paused_runs", job_name=name, now=now, pause_start=row["paused_at"],
                                pause_end=now).one()
        resumed, caught_up = int(settled["runs_resumed"]), int(settled["runs_caught_up"])
        store.execute("insert_job_events", now=now, events=[{
            "job_name": name, "kind": "resumed",
            "detail": (f"resumed by {resumed_by or '?'} (sql-agent resume); paused since {_iso(row['paused_at'])}; "
                       f"{resumed} slot(s) claimed ahead run at their time, {caught_up} caught up")}])
        audit.detail = f"{resumed} slot(s) claimed ahead run at their time, {caught_up} caught up"
    return Resume(job_name=name, paused_at=row["paused_at"], resumed_at=now, runs_resumed=resumed,
                  runs_caught_up=caught_up)


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


# --- grants (grant-sql --apply) --------------------------------------------------------------

def apply_grant_scripts(target: DatabaseTarget, scripts: Sequence[Any],
                        on_applied: Callable[[str, Any], None] | None = None, *, store: Store | None = None,
                        now: datetime | None = None, actor: Actor | None = None) -> list[str]:
    """Each grant script in its own transaction, in its database (on its server), in order; the
    places applied to ("database 'x' on server y", or "the control database"). ``on_applied``
    is told of each as it commits, so a failure later still shows what was done. The grants are
    one audited action, recorded in the control database (``store``) once they are applied, or
    refused with the error (the scripts applied before it stay: each committed on its own)."""
    arguments = {"scripts": [{"database": script.database, "server": getattr(script, "server", None),
                              "statements": list(script.statements)} for script in scripts]}
    with audited_if_installed(store, actor, AuditAction.GRANT, now=now or datetime.now(timezone.utc),
                              arguments=arguments) as audit:
        applied = _apply_grant_scripts(target, scripts, on_applied)
        if audit is not None:
            audit.detail = "applied to " + ", ".join(applied) if applied else "nothing to apply"
            audit.done()
    return applied


def _apply_grant_scripts(target: DatabaseTarget, scripts: Sequence[Any],
                         on_applied: Callable[[str, Any], None] | None) -> list[str]:
    applied = []
    for script in scripts:
        server = getattr(script, "server", None)
        where = (f"database {script.database!r}" if script.database else "the control database") + (
            f" on server {server}" if server else "")
        connection = connector(target, script.database, server)()
        try:
            connection.autocommit = False
            cursor = connection.cursor()
            for statement in split_statements("\n".join(script.statements)):
                cursor.execute(statement)
            connection.commit()
        finally:
            connection.close()
        applied.append(where)
        if on_applied is not None:
            on_applied(where, script)
    return applied


def apply_postgres_script(target: DatabaseTarget, sql: str, *, store: Store | None = None,
                          now: datetime | None = None, actor: Actor | None = None,
                          arguments: dict[str, Any] | None = None, detail: str | None = None) -> None:
    """grant-sql --agent-login --apply (and --operator --apply) on PostgreSQL: the whole script
    (its own BEGIN and COMMIT, DO blocks whose bodies hold ';') sent as one batch on an autocommit
    connection of the control database, as the --db login (an admin); audited there (``store``)
    once it committed, or refused."""
    with audited_if_installed(store, actor, AuditAction.GRANT, now=now or datetime.now(timezone.utc),
                              arguments=arguments or {"statements": sql}) as audit:
        connection = connector(target)()
        try:
            connection.autocommit = True
            cursor = connection.cursor()
            cursor.execute(sql)
            while cursor.nextset():
                pass
        finally:
            connection.close()
        if audit is not None:
            audit.detail = detail
            audit.done()


def apply_operator_grant(target: DatabaseTarget, sql: str, *, operator: str | None = None,
                         store: Store | None = None, now: datetime | None = None, actor: Actor | None = None) -> None:
    """grant-sql --operator --apply: the operator role's membership, run on the control database
    (on PostgreSQL as one batch, apply_postgres_script); audited there once it committed, or
    refused."""
    arguments = {"operator": operator, "statements": sql}
    detail = f"{operator or 'the principal'} is a member of agent_operator"
    if target.dialect == "postgres":
        apply_postgres_script(target, sql, store=store, now=now, actor=actor, arguments=arguments, detail=detail)
        return
    with audited_if_installed(store, actor, AuditAction.GRANT, now=now or datetime.now(timezone.utc),
                              arguments=arguments) as audit:
        connection = connector(target)()
        try:
            connection.autocommit = False   # the script commits as a whole, or not at all
            cursor = connection.cursor()
            for statement in split_statements(sql):
                cursor.execute(statement)
            connection.commit()
        finally:
            connection.close()
        if audit is not None:
            audit.detail = detail
            audit.done()


# --- jobs and alerts defined through the T-SQL interface (import-sqlagent --apply) -------------

@dataclass(frozen=True)
class ScheduledJobAdded:
    """One agent.add_scheduled_job call: the job, and what the procedure did ("defined" when it
    did not say)."""
    job: str
    action: str


@dataclass(frozen=True)
class AlertAdded:
    """One agent.add_alert call: the alert, and what the procedure did (defined, or redefined: an
    alert of that name was there, and is replaced whole, its state with it)."""
    alert: str
    action: str


@dataclass(frozen=True)
class AlertNotAdded:
    """An alert agent.add_alert did not define, with why (the procedure's own error, or the
    connection lost before it answered)."""
    alert: str
    reason: str


@dataclass(frozen=True)
class JobNotAdded:
    """A job agent.add_scheduled_job did not define, with why (the procedure's own error, or the
    connection lost before it answered)."""
    job: str
    reason: str


@dataclass(frozen=True)
class ImportApplied:
    """What import-sqlagent --apply defined: the jobs, then the alerts, each on its own (one the
    procedure refuses is listed with its error, the others are still defined)."""
    jobs: tuple[ScheduledJobAdded, ...]
    alerts: tuple[AlertAdded, ...]
    alerts_not_added: tuple[AlertNotAdded, ...]
    jobs_not_added: tuple[JobNotAdded, ...] = ()


# The procedures' parameters on PostgreSQL: named arguments need their types.
ADD_SCHEDULED_JOB_PG_TYPES = {"name": "varchar", "sql": "text", "schedule": "varchar", "run_at": "timestamptz",
                              "timezone": "varchar", "enabled": "int", "max_attempts": "int",
                              "database": "varchar", "misfire": "varchar"}
SET_JOB_STEPS_PG_TYPES = {"job_name": "varchar", "steps": "text"}
ADD_ALERT_PG_TYPES = {"name": "varchar", "query": "text", "schedule": "varchar", "errors": "varchar",
                      "delay_between_responses_seconds": "int", "notify": "int", "response_job": "varchar",
                      "timezone": "varchar", "timeout_seconds": "int", "enabled": "int"}


def add_alert_refusal(alert: AlertDefinition) -> str | None:
    """Why agent.add_alert cannot define this alert as its ALERT__<name>__* settings would (None:
    it can). The procedure takes every setting of an alert but its own webhook."""
    if alert.notify_webhook_url:
        return ("agent.add_alert has no @notify_webhook_url: an alert with a webhook of its own "
                f"(ALERT__{alert.name}__NOTIFY_WEBHOOK_URL) goes in the app settings printed here")
    return None


def add_alert_arguments(alert: AlertDefinition) -> dict[str, Any]:
    """agent.add_alert's arguments for an alert (what the settings' form gives the tick:
    shared/engine/condition_alerts.settings_rows), the parameters it leaves out at their defaults."""
    refusal = add_alert_refusal(alert)
    if refusal is not None:
        raise UsageError(f"alert {alert.name!r}: {refusal}", setting=f"ALERT__{alert.name}__NOTIFY_WEBHOOK_URL",
                         expected="an alert without a webhook of its own")
    values = {"name": alert.name, "query": alert.query, "schedule": alert.schedule, "errors": alert.errors,
              "delay_between_responses_seconds": alert.delay_seconds, "notify": int(alert.notify),
              "response_job": alert.response_job, "timezone": alert.timezone,
              "timeout_seconds": alert.timeout_seconds, "enabled": int(alert.enabled)}
    return {name: value for name, value in values.items() if value is not None}


def apply_import(target: DatabaseTarget, jobs: Sequence[dict[str, Any]], alerts: Sequence[AlertDefinition] = (), *,
                 store: Store | None = None, now: datetime | None = None,
                 actor: Actor | None = None) -> ImportApplied:
    """Call agent.add_scheduled_job for each job (its arguments by name), then agent.add_alert for
    each alert, as an operator would, each call a transaction of its own, in order: the T-SQL
    interface decides and records, as for any caller (each call is a 'define' or 'define-alert'
    row of the audit trail, written by the procedure). A job with ``steps`` (agent.set_job_steps
    @steps, a JSON array) is defined and given them by agent.set_job_steps in one transaction (a
    'define' and a 'set-steps' row): both or neither. A job without steps that the procedure says
    it redefined is then given none (agent.set_job_steps @steps = NULL, a call of its own): a
    redefinition keeps the steps set before, and the job is what the script says. The jobs come first, so that an alert
    whose response starts one of them finds it defined. A job or an alert the procedure refuses
    is listed (``jobs_not_added``, ``alerts_not_added``) with its error, and the others are still
    defined (one bad definition never stops the rest); a lost connection lists the call in doubt
    and every call after it as not attempted. The import itself is one 'import' row (``store``) once the calls
    are done, saying what was defined and what was not, or refused with the error."""
    arguments: dict[str, Any] = {"jobs": [call.get("name") for call in jobs]}
    if alerts:
        arguments["alerts"] = [alert.name for alert in alerts]
    with audited_if_installed(store, actor, AuditAction.IMPORT, now=now or datetime.now(timezone.utc),
                              arguments=arguments) as audit:
        if (jobs or alerts) and target.dialect not in ("postgres", "mssql"):
            raise UsageError("import-sqlagent --apply needs a PostgreSQL or SQL Server control database "
                             f"(agent.add_scheduled_job, agent.add_alert); the control database is {target.display}",
                             setting="--db", value=target.display,
                             expected="a PostgreSQL or SQL Server control database")
        alert_calls = [add_alert_arguments(alert) for alert in alerts]   # refused before any call
        done: list[ScheduledJobAdded] = []
        jobs_not_added: list[JobNotAdded] = []
        added: list[AlertAdded] = []
        not_added: list[AlertNotAdded] = []
        if jobs or alerts:
            connection = connector(target)()
            try:
                lost = False
                for index, call in enumerate(jobs):
                    try:
                        done.append(_add_scheduled_job(connection, target.dialect, call))
                        continue
                    except UsageError as exc:       # its run_at, read before any call
                        jobs_not_added.append(JobNotAdded(call["name"], str(exc)))
                        continue
                    except _CallFailed as failed:   # the procedure's refusal, or the connection's end
                        exc, procedure = failed.error, failed.procedure
                        info = classify(exc)
                        if info.kind != "transient" and not info.connection_lost:
                            jobs_not_added.append(JobNotAdded(
                                call["name"], f"{procedure} refused it: {describe(exc)}" + failed.outcome))
                            continue
                        jobs_not_added.append(JobNotAdded(call["name"], (
                            f"the connection failed during {procedure} ({describe(exc)}): whether it "
                            "was defined is unknown; `sql-agent jobs` says, and --apply again defines it")))
                        jobs_not_added += [JobNotAdded(rest["name"], "not attempted: the connection to the control "
                                                                     "database failed before it")
                                           for rest in jobs[index + 1:]]
                        not_added += [AlertNotAdded(rest["name"], "not attempted: the connection to the control "
                                                                  "database failed before it")
                                      for rest in alert_calls]
                        lost = True
                        break
                for index, call in enumerate([] if lost else alert_calls):
                    try:
                        row = _call_procedure(connection, target.dialect, "add_alert", call, ADD_ALERT_PG_TYPES)
                    except Exception as exc:      # the procedure's refusal, or the connection's end
                        info = classify(exc)
                        if info.kind != "transient" and not info.connection_lost:
                            not_added.append(AlertNotAdded(call["name"], f"agent.add_alert refused it: {describe(exc)}"))
                            continue
                        not_added.append(AlertNotAdded(call["name"], (
                            f"the connection failed during agent.add_alert ({describe(exc)}): whether it was defined "
                            "is unknown; `sql-agent alerts` says, and --apply again defines it")))
                        not_added += [AlertNotAdded(rest["name"], "not attempted: the connection to the control "
                                                                  "database failed before it")
                                      for rest in alert_calls[index + 1:]]
                        break
                    added.append(AlertAdded(alert=call["name"],
                                            action=str(row[1]) if row is not None and len(row) > 1 else "defined"))
            finally:
                connection.close()
        if audit is not None:
            audit.detail = "; ".join(filter(None, [
                f"{len(done)} job(s) defined" + (": " + ", ".join(f"{job.job} ({job.action})" for job in done)
                                                 if done else ""),
                (f"{len(jobs_not_added)} job(s) not defined: " + ", ".join(f"{j.job} ({j.reason})" for j in jobs_not_added))
                if jobs_not_added else "",
                (f"{len(added)} alert(s) defined" + (": " + ", ".join(f"{a.alert} ({a.action})" for a in added)
                                                     if added else "")) if alerts else "",
                (f"{len(not_added)} alert(s) not defined: " + ", ".join(f"{a.alert} ({a.reason})" for a in not_added))
                if not_added else ""]))
            audit.done()
    return ImportApplied(jobs=tuple(done), alerts=tuple(added), alerts_not_added=tuple(not_added),
                         jobs_not_added=tuple(jobs_not_added))


class _CallFailed(Exception):
    """A call of apply_import's that failed: the procedure, the driver's error, and what became of
    the job (words appended to the refusal)."""

    def __init__(self, procedure: str, error: BaseException, outcome: str = "") -> None:
        super().__init__(str(error))
        self.procedure, self.error, self.outcome = procedure, error, outcome


def _add_scheduled_job(connection: Any, dialect: str, arguments: dict[str, Any]) -> ScheduledJobAdded:
    """agent.add_scheduled_job with ``arguments``; with ``steps``, then agent.set_job_steps, both
    in one transaction; without, agent.set_job_steps @steps = NULL after a redefinition. A failed
    call raises _CallFailed."""
    values = dict(arguments)
    steps = values.pop("steps", None)
    if "run_at" in values:
        # '@once' is in the job's time zone: the procedure takes a point in time.
        try:
            moment = parse_schedule("@once " + values["run_at"], values["timezone"]).at
        except ValueError as exc:
            raise UsageError(f"job {values['name']!r}: run_at {values['run_at']!r}: {exc}", setting="run_at",
                             value=values["run_at"], expected="a date and time in the job's time zone") from None
        values["run_at"] = moment.isoformat()
    name = values["name"]
    if steps is None:
        try:
            row = _call_procedure(connection, dialect, "add_scheduled_job", values, ADD_SCHEDULED_JOB_PG_TYPES,
                                  moments=("run_at",))
        except Exception as exc:
            raise _CallFailed("agent.add_scheduled_job", exc) from exc
        action = row[1] if row is not None and len(row) > 1 else "defined"
        if action == "redefined":
            # A redefinition keeps the steps set before (0028): the script gives this job one
            # command, and the job runs it.
            try:
                _call_procedure(connection, dialect, "set_job_steps", {"job_name": name, "steps": None},
                                SET_JOB_STEPS_PG_TYPES)
            except Exception as exc:
                raise _CallFailed("agent.set_job_steps @steps = NULL", exc, (
                    " (the job was redefined with the script's command, and keeps the steps set before it: "
                    "--apply again, or agent.set_job_steps @steps = NULL)")) from exc
        return ScheduledJobAdded(job=name, action=action)
    procedure = "agent.add_scheduled_job"
    try:
        with _one_transaction(connection, dialect):
            row = _call_procedure(connection, dialect, "add_scheduled_job", values, ADD_SCHEDULED_JOB_PG_TYPES,
                                  moments=("run_at",), commit=False)
            procedure = "agent.set_job_steps"
            _call_procedure(connection, dialect, "set_job_steps", {"job_name": name, "steps": steps},
                            SET_JOB_STEPS_PG_TYPES, commit=False)
    except Exception as exc:
        raise _CallFailed(procedure, exc, " (rolled back with its agent.add_scheduled_job: the job is as it was "
                                          "before, never without its steps)"
                          if procedure == "agent.set_job_steps" else "") from exc
    return ScheduledJobAdded(job=name, action=row[1] if row is not None and len(row) > 1 else "defined")


@contextmanager
def _one_transaction(connection: Any, dialect: str) -> Iterator[None]:
    """The calls inside in one transaction on a connection in autocommit (as the Store's own:
    PostgreSQL's driver out of autocommit, BEGIN TRANSACTION on SQL Server), committed at the end
    or rolled back on any error."""
    if dialect == "postgres":
        connection.autocommit = False
        try:
            yield
            connection.commit()
        except BaseException:
            try:
                connection.rollback()
            except Exception:  # noqa: BLE001 - the connection is gone: its transaction with it
                pass
            raise
        finally:
            try:
                connection.autocommit = True
            except Exception:  # noqa: BLE001 - a connection lost: closed by the caller
                pass
        return
    cursor = connection.cursor()
    try:
        cursor.execute("BEGIN TRANSACTION")
    finally:
        cursor.close()
    try:
        yield
        cursor = connection.cursor()
        try:
            cursor.execute("COMMIT TRANSACTION")
        finally:
            cursor.close()
    except BaseException:
        try:
            cursor = connection.cursor()
            try:
                cursor.execute("IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION")
            finally:
                cursor.close()
        except Exception:  # noqa: BLE001 - XACT_ABORT ON rolled it back, or the connection is gone
            pass
        raise


def _call_procedure(connection: Any, dialect: str, procedure: str, values: dict[str, Any], pg_types: Mapping[str, str],
                    *, moments: Sequence[str] = (), commit: bool = True) -> Any:
    """One call of agent.<procedure> with named arguments, on a connection in autocommit (each
    call a transaction of its own, as from SSMS or psql; ``commit`` False: a call inside
    _one_transaction): its first row (or None). ``moments``: the parameters that take a point in
    time (ISO-8601 text with its offset)."""
    names = list(values)
    if dialect == "postgres":
        sql = f"SELECT * FROM agent.{procedure}(" + ", ".join(
            f'"{n}" => CAST(? AS {pg_types[n]})' for n in names) + ")"
    else:
        # An EXEC argument is a constant or a variable, not an expression: a moment is converted
        # into a variable of the parameter's type first (its ? comes first).
        timed = [n for n in names if n in moments]
        sql = ("SET NOCOUNT ON; " + "".join(f"DECLARE @moment_{n} DATETIMEOFFSET = CAST(? AS DATETIMEOFFSET); "
                                            for n in timed)
               + f"EXEC agent.{procedure} " + ", ".join(f"@{n} = @moment_{n}" if n in moments else f"@{n} = ?"
                                                       for n in names))
        names = timed + [n for n in names if n not in moments]
    cursor = connection.cursor()
    try:
        cursor.execute(sql, [values[n] for n in names])
        row = cursor.fetchone() if cursor.description else None
        if commit:
            connection.commit()
    finally:
        cursor.close()
    return row


# --- jobs defined from the monitor's form (issue 32 item 6) -----------------------------------
# The monitor defines, redefines and removes the jobs the database holds with the procedures'
# own bodies (agent.add_scheduled_job_unaudited, agent.remove_scheduled_job_unaudited: their
# checks, refusals and effects, nothing rewritten), called in the action's transaction on the
# agent's connection, with the audit row (source monitor, the signed-in principal) and the job's
# owner written in the same transaction. The audited procedures would record the agent's own
# login as the caller, the owner and the audit's principal: the job would run with the agent's
# rights, and its audit row would not say who acted.

# Where a procedure's refusal starts in the driver's message.
_PROCEDURE_PREFIXES = ("agent.add_scheduled_job: ", "agent.remove_scheduled_job: ", "agent.set_job_steps: ")
# agent.jobs.owner: its column size.
MAX_OWNER_LENGTH = 256
# The form's "new job" target (no job name: the one typed is checked by the procedure).
NEW_JOB = "(new)"


@dataclass(frozen=True)
class JobDefined:
    """A job defined (or redefined) from the monitor: what the procedure did, and whom it runs as."""
    job_name: str
    action: str         # "defined" or "redefined", as the procedure says
    owner: str


@dataclass(frozen=True)
class JobRemoved:
    job_name: str
    skipped_runs: int


def settings_job_words(name: str) -> str:
    return f"defined in app settings (JOB__{name}__*)"


def _procedure_error(exc: BaseException) -> UsageError | None:
    """A procedure's refusal (its own words: the argument, the value, what is expected) as a
    UsageError; None for any other error (a lost connection stays what it is)."""
    text = " ".join(str(classify(exc).message or exc).split())
    for prefix in _PROCEDURE_PREFIXES:
        at = text.find(prefix)
        if at >= 0:
            words = text[at:]
            for noise in ("; Error while executing the query", " (SQLExecDirectW)", ";Error while executing"):
                words = words.split(noise)[0]
            words = re.sub(r"\s*\(\d+\)$", "", words.rstrip(" ;"))     # SQL Server's "(51401)"
            return UsageError(words, setting=prefix.rstrip(": "), value=None,
                              expected="what the procedure expects (its message says)")
    return None


def _database_definitions(store: Store, what: str) -> None:
    if store.dialect == "sqlite":
        raise UsageError(f"{what} needs a PostgreSQL or SQL Server control database (agent.add_scheduled_job and "
                         "agent.remove_scheduled_job are procedures; the embedded SQLite database has none): define "
                         "jobs in the app settings (JOB__<name>__*) there", setting="--db", value="sqlite",
                         expected="a PostgreSQL or SQL Server control database")


def define_job(store: Store, definition: Any, *, owner: str, now: datetime, actor: Actor,
               edit: str | None = None) -> JobDefined:
    """Define (``edit`` None: a new job, refused when one of the name is defined) or redefine
    (``edit``: the job's name, which must be a job defined in the database) a job with
    agent.add_scheduled_job's body, ``definition`` being a shared.jobs.definition.JobDefinition;
    the job runs as ``owner``; its steps (``definition.steps``, None: none) are set with
    agent.set_job_steps's body in the same transaction. One audit row 'define' (done, or refused
    with the reason)."""
    name = definition.name
    arguments = {key: value for key, value in definition.arguments().items()}
    arguments["owner"] = owner
    steps = getattr(definition, "steps", None)
    if steps is not None:
        arguments["steps"] = steps
    if edit is not None:
        arguments["edit"] = edit
    with audited(store, actor, AuditAction.DEFINE, now=now, arguments=arguments, job_name=name) as audit:
        if not owner or not owner.strip():
            raise UsageError("the platform passed no name for the signed-in principal (X-MS-CLIENT-PRINCIPAL-NAME), "
                             "and a job defined from the monitor runs as the principal of that name: nothing saved",
                             setting="owner", value=owner, expected="the signed-in principal's name")
        if edit is not None and edit != name:
            raise UsageError(f"the form edits job {edit!r} but names {name!r}: a job is renamed by defining the new "
                             "name and removing the old one", setting="name", value=name, expected=repr(edit))
        with audit.transaction():
            existing = store.execute("get_job_definition", job_name=name).one()
            if existing is not None and existing["configured"] and not existing["defined_in_database"]:
                raise UsageError(f"job {name!r} is {settings_job_words(name)}: change it there; the monitor edits only "
                                 "jobs defined in the database", setting="name", value=name,
                                 expected="a job defined in the database")
            _database_definitions(store, "defining a job from the monitor")
            if edit is None and existing is not None and existing["configured"]:
                raise UsageError(f"a job named {name!r} is defined already: edit it (its Edit link), or choose "
                                 "another name", setting="name", value=name, expected="a name no job holds")
            if edit is not None and (existing is None or not existing["configured"]):
                raise NotFoundError(f"job {name!r} is not defined (it was removed meanwhile?): nothing to edit",
                                    setting="name", value=name, expected="a job defined in the database")
            try:
                row = store.execute("define_job", **definition.arguments()).one()
                store.execute("set_job_owner", job_name=name, owner=owner[:MAX_OWNER_LENGTH])
                # agent.set_job_steps's body (0028), for the job just made the principal's: the
                # form's steps, or none (what the form shows is what the job has).
                store.execute("set_job_steps", job_name=name, steps=steps)
            except Exception as exc:
                refusal = _procedure_error(exc)
                if refusal is None:
                    raise
                raise refusal from None
            action = str(row["action"]) if row is not None else "defined"
            # The look above ran before the procedure took the job-definitions lock: another
            # action may have defined or removed the job in between. What the procedure did must
            # be what the operator asked for, else nothing is kept (a new job's save must not
            # replace someone's job, an edit must not bring back a job just removed).
            if edit is None and action != "defined":
                raise UsageError(f"a job named {name!r} was defined by someone else meanwhile: nothing saved; edit "
                                 "it (its Edit link), or choose another name", setting="name", value=name,
                                 expected="a name no job holds")
            if edit is not None and action != "redefined":
                raise NotFoundError(f"job {name!r} was removed meanwhile: nothing saved, nothing brought back",
                                    setting="name", value=name, expected="a job defined in the database")
            audit.detail = f"{action}; runs as {owner[:MAX_OWNER_LENGTH]!r}"
    return JobDefined(job_name=name, action=action, owner=owner[:MAX_OWNER_LENGTH])


def remove_job(store: Store, name: str, *, now: datetime, actor: Actor) -> JobRemoved:
    """Remove a job defined in the database (agent.remove_scheduled_job's body: its claimed slots
    skipped, its history kept). A settings job is refused with where it is defined. One audit
    row 'remove'."""
    with audited(store, actor, AuditAction.REMOVE, now=now, arguments={"name": name}, job_name=name) as audit:
        with audit.transaction():
            existing = store.execute("get_job_definition", job_name=name).one()
            if existing is not None and existing["configured"] and not existing["defined_in_database"]:
                raise UsageError(f"job {name!r} is {settings_job_words(name)}: remove it there; the monitor removes "
                                 "only jobs defined in the database", setting="name", value=name,
                                 expected="a job defined in the database")
            _database_definitions(store, "removing a job from the monitor")
            try:
                row = store.execute("remove_job", job_name=name).one()
            except Exception as exc:
                refusal = _procedure_error(exc)
                if refusal is None:
                    raise
                raise refusal from None
            skipped = int(row["skipped_runs"]) if row is not None else 0
            audit.detail = f"removed; {skipped} claimed slot(s) skipped"
    return JobRemoved(job_name=name, skipped_runs=skipped)
