"""Fleet jobs (issue 16) on real databases: a step runs in every database its TARGETS name,
resolved again at every run, one execution per database (its own token, lease, attempts),
TARGET_PARALLELISM at a time, the last execution moving the run on at once.

PostgreSQL always (databases created and dropped by each test); SQL Server too when
AGENT_TEST_MSSQL is set (the conformance run). SQLite refuses targets at sync.
"""

from __future__ import annotations

import threading
import time
import uuid
from datetime import datetime, timezone

import pytest

from shared.control.db import connector
from shared.jobs.from_settings import parse_jobs
from shared.messaging.memory import MemoryQueue
from tests.support.appinsights_endpoint import appinsights_endpoint  # noqa: F401 (fixture)
from tests.support.harness import (
    MSSQL_BASE,
    babelfish_end_sessions,
    execute,
    fresh_database,
    make_agent,
    mssql_connection,
    mssql_server_is_babelfish,
    pg_admin_connection,
    query,
    tsql_delay,
    work,
)

UTC = timezone.utc
SERVER_DIALECTS = ["postgres"] + (["mssql"] if MSSQL_BASE else [])


class Fleet:
    """Target databases on the test server, created and dropped by the test."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.prefix = "fl" + uuid.uuid4().hex[:8]
        self.created: list[str] = []

    def _admin(self):
        return pg_admin_connection() if self.dialect == "postgres" else mssql_connection("master")

    def _run(self, *statements: str) -> None:
        admin = self._admin()
        try:
            for statement in statements:
                admin.cursor().execute(statement)
        finally:
            admin.close()

    def name(self, suffix: str) -> str:
        return f"{self.prefix}_{suffix}"

    def create(self, *suffixes: str) -> list[str]:
        names = [self.name(s) for s in suffixes]
        quote = (lambda n: n) if self.dialect == "postgres" else (lambda n: f"[{n}]")
        self._run(*[f"CREATE DATABASE {quote(n)}" for n in names])
        self.created += names
        return names

    def refuse_connections(self, suffix: str) -> None:
        name = self.name(suffix)
        if self.dialect == "postgres":
            self._run(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        elif mssql_server_is_babelfish():
            # Babelfish has no ALTER DATABASE (no OFFLINE) and its sysadmin reaches every
            # database: the target instead refuses the job's write (mark_sql), with an error
            # that names the database, as a refused connection does.
            constraint = f"refused_{name}"
            admin = mssql_connection(name)
            try:
                admin.cursor().execute(f"CREATE TABLE dbo.fleet_marks (id INT IDENTITY PRIMARY KEY, run_id INT, "
                                       f"CONSTRAINT [{constraint}] CHECK (run_id < 0))")
            finally:
                admin.close()
        else:
            self._run(f"ALTER DATABASE [{name}] SET OFFLINE WITH ROLLBACK IMMEDIATE")

    def drop(self, *suffixes: str) -> None:
        for name in [self.name(s) for s in suffixes] if suffixes else list(self.created):
            if self.dialect == "postgres":
                self._run(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            elif mssql_server_is_babelfish():
                self._babelfish_drop(name)
            else:
                self._run(f"IF DB_ID(N'{name}') IS NOT NULL ALTER DATABASE [{name}] SET ONLINE",
                          f"IF DB_ID(N'{name}') IS NOT NULL ALTER DATABASE [{name}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE",
                          f"IF DB_ID(N'{name}') IS NOT NULL DROP DATABASE [{name}]")
            if name in self.created:
                self.created.remove(name)

    def _babelfish_drop(self, name: str) -> None:
        """DROP DATABASE after ending its sessions. A session whose client was killed mid-job
        (kill -9 of a worker) is still in the database until its statement ends (at most the
        tests' 60 s sleep): the drop is tried again until then, at most 75 s."""
        import pyodbc

        admin = self._admin()
        deadline = time.monotonic() + 75
        try:
            while True:
                babelfish_end_sessions(admin.cursor(), name)
                try:
                    admin.cursor().execute(f"IF DB_ID(N'{name}') IS NOT NULL DROP DATABASE [{name}]")
                    return
                except pyodbc.Error:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(1)
        finally:
            admin.close()

    def marks(self, agent, name: str) -> list[int]:
        """What the job left in one target database: the run ids it ran for, in order."""
        connection = _peek(agent.target, name)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT run_id FROM fleet_marks ORDER BY id")
            return [row[0] for row in cursor.fetchall()]
        finally:
            connection.close()


@pytest.fixture(params=SERVER_DIALECTS)
def fleet(request):
    fleet = Fleet(request.param)
    try:
        yield fleet
    finally:
        fleet.drop()


@pytest.fixture
def control(fleet, tmp_path):
    with fresh_database(fleet.dialect, tmp_path) as url:
        yield url



def _peek(target, database: str):
    """A connection to a target database for the test's own look at its tables: the agent's
    sessions resolve names in pg_catalog only (docs/tsql.md, "The owner boundary"), the tests'
    tables are in public."""
    connection = connector(target, database)()
    if target.dialect == "postgres":
        connection.cursor().execute('SET search_path = "$user", public')
    return connection


def mark_sql(dialect: str, extra: str = "") -> str:
    """The step's SQL in a target database: remember which run it ran for (the run id comes
    from the execution's note, which names its run)."""
    if dialect == "postgres":
        return (f"{extra}CREATE TABLE IF NOT EXISTS fleet_marks (id SERIAL PRIMARY KEY, run_id INT); "
                "INSERT INTO fleet_marks (run_id) SELECT COALESCE(MAX(run_id), 0) + 1 FROM fleet_marks")
    return (f"{extra}IF OBJECT_ID(N'dbo.fleet_marks') IS NULL CREATE TABLE dbo.fleet_marks (id INT IDENTITY "
            "PRIMARY KEY, run_id INT); INSERT INTO dbo.fleet_marks (run_id) SELECT COALESCE(MAX(run_id), 0) + 1 "
            "FROM dbo.fleet_marks")


def once(**settings: str) -> dict[str, str]:
    return {"SCHEDULE": "@once " + datetime.now(UTC).isoformat(), **settings}


def executions(agent, run_id: int) -> dict[str, dict]:
    rows = query(agent, "SELECT target_database, status, attempt, last_error, run_id FROM agent.runs "
                        f"WHERE parent_run_id = {int(run_id)} ORDER BY run_id")
    return {row[0]: {"status": row[1], "attempt": row[2], "last_error": row[3], "run_id": row[4]} for row in rows}


def job_runs(agent, job: str) -> list[dict]:
    return list(reversed(agent.store().execute("list_history", job_name=job, limit=20).rows))


def run_now(agent, job: str) -> int:
    return agent.request_run_now(job)["run_id"]


# ---------------------------------------------------------------- the exact set, once per run


def test_each_run_runs_in_exactly_the_databases_its_targets_name_now_once_each(fleet, control):
    """22 databases: 20 match the glob, one of them is excluded, one refuses connections, two
    do not match; between the runs one is dropped and one created."""
    matching = fleet.create(*[f"a{i:02d}" for i in range(20)])
    fleet.create("b0", "b1")
    fleet.refuse_connections("a07")
    targets = f"db:{fleet.prefix}_a*, -db:{fleet.name('a03')}"
    agent = make_agent(control, {"fleet": {
        "SCHEDULE": "0 0 3 * * *", "TARGETS": targets, "COMMAND": mark_sql(fleet.dialect),
        "TARGET_PARALLELISM": "4", "MAX_ATTEMPTS": "1"}}, AGENT_CONNECT_RETRY_SECONDS="1", AGENT_MAX_CONCURRENCY="8")
    agent.tick(datetime.now(UTC))
    first = run_now(agent, "fleet")
    work(agent, concurrency=6, max_seconds=120)

    expected = set(matching) - {fleet.name("a03")}
    done = executions(agent, first)
    assert set(done) == expected                        # the exact set: glob, minus the exclusion
    assert done[fleet.name("a07")]["status"] == "failed"
    assert "a07" in done[fleet.name("a07")]["last_error"]
    assert {d for d, e in done.items() if e["status"] == "succeeded"} == expected - {fleet.name("a07")}
    for name in expected - {fleet.name("a07")}:
        assert fleet.marks(agent, name) == [1]          # once each
    run = agent.store().execute("get_run", run_id=first).one()
    assert run["status"] == "failed" and run["targets_total"] == 19 and run["targets_failed"] == 1
    assert run["last_error"].startswith("step 1: 1 of 19 target(s) failed: ") and fleet.name("a07") in run["last_error"]

    # Between two runs: a database dropped, one created (matching the glob): resolved again.
    fleet.drop("a05")
    fleet.create("a20")
    second = run_now(agent, "fleet")
    work(agent, concurrency=6, max_seconds=120)
    done = executions(agent, second)
    assert set(done) == (expected - {fleet.name("a05")}) | {fleet.name("a20")}
    assert fleet.marks(agent, fleet.name("a20")) == [1]
    for name in expected - {fleet.name("a07"), fleet.name("a05")}:
        assert fleet.marks(agent, name) == [1, 2]       # once per run
    assert agent.store().execute("get_run", run_id=second).one()["targets_total"] == 19


# ---------------------------------------------------------------- parallelism


def test_parallelism_is_never_exceeded_and_is_used(fleet, control):
    names = fleet.create(*[f"p{i:02d}" for i in range(9)])
    if fleet.dialect == "postgres":
        slow = ("CREATE TABLE IF NOT EXISTS spans (started TIMESTAMPTZ, ended TIMESTAMPTZ); "
                "INSERT INTO spans VALUES (clock_timestamp(), NULL); SELECT pg_sleep(0.4); "
                "UPDATE spans SET ended = clock_timestamp()")
        read = "SELECT started, ended FROM spans"
    else:
        slow = ("IF OBJECT_ID(N'dbo.spans') IS NULL CREATE TABLE dbo.spans (started DATETIME2, ended DATETIME2); "
                f"DECLARE @s DATETIME2 = SYSUTCDATETIME(); {tsql_delay(0.4)}; "
                "INSERT INTO dbo.spans VALUES (@s, SYSUTCDATETIME())")
        read = "SELECT started, ended FROM dbo.spans"
    agent = make_agent(control, {"wide": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_p*",
                                          "COMMAND": slow, "TARGET_PARALLELISM": "3"}},
                       AGENT_MAX_CONCURRENCY="10")
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "wide")

    # Watch the database too: never more than 3 executions of the run started and unfinished.
    seen: list[int] = []
    stop = threading.Event()

    def watch():
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            seen.append(len(query(agent, "SELECT run_id FROM agent.runs WHERE parent_run_id = "
                                         f"{run_id} AND status IN ('queued', 'running')")))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        work(agent, concurrency=8, max_seconds=120)
    finally:
        stop.set()
        watcher.join(10)
    spans = []
    for name in names:
        connection = _peek(agent.target, name)
        try:
            cursor = connection.cursor()
            cursor.execute(read)
            spans += [(row[0], row[1]) for row in cursor.fetchall()]
        finally:
            connection.close()
    assert len(spans) == 9
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    at_once = peak = 0
    for _, change in points:
        at_once += change
        peak = max(peak, at_once)
    assert peak == 3, spans          # never more than TARGET_PARALLELISM, and the window is used
    assert max(seen) <= 3
    assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"


def test_target_stagger_spaces_the_executions_starts_in_target_order_through_the_window(fleet, control):
    """TARGET_STAGGER_SECONDS=1 with TARGET_PARALLELISM=2 over 5 databases: execution n is runnable
    from the fan-out + (n - 1) s, exactly, and starts no earlier, also those the window lets in
    later (which would otherwise start as soon as a place frees)."""
    fleet.create(*[f"g{i}" for i in range(5)])
    agent = make_agent(control, {"spread": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_g*",
                                            "COMMAND": "SELECT 1", "TARGET_PARALLELISM": "2",
                                            "TARGET_STAGGER_SECONDS": "1"}}, AGENT_MAX_CONCURRENCY="6")
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "spread")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        work(agent, concurrency=4, max_seconds=30)
        if agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded":
            break
        time.sleep(0.2)
    assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
    rows = query(agent, "SELECT runnable_at, started_at, created_at FROM agent.runs "
                        f"WHERE parent_run_id = {int(run_id)} ORDER BY run_id")
    assert len(rows) == 5
    fanned_out = rows[0][2]
    for n, (runnable_at, started_at, _) in enumerate(rows):
        assert (runnable_at - fanned_out).total_seconds() == n, rows    # the plan, exactly
        assert started_at >= runnable_at, rows                           # kept, through the window


def test_target_stagger_is_validated_and_shown_on_the_step():
    valid, invalid = parse_jobs({"JOB__a__SCHEDULE": "0 0 1 * * *", "JOB__a__COMMAND": "SELECT 1",
                                 "JOB__a__TARGETS": "db:x*", "JOB__a__TARGET_STAGGER_SECONDS": "30",
                                 "JOB__b__SCHEDULE": "0 0 1 * * *", "JOB__b__COMMAND": "SELECT 1",
                                 "JOB__b__TARGETS": "db:x*", "JOB__b__TARGET_STAGGER_SECONDS": "3601",
                                 "JOB__c__SCHEDULE": "0 0 1 * * *", "JOB__c__STEPS__1__COMMAND": "SELECT 1",
                                 "JOB__c__STEPS__1__TARGETS": "db:x*", "JOB__c__TARGET_STAGGER_SECONDS": "5",
                                 "JOB__c__STEPS__2__COMMAND": "SELECT 2", "JOB__c__STEPS__2__TARGETS": "db:y*",
                                 "JOB__c__STEPS__2__TARGET_STAGGER_SECONDS": "0"})
    jobs = {job.name: job for job in valid}
    assert jobs["a"].steps[0].target_stagger_seconds == 30
    assert [step.target_stagger_seconds for step in jobs["c"].steps] == [5, 0]   # the job's is the steps' default
    (bad,) = invalid
    assert bad.name == "b" and "JOB__b__TARGET_STAGGER_SECONDS='3601': expected a whole number from 0 to 3600" in bad.errors[0]
    # 0 is left out of the steps' JSON: a job that does not stagger keeps its definition hash.
    assert "target_stagger_seconds" not in jobs["c"].steps[1].to_json()


# ---------------------------------------------------------------- statements per run


def test_the_fan_out_costs_the_same_statements_for_3_or_12_targets(fleet, control):
    fleet.create(*[f"s{i:02d}" for i in range(12)])
    costs = []
    for count in (3, 12):
        members = ", ".join(f"db:{fleet.name(f's{i:02d}')}" for i in range(count))
        agent = make_agent(control, {f"fan{count}": {"SCHEDULE": "0 0 3 * * *", "TARGETS": members,
                                                      "COMMAND": "SELECT 1"}})
        agent.tick(datetime.now(UTC))
        run_id = run_now(agent, f"fan{count}")
        store = agent.store()
        before = store.statements_executed
        results = agent.executor().work_once(batch=1)      # claims the run and fans it out
        assert [r.outcome for r in results] == ["fanned_out"], results
        costs.append(store.statements_executed - before)
        assert len(executions(agent, run_id)) == count
        work(agent, concurrency=4, max_seconds=60)
        assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
    assert costs[0] == costs[1], costs


# ---------------------------------------------------------------- queue mode, steps, hand-on


def test_queue_mode_hands_each_finished_execution_on_and_the_next_step_starts_when_the_last_ends(fleet, control):
    """No tick after the first: each execution's end dispatches the next one let in, and the
    last one's end dispatches the run's next step (in the control database)."""
    fleet.create("q0", "q1", "q2", "q3", "q4")
    queue = MemoryQueue()
    agent = make_agent(control, {"flow": {
        "SCHEDULE": "0 0 3 * * *",
        "STEPS__1__COMMAND": mark_sql(fleet.dialect), "STEPS__1__TARGETS": f"db:{fleet.prefix}_q*",
        "STEPS__1__TARGET_PARALLELISM": "2",
        "STEPS__2__COMMAND": "INSERT INTO after_fleet VALUES (1)"}}, queue=queue)
    execute(agent, "CREATE TABLE after_fleet (x INT)")
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "flow")
    agent.tick(datetime.now(UTC))      # dispatches the run; from here on only hand-ons
    work(agent, concurrency=4, max_seconds=60)
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "succeeded", run
    assert query(agent, "SELECT COUNT(*) FROM after_fleet") == [(1,)]
    assert {e["status"] for e in executions(agent, run_id).values()} == {"succeeded"}
    steps = [(a["step"], a["outcome"]) for a in agent.store().execute("list_attempts", run_ids=[run_id]).rows]
    assert steps == [(1, "succeeded"), (2, "succeeded")], steps


def test_a_failed_target_follows_the_steps_on_failure(fleet, control):
    fleet.create("f0", "f1")
    agent = make_agent(control, {"flow": {
        "SCHEDULE": "0 0 3 * * *",
        "STEPS__1__COMMAND": "SELECT * FROM no_such_table", "STEPS__1__TARGETS": f"db:{fleet.prefix}_f*",
        "STEPS__1__MAX_ATTEMPTS": "2", "STEPS__1__RETRY_INTERVAL_SECONDS": "0",
        "STEPS__1__ON_FAILURE": "goto:3",
        "STEPS__2__COMMAND": "INSERT INTO report VALUES ('two')",
        "STEPS__3__COMMAND": "INSERT INTO report VALUES ('three')", "STEPS__3__ON_SUCCESS": "quit_failure"}})
    execute(agent, "CREATE TABLE report (label VARCHAR(10))")
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "flow")
    work(agent, concurrency=4, max_seconds=60)
    (run,) = agent.store().execute("list_history", job_name="flow", limit=5).rows
    assert run["status"] == "failed" and run["failed_step"] == 1
    assert query(agent, "SELECT label FROM report") == [("three",)]
    done = executions(agent, run_id)
    assert {e["status"] for e in done.values()} == {"failed"}
    assert {e["attempt"] for e in done.values()} == {2}      # the step's MAX_ATTEMPTS, per target
    notes = agent.store().execute("list_attempts", run_ids=[run_id]).rows
    assert notes[0]["error_message"].startswith("step 1: 2 of 2 target(s) failed")


# ---------------------------------------------------------------- a worker killed mid-execution


def test_a_killed_workers_execution_is_taken_back_and_finished(fleet, control):
    from tests.support.faults import clean_env, kill9, start_cli, wait_until

    fleet.create("k0", "k1", "k2")
    slow_one = fleet.name("k1")
    if fleet.dialect == "postgres":
        slow = ("SELECT pg_sleep(CASE WHEN EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'slow_flag') "
                "THEN 60 ELSE 0 END); ")
    else:
        slow = f"IF OBJECT_ID(N'dbo.slow_flag') IS NOT NULL {tsql_delay(60)}; "
    flag = _peek(make_agent(control).target, slow_one)
    flag.cursor().execute("CREATE TABLE slow_flag (x INT)")
    flag.commit()
    agent = make_agent(control, {"crash": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_k*",
                                           "COMMAND": mark_sql(fleet.dialect, extra=slow), "LEASE_SECONDS": "6"}})
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "crash")
    worker = start_cli(control, "work", "--until-idle", env=clean_env())
    try:
        wait_until(lambda: executions(agent, run_id).get(slow_one, {}).get("status") == "running"
                   and all(e["status"] == "succeeded" for d, e in executions(agent, run_id).items() if d != slow_one),
                   60, "the slow execution runs and the others are done")
        time.sleep(0.5)
        kill9(worker)
    finally:
        kill9(worker)
    execution = executions(agent, run_id)[slow_one]
    assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "running"   # still waiting
    wait_until(lambda: agent.store().execute("get_run", run_id=execution["run_id"]).one()["lease_expires_at"]
               < datetime.now(UTC), 20, "the execution's lease lapses")
    agent.tick(datetime.now(UTC))
    assert agent.store().execute("get_run", run_id=execution["run_id"]).one()["status"] == "pending"
    flag.cursor().execute("DROP TABLE slow_flag")      # the next attempt is quick
    flag.commit()
    flag.close()
    work(agent, concurrency=2, max_seconds=120)
    done = executions(agent, run_id)
    assert done[slow_one]["status"] == "succeeded" and done[slow_one]["attempt"] == 2
    assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
    assert fleet.marks(agent, fleet.name("k0")) == [1] and fleet.marks(agent, slow_one) == [1]


# ---------------------------------------------------------------- cancel and stop


def _cancel_by(way: str, control: str, run_id: int, job: str) -> None:
    """Cancel a run, or stop its job, as an operator would: the CLI, or the T-SQL interface on
    a connection of the operator's own."""
    from shared.cli.commands import main
    from tests.support import tsql_caller

    if way in ("cancel", "stop"):
        assert main(["--db", control, way, str(run_id) if way == "cancel" else job]) == 0
        return
    connection = tsql_caller.connect(control)
    try:
        if way == "agent.cancel_run":
            assert tsql_caller.call(connection, "cancel_run", run_id=run_id) == [{"cancelled_run_id": run_id}]
        else:
            assert run_id in {r["cancelled_run_id"] for r in tsql_caller.call(connection, "stop_job", job_name=job)}
    finally:
        connection.close()


@pytest.mark.parametrize("way", ["cancel", "stop", "agent.cancel_run", "agent.stop_job"])
def test_cancelling_the_run_cancels_its_executions_at_once(fleet, control, way, capsys):
    """Whichever way an operator ends a run waiting for its targets, its executions end with it
    in the same transaction, not at the next tick (no tick runs here)."""
    fleet.create("c0", "c1", "c2", "c3")
    agent = make_agent(control, {"halt": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_c*",
                                          "COMMAND": "SELECT 1", "TARGET_PARALLELISM": "2"}})
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "halt")
    assert [r.outcome for r in agent.executor().work_once(batch=1)] == ["fanned_out"]
    # One execution running (claimed by a worker), one let in, two waiting for the window.
    (started,) = agent.store().execute("claim_runs", now=agent.clock(), late_cutoff=agent.clock(), batch=1,
                                       max_concurrency=10, worker="w1").rows
    assert started["parent_run_id"] == run_id
    assert sorted(e["status"] for e in executions(agent, run_id).values()) == ["pending", "running", "waiting",
                                                                               "waiting"]
    _cancel_by(way, control, run_id, "halt")
    assert {e["status"] for e in executions(agent, run_id).values()} == {"cancelled"}
    assert agent.executor().work_once(batch=4) == []
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "cancelled" and run["awaiting_targets"] == 0
    # The running execution's worker is fenced: its token moved on.
    (token,) = query(agent, f"SELECT token FROM agent.runs WHERE run_id = {int(started['run_id'])}")[0]
    assert token != started["token"]


@pytest.mark.parametrize("way", ["cancel", "agent.cancel_run"])
def test_an_execution_not_yet_let_in_can_be_cancelled_on_its_own(fleet, control, way, capsys):
    """A waiting execution is a run not yet finished like any other: cancelled, it counts as a
    failed target and the fleet goes on without it."""
    fleet.create("w0", "w1", "w2")
    agent = make_agent(control, {"one": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_w*",
                                         "COMMAND": "SELECT 1", "TARGET_PARALLELISM": "1"}})
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "one")
    assert [r.outcome for r in agent.executor().work_once(batch=1)] == ["fanned_out"]
    waiting = executions(agent, run_id)[fleet.name("w2")]
    assert waiting["status"] == "waiting"
    _cancel_by(way, control, waiting["run_id"], "one")
    assert executions(agent, run_id)[fleet.name("w2")]["status"] == "cancelled"
    work(agent, concurrency=1, max_seconds=60)
    assert {n: e["status"] for n, e in executions(agent, run_id).items()} == {
        fleet.name("w0"): "succeeded", fleet.name("w1"): "succeeded", fleet.name("w2"): "cancelled"}
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "failed" and f"1 of 3 target(s) failed: {fleet.name('w2')} (cancelled)" in run["last_error"]


def test_cancel_of_a_let_in_execution_refills_the_window_and_the_last_moves_the_run_at_once(fleet, control, capsys):
    """`cancel` of an execution holding a place in the window lets the next waiting one in; the
    cancel of the last one moves the run on in the same command (no tick runs here)."""
    from shared.cli.commands import main

    fleet.create("p0", "p1")
    agent = make_agent(control, {"pair": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_p*",
                                          "COMMAND": "SELECT 1", "TARGET_PARALLELISM": "1"}})
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "pair")
    assert [r.outcome for r in agent.executor().work_once(batch=1)] == ["fanned_out"]
    first, second = (executions(agent, run_id)[fleet.name(s)] for s in ("p0", "p1"))
    assert (first["status"], second["status"]) == ("pending", "waiting")
    assert main(["--db", control, "cancel", str(first["run_id"])]) == 0
    assert executions(agent, run_id)[fleet.name("p1")]["status"] == "pending"
    assert main(["--db", control, "cancel", str(second["run_id"])]) == 0
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "failed" and run["awaiting_targets"] == 0
    assert run["last_error"].startswith("step 1: 2 of 2 target(s) failed: ")


# ---------------------------------------------------------------- defined from T-SQL


def _define(control: str, **arguments) -> list[dict]:
    from tests.support import tsql_caller

    connection = tsql_caller.connect(control)
    try:
        return tsql_caller.call(connection, "add_scheduled_job", **arguments)
    finally:
        connection.close()


def _job(agent, name: str) -> dict:
    return {row["job_name"]: row for row in agent.store().execute("list_jobs").rows}[name]


def test_a_fleet_job_defined_from_tsql_is_the_job_its_settings_would_be_and_runs_in_its_targets(fleet, control):
    """agent.add_scheduled_job @targets, @target_parallelism: planned by the engine into the same
    fleet step as JOB__<name>__TARGETS; started by agent.start_job, it runs once in each database."""
    from tests.support import tsql_caller

    fleet.create("t0", "t1", "t2", "u0")
    targets = f"db:{fleet.prefix}_t*, -db:{fleet.prefix}_t2"
    command = mark_sql(fleet.dialect)
    agent = make_agent(control, {"from_settings": {"SCHEDULE": "0 0 3 * * *", "TARGETS": targets,
                                                   "TARGET_PARALLELISM": "2", "COMMAND": command}})
    assert _define(control, name="from_tsql", sql=command, schedule="0 0 3 * * *", targets=targets,
                   target_parallelism=2) == [{"job_name": "from_tsql", "action": "defined"}]
    agent.tick(datetime.now(UTC))
    steps = dict(query(agent, "SELECT job_name, steps FROM agent.jobs"))
    assert steps["from_tsql"] is not None and steps["from_tsql"] == steps["from_settings"]
    assert _job(agent, "from_tsql")["valid"] == 1
    connection = tsql_caller.connect(control)
    try:
        (started,) = tsql_caller.call(connection, "start_job", job_name="from_tsql")
    finally:
        connection.close()
    work(agent, concurrency=2, max_seconds=60)
    run = agent.store().execute("get_run", run_id=started["run_id"]).one()
    assert run["status"] == "succeeded", run
    assert sorted(executions(agent, started["run_id"])) == [fleet.name("t0"), fleet.name("t1")]
    assert [fleet.marks(agent, fleet.name(s)) for s in ("t0", "t1")] == [[1], [1]]
    # Redefined without @targets: a job of one database again.
    _define(control, name="from_tsql", sql="SELECT 1", schedule="0 0 3 * * *")
    agent.tick(datetime.now(UTC))
    assert dict(query(agent, "SELECT job_name, steps FROM agent.jobs"))["from_tsql"] is None


def test_tsql_targets_the_engine_refuses_make_that_job_alone_invalid_in_words_naming_the_parameter(fleet, control):
    agent = make_agent(control)
    _define(control, name="bad_member", sql="SELECT 1", schedule="0 0 3 * * *", targets="tenant_1")
    _define(control, name="a_pool", sql="SELECT 1", schedule="0 0 3 * * *", targets="pool:srv/pool1")
    _define(control, name="good", sql="SELECT 1", schedule="0 0 3 * * *", targets=f"db:{fleet.prefix}_*")
    agent.tick(datetime.now(UTC))
    bad = _job(agent, "bad_member")
    assert bad["valid"] == 0 and bad["config_error"].startswith("agent.add_scheduled_job @targets='tenant_1': expected")
    assert "has no known kind" in bad["config_error"]
    pool = _job(agent, "a_pool")
    if fleet.dialect == "postgres":
        assert pool["valid"] == 0 and "elastic pools exist only on Azure SQL Database" in pool["config_error"]
    else:
        assert pool["valid"] == 1
    good = _job(agent, "good")
    assert good["valid"] == 1 and good["next_due_at"] is not None


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("value, expected", [
    ("db:", "db:<name>"),
    ("tenant_1", "has no known kind"),
    ("db:a,,db:b", "empty member"),
    ("-db:tenant_test", "at least one member that is not an exclusion"),
    ("pool:onlypool", "the pool's server is required"),
    ("server:bad/name", "server:<server>"),
    ("db:ten[ant", "closed"),
    ("db:x;drop", "db:<name>"),
])
def test_a_bad_member_is_named_and_only_its_job_is_invalid(value, expected):
    jobs, invalid = parse_jobs({
        "JOB__bad__SCHEDULE": "0 0 3 * * *", "JOB__bad__COMMAND": "SELECT 1", "JOB__bad__TARGETS": value,
        "JOB__good__SCHEDULE": "0 0 3 * * *", "JOB__good__COMMAND": "SELECT 1", "JOB__good__TARGETS": "db:t_*"})
    assert [j.name for j in jobs] == ["good"]
    (bad,) = invalid
    assert bad.message.startswith("JOB__bad__TARGETS=") and expected in bad.message, bad.message


def test_targets_settings_that_do_not_fit_together_are_named():
    _, invalid = parse_jobs({
        "JOB__a__SCHEDULE": "0 0 3 * * *", "JOB__a__COMMAND": "SELECT 1", "JOB__a__TARGETS": "db:x",
        "JOB__a__DATABASE": "y",
        "JOB__b__SCHEDULE": "0 0 3 * * *", "JOB__b__STEPS__1__COMMAND": "SELECT 1", "JOB__b__TARGETS": "db:x",
        "JOB__c__SCHEDULE": "0 0 3 * * *", "JOB__c__COMMAND": "SELECT 1", "JOB__c__TARGETS": "db:x",
        "JOB__c__TARGET_PARALLELISM": "0"})
    messages = {job.name: job.message for job in invalid}
    assert "JOB__a__TARGETS and JOB__a__DATABASE are both set" in messages["a"]
    assert "gives each step its own JOB__b__STEPS__<n>__TARGETS" in messages["b"]
    assert "JOB__c__TARGET_PARALLELISM='0': expected a whole number from 1 to 1000" in messages["c"]


def test_sqlite_refuses_targets_and_postgresql_refuses_pools_at_sync_and_the_other_jobs_run(tmp_path):
    jobs = {"fleet": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1", "TARGETS": "db:tenant_*"},
            "pooled": {"SCHEDULE": "0 0 3 * * *", "STEPS__1__COMMAND": "SELECT 1",
                       "STEPS__1__TARGETS": "pool:srv.database.windows.net/pool1"},
            "plain": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"}}
    for dialect in ("sqlite", "postgres"):
        with fresh_database(dialect, tmp_path / dialect if dialect == "sqlite" else None) as url:
            if dialect == "sqlite":
                (tmp_path / dialect).mkdir(exist_ok=True)
                url = f"sqlite:///{tmp_path / dialect / 'agent.db'}"
            agent = make_agent(url, jobs)
            agent.tick(datetime.now(UTC))
            rows = {r["job_name"]: r for r in agent.store().execute("list_jobs").rows}
            assert rows["plain"]["valid"] == 1
            assert rows["pooled"]["valid"] == 0
            assert "JOB__pooled__STEPS__1__TARGETS='pool:srv.database.windows.net/pool1'" in rows["pooled"]["config_error"]
            if dialect == "sqlite":
                assert rows["fleet"]["valid"] == 0
                assert rows["fleet"]["config_error"].startswith("JOB__fleet__TARGETS='db:tenant_*': fleet targets need")
            else:
                assert rows["fleet"]["valid"] == 1
                assert "elastic pools exist only on Azure SQL Database" in rows["pooled"]["config_error"]


# ---------------------------------------------------------------- the notification


def test_the_runs_notification_lists_the_failing_databases_once(fleet, control):
    from tests.integration.test_notifications import Receiver

    fleet.create("n0", "n1", "n2")
    fleet.refuse_connections("n2")
    receiver = Receiver()
    try:
        agent = make_agent(control, {"tenants": {
            "SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_n*", "COMMAND": mark_sql(fleet.dialect),
            "MAX_ATTEMPTS": "1"}}, AGENT_NOTIFY_WEBHOOK_URL=receiver.url + "/ok", AGENT_CONNECT_RETRY_SECONDS="1")
        agent.tick(datetime.now(UTC))
        run_id = run_now(agent, "tenants")
        work(agent, concurrency=3, max_seconds=60)
        bodies = receiver.wait_for(1)
        time.sleep(0.5)           # nothing more: one notification for the run, none per execution
        bodies = receiver.bodies()
        assert len(bodies) == 1, bodies
        (body,) = bodies
        assert body["job"] == "tenants" and body["run_id"] == run_id and body["outcome"] == "failed"
        assert body["error"].startswith("step 1: 1 of 3 target(s) failed: ") and fleet.name("n2") in body["error"]
        assert fleet.name("n0") not in body["error"]
    finally:
        receiver.close()


# ---------------------------------------------------------------- a target's connection cut


def test_a_target_connection_terminated_mid_execution_is_retried_without_spending_an_attempt(fleet, control):
    fleet.create("x0", "x1")
    cut = fleet.name("x1")
    if fleet.dialect == "postgres":
        slow = ("SELECT pg_sleep(CASE WHEN EXISTS (SELECT 1 FROM pg_tables WHERE tablename = 'slow_flag') "
                "THEN 30 ELSE 0 END); ")
    else:
        slow = f"IF OBJECT_ID(N'dbo.slow_flag') IS NOT NULL {tsql_delay(30)}; "
    setup = _peek(make_agent(control).target, cut)
    setup.autocommit = True
    setup.cursor().execute("CREATE TABLE slow_flag (x INT)")
    agent = make_agent(control, {"cut": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_x*",
                                         "COMMAND": mark_sql(fleet.dialect, extra=slow), "MAX_ATTEMPTS": "1"}})
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "cut")
    done = threading.Event()
    worker = threading.Thread(target=lambda: (work(agent, concurrency=2, max_seconds=90), done.set()))
    worker.start()
    try:
        from tests.support.faults import wait_until

        wait_until(lambda: executions(agent, run_id).get(cut, {}).get("status") == "running", 30,
                   "the execution in the slow database runs")
        time.sleep(0.5)
        admin = fleet._admin()
        try:
            cursor = admin.cursor()
            if fleet.dialect == "postgres":
                cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               f"WHERE datname = '{cut}' AND pid <> pg_backend_pid() AND query LIKE '%pg_sleep%'")
                assert len(cursor.fetchall()) == 1          # the one backend running the slow execution
            elif mssql_server_is_babelfish():
                # No sys.dm_exec_requests (nor WAITFOR) there: the one session in the database
                # other than this test's own.
                own = setup.cursor().execute("SELECT @@SPID").fetchone()[0]
                cursor.execute("SELECT session_id FROM sys.dm_exec_sessions "
                               f"WHERE database_id = DB_ID(N'{cut}') AND session_id NOT IN (@@SPID, {int(own)})")
                sessions = [row[0] for row in cursor.fetchall()]
                assert len(sessions) == 1
                cursor.execute(f"KILL {int(sessions[0])}")
            else:
                cursor.execute("SELECT r.session_id FROM sys.dm_exec_requests AS r "
                               f"WHERE r.database_id = DB_ID(N'{cut}') AND r.wait_type = N'WAITFOR'")
                sessions = [row[0] for row in cursor.fetchall()]
                assert len(sessions) == 1
                cursor.execute(f"KILL {int(sessions[0])}")
        finally:
            admin.close()
        setup.cursor().execute("DROP TABLE slow_flag")
    finally:
        worker.join(120)
        setup.close()
    assert done.is_set()
    execution = executions(agent, run_id)[cut]
    assert execution["status"] == "succeeded" and execution["attempt"] == 2     # a transient error: no attempt spent
    outcomes = [a["outcome"] for a in agent.store().execute("list_attempts", run_ids=[execution["run_id"]]).rows]
    assert outcomes == ["transient", "succeeded"], outcomes
    assert agent.store().execute("get_run", run_id=run_id).one()["status"] == "succeeded"
    assert fleet.marks(agent, cut) == [1]


# ---------------------------------------------------------------- telemetry


def test_every_execution_event_names_its_database_under_the_runs_operation(fleet, control, appinsights_endpoint):
    """What the real exporter posts: the fan-out (TargetsResolved), each execution's events with
    target_database and parent_run_id under the run's operation id (its parent too), and the
    run's own end with the counts."""
    from tests.integration.test_engine_telemetry import _named, _op, _props

    names = fleet.create("t0", "t1", "t2")
    fleet.create("u0")                                  # not a target
    agent = make_agent(control, {"tele": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_t*",
                                          "COMMAND": "SELECT 1"}},
                       APPLICATIONINSIGHTS_CONNECTION_STRING=appinsights_endpoint.connection_string)
    agent.tick(datetime.now(UTC))
    run_id = run_now(agent, "tele")
    work(agent, concurrency=3, max_seconds=60)
    agent.telemetry.flush()
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "succeeded", run
    operation = run["operation_id"]
    events = appinsights_endpoint.events()

    (resolved,) = _named(events, "TargetsResolved")
    assert _op(resolved) == operation and _props(resolved)["run_id"] == str(run_id)
    assert _props(resolved)["targets"] == "3" and _props(resolved)["target_parallelism"] == "8"
    for name in ("RunStarted", "RunSucceeded"):
        executions_seen = [e for e in _named(events, name) if _props(e).get("target_database")]
        assert sorted(_props(e)["target_database"] for e in executions_seen) == sorted(names), name
        for envelope in executions_seen:
            assert _props(envelope)["parent_run_id"] == str(run_id)
            assert _props(envelope)["target_server"] == ""             # the agent's own server
            assert _props(envelope)["run_id"] != str(run_id)          # an execution's own id
            assert _op(envelope) == operation
            # OpenTelemetry's parent is a span id: the operation id's last 16 hex digits.
            parent = operation[16:] if agent.settings.agent.telemetry_exporter == "opentelemetry" else operation
            assert envelope["tags"]["ai.operation.parentId"] == parent
    (ended,) = [e for e in _named(events, "RunSucceeded") if _props(e)["run_id"] == str(run_id)]
    assert _op(ended) == operation and _props(ended)["targets"] == "3" and _props(ended)["targets_failed"] == "0"


# ---------------------------------------------------------------- the listings (conformance)


def test_the_server_listing_names_its_databases_without_the_system_ones(fleet, control):
    """list_server_databases as resolution runs it (PostgreSQL: pg_database from the control
    database; SQL Server / Azure SQL: sys.databases in master), and list_pool_databases on SQL
    Server: the members of a pool on Azure SQL, one clear error where there are no pools."""
    from shared.engine.fleet import list_databases

    names = fleet.create("l0", "l1")
    agent = make_agent(control)
    listed = list_databases("server", None, None, dialect=fleet.dialect, control_store=agent.store,
                            target_store=agent.target_store)
    assert set(names) <= set(listed) and len(listed) == len(set(listed))
    if fleet.dialect == "postgres":
        assert not {"template0", "template1"} & set(listed) and "postgres" in listed
        return
    assert not {"master", "tempdb", "model", "msdb"} & {name.lower() for name in listed}
    store = agent.target_store("master")
    try:
        rows = store.execute("list_pool_databases", pool=f"{fleet.prefix}_no_such_pool").rows
    except Exception as exc:            # SQL Server outside Azure: no sys.database_service_objectives
        assert "51400" in str(exc) and "no elastic pools" in str(exc), exc
    else:                               # Azure SQL Database: a pool nobody has has no members
        assert rows == []
    finally:
        store.close()


@pytest.fixture
def pg_fleet():
    fleet = Fleet("postgres")
    try:
        yield fleet
    finally:
        fleet.drop()


@pytest.fixture
def pg_control(tmp_path):
    with fresh_database("postgres", tmp_path) as url:
        yield url


def test_a_glob_on_a_named_server_is_listed_there_and_an_unreachable_server_fails_its_run_alone(pg_fleet, pg_control):
    """db:<server>/<glob> lists that server (the agent's credentials, another Server=); a
    server: member whose server refuses the connection fails the attempt, with the error, and
    the other fleet job runs. (PostgreSQL: the named server is this machine's, 127.0.0.1:5432.)"""
    from tests.support.azurite import free_loopback_port

    fleet, control = pg_fleet, pg_control

    names = fleet.create("r0", "r1")
    closed = free_loopback_port()
    agent = make_agent(control, {
        "named": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:127.0.0.1:5432/{fleet.prefix}_r*",
                  "COMMAND": mark_sql(fleet.dialect)},
        "gone": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"server:127.0.0.1:{closed}", "COMMAND": "SELECT 1",
                 "MAX_ATTEMPTS": "1"}}, AGENT_CONNECT_RETRY_SECONDS="1")
    agent.tick(datetime.now(UTC))
    named, gone = run_now(agent, "named"), run_now(agent, "gone")
    work(agent, concurrency=4, max_seconds=60)
    assert agent.store().execute("get_run", run_id=named).one()["status"] == "succeeded"
    done = executions(agent, named)
    assert set(done) == set(names) and {e["status"] for e in done.values()} == {"succeeded"}
    assert query(agent, f"SELECT DISTINCT target_server FROM agent.runs WHERE parent_run_id = {named}") == [
        ("127.0.0.1:5432",)]
    for name in names:
        assert fleet.marks(agent, name) == [1]
    run = agent.store().execute("get_run", run_id=gone).one()
    assert run["status"] == "failed" and executions(agent, gone) == {}
    assert "resolving the targets (server:127.0.0.1:" in run["last_error"] and str(closed) in run["last_error"]


# ---------------------------------------------------------------- several processes


def test_three_agent_processes_keep_one_runs_window_and_run_each_database_once(fleet, control):
    """Three agents (`run`, two workers each, AGENT_MAX_CONCURRENCY 10, the same settings) on
    one fleet run of 12 databases at TARGET_PARALLELISM 3: the window is shared across processes
    (never more than 3 executing, measured in the target databases themselves), the processes
    share the executions, and each database runs once."""
    from tests.support.faults import clean_env, kill9, start_cli, wait_until
    from tests.support.harness import job_env

    names = fleet.create(*[f"m{i:02d}" for i in range(12)])
    if fleet.dialect == "postgres":
        command = ("CREATE TABLE spans (started TIMESTAMPTZ, ended TIMESTAMPTZ); "
                   "INSERT INTO spans VALUES (clock_timestamp(), NULL); SELECT pg_sleep(0.3); "
                   "UPDATE spans SET ended = clock_timestamp()")
    else:
        command = ("CREATE TABLE dbo.spans (started DATETIME2, ended DATETIME2); DECLARE @s DATETIME2 = SYSUTCDATETIME(); "
                   f"{tsql_delay(0.3)}; INSERT INTO dbo.spans VALUES (@s, SYSUTCDATETIME())")
    jobs = {"shared": {"SCHEDULE": "0 0 3 * * *", "TARGETS": f"db:{fleet.prefix}_m*", "COMMAND": command,
                       "TARGET_PARALLELISM": "3", "MAX_ATTEMPTS": "1"}}
    settings = {"AGENT_MAX_CONCURRENCY": "10", "AGENT_POLL_SECONDS": "1"}
    agent = make_agent(control, jobs, **settings)
    agent.tick(datetime.now(UTC))
    env = clean_env(**job_env(jobs, **settings))
    # Two workers each: six in all for a window of three (a worker that ends an execution takes
    # the one it let in itself, so more per process would let one process keep them all).
    agents = [start_cli(control, "run", "--concurrency", "2", env=env) for _ in range(3)]
    try:
        time.sleep(3)                                   # all three up and polling
        assert [process.poll() for process in agents] == [None, None, None]
        run_id = run_now(agent, "shared")
        wait_until(lambda: agent.store().execute("get_run", run_id=run_id).one()["status"] != "running"
                   and agent.store().execute("get_run", run_id=run_id).one()["status"] != "pending", 90,
                   "the fleet run ends")
    finally:
        for process in agents:
            kill9(process)
    run = agent.store().execute("get_run", run_id=run_id).one()
    assert run["status"] == "succeeded" and run["targets_total"] == 12, run
    spans = []
    for name in names:
        connection = _peek(agent.target, name)
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT started, ended FROM spans")
            rows = cursor.fetchall()
        finally:
            connection.close()
        assert len(rows) == 1, (name, rows)           # once each (a second CREATE TABLE would have failed too)
        spans += [(row[0], row[1]) for row in rows]
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    at_once = peak = 0
    for _, change in points:
        at_once += change
        peak = max(peak, at_once)
    assert 2 <= peak <= 3, spans
    assert {e["status"] for e in executions(agent, run_id).values()} == {"succeeded"}
    # The worker names carry the process id: the executions were shared between processes.
    workers_seen = query(agent, "SELECT DISTINCT a.worker FROM agent.attempts a JOIN agent.runs r "
                                f"ON r.run_id = a.run_id WHERE r.parent_run_id = {int(run_id)}")
    assert len({worker for (worker,) in workers_seen}) >= 2, workers_seen


def test_a_fleet_runs_params_and_tokens_reach_every_execution(pg_fleet, pg_control):
    """Issue 33 item 4: the run's values (given, defaults filled in) go with its executions, bound
    in each target database; a token names the fleet's job, not the execution (which has none)."""
    from shared.engine.operations import run_now as start

    pg_fleet.create("p0", "p1")
    command = ("CREATE TABLE IF NOT EXISTS fleet_params (v text); INSERT INTO fleet_params "
               "SELECT current_setting('agent.param.who') || '|' || current_setting('agent.param.day') "
               "|| '|$(ESCAPE_SQUOTE(JOBNAME))'")
    agent = make_agent(pg_control, {"fan": {"TARGETS": f"db:{pg_fleet.prefix}_p*", "COMMAND": command,
                                            "PARAMS__who__REQUIRED": "true", "PARAMS__day__DEFAULT": "mon"}})
    agent.tick(datetime.now(UTC))
    run = start(agent, "fan", params=["who=it's"])
    work(agent, concurrency=2, max_seconds=60)
    assert agent.store().execute("get_run", run_id=run.run_id).one()["status"] == "succeeded"
    for database in (pg_fleet.name("p0"), pg_fleet.name("p1")):
        connection = _peek(agent.target, database)
        try:
            assert [r[0] for r in connection.cursor().execute("SELECT v FROM fleet_params").fetchall()] == \
                ["it's|mon|fan"]
        finally:
            connection.close()
