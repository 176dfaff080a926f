"""The promises of the design, against the real stand-ins, with several processes:

1. one claim per occurrence (8 processes ticking at once over 500 due jobs), every run
   executed exactly once by several worker processes;
3/4. a worker killed with SIGKILL mid-job: the lease lapses, the run is dispatched again
   and completes, and the killed attempt stays in history;
2. fencing: a zombie whose lease was taken over can neither complete the run nor keep its
   control-database work.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone

from tests.support.harness import ROOT, execute, job_env, make_agent, query, sql_for, tsql_delay, work

UTC = timezone.utc
JOBS = 500
TICKERS = 8


def _tick_in_process(db_url: str, env: dict, barrier, now_iso: str, results) -> None:
    from shared.engine.agent import Agent
    from shared.settings import load_settings

    # simulated_time: the ticks run at the hour's slot (the test's time travel), not the database's now.
    agent = Agent(load_settings(environ=env), db=db_url, simulated_time=True)
    agent.store().require_schema()
    barrier.wait(timeout=60)
    report = agent.tick(datetime.fromisoformat(now_iso))
    results.put((len(report.claimed), report.errors))
    agent.close()


def test_eight_processes_tick_500_due_jobs_each_run_executes_once(db_url):
    jobs = {f"j{i:03d}": {"SCHEDULE": "0 0 * * * *", "COMMAND": f"INSERT INTO marker (job) VALUES ('j{i:03d}')"}
            for i in range(JOBS)}
    env = job_env(jobs)
    agent = make_agent(db_url, jobs)
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    # The hour's slot, just past: the tickers claim it on time, the workers start it at once
    # (late by the minutes since the hour, within the default grace: caught up, not skipped).
    slot = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    agent.tick(slot - timedelta(minutes=30))
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(TICKERS)
    results = context.Queue()
    now_iso = (slot + timedelta(seconds=5)).isoformat()
    processes = [context.Process(target=_tick_in_process, args=(db_url, env, barrier, now_iso, results))
                 for _ in range(TICKERS)]
    for process in processes:
        process.start()
    outcomes = [results.get(timeout=180) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert all(errors == [] for _, errors in outcomes), outcomes
    assert sum(claimed for claimed, _ in outcomes) == JOBS
    runs = query(agent, f"SELECT job_name, scheduled_for FROM {_runs(agent)}")
    assert len(runs) == JOBS and len({job for job, _ in runs}) == JOBS

    # Four worker processes claim straight from the runs table at once.
    workers = [subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", db_url, "work", "--until-idle",
                                 "--concurrency", "4"],
                                cwd=ROOT, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for _ in range(4)]
    for worker in workers:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err.decode()[-2000:]
    counts = query(agent, "SELECT job, COUNT(*) FROM marker GROUP BY job")
    assert len(counts) == JOBS and all(count == 1 for _, count in counts)
    statuses = query(agent, f"SELECT status, COUNT(*) FROM {_runs(agent)} GROUP BY status")
    assert statuses == [("succeeded", JOBS)]
    agent.close()


def work_once(agent) -> int:
    from shared.engine.runner import LocalRunner

    return LocalRunner(agent, concurrency=1, visibility_timeout=0).work_once()


def _at_clock(offset: timedelta):
    """Another instance whose clock is ``offset`` ahead (an injected clock, as a lease that ran out)."""
    from tests.support.harness import Clock

    return Clock(datetime.now(UTC) + offset)


def _runs(agent) -> str:
    return "agent_runs" if agent.target.dialect == "sqlite" else "agent.runs"


def _attempts(agent) -> str:
    return "agent_attempts" if agent.target.dialect == "sqlite" else "agent.attempts"


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _wait_for(agent, sql: str, expected, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if query(agent, sql) == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"{sql} did not return {expected} within {timeout} s: {query(agent, sql)}")


def test_worker_killed_mid_job_is_taken_back_and_completes_without_spending_an_attempt(db_url):
    """MAX_ATTEMPTS=1, and the worker is killed with SIGKILL mid-job: the lapse is not a
    failure (invariant 10); the run is taken back and completes."""
    sleep_first_attempt = sql_for(
        db_url,
        "SELECT agent_sleep(CASE WHEN (SELECT MAX(attempt) FROM agent_runs WHERE job_name = 'crashy') = 1 "
        "THEN 60 ELSE 0 END); INSERT INTO marker (job) VALUES ('crashy');",
        "SELECT pg_sleep(CASE WHEN (SELECT MAX(attempt) FROM agent.runs WHERE job_name = 'crashy') = 1 "
        "THEN 60 ELSE 0 END); INSERT INTO marker (job) VALUES ('crashy');",
        "IF (SELECT MAX(attempt) FROM agent.runs WHERE job_name = 'crashy') = 1 "
        f"{tsql_delay(60)}; INSERT INTO marker (job) VALUES ('crashy');")
    jobs = {"crashy": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": sleep_first_attempt,
                       "LEASE_SECONDS": "6", "MAX_ATTEMPTS": "1"}}
    agent = make_agent(db_url, jobs)
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    agent.tick()
    worker = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", db_url, "work", "--once"],
                              cwd=ROOT, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_for(agent, f"SELECT status FROM {_runs(agent)}", [("running",)])
    time.sleep(1)
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=10)
    # Nothing renews the lease any more; a tick after it lapses takes the run back.
    time.sleep(6.5)
    report = agent.tick()
    assert [r["run_id"] for r in report.expired] and report.expired[0]["was_running"] == 1
    (run,) = agent.store().execute("list_history", job_name="crashy", limit=5).rows
    assert run["status"] == "pending" and run["token"] == 2 and run["lapses"] == 1 and run["failures"] == 0
    work(agent)   # claimed again with a new token, and run
    (run,) = agent.store().execute("list_history", job_name="crashy", limit=5).rows
    assert run["status"] == "succeeded" and run["failures"] == 0
    outcomes = [o for _, o in query(agent, f"SELECT attempt, outcome FROM {_attempts(agent)} ORDER BY attempt")]
    # SQLite only: a job that reads, then writes, may meet the lease renewal's write and get
    # "database is locked" (transient: retried, no attempt spent).
    assert outcomes[0] == "lease_expired" and outcomes[-1] == "succeeded", outcomes
    assert set(outcomes[1:-1]) <= ({"transient"} if agent.target.dialect == "sqlite" else set()), outcomes
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(1,)]
    agent.close()


def test_zombie_cannot_complete_and_its_control_database_work_rolls_back(db_url):
    """The heartbeat is kept from noticing (a one-hour lease renews every 20 min), so the
    zombie reaches its completion: the fenced UPDATE matches no row and the work it did in
    the same transaction rolls back."""
    # PostgreSQL: work first, then slow; the takeover happens while the work is uncommitted.
    # SQLite allows one writer: the zombie reads (sleeps) first, then writes after the
    # takeover committed, so its write transaction cannot even begin on a stale snapshot.
    command = sql_for(db_url,
                      "SELECT agent_sleep(4); INSERT INTO marker (job) VALUES ('zombie');",
                      "INSERT INTO marker (job) VALUES ('zombie'); SELECT pg_sleep(4);",
                      f"INSERT INTO marker (job) VALUES ('zombie'); {tsql_delay(4)};")
    jobs = {"zombie": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": command,
                       "LEASE_SECONDS": "3600"}}
    agent = make_agent(db_url, jobs)
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    agent.tick()
    results = []
    zombie = threading.Thread(target=lambda: results.append(work_once(agent)))
    zombie.start()
    _wait_for(agent, f"SELECT status FROM {_runs(agent)}", [("running",)])
    time.sleep(1)
    other = make_agent(db_url, jobs, clock=_at_clock(timedelta(hours=2)))
    takeover = other.tick()                                              # the lease "expired"
    assert takeover.expired and takeover.expired[0]["status"] == "pending"
    zombie.join(timeout=60)
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]          # the zombie's work rolled back
    run = other.store().execute("list_history", job_name="zombie", limit=5).rows[0]
    assert run["status"] == "pending" and run["token"] == 2              # taken back, not "succeeded"
    outcomes = query(agent, f"SELECT attempt, outcome FROM {_attempts(agent)} ORDER BY attempt")
    assert outcomes[0][1] in ("lease_expired", "lease_lost")
    # The new holder runs it.
    work(other)
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(1,)]
    other.close()
    agent.close()


def test_zombie_is_stopped_by_its_heartbeat(db_url):
    """With a normal lease the process's lease renewal finds the token moved on and stops the work."""
    command = sql_for(db_url, "SELECT agent_sleep(30); INSERT INTO marker (job) VALUES ('hb');",
                      "INSERT INTO marker (job) VALUES ('hb'); SELECT pg_sleep(30);",
                      f"INSERT INTO marker (job) VALUES ('hb'); {tsql_delay(30)};")
    jobs = {"hb": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": command,
                   "LEASE_SECONDS": "6"}}
    agent = make_agent(db_url, jobs)
    execute(agent, "CREATE TABLE marker (job VARCHAR(64))")
    agent.tick()
    started = time.monotonic()
    zombie = threading.Thread(target=work_once, args=(agent,))
    zombie.start()
    _wait_for(agent, f"SELECT status FROM {_runs(agent)}", [("running",)])
    other = make_agent(db_url, jobs, clock=_at_clock(timedelta(hours=1)))
    other.tick()
    zombie.join(timeout=40)
    assert time.monotonic() - started < 20                       # cancelled, not run to its end
    assert query(agent, "SELECT COUNT(*) FROM marker") == [(0,)]
    assert query(agent, f"SELECT outcome FROM {_attempts(agent)}")[0][0] in ("lease_lost", "lease_expired")
    other.close()
    agent.close()
