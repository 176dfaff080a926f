"""Liveness (issue 32 item 7): the tick records its time and period (shared/engine/liveness.py)
in the batch of its last step; the monitor's pages (a banner at the top), its JSON twins (the
Agent-Liveness header) and `sql-agent jobs` (a WARNING line first) say when the agent is late by
more than two tick periods, and quiet ticks (AGENT_QUIET_MAX_MINUTES) do not make it cry wolf."""

from __future__ import annotations

import contextlib
import json
import subprocess
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.liveness import LAST_TICK_KEY, liveness, tick_period_seconds
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import ROOT, Clock, create_pg_database, drop_pg_database, make_agent

UTC = timezone.utc
T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)
PYTHON = str(ROOT / ".venv" / "bin" / "python")


def test_the_period_is_the_largest_gap_of_the_tick_schedule_or_the_quiet_maximum():
    assert tick_period_seconds("0 * * * * *", 0, T0) == 60
    assert tick_period_seconds("*/10 * * * * *", 0, T0) == 10
    assert tick_period_seconds("0 */5 * * * *", 0, T0) == 300
    # irregular: 0, 10 and 50 past the minute: the 40-second gap counts
    assert tick_period_seconds("0,10,50 * * * * *", 0, T0) == 40
    assert tick_period_seconds("0 * * * * *", 30, T0) == 1800      # quiet ticks may sleep 30 min
    assert tick_period_seconds("0 */5 * * * *", 1, T0) == 300      # the quiet maximum is shorter


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'agent.db'}"
        return
    name, url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(name)


def monitor_of(agent, clock):
    @contextlib.contextmanager
    def lend():
        store = agent.new_store()
        try:
            yield store
        finally:
            store.close()

    return Monitor(lend, clock=clock, settings=lambda: MonitorSettings(refresh_seconds=0))


def test_a_tick_records_itself_and_two_periods_later_every_reader_says_late(db):
    clock = Clock(T0)
    agent = make_agent(db, {"j": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}, clock=clock,
                       AGENT_TICK_SCHEDULE="0 * * * * *")
    try:
        store = agent.new_store()
        try:
            assert liveness(store, T0)["late"] is True and "no tick" in liveness(store, T0)["message"]
            report = agent.tick(T0)
            assert not report.errors
            record = json.loads(store.execute("get_state", state_key=LAST_TICK_KEY).scalar())
            assert record == {"at": T0.isoformat(), "period_seconds": 60}
            assert liveness(store, T0 + timedelta(seconds=120))["late"] is False      # two periods: not yet
            late = liveness(store, T0 + timedelta(seconds=121))
            assert late["late"] is True and "has not ticked since 2026-03-02 10:00:00 UTC" in late["message"]
        finally:
            store.close()

        monitor = monitor_of(agent, clock)
        clock.now = T0 + timedelta(seconds=90)
        for path in ("/", "/jobs/j", "/poison", "/stuck", "/audit"):
            response = monitor.handle("GET", path)
            assert response.status == 200 and b"Agent late" not in response.body, path
            assert response.headers["Agent-Liveness"].startswith("ok; last-tick=2026-03-02T10:00:00")
        clock.now = T0 + timedelta(minutes=7)
        for path in ("/", "/jobs/j", "/poison", "/stuck", "/audit"):
            response = monitor.handle("GET", path)
            body = response.body.decode()
            # at the top: before the page's own heading
            assert body.index('class="liveness late"') < body.index("<h1>"), path
            assert "has not ticked since 2026-03-02 10:00:00 UTC (7 min ago" in body
            twin = monitor.handle("GET", path, "format=json")
            assert twin.headers["Agent-Liveness"] == "late; last-tick=2026-03-02T10:00:00+00:00; period-seconds=60"
            json.loads(twin.body)                  # the document keeps its shape
        # a tick later: quiet again
        agent.tick(clock.now)
        assert b"Agent late" not in monitor.handle("GET", "/").body
    finally:
        agent.close()


def test_with_quiet_ticks_the_period_is_the_quiet_maximum(db):
    clock = Clock(T0)
    agent = make_agent(db, {"j": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}, clock=clock,
                       AGENT_TICK_SCHEDULE="0 * * * * *", AGENT_QUIET_MAX_MINUTES="20")
    try:
        agent.tick(T0)
        store = agent.new_store()
        try:
            # 30 minutes of quiet ticks that did not connect: within two quiet maxima, not late
            assert liveness(store, T0 + timedelta(minutes=30))["late"] is False
            assert liveness(store, T0 + timedelta(minutes=41))["late"] is True
        finally:
            store.close()
    finally:
        agent.close()


def test_jobs_says_so_first_and_jobs_json_stays_one_document(tmp_path):
    db = f"sqlite:///{tmp_path / 'agent.db'}"
    agent = make_agent(db, {"j": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}})
    long_ago = datetime.now(UTC) - timedelta(hours=3)
    agent.tick(long_ago)
    agent.close()
    env = {"PATH": "/usr/bin:/bin"}
    shown = subprocess.run([PYTHON, "-m", "shared.cli", "--db", db, "jobs"], cwd=ROOT, capture_output=True, text=True,
                           timeout=120, env=env)
    assert shown.returncode == 0, shown.stderr
    first = shown.stdout.splitlines()[0]
    assert first.startswith("WARNING: the agent has not ticked since ") and "3 h 0 min ago" in first
    as_json = subprocess.run([PYTHON, "-m", "shared.cli", "--db", db, "jobs", "--json"], cwd=ROOT, capture_output=True,
                             text=True, timeout=120, env=env)
    assert as_json.returncode == 0 and [row["job_name"] for row in json.loads(as_json.stdout)] == ["j"]
    # On stderr, a log record as every other under --json (docs/operations.md): one JSON object a line.
    (record,) = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert record["level"] == "WARNING" and record["message"].startswith("the agent has not ticked since ")
