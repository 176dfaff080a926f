"""The rules that turn a schedule's slots into the runs the planner claims, shared by the tick's
planner (shared/engine/scheduler.py), backfill (shared/engine/operations.py) and ``next``
(shared/engine/views.py): the job's calendars (excluded slots skipped or moved) and its jitter.
A module of its own so that none of them imports another.

The key of a run (its ``scheduled_for``, the unique (job, slot) key) is a function of the job's
definition and the time the run stands for alone (``run_key``), never of what one tick decided
about it: a slot one tick claims ahead, another (racing, later) records missed or catches up,
and a run a calendar moved to a time that is also a slot of the schedule, are each keyed at the
same instant, so a slot is claimed once whichever instance and tick plans it."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from shared.control.sqlerrors import describe
from shared.jobs.calendars import CalendarRules
from shared.jobs.run_model import RunStatus
from shared.jobs.schedules import jitter_offset, parse_schedule, validate_timezone

log = logging.getLogger(__name__)

# A slot the planner decided: (slot, status, note, runnable_at).
SlotPlan = tuple[datetime, RunStatus, "str | None", "datetime | None"]

# The note prefix of a missed slot run within CATCHUP_SECONDS (scheduler.NOTE_CATCHUP_WINDOW):
# dispatch_runs, claim_runs and start_run never skip such a run as a misfire.
CATCH_UP_PREFIX = "catch-up:"


def run_offset(job_name: str, moment: datetime, schedule: Any, jitter_seconds: int,
               rules: CalendarRules | None = None, zone: Any = None) -> int:
    """How many seconds after ``moment`` (a slot of the schedule, or the time a calendar moved
    excluded slots to) the run standing for it is keyed and runs: its jitter
    (schedules.jitter_offset: fixed by the job's name and ``moment``, before the schedule's next
    slot after ``moment``), except

    * 0 when a calendar excludes ``moment`` itself (the skipped slot is recorded at its time);
    * 0 when a calendar excludes the jittered time (JITTER_SECONDS never pushes a run into an
      excluded period: the run keeps its allowed time, unjittered);
    * 0 for a one-time schedule (its run is at the time given).

    A pure function of the job's definition and ``moment``: every instance and tick agrees."""
    if jitter_seconds <= 0 or getattr(schedule, "is_once", False):
        # A one-time job runs at the time given: a jitter there would make a later change of
        # JITTER_SECONDS a new key, a second run of a job that already ran.
        return 0
    if rules and rules.why_excluded(moment, zone) is not None:
        return 0
    try:
        following = schedule.next_after(moment)
    except (ValueError, OverflowError):
        following = None
    offset = jitter_offset(job_name, moment, following, jitter_seconds)
    if offset and rules and rules.why_excluded(moment + timedelta(seconds=offset), zone) is not None:
        return 0
    return offset


def with_jitter(planned: list[SlotPlan], job: dict[str, Any]) -> list[SlotPlan]:
    """Every planned entry keyed by ``run_offset``: a slot that runs (pending: on time, caught up,
    or moved by a calendar) and a slot recorded skipped (missed, paused) alike, so that ticks
    deciding the same slot differently still meet on the unique (job, slot) key. A pending run
    says its jitter in its note (after the note it had: a catch-up keeps its ``catch-up:``
    prefix); a skipped one keeps its note as it is. The run stays before the job's next slot."""
    jitter = int(job.get("jitter_seconds") or 0)
    if jitter <= 0:
        return planned
    try:
        schedule = parse_schedule(job["schedule"], job["timezone"])
        rules = calendar_rules(job.get("calendars"))
        zone = validate_timezone(job["timezone"]) if rules else None
    except (ValueError, OverflowError):
        return planned
    out: dict[datetime, SlotPlan] = {}
    for slot, status, note, runnable in planned:
        offset = run_offset(job["job_name"], slot, schedule, jitter, rules, zone)
        key = slot + timedelta(seconds=offset)
        if offset and status == RunStatus.PENDING:
            shown = f"jitter: +{offset} s from {slot.isoformat()}"
            note = shown if note is None else f"{note} ({shown})"
        out.setdefault(key, (key, status, note, runnable))
    return sorted(out.values(), key=lambda entry: entry[0])


@lru_cache(maxsize=256)
def calendar_rules(text: str | None) -> CalendarRules:
    try:
        return CalendarRules.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:   # written by this code: should not happen
        log.error("calendars %r cannot be read (%s); they are not applied", (text or "")[:200], describe(exc))
        return CalendarRules()


def apply_calendars(planned: list[SlotPlan], rules: CalendarRules, zone) -> list[SlotPlan]:
    """The job's calendars decide each slot that would run: one they exclude is recorded
    skipped with the calendar's name (``calendar: uk_holidays``) or, with ON_EXCLUDED=next,
    skipped with the time it moved to and a run claimed at that time (the first instant the
    calendars allow; every slot of one excluded stretch moves to the same time, which runs once:
    the unique (job, slot) key, with_jitter keying it as the schedule's own slot at that time
    would be). A moved run lands on a slot of the schedule as that slot's run. A missed slot
    run within CATCHUP_SECONDS keeps its ``catch-up:`` note prefix when moved, so the misfire
    rule of the claims leaves it to run."""
    decided: dict[datetime, SlotPlan] = {}
    moved: list[SlotPlan] = []
    for slot, status, note, runnable in planned:
        why = rules.why_excluded(slot, zone) if status == RunStatus.PENDING else None
        if why is None:
            decided[slot] = (slot, status, note, runnable)
            continue
        shown = f"{why} ({note})" if note else why
        if rules.on_excluded == "next":
            allowed = rules.next_allowed(slot, zone)
            if allowed is None:
                decided[slot] = (slot, RunStatus.SKIPPED, f"{shown}; no allowed time within a year", None)
                continue
            decided[slot] = (slot, RunStatus.SKIPPED, f"{shown}; moved to {allowed.isoformat()}", None)
            if note and note.startswith(CATCH_UP_PREFIX):
                moved_note = f"{note}; {why}; moved from {slot.isoformat()}"
            else:
                moved_note = f"{shown}; moved from {slot.isoformat()}"
            moved.append((allowed, RunStatus.PENDING, moved_note, None))
        else:
            decided[slot] = (slot, RunStatus.SKIPPED, shown, None)
    for entry in moved:
        decided.setdefault(entry[0], entry)
    return sorted(decided.values(), key=lambda entry: entry[0])
