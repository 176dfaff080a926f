"""Calendars (issue 33 item 1): dates, ranges and weekly windows, checked instant by instant over
two years against a computation of their own (minutes of the week, sets of dates), in zones with
daylight saving; the next allowed time against a walk minute by minute; the settings' errors."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.jobs.calendars import CalendarRules, parse_calendars, parse_dates, parse_weekly

UTC = timezone.utc
DAY_INDEX = {"SUN": 0, "MON": 1, "TUE": 2, "WED": 3, "THU": 4, "FRI": 5, "SAT": 6}


def calendars(**settings):
    parsed = parse_calendars({f"CALENDAR__{k}": v for k, v in settings.items()})
    assert not parsed.invalid, parsed.invalid
    return parsed.calendars


def week_minutes(spec: str) -> set[int]:
    """The minutes of the week (0 = Sunday 00:00) a weekly spec holds, built minute by minute."""
    held = set()
    for item in spec.split(","):
        words = item.split()
        first, _, last = words[0].partition("-")
        a, b = DAY_INDEX[first], DAY_INDEX[last or first]
        days = [d % 7 for d in range(a, b + 1 if b >= a else b + 8)]
        if len(words) == 1:
            start, length = 0, 1440
        else:
            s, e = words[1].split("-")
            start = int(s[:2]) * 60 + int(s[3:])
            end = int(e[:2]) * 60 + int(e[3:])
            length = end - start if end > start else end + 1440 - start
        for d in days:
            for m in range(length):
                held.add((d * 1440 + start + m) % (7 * 1440))
    return held


def oracle(dates: set[date], minutes: set[int], moment: datetime, zone: ZoneInfo) -> bool:
    local = moment.astimezone(zone)
    weekday = int(local.strftime("%w"))
    return local.date() in dates or (weekday * 1440 + local.hour * 60 + local.minute) in minutes


DATES = "2026-12-25, 2026-12-24..2026-12-26, 2027-01-01, 2027-03-28..2027-03-29, 2026-10-25, 2027-02-28..2027-03-01"
WEEKLY = "SAT-SUN 10:00-12:30, FRI 22:00-06:00, WED, MON-TUE 23:30-00:15, THU 00:00-24:00"


def expanded_dates(text: str) -> set[date]:
    out = set()
    for item in text.split(","):
        first, _, last = item.strip().partition("..")
        a = date.fromisoformat(first)
        b = date.fromisoformat(last) if last else a
        while a <= b:
            out.add(a)
            a += timedelta(days=1)
    return out


@pytest.mark.parametrize("zone_name", ["Europe/London", "America/New_York", "Australia/Lord_Howe"])
def test_dates_and_weekly_windows_hold_exactly_their_instants_over_two_years(zone_name):
    zone = ZoneInfo(zone_name)
    found = calendars(h__DATES=DATES, w__WEEKLY=WEEKLY)
    rules = CalendarRules(exclude=(found["h"], found["w"]))
    dates, minutes = expanded_dates(DATES), week_minutes(WEEKLY)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    checked = 0
    while moment < datetime(2028, 1, 1, tzinfo=UTC):
        expected = oracle(dates, minutes, moment, zone)
        assert (rules.why_excluded(moment, zone) is not None) == expected, (moment, moment.astimezone(zone))
        checked += 1
        moment += timedelta(minutes=15)
    assert checked == 70080


def test_only_holds_the_instants_outside_every_only_calendar():
    zone = ZoneInfo("Europe/Paris")
    found = calendars(bd__WEEKLY="MON-FRI 08:00-18:00")
    rules = CalendarRules(only=(found["bd"],))
    minutes = week_minutes("MON-FRI 08:00-18:00")
    moment = datetime(2026, 3, 1, tzinfo=UTC)
    while moment < datetime(2026, 11, 1, tzinfo=UTC):
        assert (rules.why_excluded(moment, zone) is None) == oracle(set(), minutes, moment, zone), moment
        moment += timedelta(minutes=20)
    assert rules.why_excluded(datetime(2026, 3, 7, 12, tzinfo=UTC), zone) == "calendar: not in bd"


@pytest.mark.parametrize("zone_name", ["Europe/London", "America/New_York"])
def test_the_next_allowed_time_is_the_first_minute_the_calendars_allow(zone_name):
    zone = ZoneInfo(zone_name)
    found = calendars(h__DATES=DATES, w__WEEKLY=WEEKLY, bd__WEEKLY="MON-SAT 07:00-20:00")
    rules = CalendarRules(exclude=(found["h"], found["w"]), only=(found["bd"],), on_excluded="next")
    dates, minutes, only = expanded_dates(DATES), week_minutes(WEEKLY), week_minutes("MON-SAT 07:00-20:00")

    def allowed(moment):
        return not oracle(dates, minutes, moment, zone) and oracle(set(), only, moment, zone)

    moment = datetime(2026, 10, 20, 0, 7, tzinfo=UTC)
    while moment < datetime(2027, 4, 5, tzinfo=UTC):
        walk = moment
        while not allowed(walk):
            walk += timedelta(minutes=1)
        # the oracle walks whole minutes; every piece starts and ends on one
        walk = walk.replace(second=0) if walk != moment else walk
        assert rules.next_allowed(moment, zone) == walk, (moment, moment.astimezone(zone))
        moment += timedelta(hours=5, minutes=13)


def test_a_move_that_finds_no_allowed_time_within_a_year_says_so():
    found = calendars(all__WEEKLY="SUN-SAT")
    rules = CalendarRules(exclude=(found["all"],), on_excluded="next")
    assert rules.next_allowed(datetime(2026, 1, 1, tzinfo=UTC), ZoneInfo("UTC")) is None
    rules = CalendarRules(only=(calendars(past__DATES="2020-01-01")["past"],), on_excluded="next")
    assert rules.next_allowed(datetime(2026, 1, 1, tzinfo=UTC), ZoneInfo("UTC")) is None


def test_rules_survive_their_json():
    found = calendars(h__DATES=DATES, w__WEEKLY=WEEKLY)
    rules = CalendarRules(exclude=(found["h"],), only=(found["w"],), on_excluded="next")
    assert CalendarRules.from_json(rules.as_json()) == rules
    assert CalendarRules.from_json(None) == CalendarRules() and not CalendarRules()


@pytest.mark.parametrize("text, expected", [
    ("2026-02-30", "'2026-02-30': 2026-02-30 is not a date that exists"),
    ("2026-12-26..2026-12-24", "the range ends before it starts"),
    ("2026-12-24, ", "an empty item between commas"),
    ("24/12/2026", "'24/12/2026': expected YYYY-MM-DD or YYYY-MM-DD..YYYY-MM-DD"),
    ("２026-12-24", "expected YYYY-MM-DD"),
    ("2026-12-24...2026-12-26", "expected YYYY-MM-DD"),
    (",".join(["2026-01-01"] * 2001), "2001 dates or ranges: expected at most 2000"),
])
def test_bad_dates_are_named(text, expected):
    with pytest.raises(ValueError) as error:
        parse_dates(text)
    assert expected in str(error.value)


@pytest.mark.parametrize("text, expected", [
    ("SATURDAY", "expected a day or days"),
    ("MON-XYZ", "expected day names SUN, MON"),
    ("MON 18:00-18:00", "the window is empty"),
    ("MON 25:00-26:00", "expected times from 00:00 to 23:59 (24:00 as an end)"),
    ("MON 08:00-24:30", "expected times from 00:00 to 23:59"),
    ("MON 8:00-9:00", "expected a day or days"),
    ("", "expected a day or days"),
])
def test_bad_weekly_windows_are_named(text, expected):
    with pytest.raises(ValueError) as error:
        parse_weekly(text)
    assert expected in str(error.value)


def test_a_bad_calendar_setting_names_the_setting_and_spares_the_others():
    parsed = parse_calendars({"CALENDAR__good__DATES": "2026-12-25", "CALENDAR__bad__WEEKLY": "NOPE",
                              "CALENDAR__odd__COLOUR": "red", "CALENDAR__b@d__DATES": "2026-12-25"})
    assert set(parsed.calendars) == {"good"}
    assert parsed.invalid["bad"] == ("CALENDAR__bad__WEEKLY='NOPE': 'NOPE': expected a day or days (MON, SAT-SUN) "
                                     "with an optional window HH:MM-HH:MM (MON-FRI 18:00-24:00)",)
    assert "unknown calendar setting 'COLOUR' (expected DATES, WEEKLY, ICS)" in parsed.invalid["odd"][0]
    assert "expected a calendar name of 1 to 64 letters" in parsed.invalid["b@d"][0]


# ---------------------------------------------------------------- iCalendar files

ICS = """BEGIN:VCALENDAR\r
VERSION:2.0\r
PRODID:-//test//EN\r
BEGIN:VEVENT\r
UID:christmas@test\r
DTSTART;VALUE=DATE:20251225\r
DTEND;VALUE=DATE:20251227\r
RRULE:FREQ=YEARLY\r
SUMMARY:Christmas and Boxing Day\r
END:VEVENT\r
BEGIN:VEVENT\r
UID:standup@test\r
DTSTART;TZID=Europe/London:20260105T090000\r
DTEND;TZID=Europe/London:20260105T100000\r
RRULE:FREQ=WEEKLY;BYDAY=MO\r
EXDATE;TZID=Europe/London:20260112T090000\r
SUMMARY:Monday maintenance\r
END:VEVENT\r
BEGIN:VEVENT\r
UID:cancelled@test\r
DTSTART;VALUE=DATE:20260301\r
STATUS:CANCELLED\r
SUMMARY:Called off\r
END:VEVENT\r
BEGIN:VEVENT\r
UID:floating@test\r
DTSTART:20260401T120000\r
DURATION:PT2H\r
SUMMARY:Floating time: UTC\r
END:VEVENT\r
END:VCALENDAR\r
"""


def test_an_ics_file_holds_its_events_recurring_ones_included_over_two_years(tmp_path):
    path = tmp_path / "uk.ics"
    path.write_bytes(b"\xef\xbb\xbf" + ICS.encode())      # with a BOM, as some exports have
    parsed = parse_calendars({"CALENDAR__uk__ICS": str(path)}, today=date(2026, 6, 1))
    assert not parsed.invalid, parsed.invalid
    rules = CalendarRules(exclude=(parsed.calendars["uk"],))
    london = ZoneInfo("Europe/London")

    def expected(moment):
        local = moment.astimezone(london)
        if (local.month, local.day) in ((12, 25), (12, 26)) and local.year >= 2025:
            return True
        if local.weekday() == 0 and local.hour == 9 and local.date() >= date(2026, 1, 5) \
                and local.date() != date(2026, 1, 12):
            return True
        return datetime(2026, 4, 1, 12, tzinfo=UTC) <= moment < datetime(2026, 4, 1, 14, tzinfo=UTC)

    moment = datetime(2025, 1, 1, tzinfo=UTC)
    while moment < datetime(2028, 12, 31, tzinfo=UTC):     # the expansion window: 2025-01-01 to 2028-12-31
        assert (rules.why_excluded(moment, london) is not None) == expected(moment), (moment, moment.astimezone(london))
        moment += timedelta(minutes=30)
    # the cancelled event holds nothing; the JSON keeps the events
    assert rules.why_excluded(datetime(2026, 3, 1, 12, tzinfo=UTC), london) is None
    assert CalendarRules.from_json(rules.as_json()) == rules
    # moved past a Monday 09:00-10:00 London window: 10:00 London
    assert rules.next_allowed(datetime(2026, 7, 6, 8, 30, tzinfo=UTC), london) == datetime(2026, 7, 6, 9, tzinfo=UTC)


@pytest.mark.parametrize("content, expected", [
    (None, "the file cannot be read"),
    (b"not a calendar at all", "not an iCalendar file that can be read"),
    ("BEGIN:VCALENDAR\r\nEND:VCALENDAR\r\n".encode("utf-16"), "not UTF-8 text"),
    (b"BEGIN:VCALENDAR\r\n" + b"X" * (5 * 1024 * 1024) + b"\r\nEND:VCALENDAR\r\n", "larger than 5 MiB"),
    (("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:x\r\nDTSTART:20260101T000000Z\r\n"
      "DTEND:20260101T000100Z\r\nRRULE:FREQ=SECONDLY\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n").encode(),
     "expected at most 5000"),
    (("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:x\r\nDTSTART:20260101T000000Z\r\n"
      "DTEND:20260101T000100Z\r\nRRULE:FREQ=DAILY;BYHOUR=0,1,2,3,4,5,6,7,8,9,10,11;BYMINUTE=0,10,20,30,40,50\r\n"
      "END:VEVENT\r\nEND:VCALENDAR\r\n").encode(), "expected at most 5000"),
])
def test_a_bad_ics_file_makes_its_calendar_invalid_naming_the_setting(tmp_path, content, expected):
    path = tmp_path / "bad.ics"
    if content is not None:
        path.write_bytes(content)
    parsed = parse_calendars({"CALENDAR__bad__ICS": str(path), "CALENDAR__good__DATES": "2026-12-25"},
                             today=date(2026, 6, 1))
    assert set(parsed.calendars) == {"good"}
    (error,) = parsed.invalid["bad"]
    assert error.startswith(f"CALENDAR__bad__ICS={str(path)!r}: ") and expected in error, error


def test_an_endless_daily_maintenance_window_is_expanded_over_the_window_only(tmp_path):
    path = tmp_path / "window.ics"
    path.write_text("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:w\r\n"
                    "DTSTART;TZID=America/New_York:20250101T020000\r\nDTEND;TZID=America/New_York:20250101T030000\r\n"
                    "RRULE:FREQ=DAILY\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n")
    parsed = parse_calendars({"CALENDAR__w__ICS": str(path)}, today=date(2026, 6, 1))
    calendar = parsed.calendars["w"]
    assert 1400 < len(calendar.events) < 1470           # 2025-01-01 to 2028-12-31, daily
    ny = ZoneInfo("America/New_York")
    rules = CalendarRules(exclude=(calendar,))
    assert rules.why_excluded(datetime(2027, 7, 4, 6, 30, tzinfo=UTC), ny) == "calendar: w"    # 02:30 EDT
    assert rules.why_excluded(datetime(2027, 7, 4, 7, 30, tzinfo=UTC), ny) is None             # 03:30 EDT


def test_attacks_on_calendar_settings():
    # the same setting twice in another letter case: refused, not last-one-wins
    parsed = parse_calendars({"CALENDAR__uk__DATES": "2026-12-25", "CALENDAR__UK__DATES": "2026-12-26"})
    assert "uk" not in parsed.calendars and "compare case-insensitively" in parsed.invalid["uk"][0]
    # DATES and WEEKLY of one calendar in two letter cases: one calendar
    parsed = parse_calendars({"CALENDAR__uk__DATES": "2026-12-25", "CALENDAR__UK__WEEKLY": "SAT"})
    assert parsed.calendars["uk"].dates and parsed.calendars["uk"].weekly
    # the ends of the calendar: a date outside the months a calendar computes is refused (dates
    # in 9998 and 9999 were accepted, and a slot on them ran: an attack)
    for text in ("9999-12-30..9999-12-31", "9999-12-30", "9998-06-01", "2026-12-25, 9998-06-01", "0001-05-01",
                 "0001-12-31..0002-01-02"):
        with pytest.raises(ValueError, match="expected dates from 0002-01-01 to 9997-12-31"):
            parse_dates(text)
    assert parse_dates("9997-12-31") == ((date(9997, 12, 31), date(9997, 12, 31)),)
    last = CalendarRules(exclude=(parse_calendars({"CALENDAR__end__DATES": "0002-01-01, 9997-12-31"}).calendars["end"],))
    assert last.why_excluded(datetime(9997, 12, 31, 12, 0, tzinfo=UTC), UTC) == "calendar: end"
    assert last.why_excluded(datetime(2, 1, 1, 12, 0, tzinfo=UTC), UTC) == "calendar: end"
    assert last.why_excluded(datetime(9997, 12, 30, 12, 0, tzinfo=UTC), UTC) is None


def test_an_unreadable_ics_file_does_not_quote_its_lines(tmp_path):
    """The error reaches config_error (jobs, the monitor): a path to another file (settings with
    secrets) must not show its content."""
    secret = tmp_path / "local.settings.json"
    secret.write_text('{"Values": {"AGENT_SQL_PASSWORD": "hunter2-very-secret"}}\n')
    parsed = parse_calendars({"CALENDAR__x__ICS": str(secret)}, today=date(2026, 6, 1))
    (error,) = parsed.invalid["x"]
    assert "hunter2" not in error and "AGENT_SQL_PASSWORD" not in error and "not an iCalendar file" in error
