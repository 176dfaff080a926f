"""The tick on both dialects: one claim per occurrence, misfire and overlap decisions
recorded, bad settings isolated, constant statements per tick, nothing lost on dispatch."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from shared.errors import QueueError
from shared.queues import DatabaseQueue
from tests.conftest import at, make_agent, query, runs_table

HOURLY = {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}


def runs_of(agent, job=None):
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    return sorted(rows, key=lambda r: r["run_id"])


def job_row(agent, name):
    return next(r for r in agent.store().execute("list_jobs").rows if r["job_name"] == name)


def test_claim_once_per_occurrence_even_when_ticked_twice(agent_factory, db_url):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))                     # syncs: next slot 13:00
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T13:00:00")
    first = agent.tick(at("2026-01-01T13:00:05"))
    second = agent.tick(at("2026-01-01T13:00:06"))            # the timer firing twice
    other = make_agent(db_url, {"hourly": HOURLY})             # another instance
    third = other.tick(at("2026-01-01T13:00:07"))
    other.close()
    assert len(first.claimed) == 1 and second.claimed == [] and third.claimed == []
    (run,) = runs_of(agent, "hourly")
    assert run["scheduled_for"] == at("2026-01-01T13:00:00") and run["status"] == "queued"
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T14:00:00")


def test_a_lost_advance_is_repaired_by_the_next_tick(agent_factory):
    """A tick that claimed but died before moving next_due_at: the next tick's claim
    conflicts on the unique key, and it still advances the job (no duplicate, no stall)."""
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    store = agent.store()
    now = at("2026-01-01T13:00:05")
    store.execute("claim_due_runs", now=now, late_cutoff=now - timedelta(seconds=120))  # ...then "crash"
    report = agent.tick(at("2026-01-01T13:00:30"))
    assert report.claimed == [] and report.due_jobs == 1
    assert len(runs_of(agent, "hourly")) == 1
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T14:00:00")


def test_misfire_run_once_catches_up_once_within_grace(agent_factory):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T15:10:00"))            # down at 13:00, 14:00 and 15:00
    (run,) = runs_of(agent, "hourly")                          # one run, not three
    assert run["status"] == "queued"
    assert run["scheduled_for"] == at("2026-01-01T13:00:00")
    assert "caught up" in run["note"]
    assert len(report.dispatched) == 1
    assert job_row(agent, "hourly")["next_due_at"] == at("2026-01-01T16:00:00")


def test_misfire_beyond_grace_is_recorded_skipped(agent_factory):
    agent = agent_factory({"hourly": {**HOURLY, "GRACE_SECONDS": "3600"}})
    agent.tick(at("2026-01-01T12:30:00"))
    agent.tick(at("2026-01-01T15:10:00"))
    (run,) = runs_of(agent, "hourly")
    assert run["status"] == "skipped" and "grace" in run["note"]
    assert run["finished_at"] is not None


def test_misfire_skip_policy(agent_factory):
    agent = agent_factory({"hourly": {**HOURLY, "MISFIRE": "skip"}})
    agent.tick(at("2026-01-01T12:30:00"))
    agent.tick(at("2026-01-01T13:05:00"))                     # 5 min late > 120 s threshold
    agent.tick(at("2026-01-01T14:00:30"))                     # on time
    late, on_time = runs_of(agent, "hourly")
    assert late["status"] == "skipped" and "policy skip" in late["note"]
    assert on_time["status"] == "queued" and on_time["scheduled_for"] == at("2026-01-01T14:00:00")


def test_one_time_job_runs_once(agent_factory):
    agent = agent_factory({"once": {"SCHEDULE": "@once 2026-01-01T13:00:00", "COMMAND": "SELECT 1"}})
    agent.tick(at("2026-01-01T12:00:00"))
    agent.tick(at("2026-01-01T13:00:01"))
    agent.tick(at("2026-01-02T13:00:01"))
    (run,) = runs_of(agent, "once")
    assert run["scheduled_for"] == at("2026-01-01T13:00:00")
    assert job_row(agent, "once")["next_due_at"] is None


def test_overlap_skip_records_the_skipped_slot(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:01:00"))                     # claimed and queued, never worked
    agent.tick(at("2026-01-01T12:02:00"))                     # previous still in flight
    first, second = runs_of(agent, "m")
    assert first["status"] == "queued"
    assert second["status"] == "skipped" and second["note"].startswith("overlap")


def test_overlap_queue_waits_for_the_previous_run(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "queue"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:01:00"))
    report = agent.tick(at("2026-01-01T12:02:00"))
    first, second = runs_of(agent, "m")
    assert first["status"] == "queued" and second["status"] == "pending"
    assert report.dispatched == []


def test_overlap_allow_dispatches_both(agent_factory):
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "allow"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:01:00"))
    agent.tick(at("2026-01-01T12:02:00"))
    assert [r["status"] for r in runs_of(agent, "m")] == ["queued", "queued"]


def test_bad_setting_for_one_job_does_not_stop_the_good_one(agent_factory):
    agent = agent_factory({"good": HOURLY, "bad": {"SCHEDULE": "0 0 * * *", "COMMAND": "SELECT 1"},
                           "badzone": {**HOURLY, "TIMEZONE": "Nowhere/Land"}})
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T13:00:05"))
    assert [r["job_name"] for r in report.claimed] == ["good"]
    jobs = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
    assert jobs["bad"]["valid"] == 0 and "JOB__bad__SCHEDULE" in jobs["bad"]["config_error"]
    assert "'0 0 * * *'" in jobs["bad"]["config_error"] and "six-field NCRONTAB" in jobs["bad"]["config_error"]
    assert "JOB__badzone__TIMEZONE" in jobs["badzone"]["config_error"]
    events = agent.store().execute("list_job_events", job_name=None, limit=10).rows
    assert {e["job_name"] for e in events if e["kind"] == "config_invalid"} == {"bad", "badzone"}
    # Recorded once per change, not every tick.
    agent.tick(at("2026-01-01T14:00:05"))
    assert len(agent.store().execute("list_job_events", job_name=None, limit=10).rows) == 2


def test_disable_remove_and_reenable(agent_factory, db_url):
    agent = agent_factory({"a": HOURLY, "b": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    changed = make_agent(db_url, {"a": {**HOURLY, "ENABLED": "false"}})   # b removed, a disabled
    changed.tick(at("2026-01-01T13:00:05"))
    assert runs_of(changed) == []
    jobs = {r["job_name"]: r for r in changed.store().execute("list_jobs").rows}
    assert jobs["b"]["configured"] == 0 and jobs["a"]["enabled"] == 0
    changed.close()
    back = make_agent(db_url, {"a": HOURLY})
    back.tick(at("2026-01-01T15:30:00"))                       # re-enabled: starts at its next slot
    assert job_row(back, "a")["next_due_at"] == at("2026-01-01T16:00:00")
    assert runs_of(back) == []
    back.close()


def test_statements_per_tick_do_not_grow_with_jobs(tmp_path, db_url):
    counts = []
    for n in (5, 60):
        # Same database, new job set (a fresh sync); a long dispatch lease keeps the first
        # round's runs from expiring during the second, so only the job count differs.
        jobs = {f"r{n}-job{i:03d}": HOURLY for i in range(n)}
        agent = make_agent(db_url, jobs, AGENT_MAX_CONCURRENCY="1000", AGENT_DISPATCH_LEASE_SECONDS="86400")
        agent.tick(at(f"2026-01-0{1 if n == 5 else 2}T12:30:00"))
        report = agent.tick(at(f"2026-01-0{1 if n == 5 else 2}T13:00:05"))
        assert len(report.claimed) == n and len(report.dispatched) == n
        counts.append(report.statements)
        agent.close()
    assert counts[0] == counts[1], counts


class _FailingQueue(DatabaseQueue):
    """The port failing to send (storage unreachable): fault injection at the port."""

    def send_many(self, bodies):
        raise QueueError("queue unreachable (injected)")


def test_queue_failure_leaves_runs_pending_for_the_next_tick(agent_factory, db_url):
    agent = agent_factory({"hourly": HOURLY})
    agent.tick(at("2026-01-01T12:30:00"))
    broken = make_agent(db_url, {"hourly": HOURLY})
    broken._queue = _FailingQueue(broken.store, "agent-tasks")
    report = broken.tick(at("2026-01-01T13:00:05"))
    broken.close()
    assert report.errors and "unreachable" in report.errors[0]
    (run,) = runs_of(agent, "hourly")
    assert run["status"] == "pending"                          # claimed, not lost
    again = agent.tick(at("2026-01-01T13:01:00"))
    assert [r["run_id"] for r in again.dispatched] == [run["run_id"]]
    assert agent.queue.depth() == 1


def test_crash_between_claim_and_enqueue_is_redispatched_after_the_dispatch_lease(agent_factory):
    agent = agent_factory({"hourly": HOURLY}, AGENT_DISPATCH_LEASE_SECONDS="60")
    agent.tick(at("2026-01-01T12:30:00"))
    store = agent.store()
    now = at("2026-01-01T13:00:05")
    store.execute("claim_due_runs", now=now, late_cutoff=now - timedelta(seconds=120))
    store.execute("dispatch_runs", now=now, lease_until=now + timedelta(seconds=60), max_in_flight=10)
    # ...the process died here: the run is queued, no message was sent.
    assert agent.queue.depth() == 0
    # The reconciliation query shows it once its dispatch lease has lapsed.
    stuck = store.execute("list_stuck_runs", now=at("2026-01-01T13:01:10"),
                          stale_before=at("2026-01-01T12:00:00")).rows
    assert [(r["status"], r["job_name"]) for r in stuck] == [("queued", "hourly")]
    assert agent.tick(at("2026-01-01T13:00:30")).dispatched == []   # lease still running
    report = agent.tick(at("2026-01-01T13:01:10"))                   # lease expired
    (run,) = report.dispatched
    assert run["token"] == 3                                         # dispatch 1, expiry 2, dispatch 3
    (message,) = agent.queue.receive(1, 30)
    assert json.loads(message.body)["token"] == 3


def test_concurrency_cap_holds_runs_back(agent_factory):
    agent = agent_factory({f"j{i}": HOURLY for i in range(5)}, AGENT_MAX_CONCURRENCY="2")
    agent.tick(at("2026-01-01T12:30:00"))
    report = agent.tick(at("2026-01-01T13:00:05"))
    assert len(report.claimed) == 5 and len(report.dispatched) == 2
    statuses = sorted(r[0] for r in query(agent, f"SELECT status FROM {runs_table(agent)}"))
    assert statuses == ["pending"] * 3 + ["queued"] * 2
