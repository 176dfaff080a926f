"""The round-trip budget of the path every run takes (issue 35 item 1).

Every feature adds a little to the path a run takes, and nothing stopped it: a fifth round trip
here, a subquery planned on every claim there, until the agent ran at 0.10 of what PostgreSQL
can do. This test counts, per no-op task, what the engine sends to its control database while
a worker runs it: round trips (every execute, commit and rollback it asks of the driver) and
bytes (the SQL text and its parameters, as UTF-8), and fails when a change exceeds the budget.
A change that needs more raises the budget HERE, in BUDGETS, saying why.

Paths (each per task, counted as the difference between a round of 4 runs and a round of 2 on
the same database, so that a round's fixed costs, such as the last empty claim, cancel out):

* direct: the local runner claims from agent.runs (claim, run, complete);
* queue: the queue trigger (start the run a message names, run, complete);
* for each: an ad-hoc task, a scheduled run (a job's slot the tick claimed), and a run that hands
  on (ordered tasks: each completion makes the next runnable; in queue mode it dispatches it);
* owned: a task an operator queued from the database (agent.exec_async: it runs as its owner),
  counted apart: the owner boundary costs bytes of its own (see BUDGETS). PostgreSQL and T-SQL
  only: SQLite has no roles, so nothing runs as an owner there (Executor._owner).

Dialects: SQLite (statements; no network, but the same discipline), PostgreSQL (through pyodbc
and psqlODBC, as the local runner reaches it) and T-SQL. SQL Server cannot run here, so the
T-SQL path runs against a recording connection (tests/support/round_trips.py) that answers each
named query with the rows PostgreSQL gave for it in the same scenario: it counts what the
engine SENDS on the T-SQL path and proves nothing else (test_dialects.py parses the T-SQL;
Babelfish and SQL Server run it).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from shared.control.db import _sql_server_session
from shared.engine.agent import Agent
from shared.engine.dispatch import dispatch
from shared.engine.runner import LocalRunner
from shared.messaging.memory import MemoryQueue
from shared.settings import load_settings
from shared.telemetry.client import new_operation_id
from tests.support.harness import (
    Clock,
    create_pg_database,
    drop_pg_database,
    execute,
    job_env,
    make_agent,
    pg_admin_connection,
)
from tests.support.round_trips import (
    Answers,
    RecordingTsqlConnection,
    Tally,
    count_connections,
    record_answers,
)

UTC = timezone.utc
ROUNDS = (2, 4)            # runs per round; per task = (round of 4 - round of 2) / 2
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TSQL_URL = "Driver={ODBC Driver 18 for SQL Server};Server=recording.invalid;Database=agent;Uid=agent;Pwd=x;"


@dataclass(frozen=True)
class Budget:
    round_trips: float
    kilobytes: float
    why: str = ""


# The budget per task: (dialect, mode, path) -> at most this many round trips and KB sent.
# PostgreSQL, direct mode: 2 round trips (BEGIN and the job's SQL; one batch that resets the
# session, checks the job's transaction, completes the run fenced by its token, commits, and then
# claims the worker's next run: Executor._claim_ahead argues why that claim is the one the worker
# would have sent next). Queue mode: 3, because the next run is named by a message the worker has
# not received yet (the start needs the message's run and token, so it cannot ride on the
# completion): the start; the job's SQL; the completion. T-SQL: 4 round trips and 1.5 KB (stored
# procedures, issue 35 item 3).
# +0.1 KB for the job's search_path (issue 34, the attack on the owner boundary): the agent's
# sessions are pinned to pg_catalog, pg_temp; the job's SQL gets the database's and role's default
# back for its transaction, looked up in the batch that runs it (store.JOB_SEARCH_PATH: a fleet
# target has no agent schema to keep a function in), then sent as the value it gave for a minute
# (Store._job_search_path; the lookup was 0.35 KB a run and a tenth of the server's time). Not a
# round trip more. Measured at 1.42 KB (direct) and 1.83 KB (queue).
_PATH = "; the job's own search_path, the agent's sessions being pinned (issue 34 attack): +0.1 KB"
_PG = {"direct": Budget(2, 1.5, _PATH), "queue": Budget(3, 1.9, _PATH)}
TSQL_TARGET = Budget(4, 1.5)
# T-SQL since migration 0023 (issue 35 item 3), measured at 3 round trips and 0.97 KB (direct),
# 1.25 KB (queue) per task: the claim or start (a procedure in a transaction of its own, on an
# autocommit connection: no COMMIT round trip); the job (EXEC agent.run_job ?, BEGIN TRANSACTION
# riding on it); the completion in one batch (the session settings, check_work_transaction,
# finish_run raising when fenced, start_follow_up_runs, in queue mode lock_starts and dispatch_runs,
# then COMMIT). Before 0023: 9 and 11 round trips, 26.5 and 39 KB.
_TSQL_NOW = "T-SQL hot path as procedures (migration 0023)"
# SQLite runs a batch one statement at a time, in-process (no network): 17 direct and 19 queue
# statements until three more came with issue 34 (the claim reads the database's own now when the
# agent runs on the database clock, item 12; a follow-up's chain of jobs is checked, item 4).
_SQLITE = "SQLite runs a batch one statement at a time, in-process; +3 for issue 34 items 4 and 12"
# Issue 33 item 5 (overlap buffer-one and cancel-previous, catch-up, backfill): decided in the claims
# under the start lock (exact, whatever the timing: a rule in the tick would let a slot slip through
# between ticks). The buffer-one skip joins the claim's skip statement (no statement more; its
# condition +0.6 KB); cancel-previous is one statement more on SQLite (the runs it stops and their
# fleet executions, in one UPDATE) and +1.3 KB in each claim and start; the catch-up exemption of
# the misfire rules +0.1 KB. T-SQL: inside the procedures of migration 0023 (claim_runs, start_run,
# dispatch_runs), nothing more on the wire.
_OVERLAP = "; overlap buffer-one/cancel-previous and the catch-up exemption in the claims (issue 33 item 5)"
BUDGETS: dict[tuple[str, str, str], Budget] = {}
for _path in ("task", "scheduled", "hand-on"):
    BUDGETS[("postgres", "direct", _path)] = _PG["direct"]
    BUDGETS[("postgres", "queue", _path)] = _PG["queue"]
    BUDGETS[("sqlite", "direct", _path)] = Budget(21, 13.5, _SQLITE + _OVERLAP + ": +1 statement, +3 KB")
    BUDGETS[("sqlite", "queue", _path)] = Budget(21, 18, _SQLITE + _OVERLAP + ": +1 statement, +3.5 KB")
    BUDGETS[("mssql", "direct", _path)] = TSQL_TARGET
    BUDGETS[("mssql", "queue", _path)] = TSQL_TARGET
# Owned runs need 4 round trips on PostgreSQL, one above the 3 of the budget, on both paths: the
# claim or start; the statement that makes the owner's function (pg_temp, SECURITY DEFINER, given to
# the owner, the session marked); the job's SQL through it; the completion. Why not fewer:
# * the function cannot be made in the job's batch: tried for issue 35 (a DO block before the job,
#   its failure raising SQLSTATE AG003 to tell "the role is missing / not granted" from the job's
#   errors), psqlODBC then handed the job's notices on twice, to the setup's result and to the next
#   (tests/integration/test_step_output.py: 60 notices for 30), so a job's output would lie;
# * its completion cannot claim the next run: the connection an owned run used is closed after its
#   transaction (the owner boundary, docs/tsql.md), so nothing of the agent's runs on it after.
_OWNED = ("a run that runs as its owner (agent.exec_async) runs its SQL through a function owned by "
          "that role, made in the job's transaction in a round trip of its own (Store._run_as: in the job's "
          "batch psqlODBC doubles the job's notices), and its completion claims nothing (its connection is "
          "closed after it): 4 round trips")
# +1.8 KB for the owner boundary (issue 34 item 1, docs/tsql.md "The owner boundary"): the owner's
# function carries the loop that fires the job's deferred triggers as the owner before it returns
# (it must travel with the run: a fleet target has no agent schema to keep it in), and the two
# statements that mark and unmark the session as the owner's for agent.* calls from inside the job.
# Not a round trip more for the new connection the next run takes: the login it would ask for is
# the store's, asked once.
_BOUNDARY = "; the owner boundary's trigger loop and session mark (issue 34 item 1): +1.8 KB"
BUDGETS[("postgres", "direct", "owned")] = Budget(4, 3.9, _OWNED + "; the notices' end marker (issue 34 item 10)"
                                                  + _BOUNDARY + _PATH)
BUDGETS[("postgres", "queue", "owned")] = Budget(4, 4.3, _OWNED + "; the notices' end marker (issue 34 item 10)"
                                                 + _BOUNDARY + _PATH)
# T-SQL: the connection of an owned run is closed after it (the owner boundary), so each owned run
# opens a session: its settings and its identity, 2 round trips (5 and 6 measured since 0023).
_TSQL_OWNED = "; an owned run's connection is closed after it: each opens a session (settings, identity: +2)"
BUDGETS[("mssql", "direct", "owned")] = Budget(5, 2.3, _OWNED + "; " + _TSQL_NOW + _TSQL_OWNED)
BUDGETS[("mssql", "queue", "owned")] = Budget(6, 2.8, _OWNED + "; " + _TSQL_NOW + _TSQL_OWNED)


@dataclass(frozen=True)
class Cost:
    round_trips: float
    executes: float
    commits: float
    rollbacks: float
    bytes_sent: float

    def __str__(self) -> str:
        return (f"{self.round_trips:.2f} round trips ({self.executes:.2f} executes, {self.commits:.2f} commits, "
                f"{self.rollbacks:.2f} rollbacks), {self.bytes_sent / 1000:.2f} KB")


def per_task(first: tuple[int, ...], second: tuple[int, ...], runs: int) -> Cost:
    executes, commits, rollbacks, sent = ((b - a) / runs for a, b in zip(first[:4], second[:4]))
    return Cost(executes + commits + rollbacks, executes, commits, rollbacks, sent)


# ---------------------------------------------------------------- scenarios


class Scenario:
    """One path on one real database: set up a round of runs (not counted), then a worker runs
    them (counted)."""

    def __init__(self, url: str, mode: str, path: str, owner: str | None = None) -> None:
        self.mode, self.path, self.owner = mode, path, owner
        self.clock = Clock(START)
        self.queue = MemoryQueue() if mode == "queue" else None
        jobs = {}
        if path == "scheduled":
            # Two rounds of one-time jobs, an hour apart: each round's tick claims its own slots.
            for index in range(sum(ROUNDS)):
                at = START if index < ROUNDS[0] else START + timedelta(hours=1)
                jobs[f"job{index}"] = {"SCHEDULE": "@once " + at.isoformat(), "COMMAND": "SELECT 1"}
        self.agent = make_agent(url, jobs, clock=self.clock, queue=self.queue, AGENT_MAX_CONCURRENCY="8")
        self.order = 0

    def prepare(self, round_index: int, runs: int) -> list[tuple[str, float]]:
        """A round of ``runs`` runs ready to start; returns the messages queued for them (and the
        tick's doorbells, delayed), each with its delay."""
        store = self.agent.store()
        queued_before = len(self.queue.sent) if self.queue is not None else 0
        if self.path == "scheduled":
            if round_index:
                self.clock.advance(3600)
            self.agent.tick(self.clock())
        else:
            for _ in range(runs):
                self.order += 1
                store.execute("insert_task", command="SELECT 1", target_database=None,
                              task_order=self.order if self.path == "hand-on" else None, max_attempts=1,
                              timeout_seconds=60, lease_seconds=60, now=self.clock(),
                              operation_id=new_operation_id())
            if self.owner is not None:
                execute(self.agent, f"UPDATE agent.runs SET owner = '{self.owner}' WHERE status = 'pending'")
            if self.queue is not None:
                dispatch(store, self.queue, self.agent.settings, self.clock(), self.agent.telemetry)
        self.agent.release()
        return self.queue.sent[queued_before:] if self.queue is not None else []

    def close(self) -> None:
        self.agent.close()


def work(agent: Any, tally: Tally) -> tuple[int, tuple[int, ...]]:
    before = tally.snapshot()
    done = LocalRunner(agent, concurrency=1, visibility_timeout=0, poll_interval=0.05).work_until_idle(max_seconds=60)
    after = tally.snapshot()
    return done, tuple(b - a for a, b in zip(before, after))


def measure_real(url: str, mode: str, path: str, *, owner: str | None = None,
                 answers: Answers | None = None) -> tuple[Cost, list[list[tuple[str, float]]]]:
    """Per-task cost on a real database; with ``answers``, every named query's rows are recorded
    (round by round) for the T-SQL replay; returns the messages each round started with."""
    scenario = Scenario(url, mode, path, owner)
    tally = Tally()
    counts = []
    messages: list[list[tuple[str, float]]] = []
    try:
        count_connections(scenario.agent, tally)
        for index, runs in enumerate(ROUNDS):
            messages.append(scenario.prepare(index, runs))
            if answers is not None:
                answers.recording = True
            done, spent = work(scenario.agent, tally)
            if answers is not None:
                answers.recording = False
            assert done == runs, (path, mode, done, runs)
            counts.append(spent)
        # Every connection went back to the pool outside a transaction (the counting wrapper
        # forwards autocommit to the driver: a batch of the agent's never stays open).
        assert scenario.agent.pool.refused_back == 0, "a connection was given back inside a transaction"
    finally:
        scenario.close()
    return per_task(counts[0], counts[1], ROUNDS[1] - ROUNDS[0]), messages


def measure_tsql(mode: str, path: str, answers: Answers, messages: list[list[tuple[str, float]]]) -> Cost:
    """The same rounds on T-SQL through the recording connection, answered from PostgreSQL's."""
    queue = MemoryQueue() if mode == "queue" else None
    env = {"AGENT_MAX_CONCURRENCY": "8"}
    agent = Agent(load_settings(environ=job_env({}, **env)), db=TSQL_URL, queue=queue,
                  clock=lambda: START, simulated_time=True)
    tally = Tally(encoding="utf-16-le")
    fixed = {"session_identity": (["spid", "babelfish", "user_name"], [(55, "0", "dbo")])}
    # Opened as the agent opens a SQL Server session (its settings, autocommit, its identity asked
    # once): what a connection costs is counted, and cancels out per task (the pool keeps it).
    agent.pool._connect = _sql_server_session(lambda: RecordingTsqlConnection(answers, tally, fixed))
    counts = []
    try:
        agent.store().connection   # opened (and kept by the pool) before the rounds: per connection, not per task
        agent.release()
        for index, runs in enumerate(ROUNDS):
            if queue is not None:
                queue.send_many([body for body, _ in messages[index]],
                                delays=[delay for _, delay in messages[index]])
            done, spent = work(agent, tally)
            assert done == runs, (path, mode, done, runs)
            counts.append(spent)
    finally:
        agent.close()
    return per_task(counts[0], counts[1], ROUNDS[1] - ROUNDS[0])


def check(dialect: str, mode: str, path: str, cost: Cost) -> None:
    budget = BUDGETS[(dialect, mode, path)]
    where = f"{dialect}, {mode} mode, {path}: {cost}; budget {budget.round_trips} round trips, {budget.kilobytes} KB"
    print(where)
    assert cost.round_trips <= budget.round_trips, f"over the round-trip budget: {where}"
    assert cost.bytes_sent <= budget.kilobytes * 1000, f"over the byte budget: {where}"
    if dialect == "mssql" and path != "owned":
        # Item 3's target: when it is met, its budget takes the place of today's.
        met = cost.round_trips <= TSQL_TARGET.round_trips and cost.bytes_sent <= TSQL_TARGET.kilobytes * 1000
        assert not met or budget == TSQL_TARGET, f"the T-SQL target is met ({where}): make it the budget"


# ---------------------------------------------------------------- the tests

PATHS = ("task", "scheduled", "hand-on")
MODES = ("direct", "queue")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_sqlite_budget(tmp_path, mode, path):
    cost, _ = measure_real(f"sqlite:///{tmp_path / 'agent.db'}", mode, path)
    check("sqlite", mode, path, cost)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_postgres_budget(pg_url, mode, path):
    cost, _ = measure_real(pg_url, mode, path)
    check("postgres", mode, path, cost)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mode", MODES)
def test_tsql_budget(pg_url, monkeypatch, mode, path):
    """What the engine sends on the T-SQL path (see the module's docstring: counted, not run)."""
    answers = Answers()
    record_answers(monkeypatch, answers)
    _, messages = measure_real(pg_url, mode, path, answers=answers)
    monkeypatch.undo()
    cost = measure_tsql(mode, path, answers, messages)
    check("mssql", mode, path, cost)


@pytest.fixture
def owner_role() -> Any:
    """A role to own runs (NOLOGIN: the agent's superuser login runs its jobs' SQL as it)."""
    name = f"owner_{uuid.uuid4().hex[:10]}"
    admin = pg_admin_connection()
    admin.cursor().execute(f'CREATE ROLE "{name}" NOLOGIN')
    try:
        yield name
    finally:
        admin.cursor().execute(f'DROP ROLE IF EXISTS "{name}"')
        admin.close()


@pytest.mark.parametrize("mode", MODES)
def test_owned_run_budget(owner_role, monkeypatch, mode):
    """Owned runs on their own budget line (see BUDGETS), PostgreSQL and T-SQL."""
    name, url = create_pg_database()
    try:
        answers = Answers()
        record_answers(monkeypatch, answers)
        cost, messages = measure_real(url, mode, "owned", owner=owner_role, answers=answers)
        monkeypatch.undo()
        check("postgres", mode, "owned", cost)
        check("mssql", mode, "owned", measure_tsql(mode, "owned", answers, messages))
    finally:
        drop_pg_database(name)


def test_the_counting_wrapper_forwards_every_attribute(pg_url):
    """What the budget counts is what the driver does: ``autocommit`` written through the wrapper
    is the driver's (issue 35: a wrapper that kept it left the benchmark's claims open), and one
    execute is one request on the wire (a batch, whatever its statements)."""
    import pyodbc

    from shared.control.connection_strings import with_postgres_defaults
    from tests.support.round_trips import CountingConnection

    raw = pyodbc.connect(with_postgres_defaults(pg_url), autocommit=False)
    tally = Tally()
    counted = CountingConnection(raw, tally)
    try:
        counted.autocommit = True
        assert raw.autocommit is True and counted.autocommit is True
        # Each request its own transaction on the server: autocommit reached psqlODBC.
        first, second = (counted.cursor().execute("SELECT txid_current()").fetchone()[0] for _ in range(2))
        assert first != second
        counted.autocommit = False
        assert raw.autocommit is False
        first, second = (counted.cursor().execute("SELECT txid_current()").fetchone()[0] for _ in range(2))
        assert first == second                      # one transaction, as the driver was told
        counted.rollback()
        assert (tally.executes, tally.rollbacks, tally.round_trips) == (4, 1, 5)
    finally:
        raw.close()
