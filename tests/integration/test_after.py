"""Jobs that follow jobs (issue 27 item 3): JOB__<b>__AFTER=<a> and agent.add_scheduled_job @after.

A run of a that ends with b's AFTER_OUTCOME starts a run of b in the transaction that records a's
end: no tick in between, exactly once whoever ends the run, with the chain's operation id and
the run it followed recorded (runs.followed_run_id)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.engine.dispatch import dispatch
from shared.jobs.from_settings import parse_jobs
from shared.jobs.model import AfterOutcome
from shared.messaging.memory import MemoryQueue
from tests.support.harness import MSSQL_BASE, ROOT, Clock, at, execute, fresh_database, make_agent, query, runs_table, work
from tests.support.tsql_caller import CallError, call, connect, select


def runs(agent) -> list[dict]:
    rows = query(agent, f"SELECT run_id, job_name, status, followed_run_id, operation_id, kind, note "
                        f"FROM {runs_table(agent)} ORDER BY run_id")
    names = ("run_id", "job_name", "status", "followed_run_id", "operation_id", "kind", "note")
    return [dict(zip(names, row)) for row in rows]


def start(agent, job: str) -> dict:
    """run-now, dispatched at once in queue mode (as the command does)."""
    row = agent.request_run_now(job)
    assert row is not None and row["status"] == "pending", row
    if agent.queue is not None:
        dispatch(agent.store(), agent.queue, agent.settings, agent.clock(), agent.telemetry)
    return row


# ---------------------------------------------------------------- settings

def test_after_and_after_outcome_parse_and_are_validated():
    valid, invalid = parse_jobs({
        "JOB__a__COMMAND": "SELECT 1",
        "JOB__b__COMMAND": "SELECT 2", "JOB__b__AFTER": "a",
        "JOB__c__COMMAND": "SELECT 3", "JOB__c__AFTER": "b", "JOB__c__AFTER_OUTCOME": "Failed",
        "JOB__d__COMMAND": "SELECT 4", "JOB__d__AFTER": "a", "JOB__d__AFTER_OUTCOME": "completed",
        "JOB__d__SCHEDULE": "0 0 3 * * *",
    })
    assert invalid == ()
    jobs = {job.name: job for job in valid}
    assert (jobs["a"].after, jobs["a"].after_outcome) == (None, AfterOutcome.SUCCEEDED)
    assert (jobs["b"].after, jobs["b"].after_outcome) == ("a", AfterOutcome.SUCCEEDED)
    assert (jobs["c"].after, jobs["c"].after_outcome) == ("b", AfterOutcome.FAILED)
    assert (jobs["d"].after, jobs["d"].after_outcome, jobs["d"].schedule) == ("a", AfterOutcome.COMPLETED, "0 0 3 * * *")

    _, invalid = parse_jobs({
        "JOB__a__COMMAND": "SELECT 1",
        "JOB__badname__COMMAND": "SELECT 1", "JOB__badname__AFTER": "no such/job",
        "JOB__missing__COMMAND": "SELECT 1", "JOB__missing__AFTER": "ghost",
        "JOB__outcome__COMMAND": "SELECT 1", "JOB__outcome__AFTER": "a", "JOB__outcome__AFTER_OUTCOME": "sometimes",
        "JOB__alone__COMMAND": "SELECT 1", "JOB__alone__AFTER_OUTCOME": "failed",
        "JOB__case__COMMAND": "SELECT 1", "JOB__case__AFTER": "A",
    })
    errors = {bad.name: bad.message for bad in invalid}
    assert set(errors) == {"badname", "missing", "outcome", "alone", "case"}
    assert "JOB__badname__AFTER='no such/job'" in errors["badname"] and "expected the name of another job" in errors["badname"]
    assert "JOB__missing__AFTER='ghost'" in errors["missing"] and "job of these settings" in errors["missing"]
    assert "JOB__outcome__AFTER_OUTCOME='sometimes'" in errors["outcome"]
    assert "succeeded or failed or completed" in errors["outcome"]
    assert "set without JOB__alone__AFTER" in errors["alone"]
    assert "as it is written: 'a'" in errors["case"]


def test_cycles_are_refused_naming_the_cycle_and_the_other_jobs_keep_running():
    valid, invalid = parse_jobs({
        "JOB__self__COMMAND": "SELECT 1", "JOB__self__AFTER": "self",
        "JOB__a__COMMAND": "SELECT 1", "JOB__a__AFTER": "b",
        "JOB__b__COMMAND": "SELECT 1", "JOB__b__AFTER": "a",
        "JOB__x__COMMAND": "SELECT 1", "JOB__x__AFTER": "z",
        "JOB__y__COMMAND": "SELECT 1", "JOB__y__AFTER": "x",
        "JOB__z__COMMAND": "SELECT 1", "JOB__z__AFTER": "y",
        "JOB__tail__COMMAND": "SELECT 1", "JOB__tail__AFTER": "x",      # follows into a cycle: itself fine
        "JOB__root__COMMAND": "SELECT 1",
        "JOB__leaf__COMMAND": "SELECT 1", "JOB__leaf__AFTER": "root",
    })
    errors = {bad.name: bad.message for bad in invalid}
    assert set(errors) == {"self", "a", "b", "x", "y", "z"}
    assert {job.name for job in valid} == {"tail", "root", "leaf"}
    assert "(self -> self:" in errors["self"]
    assert "(a -> b -> a:" in errors["a"] and "(b -> a -> b:" in errors["b"]
    # Run order: x's run starts y, y's starts z, z's starts x.
    assert "JOB__x__AFTER='z': a cycle of jobs that follow each other (x -> y -> z -> x:" in errors["x"]
    assert "(z -> x -> y -> z:" in errors["z"]
    assert all("remove AFTER from one of them" in message for message in errors.values())


# ---------------------------------------------------------------- chains run without ticks

@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_a_chain_runs_in_order_with_no_tick_between(db_url, mode):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {
        "a": {"COMMAND": "SELECT 1"},
        "b": {"COMMAND": "SELECT 2", "AFTER": "a"},
        "c": {"COMMAND": "SELECT 3", "AFTER": "b"},
        "other": {"COMMAND": "SELECT 4", "AFTER": "a", "AFTER_OUTCOME": "failed"},
    }, clock=clock, queue=MemoryQueue() if mode == "queue" else None)
    agent.tick()                                            # the sync; no tick after this
    first = start(agent, "a")
    work(agent)
    rows = runs(agent)
    assert [(r["job_name"], r["status"]) for r in rows] == [("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded")]
    a, b, c = rows
    assert a["run_id"] == first["run_id"] and a["followed_run_id"] is None
    assert (b["followed_run_id"], c["followed_run_id"]) == (a["run_id"], b["run_id"])
    assert {r["operation_id"] for r in rows} == {first["operation_id"]}       # one operation: the chain
    assert b["kind"] == c["kind"] == "manual"
    assert b["note"] == f"after run {a['run_id']} of a (succeeded)"
    # In order: each link starts once the one before has ended.
    times = {row[0]: row[1:] for row in query(agent, f"SELECT run_id, started_at, finished_at FROM {runs_table(agent)}")}
    assert str(times[a["run_id"]][1]) <= str(times[b["run_id"]][0])
    assert str(times[b["run_id"]][1]) <= str(times[c["run_id"]][0])


def test_after_outcome_failed_and_completed_and_what_starts_nothing(db_url):
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {
        "a": {"COMMAND": "INSERT INTO marks (n) VALUES (1)", "MAX_ATTEMPTS": "1"},
        "on_ok": {"COMMAND": "SELECT 1", "AFTER": "a"},
        "on_fail": {"COMMAND": "SELECT 1", "AFTER": "a", "AFTER_OUTCOME": "failed"},
        "on_any": {"COMMAND": "SELECT 1", "AFTER": "a", "AFTER_OUTCOME": "completed"},
        "off": {"COMMAND": "SELECT 1", "AFTER": "a", "AFTER_OUTCOME": "completed", "ENABLED": "false"},
    }, clock=clock)
    agent.tick()
    failed = start(agent, "a")                       # no table yet: the run fails
    work(agent)
    by_job = {}
    for row in runs(agent):
        by_job.setdefault(row["job_name"], []).append(row)
    assert [r["status"] for r in by_job["a"]] == ["failed"]
    assert sorted(by_job) == ["a", "on_any", "on_fail"]
    assert by_job["on_fail"][0]["followed_run_id"] == by_job["on_any"][0]["followed_run_id"] == failed["run_id"]
    assert by_job["on_fail"][0]["note"] == f"after run {failed['run_id']} of a (failed)"

    execute(agent, "CREATE TABLE marks (n INT)")
    clock.advance(5)
    succeeded = start(agent, "a")
    work(agent)
    followers = [(r["job_name"], r["status"]) for r in runs(agent) if r["followed_run_id"] == succeeded["run_id"]]
    assert sorted(followers) == [("on_any", "succeeded"), ("on_ok", "succeeded")]

    # A run cancelled before it ran, and a start skipped by the overlap policy, start nothing.
    clock.advance(5)
    cancelled = start(agent, "a")
    from shared.cli.commands import main as cli
    assert cli(["--db", db_url, "cancel", str(cancelled["run_id"])]) == 0
    work(agent)
    assert not [r for r in runs(agent) if r["followed_run_id"] == cancelled["run_id"]]
    assert len(runs(agent)) == 2 + 2 + 1 + 2      # two ends of a with their followers, the cancelled one


def test_a_paused_follower_starts_nothing_until_resumed(db_url, capsys):
    """A pause holds the chain at the paused job: a's end starts nothing of b (b's own follower c
    neither), and once b is resumed the next end of a starts b and then c."""
    from shared.cli.commands import main as cli

    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {
        "a": {"COMMAND": "SELECT 1"},
        "b": {"COMMAND": "SELECT 2", "AFTER": "a"},
        "c": {"COMMAND": "SELECT 3", "AFTER": "b"},
    }, clock=clock)
    agent.tick()
    assert cli(["--db", db_url, "pause", "b"]) == 0
    held = start(agent, "a")
    work(agent)
    assert [(r["job_name"], r["status"]) for r in runs(agent)] == [("a", "succeeded")]

    assert cli(["--db", db_url, "resume", "b"]) == 0
    capsys.readouterr()
    clock.advance(5)
    released = start(agent, "a")
    work(agent)
    rows = runs(agent)
    assert [(r["job_name"], r["status"]) for r in rows] == [("a", "succeeded"), ("a", "succeeded"),
                                                            ("b", "succeeded"), ("c", "succeeded")]
    assert rows[2]["followed_run_id"] == released["run_id"] != held["run_id"]


def test_several_followers_start_in_one_statement(db_url):
    """Ten followers of one job: the end of its run starts all ten, with one statement."""
    clock = Clock(at("2026-11-25T08:00:00"))
    jobs = {"a": {"COMMAND": "SELECT 1"}}
    jobs.update({f"f{i}": {"COMMAND": "SELECT 1", "AFTER": "a"} for i in range(10)})
    agent = make_agent(db_url, jobs, clock=clock)
    agent.tick()
    first = start(agent, "a")
    store = agent.store()
    seen: list[str] = []
    before, store.observer = store.observer, (lambda name, *_: seen.append(name))
    agent.executor().work_once(batch=1)                # runs a alone, in this thread
    store.observer = before
    assert seen.count("start_follow_up_runs") == 1
    followers = [r for r in runs(agent) if r["followed_run_id"] == first["run_id"]]
    assert sorted(r["job_name"] for r in followers) == [f"f{i}" for i in range(10)]
    assert {r["status"] for r in followers} == {"pending"}
    work(agent)
    assert {r["status"] for r in runs(agent)} == {"succeeded"}


# ---------------------------------------------------------------- T-SQL: agent.add_scheduled_job @after

@pytest.fixture(params=["postgres"] + (["mssql"] if MSSQL_BASE else []))
def control(request):
    """A control database on a real server, an agent on the real clock (the procedures read the
    server's), and a user's own connection to it."""
    with fresh_database(request.param) as url:
        agent = make_agent(url, {"load": {"COMMAND": "SELECT 1"}})
        connection = connect(url)
        try:
            yield agent, connection
        finally:
            connection.close()
            agent.close()


def test_tsql_after_follows_a_settings_job_checks_names_and_refuses_cycles(control):
    agent, connection = control
    agent.tick()                                                   # the settings job 'load'
    (defined,) = call(connection, "add_scheduled_job", name="rebuild", sql="SELECT 2", after="LOAD")
    assert defined["action"] == "defined"
    (chained,) = call(connection, "add_scheduled_job", name="report", sql="SELECT 3", after="rebuild",
                      after_outcome="Completed")
    assert chained["action"] == "defined"
    jobs = {row["job_name"]: row for row in select(connection, "SELECT job_name, after_job, after_outcome FROM agent.jobs")}
    assert (jobs["rebuild"]["after_job"], jobs["rebuild"]["after_outcome"]) == ("load", "succeeded")  # as written
    assert (jobs["report"]["after_job"], jobs["report"]["after_outcome"]) == ("rebuild", "completed")
    assert jobs["load"]["after_job"] is None

    refused = {
        "ghost": dict(name="x", sql="SELECT 1", after="ghost"),
        "outcome": dict(name="x", sql="SELECT 1", after="load", after_outcome="sometimes"),
        "name": dict(name="x", sql="SELECT 1", after="bad name"),
        "cycle": dict(name="rebuild", sql="SELECT 2", after="report"),
        "self": dict(name="report", sql="SELECT 3", after="report"),
    }
    messages = {}
    for key, arguments in refused.items():
        with pytest.raises(CallError) as caught:
            call(connection, "add_scheduled_job", **arguments)
        messages[key] = caught.value.message
    assert "@after = 'ghost': expected the name of a job defined in the app settings or with " \
           "agent.add_scheduled_job" in messages["ghost"]
    assert "@after_outcome = 'sometimes': expected succeeded, failed or completed" in messages["outcome"]
    assert "@after = 'bad name': expected NULL" in messages["name"]
    assert "a cycle of jobs that follow each other (rebuild -> report -> rebuild:" in messages["cycle"]
    assert "(report -> report:" in messages["self"]
    # Refused calls changed nothing.
    jobs = {row["job_name"]: row for row in select(connection, "SELECT job_name, after_job FROM agent.jobs")}
    assert (jobs["rebuild"]["after_job"], jobs["report"]["after_job"]) == ("load", "rebuild")
    assert "x" not in jobs

    # The chain runs: load (settings) -> rebuild -> report, each started by the end before it.
    agent.tick()                                                   # plans the jobs defined here
    activity = {row["job_name"]: row for row in
                select(connection, "SELECT job_name, after_job, after_outcome FROM agent.job_activity")}
    assert (activity["report"]["after_job"], activity["report"]["after_outcome"]) == ("rebuild", "completed")
    assert activity["load"]["after_job"] is None
    first = start(agent, "load")
    work(agent)
    history = select(connection, "SELECT run_id, job_name, outcome, followed_run_id FROM agent.job_history "
                                 "ORDER BY run_id")
    assert [(h["job_name"], h["outcome"]) for h in history] == [("load", "succeeded"), ("rebuild", "succeeded"),
                                                                 ("report", "succeeded")]
    assert history[0]["followed_run_id"] is None and history[0]["run_id"] == first["run_id"]
    assert [h["followed_run_id"] for h in history[1:]] == [history[0]["run_id"], history[1]["run_id"]]


@pytest.mark.parametrize("dialect", ["postgres"] + (["mssql"] if MSSQL_BASE else []))
def test_a_settings_after_in_another_letter_case_follows_the_job_it_names(dialect):
    """AFTER=T names the database's t (names compare case-insensitively); the sync writes it as
    t is spelt, so the follow-up fires (the run-time join compares exactly)."""
    with fresh_database(dialect) as url:
        agent = make_agent(url, {"load": {"COMMAND": "SELECT 1"}})
        connection = connect(url)
        try:
            agent.tick()
            (defined,) = call(connection, "add_scheduled_job", name="t", sql="SELECT 1")
            assert defined["action"] == "defined"
            follower = make_agent(url, {"s": {"COMMAND": "SELECT 2", "AFTER": "T"}, "T": {"COMMAND": "SELECT 3"}})
            follower.tick()
            jobs = {row["job_name"]: row for row in select(connection, "SELECT job_name, after_job, valid FROM agent.jobs")}
            assert jobs["s"]["after_job"] == "t" and jobs["s"]["valid"] == 1
            start(follower, "t")
            work(follower)
            history = select(connection, "SELECT job_name, outcome FROM agent.job_history ORDER BY run_id")
            assert [(h["job_name"], h["outcome"]) for h in history] == [("t", "succeeded"), ("s", "succeeded")]
            follower.close()
        finally:
            connection.close()
            agent.close()


# ---------------------------------------------------------------- exactly once, with processes (PostgreSQL)

def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _wait_for(agent, sql: str, expected, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query(agent, sql) == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"{sql} did not return {expected} within {timeout} s: {query(agent, sql)}")


def test_worker_killed_mid_run_leaves_no_follow_up_and_the_retried_run_starts_exactly_one(pg_url):
    """kill -9 of the worker process mid-run of a: nothing follows yet; the lease lapses, a tick
    takes the run back, the retried run ends, and exactly one run of b follows it."""
    a = ("SELECT pg_sleep(CASE WHEN (SELECT MAX(attempt) FROM agent.runs WHERE job_name = 'a') = 1 THEN 60 ELSE 0 END); "
         "INSERT INTO marker (job) VALUES ('a');")
    agent = make_agent(pg_url, {"a": {"COMMAND": a, "LEASE_SECONDS": "6", "MAX_ATTEMPTS": "1"},
                                "b": {"COMMAND": "INSERT INTO marker (job) VALUES ('b');", "AFTER": "a"}})
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    agent.tick()
    first = start(agent, "a")
    worker = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", pg_url, "work", "--once"],
                              cwd=ROOT, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(agent, "SELECT status FROM agent.runs", [("running",)])
        time.sleep(1)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert [(r["job_name"], r["status"]) for r in runs(agent)] == [("a", "running")]      # nothing follows yet
    time.sleep(6.5)                                            # the lease lapses: nothing renews it
    report = agent.tick()
    assert [r["run_id"] for r in report.expired] == [first["run_id"]]
    assert [(r["job_name"], r["status"]) for r in runs(agent)] == [("a", "pending")]       # a lapse is no end
    work(agent)
    rows = runs(agent)
    assert [(r["job_name"], r["status"], r["followed_run_id"]) for r in rows] == [
        ("a", "succeeded", None), ("b", "succeeded", first["run_id"])]
    assert sorted(query(agent, "SELECT job FROM marker")) == [("a",), ("b",)]
    agent.tick()                                               # and no later tick adds one
    assert len(runs(agent)) == 2


def test_a_fenced_worker_and_the_new_holder_ending_the_same_run_start_one_follow_up(pg_url):
    """A worker process whose lease was taken over (an instance an hour ahead took the run back)
    and the new holder both reach the end of run a: the new holder's end starts b, the fenced
    worker's end is refused (its work rolled back) and starts nothing."""
    a = "INSERT INTO marker (job) VALUES ('a'); SELECT pg_sleep(4);"
    jobs = {"a": {"COMMAND": a, "LEASE_SECONDS": "3600"},
            "b": {"COMMAND": "INSERT INTO marker (job) VALUES ('b');", "AFTER": "a"}}
    agent = make_agent(pg_url, jobs)
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    agent.tick()
    first = start(agent, "a")
    zombie = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", pg_url, "work", "--once"],
                              cwd=ROOT, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _wait_for(agent, "SELECT status FROM agent.runs", [("running",)])
        other = make_agent(pg_url, jobs, clock=Clock(datetime.now(timezone.utc) + timedelta(hours=2)))
        assert [r["run_id"] for r in other.tick().expired] == [first["run_id"]]      # the lease "expired"
        work(other)                                            # the new holder runs a to its end
        zombie.communicate(timeout=60)                         # the zombie reaches its end: fenced
    finally:
        if zombie.poll() is None:
            zombie.kill()
    rows = runs(agent)
    assert [(r["job_name"], r["status"], r["followed_run_id"]) for r in rows] == [
        ("a", "succeeded", None), ("b", "succeeded", first["run_id"])]
    assert sorted(query(agent, "SELECT job FROM marker")) == [("a",), ("b",)]      # the zombie's work rolled back
    outcomes = [o for (o,) in query(agent, "SELECT outcome FROM agent.attempts WHERE run_id = "
                                           f"{first['run_id']} ORDER BY attempt_id")]
    assert outcomes[0] in ("lease_lost", "lease_expired") and outcomes[-1] == "succeeded", outcomes


def _start_follow_ups_in_process(db_url: str, barrier, now_iso: str, results) -> None:
    from shared.engine.agent import Agent
    from shared.engine.follow import follow_up_calls
    from shared.settings import load_settings

    agent = Agent(load_settings(environ={}), db=db_url, simulated_time=True)
    store = agent.store()
    store.require_schema()
    barrier.wait(timeout=60)
    with store.transaction():
        (name, params), = follow_up_calls(datetime.fromisoformat(now_iso))
        rows = store.execute(name, **params).rows
    results.put(sorted(row["job_name"] for row in rows))
    agent.close()


def test_eight_processes_starting_the_follow_ups_of_one_ended_run_create_one_each(pg_url):
    """The key behind the fence: eight processes run the follow-up statement for the same ended
    run at the same moment (as eight endings of it would, were the ending not fenced); the unique
    (followed_run_id, job_name) lets exactly one run of each follower in."""
    agent = make_agent(pg_url, {"a": {"COMMAND": "SELECT 1"},
                                "b": {"COMMAND": "SELECT 1", "AFTER": "a"},
                                "c": {"COMMAND": "SELECT 1", "AFTER": "a", "AFTER_OUTCOME": "completed"}})
    agent.tick()
    first = start(agent, "a")
    ended = datetime(2026, 11, 25, 8, 0, 0, 123000)
    execute(agent, f"UPDATE agent.runs SET status = 'succeeded', finished_at = '{ended.isoformat(sep=' ')}' "
                   f"WHERE run_id = {first['run_id']}")
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(8)
    results = context.Queue()
    processes = [context.Process(target=_start_follow_ups_in_process,
                                 args=(pg_url, barrier, ended.replace(tzinfo=timezone.utc).isoformat(), results))
                 for _ in range(8)]
    for process in processes:
        process.start()
    started = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert sorted(job for names in started for job in names) == ["b", "c"]
    followers = [(r["job_name"], r["followed_run_id"]) for r in runs(agent) if r["followed_run_id"] is not None]
    assert sorted(followers) == [("b", first["run_id"]), ("c", first["run_id"])]


# ---------------------------------------------------------------- shown: history, jobs, monitor, JSON, notifications

def test_the_link_is_shown_in_history_jobs_the_monitor_its_json_and_notifications(db_url, capsys):
    import contextlib
    import json
    import re

    from shared.cli.commands import main as cli
    from shared.engine.notify import notification_body
    from shared.web.app import Monitor, MonitorSettings

    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {"load": {"COMMAND": "SELECT 1"},
                                "rebuild": {"COMMAND": "SELECT 2", "AFTER": "load"},
                                "alert": {"COMMAND": "SELECT 3", "AFTER": "load", "AFTER_OUTCOME": "failed",
                                          "SCHEDULE": "0 0 6 * * *"}}, clock=clock)
    agent.tick()
    first = start(agent, "load")
    work(agent)
    (follow,) = [r for r in runs(agent) if r["followed_run_id"] == first["run_id"]]
    capsys.readouterr()

    assert cli(["--db", db_url, "history", "--json"]) == 0
    history = {run["run_id"]: run for run in json.loads(capsys.readouterr().out)["runs"]}
    assert history[follow["run_id"]]["followed_run_id"] == first["run_id"]
    assert history[first["run_id"]]["followed_run_id"] is None
    assert cli(["--db", db_url, "history"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{follow['run_id']} "))
    assert f"after #{first['run_id']}" in line and "rebuild" in line

    assert cli(["--db", db_url, "jobs", "--json"]) == 0
    jobs = {row["job_name"]: row for row in json.loads(capsys.readouterr().out)}
    assert (jobs["rebuild"]["after_job"], jobs["rebuild"]["after_outcome"]) == ("load", "succeeded")
    assert (jobs["alert"]["after_job"], jobs["alert"]["after_outcome"]) == ("load", "failed")
    assert jobs["load"]["after_job"] is None
    assert cli(["--db", db_url, "jobs"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.strip()}
    assert "on demand, after load" in lines["rebuild"]
    assert "0 0 6 * * *, after load failed" in lines["alert"]

    store = agent.new_store()
    try:
        monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: clock.now,
                          settings=lambda: MonitorSettings())
        page = monitor.handle("GET", f"/runs/{follow['run_id']}").body.decode()
        assert re.search(rf'after run <a href="[^"]*/runs/{first["run_id"]}">{first["run_id"]}</a>', page)
        twin = json.loads(monitor.handle("GET", f"/runs/{follow['run_id']}", "format=json").body)
        assert twin["run"]["followed_run_id"] == first["run_id"]
        job_page = monitor.handle("GET", "/jobs/rebuild").body.decode()
        assert re.search(r'<div class="after">after <a href="[^"]*/jobs/load">load</a></div>', job_page)
        assert "after run <a" in job_page                          # its history's kind column
        jobs_page = monitor.handle("GET", "/").body.decode()
        row = re.search(r'<tr class="job" id="job-alert">(.*?)</tr>', jobs_page, re.S).group(1)
        assert re.search(r'after <a href="[^"]*/jobs/load">load</a> failed', row)
        job_twin = json.loads(monitor.handle("GET", "/jobs/rebuild", "format=json").body)
        assert job_twin["job"]["after_job"] == "load"
        assert [r["followed_run_id"] for r in job_twin["runs"]] == [first["run_id"]]
    finally:
        store.close()

    (run,) = agent.store().execute("notification_runs", run_ids=[follow["run_id"]]).rows
    body = notification_body({"job_name": "rebuild", "run_id": follow["run_id"], "outcome": "succeeded"}, run)
    assert body["followed_run_id"] == first["run_id"] and body["operation_id"] == first["operation_id"]


def test_a_cycle_in_the_settings_makes_its_jobs_invalid_at_sync_and_the_others_run(db_url, capsys):
    """One bad job never stops the others: the jobs of a cycle are recorded invalid with the
    cycle named (jobs, its JSON, a config_invalid event), a job following into the cycle and the
    rest sync and run."""
    import json

    from shared.cli.commands import main as cli

    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {"x": {"COMMAND": "SELECT 1", "AFTER": "y"},
                                "y": {"COMMAND": "SELECT 1", "AFTER": "x"},
                                "tail": {"COMMAND": "SELECT 1", "AFTER": "x"},
                                "root": {"COMMAND": "SELECT 1"},
                                "leaf": {"COMMAND": "SELECT 1", "AFTER": "root"}}, clock=clock)
    agent.tick()
    capsys.readouterr()
    assert cli(["--db", db_url, "jobs", "--json"]) == 0
    jobs = {row["job_name"]: row for row in json.loads(capsys.readouterr().out)}
    assert (jobs["x"]["valid"], jobs["y"]["valid"]) == (0, 0)
    assert "a cycle of jobs that follow each other (x -> y -> x:" in jobs["x"]["config_error"]
    assert jobs["x"]["after_job"] is None                  # an invalid job follows nothing
    assert all(jobs[name]["valid"] == 1 for name in ("tail", "root", "leaf"))
    assert cli(["--db", db_url, "history", "--job", "x", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)["job_events"]
    assert [e["kind"] for e in events] == ["config_invalid"] and "x -> y -> x" in events[0]["detail"]
    start(agent, "root")
    work(agent)
    assert [(r["job_name"], r["status"]) for r in runs(agent)] == [("root", "succeeded"), ("leaf", "succeeded")]
    assert agent.request_run_now("x") is None               # an invalid job cannot be started


def test_a_poisoned_run_starts_its_failed_followers_on_the_queue_at_once(db_url):
    """Poisoned counts as failed: the poison's transaction starts the follower, and in queue mode
    it is dispatched at once (no doorbell, no tick)."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {"a": {"COMMAND": "SELECT 1"},
                                "on_fail": {"COMMAND": "SELECT 2", "AFTER": "a", "AFTER_OUTCOME": "failed"},
                                "on_ok": {"COMMAND": "SELECT 3", "AFTER": "a"}},
                       clock=clock, queue=MemoryQueue())
    agent.tick()
    first = start(agent, "a")
    (message,) = agent.queue.receive(1, 30)
    result = agent.executor().handle(message.body, agent.settings.agent.max_dequeue_count + 1, message.id)
    agent.queue.delete(message)
    assert result.outcome == "poisoned"
    rows = runs(agent)
    assert [(r["job_name"], r["status"]) for r in rows] == [("a", "poisoned"), ("on_fail", "queued")]
    assert rows[1]["followed_run_id"] == first["run_id"] and rows[1]["note"].endswith("of a (poisoned)")
    work(agent)
    assert [(r["job_name"], r["status"]) for r in runs(agent)] == [("a", "poisoned"), ("on_fail", "succeeded")]


def test_two_runs_of_a_job_ended_by_one_statement_start_one_follow_up_each(db_url):
    """The tick's lease expiry ends two runs of a at once (their workers died, their last lapse):
    one statement starts a follow-up for each, keyed a millisecond apart."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {"a": {"COMMAND": "SELECT 1", "OVERLAP": "allow"},
                                "b": {"COMMAND": "SELECT 2", "AFTER": "a", "AFTER_OUTCOME": "failed",
                                      "OVERLAP": "queue"}},      # b's own policy: the second waits its turn
                       clock=clock, AGENT_MAX_LAPSES="1")
    agent.tick()
    ids = [agent.request_run_now("a")["run_id"], agent.request_run_now("a")["run_id"]]
    # Both runs as two workers that died mid-run left them: running, one lapse spent, lease gone.
    execute(agent, f"UPDATE {runs_table(agent)} SET status = 'running', lapses = 1, token = token + 1, "
                   f"lease_expires_at = '2026-11-25 07:00:00' WHERE run_id IN ({ids[0]}, {ids[1]})")
    clock.advance(60)
    report = agent.tick()
    assert sorted(r["run_id"] for r in report.expired) == ids and {r["status"] for r in report.expired} == {"failed"}
    followers = [r for r in runs(agent) if r["job_name"] == "b"]
    assert sorted(r["followed_run_id"] for r in followers) == ids
    slots = query(agent, f"SELECT scheduled_for FROM {runs_table(agent)} WHERE job_name = 'b' ORDER BY run_id")
    assert len(set(slots)) == 2
    work(agent)
    assert [r["status"] for r in runs(agent) if r["job_name"] == "b"] == ["succeeded", "succeeded"]


def test_a_job_with_a_schedule_and_after_runs_on_its_slots_and_after_its_leader(db_url):
    clock = Clock(at("2026-11-25T08:59:30"))
    agent = make_agent(db_url, {"a": {"COMMAND": "SELECT 1"},
                                "b": {"COMMAND": "SELECT 2", "AFTER": "a", "SCHEDULE": "0 0 9 * * *"}}, clock=clock)
    agent.tick()                                              # claims b's 09:00 slot
    first = start(agent, "a")
    work(agent)                                               # a, then b after it: before the slot
    clock.now = at("2026-11-25T09:00:01")
    work(agent)                                               # b's slot
    rows = [(r["job_name"], r["kind"], r["status"], r["followed_run_id"]) for r in runs(agent)]
    assert sorted(rows, key=lambda r: (r[0], r[1])) == [
        ("a", "manual", "succeeded", None),
        ("b", "manual", "succeeded", first["run_id"]),
        ("b", "scheduled", "succeeded", None)]


@pytest.mark.parametrize("mode", ["direct", "queue"])
def test_a_job_with_steps_starts_its_followers_when_its_flow_ends(db_url, mode):
    """The end a step transition records (the flow's quit_success, or quit_failure after a step
    failed) starts the followers, as a one-step job's does."""
    clock = Clock(at("2026-11-25T08:00:00"))
    agent = make_agent(db_url, {
        "good": {"STEPS__1__COMMAND": "SELECT 1", "STEPS__2__COMMAND": "SELECT 2"},
        "bad": {"STEPS__1__COMMAND": "SELECT 1", "STEPS__2__COMMAND": "SELECT * FROM no_such_table",
                "STEPS__2__MAX_ATTEMPTS": "1"},
        "after_good": {"COMMAND": "SELECT 3", "AFTER": "good"},
        "after_bad": {"COMMAND": "SELECT 4", "AFTER": "bad", "AFTER_OUTCOME": "failed"},
        "after_bad_ok": {"COMMAND": "SELECT 5", "AFTER": "bad"},
    }, clock=clock, queue=MemoryQueue() if mode == "queue" else None)
    agent.tick()
    good, bad = start(agent, "good"), start(agent, "bad")
    work(agent)
    by_job = {r["job_name"]: r for r in runs(agent)}
    assert (by_job["good"]["status"], by_job["bad"]["status"]) == ("succeeded", "failed")
    assert by_job["after_good"]["followed_run_id"] == good["run_id"] and by_job["after_good"]["status"] == "succeeded"
    assert by_job["after_bad"]["followed_run_id"] == bad["run_id"] and by_job["after_bad"]["status"] == "succeeded"
    assert "after_bad_ok" not in by_job


def test_a_fleet_run_starts_its_followers_once_when_its_last_target_ends(pg_url):
    """A fleet job's run ends in the transaction of its last target execution (progress_fleets):
    that end starts the follower, once; the executions themselves start nothing."""
    from tests.integration.test_fleet import Fleet, mark_sql

    fleet = Fleet("postgres")
    try:
        fleet.create("t0", "t1", "t2")
        agent = make_agent(pg_url, {"fl": {"TARGETS": f"db:{fleet.prefix}_t*", "COMMAND": mark_sql("postgres"),
                                           "TARGET_PARALLELISM": "2"},
                                    "after_fl": {"COMMAND": "SELECT 1", "AFTER": "fl"}},
                           AGENT_MAX_CONCURRENCY="4")
        agent.tick()
        first = start(agent, "fl")
        work(agent, max_seconds=120)
        rows = runs(agent)
        assert {r["status"] for r in rows if r["kind"] == "target"} == {"succeeded"} and \
            len([r for r in rows if r["kind"] == "target"]) == 3
        followers = [r for r in rows if r["job_name"] == "after_fl"]
        assert [(r["followed_run_id"], r["status"]) for r in followers] == [(first["run_id"], "succeeded")]
        assert [r["status"] for r in rows if r["run_id"] == first["run_id"]] == ["succeeded"]
    finally:
        fleet.drop()
