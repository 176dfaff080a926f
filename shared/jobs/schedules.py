"""Schedules: six-field NCRONTAB (seconds first) in an IANA time zone, or one-time.

Slots are computed in the job's wall-clock time and converted to UTC, so a job at 02:00
Europe/Paris stays at 02:00 local across daylight-saving changes. Around the changes we
follow cron's rule (cronie, Vixie cron):

* spring forward — a wall-clock slot that does not exist (02:30 when clocks jump from
  02:00 to 03:00) runs at the same offset after the jump (03:30), once;
* fall back — a slot in the repeated hour runs once (the first time) when the schedule
  names its hours; when the hour field is a wildcard (``*`` or ``*/n``) the job runs
  in both passes, because it is an interval job and the second hour is real time.

All datetimes crossing this module's boundary are timezone-aware UTC.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = timezone.utc
ONCE_PREFIX = "@once"
# Daylight-saving shifts are at most two hours anywhere; three covers every zone.
_DST_WINDOW = timedelta(hours=3)


def validate_timezone(name: str) -> ZoneInfo:
    return _zone(name)


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    if not name or name != name.strip() or ".." in name or name.startswith("/"):
        raise ValueError(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}") from None


def _croniter():
    """croniter's class, imported at first use (cold start of the function app stays light).

    croniter (5.x-7.x) asks ``platform.architecture()`` at import, which runs the ``file``
    command on the interpreter: a process spawned, with the whole environment (every JOB__
    setting) copied, on every cold start (70-140 ms measured with 10,000 jobs). The answer for
    the running interpreter is its pointer size, so it is given directly while croniter loads."""
    module = sys.modules.get("croniter")
    if module is None:
        # only while croniter loads (see the docstring)
        import platform

        # only while croniter loads (see the docstring)
        import struct

        asked = platform.architecture
        bits = f"{struct.calcsize('P') * 8}bit"
        platform.architecture = lambda *args, **kwargs: (bits, "")
        try:
            # croniter loads on the first schedule that needs it (cold start; see the docstring)
            import croniter as module
        finally:
            platform.architecture = asked
    return module.croniter


def parse_ncrontab(expression: str) -> str:
    """Validate a six-field NCRONTAB expression; returns it normalised (single spaces)."""
    croniter = _croniter()

    fields = expression.split()
    if len(fields) != 6:
        raise ValueError(
            f"{len(fields)} fields given; NCRONTAB has six: second minute hour day month day-of-week")
    for field in fields:
        # croniter extensions NCRONTAB does not have (H hashing, L, W, #, ?) are refused.
        if not re.fullmatch(r"[0-9A-Za-z,\-*/]+", field) or re.search(r"(?<![A-Za-z])[HLW](?![A-Za-z])", field):
            raise ValueError(f"field {field!r} is not NCRONTAB syntax")
    normalised = " ".join(fields)
    if not croniter.is_valid(normalised, second_at_beginning=True):
        raise ValueError("a field is out of range or not understood")
    return normalised


def utc(value: datetime) -> datetime:
    """An aware UTC datetime (naive input is taken as UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


# (expression, time zone) -> (asked from, next slot): see CronSchedule.next_after. A plain dict:
# a lost update between threads only costs one more croniter walk.
_NEXT_SLOT_CACHE: dict[tuple[str, str], tuple[datetime, datetime]] = {}
_NEXT_SLOT_CACHE_SIZE = 4096


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    timezone: str = "UTC"

    @property
    def is_once(self) -> bool:
        return False

    def initial_due(self, now: datetime) -> datetime | None:
        """The first slot a newly configured job waits for: the next one after now."""
        return self.next_after(now)

    def next_after(self, after: datetime) -> datetime | None:
        """The first slot strictly after ``after`` (UTC in, UTC out).

        Shared by validation and planning through one cache keyed by (expression, time zone):
        each entry is the last answer and the instant it was asked from; any ``after`` in
        [asked from, answer) has the same answer (no slot lies between), so ten thousand jobs on
        a handful of schedules cost a handful of croniter walks per process, not one per job."""
        after = utc(after)
        key = (self.expression, self.timezone)
        known = _NEXT_SLOT_CACHE.get(key)
        if known is not None and known[0] <= after < known[1]:
            return known[1]
        found = self._walk_next_after(after)
        if found is not None:
            if len(_NEXT_SLOT_CACHE) >= _NEXT_SLOT_CACHE_SIZE:
                _NEXT_SLOT_CACHE.clear()  # many distinct schedules: start over rather than grow
            _NEXT_SLOT_CACHE[key] = (after, found)
        return found

    def _walk_next_after(self, after: datetime) -> datetime | None:
        croniter = _croniter()

        zone = _zone(self.timezone)
        both_folds = self._hour_is_wildcard()
        shift_near_after = _offset_shift(zone, after)
        start_wall = after.astimezone(zone).replace(tzinfo=None) - shift_near_after
        iterator = croniter(self.expression, start_wall, second_at_beginning=True)
        best: datetime | None = None
        stop_wall: datetime | None = None
        for _ in range(100_000):
            wall = iterator.get_next(datetime)
            if stop_wall is not None and wall > stop_wall:
                break
            for candidate in _instants(wall, zone, both_folds):
                if candidate > after and (best is None or candidate < best):
                    best = candidate
                    # A later wall-clock slot can only map to an earlier instant across a
                    # daylight-saving change; look that far past the best one, no further.
                    stop_wall = wall + _offset_shift(zone, candidate)
        return best

    def _hour_is_wildcard(self) -> bool:
        hour = self.expression.split()[2]
        return hour == "*" or hour.startswith("*/")


@dataclass(frozen=True)
class OnceSchedule:
    at: datetime  # aware UTC
    timezone: str = "UTC"

    @property
    def is_once(self) -> bool:
        return True

    def initial_due(self, now: datetime) -> datetime | None:
        # Even when already past: the misfire policy decides whether it still runs.
        return self.at

    def next_after(self, after: datetime) -> datetime | None:
        return self.at if self.at > utc(after) else None


@dataclass(frozen=True)
class OnDemandSchedule:
    """No schedule (an empty SCHEDULE): the job runs only when started (run-now,
    agent.start_job); it never has a slot."""

    timezone: str = "UTC"

    @property
    def is_once(self) -> bool:
        return False

    @property
    def is_on_demand(self) -> bool:
        return True

    def initial_due(self, now: datetime) -> datetime | None:
        return None

    def next_after(self, after: datetime) -> datetime | None:
        return None


Schedule = CronSchedule | OnceSchedule | OnDemandSchedule


@lru_cache(maxsize=4096)
def parse_schedule(text: str, timezone_name: str = "UTC") -> Schedule:
    """``@once <ISO-8601>`` (in the job's time zone unless it carries an offset), NCRONTAB, or
    nothing (empty: an on-demand job)."""
    zone = _zone(timezone_name)
    stripped = (text or "").strip()
    if not stripped:
        return OnDemandSchedule(timezone=timezone_name)
    if stripped.lower().startswith(ONCE_PREFIX):
        moment = stripped[len(ONCE_PREFIX):].strip()
        if not moment:
            raise ValueError("'@once' needs an ISO-8601 date and time, e.g. '@once 2026-12-31T23:00:00'")
        try:
            parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{moment!r} is not an ISO-8601 date and time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=zone)
        return OnceSchedule(at=parsed.astimezone(UTC), timezone=timezone_name)
    return CronSchedule(expression=parse_ncrontab(stripped), timezone=timezone_name)


def _instants(wall: datetime, zone: ZoneInfo, both_folds: bool) -> list[datetime]:
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if not both_folds:
        return [first]
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    # A nonexistent wall time maps to two different instants too; only an ambiguous
    # (repeated) one is a real second pass: it reads back as the same wall time.
    if second != first and second.astimezone(zone).replace(tzinfo=None) == wall:
        return [first, second]
    return [first]


def _offset_shift(zone: ZoneInfo, moment: datetime) -> timedelta:
    """How far the UTC offset changes within three hours either side of ``moment``."""
    before = (moment - _DST_WINDOW).astimezone(zone).utcoffset()
    after = (moment + _DST_WINDOW).astimezone(zone).utcoffset()
    if before is None or after is None:
        return timedelta(0)
    return abs(after - before)
