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

import dataclasses
import hashlib
import re
import sys
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

UTC = timezone.utc
ONCE_PREFIX = "@once"
# Daylight-saving shifts are at most two hours anywhere; three covers every zone.
_DST_WINDOW = timedelta(hours=3)


# What a time zone setting or argument must be (every front end says so in its refusal).
TIMEZONE_EXPECTED = ("an IANA time zone name such as UTC or Europe/Paris (a canonical name of the IANA database; "
                     "not a host's own file such as localtime, posixrules, Factory, posix/... or right/...)")
# Names a host's time zone directory holds that are no zone of the IANA database, or mean
# something else on each host: 'localtime' (the host's own zone), 'posixrules' (the rules a
# POSIX TZ string borrows), 'Factory' (the '-00' placeholder), the 'posix/' copies and the
# 'right/' zones (leap seconds counted: every instant off by 27 s and more), SystemV/ of old hosts.
_HOST_NAMES = frozenset({"localtime", "posixrules", "Factory"})
_HOST_PREFIXES = ("posix/", "right/", "SystemV/")


def validate_timezone(name: str) -> ZoneInfo:
    """The zone of a canonical IANA name (ValueError for anything else): one of the names the
    pinned tzdata package lists (requirements.txt), the same on every host, less the host
    entries above; a name only this host's /usr/share/zoneinfo holds is refused."""
    return _zone(name)


@lru_cache(maxsize=1)
def iana_timezones() -> frozenset[str]:
    """The canonical IANA names: the pinned tzdata package's list (its 'zones' file), or, without
    that package, the host's (zoneinfo.available_timezones()); the host entries left out."""
    try:
        from importlib import resources

        names = frozenset(resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split())
    except (ImportError, OSError, ValueError):
        from zoneinfo import available_timezones

        names = frozenset(available_timezones())
    return frozenset(name for name in names if name not in _HOST_NAMES and not name.startswith(_HOST_PREFIXES))


@lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    if name in _HOST_NAMES or (isinstance(name, str) and name.startswith(_HOST_PREFIXES)):
        raise ValueError(f"time zone {name!r} is a file of the host's time zone directory, which means something "
                         f"else on each host (or counts leap seconds): expected {TIMEZONE_EXPECTED}")
    if not name or name not in iana_timezones():
        raise ValueError(f"unknown time zone {name!r}: expected {TIMEZONE_EXPECTED}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {name!r}: expected {TIMEZONE_EXPECTED}") from None


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
        try:
            found = self._walk_next_after(after)
        except OverflowError:   # the next slot would be past 9999-12-31: there is none
            found = None
        if found is not None:
            if len(_NEXT_SLOT_CACHE) >= _NEXT_SLOT_CACHE_SIZE:
                _NEXT_SLOT_CACHE.clear()  # many distinct schedules: start over rather than grow
            _NEXT_SLOT_CACHE[key] = (after, found)
        return found

    def _walk_next_after(self, after: datetime) -> datetime | None:
        zone = _zone(self.timezone)
        if is_extended(self.expression):
            return compile_rules(self.expression).next_after(after, zone)
        croniter = _croniter()
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

    @property
    def ends(self) -> date | None:
        """The last day of an extended schedule with ``until`` (its wall-clock date), else None."""
        return compile_rules(self.expression).end if is_extended(self.expression) else None

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


def is_one_time(text: str | None) -> bool:
    """Whether a schedule's text is a one-time schedule (``@once ...``), without parsing it."""
    return (text or "").strip().lower().startswith(ONCE_PREFIX)


@lru_cache(maxsize=4096)
def parse_schedule(text: str, timezone_name: str = "UTC") -> Schedule:
    """``@once <ISO-8601>`` (in the job's time zone unless it carries an offset), NCRONTAB, or
    nothing (empty: an on-demand job)."""
    _zone(timezone_name)        # an unknown zone is refused whatever the schedule
    stripped = (text or "").strip()
    if not stripped:
        return OnDemandSchedule(timezone=timezone_name)
    if is_one_time(stripped):
        moment = stripped[len(ONCE_PREFIX):].strip()
        if not moment:
            raise ValueError("'@once' needs an ISO-8601 date and time, e.g. '@once 2026-12-31T23:00:00'")
        try:
            parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{moment!r} is not an ISO-8601 date and time") from None
        at = local_instant(parsed, timezone_name) if parsed.tzinfo is None else parsed.astimezone(UTC)
        return OnceSchedule(at=at, timezone=timezone_name)
    if is_extended(stripped):
        return CronSchedule(expression=compile_rules(stripped).text, timezone=timezone_name)
    return CronSchedule(expression=parse_ncrontab(stripped), timezone=timezone_name)


def _shown(moment: datetime) -> str:
    return moment.isoformat(" ", "seconds")


def local_instant(wall: datetime, timezone_name: str) -> datetime:
    """The one UTC instant of a date and time on the clocks of ``timezone_name`` (a one-time job's
    moment typed without an offset). ValueError, naming the value and the zone, when there is not
    exactly one: a time of the hour the clocks go back over happens twice (both instants are
    named: give the offset of the one meant), a time the clocks jump over never happens."""
    zone = _zone(timezone_name)
    wall = wall.replace(tzinfo=None)
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return first.astimezone(UTC)
    first_utc, second_utc = first.astimezone(UTC), second.astimezone(UTC)
    if first_utc.astimezone(zone).replace(tzinfo=None) == wall:     # reads back: it happens twice
        one, other = sorted((first_utc, second_utc))
        raise _ambiguous(wall, timezone_name, one.astimezone(zone), other.astimezone(zone))
    # the clocks jump over it: the scheduler's rule would take it as far after the jump
    after = first_utc.astimezone(zone).replace(tzinfo=None)
    raise ValueError(f"{_shown(wall)} does not exist in {timezone_name}: the clocks jump forward over it that day; "
                     f"give a time that exists, e.g. {_shown(after)} (as far after the jump), or an offset")


def _ambiguous(wall: datetime, timezone_name: str, one: datetime, other: datetime) -> ValueError:
    return ValueError(f"{_shown(wall)} happens twice in {timezone_name} (the clocks go back over it): "
                     f"{_shown(one)} ({_shown(one.astimezone(UTC).replace(tzinfo=None))} UTC, the first time) or "
                     f"{_shown(other)} ({_shown(other.astimezone(UTC).replace(tzinfo=None))} UTC, the second); "
                     f"give the offset of the one meant, e.g. {_shown(one)}")


def pinned_once(text: str, timezone_name: str) -> str:
    """'@once <local time>' as a program writes it for a person's clock (import-sqlagent): itself
    when the time names one instant; else with the offset of the first time it happens (a time
    the clocks jump over: the offset before the jump, i.e. as far after it, the scheduler's rule),
    so the job it becomes is valid and runs when SQL Agent's would."""
    moment = datetime.fromisoformat(text[len(ONCE_PREFIX):].strip())
    if moment.tzinfo is not None:
        return text
    try:
        local_instant(moment, timezone_name)
        return text
    except ValueError:
        pass
    return f"{ONCE_PREFIX} {moment.replace(tzinfo=_zone(timezone_name), fold=0).isoformat()}"


def needs_offset(moment: datetime, timezone_name: str) -> bool:
    """Whether the wall-clock time of ``moment`` (aware) in the zone happens twice: shown without
    its offset it would name two instants."""
    zone = _zone(timezone_name)
    wall = moment.astimezone(zone).replace(tzinfo=None)
    return wall.replace(tzinfo=zone, fold=0).utcoffset() != wall.replace(tzinfo=zone, fold=1).utcoffset()


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
    try:
        before = (moment - _DST_WINDOW).astimezone(zone).utcoffset()
        after = (moment + _DST_WINDOW).astimezone(zone).utcoffset()
    except OverflowError:       # within three hours of year 1 or 9999: no daylight saving there
        return timedelta(0)
    if before is None or after is None:
        return timedelta(0)
    return abs(after - before)


# ---------------------------------------------------------------- the extended form
#
# NCRONTAB as croniter walks it has no "last day of the month", "the second weekday of the
# month", "every 3 weeks from a date" or an active window. The extended form adds them:
#
#   <six fields> [; <clause>]...
#
# * the day-of-month field also takes ``L`` (the last day), ``LW`` (the last weekday, Monday to
#   Friday) and ``nW`` (the weekday nearest day n, within its month: Quartz's convention);
# * the day-of-week field also takes ``d#n`` (the nth day d of the month, n 1-5), ``dL`` or
#   ``d#L`` (the last one), and the same with a range of days, ``a-b#n`` / ``a-b#L`` (the nth or
#   last day of the month whose day of the week is in a-b: MON-FRI#2 is the second weekday,
#   SAT-SUN#1 the first weekend day);
# * clauses, each a filter on the slots the six fields give: ``from YYYY-MM-DD`` and
#   ``until YYYY-MM-DD`` (the active dates, inclusive, in the job's time zone), ``between
#   HH:MM[:SS] and HH:MM[:SS]`` (the daily window, inclusive), ``every N days|weeks|months``
#   (counted from the first day on or after ``from`` that the fields select; weeks begin on
#   Sunday), ``every N seconds|minutes|hours`` (times of day counted from the window's start,
#   or midnight).
#
# croniter 7 has L, nW, d#n and its own ``Ld`` but not LW, ``dL``, a range before ``#`` or any
# clause, and a filter over its walk would step through every second of an "every 3 days" job;
# so this form is evaluated here, day by day, with the same daylight-saving rule as the
# plain form (see the module docstring). Plain six-field expressions keep croniter's walk.

_DOW_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MONTH_NAMES = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_EXTENDED_TOKEN = re.compile(r"[LW#]", re.IGNORECASE)
_PERIOD_LIMITS = {"days": 3660, "weeks": 520, "months": 120}
_STEP_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600}
_UNITS = {"day": "days", "days": "days", "week": "weeks", "weeks": "weeks", "month": "months", "months": "months",
          "second": "seconds", "seconds": "seconds", "minute": "minutes", "minutes": "minutes",
          "hour": "hours", "hours": "hours"}
# How far the day-by-day walk looks for a slot (a schedule with none within the horizon is refused
# at validation anyway; this bounds a walk that can find none).
_MAX_SCAN_DAYS = 366 * 60
_DAY = timedelta(days=1)


_NAMES = re.compile("|".join([*_DOW_NAMES, *_MONTH_NAMES]), re.IGNORECASE)


def _strip_names(text: str) -> str:
    """The text without day and month names (WED has a W, JUL an L: neither is an extension)."""
    return _NAMES.sub("", text)


def is_extended(text: str) -> bool:
    """Whether a schedule uses the extended form (a clause, or L, W or # in a field)."""
    return ";" in text or bool(_EXTENDED_TOKEN.search(_strip_names(" ".join(text.split()[:6]))))


def _digits(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes other scripts' digits and superscripts."""
    return bool(re.fullmatch(r"[0-9]+", text))


def _number(text: str, low: int, high: int, names: dict[str, int], what: str) -> int:
    value = names.get(text.lower()) if names else None
    if value is None:
        if not _digits(text):
            raise ValueError(f"{what} {text!r}: expected a number from {low} to {high}"
                             + (" or a name" if names else ""))
        value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{what} {text!r}: expected a number from {low} to {high}")
    return value


def _plain_values(item: str, low: int, high: int, names: dict[str, int], what: str) -> set[int]:
    """One item of a list: ``*``, ``n``, ``a-b``, each with an optional ``/step``."""
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not _digits(step_text) or int(step_text) < 1:
            raise ValueError(f"{what} {item!r}: expected a step of 1 or more after '/'")
        step = int(step_text)
    if base == "*":
        first, last = low, high
    elif "-" in base:
        start_text, _, end_text = base.partition("-")
        first = _number(start_text, low, high, names, what)
        last = _number(end_text, low, high, names, what)
        if first > last:
            raise ValueError(f"{what} {item!r}: expected a range from low to high")
    else:
        first = _number(base, low, high, names, what)
        last = high if slash else first
    return set(range(first, last + 1, step))


def _cron_weekday(day: date) -> int:
    return day.isoweekday() % 7    # 0 = Sunday, as cron counts


def _last_day(day: date) -> int:
    if day.month == 12:
        return 31
    return (date(day.year, day.month + 1, 1) - _DAY).day


def _nearest_weekday(day: date, target: int) -> int | None:
    """Quartz's nW: the weekday nearest day ``target`` of this month, never crossing into another
    month; None in a month without that day."""
    last = _last_day(day)
    if target > last:
        return None
    weekday = _cron_weekday(day.replace(day=target))
    if weekday == 6:       # Saturday: the Friday before, or the Monday after on the 1st
        return target - 1 if target > 1 else target + 2
    if weekday == 0:       # Sunday: the Monday after, or the Friday before on the last day
        return target + 1 if target < last else target - 2
    return target


@dataclass(frozen=True)
class _DayOfMonth:
    days: frozenset[int]
    last: bool = False             # L
    last_weekday: bool = False     # LW
    nearest: frozenset[int] = frozenset()   # nW

    def selects(self, day: date) -> bool:
        if day.day in self.days:
            return True
        if self.last or self.last_weekday:
            last = _last_day(day)
            if self.last and day.day == last:
                return True
            if self.last_weekday:
                final = day.replace(day=last)
                back = {6: 1, 0: 2}.get(_cron_weekday(final), 0)
                if day.day == last - back:
                    return True
        return any(_nearest_weekday(day, target) == day.day for target in self.nearest)


@dataclass(frozen=True)
class _DayOfWeek:
    weekdays: frozenset[int]
    # (days of the week, n): the nth day of the month among those days; n = -1 for the last
    ordinals: tuple[tuple[frozenset[int], int], ...] = ()

    def selects(self, day: date) -> bool:
        weekday = _cron_weekday(day)
        if weekday in self.weekdays:
            return True
        for kinds, n in self.ordinals:
            if weekday not in kinds:
                continue
            if n > 0:
                before = sum(1 for k in range(1, day.day) if _cron_weekday(day.replace(day=k)) in kinds)
                if before == n - 1:
                    return True
            elif not any(_cron_weekday(day.replace(day=k)) in kinds for k in range(day.day + 1, _last_day(day) + 1)):
                return True
        return False


def _parse_day_of_month(field: str) -> _DayOfMonth | None:
    if field == "*":
        return None
    days: set[int] = set()
    nearest: set[int] = set()
    last = last_weekday = False
    for item in field.split(","):
        upper = item.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif upper.endswith("W") and _digits(upper[:-1]):
            nearest.add(_number(upper[:-1], 1, 31, {}, "day-of-month"))
        elif "L" in upper or "W" in upper or "#" in upper:
            raise ValueError(f"day-of-month {item!r}: expected L, LW, nW (a day 1-31 then W), or days")
        else:
            days |= _plain_values(item, 1, 31, {}, "day-of-month")
    return _DayOfMonth(frozenset(days), last, last_weekday, frozenset(nearest))


def _weekday_set(text: str, item: str) -> frozenset[int]:
    if "-" in text:
        first_text, _, last_text = text.partition("-")
        first = _number(first_text, 0, 7, _DOW_NAMES, "day-of-week")
        last = _number(last_text, 0, 7, _DOW_NAMES, "day-of-week")
        if last == 0 and first > 0:
            last = 7        # FRI-SUN, SAT-SUN: Sunday is also 7
        if first > last:
            raise ValueError(f"day-of-week {item!r}: expected a range from low to high (SUN is 0 or 7)")
        return frozenset(k % 7 for k in range(first, last + 1))
    return frozenset({_number(text, 0, 7, _DOW_NAMES, "day-of-week") % 7})


def _parse_day_of_week(field: str) -> _DayOfWeek | None:
    if field == "*":
        return None
    weekdays: set[int] = set()
    ordinals: list[tuple[frozenset[int], int]] = []
    for item in field.split(","):
        upper = item.upper()
        if "#" in upper:
            kinds_text, _, which = upper.partition("#")
            if which == "L":
                n = -1
            elif which in ("1", "2", "3", "4", "5"):
                n = int(which)
            else:
                raise ValueError(f"day-of-week {item!r}: expected 1 to 5 or L after '#'")
            ordinals.append((_weekday_set(kinds_text, item), n))
        elif upper.endswith("L") and len(upper) > 1 and "-" not in upper:
            ordinals.append((_weekday_set(upper[:-1], item), -1))    # Quartz's 5L: the last Friday
        elif re.search("[LW]", _strip_names(upper)):
            raise ValueError(f"day-of-week {item!r}: expected days, d#n, dL or a-b#n")
        elif "/" in item or item == "*":
            weekdays |= {value % 7 for value in _plain_values(item, 0, 7, _DOW_NAMES, "day-of-week")}
        else:
            weekdays |= _weekday_set(upper, item)
    return _DayOfWeek(frozenset(weekdays), tuple(ordinals))


def _clock_seconds(text: str, clause: str) -> int:
    match = re.fullmatch(r"([0-9]{1,2}):([0-9]{2})(?::([0-9]{2}))?", text)
    if not match or int(match[1]) > 23 or int(match[2]) > 59 or int(match[3] or 0) > 59:
        raise ValueError(f"clause {clause!r}: {text!r} is not a time of day (HH:MM or HH:MM:SS, 00:00 to 23:59:59)")
    return int(match[1]) * 3600 + int(match[2]) * 60 + int(match[3] or 0)


def _clause_date(text: str, clause: str) -> date:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
        raise ValueError(f"clause {clause!r}: {text!r} is not a date (YYYY-MM-DD)")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"clause {clause!r}: {text!r} is not a date that exists") from None


@dataclass(frozen=True)
class ScheduleRules:
    """An extended schedule, compiled: which days (``selects``) and which times of day
    (``times``, seconds since midnight, ascending) it has, and its active dates."""

    text: str                        # normalised
    months: frozenset[int]
    day_of_month: _DayOfMonth | None
    day_of_week: _DayOfWeek | None
    times: tuple[int, ...]
    both_folds: bool                 # a repeated wall-clock hour runs in both passes
    start: date | None = None        # from
    end: date | None = None          # until
    period: tuple[str, int] | None = None   # ("days" | "weeks" | "months", N)
    anchor: date | None = None       # where the period counts from

    def fields_select(self, day: date) -> bool:
        """The six fields' verdict (cron's rule: when both day fields are restricted, either one)."""
        if day.month not in self.months:
            return False
        by_month, by_week = self.day_of_month, self.day_of_week
        if by_month is None and by_week is None:
            return True
        if by_month is None:
            return by_week.selects(day)  # type: ignore[union-attr]
        if by_week is None:
            return by_month.selects(day)
        return by_month.selects(day) or by_week.selects(day)

    def selects(self, day: date) -> bool:
        if (self.start is not None and day < self.start) or (self.end is not None and day > self.end):
            return False
        if not self.fields_select(day):
            return False
        if self.period is None or self.anchor is None:
            return True
        unit, every = self.period
        if unit == "days":
            return (day - self.anchor).days % every == 0
        if unit == "weeks":
            return ((_week_start(day) - _week_start(self.anchor)).days // 7) % every == 0
        return ((day.year * 12 + day.month) - (self.anchor.year * 12 + self.anchor.month)) % every == 0

    def next_after(self, after: datetime, zone: ZoneInfo) -> datetime | None:
        after_wall = after.astimezone(zone).replace(tzinfo=None)
        after_day = after_wall.date()
        after_second = after_wall.hour * 3600 + after_wall.minute * 60 + after_wall.second
        # Near a daylight-saving change a wall time earlier than ``after``'s may be a later instant.
        margin = int(_offset_shift(zone, after).total_seconds())
        day = after_day - _DAY if after_day > date.min else after_day
        if self.start is not None and day < self.start:
            day = self.start
        best: datetime | None = None
        stop_wall: datetime | None = None
        times = self.times
        for _ in range(_MAX_SCAN_DAYS):
            if self.end is not None and day > self.end:
                break
            midnight = datetime.combine(day, time())
            if stop_wall is not None and midnight > stop_wall:
                break
            if self.selects(day):
                lower = after_second - margin + (after_day - day).days * 86400
                for index in range(bisect_left(times, lower) if lower > 0 else 0, len(times)):
                    wall = midnight + timedelta(seconds=times[index])
                    if stop_wall is not None and wall > stop_wall:
                        break
                    try:
                        instants = _instants(wall, zone, self.both_folds)
                    except OverflowError:   # before year 1 or after 9999 in UTC: no such instant
                        continue
                    for candidate in instants:
                        if candidate > after and (best is None or candidate < best):
                            best = candidate
                            # A later wall time maps to an earlier instant only across a change:
                            # look that far past the best one, no further.
                            stop_wall = wall + _offset_shift(zone, candidate)
            if day == date.max:
                break
            day += _DAY
        return best


def _week_start(day: date) -> date:
    return day - timedelta(days=_cron_weekday(day))     # weeks begin on Sunday, as SQL Agent's do


def _parse_clauses(parts: list[str]) -> dict:
    found: dict = {}

    def once(key: str, clause: str, value) -> None:
        if key in found:
            raise ValueError(f"clause {clause!r}: {key!r} is given twice (expected once)")
        found[key] = value

    normalised = []
    for raw in parts:
        clause = " ".join(raw.split()).lower()
        if not clause:
            raise ValueError("an empty clause between ';' (expected from, until, between or every)")
        words = clause.split(" ")
        if words[0] == "from" and len(words) == 2:
            once("from", clause, _clause_date(words[1], clause))
        elif words[0] == "until" and len(words) == 2:
            once("until", clause, _clause_date(words[1], clause))
        elif words[0] == "between" and len(words) == 4 and words[2] == "and":
            first, last = _clock_seconds(words[1], clause), _clock_seconds(words[3], clause)
            if first > last:
                raise ValueError(f"clause {clause!r}: the window ends before it starts (expected HH:MM[:SS] "
                                 "and a later or equal HH:MM[:SS] of the same day)")
            once("between", clause, (first, last))
            clause = f"between {_clock(first)} and {_clock(last)}"
        elif words[0] == "every" and len(words) == 3 and words[2] in _UNITS:
            unit = _UNITS[words[2]]
            if not _digits(words[1]) or int(words[1]) < 1:
                raise ValueError(f"clause {clause!r}: expected a whole number of {unit} of 1 or more")
            every = int(words[1])
            if unit in _PERIOD_LIMITS:
                if every > _PERIOD_LIMITS[unit]:
                    raise ValueError(f"clause {clause!r}: expected at most {_PERIOD_LIMITS[unit]} {unit}")
                once("period", clause, (unit, every))
            else:
                if every * _STEP_SECONDS[unit] > 86400:
                    raise ValueError(f"clause {clause!r}: expected at most a day of {unit}")
                once("step", clause, every * _STEP_SECONDS[unit])
            clause = f"every {every} {unit}"
        else:
            raise ValueError(f"clause {clause!r}: expected 'from YYYY-MM-DD', 'until YYYY-MM-DD', "
                             "'between HH:MM[:SS] and HH:MM[:SS]', 'every N days|weeks|months' or "
                             "'every N seconds|minutes|hours'")
        normalised.append(clause)
    found["text"] = normalised
    return found


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


@lru_cache(maxsize=1024)
def compile_rules(text: str) -> ScheduleRules:
    """The extended form (see above) compiled; ValueError names the field or clause at fault."""
    cron, *clause_parts = text.split(";")
    fields = cron.split()
    if len(fields) != 6:
        raise ValueError(
            f"{len(fields)} fields given; NCRONTAB has six: second minute hour day month day-of-week")
    for field in fields:
        if not re.fullmatch(r"[0-9A-Za-z,\-*/#]+", field):
            raise ValueError(f"field {field!r} is not NCRONTAB syntax")
    second, minute, hour, day_field, month_field, weekday_field = fields
    seconds = _field_values(second, 0, 59, "second")
    minutes = _field_values(minute, 0, 59, "minute")
    hours = _field_values(hour, 0, 23, "hour")
    months = frozenset(_field_values(month_field, 1, 12, "month", _MONTH_NAMES))
    day_of_month = _parse_day_of_month(day_field)
    day_of_week = _parse_day_of_week(weekday_field)
    clauses = _parse_clauses(clause_parts)
    times = sorted(h * 3600 + m * 60 + s for h in hours for m in minutes for s in seconds)
    window = clauses.get("between")
    if window is not None:
        times = [t for t in times if window[0] <= t <= window[1]]
    step = clauses.get("step")
    if step is not None:
        origin = window[0] if window is not None else 0
        times = [t for t in times if (t - origin) % step == 0]
    if not times:
        raise ValueError("no time of day is left: the second, minute and hour fields and the 'between' and "
                         "'every N seconds|minutes|hours' clauses have no time in common")
    start, end, period = clauses.get("from"), clauses.get("until"), clauses.get("period")
    if start is not None and end is not None and end < start:
        raise ValueError(f"'until {end}' is before 'from {start}' (expected the same day or later)")
    if period is not None and start is None:
        raise ValueError(f"'every {period[1]} {period[0]}' counts from a start date: add '; from YYYY-MM-DD'")
    rules = ScheduleRules(
        text=" ; ".join([" ".join(fields), *clauses["text"]]), months=months, day_of_month=day_of_month,
        day_of_week=day_of_week, times=tuple(times), both_folds=hour == "*" or hour.startswith("*/"),
        start=start, end=end, period=period)
    # The day the period counts from, and a check that the fields select any day at all (day 31
    # of February, the fifth Monday of a month list that never has one, ...).
    first = start or date(2000, 1, 1)
    for offset in range(366 * 28 + 7):     # the calendar repeats every 28 years within 1901-2099
        candidate = first + timedelta(days=offset) if date.max - first >= timedelta(days=offset) else None
        if candidate is None:
            raise ValueError(f"the day fields select no day from {first.isoformat()} to {date.max.isoformat()}")
        if rules.fields_select(candidate):
            break
    else:
        raise ValueError("the day fields select no day of any month (a day the month never has?)")
    if period is not None:
        rules = dataclasses.replace(rules, anchor=candidate)
    return rules


def _field_values(field: str, low: int, high: int, what: str, names: dict[str, int] | None = None) -> set[int]:
    if _EXTENDED_TOKEN.search(_strip_names(field)):
        raise ValueError(f"{what} {field!r}: L, W and # belong to the day-of-month and day-of-week fields")
    values: set[int] = set()
    for item in field.split(","):
        values |= _plain_values(item, low, high, names or {}, what)
    return values


# ---------------------------------------------------------------- jitter

MAX_JITTER_SECONDS = 86400


def jitter_offset(job_name: str, slot: datetime, following: datetime | None, jitter_seconds: int) -> int:
    """How many seconds late a slot of a job with JOB__<name>__JITTER_SECONDS runs: fixed by the
    job's name (case-insensitively) and the slot (SHA-256), so every instance computes the same
    and the jittered slot is still claimed once; from 0 to ``jitter_seconds``, and always before
    the job's next slot (``following``), so the runs keep their order and never share a slot."""
    if jitter_seconds <= 0:
        return 0
    bound = jitter_seconds
    if following is not None:
        bound = min(bound, int((following - slot).total_seconds()) - 1)
    if bound <= 0:
        return 0
    digest = hashlib.sha256(f"{job_name.lower()}\n{utc(slot).isoformat()}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % (bound + 1)


# ---------------------------------------------------------------- SQL Server Agent's schedules

_SQLAGENT_ORDINALS = {1: "1", 2: "2", 4: "3", 8: "4", 16: "L"}
_SQLAGENT_DAY_KINDS = {1: "SUN", 2: "MON", 3: "TUE", 4: "WED", 5: "THU", 6: "FRI", 7: "SAT", 9: "MON-FRI",
                       10: "SAT-SUN"}
_SQLAGENT_SUBDAY_SECONDS = {2: 1, 4: 60, 8: 3600}
_SQLAGENT_SUBDAY_UNITS = {2: "seconds", 4: "minutes", 8: "hours"}
SQLAGENT_NO_END_DATE = 99991231


def _agent_date(value: int, parameter: str) -> date:
    try:
        return date(value // 10000, value // 100 % 100, value % 100)
    except ValueError:
        raise ValueError(f"{parameter}={value}: expected a date as YYYYMMDD") from None


def _agent_time(value: int, parameter: str) -> int:
    hours, minutes, seconds = value // 10000, value // 100 % 100, value % 100
    if value < 0 or hours > 23 or minutes > 59 or seconds > 59:
        raise ValueError(f"{parameter}={value}: expected a time as HHMMSS from 000000 to 235959")
    return hours * 3600 + minutes * 60 + seconds


def _render_field(values: set[int], size: int, step_from_zero: bool = True) -> str:
    """A field for exactly these values (0..size-1): *, */n, a-b, a-b/n or a list."""
    ordered = sorted(values)
    if len(ordered) == size:
        return "*"
    if len(ordered) > 1:
        step = ordered[1] - ordered[0]
        if all(b - a == step for a, b in zip(ordered, ordered[1:])):
            if step_from_zero and ordered[0] == 0 and size % step == 0 and ordered[-1] + step == size:
                return f"*/{step}"
            if step == 1:
                return f"{ordered[0]}-{ordered[-1]}"
            if len(ordered) > 2:
                return f"{ordered[0]}-{ordered[-1]}/{step}"
    return ",".join(map(str, ordered))


def schedule_from_sqlagent(*, freq_type: int, freq_interval: int = 1, freq_subday_type: int = 1,
                           freq_subday_interval: int = 0, freq_relative_interval: int = 0,
                           freq_recurrence_factor: int = 0, active_start_date: int | None = None,
                           active_end_date: int = SQLAGENT_NO_END_DATE, active_start_time: int = 0,
                           active_end_time: int = 235959, today: date) -> str:
    """The schedule text (this module's grammar) that runs exactly when SQL Server Agent runs a
    schedule made by ``msdb.dbo.sp_add_schedule`` (or sp_add_jobschedule) with these arguments,
    in the job's time zone; ``today`` stands for a NULL ``@active_start_date`` (SQL Agent's
    default). ValueError names the argument and what is expected, or says why the schedule has
    no equivalent (@freq_type 64 and 128 are events, not times).

    * 1 (once): ``@once <start date>T<start time>``;
    * 4 (daily): every day, or ``every N days`` from the start date;
    * 8 (weekly): the days of the bitmask (1 = Sunday ... 64 = Saturday), ``every N weeks``
      counted from the week of the first such day on or after the start date;
    * 16 (monthly): day N of the month (a month without that day has no run), ``every N months``;
    * 32 (monthly relative): the first, second, third, fourth or last (1, 2, 4, 8, 16) Sunday ...
      Saturday (1-7), day (8), weekday (9: Monday to Friday) or weekend day (10);
    * times: once at @active_start_time (@freq_subday_type 1), or every N seconds, minutes or
      hours (2, 4, 8) from @active_start_time to @active_end_time, both included;
    * @active_start_date / @active_end_date: ``from`` / ``until`` (both included)."""
    if freq_type in (64, 128):
        event = "when SQL Server Agent starts" if freq_type == 64 else "when the computer is idle"
        raise ValueError(f"@freq_type={freq_type} ({event}): there is no such event here")
    if freq_type not in (1, 4, 8, 16, 32):
        raise ValueError(f"@freq_type={freq_type}: expected 1, 4, 8, 16 or 32 (or 64, 128: not carried)")
    start_date = today if active_start_date is None else _agent_date(active_start_date, "@active_start_date")
    start_time = _agent_time(active_start_time, "@active_start_time")
    end_time = _agent_time(active_end_time, "@active_end_time")
    if freq_type == 1:
        return f"@once {start_date.isoformat()}T{_clock(start_time)}"
    end_date = None if active_end_date == SQLAGENT_NO_END_DATE else _agent_date(active_end_date, "@active_end_date")
    if end_date is not None and end_date < start_date:
        raise ValueError(f"@active_end_date={active_end_date}: expected a date on or after @active_start_date "
                         f"({start_date:%Y%m%d})")

    # Times of day.
    clauses: list[str] = []
    if freq_subday_type == 1:
        times = {start_time}
    elif freq_subday_type in _SQLAGENT_SUBDAY_SECONDS:
        if freq_subday_interval < 1:
            raise ValueError(f"@freq_subday_interval={freq_subday_interval}: expected 1 or more with "
                             f"@freq_subday_type={freq_subday_type}")
        step = freq_subday_interval * _SQLAGENT_SUBDAY_SECONDS[freq_subday_type]
        if step > 86400:
            raise ValueError(f"@freq_subday_interval={freq_subday_interval}: expected at most a day")
        if end_time < start_time:
            raise ValueError(f"@active_end_time={active_end_time}: expected a time at or after @active_start_time="
                             f"{active_start_time} (a window across midnight is two schedules here)")
        times = set(range(start_time, end_time + 1, step))
    else:
        raise ValueError(f"@freq_subday_type={freq_subday_type}: expected 1 (at a time), 2 (seconds), "
                         "4 (minutes) or 8 (hours)")
    seconds = {t % 60 for t in times}
    minutes = {t // 60 % 60 for t in times}
    hours = {t // 3600 for t in times}
    # The hour field is * only when the times fall in every hour (an interval job: both passes of
    # a repeated hour run), never */n: a list of hours runs in the first pass only.
    hour_field = _render_field(hours, 24, step_from_zero=False)
    if len(seconds) * len(minutes) * len(hours) == len(times):
        time_fields = f"{_render_field(seconds, 60)} {_render_field(minutes, 60)} {hour_field}"
    else:   # not one product of fields: every second of those hours, filtered by the clauses
        time_fields = f"* * {hour_field}"
        clauses += [f"every {freq_subday_interval} {_SQLAGENT_SUBDAY_UNITS[freq_subday_type]}",
                    f"between {_clock(start_time)} and {_clock(end_time)}"]

    # Days.
    factor = max(freq_recurrence_factor, 1)
    if freq_type == 4:
        if freq_interval < 1:
            raise ValueError(f"@freq_interval={freq_interval}: expected a number of days, 1 or more")
        day_fields, period = "* * *", ("days", freq_interval)
    elif freq_type == 8:
        if not 1 <= freq_interval <= 127:
            raise ValueError(f"@freq_interval={freq_interval}: expected days of the week, 1 (Sunday) + 2 (Monday) "
                             "+ 4 + 8 + 16 + 32 + 64 (Saturday), from 1 to 127")
        day_fields = "* * " + ",".join(str(k) for k in range(7) if freq_interval & (1 << k))
        period = ("weeks", factor)
    elif freq_type == 16:
        if not 1 <= freq_interval <= 31:
            raise ValueError(f"@freq_interval={freq_interval}: expected a day of the month from 1 to 31")
        day_fields, period = f"{freq_interval} * *", ("months", factor)
    else:
        ordinal = _SQLAGENT_ORDINALS.get(freq_relative_interval)
        if ordinal is None:
            raise ValueError(f"@freq_relative_interval={freq_relative_interval}: expected 1 (first), 2 (second), "
                             "4 (third), 8 (fourth) or 16 (last)")
        if freq_interval == 8:
            day_fields = ("L" if ordinal == "L" else ordinal) + " * *"
        elif freq_interval in _SQLAGENT_DAY_KINDS:
            day_fields = f"* * {_SQLAGENT_DAY_KINDS[freq_interval]}#{ordinal}"
        else:
            raise ValueError(f"@freq_interval={freq_interval}: expected 1 (Sunday) to 7 (Saturday), 8 (day), "
                             "9 (weekday) or 10 (weekend day)")
        period = ("months", factor)
    if period[1] > _PERIOD_LIMITS[period[0]]:
        raise ValueError(f"every {period[1]} {period[0]}: expected at most {_PERIOD_LIMITS[period[0]]}")
    if period[1] > 1:
        clauses.append(f"every {period[1]} {period[0]}")
    if period[1] > 1 or start_date > today:
        clauses.append(f"from {start_date.isoformat()}")
    if end_date is not None:
        clauses.append(f"until {end_date.isoformat()}")
    text = " ; ".join([f"{time_fields} {day_fields}", *clauses])
    return compile_rules(text).text if is_extended(text) else parse_ncrontab(text)
