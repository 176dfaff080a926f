"""SQL Server Agent's whole calendar, slot by slot over two years.

``AgentReference`` below is an independent computation of when SQL Server Agent runs a schedule,
written from the sp_add_schedule documentation (the arguments' meanings) and nothing in
shared/jobs/schedules.py: it walks days, weeks and months the way the documentation words them
(every N days from the start date; the days of the bitmask every N weeks; the Nth day, or the
first/second/third/fourth/last Sunday..Saturday, day, weekday or weekend day, every N months;
times from @active_start_time every N seconds/minutes/hours up to @active_end_time), then maps
each wall-clock time to instants in the job's time zone by searching the zone's offsets around
it. The product's answer is ``schedule_from_sqlagent`` (the text) evaluated by ``next_after``,
one slot after the other. Where Microsoft does not say, the rule both follow is the documented
one of docs/moving-from-sql-agent.md: a period (every N weeks or months) counts from the first
day on or after @active_start_date that the schedule selects; weeks begin on Sunday; a monthly
day a month lacks (31 in April) has no run there; a wall time a daylight-saving jump skips runs
once, at the offset in force before the jump; a wall time the fall-back repeats runs in its
first pass, and in both when the schedule runs in every hour of the day (an interval job).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.jobs.schedules import compile_rules, is_extended, parse_schedule, schedule_from_sqlagent

UTC = timezone.utc
WINDOW_START = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW_END = datetime(2028, 3, 31, tzinfo=UTC)        # two years and a quarter: 2028-02-29 included
TODAY = date(2025, 12, 1)
ZONES = ["UTC", "America/New_York", "Europe/London", "Europe/Paris", "Australia/Sydney", "Pacific/Chatham",
         "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata"]


@dataclass
class AgentReference:
    """sp_add_schedule's arguments, as documented, and the wall-clock times they run at."""

    freq_type: int
    freq_interval: int = 1
    freq_subday_type: int = 1
    freq_subday_interval: int = 0
    freq_relative_interval: int = 0
    freq_recurrence_factor: int = 1
    active_start_date: int | None = None
    active_end_date: int = 99991231
    active_start_time: int = 0
    active_end_time: int = 235959
    zone: str = "UTC"
    notes: list = field(default_factory=list)

    @staticmethod
    def _date(value):
        return date(value // 10000, value // 100 % 100, value % 100)

    @staticmethod
    def _seconds(value):
        return (value // 10000) * 3600 + (value // 100 % 100) * 60 + value % 100

    def start(self):
        return TODAY if self.active_start_date is None else self._date(self.active_start_date)

    def end(self):
        return date(9999, 12, 31) if self.active_end_date == 99991231 else self._date(self.active_end_date)

    def times(self):
        """freq_subday_type 1: at active_start_time; 2/4/8: every freq_subday_interval seconds,
        minutes or hours, from active_start_time until active_end_time."""
        first = self._seconds(self.active_start_time)
        if self.freq_subday_type == 1:
            return [first]
        unit = {2: 1, 4: 60, 8: 3600}[self.freq_subday_type]
        out, t = [], first
        while t <= self._seconds(self.active_end_time):
            out.append(t)
            t += self.freq_subday_interval * unit
        return out

    def every_hour(self):
        return {t // 3600 for t in self.times()} == set(range(24))

    # -- days

    def _month_days(self, year, month):
        first = date(year, month, 1)
        return [first + timedelta(days=k) for k in range(31) if (first + timedelta(days=k)).month == month]

    def _monthly_day(self, year, month):
        """The day of this month the schedule names, or None."""
        days = self._month_days(year, month)
        if self.freq_type == 16:
            return next((d for d in days if d.day == self.freq_interval), None)
        # freq_type 32: which (freq_relative_interval) of the freq_interval kind of day.
        kind = self.freq_interval
        if kind <= 7:                 # 1 = Sunday ... 7 = Saturday
            chosen = [d for d in days if d.strftime("%A") == ["Sunday", "Monday", "Tuesday", "Wednesday",
                                                                  "Thursday", "Friday", "Saturday"][kind - 1]]
        elif kind == 8:               # day
            chosen = days
        elif kind == 9:               # weekday
            chosen = [d for d in days if d.strftime("%a") not in ("Sat", "Sun")]
        else:                         # weekend day
            chosen = [d for d in days if d.strftime("%a") in ("Sat", "Sun")]
        index = {1: 0, 2: 1, 4: 2, 8: 3, 16: -1}[self.freq_relative_interval]
        return chosen[index]

    def days(self, last_day):
        start, end = self.start(), min(self.end(), last_day)
        if self.freq_type == 1:
            return [start]
        out = []
        if self.freq_type == 4:
            d = start
            while d <= end:
                out.append(d)
                d += timedelta(days=self.freq_interval)
        elif self.freq_type == 8:
            names = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
            wanted = {names[k] for k in range(7) if self.freq_interval & (1 << k)}
            first = start
            while first.strftime("%A") not in wanted:
                first += timedelta(days=1)
            sunday = first - timedelta(days=names.index(first.strftime("%A")))
            while sunday <= end:
                for k in range(7):
                    d = sunday + timedelta(days=k)
                    if d.strftime("%A") in wanted and start <= d <= end:
                        out.append(d)
                sunday += timedelta(weeks=max(self.freq_recurrence_factor, 1))
        else:
            year, month = start.year, start.month
            while True:           # the first month whose named day is on or after the start
                d = self._monthly_day(year, month)
                if d is not None and d >= start:
                    break
                year, month = (year + 1, 1) if month == 12 else (year, month + 1)
            while date(year, month, 1) <= end:
                d = self._monthly_day(year, month)
                if d is not None and start <= d <= end:
                    out.append(d)
                months = year * 12 + (month - 1) + max(self.freq_recurrence_factor, 1)
                year, month = months // 12, months % 12 + 1
        return out

    # -- instants

    def instants(self, first: datetime, last: datetime) -> list[datetime]:
        zone = ZoneInfo(self.zone)
        out = set()
        times = self.times() if self.freq_type != 1 else [self._seconds(self.active_start_time)]
        both_passes = self.every_hour() and self.freq_type != 1
        for day in self.days(last.date() + timedelta(days=2)):
            if day < first.date() - timedelta(days=2):
                continue
            for t in times:
                wall = datetime(day.year, day.month, day.day) + timedelta(seconds=t)
                for instant in wall_to_instants(wall, zone, both_passes):
                    if first < instant <= last:
                        out.add(instant)
        return sorted(out)

    def arguments(self):
        return {k: getattr(self, k) for k in ("freq_type", "freq_interval", "freq_subday_type",
                                              "freq_subday_interval", "freq_relative_interval",
                                              "freq_recurrence_factor", "active_start_date", "active_end_date",
                                              "active_start_time", "active_end_time")}


@functools.lru_cache(maxsize=None)
def _offsets_near(day: date, zone: ZoneInfo) -> frozenset:
    """Every UTC offset ``zone`` has from two days before ``day`` to two days after, hour by hour."""
    midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return frozenset((midnight + timedelta(hours=hours)).astimezone(zone).utcoffset() for hours in range(-48, 73))


def wall_to_instants(wall: datetime, zone: ZoneInfo, both_passes: bool) -> list[datetime]:
    """Every UTC instant whose local time in ``zone`` is ``wall``, found by trying each offset the
    zone has within a day or two of it; a wall time no instant has (a jump forward) runs at
    the offset in force before the jump, the smaller one."""
    offsets = _offsets_near(wall.date(), zone)
    real = sorted({(wall - offset).replace(tzinfo=UTC) for offset in offsets
                   if ((wall - offset).replace(tzinfo=UTC)).astimezone(zone).replace(tzinfo=None) == wall})
    if not real:
        return [(wall - min(offsets)).replace(tzinfo=UTC)]
    return real if both_passes else real[:1]


def product_instants(text: str, zone: str, first: datetime, last: datetime) -> list[datetime]:
    schedule = parse_schedule(text, zone)
    out, t = [], first
    while True:
        t = schedule.next_after(t)
        if t is None or t > last:
            return out
        out.append(t)


def _cases():
    """Every @freq_type but 64 and 128, with every kind of day and time, in zones with and without
    daylight saving (northern, southern, 30- and 45-minute shifts, midnight changes)."""
    zones = itertools.cycle(ZONES)
    cases = []

    def add(zone=None, **kwargs):
        cases.append(AgentReference(zone=zone or next(zones), **kwargs))

    times = [dict(active_start_time=20000), dict(active_start_time=13000), dict(active_start_time=233000),
             dict(active_start_time=0)]
    # freq_type 32: every relative interval with every kind of day.
    for relative in (1, 2, 4, 8, 16):
        for kind in range(1, 11):
            add(freq_type=32, freq_interval=kind, freq_relative_interval=relative, **times[(relative + kind) % 4])
    # freq_type 32 and 16 every N months, counted from a start date.
    for factor, start in ((2, 20260115), (3, 20260131), (5, 20251120), (7, 20260301)):
        add(freq_type=32, freq_interval=9, freq_relative_interval=16, freq_recurrence_factor=factor,
            active_start_date=start, active_start_time=220000)
        add(freq_type=32, freq_interval=6, freq_relative_interval=8, freq_recurrence_factor=factor,
            active_start_date=start, active_start_time=10000)
        add(freq_type=16, freq_interval=15, freq_recurrence_factor=factor, active_start_date=start,
            active_start_time=23000)
    for day in (1, 15, 28, 29, 30, 31):
        add(freq_type=16, freq_interval=day, active_start_time=20000)
    # freq_type 8: day sets, every N weeks from start dates on every day of the week.
    for bits, factor, start in ((2, 1, 20260101), (42, 2, 20260107), (65, 3, 20260103), (127, 2, 20260105),
                                (62, 4, 20260108), (1, 2, 20260110), (64, 1, None)):
        add(freq_type=8, freq_interval=bits, freq_recurrence_factor=factor, active_start_date=start,
            active_start_time=13000)
    # freq_type 4: every N days from a start date, with active end dates.
    for interval, start, end in ((1, None, 99991231), (2, 20260102, 99991231), (3, 20251230, 20270615),
                                 (10, 20260301, 99991231), (30, 20260131, 99991231)):
        add(freq_type=4, freq_interval=interval, active_start_date=start, active_end_date=end,
            active_start_time=20000)
    # Times within the day: every N seconds, minutes or hours in a window (those that are one
    # NCRONTAB, and those that are not), across midnight-adjacent and DST hours.
    windows = [
        (4, 15, 0, 235959), (4, 7, 80300, 174500), (8, 1, 0, 235959), (8, 5, 13000, 235959),
        (8, 3, 10000, 220000), (4, 45, 0, 235959), (4, 1, 10000, 30000), (2, 30, 15900, 20200),
        (2, 45, 235800, 235959), (8, 2, 0, 230000), (4, 90, 5, 235959), (4, 13, 0, 235959),
    ]
    for subday, interval, first, last in windows:
        add(freq_type=4, freq_interval=1, freq_subday_type=subday, freq_subday_interval=interval,
            active_start_time=first, active_end_time=last)
    # Every 2 hours from midnight where the fall-back repeats 02:00-02:59: hours 0,2,...,22 are a
    # list (first pass only), not an interval over every hour.
    add(zone="Europe/Paris", freq_type=4, freq_interval=1, freq_subday_type=8, freq_subday_interval=2,
        active_start_time=0, active_end_time=235959)
    add(zone="Europe/Paris", freq_type=4, freq_interval=1, freq_subday_type=4, freq_subday_interval=30,
        active_start_time=0, active_end_time=235959)
    add(freq_type=8, freq_interval=1, freq_recurrence_factor=1, freq_subday_type=4, freq_subday_interval=20,
        active_start_time=10000, active_end_time=35959)
    add(freq_type=32, freq_interval=1, freq_relative_interval=1, freq_subday_type=8, freq_subday_interval=1,
        active_start_time=0, active_end_time=235959)
    # freq_type 1: once, including a wall time a jump skips and one a fall-back repeats.
    for start, at in ((20260308, 23000), (20261101, 13000), (20261004, 23000), (20270404, 23000),
                      (20260329, 13000)):
        add(freq_type=1, active_start_date=start, active_start_time=at)
    return cases


CASES = _cases()


def _slots_per_day(case):
    return len(case.times())


# Nine days around each daylight-saving change of 2026 in ZONES (United States, Europe, the
# southern zones in April and September/October) and a plain fortnight.
_CHANGES = [date(2026, 3, 8), date(2026, 3, 29), date(2026, 4, 5), date(2026, 9, 6), date(2026, 9, 27),
            date(2026, 10, 4), date(2026, 10, 25), date(2026, 11, 1), date(2027, 6, 7)]
DST_WINDOWS = [(datetime(d.year, d.month, d.day, tzinfo=UTC) - timedelta(days=4),
                datetime(d.year, d.month, d.day, tzinfo=UTC) + timedelta(days=5)) for d in _CHANGES]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.arguments().values()) + "@" + c.zone)
def test_every_slot_over_two_years_matches_sql_agent(case):
    """Slot by slot from 2026-01-01 to 2028-03-31; a schedule with more than 24 runs a day (tens of
    thousands of slots) is compared over nine days around every daylight-saving change instead."""
    text = schedule_from_sqlagent(**case.arguments(), today=TODAY)
    windows = [(WINDOW_START, WINDOW_END)] if _slots_per_day(case) <= 24 else DST_WINDOWS
    expected, got = [], []
    for first, last in windows:
        expected += case.instants(first, last)
        got += product_instants(text, case.zone, first, last)
    assert expected, "the reference has no slot in the window: a case that checks nothing"
    if got != expected:
        missing = sorted(set(expected) - set(got))[:5]
        extra = sorted(set(got) - set(expected))[:5]
        pytest.fail(f"{text!r} in {case.zone}: {len(got)} slots, SQL Agent {len(expected)}; "
                    f"missing {missing}, extra {extra}")


def test_the_cases_cover_every_freq_type_kind_and_dst_zone():
    kinds = {(c.freq_type, c.freq_interval if c.freq_type == 32 else None, c.freq_relative_interval)
             for c in CASES if c.freq_type == 32}
    assert len({(k, r) for _, k, r in kinds}) == 50           # 10 kinds of day x 5 relative intervals
    assert {c.freq_type for c in CASES} == {1, 4, 8, 16, 32}
    assert {c.freq_subday_type for c in CASES} == {1, 2, 4, 8}
    assert set(ZONES) <= {c.zone for c in CASES}


def test_the_reference_runs_a_missed_hour_once_and_a_repeated_one_as_documented():
    """The reference's own DST mapping, on known instants (New York, 2026)."""
    ny = ZoneInfo("America/New_York")
    assert wall_to_instants(datetime(2026, 3, 8, 2, 30), ny, False) == [datetime(2026, 3, 8, 7, 30, tzinfo=UTC)]
    assert wall_to_instants(datetime(2026, 11, 1, 1, 30), ny, False) == [datetime(2026, 11, 1, 5, 30, tzinfo=UTC)]
    assert wall_to_instants(datetime(2026, 11, 1, 1, 30), ny, True) == [
        datetime(2026, 11, 1, 5, 30, tzinfo=UTC), datetime(2026, 11, 1, 6, 30, tzinfo=UTC)]


@pytest.mark.parametrize("arguments, expected", [
    (dict(freq_type=64), "@freq_type=64 (when SQL Server Agent starts)"),
    (dict(freq_type=128), "@freq_type=128 (when the computer is idle)"),
    (dict(freq_type=0), "@freq_type=0: expected 1, 4, 8, 16 or 32"),
    (dict(freq_type=4, freq_interval=0), "@freq_interval=0: expected a number of days"),
    (dict(freq_type=8, freq_interval=0), "@freq_interval=0: expected days of the week"),
    (dict(freq_type=8, freq_interval=128), "@freq_interval=128: expected days of the week"),
    (dict(freq_type=16, freq_interval=32), "@freq_interval=32: expected a day of the month"),
    (dict(freq_type=32, freq_interval=11, freq_relative_interval=1), "@freq_interval=11: expected 1 (Sunday)"),
    (dict(freq_type=32, freq_interval=1, freq_relative_interval=3), "@freq_relative_interval=3: expected 1"),
    (dict(freq_type=4, freq_subday_type=4, freq_subday_interval=0), "@freq_subday_interval=0: expected 1"),
    (dict(freq_type=4, freq_subday_type=3), "@freq_subday_type=3: expected 1"),
    (dict(freq_type=4, freq_subday_type=4, freq_subday_interval=5, active_start_time=220000,
          active_end_time=20000), "@active_end_time=20000: expected a time at or after"),
    (dict(freq_type=4, active_start_time=246000), "@active_start_time=246000: expected a time as HHMMSS"),
    (dict(freq_type=4, active_start_date=20260230), "@active_start_date=20260230: expected a date as YYYYMMDD"),
    (dict(freq_type=4, active_start_date=20260301, active_end_date=20260201),
     "@active_end_date=20260201: expected a date on or after"),
    (dict(freq_type=16, freq_interval=1, freq_recurrence_factor=121, active_start_date=20260101),
     "every 121 months: expected at most 120"),
])
def test_sp_add_schedule_arguments_that_have_no_schedule_are_refused_by_name(arguments, expected):
    with pytest.raises(ValueError) as error:
        schedule_from_sqlagent(**arguments, today=TODAY)
    assert expected in str(error.value)


def test_the_texts_are_readable_and_plain_when_ncrontab_says_it_all():
    assert schedule_from_sqlagent(freq_type=4, active_start_time=20000, today=TODAY) == "0 0 2 * * *"
    assert schedule_from_sqlagent(freq_type=4, freq_subday_type=4, freq_subday_interval=15,
                                  today=TODAY) == "0 */15 * * * *"
    assert schedule_from_sqlagent(freq_type=32, freq_interval=9, freq_relative_interval=16,
                                  active_start_time=220000, today=TODAY) == "0 0 22 * * MON-FRI#L"
    assert schedule_from_sqlagent(
        freq_type=8, freq_interval=42, freq_recurrence_factor=2, freq_subday_type=8, freq_subday_interval=1,
        active_start_time=80000, active_end_time=180000, active_start_date=20260105,
        today=TODAY) == "0 0 8-18 * * 1,3,5 ; every 2 weeks ; from 2026-01-05"
    text = schedule_from_sqlagent(freq_type=4, freq_subday_type=4, freq_subday_interval=7,
                                  active_start_time=80300, active_end_time=174500, today=TODAY)
    assert text == "* * 8-17 * * * ; every 7 minutes ; between 08:03:00 and 17:45:00"
    assert is_extended(text) and not is_extended("0 0 2 * * WED")
    assert compile_rules(text).text == text      # normalised text parses to itself
