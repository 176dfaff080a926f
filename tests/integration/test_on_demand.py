"""On-demand jobs (issue 27, item 1): a job without SCHEDULE is valid, never claims a slot, and
runs when started (run-now); `jobs`, its JSON and the monitor's rows show it as "on demand"."""

from __future__ import annotations

import contextlib
import re
from datetime import datetime, timedelta, timezone

from shared.cli.commands import main as cli
from shared.engine.views import jobs_view
from shared.jobs.describe import describe_schedule
from shared.jobs.from_settings import parse_jobs
from shared.jobs.schedules import parse_schedule
from shared.web.app import Monitor, MonitorSettings
from tests.support.harness import Clock, at, query, runs_table, work


def test_a_job_without_schedule_parses_as_on_demand():
    valid, invalid = parse_jobs({"JOB__adhoc__COMMAND": "SELECT 1", "JOB__adhoc__TIMEZONE": "Europe/Paris",
                                 "JOB__blank__COMMAND": "SELECT 2", "JOB__blank__SCHEDULE": "   "})
    assert invalid == ()
    assert {job.name: job.schedule for job in valid} == {"adhoc": "", "blank": ""}
    schedule = parse_schedule("", "Europe/Paris")
    assert schedule.initial_due(at("2026-11-25T00:00:00Z")) is None
    assert schedule.next_after(at("2026-11-25T00:00:00Z")) is None
    assert describe_schedule("") == "on demand" and describe_schedule(None) == "on demand"
    # Still refused: a job with neither command nor steps, and a schedule that is not one.
    _, invalid = parse_jobs({"JOB__empty__TIMEZONE": "UTC", "JOB__bad__COMMAND": "SELECT 1",
                             "JOB__bad__SCHEDULE": "0 0 *"})
    assert {bad.name for bad in invalid} == {"empty", "bad"}


def test_an_on_demand_job_claims_no_slot_and_runs_when_started(agent_factory, db_url, capsys):
    # Two hours before the real hour: `run-now` (the CLI) makes the run runnable at the
    # database's real time, which the agent's clock has passed when it works (3 h 1 s later).
    clock = Clock(datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2))
    agent = agent_factory({"adhoc": {"COMMAND": "SELECT 1"},
                           "steps": {"STEPS__1__COMMAND": "SELECT 1", "STEPS__2__COMMAND": "SELECT 2"},
                           "timed": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}}, clock=clock)
    for _ in range(3):
        agent.tick()
        clock.advance(3600)
    rows = {r["job_name"]: r for r in jobs_view(agent.store(), clock.now)}
    for name in ("adhoc", "steps"):
        assert rows[name]["valid"] == 1 and rows[name]["next_due_at"] is None, rows[name]
        assert rows[name]["schedule_words"] == "on demand" and rows[name]["state"] == "enabled"
    assert rows["timed"]["next_due_at"] is not None
    counts = dict(query(agent, f"SELECT job_name, COUNT(*) FROM {runs_table(agent)} GROUP BY job_name"))
    assert "adhoc" not in counts and "steps" not in counts and counts["timed"] >= 2
    # Started by hand: one run each, executed as any run.
    for name in ("adhoc", "steps"):
        assert cli(["--db", db_url, "run-now", name]) == 0
        assert f"of {name} created" in capsys.readouterr().out
    clock.advance(1)
    work(agent)
    statuses = query(agent, f"SELECT job_name, status FROM {runs_table(agent)} WHERE job_name IN ('adhoc', 'steps') "
                            "ORDER BY job_name")
    assert statuses == [("adhoc", "succeeded"), ("steps", "succeeded")]
    # Later ticks still claim nothing for them.
    agent.tick()
    clock.advance(timedelta(days=1).total_seconds())
    agent.tick()
    counts = dict(query(agent, f"SELECT job_name, COUNT(*) FROM {runs_table(agent)} GROUP BY job_name"))
    assert (counts["adhoc"], counts["steps"]) == (1, 1)
    # `jobs` and the monitor show it.
    assert cli(["--db", db_url, "jobs"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("adhoc "))
    assert "on demand" in line
    store = agent.new_store()
    try:
        monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: clock.now,
                          settings=lambda: MonitorSettings())
        body = monitor.handle("GET", "/", "", "").body.decode()
        row = re.search(r'<tr class="job" id="job-adhoc">(.*?)</tr>', body, re.S).group(1)
        assert "on demand" in row
        assert "on demand" in monitor.handle("GET", "/jobs/adhoc", "", "").body.decode()
    finally:
        store.close()


def test_agent_start_job_starts_an_on_demand_job_from_t_sql(pg_url):
    from tests.support.harness import make_agent
    from tests.support.tsql_caller import call, connect

    agent = make_agent(pg_url, {"adhoc": {"COMMAND": "SELECT 1"}})
    agent.tick()
    connection = connect(pg_url)
    try:
        (row,) = call(connection, "start_job", job_name="adhoc")
    finally:
        connection.close()
    work(agent)
    assert query(agent, f"SELECT run_id, job_name, status FROM {runs_table(agent)}") == [
        (row["run_id"], "adhoc", "succeeded")]
    activity = {r["job_name"]: r for r in jobs_view(agent.store(), datetime.now(timezone.utc))}
    assert activity["adhoc"]["next_due_at"] is None and activity["adhoc"]["schedule_words"] == "on demand"


def test_a_schedule_removed_skips_the_slots_claimed_ahead(db_url):
    from tests.support.harness import make_agent

    clock = Clock(at("2026-11-25T08:00:00Z"))
    first = make_agent(db_url, {"j": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}}, clock=clock)
    first.tick()
    assert [status for (status,) in query(first, f"SELECT status FROM {runs_table(first)}")] == ["pending"]
    first.close()
    clock.advance(5)
    second = make_agent(db_url, {"j": {"COMMAND": "SELECT 1"}}, clock=clock)
    second.tick()
    assert query(second, f"SELECT status FROM {runs_table(second)}") == [("skipped",)]
    clock.advance(600)
    second.tick()
    assert len(query(second, f"SELECT status FROM {runs_table(second)}")) == 1
    (row,) = [r for r in jobs_view(second.store(), clock.now) if r["job_name"] == "j"]
    assert row["next_due_at"] is None and row["schedule_words"] == "on demand"
