"""Liveness (issue 32 item 7): has the agent ticked lately?

Every tick that reaches its last step (``Scheduler.purge_history``) records its time and the
period within which the next connected tick is expected, as one row of agent.state
(``last_tick``), in the statement batch that step sends anyway (on PostgreSQL no round trip of
its own). The period is the tick schedule's largest gap between two slots; with quiet ticks
(AGENT_QUIET_MAX_MINUTES > 0) a tick may legitimately skip connecting, so the period is then the
quiet maximum (when larger): a quiet agent is not reported late.

The readers (the monitor's pages and JSON twins, ``sql-agent jobs``) need no settings of their
own: the record carries its period, and the agent is *late* when the database's clock is more
than two periods past the last tick (or when no tick was ever recorded).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from shared.jobs.schedules import CronSchedule

UTC = timezone.utc
LAST_TICK_KEY = "last_tick"
# How many tick periods may pass without a tick before the agent is reported late.
LATE_AFTER_PERIODS = 2
# Slots of the tick schedule looked at to find its largest gap.
_GAPS_SAMPLED = 8


def tick_period_seconds(tick_schedule: str, quiet_max_minutes: int, now: datetime) -> int:
    """The longest the agent may go between two connected ticks: the tick schedule's largest gap
    between consecutive slots after ``now`` (a few looked at), or the quiet maximum when quiet
    ticks are on and it is longer."""
    period = 60
    try:
        schedule = CronSchedule(tick_schedule, "UTC")
        moments = [schedule.next_after(now)]
        for _ in range(_GAPS_SAMPLED):
            if moments[-1] is None:
                break
            moments.append(schedule.next_after(moments[-1]))
        gaps = [(b - a).total_seconds() for a, b in zip(moments, moments[1:]) if a is not None and b is not None]
        if gaps:
            period = max(1, int(max(gaps)))
    except (ValueError, OverflowError):
        pass
    if quiet_max_minutes > 0:
        period = max(period, quiet_max_minutes * 60)
    return period


def tick_record(now: datetime, period_seconds: int) -> str:
    return json.dumps({"at": now.astimezone(UTC).isoformat(), "period_seconds": int(period_seconds)})


def liveness(store: Any, now: datetime) -> dict[str, Any]:
    """What the readers show: ``late`` (bool), ``last_tick_at`` (None: never recorded),
    ``period_seconds``, ``late_after`` (when the agent counts as late) and ``message`` (words,
    None while it is not late). One indexed read of agent.state."""
    raw = store.execute("get_state", state_key=LAST_TICK_KEY).scalar()
    record = _read(raw)
    if record is None:
        return {"late": True, "last_tick_at": None, "period_seconds": None, "late_after": None,
                "message": "the agent has recorded no tick in this control database (is it running? "
                           "`sql-agent run` locally, the function app's timer in Azure)"}
    at, period = record
    late_after = at + timedelta(seconds=LATE_AFTER_PERIODS * period)
    late = now > late_after
    message = None
    if late:
        message = (f"the agent has not ticked since {at.isoformat(' ', 'seconds')[:19]} UTC "
                   f"({_span((now - at).total_seconds())} ago; it ticks at least every {_span(period)}): "
                   "the statuses below are as it left them, and no slot is being claimed")
    return {"late": late, "last_tick_at": at, "period_seconds": period, "late_after": late_after, "message": message}


def _read(raw: Any) -> tuple[datetime, int] | None:
    if not raw:
        return None
    try:
        document = json.loads(raw)
        at = datetime.fromisoformat(str(document["at"]))
        period = int(document["period_seconds"])
    except (ValueError, TypeError, KeyError):
        return None
    if period <= 0:
        return None
    return (at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)), period


def _span(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} days"
