"""Jobs that follow jobs as a graph (issue 34, items 3 and 4).

Item 3: no path creates a cycle. Every way a definition changes — the settings, agent.add_scheduled_job,
removal and re-definition, letter case, a self-reference, a chain longer than SQL Server's default
recursion limit, two definitions at once in separate sessions, a settings sync that closes a cycle
through a job defined in the database, a sync racing a procedure — goes through one check under the
job-definitions lock that sees every job's AFTER. A procedure call that would close a cycle fails
with the cycle named; a settings job that would is recorded invalid, and the sync goes on.

Item 4: the run-time guard. Follow-up runs carry their chain of jobs: a follow-up is not started for
a job already in it (a cycle written into the table directly runs each job once, not forever), nor
beyond MAX_CHAIN_JOBS jobs; the refused follow-up is a run recorded skipped with the reason, and the
job events say it once.
"""

from __future__ import annotations

import threading
import time

import pytest

from shared.jobs.chains import MAX_CHAIN_JOBS
from tests.support.harness import MSSQL_BASE, execute, fresh_database, make_agent, query, runs_table, work
from tests.support.tsql_caller import CallError, call, connect, select

SERVERS = ["postgres"] + (["mssql"] if MSSQL_BASE else [])


@pytest.fixture(params=SERVERS)
def server_url(request):
    with fresh_database(request.param) as url:
        yield url


def refused(connection, **arguments) -> CallError:
    with pytest.raises(CallError) as caught:
        call(connection, "add_scheduled_job", sql="SELECT 1", **arguments)
    return caught.value


def after_of(connection) -> dict[str, str | None]:
    return {row["job_name"]: row["after_job"] for row in
            select(connection, "SELECT job_name, after_job FROM agent.jobs WHERE configured = 1")}


# ---------------------------------------------------------------- item 3: definitions


def test_no_procedure_call_closes_a_cycle_whatever_the_path(server_url):
    agent = make_agent(server_url, {"load": {"COMMAND": "SELECT 1"}})
    agent.tick()
    connection = connect(server_url)
    try:
        # Remove, then re-define: b follows a; a is removed; a comes back following b.
        call(connection, "add_scheduled_job", name="a", sql="SELECT 1")
        call(connection, "add_scheduled_job", name="b", sql="SELECT 1", after="a")
        call(connection, "remove_scheduled_job", name="a")
        error = refused(connection, name="a", after="b")
        assert error.code in ("22023", "51401"), error
        assert ("@after = 'b': expected a chain that ends; this one is a cycle of jobs that follow each other "
                "(a -> b -> a: a run of each would start the next, forever)") in error.message, error.message
        # A new job that follows itself, and a job redefined to follow itself.
        assert "(solo -> solo:" in refused(connection, name="solo", after="solo").message
        assert "(b -> b:" in refused(connection, name="b", after="B").message
        # Letter case: names compare case-insensitively, as Azure SQL does.
        call(connection, "add_scheduled_job", name="Upper", sql="SELECT 1")
        call(connection, "add_scheduled_job", name="lower", sql="SELECT 1", after="UPPER")
        assert "(Upper -> lower -> Upper:" in refused(connection, name="Upper", after="LOWER").message
        # Through a job of the settings: load -> rebuild -> load.
        call(connection, "add_scheduled_job", name="rebuild", sql="SELECT 1", after="load")
        assert after_of(connection)["rebuild"] == "load"
        # A chain longer than SQL Server's default recursion limit (100): the walk does not stop.
        names = [f"link{n:03d}" for n in range(130)]
        call(connection, "add_scheduled_job", name=names[0], sql="SELECT 1")
        for leader, follower in zip(names, names[1:]):
            call(connection, "add_scheduled_job", name=follower, sql="SELECT 1", after=leader)
        message = refused(connection, name=names[0], after=names[-1]).message
        assert f"({names[0]} -> {names[1]} -> " in message and f" -> {names[-1]} -> {names[0]}:" in message
        assert f"{names[4]} -> ... (121 more) -> {names[126]}" in message, message   # a long cycle, shortened
        # Nothing refused was written: b still follows a (removed), a stays removed.
        jobs = after_of(connection)
        assert "a" not in jobs and jobs["b"] == "a" and jobs["Upper"] is None and jobs[names[0]] is None
    finally:
        connection.close()


def test_two_definitions_at_once_in_separate_sessions_cannot_both_close_a_cycle(server_url):
    agent = make_agent(server_url)
    agent.tick()
    setup = connect(server_url)
    for name in ("x", "y"):
        call(setup, "add_scheduled_job", name=name, sql="SELECT 1")
    setup.close()
    for round_ in range(3):
        sessions = [connect(server_url) for _ in range(2)]
        barrier = threading.Barrier(2)
        outcomes: list = [None, None]

        def define(index: int, name: str, after: str) -> None:
            barrier.wait()
            try:
                outcomes[index] = call(sessions[index], "add_scheduled_job", name=name, sql="SELECT 1", after=after)
            except CallError as exc:
                outcomes[index] = exc

        threads = [threading.Thread(target=define, args=(0, "x", "y")),
                   threading.Thread(target=define, args=(1, "y", "x"))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for session in sessions:
            session.close()
        errors = [outcome for outcome in outcomes if isinstance(outcome, CallError)]
        assert len(errors) == 1, outcomes
        assert "a cycle of jobs that follow each other" in errors[0].message
        check = connect(server_url)
        jobs = after_of(check)
        assert (jobs["x"], jobs["y"]) in (("y", None), (None, "x")), jobs
        # Back to no links for the next round.
        for name in ("x", "y"):
            call(check, "add_scheduled_job", name=name, sql="SELECT 1")
        check.close()


def _settings_job_error(agent, name: str) -> str | None:
    rows = query(agent, f"SELECT valid, config_error FROM agent.jobs WHERE job_name = '{name}'")
    assert rows, name
    return None if rows[0][0] else rows[0][1]


def test_a_settings_sync_that_closes_a_cycle_through_a_tsql_job_makes_only_that_job_invalid(server_url):
    first = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1"}, "other": {"COMMAND": "SELECT 1"}})
    first.tick()
    connection = connect(server_url)
    try:
        call(connection, "add_scheduled_job", name="t", sql="SELECT 1", after="s1")
        # The settings add a job 't' (the database holds that name: it is refused under a stand-in
        # name) and make s1 follow 't': at run time that is the database's t, which follows s1.
        second = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1", "AFTER": "t"}, "t": {"COMMAND": "SELECT 2"},
                                         "other": {"COMMAND": "SELECT 1", "AFTER": "s1"}})
        report = second.tick()
        assert report.synced and not report.errors, report.errors
        error = _settings_job_error(second, "s1")
        assert error is not None and error.startswith("JOB__s1__AFTER='t': a cycle of jobs that follow each other "
                                                      "(s1 -> t -> s1:"), error
        assert "through t (defined with agent.add_scheduled_job @after)" in error
        assert _settings_job_error(second, "other") is None         # follows s1: fine by itself
        events = select(connection, "SELECT job_name, kind, detail FROM agent.job_events WHERE kind = 'config_invalid'")
        assert [e["detail"] for e in events if e["job_name"] == "s1"] == [error]
        # The database's job is untouched; once it is removed, the next sync takes s1 back.
        assert after_of(connection)["t"] == "s1"
        call(connection, "remove_scheduled_job", name="t")
        second.tick()
        assert _settings_job_error(second, "s1") is None
        assert after_of(connection)["s1"] == "t"                      # now the settings' own t
    finally:
        connection.close()


def test_a_tsql_redefinition_that_breaks_the_cycle_lets_the_settings_job_back(server_url):
    first = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1"}})
    first.tick()
    connection = connect(server_url)
    try:
        call(connection, "add_scheduled_job", name="t", sql="SELECT 1", after="s1")
        second = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1", "AFTER": "t"}, "t": {"COMMAND": "SELECT 2"}})
        second.tick()
        assert _settings_job_error(second, "s1") is not None
        call(connection, "add_scheduled_job", name="t", sql="SELECT 1")    # no longer follows s1
        second.tick()
        assert _settings_job_error(second, "s1") is None
    finally:
        connection.close()


def test_a_sync_racing_a_procedure_call_never_lets_both_close_a_cycle(server_url, monkeypatch):
    """The sync holds the job-definitions lock from before it reads the database's jobs to its
    commit: a procedure call meanwhile waits, then sees the settings' AFTER and is refused."""
    from shared.control.store import Store

    first = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1"}})
    first.tick()
    connection = connect(server_url)
    call(connection, "add_scheduled_job", name="t", sql="SELECT 1")
    # The sync makes s1 follow 't' (a settings job the database's t displaces: at run time, the
    # database's t) while a procedure call makes t follow s1.
    second = make_agent(server_url, {"s1": {"COMMAND": "SELECT 1", "AFTER": "t"}, "t": {"COMMAND": "SELECT 2"}})
    read = threading.Event()
    original = Store.execute

    def slow_execute(self, name, **params):
        result = original(self, name, **params)
        if name == "list_database_job_names":
            read.set()
            time.sleep(2)                    # the sync holds the lock; the procedure call waits
        return result

    monkeypatch.setattr(Store, "execute", slow_execute)
    outcome: dict = {}

    def define() -> None:
        read.wait(30)
        try:
            outcome["rows"] = call(connection, "add_scheduled_job", name="t", sql="SELECT 1", after="s1")
        except CallError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=define)
    thread.start()
    report = second.tick()
    thread.join(60)
    connection.close()
    assert report.synced and not report.errors, report.errors
    # The sync saw t follow nothing (s1 -> t is fine); the procedure then saw s1 follow t.
    assert _settings_job_error(second, "s1") is None
    assert "error" in outcome and "(t -> s1 -> t:" in outcome["error"].message, outcome


# ---------------------------------------------------------------- item 4: at run time


def _runs(agent) -> list[tuple]:
    return query(agent, f"SELECT run_id, job_name, status, followed_run_id, note FROM {runs_table(agent)} "
                        "ORDER BY run_id")


def _events(agent, kind: str) -> list[tuple]:
    table = "agent_job_events" if agent.target.dialect == "sqlite" else "agent.job_events"
    return query(agent, f"SELECT job_name, detail FROM {table} WHERE kind = '{kind}' ORDER BY event_id")


def test_a_cycle_written_into_the_table_runs_each_job_once_and_says_why_it_stopped(db_url):
    """The definition check bypassed (a row written directly, or definitions changed while runs
    were in flight): after a and b, a's follow-up is refused, recorded skipped with the reason,
    and the job events say it once, however often the chain comes back to it."""
    agent = make_agent(db_url, {"a": {"COMMAND": "SELECT 1"}, "b": {"COMMAND": "SELECT 2", "AFTER": "a"}})
    agent.tick()
    jobs = "agent_jobs" if agent.target.dialect == "sqlite" else "agent.jobs"
    execute(agent, f"UPDATE {jobs} SET after_job = 'b', after_outcome = 'succeeded' WHERE job_name = 'a'")
    for _ in range(2):
        agent.request_run_now("a")
        work(agent, max_seconds=30)
    runs = _runs(agent)
    # Each time: a, b, then a's follow-up recorded skipped; nothing more.
    assert [(job, status) for _, job, status, _, _ in runs] == [("a", "succeeded"), ("b", "succeeded"),
                                                                ("a", "skipped")] * 2, runs
    refusal = runs[2]
    assert refusal[3] == runs[1][0]                                    # after b's run
    assert refusal[4].startswith(f"chain: not started after run {runs[1][0]} of b: job a is already in this chain "
                                 "of runs (a -> b -> a)"), refusal[4]
    events = _events(agent, "follow_up_refused")
    assert len(events) == 1 and events[0][0] == "a" and "(a -> b -> a)" in events[0][1], events


def test_a_chain_longer_than_the_bound_stops_there_and_says_so(db_url):
    count = MAX_CHAIN_JOBS + 5
    jobs = {f"j{n:03d}": {"COMMAND": "SELECT 1", **({"AFTER": f"j{n - 1:03d}"} if n else {})} for n in range(count)}
    agent = make_agent(db_url, jobs)
    agent.tick()
    agent.request_run_now("j000")
    work(agent, max_seconds=120)
    runs = _runs(agent)
    succeeded = [job for _, job, status, _, _ in runs if status == "succeeded"]
    assert succeeded == [f"j{n:03d}" for n in range(MAX_CHAIN_JOBS)], succeeded[-3:]
    (last,) = [run for run in runs if run[2] == "skipped"]
    assert last[1] == f"j{MAX_CHAIN_JOBS:03d}"
    assert f"the chain of runs already holds {MAX_CHAIN_JOBS} jobs" in last[4], last[4]
    assert len(runs) == MAX_CHAIN_JOBS + 1
    assert len(_events(agent, "follow_up_refused")) == 1
