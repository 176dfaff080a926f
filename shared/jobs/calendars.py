"""Calendars: named sets of dates, date ranges and weekly windows that a job's slots avoid
(``JOB__<name>__EXCLUDE``) or keep to (``JOB__<name>__ONLY``), issue 33.

A calendar is defined in settings::

    CALENDAR__<name>__DATES   2026-12-25, 2026-12-24..2026-12-26, ...   (dates and inclusive ranges)
    CALENDAR__<name>__WEEKLY  SAT-SUN, MON-FRI 18:00-24:00, FRI 22:00-06:00, ...

Dates and windows are read in the time zone of the job that uses the calendar (a holiday is a
local date). A weekly window's start is included and its end is not; an end at or before the
start runs into the next day (FRI 22:00-06:00 is Friday 22:00 to Saturday 06:00); a day without
times is the whole day. Pure: no database; a job row carries its calendars whole (JSON), so the
claim and the views read them with the job.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

UTC = timezone.utc
CALENDAR_SETTING_PREFIX = "CALENDAR__"
CALENDAR_FIELDS = ("DATES", "WEEKLY")
ON_EXCLUDED_POLICIES = ("skip", "next")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# How far ON_EXCLUDED=next looks for an allowed time, and how many calendar pieces it steps over.
MOVE_HORIZON = timedelta(days=366)
_MAX_STEPS = 2000
# At most this many dates or ranges, and weekly windows, in one calendar (a job row carries it).
MAX_DATE_ITEMS = 2000
MAX_WEEKLY_ITEMS = 100


@dataclass(frozen=True)
class WeeklyWindow:
    days: frozenset[int]       # 0 = Sunday, as cron counts
    start: int                 # seconds since midnight, included
    end: int                   # seconds since midnight, excluded; <= start: into the next day

    def text(self) -> str:
        days = ",".join(_DAY_NAMES[d] for d in sorted(self.days))
        if self.start == 0 and self.end == 86400:
            return days
        return f"{days} {_clock(self.start)}-{_clock(self.end)}"


@dataclass(frozen=True)
class Calendar:
    name: str
    dates: tuple[tuple[date, date], ...] = ()        # inclusive ranges, sorted
    weekly: tuple[WeeklyWindow, ...] = ()

    # -- what it holds

    def contains(self, instant: datetime, zone: ZoneInfo) -> bool:
        return self._piece_end(instant, zone) is not None

    def _piece_end(self, instant: datetime, zone: ZoneInfo) -> datetime | None:
        """When the piece of this calendar that holds ``instant`` ends (the first instant after
        it), or None when no piece holds it."""
        wall = instant.astimezone(zone).replace(tzinfo=None)
        day, second = wall.date(), wall.hour * 3600 + wall.minute * 60 + wall.second
        ends = []
        for first, last in self.dates:
            if first <= day <= last:
                ends.append(_instant(datetime.combine(last, time()) + timedelta(days=1), zone))
        weekday = day.isoweekday() % 7
        for window in self.weekly:
            if window.end > window.start:
                if weekday in window.days and window.start <= second < window.end:
                    ends.append(_instant(datetime.combine(day, time()) + timedelta(seconds=window.end), zone))
            else:       # into the next day
                if weekday in window.days and second >= window.start:
                    ends.append(_instant(datetime.combine(day, time()) + timedelta(days=1, seconds=window.end), zone))
                elif (weekday - 1) % 7 in window.days and second < window.end:
                    ends.append(_instant(datetime.combine(day, time()) + timedelta(seconds=window.end), zone))
        later = [end for end in ends if end > instant]
        return max(later) if later else None

    def _next_start(self, instant: datetime, zone: ZoneInfo) -> datetime | None:
        """The first instant at or after ``instant`` that this calendar holds (None: none within
        MOVE_HORIZON)."""
        if self.contains(instant, zone):
            return instant
        wall = instant.astimezone(zone).replace(tzinfo=None)
        starts = []
        for first, _last in self.dates:
            if first > wall.date():
                starts.append(_instant(datetime.combine(first, time()), zone))
        for offset in range(8):
            day = wall.date() + timedelta(days=offset)
            for window in self.weekly:
                if day.isoweekday() % 7 in window.days:
                    moment = _instant(datetime.combine(day, time()) + timedelta(seconds=window.start), zone)
                    if moment >= instant:
                        starts.append(moment)
        found = min(starts, default=None)
        return found if found is not None and found - instant <= MOVE_HORIZON else None

    # -- JSON (a job row's `calendars` column)

    def as_json(self) -> dict:
        return {"name": self.name, "dates": [[a.isoformat(), b.isoformat()] for a, b in self.dates],
                "weekly": [[sorted(w.days), w.start, w.end] for w in self.weekly]}

    @staticmethod
    def from_json(value: dict) -> Calendar:
        return Calendar(name=value["name"],
                        dates=tuple((date.fromisoformat(a), date.fromisoformat(b)) for a, b in value.get("dates", ())),
                        weekly=tuple(WeeklyWindow(frozenset(d), s, e) for d, s, e in value.get("weekly", ())))

    def describe(self) -> str:
        parts = [a.isoformat() if a == b else f"{a.isoformat()}..{b.isoformat()}" for a, b in self.dates[:5]]
        if len(self.dates) > 5:
            parts.append(f"... ({len(self.dates)} dates or ranges)")
        parts += [w.text() for w in self.weekly]
        return ", ".join(parts) or "(empty)"


@dataclass(frozen=True)
class CalendarRules:
    """A job's calendars: the slots they hold are excluded (``exclude``), or every slot outside
    them is (``only``); an excluded slot is skipped, or moved to the next allowed time."""

    exclude: tuple[Calendar, ...] = ()
    only: tuple[Calendar, ...] = ()
    on_excluded: str = "skip"
    names: dict = field(default_factory=dict, compare=False, hash=False)

    def __bool__(self) -> bool:
        return bool(self.exclude or self.only)

    def why_excluded(self, instant: datetime, zone: ZoneInfo) -> str | None:
        """The note of an excluded slot (``calendar: <name>``, or ``calendar: not in <names>``
        for a slot outside every ONLY calendar), or None when the slot may run."""
        for calendar in self.exclude:
            if calendar.contains(instant, zone):
                return f"calendar: {calendar.name}"
        if self.only and not any(calendar.contains(instant, zone) for calendar in self.only):
            return "calendar: not in " + ",".join(calendar.name for calendar in self.only)
        return None

    def next_allowed(self, instant: datetime, zone: ZoneInfo) -> datetime | None:
        """The first instant at or after ``instant`` that no EXCLUDE calendar holds and some ONLY
        calendar does (None: none within MOVE_HORIZON)."""
        moment = instant
        for _ in range(_MAX_STEPS):
            moved = False
            for calendar in self.exclude:
                end = calendar._piece_end(moment, zone)
                if end is not None:
                    moment, moved = end, True
            if self.only and not any(calendar.contains(moment, zone) for calendar in self.only):
                starts = [start for start in (c._next_start(moment, zone) for c in self.only) if start is not None]
                if not starts:
                    return None
                moment, moved = min(starts), True
            if moment - instant > MOVE_HORIZON:
                return None
            if not moved:
                return moment
        return None

    def as_json(self) -> str:
        return json.dumps({"exclude": [c.as_json() for c in self.exclude], "only": [c.as_json() for c in self.only],
                           "on_excluded": self.on_excluded}, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str | None) -> CalendarRules:
        if not text:
            return CalendarRules()
        value = json.loads(text)
        return CalendarRules(exclude=tuple(Calendar.from_json(c) for c in value.get("exclude", ())),
                             only=tuple(Calendar.from_json(c) for c in value.get("only", ())),
                             on_excluded=value.get("on_excluded", "skip"))

    def describe(self) -> str:
        parts = []
        if self.exclude:
            parts.append("excluding " + ", ".join(c.name for c in self.exclude))
        if self.only:
            parts.append("only in " + ", ".join(c.name for c in self.only))
        if parts and self.on_excluded == "next":
            parts.append("an excluded slot moves to the next allowed time")
        return "; ".join(parts)


def _clock(seconds: int) -> str:
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}"


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """A wall time in ``zone`` as an instant (a time a daylight-saving jump skips: the same offset
    after it, as slots do)."""
    return wall.replace(tzinfo=zone, fold=0).astimezone(UTC)


# ---------------------------------------------------------------- settings


def parse_dates(text: str) -> tuple[tuple[date, date], ...]:
    """``2026-12-25, 2026-12-24..2026-12-26``: dates and inclusive ranges; ValueError says which
    item and what is expected."""
    ranges = []
    items = [item.strip() for item in text.split(",")]
    if len(items) > MAX_DATE_ITEMS:
        raise ValueError(f"{len(items)} dates or ranges: expected at most {MAX_DATE_ITEMS}")
    for item in items:
        if not item:
            raise ValueError("an empty item between commas (expected YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD)")
        first_text, dots, last_text = item.partition("..")
        first = _date(first_text.strip(), item)
        last = _date(last_text.strip(), item) if dots else first
        if last < first:
            raise ValueError(f"{item!r}: the range ends before it starts (expected YYYY-MM-DD..a later YYYY-MM-DD)")
        ranges.append((first, last))
    return tuple(sorted(ranges))


def _date(text: str, item: str) -> date:
    if not re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
        raise ValueError(f"{item!r}: expected YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD")
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{item!r}: {text} is not a date that exists") from None


def parse_weekly(text: str) -> tuple[WeeklyWindow, ...]:
    """``SAT-SUN, MON-FRI 18:00-24:00, FRI 22:00-06:00``: days (a day or a range, Sunday to
    Saturday) each with an optional HH:MM-HH:MM window."""
    windows = []
    items = [item.strip() for item in text.split(",")]
    if len(items) > MAX_WEEKLY_ITEMS:
        raise ValueError(f"{len(items)} windows: expected at most {MAX_WEEKLY_ITEMS}")
    for item in items:
        match = re.fullmatch(r"([A-Za-z]{3})(?:-([A-Za-z]{3}))?(?:\s+([0-9]{2}):([0-9]{2})-([0-9]{2}):([0-9]{2}))?", item)
        expected = "a day or days (MON, SAT-SUN) with an optional window HH:MM-HH:MM (MON-FRI 18:00-24:00)"
        if not match:
            raise ValueError(f"{item!r}: expected {expected}")
        first, last = _DAYS.get(match[1].lower()), _DAYS.get((match[2] or match[1]).lower())
        if first is None or last is None:
            raise ValueError(f"{item!r}: expected day names SUN, MON, TUE, WED, THU, FRI, SAT")
        days = frozenset(range(first, last + 1)) if first <= last else frozenset([*range(first, 7), *range(0, last + 1)])
        if match[3] is None:
            start, end = 0, 86400
        else:
            start_h, start_m, end_h, end_m = (int(match[k]) for k in (3, 4, 5, 6))
            if start_h > 23 or start_m > 59 or end_m > 59 or end_h > 24 or (end_h == 24 and end_m):
                raise ValueError(f"{item!r}: expected times from 00:00 to 23:59 (24:00 as an end)")
            start, end = start_h * 3600 + start_m * 60, end_h * 3600 + end_m * 60
            if start == end:
                raise ValueError(f"{item!r}: the window is empty (the same start and end)")
        windows.append(WeeklyWindow(days, start, end))
    return tuple(windows)


@dataclass(frozen=True)
class CalendarSettings:
    """Every CALENDAR__<name>__* of the settings: the calendars, and each invalid one's errors."""

    calendars: dict[str, Calendar]
    invalid: dict[str, tuple[str, ...]]


def parse_calendars(env: dict[str, str]) -> CalendarSettings:
    """CALENDAR__<name>__DATES / __WEEKLY into calendars; a bad setting makes its calendar
    invalid (the jobs that use it say so), never the others. Names compare case-insensitively."""
    given: dict[str, dict[str, tuple[str, str]]] = {}
    invalid: dict[str, list[str]] = {}
    for key, value in env.items():
        if not key.upper().startswith(CALENDAR_SETTING_PREFIX):
            continue
        name, _, part = key[len(CALENDAR_SETTING_PREFIX):].partition("__")
        if not NAME_PATTERN.fullmatch(name or ""):
            invalid.setdefault(name.lower(), []).append(
                f"{key}: expected a calendar name of 1 to 64 letters, digits, '_', '.' or '-'")
            continue
        if part.upper() not in CALENDAR_FIELDS:
            invalid.setdefault(name.lower(), []).append(
                f"{key}: unknown calendar setting {part!r} (expected {', '.join(CALENDAR_FIELDS)})")
            continue
        given.setdefault(name.lower(), {})[part.upper()] = (key, value, name)
    calendars: dict[str, Calendar] = {}
    for folded, parts in given.items():
        errors = invalid.setdefault(folded, [])
        display = next(iter(parts.values()))[2]
        dates: tuple = ()
        weekly: tuple = ()
        for part, (key, value, _) in parts.items():
            try:
                if part == "DATES":
                    dates = parse_dates(value)
                else:
                    weekly = parse_weekly(value)
            except ValueError as exc:
                shown = value if len(value) <= 200 else value[:200] + "..."
                errors.append(f"{key}={shown!r}: {exc}")
        if not errors:
            calendars[folded] = Calendar(name=display, dates=dates, weekly=weekly)
    return CalendarSettings(calendars, {name: tuple(errors) for name, errors in invalid.items() if errors})
