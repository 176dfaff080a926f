"""`sql-agent next JOB` and the monitor job page's "Next slots" (issue 33 item 6), on SQLite and
PostgreSQL: the slots of the job as the agent last synced it, in UTC and in the job's time zone,
compared with a computation of their own over two years; the notes for jobs whose slots do not
run (on demand, ended, paused, disabled, invalid)."""

from __future__ import annotations

import contextlib
import json
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from shared.cli.commands import main as cli
from shared.cli.output import EXIT_OK
from shared.engine.operations import pause_job
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import at

UTC = timezone.utc
PARIS = ZoneInfo("Europe/Paris")


def last_weekdays_at_22_paris(first: date, months: int) -> list[datetime]:
    """22:00 Paris time on the last Monday-to-Friday day of each month, by walking back from
    the month's last day (independent of the schedule grammar)."""
    out = []
    year, month = first.year, first.month
    for _ in range(months):
        day = date(year + month // 12, month % 12 + 1, 1) - timedelta(days=1)
        while day.weekday() >= 5:
            day -= timedelta(days=1)
        out.append(datetime(day.year, day.month, day.day, 22, tzinfo=PARIS).astimezone(UTC))
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


JOBS = {
    "month_end": {"SCHEDULE": "0 0 22 * * MON-FRI#L", "COMMAND": "SELECT 1", "TIMEZONE": "Europe/Paris"},
    "summer": {"SCHEDULE": "0 30 1 * * * ; from 2026-06-01 ; until 2026-06-03", "COMMAND": "SELECT 1"},
    "by_hand": {"COMMAND": "SELECT 1"},
    "off": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1", "ENABLED": "false"},
    "held": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"},
}


@pytest.fixture
def agent(agent_factory):
    built = agent_factory(JOBS)
    built.tick(at("2026-01-01T00:00:00"))
    return built


def next_json(capsys, db_url, *args):
    capsys.readouterr()
    code = cli(["--db", db_url, "next", *args, "--json"])
    out, err = capsys.readouterr()
    assert code == EXIT_OK and err == "", err
    return json.loads(out)


def test_next_lists_two_years_of_slots_in_utc_and_in_the_jobs_time_zone(agent, db_url, capsys):
    view = next_json(capsys, db_url, "month_end", "--count", "24", "--from", "2026-01-01T00:00:00Z")
    expected = last_weekdays_at_22_paris(date(2026, 1, 1), 24)
    assert [datetime.fromisoformat(s["at"]) for s in view["slots"]] == expected
    assert [s["local"] for s in view["slots"]] == [t.astimezone(PARIS).isoformat() for t in expected]
    assert view["timezone"] == "Europe/Paris" and view["note"] is None and view["count"] == 24
    # strictly after --from: from the first slot itself, the second comes first
    again = next_json(capsys, db_url, "month_end", "--count", "1", "--from", view["slots"][0]["at"])
    assert again["slots"] == view["slots"][1:2]
    # text: both times on each line
    capsys.readouterr()
    assert cli(["--db", db_url, "next", "month_end", "--count", "2", "--from", "2026-01-01T00:00:00Z"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "SLOT (UTC)" in out and "SLOT (Europe/Paris)" in out
    assert "2026-01-30 21:00:00" in out and "2026-01-30 22:00:00+01:00" in out
    assert "2026-02-27 21:00:00" in out and "2026-02-27 22:00:00+01:00" in out


def test_next_says_why_there_are_fewer_slots_or_why_they_do_not_run(agent, db_url, capsys):
    summer = next_json(capsys, db_url, "summer", "--count", "5", "--from", "2026-01-01T00:00:00Z")
    assert [s["at"] for s in summer["slots"]] == ["2026-06-01T01:30:00+00:00", "2026-06-02T01:30:00+00:00",
                                                  "2026-06-03T01:30:00+00:00"]
    assert summer["note"] == "its schedule ends on 2026-06-03"
    assert next_json(capsys, db_url, "by_hand")["note"] == "on demand: no slot (it runs when started)"
    off = next_json(capsys, db_url, "off", "--count", "1")
    assert len(off["slots"]) == 1 and off["note"] == "disabled: these slots are not claimed"
    pause_job(agent.store(), "held", now=at("2026-01-01T00:00:00"), reason="test")
    held = next_json(capsys, db_url, "held", "--count", "1")
    assert len(held["slots"]) == 1 and held["note"].startswith("paused: a slot that comes while paused")


def test_the_monitor_job_page_shows_the_next_slots(agent):
    @contextlib.contextmanager
    def lend():
        store = agent.new_store()
        try:
            yield store
        finally:
            store.close()

    now = datetime(2026, 1, 15, tzinfo=UTC)
    monitor = Monitor(lend, clock=lambda: now, settings=lambda: MonitorSettings())
    html = monitor.handle("GET", "/jobs/month_end", "", "").body.decode()
    assert "<h2>Next slots</h2>" in html and "2026-01-30 22:00:00+01:00" in html
    document = json.loads(monitor.handle("GET", "/jobs/month_end", "format=json", "").body)
    expected = last_weekdays_at_22_paris(date(2026, 1, 1), 10)
    assert [datetime.fromisoformat(s["at"]) for s in document["next"]["slots"]] == expected
    by_hand = monitor.handle("GET", "/jobs/by_hand", "", "").body.decode()
    assert "on demand: no slot" in by_hand
