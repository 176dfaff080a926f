"""`work --until-idle` (and the tests' `work`) ends only when the database says nothing is
runnable now (issue 34, item 12), on every dialect.

* One clock: the agent's reading of the database's clock lags it (by a round trip: 8 ms on
  Babelfish, a few on a loaded machine). A run made at the database's now by someone else
  (agent.start_job, agent.exec_async, another process's run-now or submit) was not runnable yet
  by the worker's reading, so its claim found nothing and `work` ended with the run pending. The
  claim now asks the database's own clock.
* A failed look is no "nothing to do": a claim that failed ended the worker as if idle. A
  transient failure is now tried again, anything else raised.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from shared.control.clock import as_utc
from shared.engine.operations import submit
from tests.support.harness import execute, make_agent, pg_admin_connection, query, runs_table, sql_for, work

LAG_SECONDS = 0.5


def _status(agent, run_id: int) -> str:
    return agent.store().execute("get_run", run_id=run_id).one()["status"]


def _lagging(agent, seconds: float) -> None:
    """The agent's clock reads the database's ``seconds`` late, as it would after a reading whose
    answer took that long to come back (the clock marks a reading at the end of its round trip)."""
    server_now = as_utc(agent.store().execute("database_time").scalar())
    agent.database_clock.observe(server_now - timedelta(seconds=seconds), time.monotonic())
    agent.release()
    assert (server_now - agent.clock()).total_seconds() > seconds - 0.2


def test_a_run_made_at_the_databases_now_is_worked_although_the_workers_clock_lags(db_url):
    worker = make_agent(db_url)
    operator = make_agent(db_url)     # another process: its clock is read afresh
    _lagging(worker, LAG_SECONDS)
    task = submit(operator, "SELECT 1", order=None, max_attempts=1, timeout_seconds=60)
    assert work(worker, concurrency=1) == 1
    assert _status(worker, task.run_id) == "succeeded"
    # ... and the decision stays the database's: a run whose time has not come is not started.
    later = submit(operator, "SELECT 2", order=None, max_attempts=1, timeout_seconds=60)
    execute(operator, f"UPDATE {runs_table(operator)} SET runnable_at = "
                      + sql_for(db_url, "strftime('%Y-%m-%d %H:%M:%f', 'now', '+1 hour')",
                                "CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp) + INTERVAL '1 hour'",
                                "DATEADD(hour, 1, SYSUTCDATETIME())")
                      + f" WHERE run_id = {int(later.run_id)}")
    assert work(worker, concurrency=2) == 0
    assert _status(worker, later.run_id) == "pending"


def test_a_run_queued_from_tsql_is_worked_by_the_next_work(pg_url):
    """test_job_owner's set_role, reduced: agent.exec_async stamps the run with the server's time,
    and `work` right after it must run it (it left it pending under load, the worker's clock a
    millisecond behind; here half a second, every time)."""
    from tests.support.tsql_caller import call
    import pyodbc

    agent = make_agent(pg_url)
    _lagging(agent, LAG_SECONDS)
    connection = pyodbc.connect(pg_url, autocommit=True, timeout=10)
    try:
        (task,) = call(connection, "exec_async", sql="SELECT 1", execution_order=None)
    finally:
        connection.close()
    assert work(agent, concurrency=1) == 1
    assert _status(agent, task["run_id"]) == "succeeded"


def test_a_claim_that_fails_is_an_error_not_nothing_to_do(db_url):
    agent = make_agent(db_url)
    task = submit(agent, "SELECT 1", order=None, max_attempts=1, timeout_seconds=60)
    # Every claim fails (the server refuses to start a run): a permanent error.
    execute(agent, sql_for(
        db_url,
        "CREATE TRIGGER no_claims BEFORE UPDATE OF status ON agent_runs WHEN NEW.status = 'running' "
        "BEGIN SELECT RAISE(ABORT, 'no claims today'); END",
        "CREATE FUNCTION public.no_claims() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.status = 'running' THEN RAISE EXCEPTION 'no claims today'; END IF; RETURN NEW; END $$; "
        "CREATE TRIGGER no_claims BEFORE UPDATE ON agent.runs FOR EACH ROW EXECUTE FUNCTION public.no_claims()",
        "CREATE TRIGGER agent.no_claims ON agent.runs AFTER UPDATE AS "
        "IF EXISTS (SELECT 1 FROM inserted WHERE status = N'running') THROW 50000, N'no claims today', 1;"))
    with pytest.raises(Exception, match="no claims today"):
        work(agent, concurrency=2, max_seconds=30)
    assert _status(agent, task.run_id) == "pending"
    execute(agent, sql_for(db_url, "DROP TRIGGER no_claims", "DROP TRIGGER no_claims ON agent.runs",
                           "DROP TRIGGER agent.no_claims"))
    assert work(agent, concurrency=2) == 1
    assert _status(agent, task.run_id) == "succeeded"


def test_a_claim_on_a_connection_the_server_ended_is_tried_again(pg_url):
    """The server ends the worker's idle pooled connection (a restart, a failover, an
    administrator): the next claim fails on it, transiently; `work` claims again on a new one
    instead of ending with the run pending."""
    agent = make_agent(pg_url)
    assert work(agent, concurrency=1) == 0           # the worker's connection, idle in the pool now
    task = submit(agent, "SELECT 1", order=None, max_attempts=1, timeout_seconds=60)
    agent.release()
    database = pg_url.split("Database=")[1].rstrip(";")
    admin = pg_admin_connection()
    try:
        ended = admin.cursor().execute(
            "SELECT COUNT(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = ? AND pid <> pg_backend_pid()",
            database).fetchone()[0]
    finally:
        admin.close()
    assert ended >= 1
    assert work(agent, concurrency=1) == 1
    assert _status(agent, task.run_id) == "succeeded"
    assert query(agent, f"SELECT COUNT(*) FROM {runs_table(agent)} WHERE status = 'pending'") == [(0,)]
