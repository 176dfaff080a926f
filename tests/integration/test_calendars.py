"""Calendars in the claim (issue 33 item 1), on SQLite and PostgreSQL: a slot a job's calendar
excludes is recorded skipped with the calendar's name, or moved to the next allowed time and run
there once; a slot outside an ONLY calendar likewise; a bad calendar makes the jobs that use it
invalid, naming the setting, and no other."""

from __future__ import annotations

from datetime import timezone

import pytest

from shared.messaging.memory import MemoryQueue
from tests.support.harness import at, make_agent

UTC = timezone.utc
CALENDARS = {
    "CALENDAR__uk__DATES": "2026-12-25, 2026-12-24..2026-12-26, 2027-01-01",
    "CALENDAR__weekend__WEEKLY": "SAT-SUN",
    "CALENDAR__business_days__WEEKLY": "MON-FRI",
    "CALENDAR__night_freeze__WEEKLY": "FRI 22:00-06:00",
}


@pytest.fixture
def calendar_agent(db_url):
    agents = []

    def build(jobs, extra=None):
        env = dict(CALENDARS, **(extra or {}))
        agent = make_agent(db_url, jobs, queue=MemoryQueue(), **env)
        agents.append(agent)
        return agent

    yield build
    for agent in agents:
        agent.close()


def runs(agent, job):
    """(slot, status, note) of the job's runs; a run the calendars let through may later be skipped
    by the misfire rules as the test's ticks jump days ahead with no worker: it reads 'ran'."""
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    out = []
    for r in sorted(rows, key=lambda r: r["scheduled_for"]):
        calendar = (r["note"] or "").startswith("calendar:")
        out.append((r["scheduled_for"], r["status"] if calendar else "ran", r["note"] if calendar else None))
    return out


def job_row(agent, name):
    return next(r for r in agent.store().execute("list_jobs").rows if r["job_name"] == name)


def daily(**extra):
    return {"SCHEDULE": "0 0 2 * * *", "COMMAND": "SELECT 1", **extra}


def test_an_excluded_slot_is_recorded_skipped_with_the_calendars_name(calendar_agent):
    agent = calendar_agent({"nightly": daily(EXCLUDE="uk,weekend")})
    for moment in ("2026-12-23T01:59:00", "2026-12-24T02:00:01", "2026-12-25T02:00:01", "2026-12-26T02:00:01",
                   "2026-12-27T02:00:01", "2026-12-28T02:00:01"):
        agent.tick(at(moment))
    assert runs(agent, "nightly") == [
        (at("2026-12-23T02:00:00"), "ran", None),
        (at("2026-12-24T02:00:00"), "skipped", "calendar: uk"),
        (at("2026-12-25T02:00:00"), "skipped", "calendar: uk"),
        (at("2026-12-26T02:00:00"), "skipped", "calendar: uk"),                   # a Saturday: uk first
        (at("2026-12-27T02:00:00"), "skipped", "calendar: weekend"),
        (at("2026-12-28T02:00:00"), "ran", None),
    ]


def test_on_excluded_next_moves_the_run_to_the_next_allowed_time_once(calendar_agent):
    agent = calendar_agent({"nightly": daily(EXCLUDE="uk", ON_EXCLUDED="next"),
                            "hourly": {"SCHEDULE": "0 30 * * * *", "COMMAND": "SELECT 1", "EXCLUDE": "night_freeze",
                                       "ON_EXCLUDED": "next", "TIMEZONE": "Europe/London"}})
    for moment in ("2026-12-24T01:59:00", "2026-12-24T02:00:01", "2026-12-25T02:00:01", "2026-12-26T02:00:01"):
        agent.tick(at(moment))
    moved = "calendar: uk; moved to 2026-12-27T00:00:00+00:00"
    assert runs(agent, "nightly") == [
        (at("2026-12-24T02:00:00"), "skipped", moved),
        (at("2026-12-25T02:00:00"), "skipped", moved),
        (at("2026-12-26T02:00:00"), "skipped", moved),
        (at("2026-12-27T00:00:00"), "pending", "calendar: uk; moved from 2026-12-24T02:00:00+00:00"),
    ]
    # Friday 2027-01-08 22:00 to Saturday 06:00 London (GMT): the 22:30 ... 05:30 slots move to 06:00.
    for moment in ("2027-01-08T21:59:00", "2027-01-08T22:30:01", "2027-01-08T23:30:01", "2027-01-09T05:30:01"):
        agent.tick(at(moment))
    got = [r for r in runs(agent, "hourly") if r[0] >= at("2027-01-08T21:00:00")]
    assert got[0] == (at("2027-01-08T21:30:00"), "ran", None)
    assert got[1] == (at("2027-01-08T22:30:00"), "skipped", "calendar: night_freeze; moved to 2027-01-09T06:00:00+00:00")
    assert (at("2027-01-09T06:00:00"), "pending", "calendar: night_freeze; moved from 2027-01-08T22:30:00+00:00") in got
    assert len([r for r in got if r[0] == at("2027-01-09T06:00:00")]) == 1


def test_only_keeps_the_slots_inside_the_calendar(calendar_agent):
    agent = calendar_agent({"weekdays": daily(ONLY="business_days")})
    for moment in ("2027-01-07T01:59:00", "2027-01-08T02:00:01", "2027-01-09T02:00:01", "2027-01-10T02:00:01",
                   "2027-01-11T02:00:01"):
        agent.tick(at(moment))
    assert [(r[0].day, r[1], r[2]) for r in runs(agent, "weekdays")] == [
        (7, "ran", None), (8, "ran", None), (9, "skipped", "calendar: not in business_days"),
        (10, "skipped", "calendar: not in business_days"), (11, "ran", None)]


def test_a_bad_calendar_makes_only_the_jobs_that_use_it_invalid(calendar_agent):
    agent = calendar_agent({"uses_bad": daily(EXCLUDE="bad"), "uses_unknown": daily(ONLY="nowhere"),
                            "fine": daily(EXCLUDE="uk")},
                           extra={"CALENDAR__bad__DATES": "2026-12-24..2026-12-20"})
    agent.tick(at("2026-12-01T00:00:00"))
    assert job_row(agent, "fine")["valid"] == 1
    assert job_row(agent, "uses_bad")["valid"] == 0
    assert job_row(agent, "uses_bad")["config_error"] == (
        "JOB__uses_bad__EXCLUDE='bad': expected valid calendars: 'bad' is not (CALENDAR__bad__DATES="
        "'2026-12-24..2026-12-20': '2026-12-24..2026-12-20': the range ends before it starts (expected "
        "YYYY-MM-DD..a later YYYY-MM-DD))")
    assert job_row(agent, "uses_unknown")["config_error"].startswith(
        "JOB__uses_unknown__ONLY='nowhere': expected names of calendars defined by CALENDAR__<name>__DATES")


def test_jobs_next_and_the_monitor_show_the_calendars_and_the_slots_they_remove(calendar_agent, db_url, capsys):
    import json

    from shared.cli.commands import main as cli

    agent = calendar_agent({"nightly": daily(EXCLUDE="uk", ON_EXCLUDED="next"), "weekdays": daily(ONLY="business_days")})
    agent.tick(at("2026-12-01T00:00:00"))
    capsys.readouterr()
    assert cli(["--db", db_url, "jobs"]) == 0
    out = capsys.readouterr().out
    assert "0 0 2 * * *, excluding uk; an excluded slot moves to the next allowed time" in out
    assert "0 0 2 * * *, only in business_days" in out
    assert cli(["--db", db_url, "next", "nightly", "--count", "3", "--from", "2026-12-23T00:00:00Z", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [(s["at"], s["moved"]) for s in view["slots"]] == [
        ("2026-12-23T02:00:00+00:00", None),
        ("2026-12-27T00:00:00+00:00", "calendar: uk; moved from 2026-12-24T02:00:00+00:00"),
        ("2026-12-27T02:00:00+00:00", None)]
    assert [(s["at"], s["calendar"], s["moved_to"]) for s in view["removed"]] == [
        ("2026-12-24T02:00:00+00:00", "calendar: uk", "2026-12-27T00:00:00+00:00"),
        ("2026-12-25T02:00:00+00:00", "calendar: uk", "2026-12-27T00:00:00+00:00"),
        ("2026-12-26T02:00:00+00:00", "calendar: uk", "2026-12-27T00:00:00+00:00")]
    assert cli(["--db", db_url, "next", "weekdays", "--count", "2", "--from", "2027-01-08T03:00:00Z"]) == 0
    out = capsys.readouterr().out
    assert "2027-01-11 02:00:00" in out and "2027-01-12 02:00:00" in out
    assert "2027-01-09 02:00:00" in out and "calendar: not in business_days" in out   # removed, listed


def test_an_ics_calendar_excludes_its_events(calendar_agent, tmp_path):
    path = tmp_path / "holidays.ics"
    path.write_text("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nBEGIN:VEVENT\r\nUID:ny@test\r\n"
                    "DTSTART;VALUE=DATE:20270101\r\nRRULE:FREQ=YEARLY\r\nSUMMARY:New Year\r\nEND:VEVENT\r\n"
                    "END:VCALENDAR\r\n")
    agent = calendar_agent({"nightly": daily(EXCLUDE="newyear")}, extra={"CALENDAR__newyear__ICS": str(path)})
    for moment in ("2026-12-31T01:59:00", "2027-01-01T02:00:01", "2027-01-02T02:00:01"):
        agent.tick(at(moment))
    assert runs(agent, "nightly") == [(at("2026-12-31T02:00:00"), "ran", None),
                                      (at("2027-01-01T02:00:00"), "skipped", "calendar: newyear"),
                                      (at("2027-01-02T02:00:00"), "ran", None)]


def test_next_steps_over_a_long_excluded_stretch_instead_of_listing_it_whole():
    """An every-second job excluded for a weekend: `next` lists a few removed slots, says where the
    stretch ends, and finds the slots after it at once (not 172,800 walks)."""
    import time

    from shared.engine.views import NEXT_STRETCH_SHOWN, upcoming_slots
    from shared.jobs.calendars import CalendarRules, parse_calendars

    weekend = parse_calendars({"CALENDAR__we__WEEKLY": "SAT-SUN"}).calendars["we"]
    row = {"job_name": "sec", "schedule": "* * * * * *", "timezone": "Europe/Paris", "valid": 1, "enabled": 1,
           "configured": 1, "calendars": CalendarRules(exclude=(weekend,)).as_json(), "jitter_seconds": 0}
    started = time.monotonic()
    view = upcoming_slots(row, at("2026-11-27T23:00:00"), 1000)      # Saturday 00:00 Paris
    assert time.monotonic() - started < 10
    assert view["slots"][0]["at"] == at("2026-11-29T23:00:00") and len(view["slots"]) == 1000   # Monday 00:00 Paris
    assert len(view["removed"]) == NEXT_STRETCH_SHOWN
    assert view["removed"][-1]["calendar"] == "calendar: we (and every slot after it before 2026-11-29T23:00:00+00:00)"
