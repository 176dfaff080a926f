"""The rules that turn a schedule's slots into the runs the planner claims, shared by the tick's
planner (shared/engine/scheduler.py) and backfill (shared/engine/operations.py): the job's
calendars (excluded slots skipped or moved) and its jitter. A module of its own so that neither
of the two imports the other."""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from shared.control.sqlerrors import describe
from shared.jobs.calendars import CalendarRules
from shared.jobs.run_model import RunStatus
from shared.jobs.schedules import jitter_offset, parse_schedule

log = logging.getLogger(__name__)

# A slot the planner decided: (slot, status, note, runnable_at).
SlotPlan = tuple[datetime, RunStatus, "str | None", "datetime | None"]


def with_jitter(planned: list[SlotPlan], job: dict[str, Any]) -> list[SlotPlan]:
    """Each slot the schedule gave that runs (pending, no note: not a catch-up, not moved by a
    calendar) moved later by the job's jitter (schedules.jitter_offset): the run is keyed by the
    jittered time, the same on every instance, and stays before the job's next slot."""
    try:
        schedule = parse_schedule(job["schedule"], job["timezone"])
    except (ValueError, OverflowError):
        return planned
    out: list[SlotPlan] = []
    for slot, status, note, runnable in planned:
        if status == RunStatus.PENDING and note is None and runnable is None:
            offset = jitter_offset(job["job_name"], slot, schedule.next_after(slot), int(job["jitter_seconds"]))
            if offset:
                out.append((slot + timedelta(seconds=offset), status, f"jitter: +{offset} s from {slot.isoformat()}",
                            None))
                continue
        out.append((slot, status, note, runnable))
    return out


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
    the unique (job, slot) key). A moved run lands on a slot of the schedule as that slot's run."""
    decided: dict[datetime, SlotPlan] = {}
    moved: list[SlotPlan] = []
    for slot, status, note, runnable in planned:
        why = rules.why_excluded(slot, zone) if status == RunStatus.PENDING else None
        if why is None:
            decided[slot] = (slot, status, note, runnable)
            continue
        if note:
            why = f"{why} ({note})"
        if rules.on_excluded == "next":
            allowed = rules.next_allowed(slot, zone)
            if allowed is None:
                decided[slot] = (slot, RunStatus.SKIPPED, f"{why}; no allowed time within a year", None)
                continue
            decided[slot] = (slot, RunStatus.SKIPPED, f"{why}; moved to {allowed.isoformat()}", None)
            moved.append((allowed, RunStatus.PENDING, f"{why}; moved from {slot.isoformat()}", None))
        else:
            decided[slot] = (slot, RunStatus.SKIPPED, why, None)
    for entry in moved:
        decided.setdefault(entry[0], entry)
    return sorted(decided.values(), key=lambda entry: entry[0])
