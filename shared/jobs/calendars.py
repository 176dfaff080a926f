"""Calendars: named sets of dates, date ranges and weekly windows that a job's slots avoid
(``JOB__<name>__EXCLUDE``) or keep to (``JOB__<name>__ONLY``), issue 33.

A calendar is defined in settings::

    CALENDAR__<name>__DATES   2026-12-25, 2026-12-24..2026-12-26, ...   (dates and inclusive ranges)
    CALENDAR__<name>__WEEKLY  SAT-SUN, MON-FRI 18:00-24:00, FRI 22:00-06:00, ...
    CALENDAR__<name>__ICS     holidays/uk.ics   (an iCalendar file: its events, recurring ones too)

Dates and windows are read in the time zone of the job that uses the calendar (a holiday is a
local date). A weekly window's start is included and its end is not; an end at or before the
start runs into the next day (FRI 22:00-06:00 is Friday 22:00 to Saturday 06:00); a day without
times is the whole day. An instant is in a window when its local time is: around a daylight-saving
change, a window starting in the gap starts at the first instant after it (SUN 01:30-03:00 in
London on the last Sunday of March: 02:00 BST), one wholly in the gap is moved forward by the gap
(as cron moves a time that does not exist), and a local time the clocks repeat is held in both
passes; a date likewise holds the instants whose local date it is. Pure: no database; a job row
carries its calendars whole (JSON), so the claim and the views read them with the job.

Bounded work: a calendar's pieces are computed once per zone and month as sorted, merged ranges
(a slot's check is a binary search; the next allowed time jumps piece to piece and looks at most
MOVE_HORIZON ahead), and an iCalendar file is read within budgets (read_ics).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from functools import lru_cache
from typing import Any, Callable
from zoneinfo import ZoneInfo

UTC = timezone.utc
CALENDAR_SETTING_PREFIX = "CALENDAR__"
CALENDAR_FIELDS = ("DATES", "WEEKLY", "ICS")
ON_EXCLUDED_POLICIES = ("skip", "next")
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_DAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# How far ON_EXCLUDED=next looks for an allowed time: beyond it, there is none (the slot is
# recorded skipped, `no allowed time within a year`).
MOVE_HORIZON = timedelta(days=366)
# At most this many dates or ranges, and weekly windows, in one calendar (a job row carries it).
MAX_DATE_ITEMS = 2000
MAX_WEEKLY_ITEMS = 100
MAX_EVENTS = 5000
# At most this many calendars a job's EXCLUDE, and its ONLY, names (each is merged with the others
# for every month a slot is decided in).
MAX_CALENDARS_PER_JOB = 20
MAX_ICS_BYTES = 5 * 1024 * 1024
# At most this many CALENDAR__<name>__ICS files in the settings, and this many bytes in all: a
# cold start parses each (a few seconds a MiB), and read_ics keeps the answers of twice as many.
MAX_ICS_CALENDARS = 16
MAX_ICS_TOTAL_BYTES = 20 * 1024 * 1024
# An iCalendar file's expansion: at most this many rules (RRULE, EXRULE) an event, and steps of
# work (_WorkBudget: about half a microsecond each) for the whole file: to walk its rules first,
# from their DTSTART to past the window (a DTSTART long before it, or a rule that rarely or
# never matches, walks long), then to expand them with their occurrences (that walk again, and
# a few hundred steps an occurrence). A bomb is stopped within a few seconds, once: the answer
# is kept while the file is unchanged.
MAX_RULES_PER_EVENT = 10
ICS_RULE_BUDGET = 2_000_000
ICS_WORK_BUDGET = 2_500_000
# The recurring events of an iCalendar file are expanded from the start of last year to the end
# of the year after next (read again when the file or the year changes).
ICS_YEARS_BACK, ICS_YEARS_AHEAD = 1, 2


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
    events: tuple[tuple[datetime, datetime], ...] = ()   # [start, end) instants (UTC), sorted

    # -- what it holds

    def contains(self, instant: datetime, zone: ZoneInfo) -> bool:
        """Whether ``instant`` is in one of this calendar's pieces: its local date in one of the
        dates, its local time in one of the weekly windows, or it in one of the timed events."""
        moment = _naive_utc(instant)
        starts, ends = self._pieces(zone, _month(moment))
        index = bisect_right(starts, moment) - 1
        return index >= 0 and moment < ends[index]

    def _pieces(self, zone: ZoneInfo, month: int) -> tuple[list[datetime], list[datetime]]:
        """The instants this calendar holds from a few days before ``month`` (_month) to a few
        days after it, as sorted, merged [start, end) ranges (naive UTC): the starts and the
        ends (a piece that runs on past the span may end early, after the span's end). Computed
        once per calendar, zone and month (the planner asks for every slot)."""
        return _memoized(self, (zone, month), lambda: _merged(self._ranges(zone, month)))

    def _ranges(self, zone: ZoneInfo, month: int) -> list[tuple[datetime, datetime]]:
        low, high = _span(month)
        segments = _segments(zone, month)
        ranges: list[tuple[datetime, datetime]] = []
        first_day, last_day = low.date() - timedelta(days=2), high.date() + timedelta(days=2)
        for first, last in self.dates:
            if last < first_day or first > last_day:
                continue
            ranges += _local_range(datetime.combine(max(first, first_day), time()),
                                   datetime.combine(min(last, last_day) + timedelta(days=1), time()), segments)
        by_day = _weekly_by_day(self.weekly)
        day = first_day
        while day <= last_day:
            midnight = datetime.combine(day, time())
            for start, end in by_day[day.isoweekday() % 7]:
                ranges += _local_range(midnight + timedelta(seconds=start), midnight + timedelta(seconds=end), segments)
            day += timedelta(days=1)
        for start, end in self.events:
            start, end = _naive_utc(start), _naive_utc(end)
            if end > low and start < high:
                ranges.append((start, end))
        return ranges

    # -- JSON (a job row's `calendars` column)

    def as_json(self) -> dict:
        value: dict = {"name": self.name, "dates": [[a.isoformat(), b.isoformat()] for a, b in self.dates],
                       "weekly": [[sorted(w.days), w.start, w.end] for w in self.weekly]}
        if self.events:
            value["events"] = [[a.isoformat(), b.isoformat()] for a, b in self.events]
        return value

    @staticmethod
    def from_json(value: dict) -> Calendar:
        return Calendar(name=value["name"],
                        dates=tuple((date.fromisoformat(a), date.fromisoformat(b)) for a, b in value.get("dates", ())),
                        weekly=tuple(WeeklyWindow(frozenset(d), s, e) for d, s, e in value.get("weekly", ())),
                        events=tuple((datetime.fromisoformat(a), datetime.fromisoformat(b))
                                     for a, b in value.get("events", ())))

    def describe(self) -> str:
        parts = [a.isoformat() if a == b else f"{a.isoformat()}..{b.isoformat()}" for a, b in self.dates[:5]]
        if len(self.dates) > 5:
            parts.append(f"... ({len(self.dates)} dates or ranges)")
        parts += [w.text() for w in self.weekly]
        if self.events:
            parts.append(f"{len(self.events)} timed event(s)")
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
        calendar does (None: none within MOVE_HORIZON). Bounded: the calendars' pieces are
        merged once per zone and month (sorted ranges), and the walk jumps from piece to piece
        with a binary search, at most once per piece, through at most the 14 months of the
        horizon."""
        moment = _naive_utc(instant)
        limit = moment + MOVE_HORIZON
        month = _month(moment)
        for _ in range(15):
            (ex_starts, ex_ends), only = self._merged_pieces(zone, month)
            month_end = _month_start(month + 1)
            for _ in range(len(ex_starts) + (len(only[0]) if only else 0) + 2):
                if only is not None:
                    only_starts, only_ends = only
                    index = bisect_right(only_starts, moment) - 1
                    if index < 0 or moment >= only_ends[index]:
                        moment = only_starts[index + 1] if index + 1 < len(only_starts) else month_end
                if moment > limit:
                    return None
                if moment >= month_end:
                    break                       # on in the next month's pieces
                index = bisect_right(ex_starts, moment) - 1
                if index >= 0 and moment < ex_ends[index]:
                    moment = ex_ends[index]      # past this excluded piece (an ONLY piece is checked again)
                    continue
                return moment.replace(tzinfo=UTC)
            month = max(month + 1, _month(moment))
            if month > _MAX_MONTH:
                return None
        return None

    def _merged_pieces(self, zone: ZoneInfo, month: int):
        """(the EXCLUDE calendars' pieces merged, the ONLY calendars' merged or None), once per
        zone and month."""
        def merge():
            excluded = _merged([piece for calendar in self.exclude for piece in zip(*calendar._pieces(zone, month))])
            only = _merged([piece for calendar in self.only
                            for piece in zip(*calendar._pieces(zone, month))]) if self.only else None
            return excluded, only

        return _memoized(self, (zone, month), merge)

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


def _naive_utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC).replace(tzinfo=None) if instant.tzinfo else instant


# Months as a number (year * 12 + month - 1); the first and last two years have no room for the
# span of a month (an instant there is in no piece).
_MIN_MONTH, _MAX_MONTH = 2 * 12, 9997 * 12 + 11
# The dates a calendar's DATES may name: those of the months it computes (a date outside them was
# accepted once and never applied: a slot on 9998-06-01 ran).
FIRST_DATE, LAST_DATE = date(_MIN_MONTH // 12, 1, 1), date(_MAX_MONTH // 12, 12, 31)
_MEMO_SIZE = 48


def _month(moment: datetime) -> int:
    return min(max(moment.year * 12 + moment.month - 1, _MIN_MONTH), _MAX_MONTH)


def _month_start(month: int) -> datetime:
    return datetime(month // 12, month % 12 + 1, 1)


def _span(month: int) -> tuple[datetime, datetime]:
    """The instants (naive UTC) whose pieces a calendar computes for ``month``: the month and a
    few days either side (local dates and times are up to a day off UTC)."""
    return _month_start(month) - timedelta(days=3), _month_start(month + 1) + timedelta(days=3)


@lru_cache(maxsize=256)
def _segments(zone: ZoneInfo, month: int) -> tuple[list[datetime], list[timedelta]]:
    """The zone's UTC offsets over the span of ``month`` (and 3 days either side): the instants
    (naive UTC) each offset starts at, and the offsets. Sampled every 6 hours, each change found
    to the second by bisection."""
    low, high = _span(month)
    low, high = low - timedelta(days=3), high + timedelta(days=3)

    def offset(moment: datetime) -> timedelta:
        return moment.replace(tzinfo=UTC).astimezone(zone).utcoffset() or timedelta(0)

    starts, offsets = [datetime.min], [offset(low)]
    step = timedelta(hours=6)
    moment = low
    while moment < high:
        after = moment + step
        if offset(after) != offsets[-1]:
            a, b = moment, after                 # offset(a) is the current one, offset(b) not
            while b - a > timedelta(seconds=1):
                middle = a + (b - a) / 2
                middle = middle.replace(microsecond=0)
                if middle <= a:
                    break
                if offset(middle) == offsets[-1]:
                    a = middle
                else:
                    b = middle
            starts.append(b)
            offsets.append(offset(b))
        moment = after
    return starts, offsets


def _local_range(first: datetime, end: datetime, segments) -> list[tuple[datetime, datetime]]:
    """The instants (naive UTC) whose local time is in [first, end) (naive local times): for each
    stretch of one UTC offset, the range [first, end) at that offset, within the stretch. A local
    time a daylight-saving jump skips exists in no stretch: a range starting in the gap starts at
    the first instant after it (one wholly in the gap is moved forward by the gap); a local time
    repeated when the clocks go back is held twice (both passes)."""
    starts, offsets = segments
    out = []
    index = max(bisect_right(starts, first - timedelta(hours=30)) - 1, 0)
    while index < len(starts) and starts[index] < end + timedelta(hours=30):
        stretch_end = starts[index + 1] if index + 1 < len(starts) else datetime.max
        low = max(first - offsets[index], starts[index])
        high = min(end - offsets[index], stretch_end)
        if low < high:
            out.append((low, high))
        index += 1
    if not out and first < end:
        # A range wholly inside a gap (SUN 01:15-01:45 in London the day the clocks go forward):
        # moved forward by the gap, as cron moves a time that does not exist, so it is not lost.
        for index in range(1, len(starts)):
            before, after, jump = offsets[index - 1], offsets[index], starts[index]
            if after > before and first - before >= jump and end - after <= jump:
                out.append((first - before, end - before))
                break
    return out


def _weekly_by_day(weekly: tuple[WeeklyWindow, ...]) -> list[list[tuple[int, int]]]:
    """Each weekday's windows (0 = Sunday) as merged (start, end) seconds from its midnight (an
    end past 86400: into the next day)."""
    by_day: list[list[tuple[int, int]]] = [[] for _ in range(7)]
    for window in weekly:
        end = window.end if window.end > window.start else 86400 + window.end
        for day in window.days:
            by_day[day].append((window.start, end))
    merged = []
    for pieces in by_day:
        out: list[tuple[int, int]] = []
        for start, end in sorted(pieces):
            if out and start <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged.append(out)
    return merged


def _memoized(owner: Any, key: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` kept on ``owner`` (a frozen dataclass: its own _memo dict, cleared when it
    holds _MEMO_SIZE answers) under ``key``."""
    memo = owner.__dict__.get("_memo")
    if memo is None:
        memo = {}
        object.__setattr__(owner, "_memo", memo)
    found = memo.get(key)
    if found is None:
        if len(memo) >= _MEMO_SIZE:
            memo.clear()
        found = memo[key] = compute()
    return found


def _merged(ranges) -> tuple[list[datetime], list[datetime]]:
    """Ranges sorted and merged (touching ones too): (starts, ends)."""
    starts: list[datetime] = []
    ends: list[datetime] = []
    for start, end in sorted(ranges):
        if ends and start <= ends[-1]:
            if end > ends[-1]:
                ends[-1] = end
        else:
            starts.append(start)
            ends.append(end)
    return starts, ends


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
        if first < FIRST_DATE or last > LAST_DATE:
            raise ValueError(f"{item!r}: expected dates from {FIRST_DATE.isoformat()} to {LAST_DATE.isoformat()} "
                             "(a calendar holds no time outside them)")
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


def parse_calendars(env: dict[str, str], today: date | None = None) -> CalendarSettings:
    """CALENDAR__<name>__DATES / __WEEKLY / __ICS into calendars; a bad setting makes its calendar
    invalid (the jobs that use it say so), never the others. Names compare case-insensitively.
    ``today`` fixes the window recurring iCalendar events are expanded in (default: today)."""
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
        earlier = given.setdefault(name.lower(), {}).get(part.upper())
        if earlier is not None:
            invalid.setdefault(name.lower(), []).append(
                f"{key}: {earlier[0]} sets it too (calendar names compare case-insensitively): keep one")
            continue
        given[name.lower()][part.upper()] = (key, value, name)
    calendars: dict[str, Calendar] = {}
    too_many_files = _ics_over_limits(given)
    for folded, parts in given.items():
        errors = invalid.setdefault(folded, [])
        display = next(iter(parts.values()))[2]
        dates: tuple = ()
        weekly: tuple = ()
        events: tuple = ()
        ics_dates: tuple = ()
        for part, (key, value, _) in parts.items():
            try:
                if part == "DATES":
                    dates = parse_dates(value)
                elif part == "WEEKLY":
                    weekly = parse_weekly(value)
                elif folded in too_many_files:
                    raise ValueError(too_many_files[folded])
                else:
                    ics_dates, events = read_ics(value.strip(), today or datetime.now(UTC).date())
            except ValueError as exc:
                shown = value if len(value) <= 200 else value[:200] + "..."
                errors.append(f"{key}={shown!r}: {exc}")
        if not errors:
            calendars[folded] = Calendar(name=display, dates=tuple(sorted(dates + ics_dates)), weekly=weekly,
                                         events=events)
    return CalendarSettings(calendars, {name: tuple(errors) for name, errors in invalid.items() if errors})


def _ics_over_limits(given: dict[str, dict[str, tuple[str, str, str]]]) -> dict[str, str]:
    """The ICS calendars past MAX_ICS_CALENDARS or MAX_ICS_TOTAL_BYTES (taken in name order, so
    that every instance refuses the same ones), each with why."""
    refused: dict[str, str] = {}
    total = 0
    for index, folded in enumerate(sorted(name for name, parts in given.items() if "ICS" in parts)):
        if index >= MAX_ICS_CALENDARS:
            refused[folded] = (f"more than {MAX_ICS_CALENDARS} calendars are read from iCalendar files "
                               f"(CALENDAR__<name>__ICS): expected at most {MAX_ICS_CALENDARS} (the first "
                               f"{MAX_ICS_CALENDARS} by name are read)")
            continue
        try:
            size = os.stat(given[folded]["ICS"][1].strip()).st_size
        except (OSError, ValueError):
            continue                        # read_ics says what is wrong with the path
        if size > MAX_ICS_BYTES:
            continue                        # read_ics refuses it alone
        if total + size > MAX_ICS_TOTAL_BYTES:
            refused[folded] = (f"the iCalendar files of the calendars before it by name and this one hold more than "
                               f"{MAX_ICS_TOTAL_BYTES // (1024 * 1024)} MiB: expected at most "
                               f"{MAX_ICS_TOTAL_BYTES // (1024 * 1024)} MiB of .ics files in all")
            continue
        total += size
    return refused


def read_ics(path: str, today: date) -> tuple[tuple[tuple[date, date], ...], tuple[tuple[datetime, datetime], ...]]:
    """The events of an iCalendar file (RFC 5545) as dates (all-day events: DTSTART;VALUE=DATE,
    their end excluded) and [start, end) instants (timed events; a time without a zone is UTC),
    recurring ones (RRULE, RDATE, EXDATE) expanded from the start of last year to the end of the
    year after next; cancelled events are left out. ``path``: a file, absolute or relative to the
    current directory (the function app's root). ValueError says what is wrong.

    Bounded whatever the file holds: at most MAX_ICS_BYTES read; MAX_EVENTS events, RDATE and
    EXDATE values, MAX_RULES_PER_EVENT rules an event, counted before anything is expanded; its
    rules walked first (dateutil alone, within ICS_RULE_BUDGET steps of work, counting the
    occurrences in the window), then expanded (within twice that walk and ICS_WORK_BUDGET): a
    rule is walked from its DTSTART, however long before the window, and one that rarely or never
    matches walks on past it. The answer (or the refusal) is kept while the file is unchanged:
    the settings are read at every tick."""
    if not path:
        raise ValueError("expected the path of an iCalendar (.ics) file")
    try:
        status = os.stat(path)
    except OSError as exc:
        raise ValueError(f"the file cannot be read ({exc.strerror or exc}); expected the path of an iCalendar "
                         "file, absolute or relative to the app's root") from None
    if not stat.S_ISREG(status.st_mode):
        raise ValueError(NOT_A_FILE)
    key = (os.path.abspath(path), status.st_mtime_ns, status.st_size, status.st_ino, today.year)
    found = _ICS_READ.get(key)
    if found is None:
        try:
            found = _read_ics(path, today)
        except ValueError as exc:
            found = exc
        if len(_ICS_READ) >= 2 * MAX_ICS_CALENDARS:
            _ICS_READ.clear()
        _ICS_READ[key] = found
    if isinstance(found, ValueError):
        raise ValueError(str(found))
    return found


NOT_A_FILE = ("not a regular file (a named pipe, a device or a directory); expected the path of an iCalendar "
              "file, absolute or relative to the app's root")
# read_ics's answers (or refusals), by file (path, modification time, size, inode) and year.
_ICS_READ: dict[tuple, object] = {}


def _read_ics(path: str, today: date):
    try:
        # Opened without waiting (a named pipe put there since the stat would wait for a writer:
        # the tick hung), and read only when it is a regular file.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with open(descriptor, "rb") as handle:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise ValueError(NOT_A_FILE)
            data = handle.read(MAX_ICS_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"the file cannot be read ({exc.strerror or exc}); expected the path of an iCalendar "
                         "file, absolute or relative to the app's root") from None
    if len(data) > MAX_ICS_BYTES:
        raise ValueError(f"the file is larger than {MAX_ICS_BYTES // (1024 * 1024)} MiB")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError("the file is not UTF-8 text (RFC 5545 calendars are UTF-8)") from None
    # icalendar and recurring-ical-events load only for a calendar file (a cold start without one
    # does not pay for them).
    import icalendar
    import recurring_ical_events

    start = date(today.year - ICS_YEARS_BACK, 1, 1)
    end = date(today.year + ICS_YEARS_AHEAD + 1, 1, 1)
    expected = (f"expected at most {MAX_EVENTS} events from {start} to {end} (recurring events starting near that "
                "window: a rule is expanded from its DTSTART)")
    try:
        _count_lines(text, expected)        # before the parse, which costs a few seconds a few MiB
        calendar = icalendar.Calendar.from_ical(text)
        events = calendar.walk("VEVENT")
        _check_sizes(events, expected)
        with _WorkBudget(ICS_RULE_BUDGET) as walked:
            _check_rules(events, start, end)
        # The expansion walks the same rules again, and does more for each occurrence.
        with _WorkBudget(2 * walked.steps + ICS_WORK_BUDGET):
            occurrences = list(recurring_ical_events.of(calendar).between(start, end))
        if len(occurrences) > MAX_EVENTS:
            raise _Refused(f"more than {MAX_EVENTS} events from {start} to {end}: expected at most {MAX_EVENTS}")
    except _TooMuchWork as exc:
        raise ValueError(f"expanding its recurring events takes more than {exc.args[0]} steps of work (a rule is "
                         f"walked from its DTSTART, however long before {start}, and one that rarely or never "
                         f"matches walks on past the window): {expected}") from None
    except ValueError as exc:
        if isinstance(exc, _Refused):
            raise ValueError(str(exc)) from None
        raise ValueError(f"not an iCalendar file that can be read ({type(exc).__name__})") from None
    except Exception as exc:   # the libraries' many parse errors: one message
        # Not the library's text: it quotes the file's lines, and this message reaches the job's
        # config_error (jobs, the monitor): a path pointing at another file must not show it.
        raise ValueError(f"not an iCalendar file that can be read ({type(exc).__name__})") from None
    dates: list[tuple[date, date]] = []
    events: list[tuple[datetime, datetime]] = []
    for event in occurrences:
        if str(event.get("STATUS", "")).upper() == "CANCELLED" or event.get("DTSTART") is None:
            continue
        first = event["DTSTART"].dt
        last = event["DTEND"].dt if event.get("DTEND") is not None else None
        if last is None and event.get("DURATION") is not None:
            last = first + event["DURATION"].dt
        if not isinstance(first, datetime):          # an all-day event: its dates, the end excluded
            final = (last if isinstance(last, date) and not isinstance(last, datetime) else first + timedelta(days=1))
            dates.append((first, max(first, final - timedelta(days=1))))
            continue
        last = last if isinstance(last, datetime) else first
        first_utc = (first if first.tzinfo else first.replace(tzinfo=UTC)).astimezone(UTC)
        last_utc = (last if last.tzinfo else last.replace(tzinfo=UTC)).astimezone(UTC)
        if last_utc > first_utc:
            events.append((first_utc, last_utc))
    if len(dates) + len(events) > MAX_EVENTS:
        raise ValueError(f"{len(dates) + len(events)} events from {start} to {end}: expected at most {MAX_EVENTS}")
    return tuple(sorted(set(dates))), tuple(sorted(set(events)))


class _Refused(ValueError):
    """A file refused for its size (its message says which limit and what is expected)."""


_LINE = re.compile(r"^(?:(BEGIN:VEVENT)|(RDATE|EXDATE)[;:]([^\r\n]*))", re.IGNORECASE | re.MULTILINE)


def _count_lines(text: str, expected: str) -> None:
    """The counts _check_sizes checks, from the file's lines (unfolded), before it is parsed: a
    file far over them is refused without paying for the parse. _check_sizes, on the parsed
    file, stays the exact check."""
    events = rdates = exdates = 0
    for match in _LINE.finditer(re.sub(r"\r?\n[ \t]", "", text)):
        if match[1]:
            events += 1
            continue
        values = match[3].rpartition(":")[2].count(",") + 1      # after the parameters, comma-separated
        if match[2].upper() == "RDATE":
            rdates += values
        else:
            exdates += values
    if events > MAX_EVENTS:
        raise _Refused(f"more than {MAX_EVENTS} events (VEVENT): {expected}")
    if rdates > MAX_EVENTS:
        raise _Refused(f"more than {MAX_EVENTS} RDATE values: {expected}")
    if exdates > MAX_EVENTS:
        raise _Refused(f"more than {MAX_EVENTS} EXDATE values: expected at most {MAX_EVENTS}")


def _check_sizes(events, expected: str) -> None:
    """The counts a file's expansion grows with, checked before it is expanded: events, RDATE and
    EXDATE values, rules an event."""
    count = rdates = exdates = 0
    for event in events:
        count += 1
        if count > MAX_EVENTS:
            raise _Refused(f"more than {MAX_EVENTS} events (VEVENT): {expected}")
        for name in ("RRULE", "EXRULE"):
            rules = event.get(name)
            if isinstance(rules, list) and len(rules) > MAX_RULES_PER_EVENT:
                raise _Refused(f"an event with {len(rules)} {name} lines: expected at most {MAX_RULES_PER_EVENT}")
        for name in ("RDATE", "EXDATE"):
            value = event.get(name)
            values = sum(len(getattr(one, "dts", ()) or ()) for one in (value if isinstance(value, list) else [value])
                         if one is not None)
            if name == "RDATE":
                rdates += values
            else:
                exdates += values
        if rdates > MAX_EVENTS:
            raise _Refused(f"more than {MAX_EVENTS} RDATE values: {expected}")
        if exdates > MAX_EVENTS:
            raise _Refused(f"more than {MAX_EVENTS} EXDATE values: expected at most {MAX_EVENTS}")


def _check_rules(events, start: date, end: date) -> None:
    """Each event's RRULE walked as the expansion will walk it (from its DTSTART to past the
    window), counting the occurrences in the window: more than MAX_EVENTS in all refused (run
    within a _WorkBudget: a walk too long is stopped). Only dateutil's walk, without the
    libraries' work for each occurrence, so a bomb is found for a fraction of the cost of
    expanding it."""
    from dateutil.rrule import rrulestr
    from icalendar import vRecur

    low, high = datetime.combine(start, time()) - timedelta(days=1), datetime.combine(end, time()) + timedelta(days=1)
    total = 0
    for event in events:
        first = event.get("DTSTART")
        rules = event.get("RRULE")
        if first is None or rules is None:
            continue
        first = first.dt
        if not isinstance(first, datetime):
            first = datetime.combine(first, time())
        first = first.replace(tzinfo=None)          # its wall time: the walk is the same
        for rule in rules if isinstance(rules, list) else [rules]:
            text = vRecur({k: v for k, v in rule.items() if k.upper() != "UNTIL"}).to_ical().decode()
            walk = rrulestr(text, dtstart=first)
            until = (rule.get("UNTIL") or [None])[0]
            if until is not None:
                if not isinstance(until, datetime):
                    until = datetime.combine(until, time()) + timedelta(days=1)
                elif until.tzinfo is not None:
                    until = until.astimezone(UTC).replace(tzinfo=None) + timedelta(days=1)
                walk = walk.replace(until=until)
            for moment in walk:
                if moment > high:
                    break
                if moment >= low:
                    total += 1
                    if total > MAX_EVENTS:
                        raise _Refused(f"more than {MAX_EVENTS} events from {start} to {end}: expected at most "
                                       f"{MAX_EVENTS}")


class _TooMuchWork(BaseException):
    """An iCalendar file whose expansion takes more steps than its budget (the first argument).
    Not an Exception: no ``except Exception`` of the libraries holds it back."""


class _WorkBudget:
    """Counts the steps of the work it wraps and stops it past ``limit`` (_TooMuchWork): a step
    is a Python function call or a generator resumed, in this thread (sys.settrace, which sees
    every one of them; the expansion runs in Python, and each of its loops calls a function or
    resumes a generator every time round). A tracer already set (a debugger, coverage) is kept:
    it sees every call as before. The bound is on work, not on time, so it holds on any
    machine."""

    def __init__(self, limit: int):
        self.limit = limit
        self.steps = 0
        self.previous = None

    def __call__(self, frame, event, arg):
        self.steps += _STEP_WEIGHTS.get(frame.f_code, 1)
        if self.steps > self.limit:
            raise _TooMuchWork(self.limit)
        return self.previous(frame, event, arg) if self.previous is not None else None

    def __enter__(self):
        if not _STEP_WEIGHTS:
            _STEP_WEIGHTS.update(_step_weights())
        self.previous = sys.gettrace()
        sys.settrace(self)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)
        return False


# Steps weighted by their work (measured: about 0.2 to 0.5 microseconds a step, traced): a call
# that walks a whole period of a rule counts the days dateutil looks at (a year, a month, a week
# of a YEARLY, MONTHLY, WEEKLY rule; a day, and its times, of the others), an occurrence of a
# rule (its walk resumed) a few.
_STEP_WEIGHTS: dict = {}


def _step_weights() -> dict:
    from dateutil import rrule

    info = getattr(rrule, "_iterinfo", None)
    weights = {getattr(info, name, None): weight
               for name, weight in (("ydayset", 366), ("mdayset", 31), ("wdayset", 21), ("ddayset", 10))}
    weights[getattr(rrule.rrule, "_iter", None)] = 4
    return {function.__code__: weight for function, weight in weights.items() if hasattr(function, "__code__")} \
        or {None: 1}
