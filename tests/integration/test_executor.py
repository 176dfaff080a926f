"""The executor on both dialects: fenced start and completion, error classification,
retries with backoff, poison handling, run-now, ad-hoc tasks, cancel and timeout."""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.cli.commands import main as cli
from shared.errors import TransientJobError
from shared.messaging.memory import MemoryQueue
from shared.messaging.messages import RunMessage
from tests.support.harness import Clock, at, execute, query, sql_for, tsql_delay, work

UTC = timezone.utc


@pytest.fixture
def agent_factory(agent_factory):
    """These tests follow the queue trigger's path: a queue (with Azure Storage semantics)
    carries each run's message, as in the function app."""
    def build(jobs=None, **kwargs):
        kwargs.setdefault("queue", MemoryQueue())
        return agent_factory(jobs, **kwargs)

    return build


def runs_of(agent, job=None):
    return sorted(agent.store().execute("list_history", job_name=job, limit=1000).rows, key=lambda r: r["run_id"])


def attempts_of(agent, run_id):
    return agent.store().execute("list_attempts", run_ids=[run_id]).rows


def poison_rows(agent):
    return agent.store().execute("list_poison", limit=100).rows


def tick_now(agent, offset_seconds: float = 0):
    return agent.tick(datetime.now(UTC) + timedelta(seconds=offset_seconds))


def every_second(command: str, **extra: str) -> dict[str, str]:
    """A one-time job due now: the first tick claims and dispatches it, later ticks don't."""
    return {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": command, **extra}


def prime(agent):
    return tick_now(agent)


def test_run_succeeds_and_its_work_commits_with_the_completion(agent_factory, db_url):
    agent = agent_factory({"ins": every_second("INSERT INTO marker (job) VALUES ('ins')")})
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    report = prime(agent)
    assert len(report.dispatched) == 1
    assert work(agent) == 1
    (run,) = runs_of(agent, "ins")
    assert run["status"] == "succeeded" and run["attempt"] == 1
    (attempt,) = attempts_of(agent, run["run_id"])
    assert attempt["outcome"] == "succeeded" and attempt["dequeue_count"] == 1
    assert query(agent, "SELECT job FROM marker") == [("ins",)]
    assert agent.queue.run_messages() == 0


def test_a_command_with_quotes_backslashes_and_line_breaks_runs_as_written(agent_factory, db_url):
    """The settings sync hands commands to the database as JSON: the stored command and what it
    does are the text of the setting, escapes and all (Babelfish's OPENJSON leaves JSON escapes
    in, which agent.json_text removes; SQL Server's text is unchanged)."""
    value = 'say "hi"\\ there\ttab'
    command = f"INSERT INTO marker (job)\r\nVALUES ('{value}') -- \"q\" \\n"
    agent = agent_factory({"quoted": every_second(command)})
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    prime(agent)
    assert work(agent) == 1
    (run,) = runs_of(agent, "quoted")
    assert run["status"] == "succeeded", run["last_error"]
    assert query(agent, "SELECT job FROM marker") == [(value,)]
    jobs = "agent_jobs" if agent.target.dialect == "sqlite" else "agent.jobs"
    assert query(agent, f"SELECT command FROM {jobs} WHERE job_name = 'quoted'") == [(command,)]


def test_permanent_error_is_retried_with_backoff_then_fails(agent_factory):
    """An error in the job's SQL spends an attempt; the retry goes out at once as a message
    delayed by the backoff (not at the next tick), and is not run before it."""
    jobs = {"broken": every_second("SELECT * FROM no_such_table", MAX_ATTEMPTS="2")}
    clock = Clock(datetime.now(UTC))
    queue = MemoryQueue(clock=lambda: clock.now.timestamp())
    agent = agent_factory(jobs, clock=clock, queue=queue, AGENT_RETRY_BACKOFF_SECONDS="30")
    agent.tick()
    work(agent)
    (run,) = runs_of(agent, "broken")
    assert run["status"] == "queued" and run["attempt"] == 1 and run["failures"] == 1
    assert "no_such_table" in run["last_error"]
    assert queue.run_messages() == 1 and queue.visible() == 0   # the retry waits on the queue
    assert work(agent) == 0
    clock.advance(31)
    work(agent)
    (run,) = runs_of(agent, "broken")
    assert run["status"] == "failed" and run["attempt"] == 2 and run["token"] == 2
    attempts = attempts_of(agent, run["run_id"])
    assert [a["outcome"] for a in attempts] == ["failed", "failed"]
    assert all("no_such_table" in a["error_message"] for a in attempts)


def test_failure_late_in_the_day_retries_after_midnight(agent_factory, db_url):
    """Runs are keyed by slot, not calendar date: the 23:00 run retries at 00:00 and is
    still the 23:00 run (no new run for the new day, no lost retry)."""
    clock = Clock(at("2026-03-01T22:30:00"))
    agent = agent_factory({"nightly": {"SCHEDULE": "0 0 23 * * *", "COMMAND": "SELECT * FROM later_table",
                                       "MAX_ATTEMPTS": "2"}},
                          clock=clock, AGENT_RETRY_BACKOFF_SECONDS="3600")
    agent.tick()
    clock.now = at("2026-03-01T23:00:05")
    agent.tick()
    work(agent)
    (run,) = runs_of(agent, "nightly")
    assert run["status"] == "pending"
    execute(agent, "CREATE TABLE later_table (x INT)")  # the cause is fixed
    clock.now = at("2026-03-02T00:00:30")
    report = agent.tick()
    assert [r["run_id"] for r in report.dispatched] == [run["run_id"]]
    work(agent)
    (run,) = runs_of(agent, "nightly")
    assert run["status"] == "succeeded" and run["scheduled_for"] == at("2026-03-01T23:00:00")


def test_transient_error_is_redelivered_and_succeeds(pg_url):
    """A connection killed under the job (SQLSTATE 57P01/08xxx) is transient: the message is
    redelivered (dequeue count 2, 3) and the run succeeds without spending job retries."""
    from tests.support.harness import make_agent

    flaky = ("SELECT CASE WHEN (SELECT MAX(attempt) FROM agent.runs WHERE job_name = 'flaky') < 3 "
             "THEN pg_terminate_backend(pg_backend_pid()) END")
    agent = make_agent(pg_url, {"flaky": every_second(flaky, MAX_ATTEMPTS="1")}, queue=MemoryQueue())
    try:
        prime(agent)
        work(agent)
        (run,) = runs_of(agent, "flaky")
        assert run["status"] == "succeeded"
        attempts = attempts_of(agent, run["run_id"])
        assert [a["outcome"] for a in attempts] == ["transient", "transient", "succeeded"]
        assert [a["dequeue_count"] for a in attempts] == [1, 2, 3]
        assert poison_rows(agent) == []
    finally:
        agent.close()


def test_always_transient_job_is_poisoned_at_the_threshold(pg_url):
    from tests.support.harness import make_agent

    agent = make_agent(pg_url, {"doomed": every_second("SELECT pg_terminate_backend(pg_backend_pid())")},
                       queue=MemoryQueue(), AGENT_MAX_DEQUEUE_COUNT="4")
    try:
        prime(agent)
        work(agent)
        (run,) = runs_of(agent, "doomed")
        assert run["status"] == "poisoned"
        (poison,) = poison_rows(agent)
        assert poison["run_id"] == run["run_id"] and poison["dequeue_count"] == 4
        body = json.loads(poison["body"])
        assert body["run_id"] == run["run_id"] and body["token"] == run["token"]
        errors = json.loads(poison["errors"])
        assert [e["outcome"] for e in errors] == ["transient", "transient", "transient", "poisoned", "poisoned"]
        assert agent.queue.run_messages() == 0
        assert agent.queue.poisoned == []   # the app handled it; the host never had to
    finally:
        agent.close()


@pytest.mark.parametrize("body,reason", [
    ("this is not json", "not JSON"),
    ('{"v": 2, "run_id": 1, "token": 1}', "message version"),
    ('{"v": 1, "run_id": "1", "token": 1}', "run_id"),
    ('{"v": 1, "run_id": 1, "token": 1, "sql": "DROP TABLE x"}', "unknown field"),
    ('[1, 2]', "expected an object"),
])
def test_malformed_messages_are_poisoned_at_once_with_body_kept(agent_factory, body, reason):
    agent = agent_factory({})
    result = agent.handle_message(body, 1, "m-1")
    assert result.outcome == "poisoned"
    (poison,) = poison_rows(agent)
    assert poison["body"] == body and poison["run_id"] is None and poison["dequeue_count"] == 1
    assert reason in poison["reason"] and poison["message_id"] == "m-1"


def test_unknown_run_and_forged_token_are_poisoned_stale_token_is_acknowledged(agent_factory):
    jobs = {"ok": every_second("SELECT 1")}
    clock = Clock(datetime.now(UTC))
    agent = agent_factory(jobs, clock=clock)
    unknown = RunMessage(run_id=999999, token=1).to_json()
    assert agent.handle_message(unknown, 1).outcome == "poisoned"
    agent.tick()
    (run,) = runs_of(agent, "ok")
    forged = RunMessage(run_id=run["run_id"], token=run["token"] + 5).to_json()
    assert agent.handle_message(forged, 1).outcome == "poisoned"
    clock.advance(400)
    agent.tick()            # dispatch lease lapsed: expired (token 2) and dispatched again (token 3)
    stale = RunMessage(run_id=run["run_id"], token=1).to_json()
    assert agent.handle_message(stale, 1).outcome == "stale"
    reasons = [p["reason"] for p in poison_rows(agent)]
    assert any("unknown run 999999" in r for r in reasons) and any("never issued" in r for r in reasons)
    # The forged and stale messages did not touch the run; its current message runs it.
    work(agent)
    assert runs_of(agent, "ok")[0]["status"] == "succeeded"


def test_a_delivery_above_the_dequeue_limit_of_a_run_a_live_worker_holds_is_a_duplicate(agent_factory):
    """An attack: the same message delivered again, past AGENT_MAX_DEQUEUE_COUNT, while a worker
    ran the run and renewed its lease, poisoned it; the worker's completion was refused (and with
    DATABASE its committed work was recorded poisoned). Only a worker that stops renewing loses a
    run: the duplicate is acknowledged; once the lease has lapsed, the same delivery poisons."""
    clock = Clock(datetime.now(UTC))
    agent = agent_factory({"ok": every_second("SELECT 1")}, clock=clock)
    agent.tick()
    clock.advance(2)                        # past the one-time slot
    (run,) = runs_of(agent, "ok")
    body = RunMessage(run_id=run["run_id"], token=run["token"]).to_json()
    started = agent.store().execute("start_run", run_id=run["run_id"], token=run["token"], now=clock(),
                                    worker="the-live-worker", dequeue_count=1, max_concurrency=8,
                                    late_cutoff=clock() - timedelta(hours=1)).rows
    assert started and started[0]["decision"] == "start", started
    above = agent.settings.agent.max_dequeue_count + 1
    assert agent.handle_message(body, above, "m-1").outcome == "duplicate"
    (held,) = runs_of(agent, "ok")
    assert held["status"] == "running" and held["token"] == run["token"] and not poison_rows(agent)
    clock.advance(3600)                     # the worker stopped renewing: its lease lapsed
    assert agent.handle_message(body, above + 1, "m-1").outcome == "poisoned"
    assert runs_of(agent, "ok")[0]["status"] == "poisoned"


def test_a_malformed_messages_poison_record_names_no_run_to_requeue(agent_factory):
    """A message for an unknown run, or with a token never issued, is malformed: its record named
    the run id it claimed, so `poison requeue` started that run, or a run created later under that
    id (an attack). It names none, and says which in its reason."""
    agent = agent_factory({"ok": every_second("SELECT 1")})
    agent.tick()
    (run,) = runs_of(agent, "ok")
    agent.handle_message(RunMessage(run_id=run["run_id"] + 1000, token=1).to_json(), 1)
    agent.handle_message(RunMessage(run_id=run["run_id"], token=run["token"] + 7).to_json(), 1)
    rows = poison_rows(agent)
    assert sorted(p["run_id"] is None for p in rows) == [True, True], rows
    assert {("unknown run" in p["reason"]) or ("never issued" in p["reason"]) for p in rows} == {True}


def test_poison_does_not_stop_other_work(agent_factory):
    agent = agent_factory({"good": every_second("SELECT 1")})
    agent.queue.send_many(["garbage", "{}"])
    prime(agent)
    work(agent)
    assert [r["status"] for r in runs_of(agent, "good")] == ["succeeded"]
    assert len(poison_rows(agent)) == 2
    assert agent.queue.run_messages() == 0


def test_the_same_message_delivered_twice_runs_the_job_once(agent_factory):
    agent = agent_factory({"once": every_second("INSERT INTO marker (job) VALUES ('once')")})
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    prime(agent)
    (message,) = agent.queue.receive(1, 0)
    agent.queue.release(message, 0)
    agent.queue.send_many([message.body])                   # at-least-once delivery: a duplicate
    work(agent, concurrency=1)
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(1,)]
    assert runs_of(agent, "once")[0]["status"] == "succeeded"


def test_dequeue_count_above_threshold_is_poisoned_before_running(agent_factory):
    agent = agent_factory({"loop": every_second("INSERT INTO marker (job) VALUES ('loop')")})
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    prime(agent)
    (message,) = agent.queue.receive(1, 0)
    result = agent.handle_message(message.body, 6, message.id)   # e.g. a restart loop
    assert result.outcome == "poisoned"
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]
    assert runs_of(agent, "loop")[0]["status"] == "poisoned"


def test_poison_requeue_gives_the_run_another_attempt(agent_factory, db_url):
    agent = agent_factory({"doomed": every_second("SELECT * FROM missing_for_now")})
    prime(agent)
    (message,) = agent.queue.receive(1, 0)
    agent.handle_message(message.body, 9, message.id)
    agent.queue.delete(message)
    (poison,) = poison_rows(agent)
    execute(agent, "CREATE TABLE missing_for_now (x INT)")
    assert cli(["--db", db_url, "poison", "requeue", str(poison["poison_id"])]) == 0
    agent.tick()       # the command line has no queue here; the agent's dispatch sends it
    work(agent)
    run = runs_of(agent, "doomed")[0]
    assert run["status"] == "succeeded"
    assert poison_rows(agent)[0]["requeued_at"] is not None
    assert cli(["--db", db_url, "poison", "requeue", "424242"]) == 2


def _slow_sql(db_url: str, seconds: int) -> str:
    return sql_for(db_url, f"SELECT agent_sleep({seconds})", f"SELECT pg_sleep({seconds})", tsql_delay(seconds))


def test_timeout_cancels_runaway_work(agent_factory, db_url):
    agent = agent_factory({"slow": every_second(_slow_sql(db_url, 30), TIMEOUT_SECONDS="1", MAX_ATTEMPTS="1")})
    prime(agent)
    started = time.monotonic()
    work(agent)
    assert time.monotonic() - started < 15
    (run,) = runs_of(agent, "slow")
    assert run["status"] == "failed" and "timed out after 1 s" in run["last_error"]
    assert attempts_of(agent, run["run_id"])[0]["outcome"] == "timeout"


def test_cancel_stops_a_running_job(agent_factory, db_url):
    agent = agent_factory({"slow": every_second(_slow_sql(db_url, 60), LEASE_SECONDS="6")})
    prime(agent)
    worker = threading.Thread(target=work, args=(agent,), kwargs={"concurrency": 1})
    started = time.monotonic()
    worker.start()
    run_id = _wait_for_status(agent, "slow", "running")
    assert cli(["--db", db_url, "cancel", str(run_id)]) == 0
    worker.join(timeout=30)
    assert not worker.is_alive() and time.monotonic() - started < 25
    (run,) = runs_of(agent, "slow")
    assert run["status"] == "cancelled"
    assert attempts_of(agent, run_id)[0]["outcome"] == "lease_lost"
    assert cli(["--db", db_url, "cancel", str(run_id)]) == 2


def _wait_for_status(agent, job, status, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = [r for r in runs_of(agent, job) if r["status"] == status]
        if rows:
            return rows[0]["run_id"]
        time.sleep(0.1)
    raise AssertionError(f"no {status} run of {job} within {timeout} s: {runs_of(agent, job)}")


def test_transient_job_error_propagates_out_of_the_executor(pg_url):
    """The executor raises so that the queue (host) redelivers; it does not swallow it."""
    from tests.support.harness import make_agent

    agent = make_agent(pg_url, {"t": every_second("SELECT pg_terminate_backend(pg_backend_pid())")},
                       queue=MemoryQueue())
    try:
        prime(agent)
        (message,) = agent.queue.receive(1, 0)
        with pytest.raises(TransientJobError):
            agent.handle_message(message.body, 1, message.id)
        (run,) = runs_of(agent, "t")
        assert run["status"] == "queued"           # waiting for the redelivery, same token
    finally:
        agent.close()
