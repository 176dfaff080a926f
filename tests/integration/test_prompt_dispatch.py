"""Prompt dispatch (invariants 8 and 9): every slot on time to the second, finished work hands
on at once, the minute tick is only the safety net; the cap holds on every path.

Both ways the agent runs are covered: direct mode (the local runner's workers claim straight
from the runs table) and queue mode (the function app's path: a queue with Azure Storage
semantics carries each run's message; Azurite for the doorbell chain)."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.runner import LocalRunner
from shared.messaging.memory import MemoryQueue
from tests.support.harness import Clock, at, execute, make_agent, query, sql_for, tsql_delay, work

UTC = timezone.utc


def runs_of(agent, job=None):
    return sorted(agent.store().execute("list_history", job_name=job, limit=10000).rows, key=lambda r: r["run_id"])


def submit(agent, sql: str, order: int | None = None, max_attempts: int = 1):
    from shared.telemetry.client import new_operation_id

    return agent.store().execute("insert_task", command=sql, target_database=None, task_order=order,
                                 max_attempts=max_attempts, timeout_seconds=60, lease_seconds=60,
                                 now=agent.clock(), operation_id=new_operation_id()).one()


# ---------------------------------------------------------------- slots to the second


def test_every_five_seconds_runs_every_slot_within_two_seconds(db_url):
    """A `*/5` job under the local runner for 30 s: every slot runs, each within 2 s of its time,
    none before it, though the tick runs once a minute."""
    agent = make_agent(db_url, {"beat": {"SCHEDULE": "*/5 * * * * *",
                                         "COMMAND": "INSERT INTO beats (at) VALUES (CURRENT_TIMESTAMP)"}},
                       AGENT_MAX_CONCURRENCY="2")
    execute(agent, "CREATE TABLE beats (at VARCHAR(40))")
    runner = LocalRunner(agent, concurrency=2)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        # Measured from the first run's end on: Babelfish compiles each batch at its first use on
        # a connection (1-3 s, docs/azure-sql.md), which the first slot pays and the claim is not
        # about; PostgreSQL and SQLite get there in milliseconds.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(r["status"] == "succeeded" for r in runs_of(agent, "beat")):
            time.sleep(0.1)
        started = datetime.now(UTC)
        time.sleep(31)
        ended = datetime.now(UTC)                           # the window the runner ran in
    finally:
        runner.stop()
        thread.join(timeout=30)
    assert not thread.is_alive()
    runs = [r for r in runs_of(agent, "beat") if started + timedelta(seconds=1) <= r["scheduled_for"] <= ended - timedelta(seconds=3)]
    assert len(runs) >= 5, runs
    slots = [r["scheduled_for"] for r in runs]
    assert all((b - a) == timedelta(seconds=5) for a, b in zip(slots, slots[1:])), slots   # none missing
    for run in runs:
        assert run["status"] == "succeeded", run
        lateness = (run["started_at"] - run["scheduled_for"]).total_seconds()
        assert 0 <= lateness < 2, (run["scheduled_for"], run["started_at"])
    agent.close()


def test_a_message_delivered_before_its_slot_does_not_run_and_is_sent_again(agent_factory):
    clock = Clock(at("2026-01-01T12:00:30"))
    queue = MemoryQueue()
    agent = agent_factory({"m": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}}, clock=clock, queue=queue)
    agent.tick()                                              # claims 12:01:00, sent delayed
    (run,) = runs_of(agent, "m")
    assert run["status"] == "queued" and run["scheduled_for"] == at("2026-01-01T12:01:00")
    (body, delay), *_ = [(b, d) for b, d in queue.sent if '"run_id"' in b]
    assert delay == 30                                        # invisible until its slot
    result = agent.handle_message(body, 1, "early-delivery")  # the queue delivered it early anyway
    assert result.outcome == "early"
    (again,) = runs_of(agent, "m")
    assert again["status"] == "queued" and again["attempt"] == 0 and again["token"] == run["token"]
    body_again, delay_again = queue.sent[-1]
    assert body_again == body and delay_again == 30           # re-sent for the rest of the wait
    clock.advance(30)
    assert agent.handle_message(body_again, 1, "on-time").outcome == "succeeded"


def test_no_slot_is_lost_across_a_restart_in_the_middle_of_a_lookahead_window(db_url):
    """Slots claimed ahead survive the agent's restart: each one runs, or is recorded skipped
    with its reason (the ones missed while it was down: a later slot was due too)."""
    clock = Clock(at("2026-01-01T12:00:00"))
    jobs = {"m": {"SCHEDULE": "*/10 * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "queue"}}
    agent = make_agent(db_url, jobs, clock=clock)
    agent.tick()                                              # claims 12:00:10 ... 12:01:30
    claimed = [r["scheduled_for"] for r in runs_of(agent, "m")]
    assert claimed[0] == at("2026-01-01T12:00:10") and claimed[-1] == at("2026-01-01T12:01:30")
    clock.now = at("2026-01-01T12:00:25")
    work(agent)                                               # 12:00:10 and 12:00:20 run
    agent.close()                                             # ...the agent stops mid-window
    clock.now = at("2026-01-01T12:10:05")                     # and comes back ten minutes later
    agent = make_agent(db_url, jobs, clock=clock)
    agent.tick()
    work(agent)
    runs = runs_of(agent, "m")
    slots = [r["scheduled_for"] for r in runs]
    first, last = at("2026-01-01T12:00:10"), max(slots)
    expected = [first + timedelta(seconds=10 * i) for i in range(int((last - first).total_seconds() / 10) + 1)]
    assert slots == expected                                  # every slot has its row
    late_cutoff = at("2026-01-01T12:08:05")                   # AGENT_MISFIRE_THRESHOLD_SECONDS=120
    for run in runs:
        if run["scheduled_for"] <= at("2026-01-01T12:00:20"):
            assert run["status"] == "succeeded", run          # ran before the stop
        elif run["scheduled_for"] < late_cutoff:
            assert run["status"] == "skipped" and run["note"].startswith("misfire:"), run
        elif run["scheduled_for"] <= clock.now:
            assert run["status"] == "succeeded", run          # due within the threshold: run, in order
        else:
            assert run["status"] == "pending", run            # claimed ahead, its slot to come
    agent.close()


def test_a_slot_claimed_ahead_for_a_job_disabled_since_is_recorded_skipped(db_url):
    clock = Clock(at("2026-01-01T12:00:00"))
    agent = make_agent(db_url, {"m": {"SCHEDULE": "*/20 * * * * *", "COMMAND": "SELECT 1"}}, clock=clock)
    agent.tick()
    assert [r["status"] for r in runs_of(agent, "m")] == ["pending"] * 4
    agent.close()
    changed = make_agent(db_url, {"m": {"SCHEDULE": "*/20 * * * * *", "COMMAND": "SELECT 1", "ENABLED": "false"}},
                         clock=clock)
    changed.tick()
    runs = runs_of(changed, "m")
    assert [r["status"] for r in runs] == ["skipped"] * 4
    assert all("disabled after this slot was claimed" in r["note"] for r in runs)
    changed.close()


# ---------------------------------------------------------------- hand-on at completion


@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_120_runs_due_at_once_under_a_cap_of_4_complete_after_a_single_tick(db_url, mode):
    jobs = {f"j{i:03d}": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"} for i in range(120)}
    clock = Clock(at("2026-01-01T12:30:00"))
    agent = make_agent(db_url, jobs, clock=clock, queue=MemoryQueue() if mode == "queue" else None,
                       AGENT_MAX_CONCURRENCY="4")
    agent.tick()
    clock.now = at("2026-01-01T13:00:05")
    report = agent.tick()                                     # the only tick
    assert len(report.claimed) == 120
    if mode == "queue":
        assert len(report.dispatched) == 4                    # the cap: the rest are handed on
    work(agent, concurrency=4)
    assert [r["status"] for r in runs_of(agent)] == ["succeeded"] * 120
    agent.close()


@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_three_order_levels_complete_with_no_tick_at_all(db_url, mode):
    agent = make_agent(db_url, queue=MemoryQueue() if mode == "queue" else None)
    execute(agent, "CREATE TABLE seen (label VARCHAR(20), seq INT)")
    for order in (3, 1, 2, 1, 3, 2):
        submit(agent, f"INSERT INTO seen (label, seq) VALUES ('o{order}', (SELECT COUNT(*) FROM seen))", order)
    if mode == "queue":
        from shared.engine.dispatch import dispatch

        dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)   # as submit does
    work(agent, concurrency=4)
    seen = query(agent, "SELECT label, seq FROM seen ORDER BY seq")
    assert [label for label, _ in seen] == ["o1", "o1", "o2", "o2", "o3", "o3"]
    assert all(r["status"] == "succeeded" for r in runs_of(agent))
    agent.close()


def test_a_retry_goes_out_at_its_backoff_in_direct_mode(db_url):
    clock = Clock(datetime.now(UTC))
    agent = make_agent(db_url, clock=clock, AGENT_RETRY_BACKOFF_SECONDS="30")
    submit(agent, "SELECT * FROM appears_later", max_attempts=2)
    work(agent)
    (run,) = runs_of(agent)
    assert run["status"] == "pending" and run["failures"] == 1
    detail = agent.store().execute("get_run", run_id=run["run_id"]).one()
    assert abs((detail["runnable_at"] - clock.now).total_seconds() - 30) < 0.01   # the backoff, to the ms
    execute(agent, "CREATE TABLE appears_later (x INT)")
    assert work(agent) == 0                                   # not before its backoff
    clock.advance(31)
    work(agent)
    assert runs_of(agent)[0]["status"] == "succeeded"
    agent.close()


def test_a_row_inserted_behind_the_agents_back_starts_within_the_poll_interval(db_url):
    """Another process inserts a run straight into the table (as the T-SQL procedures will):
    the local runner's idle workers find it within AGENT_POLL_SECONDS, the tick a minute away."""
    agent = make_agent(db_url, AGENT_POLL_SECONDS="1", AGENT_TICK_SCHEDULE="0 0 0 1 1 *")
    execute(agent, "CREATE TABLE behind (at VARCHAR(40))")
    runner = LocalRunner(agent, concurrency=1)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(1.5)                                       # the runner is idle now
        other = make_agent(db_url)                            # another process's connection
        # Twice: the first run is untimed, as Babelfish compiles each batch at its first use on a
        # connection (1-3 s, docs/azure-sql.md); the second measures the poll. Each is timed from
        # its row's commit (submit returns), since no worker can see the row before.
        for count in (1, 2):
            submit(other, "INSERT INTO behind (at) VALUES ('x')")
            inserted = time.monotonic()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and query(agent, "SELECT COUNT(*) FROM behind") != [(count,)]:
                time.sleep(0.05)
            assert query(agent, "SELECT COUNT(*) FROM behind") == [(count,)]
        other.close()
        assert time.monotonic() - inserted < 1 + 1.0          # the poll interval, plus a little
    finally:
        runner.stop()
        thread.join(timeout=30)
        agent.close()


# ---------------------------------------------------------------- the cap holds


@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_the_cap_holds_whoever_starts(db_url, mode):
    """AGENT_MAX_CONCURRENCY=2, jobs due at once, tasks submitted while workers run, three
    workers: never more than two executions overlap (measured from what the jobs record)."""
    slow = sql_for(db_url, "SELECT agent_sleep(0.3)", "SELECT pg_sleep(0.3)", tsql_delay(0.3))
    now_sql = sql_for(db_url, "strftime('%Y-%m-%d %H:%M:%f', 'now')", "clock_timestamp()",
                      "CONVERT(VARCHAR(40), SYSUTCDATETIME(), 121)")
    agent = make_agent(db_url, queue=MemoryQueue() if mode == "queue" else None, AGENT_MAX_CONCURRENCY="2")
    execute(agent, "CREATE TABLE spans (label VARCHAR(20), started VARCHAR(40), ended VARCHAR(40))")

    def task(label: str) -> str:
        # the start and end of the job's own work, in the database's clock
        if agent.target.dialect == "mssql":
            return (f"DECLARE @s VARCHAR(40) = {now_sql}; {slow}; "
                    f"INSERT INTO spans (label, started, ended) VALUES ('{label}', @s, {now_sql})")
        return (f"CREATE TEMP TABLE IF NOT EXISTS t_{label} (s VARCHAR(40)); "
                f"INSERT INTO t_{label} VALUES ({now_sql}); {slow}; "
                f"INSERT INTO spans (label, started, ended) SELECT '{label}', s, {now_sql} FROM t_{label}")

    for i in range(6):
        submit(agent, task(f"a{i}"))

    def submitter():
        for i in range(6):
            submit(agent_b, task(f"b{i}"))
            if mode == "queue":
                from shared.engine.dispatch import dispatch

                dispatch(agent_b.store(), agent_b.queue, agent_b.settings, agent_b.clock(), agent_b.telemetry)
            time.sleep(0.1)

    agent_b = make_agent(db_url, queue=agent.queue if mode == "queue" else None, AGENT_MAX_CONCURRENCY="2")
    if mode == "queue":
        from shared.engine.dispatch import dispatch

        dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)
    feeder = threading.Thread(target=submitter)
    feeder.start()
    work(agent, concurrency=3, max_seconds=60)
    feeder.join()
    work(agent, concurrency=3, max_seconds=60)
    spans = [(datetime.fromisoformat(str(s)), datetime.fromisoformat(str(e)))
             for s, e in query(agent, "SELECT started, ended FROM spans")]
    assert len(spans) == 12
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 2, spans
    agent_b.close()
    agent.close()


# ---------------------------------------------------------------- the doorbell chain (Azure)


def test_the_tick_leaves_one_doorbell_chain_per_period_whatever_the_instances(agent_factory):
    clock = Clock(at("2026-01-01T12:00:00"))
    queue = MemoryQueue()
    first = agent_factory({}, clock=clock, queue=queue, AGENT_POLL_SECONDS="10")
    second = agent_factory({}, clock=clock, queue=queue, AGENT_POLL_SECONDS="10")
    assert first.tick().doorbells == 5                        # 10, 20, ... 50 s: until the next tick
    assert second.tick().doorbells == 0                       # the same period: no second chain
    delays = sorted(d for b, d in queue.sent if "doorbell" in b)
    assert delays == [10, 20, 30, 40, 50]
    clock.advance(60)
    assert second.tick().doorbells == 5                       # the next period


def test_a_doorbell_dispatches_work_inserted_behind_the_agents_back(agent_factory):
    queue = MemoryQueue()
    agent = agent_factory({}, queue=queue)
    execute(agent, "CREATE TABLE behind (x INT)")
    submit(agent, "INSERT INTO behind (x) VALUES (1)")        # no dispatch: inserted by "someone else"
    assert queue.run_messages() == 0
    from shared.messaging.messages import DoorbellMessage

    result = agent.handle_message(DoorbellMessage(period=1).to_json(), 1, "bell")
    assert result.outcome == "doorbell" and queue.run_messages() == 1
    work(agent)
    assert query(agent, "SELECT x FROM behind") == [(1,)]


def test_a_doorbell_never_fails_nor_is_poisoned(agent_factory, monkeypatch):
    agent = agent_factory({}, queue=MemoryQueue())
    from shared.engine import executor as executor_module
    from shared.messaging.messages import DoorbellMessage

    def broken(*args, **kwargs):
        raise RuntimeError("database unreachable (injected)")

    monkeypatch.setattr(executor_module, "dispatch", broken)
    result = agent.handle_message(DoorbellMessage(period=1).to_json(), 99, "bell")
    assert result.outcome == "doorbell" and result.detail == "dispatch failed"
    assert agent.store().execute("list_poison", limit=5).rows == []
