"""NCRONTAB (seconds first), IANA time zones across daylight-saving changes, one-time jobs."""

from datetime import datetime, timezone

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
