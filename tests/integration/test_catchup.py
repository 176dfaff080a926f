"""JOB__<name>__CATCHUP_SECONDS (issue 33 item 5), on SQLite and PostgreSQL: after downtime every
missed slot within the window runs, oldest first, respecting the overlap policy and
AGENT_MAX_CONCURRENCY; older missed slots are skipped; no claim skips a caught-up slot as a
misfire; conflicting settings are refused naming both; a huge window is bounded."""

from __future__ import annotations

from datetime import timedelta

import pytest

from shared.engine.scheduler import MAX_CATCHUP_SLOTS
from shared.jobs.from_settings import parse_jobs
from tests.support.harness import at, execute, runs_table

HOURLY = {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1", "LEASE_SECONDS": "3600"}


def runs_of(agent, job):
    rows = agent.store().execute("list_history", job_name=job, limit=5000).rows
    return sorted(rows, key=lambda r: r["scheduled_for"])


def claim(agent, now, max_concurrency=100, batch=100):
    return agent.store().execute("claim_runs", now=now, late_cutoff=now - timedelta(seconds=120), worker="w",
                                 max_concurrency=max_concurrency, batch=batch).rows


def finish(agent, run_ids):
    if run_ids:
        execute(agent, f"UPDATE {runs_table(agent)} SET status = 'succeeded' "
                       f"WHERE run_id IN ({', '.join(map(str, run_ids))})")


def test_every_missed_slot_within_the_window_runs_oldest_first_one_at_a_time(agent_factory):
    agent = agent_factory({"h": {**HOURLY, "CATCHUP_SECONDS": str(5 * 3600), "OVERLAP": "queue"}})
    agent.tick(at("2026-01-01T00:30:00"))
    agent.tick(at("2026-01-01T10:10:00"))                 # down from 01:00 to 10:00
    statuses = {r["scheduled_for"]: (r["status"], r["note"]) for r in runs_of(agent, "h")}
    window = [at(f"2026-01-01T{h:02d}:00:00") for h in range(6, 11)]     # 05:10 .. 10:10
    older = [at(f"2026-01-01T{h:02d}:00:00") for h in range(1, 6)]
    assert all(statuses[s][0] == "pending" and statuses[s][1].startswith("catch-up:") for s in window), statuses
    assert all(statuses[s][0] == "skipped" and "CATCHUP_SECONDS" in statuses[s][1] for s in older), statuses
    now = at("2026-01-01T10:10:05")
    started = []
    for _ in range(len(window)):
        rows = claim(agent, now)
        assert [r["decision"] for r in rows] == ["start"], rows       # queue: one at a time, never skipped
        started.append(rows[0]["scheduled_for"])
        finish(agent, [rows[0]["run_id"]])
        now += timedelta(minutes=5)                              # long past the misfire threshold
    assert started == window
    assert claim(agent, now) == []


def test_the_catch_up_respects_the_cap(agent_factory):
    jobs = {f"h{i}": {**HOURLY, "CATCHUP_SECONDS": str(3 * 3600), "OVERLAP": "allow"} for i in range(3)}
    agent = agent_factory(jobs)
    agent.tick(at("2026-01-01T00:30:00"))
    agent.tick(at("2026-01-01T10:10:00"))
    now = at("2026-01-01T10:10:05")
    first = claim(agent, now, max_concurrency=4)
    assert len([r for r in first if r["decision"] == "start"]) == 4
    assert claim(agent, now, max_concurrency=4) == []            # the cap holds the other five
    finish(agent, [r["run_id"] for r in first])
    second = claim(agent, now + timedelta(minutes=10), max_concurrency=4)
    assert len([r for r in second if r["decision"] == "start"]) == 4
    finish(agent, [r["run_id"] for r in second])
    third = claim(agent, now + timedelta(minutes=20), max_concurrency=4)
    assert [r["decision"] for r in third] == ["start"]
    assert not [r for r in first + second + third if r["decision"] == "skipped"]
    for name in jobs:                                           # each job's window: 08:00, 09:00, 10:00
        assert [r["status"] for r in runs_of(agent, name)][-4:-1] != ["skipped"] * 3


def test_without_a_window_run_once_catches_up_only_the_latest(agent_factory):
    """The contrast (unchanged): MISFIRE=run-once alone runs one of the missed slots."""
    agent = agent_factory({"h": HOURLY})
    agent.tick(at("2026-01-01T00:30:00"))
    agent.tick(at("2026-01-01T10:10:00"))
    pending = [r for r in runs_of(agent, "h") if r["status"] == "pending" and r["scheduled_for"] < at("2026-01-01T10:10:00")]
    assert [r["scheduled_for"] for r in pending] == [at("2026-01-01T10:00:00")]


def test_a_huge_window_runs_at_most_the_bound(agent_factory):
    agent = agent_factory({"s": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "queue",
                                 "CATCHUP_SECONDS": str(366 * 86400), "GRACE_SECONDS": str(366 * 86400)}})
    agent.tick(at("2026-01-01T00:00:30"))
    agent.tick(at("2026-01-03T00:00:30"))                       # two days down: 2,880 missed slots
    rows = runs_of(agent, "s")
    caught = [r for r in rows if r["status"] == "pending" and (r["note"] or "").startswith("catch-up:")]
    assert len(caught) == MAX_CATCHUP_SLOTS
    assert "older slot(s) of the window not run" in caught[0]["note"]
    assert caught[-1]["scheduled_for"] == at("2026-01-02T23:58:00")


@pytest.mark.parametrize("extra, expected", [
    ({"MISFIRE": "skip", "OVERLAP": "queue"}, "JOB__j__MISFIRE=skip conflict"),
    ({"OVERLAP": "skip"}, "JOB__j__OVERLAP=skip conflict"),
    ({}, "JOB__j__OVERLAP=skip conflict"),                               # the default overlap
    ({"OVERLAP": "cancel-previous"}, "JOB__j__OVERLAP=cancel-previous conflict"),
    ({"OVERLAP": "queue", "GRACE_SECONDS": "60"}, "expected at most JOB__j__GRACE_SECONDS=60"),
])
def test_conflicting_settings_are_refused_naming_both(extra, expected):
    jobs, invalid = parse_jobs({"JOB__j__SCHEDULE": "0 0 * * * *", "JOB__j__COMMAND": "SELECT 1",
                                "JOB__j__CATCHUP_SECONDS": "3600", **{f"JOB__j__{k}": v for k, v in extra.items()}})
    assert not jobs and expected in invalid[0].message, invalid


@pytest.mark.parametrize("raw", ["-1", "1e3", " x", "99999999999999999999", str(366 * 86400 + 1), "NaN"])
def test_bad_catchup_values_name_the_setting(raw):
    jobs, invalid = parse_jobs({"JOB__j__SCHEDULE": "0 0 * * * *", "JOB__j__COMMAND": "SELECT 1",
                                "JOB__j__OVERLAP": "queue", "JOB__j__CATCHUP_SECONDS": raw})
    assert not jobs and "JOB__j__CATCHUP_SECONDS" in invalid[0].message, (raw, invalid)


def test_zero_is_no_window():
    jobs, invalid = parse_jobs({"JOB__j__SCHEDULE": "0 0 * * * *", "JOB__j__COMMAND": "SELECT 1",
                                "JOB__j__CATCHUP_SECONDS": "0"})
    assert not invalid and jobs[0].catchup_seconds == 0


def test_queue_mode_dispatches_and_starts_the_caught_up_slots(agent_factory):
    """dispatch_runs and start_run never skip a caught-up slot as a misfire either."""
    from shared.messaging.memory import MemoryQueue
    agent = agent_factory({"h": {**HOURLY, "CATCHUP_SECONDS": str(3 * 3600), "OVERLAP": "allow"}}, queue=MemoryQueue())
    agent.tick(at("2026-01-01T00:30:00"))
    report = agent.tick(at("2026-01-01T10:10:00"))
    dispatched = sorted(r["scheduled_for"] for r in report.dispatched)
    assert [at(f"2026-01-01T{h:02d}:00:00") for h in (8, 9, 10)] == [s for s in dispatched if s.hour in (8, 9, 10)]
    now = at("2026-01-01T10:15:00")                               # long past the misfire threshold
    for run in runs_of(agent, "h"):
        if run["status"] != "queued":
            continue
        (row,) = agent.store().execute("start_run", run_id=run["run_id"], token=run["token"], now=now, worker="w",
                                       dequeue_count=1, max_concurrency=100,
                                       late_cutoff=now - timedelta(seconds=120)).rows
        assert row["decision"] == "start", row
