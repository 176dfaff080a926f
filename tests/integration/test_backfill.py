"""sql-agent backfill JOB --from --to (issue 33 item 5), on SQLite and PostgreSQL: the slots of a
past window become recorded runs of their slots, oldest first; a slot that already ran is not
run twice (a second backfill, or two at once, make each run once); a slot recorded skipped that
never started is run now; the window is bounded; every call is audited, done or refused; the
runs of a job removed mid-backfill are not run."""

from __future__ import annotations

import json
import threading
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.operations import MAX_BACKFILL_SLOTS, backfill
from shared.errors import NotFoundError, UsageError
from tests.support.harness import execute, make_agent, query, work

UTC = timezone.utc
HOURLY = {"SCHEDULE": "0 0 * * * *", "MISFIRE": "skip"}


def hour(value: datetime) -> datetime:
    return value.replace(minute=0, second=0, microsecond=0)


def build(agent_factory, jobs=None):
    jobs = jobs or {"h": {**HOURLY, "COMMAND": "INSERT INTO seen (v) VALUES (1)"}}
    agent = agent_factory(jobs)
    if agent.target.dialect == "sqlite":
        execute(agent, "CREATE TABLE seen (id INTEGER PRIMARY KEY AUTOINCREMENT, v INT)")
    else:
        execute(agent, "CREATE TABLE seen (id SERIAL PRIMARY KEY, v INT)")
    agent.tick(datetime.now(UTC))
    return agent


def runs(agent, job="h"):
    return sorted(agent.store().execute("list_history", job_name=job, limit=5000).rows, key=lambda r: r["run_id"])


def audit_rows(agent):
    return [r for r in agent.store().execute("list_audit", job_name=None, since=None, limit=100).rows
            if r["action"] == "backfill"]


def test_backfill_runs_each_slot_of_the_window_once_oldest_first(agent_factory):
    agent = build(agent_factory)
    now = datetime.now(UTC)
    start, end = hour(now) - timedelta(hours=6), hour(now) - timedelta(hours=2)
    done = backfill(agent, "h", start, end)
    expected = [start + timedelta(hours=i) for i in range(5)]          # both ends included
    assert [row["scheduled_for"] for row in done.made] == expected
    assert {row["action"] for row in done.made} == {"inserted"} and done.already == 0
    work(agent)
    made = [r for r in runs(agent) if r["kind"] == "backfill"]
    assert [r["scheduled_for"] for r in made] == expected
    assert all(r["status"] == "succeeded" for r in made), made
    # Oldest first: each started after the one before it ended (overlap queue for backfill runs).
    starts = [r["started_at"] for r in made]
    assert starts == sorted(starts)
    assert query(agent, "SELECT COUNT(*) FROM seen") == [(5,)]
    # Again, wider: only the slots without a run are made; none runs twice.
    again = backfill(agent, "h", start - timedelta(hours=2), end)
    assert [row["scheduled_for"] for row in again.made] == [start - timedelta(hours=2), start - timedelta(hours=1)]
    assert again.already == 5
    work(agent)
    assert query(agent, "SELECT COUNT(*) FROM seen") == [(7,)]
    rows = audit_rows(agent)
    assert [r["outcome"] for r in rows] == ["done", "done"]
    assert "5 slot(s): 5 run(s) made" in rows[-1]["detail"] and json.loads(rows[-1]["arguments"])["job_name"] == "h"


def test_a_skipped_slot_is_run_by_its_own_row(agent_factory, db_url):
    agent = build(agent_factory)
    now = datetime.now(UTC)
    # The agent was "down": the tick after records the missed slots skipped (MISFIRE=skip).
    execute(agent, "DELETE FROM " + ("agent_runs" if agent.target.dialect == "sqlite" else "agent.runs"))
    execute(agent, ("UPDATE agent_jobs" if agent.target.dialect == "sqlite" else "UPDATE agent.jobs")
            + f" SET next_due_at = '{(hour(now) - timedelta(hours=3)).strftime('%Y-%m-%d %H:%M:%S')}'")
    agent.tick(now)
    skipped = [r for r in runs(agent) if r["status"] == "skipped"]
    assert len(skipped) >= 2
    done = backfill(agent, "h", hour(now) - timedelta(hours=3), hour(now) - timedelta(hours=1))
    assert {row["run_id"] for row in done.made if row["action"] == "rerun"} <= {r["run_id"] for r in skipped}
    assert sum(1 for row in done.made if row["action"] == "rerun") >= 2
    work(agent)
    by_slot: dict = {}
    for r in runs(agent):
        by_slot.setdefault(r["scheduled_for"], []).append(r)
    assert all(len(v) == 1 for v in by_slot.values())           # one run per slot, always
    for row in done.made:
        assert by_slot[row["scheduled_for"]][0]["status"] == "succeeded"


def test_two_backfills_at_once_make_each_run_once(agent_factory, db_url):
    agent = build(agent_factory)
    now = datetime.now(UTC)
    start, end = hour(now) - timedelta(hours=40), hour(now) - timedelta(hours=1)
    other = make_agent(db_url, {"h": {**HOURLY, "COMMAND": "INSERT INTO seen (v) VALUES (1)"}})
    barrier = threading.Barrier(2)
    results, failures = [], []

    def one(instance):
        try:
            barrier.wait(timeout=30)
            results.append(backfill(instance, "h", start, end))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(a,)) for a in (agent, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert sum(len(r.made) for r in results) == 40
    slots = [r["scheduled_for"] for r in runs(agent) if r["kind"] == "backfill"]
    assert len(slots) == len(set(slots)) == 40


def test_the_window_is_bounded_and_checked_with_clear_errors(agent_factory):
    agent = build(agent_factory, {"s": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"},
                                  "od": {"COMMAND": "SELECT 1"}})
    now = datetime.now(UTC)
    with pytest.raises(UsageError) as caught:
        backfill(agent, "s", now - timedelta(days=400 * 365), now - timedelta(minutes=1))
    assert f"more than {MAX_BACKFILL_SLOTS} slots" in str(caught.value) and caught.value.setting == "--to"
    with pytest.raises(UsageError) as caught:
        backfill(agent, "s", now - timedelta(minutes=5), now + timedelta(minutes=5))
    assert "in the future" in str(caught.value)
    with pytest.raises(UsageError) as caught:
        backfill(agent, "s", now - timedelta(minutes=5), now - timedelta(minutes=5))
    assert "is not before --to" in str(caught.value)
    with pytest.raises(UsageError) as caught:
        backfill(agent, "od", now - timedelta(minutes=5), now - timedelta(minutes=1))
    assert "on demand" in str(caught.value)
    with pytest.raises(NotFoundError):
        backfill(agent, "ghost", now - timedelta(minutes=5), now - timedelta(minutes=1))
    assert [r for r in runs(agent, "s") if r["kind"] == "backfill"] == []
    assert [r["outcome"] for r in audit_rows(agent)] == ["refused"] * 5
    # Exactly the bound: 1000 slots of a job every minute is accepted.
    done = backfill(agent, "s", hour(now) - timedelta(minutes=1100), hour(now) - timedelta(minutes=101))
    assert done.slots == MAX_BACKFILL_SLOTS


def test_backfill_runs_of_a_job_removed_mid_backfill_do_not_run(agent_factory, db_url):
    agent = build(agent_factory)
    now = datetime.now(UTC)
    done = backfill(agent, "h", hour(now) - timedelta(hours=10), hour(now) - timedelta(hours=1))
    assert len(done.made) == 10
    removed = make_agent(db_url, {})
    removed.tick(datetime.now(UTC))
    work(removed)
    made = [r for r in runs(agent) if r["kind"] == "backfill"]
    assert {r["status"] for r in made} == {"skipped"}, made
    assert query(agent, "SELECT COUNT(*) FROM seen") == [(0,)]


def test_backfill_from_the_command_line_json(agent_factory, capsys):
    from shared.cli.commands import cmd_backfill
    agent = build(agent_factory)
    now = datetime.now(UTC)

    class Args:
        json = True
        name = "h"
        start = hour(now) - timedelta(hours=3)
        end = hour(now) - timedelta(hours=2)

    assert cmd_backfill(agent, Args()) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["slots"] == 2 and len(document["runs"]) == 2 and document["already_run"] == 0
