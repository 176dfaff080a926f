"""Pause and resume a job (issue 27): `sql-agent pause JOB [--until TIME]` and `resume JOB`.

The pause is a row of agent.job_pauses, state of its own that the settings sync never touches;
the tick reads it (select_due_jobs) and records each slot that comes while the job is paused as
a run skipped "paused" (shared/scheduler.py, _plan_paused_slots). agent.pause_job and
agent.resume_job (migration 0009) do the same from T-SQL. Every time is the database's clock
(the caller passes the agent's clock, which is it). Starting a paused job by hand (run-now,
agent.start_job) is allowed, as SQL Server Agent starts a disabled job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .errors import NotFoundError, UsageError

# agent.job_pauses.reason, agent.job_pauses.paused_by: their column sizes.
MAX_REASON_LENGTH = 400
MAX_PAUSED_BY_LENGTH = 256


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

    def as_dict(self) -> dict[str, Any]:
        return {"job_name": self.job_name, "paused": False, "paused_at": self.paused_at,
                "resumed_at": self.resumed_at}


def pause_job(store, name: str, *, now: datetime, until: datetime | None = None, paused_by: str | None = None,
              reason: str | None = None, telemetry: Any = None) -> Pause:
    """Pause ``name`` from ``now`` until ``until`` (None: until resumed). Pausing a paused job
    keeps its start and takes the new end and reason. The slots it had claimed inside the pause
    are recorded skipped "paused" in the same transaction, under the pauses lock a tick's claim
    holds shared: once this returns, no slot inside the pause is claimed."""
    if until is not None and until <= now:
        raise UsageError(f"--until {until.isoformat()}: expected a time after now (the database's clock: "
                         f"{now.isoformat()})", setting="--until", value=until.isoformat(),
                         expected=f"a time after {now.isoformat()} (the database's clock)")
    if reason is not None and len(reason) > MAX_REASON_LENGTH:
        raise UsageError(f"--reason: {len(reason)} characters; expected at most {MAX_REASON_LENGTH}",
                         setting="--reason", value=reason[:80], expected=f"at most {MAX_REASON_LENGTH} characters")
    paused_by = paused_by[:MAX_PAUSED_BY_LENGTH] if paused_by else None
    with store.transaction():
        store.execute("lock_job_pauses")
        row = store.execute("pause_job", job_name=name, now=now, paused_until=until, paused_by=paused_by,
                            reason=reason).one()
        if row is None:
            raise _unknown_job(store, name)
        skipped = store.execute("skip_paused_slots", job_name=name, now=now, paused_until=until).rows
        pause = Pause(job_name=name, paused_at=row["paused_at"], paused_until=row["paused_until"],
                      paused_by=row["paused_by"], reason=row["reason"], runs_skipped=len(skipped))
        store.execute("insert_job_events", now=now, events=[{
            "job_name": name, "kind": "paused",
            "detail": (f"paused by {paused_by or '?'} (sql-agent pause) "
                       f"{'until ' + _iso(until) if until else 'until resumed'}"
                       f"{': ' + reason if reason else ''}; {len(skipped)} claimed slot(s) skipped")}])
    if telemetry is not None:
        telemetry.event("JobPaused", {"job": name, "outcome": "paused", "paused_until": pause.paused_until,
                                      "paused_by": pause.paused_by, "reason": pause.reason,
                                      "runs_skipped": pause.runs_skipped})
    return pause


def resume_job(store, name: str, *, now: datetime, resumed_by: str | None = None, telemetry: Any = None) -> Resume:
    """End the pause of ``name`` now. The slots it missed are the misfire policy's: under
    run-once the latest one (held back, unrecorded) is caught up once within GRACE_SECONDS by
    the next tick; under skip none runs. A job that is not paused is an error (exit code 2)."""
    with store.transaction():
        store.execute("lock_job_pauses")
        row = store.execute("resume_job", job_name=name, now=now).one()
        if row is None or not row["in_force"]:
            if store.execute("get_job", job_name=name).one() is None:
                raise _unknown_job(store, name)
            ended = f" (its pause ended by itself at {_iso(row['paused_until'])})" if row is not None else ""
            raise UsageError(f"job {name!r} is not paused{ended}", setting="JOB", value=name,
                             expected="a paused job (sql-agent jobs shows them)")
        store.execute("insert_job_events", now=now, events=[{
            "job_name": name, "kind": "resumed",
            "detail": f"resumed by {resumed_by or '?'} (sql-agent resume); paused since {_iso(row['paused_at'])}"}])
    if telemetry is not None:
        telemetry.event("JobResumed", {"job": name, "outcome": "resumed", "paused_by": resumed_by})
    return Resume(job_name=name, paused_at=row["paused_at"], resumed_at=now)


def pause_in_force(row: dict[str, Any], now: datetime) -> bool:
    """Whether a list_jobs / get_job row's pause (paused_at, paused_until) holds at ``now``."""
    if row.get("paused_at") is None:
        return False
    until = row.get("paused_until")
    return until is None or until > now


def _unknown_job(store, name: str) -> NotFoundError:
    jobs = [r["job_name"] for r in store.execute("list_jobs").rows if r["configured"]]
    known = ", ".join(jobs) or "none"
    return NotFoundError(f"no job named {name!r} (jobs the agent knows: {known}; a job added to the settings is "
                         "known after the agent's next tick)", setting="JOB", value=name,
                         expected=f"one of the jobs the agent knows: {known}")


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)
