"""Overlap policies buffer-one and cancel-previous (issue 33 item 5), on every dialect, in queue
mode (dispatch_runs, start_run) and in direct mode (claim_runs): at most one run waits behind the
one in flight (a further slot is skipped, with the reason), or the run in flight is stopped as
`stop` stops it and the newer one starts. Decided under the start lock: several processes
claiming at once start each slot once."""

from __future__ import annotations

import threading
from datetime import timedelta

from shared.messaging.memory import MemoryQueue
from tests.support.harness import at, execute, make_agent, runs_table

EVERY_MINUTE = {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1", "LEASE_SECONDS": "3600"}


def runs_of(agent, job):
    rows = agent.store().execute("list_history", job_name=job, limit=1000).rows
    return sorted(rows, key=lambda r: r["scheduled_for"])


def start(agent, run_id):
    """A worker picks up the run's message (queue mode) and starts it (its SQL not run)."""
    run = agent.store().execute("get_run", run_id=run_id).one()
    now = max(run["runnable_at"], run["scheduled_for"])
    (row,) = agent.store().execute("start_run", run_id=run_id, token=run["token"], now=now, worker="w",
                                   dequeue_count=1, max_concurrency=100,
                                   late_cutoff=now - timedelta(seconds=120)).rows
    return row


def claim(agent, now, batch=10, max_concurrency=100):
    return agent.store().execute("claim_runs", now=now, late_cutoff=now - timedelta(seconds=120), worker="w",
                                 max_concurrency=max_concurrency, batch=batch).rows


def finish(agent, run_id):
    execute(agent, f"UPDATE {runs_table(agent)} SET status = 'succeeded' WHERE run_id = {run_id}")


def test_buffer_one_keeps_one_waiting_run_and_skips_the_next_with_the_reason(agent_factory):
    agent = agent_factory({"m": {**EVERY_MINUTE, "OVERLAP": "buffer-one"}}, queue=MemoryQueue())
    agent.tick(at("2026-01-01T12:00:30"))
    (first,) = runs_of(agent, "m")
    assert start(agent, first["run_id"])["decision"] == "start"
    agent.tick(at("2026-01-01T12:02:00"))                      # 12:02 waits behind 12:01
    agent.tick(at("2026-01-01T12:03:00"))                      # 12:03: one runs, one waits: skipped
    first, second, third = runs_of(agent, "m")[:3]
    assert first["status"] == "running"
    assert second["status"] == "pending"
    # 12:03 went to the queue ahead (a delayed message); when it arrives, one runs and one waits.
    row = start(agent, third["run_id"])
    assert row["decision"] == "skip-buffer" and "policy buffer-one" in row["note"], row
    assert runs_of(agent, "m")[2]["status"] == "skipped"
    finish(agent, first["run_id"])
    report = agent.tick(at("2026-01-01T12:03:10"))
    assert second["run_id"] in [r["run_id"] for r in report.dispatched]
    assert start(agent, second["run_id"])["decision"] == "start"


def test_buffer_one_in_direct_mode(agent_factory):
    agent = agent_factory({"m": {**EVERY_MINUTE, "OVERLAP": "buffer-one"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:03:30"))                      # plans 12:01 .. 12:04
    rows = claim(agent, at("2026-01-01T12:01:00"))
    assert [r["decision"] for r in rows] == ["start"]
    rows = claim(agent, at("2026-01-01T12:02:00"))
    assert rows == []                                          # 12:02 waits
    rows = claim(agent, at("2026-01-01T12:03:00"))
    assert [(r["decision"], r["scheduled_for"]) for r in rows] == [("skipped", at("2026-01-01T12:03:00"))]
    assert "policy buffer-one" in rows[0]["note"]
    statuses = {r["scheduled_for"]: r["status"] for r in runs_of(agent, "m")}
    assert statuses[at("2026-01-01T12:02:00")] == "pending"


def test_a_queued_job_is_not_capped_at_one_waiting(agent_factory):
    """The contrast: overlap queue keeps every slot waiting."""
    agent = agent_factory({"m": {**EVERY_MINUTE, "OVERLAP": "queue"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:03:30"))
    claim(agent, at("2026-01-01T12:01:00"))
    assert claim(agent, at("2026-01-01T12:03:00")) == []


def test_cancel_previous_stops_the_run_in_flight_and_starts_the_new_one_queue_mode(agent_factory):
    agent = agent_factory({"m": {**EVERY_MINUTE, "OVERLAP": "cancel-previous"}}, queue=MemoryQueue())
    agent.tick(at("2026-01-01T12:00:30"))
    (first,) = runs_of(agent, "m")
    assert start(agent, first["run_id"])["decision"] == "start"
    report = agent.tick(at("2026-01-01T12:02:00"))
    second = runs_of(agent, "m")[1]
    assert second["run_id"] in [r["run_id"] for r in report.dispatched]
    row = start(agent, second["run_id"])
    assert row["decision"] == "start" and row["run_id"] == second["run_id"]
    first, second = runs_of(agent, "m")[:2]
    assert first["status"] == "cancelled" and "cancel-previous" in first["note"], first
    assert second["status"] == "running"
    # The stopped worker is fenced: its token moved on, as `stop` does.
    assert agent.store().execute("get_run", run_id=first["run_id"]).one()["token"] > 1


def test_cancel_previous_in_direct_mode(agent_factory):
    agent = agent_factory({"m": {**EVERY_MINUTE, "OVERLAP": "cancel-previous"}})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:01:30"))
    (row,) = claim(agent, at("2026-01-01T12:01:00"))
    assert row["decision"] == "start"
    agent.tick(at("2026-01-01T12:02:00"))
    rows = claim(agent, at("2026-01-01T12:02:00"))
    decisions = sorted((r["decision"], r["scheduled_for"]) for r in rows)
    assert decisions == [("cancelled", at("2026-01-01T12:01:00")), ("start", at("2026-01-01T12:02:00"))]
    statuses = [(r["scheduled_for"], r["status"]) for r in runs_of(agent, "m")][:2]
    assert statuses == [(at("2026-01-01T12:01:00"), "cancelled"), (at("2026-01-01T12:02:00"), "running")]


def test_skip_is_unchanged_by_the_new_policies(agent_factory):
    agent = agent_factory({"m": EVERY_MINUTE})
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:01:30"))
    claim(agent, at("2026-01-01T12:01:00"))
    agent.tick(at("2026-01-01T12:02:00"))
    (row,) = claim(agent, at("2026-01-01T12:02:00"))
    assert row["decision"] == "skipped" and "policy skip" in row["note"]


def _race(db_url, agent, now, processes=4):
    """``processes`` agents claim at ``now`` at once; every row they got back."""
    others = [make_agent(db_url, None) for _ in range(processes - 1)]
    barrier = threading.Barrier(processes)
    got, failures = [], []

    def one(instance):
        try:
            barrier.wait(timeout=30)
            got.extend(claim(instance, now))
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(instance,)) for instance in [agent, *others]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    return got


def test_several_processes_claim_each_slot_once_under_both_policies(agent_factory, db_url):
    jobs = {f"b{i}": {**EVERY_MINUTE, "OVERLAP": "buffer-one"} for i in range(3)}
    jobs |= {f"c{i}": {**EVERY_MINUTE, "OVERLAP": "cancel-previous"} for i in range(3)}
    agent = agent_factory(jobs)
    agent.tick(at("2026-01-01T12:00:30"))
    agent.tick(at("2026-01-01T12:03:30"))
    first = _race(db_url, agent, at("2026-01-01T12:01:00"))
    assert sorted(r["job_name"] for r in first if r["decision"] == "start") == sorted(jobs)
    second = _race(db_url, agent, at("2026-01-01T12:02:00"))
    started = sorted(r["job_name"] for r in second if r["decision"] == "start")
    cancelled = sorted(r["job_name"] for r in second if r["decision"] == "cancelled")
    assert started == ["c0", "c1", "c2"] and cancelled == ["c0", "c1", "c2"]
    third = _race(db_url, agent, at("2026-01-01T12:03:00"))
    skipped = sorted(r["job_name"] for r in third if r["decision"] == "skipped")
    assert skipped == ["b0", "b1", "b2"]
    assert sorted(r["job_name"] for r in third if r["decision"] == "start") == ["c0", "c1", "c2"]
    for name in jobs:
        running = [r for r in runs_of(agent, name) if r["status"] == "running"]
        assert len(running) == 1, (name, running)
