"""NCRONTAB (seconds first), IANA time zones across daylight-saving changes, one-time jobs."""

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.jobs.schedules import CronSchedule, OnceSchedule, parse_ncrontab, parse_schedule

UTC = timezone.utc


def u(*parts):
    return datetime(*parts, tzinfo=UTC)


def slots(schedule, start, count):
    out, t = [], start
    for _ in range(count):
        t = schedule.next_after(t)
        out.append(t)
    return out


def test_seconds_come_first():
    every_30s = parse_schedule("*/30 * * * * *")
    assert slots(every_30s, u(2026, 1, 1, 0, 0, 0), 3) == [u(2026, 1, 1, 0, 0, 30), u(2026, 1, 1, 0, 1, 0),
                                                            u(2026, 1, 1, 0, 1, 30)]
    daily = parse_schedule("0 30 2 * * *")
    assert daily.next_after(u(2026, 1, 1, 3, 0)) == u(2026, 1, 2, 2, 30)


def test_next_is_strictly_after():
    minute = parse_schedule("0 * * * * *")
    assert minute.next_after(u(2026, 1, 1, 12, 0, 0)) == u(2026, 1, 1, 12, 1, 0)


def test_weekdays_and_names():
    weekdays = parse_schedule("0 0 6 * * MON-FRI")
    friday = u(2026, 11, 20, 7, 0)  # a Friday
    assert weekdays.next_after(friday) == u(2026, 11, 23, 6, 0)  # Monday


@pytest.mark.parametrize("bad", ["* * * * *", "0 0 0 * * * *", "61 * * * * *", "0 0 25 * * *", "x y z a b c",
                                 "0 0 0 L * *", "H 0 0 * * *", ""])
def test_invalid_expressions_are_refused(bad):
    with pytest.raises(ValueError):
        parse_ncrontab(bad)


def test_time_zone_keeps_wall_clock_across_dst():
    paris = parse_schedule("0 0 2 * * *", "Europe/Paris")
    # Winter: 02:00 CET = 01:00 UTC; summer: 02:00 CEST = 00:00 UTC.
    assert paris.next_after(u(2026, 1, 10, 12, 0)) == u(2026, 1, 11, 1, 0)
    assert paris.next_after(u(2026, 7, 10, 12, 0)) == u(2026, 7, 11, 0, 0)


def test_spring_forward_runs_a_missing_time_once_after_the_jump():
    # 2026-03-08: New York jumps from 02:00 EST to 03:00 EDT; 02:30 does not exist.
    ny = parse_schedule("0 30 2 * * *", "America/New_York")
    first = ny.next_after(u(2026, 3, 8, 5, 0))        # 00:00 EST
    assert first == u(2026, 3, 8, 7, 30)                # 03:30 EDT, the same offset past the jump
    assert ny.next_after(first) == u(2026, 3, 9, 6, 30)  # next day 02:30 EDT


def test_fall_back_fixed_hour_runs_once():
    # 2026-11-01: New York repeats 01:00-02:00. A job at 01:30 runs once (the first pass).
    ny = parse_schedule("0 30 1 * * *", "America/New_York")
    first = ny.next_after(u(2026, 11, 1, 4, 0))         # 00:00 EDT
    assert first == u(2026, 11, 1, 5, 30)                # 01:30 EDT
    assert ny.next_after(first) == u(2026, 11, 2, 6, 30)  # next day 01:30 EST, not 01:30 EST same day


def test_fall_back_wildcard_hour_runs_in_both_passes():
    hourly = parse_schedule("0 0 * * * *", "America/New_York")
    got = slots(hourly, u(2026, 11, 1, 3, 30), 5)
    # 00:00 EDT, 01:00 EDT, 01:00 EST (the repeated hour is real time), 02:00 EST, 03:00 EST
    assert got == [u(2026, 11, 1, 4), u(2026, 11, 1, 5), u(2026, 11, 1, 6), u(2026, 11, 1, 7), u(2026, 11, 1, 8)]


def test_spring_forward_interval_job_has_no_duplicate_instants():
    every_30m = parse_schedule("0 */30 * * * *", "America/New_York")
    got = slots(every_30m, u(2026, 3, 8, 6, 0), 4)   # from 01:00 EST
    assert got == [u(2026, 3, 8, 6, 30), u(2026, 3, 8, 7, 0), u(2026, 3, 8, 7, 30), u(2026, 3, 8, 8, 0)]
    assert len(set(got)) == len(got)


def test_once_in_job_time_zone_or_with_offset():
    local = parse_schedule("@once 2026-12-01T03:00:00", "Europe/Paris")
    assert isinstance(local, OnceSchedule) and local.at == u(2026, 12, 1, 2, 0)
    offset = parse_schedule("@once 2026-12-01T03:00:00+00:00", "Europe/Paris")
    assert offset.at == u(2026, 12, 1, 3, 0)
    assert local.next_after(u(2026, 11, 30)) == local.at
    assert local.next_after(local.at) is None
    # A one-time job already past is still due once: the misfire policy decides.
    assert local.initial_due(u(2027, 1, 1)) == local.at


@pytest.mark.parametrize("bad", ["@once", "@once tomorrow", "@once 2026-13-01T00:00:00"])
def test_invalid_once(bad):
    with pytest.raises(ValueError):
        parse_schedule(bad)


def test_unknown_time_zone():
    with pytest.raises(ValueError, match="unknown time zone"):
        parse_schedule("0 0 0 * * *", "Mars/Olympus")


def test_cron_initial_due_is_next_slot():
    schedule = parse_schedule("0 0 * * * *")
    assert isinstance(schedule, CronSchedule)
    assert schedule.initial_due(u(2026, 1, 1, 12, 30)) == u(2026, 1, 1, 13, 0)


def test_validation_and_planning_walk_croniter_once_per_distinct_schedule(monkeypatch):
    """Settings validation (schedule_problem) and the tick's planning share one next-slot cache
    keyed by (schedule, time zone): 3,000 jobs on three schedules cost three croniter walks."""
    from shared.jobs import schedules
    from shared.jobs.from_settings import parse_jobs

    walks = []
    real_walk = schedules.CronSchedule._walk_next_after

    def counting(self, after):
        walks.append(self.expression)
        return real_walk(self, after)

    monkeypatch.setattr(schedules.CronSchedule, "_walk_next_after", counting)
    schedules._NEXT_SLOT_CACHE.clear()
    distinct = ["0 0 * * * *", "0 */5 * * * *", "30 15 2 * * *"]
    env = {}
    for i in range(3000):
        env[f"JOB__j{i}__SCHEDULE"] = distinct[i % 3]
        env[f"JOB__j{i}__COMMAND"] = "SELECT 1"
        if i % 3 == 2:
            env[f"JOB__j{i}__TIMEZONE"] = "Europe/Paris"
    jobs, invalid = parse_jobs(env)
    assert len(jobs) == 3000 and not invalid
    assert sorted(walks) == sorted(distinct)
    # Planning from the same instant onwards reuses the entries: no new walk.
    now = datetime.now(timezone.utc)
    for job in jobs[:300]:
        parse_schedule(job.schedule, job.timezone).next_after(now)
    assert len(walks) == 3


def test_the_next_slot_cache_answers_exactly_as_a_fresh_walk():
    from datetime import timedelta

    from shared.jobs import schedules

    schedule = parse_schedule("0 30 2 * * *", "Europe/Paris")
    start = datetime(2026, 3, 28, 0, 0, tzinfo=timezone.utc)  # across the spring-forward night
    probes = [start + timedelta(minutes=7 * i) for i in range(1200)]
    cached = [schedule.next_after(p) for p in probes]
    fresh = []
    for p in probes:
        schedules._NEXT_SLOT_CACHE.clear()
        fresh.append(schedule.next_after(p))
    assert cached == fresh


# ---------------------------------------------------------------- the extended form

def _days_of(text, zone="UTC", first=date(2026, 1, 1), last=date(2028, 12, 31)):
    """The local dates of a schedule's slots from ``first`` to ``last`` (slot by slot)."""
    schedule = parse_schedule(text, zone)
    out, t = [], datetime(first.year, first.month, first.day, tzinfo=UTC)
    end = datetime(last.year, last.month, last.day, 23, 59, 59, tzinfo=UTC)
    while True:
        t = schedule.next_after(t)
        if t is None or t > end:
            return out
        out.append(t.astimezone(ZoneInfo(zone)).date())


def _every_day(first=date(2026, 1, 1), last=date(2028, 12, 31)):
    return [first + timedelta(days=k) for k in range((last - first).days + 1)]


def _month(day):
    start = day.replace(day=1)
    return [start + timedelta(days=k) for k in range(31) if (start + timedelta(days=k)).month == day.month]


def _weekday_name(day):
    return day.strftime("%a").upper()


def _nearest_weekday_quartz(day, n):
    """Quartz: the weekday nearest day n of the month, never leaving the month."""
    month = _month(day)
    if n > len(month):
        return None
    target = month[n - 1]
    if _weekday_name(target) == "SAT":
        return target - timedelta(days=1) if n > 1 else target + timedelta(days=2)
    if _weekday_name(target) == "SUN":
        return target + timedelta(days=1) if n < len(month) else target - timedelta(days=2)
    return target


WEEKDAYS = {"MON", "TUE", "WED", "THU", "FRI"}


@pytest.mark.parametrize("day_field, weekday_field, selects", [
    ("L", "*", lambda d: _month(d)[-1] == d),
    ("LW", "*", lambda d: [x for x in _month(d) if _weekday_name(x) in WEEKDAYS][-1] == d),
    ("1W", "*", lambda d: _nearest_weekday_quartz(d, 1) == d),
    ("15W", "*", lambda d: _nearest_weekday_quartz(d, 15) == d),
    ("31W", "*", lambda d: _nearest_weekday_quartz(d, 31) == d),
    ("30W", "*", lambda d: _nearest_weekday_quartz(d, 30) == d),
    ("1,L", "*", lambda d: d.day == 1 or _month(d)[-1] == d),
    ("*", "5#3", lambda d: _weekday_name(d) == "FRI" and 15 <= d.day <= 21),
    ("*", "MON#5", lambda d: _weekday_name(d) == "MON" and d.day >= 29),
    ("*", "5L", lambda d: _weekday_name(d) == "FRI" and d.day + 7 > len(_month(d))),
    ("*", "SUN#L", lambda d: _weekday_name(d) == "SUN" and d.day + 7 > len(_month(d))),
    ("*", "MON-FRI#2", lambda d: [x for x in _month(d) if _weekday_name(x) in WEEKDAYS][1] == d),
    ("*", "MON-FRI#L", lambda d: [x for x in _month(d) if _weekday_name(x) in WEEKDAYS][-1] == d),
    ("*", "SAT-SUN#1", lambda d: [x for x in _month(d) if _weekday_name(x) not in WEEKDAYS][0] == d),
    ("*", "6-7#4", lambda d: [x for x in _month(d) if _weekday_name(x) not in WEEKDAYS][3] == d),
    ("*", "FRI-SUN#L", lambda d: [x for x in _month(d) if _weekday_name(x) in {"FRI", "SAT", "SUN"}][-1] == d),
    ("*", "MON#1,FRI#L", lambda d: (_weekday_name(d) == "MON" and d.day <= 7)
     or (_weekday_name(d) == "FRI" and d.day + 7 > len(_month(d)))),
    # Both day fields restricted: either one (cron's rule, as for plain expressions).
    ("L", "MON#1", lambda d: _month(d)[-1] == d or (_weekday_name(d) == "MON" and d.day <= 7)),
])
def test_extended_day_tokens_select_exactly_their_days_over_three_years(day_field, weekday_field, selects):
    for zone in ("UTC", "America/New_York"):
        got = _days_of(f"0 0 12 {day_field} * {weekday_field}", zone)
        assert got == [d for d in _every_day() if selects(d)], (day_field, weekday_field, zone)


@pytest.mark.parametrize("ours, theirs", [("L", "L"), ("15W", "15W"), ("1W", "1W"), ("* * 5#3", "* * 5#3"),
                                          ("* * 5L", "* * L5"), ("* * 1#5", "* * 1#5")])
def test_where_croniter_has_the_token_it_agrees_with_ours(ours, theirs):
    """croniter 7 walks L, nW, d#n and its own Ld (not LW, dL or a range before #); where it has the
    token, its slots are ours over three years (a second, independent implementation)."""
    from croniter import croniter

    ours_text = f"0 0 12 {ours}" + (" * *" if ours.count(" ") == 0 else "")
    theirs_text = f"0 12 {theirs}" + (" * *" if theirs.count(" ") == 0 else "")
    walk = croniter(theirs_text, datetime(2025, 12, 31, 12, 0))
    expected = []
    while (slot := walk.get_next(datetime)).date() <= date(2028, 12, 31):
        expected.append(slot.date())
    assert _days_of(ours_text) == expected


def test_clauses_filter_the_fields_slots():
    assert _days_of("0 0 9 * * * ; from 2026-03-30 ; until 2026-04-02") == [
        date(2026, 3, 30), date(2026, 3, 31), date(2026, 4, 1), date(2026, 4, 2)]
    # every 3 days counted from the start date, the 1st of the cycle included
    got = _days_of("0 0 9 * * * ; every 3 days ; from 2026-01-02", last=date(2026, 1, 12))
    assert got == [date(2026, 1, 2), date(2026, 1, 5), date(2026, 1, 8), date(2026, 1, 11)]
    # every 2 weeks on Mon and Fri, counted from the week (Sunday first) of the first Mon/Fri on or
    # after Wednesday 2026-01-07: Fri 9; then Mon 19, Fri 23; ...
    got = _days_of("0 0 9 * * MON,FRI ; every 2 weeks ; from 2026-01-07", last=date(2026, 2, 7))
    assert got == [date(2026, 1, 9), date(2026, 1, 19), date(2026, 1, 23), date(2026, 2, 2), date(2026, 2, 6)]
    # every 2 months on the last day, counted from the first last day on or after 2026-01-31
    got = _days_of("0 0 9 L * * ; every 2 months ; from 2026-01-31", last=date(2026, 8, 31))
    assert got == [date(2026, 1, 31), date(2026, 3, 31), date(2026, 5, 31), date(2026, 7, 31)]


def test_every_n_minutes_counts_from_the_windows_start_not_the_hour():
    schedule = parse_schedule("* * * * * * ; every 7 minutes ; between 08:03 and 08:40")
    assert slots(schedule, u(2026, 1, 1), 6) == [u(2026, 1, 1, 8, 3), u(2026, 1, 1, 8, 10), u(2026, 1, 1, 8, 17),
                                                 u(2026, 1, 1, 8, 24), u(2026, 1, 1, 8, 31), u(2026, 1, 1, 8, 38)]
    assert schedule.next_after(u(2026, 1, 1, 8, 38)) == u(2026, 1, 2, 8, 3)


def test_a_schedule_past_its_until_has_no_slot_and_is_not_an_error():
    from shared.jobs.from_settings import schedule_problem

    ended = parse_schedule("0 0 9 * * * ; until 2020-01-01")
    assert ended.next_after(u(2026, 1, 1)) is None
    assert schedule_problem(ended) is None
    assert schedule_problem(parse_schedule("0 0 9 L * * ; from 2200-01-01")) is not None   # beyond the horizon


def test_extended_form_keeps_the_daylight_saving_rule():
    # Spring forward: 02:30 on the last weekday of March does not exist in Paris on 2026-03-31? It
    # does (the change is the 29th); the 29th is a Sunday: use the last Sunday (SUN#L).
    paris = parse_schedule("0 30 2 * * SUN#L", "Europe/Paris")
    # 2026-03-29 02:30 does not exist (02:00 CET -> 03:00 CEST): runs at 03:30 CEST = 01:30 UTC, once
    assert paris.next_after(u(2026, 3, 28)) == u(2026, 3, 29, 1, 30)
    # 2026-10-25 02:30 happens twice: a fixed hour runs in the first pass only (00:30 UTC)
    assert paris.next_after(u(2026, 10, 24)) == u(2026, 10, 25, 0, 30)
    assert paris.next_after(u(2026, 10, 25, 0, 30)) == u(2026, 11, 29, 1, 30)
    # an every-hour schedule runs in both passes
    hourly = parse_schedule("0 30 * * * SUN#L ; between 01:00 and 03:59", "Europe/Paris")
    assert slots(hourly, u(2026, 10, 24, 23, 0), 4) == [u(2026, 10, 24, 23, 30), u(2026, 10, 25, 0, 30),
                                                        u(2026, 10, 25, 1, 30), u(2026, 10, 25, 2, 30)]


@pytest.mark.parametrize("bad, expected", [
    ("0 0 9 * * * ; every 2 weeks", "'every 2 weeks' counts from a start date: add '; from YYYY-MM-DD'"),
    ("0 0 9 * * * ; from 2026-02-30", "'2026-02-30' is not a date that exists"),
    ("0 0 9 * * * ; from 2026/02/01", "is not a date (YYYY-MM-DD)"),
    ("0 0 9 * * * ; until 2026-01-01 ; from 2026-02-01", "'until 2026-01-01' is before 'from 2026-02-01'"),
    ("0 0 9 * * * ; between 18:00 and 08:00", "the window ends before it starts"),
    ("0 0 9 * * * ; between 24:00 and 25:00", "'24:00' is not a time of day"),
    ("0 0 9 * * * ; between 10:00 and 18:00", "no time of day is left"),
    ("0 0 9 * * * ; every 0 days ; from 2026-01-01", "expected a whole number of days of 1 or more"),
    ("0 0 9 * * * ; every 121 months ; from 2026-01-01", "expected at most 120 months"),
    ("* * * * * * ; every 25 hours", "expected at most a day of hours"),
    ("0 0 9 * * * ; from 2026-01-01 ; from 2026-02-01", "'from' is given twice"),
    ("0 0 9 * * * ;", "an empty clause"),
    ("0 0 9 * * * ; at 10:00", "expected 'from YYYY-MM-DD', 'until YYYY-MM-DD'"),
    ("0 0 9 L 2 * ; every 1 days ; from 2026-01-01", None),
    ("0 0 9 5L * *", "day-of-month '5L': expected L, LW, nW"),
    ("0 0 9 32W * *", "day-of-month '32': expected a number from 1 to 31"),
    ("0 0 9 * * L", "day-of-week 'L': expected days"),
    ("0 0 9 * * 5#6", "expected 1 to 5 or L after '#'"),
    ("0 0 9 * * FRI-MON#1", "expected a range from low to high"),
    ("0 L 9 * * *", "minute 'L': L, W and # belong to the day-of-month and day-of-week fields"),
    ("0 0 9 30 2 * ; from 2026-01-01", "the day fields select no day of any month"),
    ("0 0 9 * * MON#5 ; until 2026-01-01", None),
    ("0 0 9 * * 5#3 extra", "7 fields given"),
])
def test_extended_form_errors_name_the_field_or_clause(bad, expected):
    if expected is None:
        parse_schedule(bad)     # valid
        return
    with pytest.raises(ValueError) as error:
        parse_schedule(bad)
    assert expected in str(error.value)


def test_extended_form_through_settings_names_the_setting_and_value():
    from shared.jobs.from_settings import parse_jobs

    jobs, invalid = parse_jobs({
        "JOB__ok__SCHEDULE": "0 0 22 * * MON-FRI#L ; every 2 months ; from 2026-01-01",
        "JOB__ok__COMMAND": "SELECT 1",
        "JOB__bad__SCHEDULE": "0 0 22 * * * ; every 2 weeks",
        "JOB__bad__COMMAND": "SELECT 1",
    })
    assert [job.name for job in jobs] == ["ok"]
    assert len(invalid) == 1 and invalid[0].name == "bad"
    assert "JOB__bad__SCHEDULE" in invalid[0].errors[0] and "'every 2 weeks' counts from a start date" in \
        invalid[0].errors[0]


@pytest.mark.parametrize("text", ["0 0 9 * * * ; every ٣ days ; from 2026-01-01", "0 0 9 * * * ; between ０8:00 and 09:00",
                                  "0 0 9 1W * * ; from ٢٠٢٦-01-01", "0 0 9 ²W * *", "0 0 9 * * MON#٣"])
def test_only_ascii_digits_are_numbers(text):
    with pytest.raises(ValueError):
        parse_schedule(text)


def test_the_ends_of_the_calendar_give_no_slot_or_a_real_one_never_an_error():
    start, end = datetime(1, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    for text in ("0 0 9 * * *", "0 0 9 L * *", "0 0 23 * * * ; until 9999-12-31"):
        for zone in ("UTC", "Pacific/Kiritimati", "Pacific/Pago_Pago"):
            assert parse_schedule(text, zone).next_after(end) is None
            first = parse_schedule(text, zone).next_after(start)
            assert first is None or first > start
    # the last day of year 9999, 09:00 at UTC+14, is 19:00 UTC the day before
    assert parse_schedule("0 0 9 L * *", "Pacific/Kiritimati").next_after(u(9999, 12, 30)) == u(9999, 12, 30, 19)
    with pytest.raises(ValueError, match="select no day from 9999-12-01 to 9999-12-31"):
        parse_schedule("0 0 9 L 2 * ; from 9999-12-01")


# ---------------------------------------------------------------- jitter

def test_jitter_is_fixed_by_job_and_slot_bounded_and_before_the_next_slot():
    from shared.jobs.schedules import jitter_offset

    slot, following = u(2026, 1, 1, 2), u(2026, 1, 2, 2)
    offsets = [jitter_offset(f"job{k}", slot, following, 600) for k in range(2000)]
    assert all(0 <= d <= 600 for d in offsets)
    assert len(set(offsets)) > 450                     # spread: 2000 jobs over 601 seconds
    assert offsets == [jitter_offset(f"JOB{k}", slot, following, 600) for k in range(2000)]   # names fold
    assert jitter_offset("a", slot, following, 0) == 0
    # never at or past the next slot: every 10 s with 600 s of jitter stays within 9 s
    every_10 = [jitter_offset(f"j{k}", slot, slot + timedelta(seconds=10), 600) for k in range(500)]
    assert max(every_10) == 9 and min(every_10) == 0
    assert jitter_offset("j", slot, slot + timedelta(seconds=1), 600) == 0
    per_slot = {jitter_offset("nightly", slot + timedelta(days=k), None, 3600) for k in range(200)}
    assert len(per_slot) > 150                         # each slot its own delay


def test_every_process_computes_the_same_jitter():
    """Instances agree whatever their hash seed: the offset is SHA-256 of the name and the slot."""
    import subprocess
    import sys

    from shared.jobs.schedules import jitter_offset

    code = ("from datetime import datetime, timezone; from shared.jobs.schedules import jitter_offset; "
            "print([jitter_offset(f'job{k}', datetime(2026, 1, 1, 2, tzinfo=timezone.utc), None, 3600) for k in range(50)])")
    here = [jitter_offset(f"job{k}", u(2026, 1, 1, 2), None, 3600) for k in range(50)]
    for seed in ("1", "2", "random"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
        assert out.stdout.strip() == str(here)


@pytest.mark.parametrize("value, expected", [("-1", "from 0 to 86400"), ("86401", "from 0 to 86400"),
                                             ("ten", "from 0 to 86400"), ("1e3", "from 0 to 86400")])
def test_jitter_setting_is_checked_by_name(value, expected):
    from shared.jobs.from_settings import parse_jobs

    jobs, invalid = parse_jobs({"JOB__x__SCHEDULE": "0 0 2 * * *", "JOB__x__COMMAND": "SELECT 1",
                                "JOB__x__JITTER_SECONDS": value})
    assert not jobs and invalid[0].errors[0].startswith(f"JOB__x__JITTER_SECONDS={value!r}")
    assert expected in invalid[0].errors[0]
