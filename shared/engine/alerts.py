"""Alerts the agent raises itself (issue 32 items 1 and 2), decided by the tick.

A job may ask for (shared/jobs/from_settings.py, docs/configuration.md):

* ``MAX_DURATION_SECONDS``: a run still running that long after its attempt started is notified
  once (kind ``duration``);
* ``STOP_AFTER_SECONDS``: such a run is stopped, as ``stop JOB`` stops it (cancelled, the token
  bump fences its worker), and notified once (kind ``stopped``);
* ``SLOWER_THAN``: a run (running, or ended within the last ``LOOKBACK_SECONDS``) that took more
  than this multiple of the p95 of its job's last ``HISTORY_RUNS`` successful runs is notified
  once (kind ``slower``); the p95 is the nearest rank, and only once the job has
  ``MIN_HISTORY_RUNS`` successful runs;
* ``DEADLINE_SECONDS``: a scheduled slot with no success within that long of it (its run failed
  for good, was poisoned or stopped, is still running, never started, or the slot was skipped —
  not one a pause or a calendar held) is notified once per slot (kind ``deadline``).

Each alert is a row of the notification outbox keyed by (run, kind) — a slot is one run, the
unique (job, slot) — so ticks racing each other write it once; the Notifier delivers it as any
outcome (docs/schemas/notification.schema.json, with ``kind`` and ``alert``), and the tick tells
telemetry (``AlertRaised``) of the rows it wrote itself, so an event is told once as well. With no
webhook the row is recorded ``unsent`` (never claimed): the alert is still raised once.

The tick's step is three statements whatever the number of jobs (stop, the fleets the stop
moved, the alerts), in one transaction. ``next_alert_moment`` is the one place that says when the
next alert may come due, for a tick that sleeps until something is due.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from shared.control.store import Store

log = logging.getLogger(__name__)
UTC = timezone.utc

# The p95 of SLOWER_THAN: over the job's last 20 successful runs (nearest rank: the 19th
# shortest; with fewer, the rank ceil(0.95 n), i.e. the longest below 20), from 5 on (fewer say
# little). Only runs that ended before the lookback window (so the run judged is never its own
# yardstick) and were not told slower themselves (an outlier already told does not raise the bar).
HISTORY_RUNS = 20
MIN_HISTORY_RUNS = 5
# How far back a tick looks for what ended (a stopped run, a slow run that finished) or whose
# deadline passed since the last tick: an hour covers ticks that were missed or slept; what is
# older than that when a tick first sees it is not alerted (the KQL rule in infra/alerts.bicep
# stays the dead man's switch for an agent that stopped ticking).
LOOKBACK_SECONDS = 3600

# A run that ended (stopped, or slow) is found by its slot within this much before the lookback
# (the runs table's (job, slot) index; longer than the longest limit, a week): a tick never scans
# a job's whole history.
OLDEST_SLOT = timedelta(days=8)

ALERT_KINDS = ("duration", "stopped", "slower", "deadline")
ALERT_SETTINGS = ("max_duration_seconds", "stop_after_seconds", "slower_than", "deadline_seconds")


def alert_columns(job: Any) -> dict[str, Any]:
    """The alert limits of a settings job as agent.jobs columns, only those set: a job without
    alerts syncs the row it synced before (its definition hash does not move on upgrade)."""
    return {name: getattr(job, name) for name in ALERT_SETTINGS if getattr(job, name, None) is not None}


def has_alerts(settings: Any) -> bool:
    return any(getattr(job, name, None) is not None for job in settings.jobs for name in ALERT_SETTINGS)


def raise_alerts(store: Store, now: datetime, default_url: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """In one transaction: stop the runs past their STOP_AFTER_SECONDS (and move on the fleets
    the stop ended, as `stop` does), then write every alert due at ``now`` that was not written
    before. Returns (runs stopped, alerts written by this call)."""
    with store.transaction():
        stopped = store.execute("stop_overdue_runs", now=now).rows
        if stopped:
            store.execute("progress_fleets", parent_run_id=None, run_id=None, token=None, now=now)
        since = now - timedelta(seconds=LOOKBACK_SECONDS)
        raised = store.execute("raise_alerts", now=now, since=since, oldest_slot=since - OLDEST_SLOT,
                               default_url=default_url, history=HISTORY_RUNS, min_history=MIN_HISTORY_RUNS).rows
    return stopped, raised


def next_alert_moment(store: Store, now: datetime) -> datetime | None:
    """The earliest moment after ``now`` when a tick may find an alert due (a running run reaching
    MAX_DURATION_SECONDS or STOP_AFTER_SECONDS, a slot reaching its DEADLINE_SECONDS), or None.
    One statement. A tick that sleeps until something is due (quiet ticks) wakes by then.
    SLOWER_THAN has no fixed moment (the p95 moves): while a run of a job with SLOWER_THAN is
    running, such a tick should not sleep past its period (see docs/configuration.md)."""
    value = store.execute("next_alert_moment", now=now).scalar()
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def alert_limits_text(row: dict[str, Any]) -> str:
    """The job's alert limits (shared/engine/alerts.py) in a few words, "-" when it asks for none."""
    words = []
    if row.get("max_duration_seconds"):
        words.append(f"max {row['max_duration_seconds']} s")
    if row.get("stop_after_seconds"):
        words.append(f"stop {row['stop_after_seconds']} s")
    if row.get("slower_than"):
        words.append(f"slower {row['slower_than']:g}x p95")
    if row.get("deadline_seconds"):
        words.append(f"deadline {row['deadline_seconds']} s")
    return ", ".join(words) or "-"
