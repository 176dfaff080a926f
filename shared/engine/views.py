"""What the operator sees, gathered once: the data behind the monitor's pages and the CLI's
`jobs`, `history`, `stuck` and `poison list` (their --json is exactly what these return, so a
page's JSON twin and the command agree by construction).

Every function runs a fixed number of named queries, whatever the number of jobs or runs (the
jobs page: list_jobs and list_job_activity; never a query per job or per run), and only
SELECTs: nothing here changes the database. Fleet runs add one query, list_run_targets, for
every execution of the runs shown, and only when a run shown has targets.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

from shared.engine.slots import run_offset
from shared.errors import NotFoundError
from shared.jobs.calendars import CalendarRules
from shared.jobs.describe import describe_schedule
from shared.jobs.params import read_json
from shared.jobs.run_model import RunStatus
from shared.jobs.schedules import parse_schedule

UTC = timezone.utc

# Where a job is defined: list_jobs' `source` column, `settings` (JOB__<name>__*) or `database`
# (agent.add_scheduled_job); a row without one is a settings job.
DEFAULT_JOB_SOURCE = "settings"
TIMELINE_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}


def pause_in_force(row: dict[str, Any], now: datetime) -> bool:
    """Whether a list_jobs / get_job row's pause (paused_at, paused_until) holds at ``now``
    (a pause is made and ended by shared.engine.operations.pause_job / resume_job)."""
    if row.get("paused_at") is None:
        return False
    until = row.get("paused_until")
    return until is None or until > now
DEFAULT_WINDOW = "24h"
# The most runs one timeline draws (the page says so when a window holds more).
TIMELINE_LIMIT = 1500
DEFAULT_HISTORY_LIMIT = 50
DEFAULT_POISON_LIMIT = 50
DEFAULT_STUCK_LIMIT = 500
DEFAULT_STUCK_AGE_SECONDS = 600
# `next` and the job page's preview of the slots to come.
DEFAULT_NEXT_COUNT = 10
MAX_NEXT_COUNT = 1000
# `next` lists this many slots of one excluded stretch, then the stretch's end (an every-second job
# over a weekend would list 172,800).
NEXT_STRETCH_SHOWN = 5
RUN_POISON_LIMIT = 50


# ---------------------------------------------------------------- jobs


def job_state(row: dict[str, Any], now: datetime | None = None) -> str:
    # planning: defined by a T-SQL procedure, not yet checked and planned by the engine;
    # paused: a pause in force at ``now`` (sql-agent pause, agent.pause_job).
    return ("invalid" if not row["valid"] else "removed" if not row["configured"]
            else "disabled" if not row["enabled"] else "planning" if row.get("needs_planning")
            else "paused" if now is not None and pause_in_force(row, now) else "enabled")


def jobs_view(store, now: datetime) -> list[dict[str, Any]]:
    """One row per job: list_jobs' columns (the keys `jobs --json` always had) and what the
    monitor adds: source, state, schedule in words, next slot in the job's time zone, and the
    status now (idle, running since when on which worker, queued, retrying at, waiting)."""
    jobs = store.execute("list_jobs").rows
    activity = store.execute("list_job_activity", job_name=None).rows
    return _with_activity(jobs, activity, now)


def _with_activity(jobs: list[dict[str, Any]], activity: list[dict[str, Any]], now: datetime) -> list[dict[str, Any]]:
    by_job: dict[str, list[dict[str, Any]]] = {}
    for group in activity:
        by_job.setdefault(group["job_name"], []).append(group)
    return [{**row, **_job_extras(row, now), **status_now(by_job.get(row["job_name"], []), now)} for row in jobs]


# A job's pause as list_jobs / get_job give it; all None when no pause is in force (one that ended
# by itself at its paused_until is no pause).
PAUSE_KEYS = ("paused_at", "paused_until", "paused_by", "pause_reason")


def declared_params(value: Any) -> dict[str, Any] | None:
    """agent.jobs.params as stored (JSON text; a dict when already read) as an object, None: none."""
    if isinstance(value, dict):
        return value or None
    return read_json(value) or None


def params_words(params: dict[str, Any] | None) -> str:
    """A job's declared parameters in a few words: ``k=default`` or ``k (required)``; "-": none."""
    if not params:
        return "-"
    words = [f"{name}={value}" if value is not None else f"{name} (required)" for name, value in params.items()]
    text = ", ".join(words)
    return text if len(text) <= 120 else text[:117] + "..."


def _job_extras(row: dict[str, Any], now: datetime) -> dict[str, Any]:
    paused = pause_in_force(row, now)
    return {
        **{key: row.get(key) if paused else None for key in PAUSE_KEYS},
        "paused": paused,
        "source": row.get("source") or DEFAULT_JOB_SOURCE,
        "state": job_state(row, now),
        "schedule_words": describe_schedule(row.get("schedule")),
        "calendar_words": calendar_words(row.get("calendars")),
        # The parameters it declares as an object (name -> default, None: none, a run must give it);
        # None: it declares none. `jobs --json`, the jobs page and a job page alike.
        "params": declared_params(row.get("params")),
        "next_due_local": local_time(row.get("next_due_at"), row.get("timezone")),
    }


def calendar_words(text: str | None) -> str | None:
    """A job's calendars in words ("excluding uk_holidays, freeze; an excluded slot moves to the
    next allowed time"), or None when it has none (or they cannot be read: a page never fails)."""
    try:
        return _rules(text).describe() or None
    except Exception:   # words are a courtesy
        return None


def _rules(text: str | None) -> CalendarRules:
    return CalendarRules.from_json(text)


def after_words(row: dict[str, Any]) -> str | None:
    """Whom a job follows, in words ("after load", "after load failed"), or None: a job row's
    after_job and after_outcome (JOB__<name>__AFTER, agent.add_scheduled_job @after)."""
    leader = row.get("after_job")
    if not leader:
        return None
    outcome = row.get("after_outcome") or "succeeded"
    return f"after {leader}" + ("" if outcome == "succeeded" else f" {outcome}")


def catchup_words(row: dict[str, Any]) -> str | None:
    """A job's catch-up window in words ("catch-up 3600 s": after downtime, every missed slot
    within that many seconds runs), or None when it has none (JOB__<name>__CATCHUP_SECONDS,
    agent.add_scheduled_job @catchup_seconds)."""
    seconds = int(row.get("catchup_seconds") or 0)
    return f"catch-up {seconds} s" if seconds > 0 else None


def status_now(groups: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
    """A job's status from its list_job_activity groups: the most active state wins (running,
    then queued, then retrying, then waiting, then due), with the number of runs in flight."""
    in_flight = sum(int(g["runs"]) for g in groups)
    running = [g for g in groups if g["status"] == RunStatus.RUNNING]
    queued = [g for g in groups if g["status"] == RunStatus.QUEUED]
    pending = [g for g in groups if g["status"] == RunStatus.PENDING]
    retrying = [g for g in pending if g["retry"] and g["first_runnable_at"] and g["first_runnable_at"] > now]
    waiting = [g for g in pending if g["first_runnable_at"] and g["first_runnable_at"] <= now]
    status: dict[str, Any] = {"status": "idle", "status_since": None, "status_worker": None,
                              "retry_at": None, "runs_in_flight": in_flight}
    if running:
        starts = [g["first_started_at"] for g in running if g["first_started_at"]]
        workers = [g["worker"] for g in running if g["worker"]]
        status.update(status="running", status_since=min(starts, default=None), status_worker=min(workers, default=None))
    elif queued:
        status.update(status="queued", status_since=min(g["first_scheduled_for"] for g in queued))
    elif retrying:
        status.update(status="retrying", retry_at=min(g["first_runnable_at"] for g in retrying))
    elif waiting:
        status.update(status="waiting", status_since=min(g["first_scheduled_for"] for g in waiting))
    elif pending:
        status.update(status="due", status_since=min(g["first_scheduled_for"] for g in pending))
    return status


def local_time(value: datetime | None, zone: str | None) -> str | None:
    """An instant in the job's time zone (ISO-8601 with its offset); None when there is none or
    the zone is unknown (an invalid job's zone may be anything)."""
    if value is None:
        return None
    try:
        return value.astimezone(ZoneInfo(zone or "UTC")).isoformat()
    except Exception:
        return None


# ---------------------------------------------------------------- one job


def unknown_job(store, name: str, *, setting: str = "JOB") -> NotFoundError:
    """The error for a job name the agent does not know, naming the jobs it does."""
    jobs = [r["job_name"] for r in store.execute("list_jobs").rows if r["configured"]]
    known = ", ".join(jobs) or "none"
    return NotFoundError(f"no job named {name!r} (jobs the agent knows: {known}; a job added to the settings is "
                         "known after the agent's next tick)", setting=setting, value=name,
                         expected=f"one of the jobs the agent knows: {known}")


def history_view(store, job_name: str | None, limit: int, *, with_output: bool = False) -> dict[str, Any]:
    """`history --json`: runs newest first, each with its attempts (and, ``with_output``, each
    attempt's output: up to AGENT_STEP_OUTPUT_MAX_BYTES each, so read only when asked for) and
    its fleet executions (`targets`, see fleet_targets; empty for a run without targets), and the
    job events."""
    runs = store.execute("list_history", job_name=job_name, limit=limit).rows
    attempts = store.execute("list_attempts", run_ids=[r["run_id"] for r in runs]).rows if runs else []
    events = store.execute("list_job_events", job_name=job_name, limit=limit).rows
    if job_name is not None and not runs and not events and store.execute("get_job", job_name=job_name).one() is None:
        # A job with nothing to show yet is an empty history; a name no job has is an error
        # (exit 2), as for run-now, pause or stop: a typo must not look like a quiet job.
        raise unknown_job(store, job_name, setting="--job")
    if runs and with_output:
        _attach_output(store, [r["run_id"] for r in runs], attempts)
    targets = fleet_targets(store, runs)
    by_run: dict[int, list[dict[str, Any]]] = {}
    for attempt in attempts:
        by_run.setdefault(attempt["run_id"], []).append(attempt)
    # params: the values the run started with (agent.runs.params), as an object; None: none given.
    return {"runs": [{**run, "params": read_json(run.get("params")) or None, "attempts": by_run.get(run["run_id"], []),
                      **_with_targets(targets.get(run["run_id"], []))}
                     for run in runs],
            "job_events": events}


DEFAULT_AUDIT_LIMIT = 50


def audit_view(store, job_name: str | None = None, since: datetime | None = None,
               limit: int = DEFAULT_AUDIT_LIMIT) -> list[dict[str, Any]]:
    """`audit --json` and the monitor's audit page: the audit trail newest first (one query),
    each row's arguments as the JSON object they were recorded as. A job name no job has any more
    is no error: a removed job's trail stays as long as the history."""
    rows = store.execute("list_audit", job_name=job_name, since=since, limit=limit).rows
    for row in rows:
        text = row.get("arguments")
        try:
            row["arguments"] = json.loads(text) if text else {}
        except ValueError:          # written by hand into the table: shown as it is
            row["arguments"] = {"text": text}
    return rows


# The keys of an execution in a run's `targets` (list_run_targets' columns, `attempt` as `attempts`).
TARGET_KEYS = ("target_server", "target_database", "run_id", "step", "parent_token", "status", "attempts",
               "max_attempts", "last_error_number", "last_error", "started_at", "finished_at")


def fleet_targets(store, runs: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The executions of the fleet runs among ``runs`` (those that fanned out: targets_total set),
    by run id, in one query (list_run_targets) and none when no run has targets. Each run's
    executions come grouped by target: the agent's own server (target_server None) first, then
    by server, database, step and execution, so a target's executions (one per fleet step, or
    per visit of a step the flow came back to) follow each other."""
    fleet = [run["run_id"] for run in runs if run.get("targets_total")]
    if not fleet:
        return {}
    by_run: dict[int, list[dict[str, Any]]] = {}
    for row in store.execute("list_run_targets", run_ids=fleet).rows:
        execution = {**row, "attempts": row["attempt"]}
        by_run.setdefault(row["parent_run_id"], []).append({key: execution[key] for key in TARGET_KEYS})
    for executions in by_run.values():
        executions.sort(key=_target_order)
    return by_run


def _target_order(execution: dict[str, Any]) -> tuple:
    server = execution["target_server"]
    return (server is not None, server or "", execution["target_database"] or "", execution["step"] or 0,
            execution["run_id"])


def target_label(execution: dict[str, Any]) -> str:
    """A target in words: its database, with its server when not the agent's own."""
    database = execution.get("target_database") or "?"
    server = execution.get("target_server")
    return f"{server}/{database}" if server else database


def _with_targets(executions: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's `targets` and `target_statuses` (executions per status, e.g. while they run)."""
    statuses: dict[str, int] = {}
    for execution in executions:
        statuses[execution["status"]] = statuses.get(execution["status"], 0) + 1
    return {"targets": executions, "target_statuses": dict(sorted(statuses.items()))}


def _attach_output(store, run_ids: list[int], attempts: list[dict[str, Any]]) -> None:
    """Each attempt's output (what the server said while its step ran), in one query."""
    outputs = {(row["run_id"], row["attempt"]): row["output"]
               for row in store.execute("list_attempt_output", run_ids=run_ids).rows}
    for attempt in attempts:
        attempt["output"] = outputs.get((attempt["run_id"], attempt["attempt"]))


def job_view(store, name: str, now: datetime, window: str = DEFAULT_WINDOW,
             history_limit: int = DEFAULT_HISTORY_LIMIT) -> dict[str, Any] | None:
    """A job page: the job's row (as on the jobs page), its timeline over the window, then its
    history (as `history --job NAME --json`). None when no job has that name."""
    job = store.execute("get_job", job_name=name).one()
    if job is None:
        return None
    activity = store.execute("list_job_activity", job_name=name).rows
    (job,) = _with_activity([job], activity, now)
    since = now - TIMELINE_WINDOWS[window]
    timeline = store.execute("list_job_timeline", job_name=name, since=since, limit=TIMELINE_LIMIT + 1).rows
    cut = len(timeline) > TIMELINE_LIMIT
    history = history_view(store, name, history_limit, with_output=True)
    return {"job": job, "window": window, "window_start": since, "window_end": now,
            "timeline": {"runs": timeline[:TIMELINE_LIMIT], "limit": TIMELINE_LIMIT, "cut": cut},
            "next": upcoming_slots(job, now, DEFAULT_NEXT_COUNT), **history}


# ---------------------------------------------------------------- the slots to come


def next_view(store, name: str, start: datetime, count: int = DEFAULT_NEXT_COUNT) -> dict[str, Any]:
    """`next JOB`: the job as the agent last synced it (get_job: one query) and its next ``count``
    slots strictly after ``start``; NotFoundError names the jobs the agent knows."""
    job = store.execute("get_job", job_name=name).one()
    if job is None:
        known = ", ".join(sorted(r["job_name"] for r in store.execute("list_jobs").rows)) or "none"
        raise NotFoundError(f"no job named {name!r} (jobs the agent knows: {known})", setting="JOB", value=name,
                            expected=f"one of the jobs the agent knows: {known}")
    return upcoming_slots(job, start, count)


def upcoming_slots(job: dict[str, Any], start: datetime, count: int) -> dict[str, Any]:
    """A job row's next ``count`` slots strictly after ``start``, each in UTC and in the job's
    time zone, from its schedule (calendar tokens and clauses included); computed here, in
    Python, from the row: no query. ``note`` says why there are fewer than asked (on demand, a
    one-time job already past, a schedule that ended) and what the slots do not show (a job
    disabled, paused, invalid)."""
    zone = job.get("timezone") or "UTC"
    view: dict[str, Any] = {"job_name": job["job_name"], "schedule": job.get("schedule") or "", "timezone": zone,
                            "schedule_words": describe_schedule(job.get("schedule")),
                            "calendar_words": calendar_words(job.get("calendars")), "from": start, "count": count,
                            "slots": [], "removed": [], "note": None}
    if not job.get("valid", 1):
        view["note"] = f"invalid: {job.get('config_error') or 'its settings are refused'}; it claims no slot"
        return view
    try:
        schedule = parse_schedule(job.get("schedule") or "", zone)
    except ValueError as exc:
        view["note"] = f"its schedule is not understood here ({exc})"
        return view
    try:
        rules, tz = _rules(job.get("calendars")), ZoneInfo(zone)
    except Exception:
        rules, tz = CalendarRules(), ZoneInfo("UTC")
    runs: dict[datetime, str | None] = {}       # instant -> why it runs there (a moved slot)
    latest: datetime | None = None
    moment: datetime | None = start
    stretch = 0         # slots removed in a row: past a few, the walk jumps to the next allowed time
    for _ in range(count * 20 if rules else count):
        moment = schedule.next_after(moment) if moment is not None else None
        if moment is None or (len(runs) >= count and latest is not None and moment > latest):
            break
        why = rules.why_excluded(moment, tz) if rules else None
        if why is None:
            stretch = 0
            runs.setdefault(moment, None)
            latest = max(latest or moment, moment)
            continue
        allowed = rules.next_allowed(moment, tz)
        moved = allowed if rules.on_excluded == "next" else None
        stretch += 1
        jump = stretch >= NEXT_STRETCH_SHOWN and allowed is not None
        if len(view["removed"]) < count:
            note = f"{why} (and every slot after it before {allowed.isoformat()})" if jump else why
            view["removed"].append({"at": moment, "local": local_time(moment, zone), "calendar": note,
                                    "moved_to": moved})
        if moved is not None:
            runs.setdefault(moved, f"{why}; moved from {moment.isoformat()}")
            latest = max(latest or moved, moved)
        if allowed is None:
            notes_early = f"{why}: no allowed time within a year after {moment.isoformat()}"
            view["note"] = notes_early
            break
        if jump:        # the rest of the stretch: the next slot at or after the allowed time
            moment, stretch = allowed - timedelta(microseconds=1), 0
    jitter = int(job.get("jitter_seconds") or 0)
    slots = []
    for at in sorted(runs)[:count]:
        # Keyed as the planner keys it (slots.run_offset): a moved run is jittered as the
        # schedule's own slot at that time would be; never into an excluded period.
        offset = run_offset(job["job_name"], at, schedule, jitter, rules, tz)
        moment = at + timedelta(seconds=offset)
        slots.append({"at": moment, "local": local_time(moment, zone), "moved": runs[at], "jitter_seconds": offset})
    view["slots"] = slots
    notes = []
    if getattr(schedule, "is_on_demand", False):
        notes.append("on demand: no slot (it runs when started)")
    elif not view["slots"] and schedule.is_once:
        notes.append("a one-time job whose slot is not after this time")
    elif len(view["slots"]) < count and getattr(schedule, "ends", None) is not None:
        notes.append(f"its schedule ends on {schedule.ends.isoformat()}")
    state = job_state(job, start)
    if state in ("disabled", "removed"):
        notes.append(f"{state}: these slots are not claimed")
    elif state == "paused":
        until = job.get("paused_until")
        notes.append("paused" + (f" until {until.isoformat()}" if until else "")
                     + ": a slot that comes while paused is recorded skipped")
    if view["note"]:
        notes.insert(0, view["note"])
    view["note"] = "; ".join(notes) or None
    return view


# ---------------------------------------------------------------- one run, poison, stuck


# What an execution's run page says of the run it belongs to (get_run's columns).
PARENT_KEYS = ("run_id", "job_name", "kind", "status", "step", "scheduled_for", "targets_total", "targets_failed")


def run_view(store, run_id: int) -> dict[str, Any] | None:
    """A run page: the run, its attempts (with output) and poison messages; a fleet run also its
    executions by target (`targets`, as in history), an execution the run it belongs to
    (`parent`: None for any other run, or when that run is gone). get_run, list_attempts (and
    list_attempt_output when there are attempts) and list_run_poison; one query more for a fleet
    run (list_run_targets) or an execution (get_run of its run)."""
    run = store.execute("get_run", run_id=run_id).one()
    if run is None:
        return None
    attempts = store.execute("list_attempts", run_ids=[run_id]).rows
    if attempts:
        _attach_output(store, [run_id], attempts)
    poison = _decoded(store.execute("list_run_poison", run_id=run_id, limit=RUN_POISON_LIMIT).rows)
    parent = None
    if run.get("parent_run_id") is not None:
        row = store.execute("get_run", run_id=run["parent_run_id"]).one()
        parent = {key: row[key] for key in PARENT_KEYS} if row else None
    targets = fleet_targets(store, [run]).get(run_id, [])
    run["params"] = read_json(run.get("params")) or None      # as history gives it
    return {"run": run, "attempts": attempts, "poison": poison, "parent": parent, **_with_targets(targets)}


def poison_view(store, limit: int = DEFAULT_POISON_LIMIT) -> list[dict[str, Any]]:
    """`poison list --json`: poison messages newest first, errors decoded."""
    return _decoded(store.execute("list_poison", limit=limit).rows)


def stuck_view(store, now: datetime, older_than: int = DEFAULT_STUCK_AGE_SECONDS,
               limit: int = DEFAULT_STUCK_LIMIT) -> list[dict[str, Any]]:
    """`stuck --json`: runs past their lease, or runnable but not started for ``older_than`` s."""
    return store.execute("list_stuck_runs_page", now=now, stale_before=now - timedelta(seconds=older_than),
                         limit=limit).rows


def _decoded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for row in rows:
        try:
            row["errors"] = json.loads(row["errors"]) if row["errors"] else []
        except ValueError:      # shown as stored rather than breaking the page
            row["errors"] = [row["errors"]]
    return rows


def _json_default(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def to_json(value: Any, *, compact: bool = False) -> str:
    """The JSON the CLI prints (`--json`, indented) and the pages' twins answer (``compact``: the
    same values, without the indentation, which json only writes in pure Python: 1,000 jobs
    took 5 times longer indented)."""
    if compact:
        return json.dumps(value, default=_json_default, separators=(",", ":"))
    return json.dumps(value, indent=2, default=_json_default)


def alerts_view(store, firings: int = 20) -> dict[str, Any]:
    """`alerts --json` and the monitor's alerts page: every condition alert (issue 32 item 3) with
    its state, and the latest responses with what each said (two statements)."""
    alerts = store.execute("list_alerts").rows
    latest = store.execute("list_alert_firings", alert_name=None, limit=firings).rows
    for row in latest:
        text = row.get("detail")
        try:
            row["detail"] = json.loads(text) if text else None
        except ValueError:
            row["detail"] = {"text": text}
    for row in alerts:
        row["enabled"] = bool(row["enabled"])
        row["notify"] = bool(row["notify"])
        row["state"] = ("invalid" if row["valid"] == 0 else "unchecked" if row["valid"] is None
                        else "disabled" if not row["enabled"] else "failing" if row["last_error"] else "ok")
    return {"alerts": alerts, "firings": latest}


# ---------------------------------------------------------------- the job form (issue 32 item 6)


def job_definition(store, name: str) -> dict[str, Any] | None:
    """One job as agent.add_scheduled_job's arguments hold it, with where it is defined
    (defined_in_database), whether the settings or the database still hold it (configured) and
    its owner: what an edit starts from (get_job_definition: one indexed read)."""
    return store.execute("get_job_definition", job_name=name).one()


def configured_jobs(store) -> list[dict[str, Any]]:
    """The jobs the settings or the database hold now (list_jobs, removed ones left out), each
    with its ``source`` (settings or database)."""
    return [row for row in store.execute("list_jobs").rows if row["configured"]]
