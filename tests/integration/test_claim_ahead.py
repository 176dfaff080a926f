"""Direct mode on PostgreSQL: a run's completion also claims the worker's next run, in the same
batch after its COMMIT (issue 35 item 2: two round trips a task, not three). Executor._claim_ahead
argues the semantics; these tests hold it to them: the claim is committed before the run it
claimed starts; a fenced completion (and its refusal of the job's transaction) claims nothing and
commits nothing; a claim that fails after the COMMIT leaves the run completed; a worker that
stops runs the run it claimed so; owned runs never claim on the session they used."""

from __future__ import annotations

import logging
import threading
import time

import pyodbc

from shared.control.connection_strings import with_postgres_defaults
from shared.engine.runner import LocalRunner
from tests.support.harness import execute, make_agent, query
from tests.support.round_trips import Tally, count_connections

CLAIM = "SELECT c.decision"        # the claim's statement, as postgres.sql's claim_runs begins


def submit(agent, sql: str, order: int | None = None) -> int:
    from shared.telemetry.client import new_operation_id

    return agent.store().execute("insert_task", command=sql, target_database=None, task_order=order, max_attempts=1,
                                 timeout_seconds=60, lease_seconds=60, now=agent.clock(),
                                 operation_id=new_operation_id()).one()["run_id"]


def status(agent, run_id: int) -> str:
    return agent.store().execute("get_run", run_id=run_id).one()["status"]


def test_the_next_run_is_claimed_with_the_completion_and_committed_before_it_runs(pg_url):
    agent = make_agent(pg_url)
    execute(agent, "CREATE TABLE seen (run_id BIGINT, status TEXT)")
    first = submit(agent, "SELECT 1", order=1)
    second = submit(agent, "SELECT pg_sleep(1)", order=2)    # runnable only once the first ended
    third = submit(agent, "SELECT 1", order=3)
    agent.release()
    watcher = pyodbc.connect(with_postgres_defaults(pg_url), autocommit=True)
    statuses: list[str] = []
    done = threading.Event()

    def watch() -> None:
        # Another session: what it sees of the second run is committed.
        while not done.is_set():
            statuses.append(watcher.cursor().execute("SELECT status FROM agent.runs WHERE run_id = ?",
                                                     second).fetchone()[0])
            time.sleep(0.02)

    tally = Tally()
    count_connections(agent, tally)
    thread = threading.Thread(target=watch)
    thread.start()
    try:
        assert LocalRunner(agent, concurrency=1, poll_interval=0.05).work_until_idle(max_seconds=60) == 3
    finally:
        done.set()
        thread.join()
        # One look after the work: under load the watcher's last look can predate the second
        # run's completion (the third run and the last claim take a few milliseconds).
        statuses.append(watcher.cursor().execute("SELECT status FROM agent.runs WHERE run_id = ?", second).fetchone()[0])
        watcher.close()
    assert [status(agent, run) for run in (first, second, third)] == ["succeeded"] * 3
    assert "running" in statuses and statuses[-1] == "succeeded"
    # The first run was claimed on its own, the second and third by the completion before each,
    # and the last completion's claim found nothing: one claim of its own ends the work.
    alone = [s for s in tally.statements if s.startswith(CLAIM)]
    riding = [s for s in tally.statements if "COMMIT;" in s and "agent.claim_runs(" in s]
    assert (len(alone), len(riding)) == (2, 3), tally.statements
    assert all(s.index("agent.finish_run(") < s.index("COMMIT;") < s.index("agent.claim_runs(") for s in riding)


def test_a_fenced_completion_commits_nothing_and_claims_nothing(pg_url):
    agent = make_agent(pg_url)
    execute(agent, "CREATE TABLE marks (run_id BIGINT)")
    fenced = submit(agent, "INSERT INTO marks VALUES (1); SELECT pg_sleep(1.5)")
    after = submit(agent, "INSERT INTO marks VALUES (2)")
    agent.release()
    other = pyodbc.connect(with_postgres_defaults(pg_url), autocommit=True)

    def take_over() -> None:
        # While the first run's SQL runs, its token moves on (a takeover): its completion's
        # agent.finish_run raises, the batch stops before its COMMIT and before the claim.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if other.cursor().execute("SELECT status FROM agent.runs WHERE run_id = ?", fenced).fetchone()[0] \
                    == "running":
                other.cursor().execute("UPDATE agent.runs SET token = token + 1 WHERE run_id = ?", fenced)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=take_over)
    thread.start()
    try:
        LocalRunner(agent, concurrency=1, poll_interval=0.05).work_until_idle(max_seconds=20)
    finally:
        thread.join()
        other.close()
    assert query(agent, "SELECT run_id FROM marks ORDER BY run_id") == [(2,)]     # the fenced work rolled back
    assert status(agent, after) == "succeeded"
    assert query(agent, f"SELECT COUNT(*) FROM agent.attempts WHERE run_id = {after}") == [(1,)]


def test_a_claim_that_fails_after_the_commit_leaves_the_run_completed(pg_url, monkeypatch, caplog):
    agent = make_agent(pg_url)
    runs = [submit(agent, "SELECT 1") for _ in range(3)]
    agent.release()
    runner = LocalRunner(agent, concurrency=1, poll_interval=0.05)
    original = runner.executor._claim_ahead

    def failing(store, owner):
        ahead = original(store, owner)
        if ahead is not None:
            ahead[0]["batch"] = -1          # LIMIT -1: the claim raises, after the COMMIT
        return ahead

    monkeypatch.setattr(runner.executor, "_claim_ahead", failing)
    with caplog.at_level(logging.WARNING, logger="shared.engine.endings"):
        assert runner.work_until_idle(max_seconds=30) == 3
    assert [status(agent, run) for run in runs] == ["succeeded"] * 3
    assert sum("claiming the next run in the same batch failed" in r.getMessage() for r in caplog.records) == 3


def test_a_worker_that_stops_runs_the_run_it_claimed_with_the_completion(pg_url):
    agent = make_agent(pg_url)
    runs = [submit(agent, "SELECT pg_sleep(0.6)") for _ in range(3)]
    agent.release()
    # The deadline passes while the first run runs: its completion claimed the second, which
    # the worker runs before it ends; the third is never claimed.
    assert LocalRunner(agent, concurrency=1, poll_interval=0.05).work_until_idle(max_seconds=0.3) == 2
    assert [status(agent, run) for run in runs] == ["succeeded", "succeeded", "pending"]


def test_sqlite_never_claims_with_the_completion(tmp_path):
    agent = make_agent(f"sqlite:///{tmp_path / 'agent.db'}")
    runs = [submit(agent, "SELECT 1") for _ in range(2)]
    agent.release()
    tally = Tally()
    count_connections(agent, tally)
    assert LocalRunner(agent, concurrency=1, poll_interval=0.05).work_until_idle(max_seconds=30) == 2
    assert [status(agent, run) for run in runs] == ["succeeded"] * 2
    assert not any("COMMIT" in s and "claim" in s.lower() for s in tally.statements)
