"""Calendars hardened, in the claim (issue 33), on SQLite and PostgreSQL: an ONLY weekly window
that starts inside a daylight-saving gap keeps that week's run, at the first instant after the
gap; a job whose calendars allow no time within a year has its slots recorded skipped saying so,
and the tick stays quick."""

from __future__ import annotations

import time

import pytest

from shared.messaging.memory import MemoryQueue
from tests.support.harness import at, make_agent


@pytest.fixture
def agent_of(db_url):
    agents = []

    def build(jobs, **env):
        agent = make_agent(db_url, jobs, queue=MemoryQueue(), **env)
        agents.append(agent)
        return agent

    yield build
    for agent in agents:
        agent.close()


def history(agent, job):
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    return sorted((r["scheduled_for"], r["status"], r["note"]) for r in rows)


def test_an_only_window_starting_in_the_spring_gap_runs_at_the_first_instant_after_it(agent_of):
    # Europe/London 2026-03-29: 01:00 GMT jumps to 02:00 BST; the window SUN 01:30-03:00 holds
    # 02:00-03:00 BST (01:00-02:00 UTC) that day.
    agent = agent_of({"weekly": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1", "TIMEZONE": "Europe/London",
                                 "ONLY": "sunday_night", "ON_EXCLUDED": "next"}},
                     CALENDAR__sunday_night__WEEKLY="SUN 01:30-03:00")
    for moment in ("2026-03-28T23:59:00", "2026-03-29T00:00:01", "2026-03-29T01:00:01", "2026-03-29T02:00:01"):
        agent.tick(at(moment))
    got = {slot: (status, note) for slot, status, note in history(agent, "weekly")}
    assert got[at("2026-03-29T00:00:00")] == ("skipped", "calendar: not in sunday_night; moved to 2026-03-29T01:00:00+00:00")
    assert got[at("2026-03-29T01:00:00")][0] != "skipped"          # the week's run: 02:00 BST
    assert got[at("2026-03-29T02:00:00")] == ("skipped", "calendar: not in sunday_night; moved to 2026-04-05T00:30:00+00:00")


def test_calendars_that_allow_nothing_within_a_year_skip_the_slots_saying_so_quickly(agent_of):
    days = ",".join(f"{year}-01-01..{year}-12-31" for year in range(2026, 2032))
    agent = agent_of({"never": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "EXCLUDE": "always",
                                "ON_EXCLUDED": "next"},
                      "past": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "ONLY": "gone", "ON_EXCLUDED": "next"}},
                     CALENDAR__always__DATES=days, CALENDAR__gone__DATES="2020-01-01")
    agent.tick(at("2026-06-01T11:59:30"))
    started = time.monotonic()
    agent.tick(at("2026-06-01T12:05:01"))
    assert time.monotonic() - started < 20          # a backstop: each slot's answer is a few binary searches
    for job, note in (("never", "calendar: always"), ("past", "calendar: not in gone")):
        rows = [r for r in history(agent, job) if r[0] >= at("2026-06-01T12:00:00")]
        assert rows and all(r[1] == "skipped" for r in rows), rows          # nothing runs
        decided = [r for r in rows if r[2].startswith("calendar:")]        # (the others: misfire's)
        assert len(decided) >= 3 and all(r[2].startswith(note) and r[2].endswith("; no allowed time within a year")
                                         for r in decided), decided
