"""Calendars hardened (issue 33, the attack on shared/jobs/calendars.py):

1. an iCalendar file that expands to too much (a DTSTART long before the window, BY lists that
   multiply occurrences, RDATE and EXDATE lists, many events, a rule that never matches) is
   refused naming the setting and the file, within a bounded amount of work, counted here
   call by call (sys.settrace) and not timed (a time only as a generous backstop);
2. ON_EXCLUDED=next over calendars that exclude (almost) everything costs little and is
   bounded: calls counted, the answer None beyond the horizon;
3. weekly windows and dates whose bounds fall in a daylight-saving gap or in the repeated hour:
   a window starting in a gap starts at the first instant after it (one wholly in the gap is
   moved forward by the gap, as cron moves a time that does not exist); a repeated local time is
   held in both passes; checked against an oracle minute by minute around the changes.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.jobs import calendars as cal
from shared.jobs.calendars import CalendarRules, parse_calendars
from shared.jobs.from_settings import parse_jobs

UTC = timezone.utc
TODAY = date(2026, 6, 1)          # the expansion window: 2025-01-01 to 2029-01-01


class Calls:
    """Counts the Python calls (and generator resumes) made inside it, as _WorkBudget does:
    a measure of work that does not depend on the machine."""

    def __init__(self):
        self.count = 0

    def __call__(self, frame, event, arg):
        self.count += 1
        return None

    def __enter__(self):
        self.previous = sys.gettrace()
        sys.settrace(self)
        return self

    def __exit__(self, *exc):
        sys.settrace(self.previous)
        return False


def ics(*events: str) -> str:
    return ("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nPRODID:-//test//EN\r\n"
            + "".join(f"BEGIN:VEVENT\r\nUID:{i}@test\r\n{body}END:VEVENT\r\n" for i, body in enumerate(events))
            + "END:VCALENDAR\r\n")


def timed(start: str, rule: str | None = None, extra: str = "") -> str:
    return (f"DTSTART:{start}\r\nDTEND:{start[:-4]}100Z\r\n" + (f"RRULE:{rule}\r\n" if rule else "") + extra)


def utc_list(first: datetime, count: int, step: timedelta) -> str:
    return ",".join((first + k * step).strftime("%Y%m%dT%H%M%SZ") for k in range(count))


# The bound on the work of refusing any of these: the two budgets of the expansion (the rules'
# walk, then the expansion, with twice the walk) and the parse of a small file. The steps of the
# budgets are weighted (a step is at least one call), so the calls are at most these.
MOST_CALLS = 3 * cal.ICS_RULE_BUDGET + cal.ICS_WORK_BUDGET + 500_000

BOMBS = {
    # a DTSTART long before the window: the expansion walks from it
    "dtstart_far_back": (ics(timed("10000101T000000Z", "FREQ=MINUTELY;INTERVAL=1000")), "takes more than"),
    "dtstart_far_back_daily": (ics(timed("10000101T000000Z", "FREQ=DAILY")), "takes more than"),
    # BY lists that multiply the occurrences of a period (BYDAY in a YEARLY rule: every Monday)
    "byday_multiplies": (ics(timed("19000101T000000Z", "FREQ=YEARLY;BYDAY=MO;BYHOUR=" + ",".join(map(str, range(24)))
                                   + ";BYMINUTE=" + ",".join(map(str, range(0, 60, 2))))), "takes more than"),
    "by_lists_in_the_window": (ics(timed("20260101T000000Z", "FREQ=YEARLY;BYMONTH=1,2,3,4,5,6,7,8,9,10,11,12;"
                                         "BYMONTHDAY=" + ",".join(map(str, range(1, 32))) + ";BYHOUR=1,2,3;BYMINUTE=0,30")),
                               "more than 5000 events from 2025-01-01 to 2029-01-01"),
    "secondly": (ics(timed("20260101T000000Z", "FREQ=SECONDLY")), "more than 5000 events"),
    # a rule that never matches walks on to the year 9999 (dateutil), one that rarely does far
    "never_matching_daily_x3": (ics(*[timed("20260101T000000Z", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30")] * 3),
                                "takes more than"),
    "never_matching_hourly": (ics(timed("20260101T000000Z", "FREQ=HOURLY;BYMONTH=4;BYMONTHDAY=31")), "takes more than"),
    "never_matching_weekly": (ics(timed("20260101T000000Z", "FREQ=WEEKLY;BYMONTH=2;BYMONTHDAY=30")),
                              "takes more than"),
    # RDATE and EXDATE lists
    "rdate_list": (ics(timed("20260101T000000Z", None, "RDATE:" + utc_list(datetime(2026, 1, 1, tzinfo=UTC), 5001,
                                                                       timedelta(hours=1)) + "\r\n")),
                   "more than 5000 RDATE values"),
    "rdates_over_events": (ics(*[timed("20260101T000000Z", None, "RDATE:" + utc_list(
        datetime(2026, 1, 1, k, tzinfo=UTC), 1000, timedelta(days=1)) + "\r\n") for k in range(6)]),
        "more than 5000 RDATE values"),
    "exdate_list": (ics(timed("20260101T000000Z", "FREQ=DAILY;COUNT=10", "EXDATE:" + utc_list(
        datetime(2026, 1, 1, tzinfo=UTC), 5001, timedelta(minutes=1)) + "\r\n")), "more than 5000 EXDATE values"),
    # many events: each just under any limit of its own
    "many_events": (ics(*[timed("20260101T000000Z")] * 5001), "more than 5000 events (VEVENT)"),
    "many_events_far_back": (ics(*[timed("19000101T000000Z", "FREQ=WEEKLY;INTERVAL=52;BYDAY=MO")] * 1500),
                             "takes more than"),
    "many_events_each_under": (ics(*[timed("20260101T000000Z", "FREQ=HOURLY;COUNT=4999")] * 3),
                               "more than 5000 events from 2025-01-01 to 2029-01-01"),
    "many_rules": (ics("DTSTART:20260101T000000Z\r\n" + "RRULE:FREQ=YEARLY\r\n" * 11), "11 RRULE lines"),
}


# Counted call by call (slow: a Python tracer on every call) for one bomb of each kind; the
# others are refused the same way, within the same budgets.
COUNTED = {"dtstart_far_back", "byday_multiplies", "never_matching_daily_x3", "rdate_list", "many_events_far_back",
           "many_rules"}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_an_ics_bomb_is_refused_within_bounded_work_naming_the_setting_and_file(tmp_path, name):
    text, expected = BOMBS[name]
    path = tmp_path / f"{name}.ics"
    path.write_text(text)
    env = {"CALENDAR__bomb__ICS": str(path), "CALENDAR__fine__DATES": "2026-12-25"}
    started = time.perf_counter()
    parsed = parse_calendars(env, today=TODAY)
    elapsed = time.perf_counter() - started
    assert set(parsed.calendars) == {"fine"}          # the other calendar stands
    (error,) = parsed.invalid["bomb"]
    assert error.startswith(f"CALENDAR__bomb__ICS={str(path)!r}: ") and expected in error, error
    assert "expected at most" in error, error
    assert elapsed < 30, elapsed     # a backstop only (about 2 s on an idle machine): the bound is the count below
    # read again unchanged: the refusal is kept, no work
    with Calls() as again:
        assert parse_calendars(env, today=TODAY).invalid["bomb"] == (error,)
    assert again.count < 2000, again.count
    if name in COUNTED:
        cal._ICS_READ.clear()
        with Calls() as calls:
            assert parse_calendars(env, today=TODAY).invalid["bomb"] == (error,)
        assert calls.count <= MOST_CALLS, (calls.count, MOST_CALLS)


def test_the_counts_are_checked_on_the_parsed_file_too():
    """The lines are counted before the parse (cheap); the parsed events are counted again, exactly:
    a folded RDATE line over the limit is refused by both, one under it by neither."""
    import icalendar

    folded = ics(timed("20260101T000000Z", None, "RDATE:" + utc_list(datetime(2026, 1, 1, tzinfo=UTC), 5001,
                                                                     timedelta(hours=1)).replace(",", ",\r\n ", 50) + "\r\n"))
    with pytest.raises(ValueError, match="more than 5000 RDATE values"):
        cal._count_lines(folded, "expected ...")
    with pytest.raises(ValueError, match="more than 5000 RDATE values"):
        cal._check_sizes(icalendar.Calendar.from_ical(folded).walk("VEVENT"), "expected ...")
    fine = ics(timed("20260101T000000Z", None, "RDATE:" + utc_list(datetime(2026, 1, 1, tzinfo=UTC), 4999,
                                                                   timedelta(hours=1)) + "\r\n"))
    cal._count_lines(fine, "expected ...")
    cal._check_sizes(icalendar.Calendar.from_ical(fine).walk("VEVENT"), "expected ...")


def test_the_work_budget_stops_a_walk_that_never_yields_and_keeps_the_tracer_before_it():
    from dateutil.rrule import rrulestr

    rule = rrulestr("FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30", dtstart=datetime(2026, 1, 1))
    with Calls() as outer:
        with pytest.raises(cal._TooMuchWork):
            with cal._WorkBudget(100_000) as budget:
                list(rule)
        assert sys.gettrace() is outer                 # restored
    assert 100_000 < budget.steps <= 100_000 + 400     # stopped at the first step past the limit
    assert outer.count >= budget.steps // 10          # the tracer before it saw the calls too


HOLIDAYS = ics(*[f"DTSTART;VALUE=DATE:1970{1 + k % 12:02d}{1 + k % 28:02d}\r\nRRULE:FREQ=YEARLY\r\n" for k in range(30)],
               "DTSTART;TZID=Europe/London:20150105T090000\r\nDTEND;TZID=Europe/London:20150105T100000\r\n"
               "RRULE:FREQ=WEEKLY;BYDAY=MO,WE,FR\r\nEXDATE;TZID=Europe/London:20260107T090000\r\n",
               "DTSTART:20260401T120000Z\r\nDTEND:20260401T130000Z\r\nRDATE:20260402T120000Z,20260403T120000Z\r\n")


def test_a_real_calendar_file_with_rules_from_1970_is_read_whole(tmp_path):
    path = tmp_path / "holidays.ics"
    path.write_text(HOLIDAYS)
    parsed = parse_calendars({"CALENDAR__h__ICS": str(path)}, today=TODAY)
    assert not parsed.invalid, parsed.invalid
    calendar = parsed.calendars["h"]
    # 30 yearly all-day events over 2025-2028, each its own date or a repeat of another's
    assert {(a.month, a.day) for a, _b in calendar.dates} == {(1 + k % 12, 1 + k % 28) for k in range(30)}
    assert all(a.year in (2025, 2026, 2027, 2028) and a == b for a, b in calendar.dates)
    london = ZoneInfo("Europe/London")
    assert calendar.contains(datetime(2027, 3, 3, 9, 30, tzinfo=UTC), london)          # a Wednesday, GMT
    assert not calendar.contains(datetime(2026, 1, 7, 9, 30, tzinfo=UTC), london)      # a Wednesday, the EXDATE
    assert calendar.contains(datetime(2026, 1, 9, 9, 30, tzinfo=UTC), london)          # the Friday after
    assert calendar.contains(datetime(2026, 4, 3, 12, 30, tzinfo=UTC), london)         # an RDATE


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "c.ics"
    path.write_text(ics(timed("20260101T000000Z")))
    first = parse_calendars({"CALENDAR__c__ICS": str(path)}, today=TODAY).calendars["c"]
    path.write_text(ics(timed("20260102T000000Z"), timed("20260103T000000Z")))
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    second = parse_calendars({"CALENDAR__c__ICS": str(path)}, today=TODAY).calendars["c"]
    assert len(first.events) == 1 and len(second.events) == 2


@pytest.mark.parametrize("kind", ["named_pipe", "device", "directory"])
def test_an_ics_path_that_is_no_regular_file_is_refused_at_once(tmp_path, kind):
    """An attack: a named pipe as the calendar file hung every tick (open waits for a writer)."""
    path = {"named_pipe": tmp_path / "pipe.ics", "device": "/dev/zero", "directory": tmp_path}[kind]
    if kind == "named_pipe":
        os.mkfifo(path)
    started = time.monotonic()
    parsed = parse_calendars({"CALENDAR__c__ICS": str(path)}, today=TODAY)
    assert "not a regular file" in parsed.invalid["c"][0] and "CALENDAR__c__ICS" in parsed.invalid["c"][0]
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------- 2. calendars excluding (almost) everything

LONDON = ZoneInfo("Europe/London")
# 2,000 dates in a row, each its own item (the most a calendar takes): the old walk stepped a
# day at a time, each step over every date
EVERY_DAY_FOR_YEARS = ",".join((date(2026, 1, 1) + timedelta(days=k)).isoformat() for k in range(2000))


def daily_ics(tmp_path) -> str:
    path = tmp_path / "daily.ics"
    path.write_text(ics("DTSTART;TZID=America/New_York:20250101T020000\r\nDTEND;TZID=America/New_York:20250101T030000\r\n"
                        "RRULE:FREQ=DAILY\r\n"))
    return str(path)


def rules_of(env, exclude=(), only=(), today=TODAY):
    parsed = parse_calendars(env, today=today)
    assert not parsed.invalid, parsed.invalid
    return CalendarRules(exclude=tuple(parsed.calendars[n] for n in exclude),
                         only=tuple(parsed.calendars[n] for n in only), on_excluded="next")


@pytest.mark.parametrize("case", ["dates_for_years", "every_hour_every_day", "only_never_occurs",
                                  "only_a_minute_a_week_all_excluded"])
def test_next_allowed_over_calendars_excluding_everything_is_bounded_and_none(tmp_path, case):
    hours = ",".join(f"SUN-SAT {h:02d}:00-{h + 1:02d}:00" for h in range(24))
    env, exclude, only = {
        "dates_for_years": ({"CALENDAR__a__DATES": EVERY_DAY_FOR_YEARS, "CALENDAR__e__ICS": daily_ics(tmp_path)},
                            ("a", "e"), ()),
        "every_hour_every_day": ({"CALENDAR__w__WEEKLY": hours}, ("w",), ()),
        "only_never_occurs": ({"CALENDAR__p__DATES": "2020-01-01", "CALENDAR__a__DATES": EVERY_DAY_FOR_YEARS},
                              ("a",), ("p",)),
        "only_a_minute_a_week_all_excluded": ({"CALENDAR__o__WEEKLY": "MON 09:00-09:01",
                                               "CALENDAR__a__DATES": EVERY_DAY_FOR_YEARS,
                                               "CALENDAR__e__ICS": daily_ics(tmp_path)}, ("a", "e"), ("o",)),
    }[case]
    rules = rules_of(env, exclude, only)
    with Calls() as cold:
        assert rules.next_allowed(datetime(2026, 6, 1, 12, tzinfo=UTC), LONDON) is None
    # cold: the pieces of the 14 months of the horizon, once (the old walk stepped up to 2000
    # times over every date and event of every calendar)
    assert cold.count < 400_000, cold.count
    with Calls() as warm:
        for minute in range(60):               # a tick deciding 60 slots of a minutely job
            moment = datetime(2026, 6, 2, 12, minute, tzinfo=UTC)
            assert rules.why_excluded(moment, LONDON) is not None
            assert rules.next_allowed(moment, LONDON) is None
    assert warm.count < 60 * 120, warm.count


def test_next_allowed_finds_a_far_allowed_time_past_thousands_of_pieces():
    # one allowed minute a day (23:59), and only on 2027-03-01: 273 days and 273 pieces on
    rules = rules_of({"CALENDAR__w__WEEKLY": "SUN-SAT 00:00-23:59", "CALENDAR__d__DATES": "2027-03-01"}, ("w",), ("d",))
    assert rules.next_allowed(datetime(2026, 6, 1, tzinfo=UTC), LONDON) == datetime(2027, 3, 1, 23, 59, tzinfo=UTC)
    # 2,800 excluded pieces of 20 minutes with 10-minute gaps, a gap a day left open from 2026-09-01
    windows = ",".join(f"SUN-SAT {h:02d}:{m:02d}-{h:02d}:{m + 20:02d}" for h in range(24) for m in (0, 30))
    rules = rules_of({"CALENDAR__w__WEEKLY": windows, "CALENDAR__x__DATES": "2026-06-01..2026-08-31",
                      "CALENDAR__o__WEEKLY": "SUN-SAT 12:25-12:30"}, ("w", "x"), ("o",))
    with Calls() as calls:
        found = rules.next_allowed(datetime(2026, 6, 1, tzinfo=UTC), LONDON)
    assert found == datetime(2026, 9, 1, 11, 25, tzinfo=UTC)           # 12:25 BST
    assert calls.count < 400_000, calls.count


def test_the_horizon_is_a_year_and_a_stretch_within_it_is_crossed_at_once():
    rules = rules_of({"CALENDAR__x__DATES": "2026-01-01..2027-05-15"}, ("x",))
    assert rules.next_allowed(datetime(2026, 6, 1, tzinfo=UTC), LONDON) == datetime(2027, 5, 15, 23, tzinfo=UTC)
    rules = rules_of({"CALENDAR__x__DATES": "2026-01-01..2027-06-30"}, ("x",))
    assert rules.next_allowed(datetime(2026, 6, 1, tzinfo=UTC), LONDON) is None      # 395 days on


def test_a_job_naming_too_many_calendars_is_refused_naming_the_setting():
    env = {f"CALENDAR__c{k}__DATES": "2026-12-25" for k in range(cal.MAX_CALENDARS_PER_JOB + 1)}
    env.update({"JOB__many__SCHEDULE": "0 0 2 * * *", "JOB__many__COMMAND": "SELECT 1",
                "JOB__many__EXCLUDE": ",".join(f"c{k}" for k in range(cal.MAX_CALENDARS_PER_JOB + 1)),
                "JOB__fine__SCHEDULE": "0 0 2 * * *", "JOB__fine__COMMAND": "SELECT 1",
                "JOB__fine__ONLY": ",".join(f"c{k}" for k in range(cal.MAX_CALENDARS_PER_JOB))})
    jobs, invalid = parse_jobs(env)
    assert [j.name for j in jobs] == ["fine"]
    (bad,) = invalid
    text = str(bad.error if hasattr(bad, "error") else bad)
    assert "JOB__many__EXCLUDE=" in text and f"at most {cal.MAX_CALENDARS_PER_JOB} calendar names" in text, text
    assert "(this names 21)" in text


def test_a_database_job_naming_too_many_calendars_is_refused_naming_the_parameter():
    from shared.engine.planning import calendar_verdict

    defined = {f"c{k}": cal.Calendar(name=f"c{k}", dates=((date(2026, 12, 25), date(2026, 12, 25)),))
               for k in range(cal.MAX_CALENDARS_PER_JOB + 1)}
    names = ",".join(defined)
    error, rules = calendar_verdict({"requested_exclude": names}, defined)
    assert rules is None and error.startswith("agent.set_job_calendars @exclude_calendars='c0,c1,") and \
        f"expected at most {cal.MAX_CALENDARS_PER_JOB} calendar names" in error, error
    error, rules = calendar_verdict({"requested_only": names.rpartition(",")[0]}, defined)
    assert error is None and len(CalendarRules.from_json(rules).only) == cal.MAX_CALENDARS_PER_JOB


# ---------------------------------------------------------------- 3. daylight saving: gaps and repeated hours

def held(zone: ZoneInfo, windows: list[tuple[int, int, int]], dates: set[date], moment: datetime) -> bool:
    """The oracle: ``moment``'s local time in one of the windows (weekday 0 = Sunday, start and
    end minutes of the day, an end at or before the start into the next day) or its local date
    in ``dates``."""
    local = moment.astimezone(zone)
    if local.date() in dates:
        return True
    weekday, minute = int(local.strftime("%w")), local.hour * 60 + local.minute
    for day, start, end in windows:
        if end > start and weekday == day and start <= minute < end:
            return True
        if end <= start and ((weekday == day and minute >= start) or ((weekday - 1) % 7 == day and minute < end)):
            return True
    return False


DAYS = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}
ZONES = {
    # zone: (the spring change, the autumn change) of 2026, as local dates
    "Europe/London": (date(2026, 3, 29), date(2026, 10, 25)),          # 01:00 -> 02:00, 02:00 -> 01:00
    "America/New_York": (date(2026, 3, 8), date(2026, 11, 1)),         # 02:00 -> 03:00, 02:00 -> 01:00
    "Australia/Lord_Howe": (date(2026, 10, 4), date(2026, 4, 5)),      # 02:00 -> 02:30, 02:00 -> 01:30
    "America/Havana": (date(2026, 3, 8), date(2026, 11, 1)),           # 00:00 -> 01:00, 01:00 -> 00:00
    "America/Santiago": (date(2026, 9, 6), date(2026, 4, 5)),          # 00:00 -> 01:00, 00:00 -> 23:00
}
WINDOWS = "SUN 00:30-01:15, SUN 01:30-03:00, SUN 02:15-02:45, SUN 23:30-00:45, SAT 23:50-00:10, SUN 01:00-01:30, SUN 01:45-02:40"


def minutes(first: datetime, count: int, test) -> list[bool]:
    return [test(first + timedelta(minutes=k)) for k in range(count)]


def next_true(flags: list[bool]) -> list[int | None]:
    """For each minute, the first minute at or after it whose flag is set (None: none)."""
    out: list[int | None] = [None] * len(flags)
    following = None
    for k in range(len(flags) - 1, -1, -1):
        if flags[k]:
            following = k
        out[k] = following
    return out


def wholly_in_a_gap(zone: ZoneInfo, day: date, start: int, end: int) -> bool:
    """Whether no local time of the window [start, end) minutes of ``day`` exists."""
    for minute in range(start, end if end > start else end + 1440):
        local = datetime.combine(day, datetime.min.time()) + timedelta(minutes=minute)
        aware = local.replace(tzinfo=zone)
        if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == local:
            return False
    return True


@pytest.mark.parametrize("zone_name", sorted(ZONES))
@pytest.mark.parametrize("window", [w.strip() for w in WINDOWS.split(",")])
def test_windows_and_dates_around_daylight_saving_changes_hold_their_local_times(zone_name, window):
    """Minute by minute over four days around each change, against the oracle: what the
    calendars hold, the next allowed time with them EXCLUDEd, and with the window as ONLY."""
    zone = ZoneInfo(zone_name)
    spring, autumn = ZONES[zone_name]
    day, times = window.split()
    start, end = (int(t[:2]) * 60 + int(t[3:]) for t in times.split("-"))
    windows = [(DAYS[day], start, end)]
    dates = {spring - timedelta(days=1), autumn}
    rules = rules_of({"CALENDAR__w__WEEKLY": window,
                      "CALENDAR__d__DATES": ",".join(d.isoformat() for d in sorted(dates))}, ("w", "d"))
    only = rules_of({"CALENDAR__w__WEEKLY": window}, (), ("w",))
    checked = 0
    for change in (spring, autumn):
        window_day = change if DAYS[day] == int(change.strftime("%w")) else change - timedelta(days=1)
        if wholly_in_a_gap(zone, window_day, start, end):
            continue        # moved forward by the gap: test_an_only_window_starting_in_the_spring_gap_...
        first = datetime.combine(change - timedelta(days=2), datetime.min.time(), tzinfo=UTC)
        span = 12 * 1440            # the ONLY window comes back within a week
        excluded = minutes(first, span, lambda m: held(zone, windows, dates, m))
        allowed_next = next_true([not flag for flag in excluded])
        inside_next = next_true(minutes(first, span, lambda m: held(zone, windows, set(), m)))
        for k in range(0, 4 * 1440, 5):
            moment = first + timedelta(minutes=k)
            assert (rules.why_excluded(moment, zone) is not None) == excluded[k], (moment, moment.astimezone(zone))
            if k % 35 == 0:
                expected = allowed_next[k]
                assert rules.next_allowed(moment, zone) == first + timedelta(minutes=expected), (moment, expected)
                expected = inside_next[k]
                assert only.next_allowed(moment, zone) == first + timedelta(minutes=expected), (moment, expected)
            checked += 1
    assert checked >= 1152


def test_an_only_window_starting_in_the_spring_gap_starts_when_the_gap_ends():
    # Europe/London 2026-03-29: 01:00 GMT -> 02:00 BST; a SUN 01:30-03:00 window starts at 02:00 BST
    london = rules_of({"CALENDAR__w__WEEKLY": "SUN 01:30-03:00"}, (), ("w",))
    assert london.next_allowed(datetime(2026, 3, 28, 12, tzinfo=UTC), LONDON) == datetime(2026, 3, 29, 1, tzinfo=UTC)
    # America/New_York 2026-03-08: 02:00 EST -> 03:00 EDT; SUN 02:30-04:00 starts at 03:00 EDT
    ny = ZoneInfo("America/New_York")
    rules = rules_of({"CALENDAR__w__WEEKLY": "SUN 02:30-04:00"}, (), ("w",))
    assert rules.next_allowed(datetime(2026, 3, 7, 12, tzinfo=UTC), ny) == datetime(2026, 3, 8, 7, tzinfo=UTC)
    assert rules.why_excluded(datetime(2026, 3, 8, 6, 59, tzinfo=UTC), ny) is not None           # 01:59 EST
    assert rules.why_excluded(datetime(2026, 3, 8, 7, 0, tzinfo=UTC), ny) is None                # 03:00 EDT
    # wholly in the gap: moved forward by the gap (01:15-01:45 -> 02:15-02:45 BST), the week kept
    rules = rules_of({"CALENDAR__w__WEEKLY": "SUN 01:15-01:45"}, (), ("w",))
    assert rules.next_allowed(datetime(2026, 3, 28, 12, tzinfo=UTC), LONDON) == datetime(2026, 3, 29, 1, 15, tzinfo=UTC)
    assert rules.why_excluded(datetime(2026, 3, 29, 1, 44, tzinfo=UTC), LONDON) is None
    assert rules.why_excluded(datetime(2026, 3, 29, 1, 45, tzinfo=UTC), LONDON) is not None
    # the week after: the window as usual (01:15 BST)
    assert rules.next_allowed(datetime(2026, 3, 30, tzinfo=UTC), LONDON) == datetime(2026, 4, 5, 0, 15, tzinfo=UTC)
    # New York, wholly in its gap: 03:10 EDT (the old walk stepped 2,000 times on the same instant
    # and answered None: the week's run lost)
    in_gap = rules_of({"CALENDAR__w__WEEKLY": "SUN 02:10-02:50"}, (), ("w",))
    assert in_gap.next_allowed(datetime(2026, 3, 7, 12, tzinfo=UTC), ny) == datetime(2026, 3, 8, 7, 10, tzinfo=UTC)


def test_a_window_in_the_repeated_hour_is_held_in_both_passes():
    # Europe/London 2026-10-25: 02:00 BST -> 01:00 GMT; 01:00-01:30 happens at 00:00Z and at 01:00Z
    rules = rules_of({"CALENDAR__w__WEEKLY": "SUN 01:00-01:30"}, (), ("w",))
    assert rules.next_allowed(datetime(2026, 10, 24, 12, tzinfo=UTC), LONDON) == datetime(2026, 10, 25, 0, tzinfo=UTC)
    assert rules.next_allowed(datetime(2026, 10, 25, 0, 30, tzinfo=UTC), LONDON) == datetime(2026, 10, 25, 1, tzinfo=UTC)
    assert rules.next_allowed(datetime(2026, 10, 25, 1, 30, tzinfo=UTC), LONDON) == datetime(2026, 11, 1, 1, tzinfo=UTC)
    excluded = rules_of({"CALENDAR__w__WEEKLY": "SUN 01:00-01:30"}, ("w",))
    assert excluded.next_allowed(datetime(2026, 10, 25, 0, 10, tzinfo=UTC), LONDON) == datetime(2026, 10, 25, 0, 30,
                                                                                                  tzinfo=UTC)
    assert excluded.why_excluded(datetime(2026, 10, 25, 1, 10, tzinfo=UTC), LONDON) == "calendar: w"    # 01:10 GMT
    assert excluded.why_excluded(datetime(2026, 10, 25, 0, 40, tzinfo=UTC), LONDON) is None             # 01:40 BST


def test_excluded_dates_whose_midnight_is_skipped_or_repeated():
    havana = ZoneInfo("America/Havana")         # 2026-03-08 00:00 does not exist (-> 01:00 CDT)
    rules = rules_of({"CALENDAR__x__DATES": "2026-03-08"}, ("x",))
    assert rules.why_excluded(datetime(2026, 3, 8, 4, 59, tzinfo=UTC), havana) is None       # 03-07 23:59 CST
    assert rules.why_excluded(datetime(2026, 3, 8, 5, 0, tzinfo=UTC), havana) == "calendar: x"   # 03-08 01:00 CDT
    assert rules.next_allowed(datetime(2026, 3, 8, 12, tzinfo=UTC), havana) == datetime(2026, 3, 9, 4, tzinfo=UTC)
    rules = rules_of({"CALENDAR__x__DATES": "2026-03-07"}, ("x",))
    assert rules.next_allowed(datetime(2026, 3, 7, 12, tzinfo=UTC), havana) == datetime(2026, 3, 8, 5, tzinfo=UTC)
    santiago = ZoneInfo("America/Santiago")     # 2026-04-04 23:00-24:00 happens twice; 2026-09-06 00:00 does not exist
    rules = rules_of({"CALENDAR__x__DATES": "2026-04-04, 2026-09-05"}, ("x",))
    assert rules.why_excluded(datetime(2026, 4, 5, 3, 30, tzinfo=UTC), santiago) == "calendar: x"    # 23:30, second pass
    assert rules.next_allowed(datetime(2026, 4, 4, 12, tzinfo=UTC), santiago) == datetime(2026, 4, 5, 4, tzinfo=UTC)
    assert rules.next_allowed(datetime(2026, 9, 5, 12, tzinfo=UTC), santiago) == datetime(2026, 9, 6, 4, tzinfo=UTC)


def test_the_number_of_ics_calendars_and_their_bytes_in_all_are_bounded(tmp_path, monkeypatch):
    """Each iCalendar file is parsed at a cold start (a few seconds a MiB): at most
    MAX_ICS_CALENDARS of them, and MAX_ICS_TOTAL_BYTES in all, taken in name order so that every
    instance refuses the same ones; the others are each invalid in words, the rest are read."""
    settings = {}
    for index in range(cal.MAX_ICS_CALENDARS + 2):
        path = tmp_path / f"c{index:02d}.ics"
        path.write_text(ics(timed("20260101T000000Z")))
        settings[f"CALENDAR__c{index:02d}__ICS"] = str(path)
    parsed = parse_calendars(settings, today=TODAY)
    assert sorted(parsed.invalid) == [f"c{cal.MAX_ICS_CALENDARS:02d}", f"c{cal.MAX_ICS_CALENDARS + 1:02d}"]
    (error,) = parsed.invalid[f"c{cal.MAX_ICS_CALENDARS:02d}"]
    assert error.startswith(f"CALENDAR__c{cal.MAX_ICS_CALENDARS:02d}__ICS=") and \
        f"expected at most {cal.MAX_ICS_CALENDARS}" in error
    assert len(parsed.calendars) == cal.MAX_ICS_CALENDARS
    # Bytes in all: with a total limit of two files' size, the third by name is refused.
    size = (tmp_path / "c00.ics").stat().st_size
    monkeypatch.setattr(cal, "MAX_ICS_TOTAL_BYTES", 2 * size)
    parsed = parse_calendars({key: settings[key] for key in list(settings)[:3]}, today=TODAY)
    assert list(parsed.invalid) == ["c02"] and sorted(parsed.calendars) == ["c00", "c01"]
    assert "MiB of .ics files in all" in parsed.invalid["c02"][0]
