"""Quiet ticks (issue 31): a timer tick that does not connect to the control database while
nothing in it can come due, so that a serverless database can pause (docs/cost.md).

The last tick that connected asks the database, in one statement (``quiet_horizon``), for the
earliest time anything there can come due — a job's next slot (calendars and jitter only ever
move a slot later, so the stored next slot is never too late), a pending run (a retry, a run held
or delayed), a lease in flight (its expiry), a pause's end, a notification's next delivery, an alert a job asks for (shared/engine/alerts.py:
next_alert_moment, one more statement only when a job has alert limits), a condition alert's next
probe (shared/engine/condition_alerts.py; in the same statement) — and
records the *wake time*: that moment less one claim span (the next tick plus
AGENT_LOOKAHEAD_MARGIN_SECONDS, so the tick that claims and dispatches it still connects) and
one more tick period of slack, bounded by now + AGENT_QUIET_MAX_MINUTES. A later tick reads the
record without the database and connects when any of these holds:

* the record is missing, unreadable, of another version, or not what this code writes;
* it was written for other settings (the jobs' config hash, AGENT_QUIET_MAX_MINUTES, the tick
  schedule) or another deployment (the code's own files changed);
* it was invalidated (run-now, submit, or any command that changes work from the CLI);
* the instance's clock is at or past the wake time, or before the time the record was written
  (a clock that jumped back, or a record dated in the future), less the allowed skew;
* the wake time lies further from the time it was written than AGENT_QUIET_MAX_MINUTES (a
  record that would sleep longer than the maximum is not trusted).

So a record can delay a connection by at most AGENT_QUIET_MAX_MINUTES, whatever it says or
whichever clock jumps. Work the agent cannot see without connecting (agent.exec_async and the
other T-SQL procedures, a job defined from T-SQL, a run inserted by another process) waits at
most that long for the tick that finds it. Several instances: each reads the same record and
every connected tick rewrites it from the database's state; a write that races an invalidation
can hide that invalidation until the wake time, which is bounded the same way, and the CLI's
run-now and submit dispatch their run at once anyway (the tick is the safety net).

Where the record lives: beside the embedded database for SQLite (``agent.db.quiet.json``), and
in Azure as the metadata of a queue of the app's own storage account (``<AGENT_QUEUE_NAME>-quiet``,
through the queue SDK the app already uses); a PostgreSQL or SQL Server control database without
a storage account keeps it in the working directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from shared.control.sqlerrors import describe
from shared.engine.alerts import has_alerts, next_alert_moment
from shared.engine.dispatch import claim_horizon
from shared.jobs.schedules import CronSchedule
from shared.settings import Settings

log = logging.getLogger(__name__)
UTC = timezone.utc
RECORD_VERSION = 1
# What this code writes is a few hundred characters; anything much longer is not read.
MAX_RECORD_CHARS = 4096
QUIET_SUFFIX = "-quiet"    # AGENT_QUEUE_NAME is at most 56 characters: 62, within a queue name's 63
# Files whose change is a new deployment: the code the timer runs (stat only: no read at cold start).
_DEPLOYMENT_FILES = ("function_app.py", "shared/__init__.py", "shared/engine/quiet.py", "requirements.txt")
_ROOT = Path(__file__).resolve().parents[2]


def enabled(settings: Settings) -> bool:
    return settings.agent.quiet_max_minutes > 0


def deployment_marker() -> str:
    """What changes with a new deployment of the app: the size and modification time of its
    own files (a deployment writes them anew), and WEBSITE_DEPLOYMENT_ID where the host sets one."""
    parts = [os.environ.get("WEBSITE_DEPLOYMENT_ID", "")]
    for name in _DEPLOYMENT_FILES:
        try:
            stat = (_ROOT / name).stat()
            parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
        except OSError:
            parts.append(f"{name}:-")
    return "|".join(parts)


def fingerprint(settings: Settings) -> str:
    agent = settings.agent
    text = "\n".join([settings.config_hash, str(agent.quiet_max_minutes), agent.tick_schedule,
                      str(agent.lookahead_margin_seconds), agent.db, str(agent.sql_server), str(agent.sql_database),
                      deployment_marker()])
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Decision:
    connect: bool
    reason: str
    wake_at: datetime | None = None


# ------------------------------------------------------------------ where the record lives


class RecordStore(Protocol):
    def read(self) -> str | None: ...
    def write(self, text: str) -> None: ...


class FileRecord:
    """A file beside the embedded database (written whole, then renamed into place)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, self.path)


class QueueMetadataRecord:
    """The metadata of a queue of the app's own storage account: read and written with the
    queue SDK (get_queue_properties / set_queue_metadata), no database, no extra dependency."""

    KEY = "quiethorizon"

    def __init__(self, settings: Settings) -> None:
        from shared.messaging.azure_storage import AzureStorageQueue

        agent = settings.agent
        queue = AzureStorageQueue.from_settings(agent.storage_connection, agent.storage_queue_service_uri,
                                                agent.storage_client_id, agent.queue_name, agent.queue_encoding)
        self.client = queue._queue_client(f"{agent.queue_name}{QUIET_SUFFIX}")

    def read(self) -> str | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            metadata = self.client.get_queue_properties().metadata or {}
        except ResourceNotFoundError:
            return None
        return metadata.get(self.KEY)

    def write(self, text: str) -> None:
        from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

        try:
            self.client.set_queue_metadata(metadata={self.KEY: text})
        except ResourceNotFoundError:
            try:
                self.client.create_queue(metadata={self.KEY: text})
            except ResourceExistsError:
                self.client.set_queue_metadata(metadata={self.KEY: text})


def record_store(settings: Settings) -> RecordStore:
    agent = settings.agent
    if agent.uses_azure_queue:
        return QueueMetadataRecord(settings)
    if agent.db.startswith("sqlite:///") and not agent.sql_server:
        return FileRecord(Path(agent.db[len("sqlite:///"):] + ".quiet.json"))
    return FileRecord(Path("agent.quiet.json"))


# ------------------------------------------------------------------ deciding without the database


def decide(settings: Settings, text: str | None, now: datetime) -> Decision:
    """Whether a tick at the instance's ``now`` connects, from the record's ``text`` alone."""
    if not enabled(settings):
        return Decision(True, "quiet ticks are off (AGENT_QUIET_MAX_MINUTES=0)")
    if text is None:
        return Decision(True, "no horizon recorded")
    if len(text) > MAX_RECORD_CHARS:
        return Decision(True, "horizon record too long to be one this code wrote")
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or record.get("version") != RECORD_VERSION:
            return Decision(True, "horizon record of another version")
        if record.get("invalidated"):
            return Decision(True, f"horizon invalidated ({str(record.get('invalidated'))[:100]})")
        wake_at = _time(record["wake_at"])
        written_at = _time(record["written_at"])
        recorded_fingerprint = record["fingerprint"]
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        return Decision(True, f"horizon record unreadable ({exc.__class__.__name__})")
    if recorded_fingerprint != fingerprint(settings):
        return Decision(True, "settings or deployment changed since the horizon was recorded")
    maximum = timedelta(minutes=settings.agent.quiet_max_minutes)
    skew = timedelta(seconds=settings.agent.max_clock_skew_seconds)
    if wake_at - written_at > maximum or wake_at < written_at:
        return Decision(True, "horizon record beyond AGENT_QUIET_MAX_MINUTES: not trusted")
    if now < written_at - skew:
        return Decision(True, "the instance's clock is before the recorded horizon was written (a clock jump or a future-dated record)")
    if now >= wake_at:
        return Decision(True, "horizon reached", wake_at)
    return Decision(False, f"quiet until {wake_at.isoformat()}", wake_at)


def _time(value: Any) -> datetime:
    moment = datetime.fromisoformat(str(value))
    if moment.tzinfo is None:
        raise ValueError("a time without its offset")
    return moment.astimezone(UTC)


def should_connect(settings: Settings, now: datetime | None = None,
                   store: RecordStore | None = None) -> Decision:
    """The timer's question, asked before anything connects. Any failure to read: connect."""
    if not enabled(settings):
        return Decision(True, "quiet ticks are off (AGENT_QUIET_MAX_MINUTES=0)")
    now = now or datetime.now(UTC)
    try:
        text = (store or record_store(settings)).read()
    except Exception as exc:  # noqa: BLE001 - storage away or refusing: the database decides
        return Decision(True, f"horizon record unreadable ({describe(exc)})")
    return decide(settings, text, now)


# ------------------------------------------------------------------ recording after a connected tick


def horizon(store: Any, settings: Settings, now: datetime) -> tuple[datetime, str]:
    """The wake time after a tick at ``now`` (the database's clock) and what decided it: one
    statement on the tick's own connection."""
    row = store.execute("quiet_horizon", now=now).one() or {}
    maximum = now + timedelta(minutes=settings.agent.quiet_max_minutes)
    if int(row.get("waiting") or 0) or int(row.get("unleased") or 0):
        return now, "a fleet run waits for its targets, or a run in flight holds no lease"
    candidates = [(maximum, "AGENT_QUIET_MAX_MINUTES")]
    if has_alerts(settings):
        # A job's alert limits (issue 32): a running run reaching MAX_DURATION_SECONDS or
        # STOP_AFTER_SECONDS, a slot reaching its DEADLINE_SECONDS (also one whose run failed or
        # was skipped: nothing else wakes for it). SLOWER_THAN watches running runs, whose leases
        # (next_lease_at) already wake the ticks. One more statement, only with alerts configured.
        row = {**row, "next_alert_at": next_alert_moment(store, now)}
    # next_condition_alert_at: a condition alert's probe next due, an alert defined with
    # agent.add_alert not yet checked, or a failure an ERRORS alert has not looked at (now).
    for name in ("next_slot_at", "next_runnable_at", "next_lease_at", "next_pause_end_at", "next_notification_at",
                 "next_alert_at", "next_condition_alert_at"):
        value = row.get(name)
        if isinstance(value, str):
            value = _time(value if "+" in value[10:] or value.endswith("Z") else value + "+00:00")
        if isinstance(value, datetime):
            candidates.append((value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC), name))
    earliest, why = min(candidates, key=lambda item: item[0])
    if why == "AGENT_QUIET_MAX_MINUTES":
        return earliest, why
    # The tick that claims and dispatches it must still connect: one claim span before it (the
    # next tick plus the margin), and one tick period more in case a timer firing is late or lost.
    span = claim_horizon(settings, now) - now
    period = _tick_period(settings, now)
    return max(now, earliest - span - period), why


def _tick_period(settings: Settings, now: datetime) -> timedelta:
    schedule = CronSchedule(settings.agent.tick_schedule, "UTC")
    first = schedule.next_after(now) or now
    second = schedule.next_after(first) or first
    return second - first


def record(settings: Settings, wake_at: datetime, written_at: datetime, why: str,
           store: RecordStore | None = None) -> None:
    text = json.dumps({"version": RECORD_VERSION, "wake_at": wake_at.astimezone(UTC).isoformat(),
                       "written_at": written_at.astimezone(UTC).isoformat(), "because": why,
                       "fingerprint": fingerprint(settings)})
    (store or record_store(settings)).write(text)


def invalidate(settings: Settings, reason: str, store: RecordStore | None = None) -> bool:
    """The next tick connects (run-now, submit, a change made from the CLI). Never raises: a
    record that cannot be reached delays the safety net by at most AGENT_QUIET_MAX_MINUTES.
    Returns whether the record was reached."""
    if not enabled(settings):
        return True
    try:
        (store or record_store(settings)).write(json.dumps({"version": RECORD_VERSION, "invalidated": reason}))
        return True
    except Exception as exc:  # noqa: BLE001
        log.warning("quiet ticks: could not invalidate the horizon record (%s); the next connected tick "
                    "comes within AGENT_QUIET_MAX_MINUTES=%d", describe(exc), settings.agent.quiet_max_minutes)
        return False


def after_tick(agent: Any, report: Any, store: RecordStore | None = None,
               instance_now: datetime | None = None) -> Decision | None:
    """After a connected tick: record the next wake time (not after a refused tick or one with
    errors: the next tick connects again). Failures are logged, never raised.

    The horizon is computed on the database's clock (the agent's one clock) and recorded on the
    instance's (``instance_now``: its clock when the tick began, which is what the next timer
    compares with), so an instance clock off by up to the allowed skew wakes neither late nor
    early by that much."""
    settings = agent.settings
    if not enabled(settings):
        return None
    target = store or record_store(settings)
    try:
        if report.refused or report.errors:
            invalidate(settings, "the last tick did not finish cleanly", target)
            return None
        database_now = report.reference or report.now
        wake_at, why = horizon(agent.store(), settings, database_now)
        offset = (instance_now - database_now) if instance_now is not None else timedelta(0)
        if abs(offset) > timedelta(seconds=settings.agent.max_clock_skew_seconds):
            invalidate(settings, "the instance's clock is further from the database's than the allowed skew", target)
            return None
        record(settings, wake_at + offset, database_now + offset, why, target)
        return Decision(False, why, wake_at)
    except Exception as exc:  # noqa: BLE001 - the next tick simply connects
        log.warning("quiet ticks: could not record the horizon (%s); the next tick connects", describe(exc))
        return None


def timer_tick(agent: Any, now: datetime | None = None, store: RecordStore | None = None) -> tuple[Decision, Any]:
    """What the timer does: decide without the database, then (when it must) tick and record the
    next wake time. Returns the decision and the tick's report (None: the tick stayed quiet).
    ``now`` is a test's simulated time (the agent's simulated_time), the instance's clock otherwise."""
    instance_now = now or datetime.now(UTC)
    decision = should_connect(agent.settings, instance_now, store)
    if not decision.connect:
        return decision, None
    report = agent.tick(now)
    after_tick(agent, report, store, instance_now)
    return decision, report
