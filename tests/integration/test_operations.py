"""The operator actions of shared/engine/operations.py called as a front end calls them, on SQLite and
PostgreSQL: each returns what it did as a typed result, and refuses what cannot be done with an
error naming the argument (the command-line tests check the same through `sql-agent`)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from shared.engine import operations
from shared.errors import ConfigError, NotFoundError, UsageError
from shared.messaging.memory import MemoryQueue
from tests.support.harness import query, runs_table

JOBS = {"adhoc": {"COMMAND": "SELECT 1", "OVERLAP": "skip"}, "broken": {"COMMAND": "SELECT 1", "SCHEDULE": "0 0 *"}}


def _statuses(agent) -> dict[int, str]:
    return dict(query(agent, f"SELECT run_id, status FROM {runs_table(agent)}"))


def test_direct_mode_actions_return_what_they_did(agent_factory):
    agent = agent_factory(JOBS)
    agent.tick()                                    # the jobs synced: what run-now and stop know

    task = operations.submit(agent, "SELECT 2", order=3, max_attempts=1, timeout_seconds=60)
    assert task == operations.Submitted(run_id=task.run_id, order=3, dispatched=None)
    assert _statuses(agent)[task.run_id] == "pending"
    with pytest.raises(UsageError) as empty:
        operations.submit(agent, "  ", order=None, max_attempts=1, timeout_seconds=60)
    assert empty.value.setting == "--sql"

    cancelled = operations.cancel(agent, task.run_id)
    assert cancelled == operations.Cancelled(run_id=task.run_id, runs_moved=0, follow_ups_started=0,
                                             dispatched=None)
    assert _statuses(agent)[task.run_id] == "cancelled"
    with pytest.raises(UsageError, match="already cancelled"):
        operations.cancel(agent, task.run_id)
    with pytest.raises(NotFoundError):
        operations.cancel(agent, task.run_id + 1000)

    first = operations.run_now(agent, "adhoc")
    assert (first.job_name, first.skipped, first.dispatched) == ("adhoc", False, None)
    # OVERLAP skip: a second start while the first is pending is recorded skipped, not dispatched.
    second = operations.run_now(agent, "adhoc")
    assert second.skipped and second.note and second.dispatched is None and second.run_id != first.run_id
    with pytest.raises(ConfigError):
        operations.run_now(agent, "broken")
    with pytest.raises(NotFoundError) as unknown:
        operations.run_now(agent, "ghost")
    assert "adhoc" in unknown.value.expected and "broken" not in unknown.value.expected

    stopped = operations.stop(agent, "adhoc")
    assert stopped == operations.Stopped(job_name="adhoc", cancelled_run_ids=(first.run_id,))
    assert _statuses(agent)[first.run_id] == "cancelled"
    assert operations.stop(agent, "adhoc").cancelled_run_ids == ()
    with pytest.raises(NotFoundError):
        operations.stop(agent, "ghost")


def test_queue_mode_actions_hand_their_run_to_the_queue(agent_factory):
    queue = MemoryQueue()
    agent = agent_factory(JOBS, queue=queue)
    agent.tick()
    before = queue.run_messages()
    task = operations.submit(agent, "SELECT 2", order=None, max_attempts=1, timeout_seconds=60)
    assert task.dispatched == 1 and queue.run_messages() == before + 1
    run = operations.run_now(agent, "adhoc")
    assert run.dispatched == 1 and queue.run_messages() == before + 2
    assert operations.dispatch_now(agent) == 0      # nothing more ready: nothing sent twice


def test_requeue_gives_a_poisoned_run_one_more_attempt_once(agent_factory):
    queue = MemoryQueue()
    agent = agent_factory({"doomed": {"SCHEDULE": "@once " + datetime.now(timezone.utc).isoformat(),
                                      "COMMAND": "SELECT 1"}}, queue=queue)
    agent.tick(datetime.now(timezone.utc))
    (message,) = queue.receive(1, 0)
    assert agent.handle_message(message.body, 9, message.id).outcome == "poisoned"   # a restart loop
    queue.delete(message)
    (poison,) = agent.store().execute("list_poison", limit=10).rows

    requeued = operations.requeue(agent, poison["poison_id"])
    assert requeued == operations.Requeued(poison_id=poison["poison_id"], run_id=poison["run_id"], dispatched=1)
    assert _statuses(agent)[poison["run_id"]] != "poisoned" and queue.run_messages() == 1
    # Requeued already: its run is no longer poisoned or failed, nothing changes.
    with pytest.raises(UsageError, match="only a poisoned or failed run") as again:
        operations.requeue(agent, poison["poison_id"])
    assert again.value.setting == "ID" and queue.run_messages() == 1
    with pytest.raises(NotFoundError):
        operations.requeue(agent, poison["poison_id"] + 1000)
