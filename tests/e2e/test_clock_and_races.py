"""Time and concurrency safety (issue 22, items 1-3), on the real stand-ins.

* One clock: the agent's time is the control database's. A tick at a time further from it
  than AGENT_MAX_CLOCK_SKEW_SECONDS (an operator's ``--now``, either way) changes nothing and
  says so; an instance whose own wall clock is an hour behind (shifted in-process) still
  claims, renews leases and dispatches on the database's time.
* Racing ticks: eight ``tick`` processes at once over 300 due jobs on PostgreSQL all exit 0,
  and exactly one run exists per (job, slot).
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from shared.messaging.memory import MemoryQueue
from tests.support.clock_shift import instance_clock_shifted
from tests.support.harness import ROOT, execute, make_agent, query, runs_table, sql_for

UTC = timezone.utc
MINUTELY = {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}


def database_now(agent) -> datetime:
    from shared.control.clock import as_utc

    return as_utc(agent.store().execute("database_time").scalar())


def real_agent(db_url, jobs=None, **kwargs):
    """An agent as the function app and the command line build it: the database's clock, ticks
    checked against it (no simulated time)."""
    return make_agent(db_url, jobs, simulated_time=False, **kwargs)


# ---------------------------------------------------------------- 1. a tick's time far from the database's


@pytest.mark.parametrize("offset", [-3600, -310, 310, 86400 * 365 * 4])
def test_a_tick_whose_time_is_off_changes_nothing(db_url, offset):
    agent = real_agent(db_url, {"m": MINUTELY, "h": {"SCHEDULE": "0 0 * * * *", "COMMAND": "SELECT 1"}})
    first = agent.tick()
    assert not first.refused and not first.errors, first.errors
    table = runs_table(agent)
    runs_before = query(agent, f"SELECT run_id, job_name, scheduled_for, status FROM {table} ORDER BY run_id")
    jobs_before = query(agent, "SELECT job_name, next_due_at FROM " + table.replace("runs", "jobs") + " ORDER BY job_name")
    assert runs_before
    events = []
    agent.telemetry.event = lambda name, properties=None, **kw: events.append((name, properties))
    report = agent.tick(database_now(agent) + timedelta(seconds=offset))
    assert report.refused and len(report.errors) == 1
    assert "AGENT_MAX_CLOCK_SKEW_SECONDS=300" in report.errors[0] and "nothing was changed" in report.errors[0]
    assert ("behind" if offset < 0 else "ahead of") in report.errors[0]
    assert [name for name, _ in events] == ["ClockSkewDetected"]
    assert events[0][1]["outcome"] == "refused"
    assert query(agent, f"SELECT run_id, job_name, scheduled_for, status FROM {table} ORDER BY run_id") == runs_before
    assert query(agent, "SELECT job_name, next_due_at FROM " + table.replace("runs", "jobs")
                 + " ORDER BY job_name") == jobs_before
    # Within the skew, a tick goes ahead (and the next sane tick finds nothing to recover).
    within = agent.tick(database_now(agent) - timedelta(seconds=200))
    assert not within.refused and not within.recovered and not within.errors
    again = agent.tick()
    assert not again.recovered and not [r for r in again.claimed if r["status"] == "skipped"]


def _times(agent, sql: str, count: int) -> list[tuple]:
    """Rows of ``sql`` with their first ``count`` columns as aware UTC datetimes (SQLite answers text)."""
    def as_time(value):
        value = datetime.fromisoformat(value) if isinstance(value, str) else value
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return [tuple(as_time(v) if i < count else v for i, v in enumerate(row)) for row in query(agent, sql)]


@pytest.mark.parametrize("offset", [1, 60, 279, -1, -60, -279])
def test_a_tick_within_the_skew_decides_on_the_databases_clock(db_url, offset):
    """Issue 34 item 7: a tick whose time is off the database's by less than the allowed skew
    (an operator's ``tick --now``) decides every time on the database's clock: no slot looks
    missed before it is (no false misfire, no late catch-up), none runs before its time, no
    live lease is taken for lapsed, and a job it syncs gets no slot from before it existed."""
    from shared.engine.scheduler import NOTE_CATCH_UP

    agent = real_agent(db_url, {"often": {"SCHEDULE": "*/5 * * * * *", "COMMAND": "SELECT 1"}})
    table = runs_table(agent)
    before = database_now(agent)
    if offset < 0:
        # The first tick is the one behind: the job is new, and its first slot comes after
        # the database's time, not from the tick's earlier one.
        report = agent.tick(before + timedelta(seconds=offset))
        assert not report.refused and not report.errors, report.errors
    else:
        first = agent.tick()
        assert not first.refused and not first.errors, first.errors
        # One claimed run is running under a live lease (60 s, renewed on the database's clock).
        execute(agent, f"UPDATE {table} SET status = 'running', attempt = 1, lease_expires_at = "
                       + sql_for(db_url, "strftime('%Y-%m-%d %H:%M:%f', 'now', '+60 seconds')",
                                 "CAST(clock_timestamp() AT TIME ZONE 'UTC' AS timestamp) + INTERVAL '60 seconds'",
                                 "DATEADD(SECOND, 60, SYSUTCDATETIME())")
                       + f" WHERE run_id = (SELECT MIN(run_id) FROM {table})")
        report = agent.tick(database_now(agent) + timedelta(seconds=offset))
        assert not report.refused and not report.errors, report.errors
    rows = _times(agent, f"SELECT scheduled_for, runnable_at, status, note FROM {table} ORDER BY scheduled_for", 2)
    assert rows
    assert [row for row in rows if row[2] == "skipped"] == [], "a false misfire"
    assert [row for row in rows if row[3] == NOTE_CATCH_UP] == [], "a false catch-up"
    if offset > 0:
        assert report.expired == [], "a live lease taken for lapsed"
        assert query(agent, f"SELECT COUNT(*) FROM {table} WHERE status = 'running'") == [(1,)]
    # Nothing runnable before its slot, and no slot from before the tick (the database's time).
    assert all(runnable >= slot for slot, runnable, _, _ in rows)
    assert min(slot for slot, *_ in rows) >= before - timedelta(seconds=1), (before, rows[:3])


def test_cli_tick_an_hour_behind_exits_non_zero_with_one_line(pg_url):
    from tests.support.faults import clean_env

    agent = real_agent(pg_url, {"m": MINUTELY})
    agent.tick()
    before = query(agent, "SELECT run_id, status, scheduled_for FROM agent.runs ORDER BY run_id")
    jobs_before = query(agent, "SELECT next_due_at, advanced_at FROM agent.jobs")
    hour_ago = (database_now(agent) - timedelta(hours=1)).isoformat()
    env = clean_env(JOB__m__SCHEDULE=MINUTELY["SCHEDULE"], JOB__m__COMMAND=MINUTELY["COMMAND"])
    result = subprocess.run([sys.executable, "-m", "shared.cli", "--db", pg_url, "tick", "--now", hour_ago],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: tick refused:") and "60 min behind" in lines[0], lines
    assert result.stdout == ""
    assert query(agent, "SELECT run_id, status, scheduled_for FROM agent.runs ORDER BY run_id") == before
    assert query(agent, "SELECT next_due_at, advanced_at FROM agent.jobs") == jobs_before
    assert query(agent, "SELECT COUNT(*) FROM agent.job_events WHERE kind = 'clock_recovered'") == [(0,)]


def test_the_timer_function_logs_a_refused_tick_and_returns(pg_url, monkeypatch, caplog):
    from shared.engine import agent as agent_module

    agent = real_agent(pg_url, {"m": MINUTELY})
    agent.tick()
    before = query(agent, "SELECT run_id, status FROM agent.runs ORDER BY run_id")
    real_tick = agent_module.Agent.tick
    hour_behind = database_now(agent) - timedelta(hours=1)
    monkeypatch.setattr(agent_module.Agent, "tick", lambda self, now=None: real_tick(self, now or hour_behind))
    monkeypatch.setenv("AGENT_DB", pg_url)
    monkeypatch.setenv("JOB__m__SCHEDULE", MINUTELY["SCHEDULE"])
    monkeypatch.setenv("JOB__m__COMMAND", MINUTELY["COMMAND"])
    agent_module.reset_default_agent()
    try:
        agent_module.run_timer_tick()        # returns: logged, not raised
    finally:
        agent_module.reset_default_agent()
    assert any("tick refused" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    assert query(agent, "SELECT run_id, status FROM agent.runs ORDER BY run_id") == before


def test_recovery_undoes_a_runaway_clock_once_and_then_finds_nothing(db_url):
    """State a clock a day ahead left behind (an older version's tick, simulated here) is
    undone by the next tick, measured from the database's clock; the tick after finds nothing."""
    from tests.support.harness import Clock

    jobs = {"m": MINUTELY}
    agent = real_agent(db_url, jobs)
    agent.tick()
    table = runs_table(agent)
    ahead = make_agent(db_url, jobs, clock=Clock(database_now(agent) + timedelta(days=1)))
    ahead.tick()
    ahead.close()
    far = (database_now(agent) + timedelta(hours=1)).replace(tzinfo=None).isoformat(sep=" ")
    assert query(agent, f"SELECT COUNT(*) FROM {table} WHERE scheduled_for > '{far}'")[0][0] >= 1
    first = agent.tick()
    assert first.recovered and not first.refused and not first.errors
    assert query(agent, f"SELECT COUNT(*) FROM {table} WHERE scheduled_for > '{far}'") == [(0,)]
    second = agent.tick()
    assert not second.recovered and not second.errors
    assert not [r for r in second.claimed if r["status"] == "skipped"]


# ---------------------------------------------------------------- 2. an instance clock an hour behind


def test_an_instance_an_hour_behind_claims_on_the_databases_time(db_url):
    agent = real_agent(db_url, {"m": MINUTELY})
    db_before = database_now(agent)
    with instance_clock_shifted(-3600):
        report = agent.tick()
        assert not report.refused and not report.errors
        assert abs(agent.database_clock.instance_skew + 3600) < 5
    db_now = database_now(agent)
    # The tick's time is the database's, read while it ran: between the database's times before
    # and after it (within a second of rounding), however long the tick took (a first tick on
    # Babelfish compiles each statement: several seconds), and an hour from the instance's.
    assert db_before - timedelta(seconds=1) <= report.now <= db_now + timedelta(seconds=1), (db_before, report.now, db_now)
    slots = [r["scheduled_for"] for r in report.claimed]
    assert slots and all(abs((slot - db_now).total_seconds()) < 300 for slot in slots)
    assert not [r for r in report.claimed if r["status"] == "skipped"]   # no false misfire


def test_a_worker_an_hour_behind_keeps_its_lease_alive(pg_url):
    """The worker renews on the database's clock: its lease lies in the future for a healthy
    peer, whose tick does not take the run for lapsed (nor run it a second time)."""
    import threading

    slow = {"SCHEDULE": "0 0 0 1 1 *", "COMMAND": "SELECT pg_sleep(8)", "LEASE_SECONDS": "6",
            "MAX_ATTEMPTS": "1"}
    peer = real_agent(pg_url, {"slow": slow})
    worker = real_agent(pg_url, {"slow": slow})
    peer.tick()
    run = worker.request_run_now("slow")
    assert run is not None
    outcome = {}
    with instance_clock_shifted(-3600):
        thread = threading.Thread(target=lambda: outcome.update(results=worker.executor().work_once()))
        thread.start()
        time.sleep(7)                # past the first lease (6 s); renewed every 2 s
        lease = query(peer, f"SELECT lease_expires_at FROM agent.runs WHERE run_id = {run['run_id']}")[0][0]
        report = peer.tick()
        thread.join(30)
    assert lease.replace(tzinfo=UTC) > database_now(peer) - timedelta(seconds=2)
    assert not [r for r in report.expired if r["run_id"] == run["run_id"]]
    assert [r.outcome for r in outcome["results"]] == ["succeeded"], outcome
    (status, lapses), = query(peer, f"SELECT status, lapses FROM agent.runs WHERE run_id = {run['run_id']}")
    assert (status, lapses) == ("succeeded", 0)
    assert query(peer, f"SELECT COUNT(*) FROM agent.attempts WHERE run_id = {run['run_id']}") == [(1,)]


def test_dispatch_an_hour_behind_sends_messages_for_the_databases_slots(db_url):
    queue = MemoryQueue()
    agent = real_agent(db_url, {"m": MINUTELY}, queue=queue)
    with instance_clock_shifted(-3600):
        report = agent.tick()
    assert not report.errors and report.dispatched
    db_now = database_now(agent)
    table = runs_table(agent)
    for run_id, status, lease in query(agent, f"SELECT run_id, status, lease_expires_at FROM {table} "
                                              "WHERE status = 'queued'"):
        lease = lease if isinstance(lease, datetime) else datetime.fromisoformat(lease)
        # The dispatch lease runs from the database's time, not an hour before it.
        assert lease.replace(tzinfo=UTC) > db_now, (run_id, lease, db_now)


def test_the_database_clock_carries_forward_on_the_monotonic_clock(db_url):
    agent = real_agent(db_url)
    clock = agent.database_clock
    first = clock()
    reads = clock.reads
    with instance_clock_shifted(-3600):
        later = clock()
    assert clock.reads == reads                       # no round trip within the resync interval
    assert timedelta(0) <= later - first < timedelta(seconds=5)
    assert abs((later - database_now(agent)).total_seconds()) < 2


def test_a_lone_runner_whose_wall_clock_jumps_back_keeps_ticking_and_running(pg_url):
    """The local runner's timers are monotonic and its time the database's: a wall clock set
    back an hour while it runs stops neither its ticks nor its runs."""
    import threading

    from shared.engine.runner import LocalRunner

    agent = real_agent(pg_url, {"s": {"SCHEDULE": "* * * * * *", "COMMAND": "SELECT 1", "OVERLAP": "allow"}},
                       AGENT_TICK_SCHEDULE="* * * * * *")
    ticks = []
    real_tick = agent.tick
    agent.tick = lambda now=None: ticks.append(time.monotonic()) or real_tick(now)
    runner = LocalRunner(agent, concurrency=2, poll_interval=0.2)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(2.5)
        with instance_clock_shifted(-3600):
            jumped = time.monotonic()
            jumped_at = database_now(agent)
            time.sleep(3.5)
    finally:
        runner.stop()
        thread.join(timeout=30)
    assert len([t for t in ticks if t > jumped]) >= 2, ticks
    started = query(agent, "SELECT COUNT(*) FROM agent.runs WHERE started_at > "
                           f"'{jumped_at.replace(tzinfo=None).isoformat(sep=' ')}' AND status = 'succeeded'")[0][0]
    assert started >= 2
    assert query(agent, "SELECT COUNT(*) FROM agent.runs WHERE status = 'skipped'") == [(0,)]


# ---------------------------------------------------------------- 3. racing ticks


# The command line's `tick`, started at a given instant (Unix time) once its imports are done.
LAUNCH_AT = ("import sys, time; import pyodbc, shared.cli, shared.engine.agent, shared.engine.scheduler, shared.control.store; "
             "time.sleep(max(0.0, float(sys.argv[1]) - time.time())); sys.exit(shared.cli.commands.main(sys.argv[2:]))")


def test_eight_ticks_at_once_over_300_due_jobs_all_succeed(pg_url):
    from tests.support.faults import clean_env

    jobs = {f"j{n:03d}": {"SCHEDULE": "*/20 * * * * *", "COMMAND": "SELECT 1"} for n in range(300)}
    env = clean_env(**{f"JOB__{name}__{key}": value for name, job in jobs.items() for key, value in job.items()})
    agent = real_agent(pg_url, jobs)
    for round_ in range(3):
        # Each process imports everything, then waits for the same instant to run `tick`.
        start = time.time() + 2.5
        processes = [subprocess.Popen([sys.executable, "-c", LAUNCH_AT, str(start), "--db", pg_url, "tick"],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(8)]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in processes]
        for p in processes:
            p.stdout.close()
            p.stderr.close()
        assert [code for code, _ in results] == [0] * 8, [err for code, err in results if code]
        if round_ < 2:
            time.sleep(1.0)
    assert query(agent, "SELECT COUNT(*) FROM (SELECT job_name, scheduled_for FROM agent.runs "
                        "GROUP BY job_name, scheduled_for HAVING COUNT(*) > 1) AS d") == [(0,)]
    (jobs_claimed,), = query(agent, "SELECT COUNT(DISTINCT job_name) FROM agent.runs")
    assert jobs_claimed == 300
    # No slot lost between the first and the last claimed one, per job.
    gaps = query(agent, "SELECT job_name, COUNT(*), MIN(scheduled_for), MAX(scheduled_for) FROM agent.runs "
                        "GROUP BY job_name")
    for name, count, low, high in gaps:
        assert count == int((high - low).total_seconds() // 20) + 1, (name, count, low, high)


def test_a_real_deadlock_victim_is_a_lock_conflict_and_the_step_runs_again(pg_url):
    """PostgreSQL's own deadlock error (40P01 through psqlODBC) is recognised as a lost lock
    race, and a tick step that met it runs again and succeeds."""
    import threading

    import pyodbc

    from shared.control.sqlerrors import is_lock_conflict
    from shared.engine.scheduler import Scheduler, TickReport

    agent = real_agent(pg_url)
    setup = pyodbc.connect(pg_url, autocommit=True)
    setup.execute("CREATE TABLE dl (k INT PRIMARY KEY, v INT)")
    setup.execute("INSERT INTO dl VALUES (1, 0), (2, 0)")
    barrier = threading.Barrier(2)
    errors = []

    def cross(first: int, second: int) -> None:
        connection = pyodbc.connect(pg_url, autocommit=False)
        try:
            connection.execute(f"UPDATE dl SET v = v + 1 WHERE k = {first}")
            barrier.wait(10)
            connection.execute(f"UPDATE dl SET v = v + 1 WHERE k = {second}")
            connection.commit()
        except pyodbc.Error as exc:
            errors.append(exc)
            connection.rollback()
        finally:
            connection.close()

    threads = [threading.Thread(target=cross, args=pair) for pair in ((1, 2), (2, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    setup.close()
    assert len(errors) == 1 and is_lock_conflict(errors[0]), errors
    assert not is_lock_conflict(pyodbc.ProgrammingError("42601", "[42601] ERROR: syntax error at or near"))

    calls = []

    def step(now, report):
        calls.append(now)
        if len(calls) < 3:
            raise errors[0]

    scheduler = Scheduler(agent.store(), None, agent.settings, agent.telemetry)
    report = TickReport(now=datetime.now(UTC))
    scheduler._run_step(step, report.now, report)
    assert len(calls) == 3 and report.lock_retries == 2
