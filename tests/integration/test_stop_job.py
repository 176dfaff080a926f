"""stop JOB (SQL Agent's sp_stop_job) on SQLite and PostgreSQL: the job's runs in flight are
cancelled, the running one stopped at its worker's next lease renewal, future slots kept."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta, timezone

from shared.cli.commands import main as cli
from tests.support.harness import execute, runs_table, sql_for, tsql_delay, work

UTC = timezone.utc


def _runs(agent, job):
    return sorted(agent.store().execute("list_history", job_name=job, limit=100).rows, key=lambda r: r["run_id"])


def test_stop_cancels_the_running_run_and_due_runs_but_not_future_slots(agent_factory, db_url, capsys):
    slow = sql_for(db_url, "SELECT agent_sleep(60)", "SELECT pg_sleep(60)", tsql_delay(60))
    agent = agent_factory({"slow": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": slow,
                                    "LEASE_SECONDS": "6", "OVERLAP": "allow"},
                           "other": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "COMMAND": "SELECT 1"}})
    agent.tick(datetime.now(UTC))
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    # A future slot of the same job (claimed ahead), which stop must leave alone.
    execute(agent, f"INSERT INTO {runs_table(agent)} (job_name, kind, scheduled_for, status, command, overlap, "
                   f"max_attempts, timeout_seconds, lease_seconds, runnable_at, created_at, operation_id) "
                   f"VALUES ('slow', 'scheduled', '{future}', 'pending', 'SELECT 1', 'allow', 1, 60, 6, '{future}', "
                   f"'{future}', 'future-op')")
    worker = threading.Thread(target=work, args=(agent,), kwargs={"concurrency": 2})
    started = time.monotonic()
    worker.start()
    deadline = time.monotonic() + 20
    while not any(r["status"] == "running" for r in _runs(agent, "slow")):
        assert time.monotonic() < deadline, _runs(agent, "slow")
        time.sleep(0.1)
    assert cli(["--db", db_url, "stop", "slow"]) == 0
    assert "1 run(s) cancelled" in capsys.readouterr().out
    worker.join(timeout=30)
    # Lease 6 s: the renewal every 2 s finds the token gone and cancels the statement.
    assert not worker.is_alive() and time.monotonic() - started < 20
    runs = _runs(agent, "slow")
    assert [r["status"] for r in runs] == ["cancelled", "pending"], runs
    assert runs[0]["note"] == "stopped by operator (stop JOB)"
    (attempt,) = agent.store().execute("list_attempts", run_ids=[runs[0]["run_id"]]).rows
    assert attempt["outcome"] == "lease_lost"
    assert [r["status"] for r in _runs(agent, "other")] == ["succeeded"]
    # Nothing in flight any more: says so, exit 0; an unknown job: exit 2 naming the known ones.
    assert cli(["--db", db_url, "stop", "slow"]) == 0
    assert "no run in flight" in capsys.readouterr().out
    assert cli(["--db", db_url, "stop", "ghost"]) != 0
    assert "no job named 'ghost'" in capsys.readouterr().err


def test_stop_cancels_a_run_waiting_for_its_retry(agent_factory, db_url):
    agent = agent_factory({"broken": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(),
                                      "COMMAND": "SELECT * FROM no_such_table", "MAX_ATTEMPTS": "3"}},
                          AGENT_RETRY_BACKOFF_SECONDS="3600")
    agent.tick(datetime.now(UTC))
    work(agent)
    (run,) = _runs(agent, "broken")
    assert run["status"] == "pending" and run["attempt"] == 1
    assert cli(["--db", db_url, "stop", "broken"]) == 0
    (run,) = _runs(agent, "broken")
    assert run["status"] == "cancelled"


def test_stop_ends_a_multi_step_run_at_its_running_step(agent_factory, db_url):
    slow = sql_for(db_url, "SELECT agent_sleep(60)", "SELECT pg_sleep(60)", tsql_delay(60))
    agent = agent_factory({"nightly": {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), "LEASE_SECONDS": "6",
                                       "STEPS__1__COMMAND": "SELECT 1", "STEPS__2__COMMAND": slow,
                                       "STEPS__3__COMMAND": "CREATE TABLE step3_ran (x INT)"}})
    agent.tick(datetime.now(UTC))
    worker = threading.Thread(target=work, args=(agent,), kwargs={"concurrency": 1})
    started = time.monotonic()
    worker.start()
    deadline = time.monotonic() + 20
    while not any(r["status"] == "running" and r["step"] == 2 for r in _runs(agent, "nightly")):
        assert time.monotonic() < deadline, _runs(agent, "nightly")
        time.sleep(0.1)
    time.sleep(0.3)
    assert cli(["--db", db_url, "stop", "nightly"]) == 0
    worker.join(timeout=30)
    assert not worker.is_alive() and time.monotonic() - started < 20
    (run,) = _runs(agent, "nightly")
    assert run["status"] == "cancelled" and run["step"] == 2
    attempts = agent.store().execute("list_attempts", run_ids=[run["run_id"]]).rows
    assert [(a["step"], a["outcome"]) for a in attempts] == [(1, "succeeded"), (2, "lease_lost")]
    store = agent.new_store()
    try:
        table = "sqlite_master" if store.dialect == "sqlite" else "information_schema.tables"
        column = "name" if store.dialect == "sqlite" else "table_name"
        cursor = store.connection.cursor()
        cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = 'step3_ran'")
        assert cursor.fetchone()[0] == 0
    finally:
        store.close()
