"""Dispatch in queue mode: what may run gets a message, now or delayed until its slot.

``dispatch`` is called by the tick, by a worker the moment a run ends or frees a place (the
hand-on), by a doorbell and by the operator commands. Under the start lock, one batch skips the
slots that may not run (overlap skip, misfire), marks queued every due run that may start
(task order, overlap 'queue', the cap counting runs executing or due on the queue) and every
run due within the lookahead (it holds no place), each with a new token; then the messages go
out, a future one invisible until its slot. A message that cannot be sent puts its run back to
pending; if even that fails, the dispatch lease expires and a later dispatch sends it again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from shared.control.sqlerrors import describe
from shared.control.store import Store
from shared.errors import PartialDispatchError, QueueError
from shared.jobs.schedules import CronSchedule
from shared.messaging.messages import DoorbellMessage, RunMessage
from shared.settings import Settings

log = logging.getLogger(__name__)
UTC = timezone.utc
# Messages for future slots sent by one dispatch; the rest go with the next one (a doorbell,
# a completion or the tick), and a run due before its message went out is dispatched as due.
MAX_AHEAD_MESSAGES = 1000
DOORBELL_STATE_KEY = "doorbell_chain"


@dataclass
class DispatchOutcome:
    queued: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)


def claim_horizon(settings: Settings, now: datetime) -> datetime:
    """The next tick after ``now`` plus AGENT_LOOKAHEAD_MARGIN_SECONDS: slots up to here are
    claimed (and, in queue mode, their messages sent delayed) by this tick."""
    following = CronSchedule(settings.agent.tick_schedule, "UTC").next_after(now) or now
    return following + timedelta(seconds=settings.agent.lookahead_margin_seconds)


def dispatch_params(settings: Settings, now: datetime) -> dict[str, Any]:
    agent = settings.agent
    return {"now": now, "late_cutoff": now - timedelta(seconds=agent.misfire_threshold_seconds),
            "max_concurrency": agent.max_concurrency, "lookahead_until": claim_horizon(settings, now),
            "ahead_limit": MAX_AHEAD_MESSAGES, "dispatch_lease_seconds": agent.dispatch_lease_seconds}


def dispatch(store: Store, queue: Any, settings: Settings, now: datetime, telemetry: Any) -> DispatchOutcome:
    rows = store.execute("dispatch_runs", **dispatch_params(settings, now)).rows
    return send_dispatched(rows, store, queue, now, telemetry)


def send_dispatched(rows: Sequence[dict[str, Any]], store: Store, queue: Any, now: datetime,
                    telemetry: Any) -> DispatchOutcome:
    """Send the messages of runs ``dispatch_runs`` marked queued (after its commit: a message
    must never name a token the database has not committed)."""
    outcome = DispatchOutcome(queued=[r for r in rows if r["decision"] == "queued"],
                              skipped=[r for r in rows if r["decision"] == "skipped"])
    for run in outcome.skipped:
        _skipped_event(telemetry, run)
    runs = sorted(outcome.queued, key=lambda r: (r["runnable_at"], r["run_id"]))
    if not runs:
        return outcome
    bodies = [RunMessage(run_id=r["run_id"], token=r["token"], operation_id=r["operation_id"]).to_json() for r in runs]
    delays = [delay_until(r["runnable_at"], now) for r in runs]
    try:
        queue.send_many(bodies, delays=delays)
    except QueueError as exc:
        sent = max(0, int(getattr(exc, "sent", 0) or 0))
        unsent = runs[sent:]
        try:
            store.execute("release_dispatch", runs=[{"run_id": r["run_id"], "token": r["token"]} for r in unsent])
        except Exception as release_error:  # the dispatch lease covers this case
            log.error("could not put back %d undispatched runs (their dispatch lease will): %s", len(unsent),
                      describe(release_error))
        for run in runs[:sent] if telemetry.enabled else ():
            _dispatched_event(telemetry, run)
        raise PartialDispatchError(f"{exc} ({len(unsent)} run(s) left pending for the next dispatch)",
                                   runs[:sent]) from exc
    for run in runs if telemetry.enabled else ():
        _dispatched_event(telemetry, run)
    outcome.queued = runs
    return outcome


def delay_until(moment: datetime, now: datetime) -> int:
    """Whole seconds until ``moment`` (rounded up: a message may arrive a little late, never
    early), 0 when it has come."""
    seconds = (moment - now).total_seconds()
    return max(0, math.ceil(seconds)) if seconds > 0 else 0


def ring_doorbells(store: Store, queue: Any, settings: Settings, now: datetime) -> int:
    """Leave a chain of delayed doorbells until the next tick, AGENT_POLL_SECONDS apart, so that
    runs inserted behind the agent's back start within that time. One chain per tick period,
    whatever the number of instances or double fires: the first tick of a period claims it."""
    agent = settings.agent
    following = CronSchedule(agent.tick_schedule, "UTC").next_after(now) or now
    period = int(following.timestamp())
    won = store.execute("claim_state", state_key=DOORBELL_STATE_KEY, state_value=f"{period:012d}", now=now).rows
    if not won:
        return 0
    span = (following - now).total_seconds()
    delays = [delay for delay in range(agent.poll_seconds, int(span), agent.poll_seconds)]
    if not delays:
        return 0
    body = DoorbellMessage(period=period).to_json()
    # A doorbell nobody took before the next tick is useless: it expires then.
    queue.send_many([body] * len(delays), delays=delays, time_to_live=int(span) + agent.poll_seconds)
    return len(delays)


def run_properties(run: dict[str, Any], **extra: Any) -> dict[str, Any]:
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


def _dispatched_event(telemetry: Any, run: dict[str, Any]) -> None:
    telemetry.event("RunDispatched", run_properties(run, outcome="queued"), operation_id=run.get("operation_id"))


def _skipped_event(telemetry: Any, run: dict[str, Any]) -> None:
    note = run.get("note") or ""
    log.info("run %s (%s) slot %s skipped: %s", run.get("run_id"), run.get("job_name"), run.get("scheduled_for"), note)
    if telemetry.enabled:
        name = "OverlapSkipped" if note.startswith("overlap") else "MisfireSkipped"
        telemetry.event(name, run_properties(run, outcome="skipped", error_message=note),
                        operation_id=run.get("operation_id"))
