"""A connection budget (issue 22, item 4), on a real PostgreSQL.

The server's max_connections is never touched: each test creates a scratch login role with
``ALTER ROLE ... CONNECTION LIMIT n`` (PostgreSQL refuses the role's connection n+1 with "too
many connections for role", as a full server answers "too many clients"), runs the agent as that
role, and drops it afterwards.

* ``work --until-idle --concurrency 40`` with AGENT_MAX_CONNECTIONS below the role's limit: every
  run succeeds, the process never holds more than its cap (sampled in pg_stat_activity), another
  client of the same role can still connect meanwhile, and the process exits.
* the role's limit below what the process wants: the server refuses some of its connections;
  it pauses, works on the connections it has, finishes every run and exits.
* connections are opened when there is work: an agent and its runner hold none before work,
  none after the pool's idle time, and the monitor's stores hold none between requests.
* ``doctor`` warns when AGENT_MAX_CONNECTIONS x processes exceeds what the server allows the role.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest

from shared.control.connection_strings import build_connection_string, odbc_pairs
from tests.support.harness import PG_BASE, ROOT, job_env, make_agent, pg_admin_connection

JOBS = 40
YEARLY = "0 0 0 1 1 *"     # never due during the test: runs come from run-now


def _admin_on(database_url: str):
    import pyodbc

    return pyodbc.connect(database_url, autocommit=True, timeout=5)


@pytest.fixture
def capped_role(pg_url):
    """(make, sessions): ``make(limit)`` creates a login role with CONNECTION LIMIT ``limit`` owning
    the test database's agent schema, and returns its connection string; ``sessions()`` counts its
    connections now. The role is dropped afterwards."""
    role = f"agent_cap_{uuid.uuid4().hex[:10]}"
    password = uuid.uuid4().hex
    database = odbc_pairs(pg_url)["database"]
    admin = pg_admin_connection()
    created = []

    def make(limit: int) -> str:
        cursor = admin.cursor()
        # The migrations create the cluster's agent_operator role when it is missing: created here
        # by the administrator, so the scratch role (CREATEROLE only to pass that statement)
        # never owns a role of the cluster and drops cleanly.
        cursor.execute("DO $$ BEGIN CREATE ROLE agent_operator NOLOGIN; "
                       "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$")
        cursor.execute(f"CREATE ROLE {role} LOGIN CREATEROLE CONNECTION LIMIT {int(limit)} PASSWORD '{password}'")
        cursor.execute(f"GRANT ALL ON DATABASE {database} TO {role}")
        created.append(role)
        # The server and options of AGENT_TEST_PG, as the scratch role (with a password, for a
        # server that asks for one).
        return build_connection_string(PG_BASE, "postgres", [("Uid", role), ("Pwd", password),
                                                             ("Database", database)])

    def sessions() -> int:
        cursor = admin.cursor()
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = ?", role)
        return int(cursor.fetchone()[0])

    try:
        yield make, sessions
    finally:
        if created:
            cursor = admin.cursor()
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ?", role)
            with _admin_on(pg_url) as owner:
                owner.cursor().execute(f"REASSIGN OWNED BY {role} TO CURRENT_USER; DROP OWNED BY {role}")
            cursor.execute(f"DROP ROLE IF EXISTS {role}")
        admin.close()


def _jobs() -> dict[str, dict[str, str]]:
    return {f"j{i:02d}": {"SCHEDULE": YEARLY, "COMMAND": "SELECT 1"} for i in range(JOBS)}


def _prepare(url: str) -> None:
    """The schema (owned by the role), the jobs synced, one run-now run per job due now."""
    agent = make_agent(url, _jobs(), simulated_time=False, AGENT_MAX_CONNECTIONS="3", AGENT_MAX_CONCURRENCY="100")
    try:
        report = agent.tick()
        assert not report.errors, report.errors
        for name in _jobs():
            assert agent.request_run_now(name) is not None
    finally:
        agent.close()


def _settled(sessions, seconds: float = 5.0) -> int:
    """The role's sessions once the ones just closed are gone: PostgreSQL ends a backend after
    its client disconnected, not before close() returns (a loaded machine shows the lag)."""
    deadline = time.monotonic() + seconds
    while (count := sessions()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def _statuses(url: str) -> dict[str, int]:
    with _admin_on(url) as connection:
        cursor = connection.cursor()
        cursor.execute("SELECT status, count(*) FROM agent.runs GROUP BY status")
        return {status: int(count) for status, count in cursor.fetchall()}


def _work(url: str, cap: int, sessions, *, probe_url: str | None = None, budget: float = 40.0):
    """``work --until-idle --concurrency 40`` as the role; samples the role's sessions every 20 ms
    while it runs. Returns (result, most sessions seen, whether the probe connection got in)."""
    from tests.support.faults import clean_env

    env = clean_env(**job_env(_jobs(), AGENT_MAX_CONNECTIONS=str(cap), AGENT_MAX_CONCURRENCY="100",
                              AGENT_CONNECT_RETRY_SECONDS="20"))
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "shared.cli", "--db", url, "work", "--until-idle",
                                "--concurrency", "40", "--max-seconds", "30"],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    most, probed = 0, None
    try:
        while process.poll() is None and time.monotonic() - started < budget:
            most = max(most, sessions())
            if probe_url and probed is None and most >= 1:
                # Another client of the same role, while the process works.
                try:
                    _admin_on(probe_url).close()
                    probed = True
                except Exception as exc:  # noqa: BLE001 - the assertion says what it was
                    probed = exc
            time.sleep(0.02)
        out, err = process.communicate(timeout=max(1.0, budget - (time.monotonic() - started)))
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), most, probed, \
        time.monotonic() - started


def test_forty_workers_stay_within_the_cap_and_leave_room_for_others(capped_role, pg_url):
    make, sessions = capped_role
    url = make(8)
    _prepare(url)
    assert _settled(sessions) == 0
    result, most, probed, seconds = _work(url, 4, sessions, probe_url=url)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"processed {JOBS} run(s)" in result.stdout, (result.stdout, result.stderr[-2000:])
    assert _statuses(pg_url) == {"succeeded": JOBS}
    assert 1 <= most <= 4, most                      # never more than AGENT_MAX_CONNECTIONS
    assert probed is True, probed                    # the role's other clients still got in
    assert "refused" not in result.stderr, result.stderr[-2000:]
    assert _settled(sessions) == 0                   # it exited, its connections with it
    print(f"\n40 workers, AGENT_MAX_CONNECTIONS=4, role limit 8: {JOBS} runs in {seconds:.1f} s, "
          f"at most {most} sessions")


def test_a_role_limit_below_the_cap_refuses_and_the_work_still_finishes(capped_role, pg_url):
    make, sessions = capped_role
    url = make(3)
    _prepare(url)
    # The process wants up to 10 connections; the role allows 3, one of which this test holds.
    held = _admin_on(url)
    try:
        result, most, _, seconds = _work(url, 10, sessions)
    finally:
        held.close()
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"processed {JOBS} run(s)" in result.stdout, (result.stdout, result.stderr[-2000:])
    assert _statuses(pg_url) == {"succeeded": JOBS}
    assert "refused a connection" in result.stderr, result.stderr[-2000:]
    assert most <= 3
    assert seconds < 30, seconds
    print(f"\nrole limit 3 (1 held elsewhere), AGENT_MAX_CONNECTIONS=10: {JOBS} runs in {seconds:.1f} s, "
          f"{result.stderr.count('refused a connection')} refusal(s) logged")


def test_connections_are_opened_for_work_and_closed_when_idle(capped_role, pg_url):
    from shared.engine.runner import LocalRunner
    from shared.web.local_server import StorePool

    make, sessions = capped_role
    url = make(20)
    _prepare(url)
    agent = make_agent(url, _jobs(), simulated_time=False, AGENT_MAX_CONNECTIONS="5")
    try:
        agent.release()
        agent.pool.idle_seconds = 0.3
        time.sleep(0.5)
        runner = LocalRunner(agent, concurrency=30)
        assert sessions() == 0                       # thirty worker threads-to-be, no connection
        assert runner.work_until_idle(max_seconds=30) == JOBS
        assert agent.pool.stats().peak <= 5
        pool = StorePool(agent)
        with pool.lend() as store:
            store.execute("database_time")
        assert pool.connections() == 0               # the monitor's store gave its connection back
        deadline = time.monotonic() + 5
        while sessions() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sessions() == 0                       # the idle ones closed by the reaper
    finally:
        agent.close()


def test_doctor_warns_when_the_cap_times_processes_exceeds_the_roles_limit(capped_role, pg_url):
    from shared.ops.doctor import run_doctor

    make, _ = capped_role
    url = make(12)
    _prepare(url)
    agent = make_agent(url, AGENT_MAX_CONNECTIONS="5")
    try:
        assert not [w for w in run_doctor(agent, processes=2).warnings if "AGENT_MAX_CONNECTIONS" in w]
        warnings = [w for w in run_doctor(agent, processes=3).warnings if "AGENT_MAX_CONNECTIONS" in w]
        assert len(warnings) == 1, warnings
        assert "5 x 3 processes = 15" in warnings[0] and "12" in warnings[0] and "CONNECTION LIMIT" in warnings[0]
    finally:
        agent.close()


# ---------------------------------------------------------------- the pool's rules, on SQLite connections


class _Server:
    """Opens real SQLite connections, refusing beyond ``allowed`` at once as PostgreSQL does
    (the driver's own error shape: pyodbc.Error with SQLSTATE 08001 and the server's text)."""

    def __init__(self, path, allowed: int) -> None:
        self.path, self.allowed, self.open, self.attempts = str(path), allowed, 0, 0
        self.lock = threading.Lock()

    def connect(self):
        import sqlite3

        import pyodbc

        with self.lock:
            self.attempts += 1
            if self.open >= self.allowed:
                raise pyodbc.Error("08001", '[08001] connection to server failed: FATAL:  too many connections '
                                            'for role "agent" (101) (SQLDriverConnect)')
            self.open += 1
        connection = sqlite3.connect(self.path, check_same_thread=False)
        server = self

        class Counted:
            def __getattr__(self, name):
                return getattr(connection, name)

            def close(self):
                with server.lock:
                    server.open -= 1
                connection.close()

        return Counted()


def test_the_reserved_shares_stay_available_when_work_holds_its_whole_share(tmp_path):
    from shared.control.pool import ConnectionPool
    from shared.errors import PoolTimeout

    server = _Server(tmp_path / "x.db", allowed=100)
    pool = ConnectionPool(server.connect, 4)
    work = [pool.take("work"), pool.take("work")]              # the whole work share (4 - 2)
    with pytest.raises(PoolTimeout, match="all 2 of this process's work connections"):
        pool.take("work", wait_seconds=0.2)
    lease, clock = pool.take("lease"), pool.take("clock")      # never waits for the workers
    assert server.open == 4 and pool.stats().peak == 4
    pool.give("work", work.pop())
    assert pool.take("work", wait_seconds=0.2) is not None    # the one given back
    for kind, connection in (("lease", lease), ("clock", clock)):
        pool.discard(kind, connection)
    pool.close()


def test_a_refusal_pauses_opening_and_a_reserved_share_gets_room(tmp_path):
    from shared.control.pool import ConnectionPool

    server = _Server(tmp_path / "x.db", allowed=2)
    pool = ConnectionPool(server.connect, 6, retry_seconds=5)
    first, second = pool.take("work"), pool.take("work")
    pool.give("work", second)                                  # idle, still open on the server
    started = time.monotonic()
    lease = pool.take("lease")                                 # refused: the idle work one is closed for it
    assert time.monotonic() - started < 1.0 and pool.refusals == 1 and server.open == 2
    waiter = threading.Thread(target=lambda: pool.give("work", pool.take("work")))
    waiter.start()                                             # refused again, paused: waits for a return
    time.sleep(0.3)
    assert waiter.is_alive() and server.attempts <= 5
    pool.give("work", first)
    waiter.join(5)
    assert not waiter.is_alive() and server.open == 2
    pool.discard("lease", lease)
    pool.close()
    assert server.open == 0


def test_idle_connections_close_after_the_idle_time(tmp_path):
    from shared.control.pool import ConnectionPool

    server = _Server(tmp_path / "x.db", allowed=100)
    pool = ConnectionPool(server.connect, 5, idle_seconds=0.2)
    taken = [pool.take("work") for _ in range(3)]
    for connection in taken:
        pool.give("work", connection)
    assert server.open == 3
    deadline = time.monotonic() + 3
    while server.open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.open == 0 and pool.stats().open == 0


def test_the_reaper_sleeps_through_connections_given_back(tmp_path):
    """Issue 35: the reaper slept on the takers' condition, so every connection given back (two
    a run) woke it, a second thread and a GIL handoff per run. It wakes when the oldest idle
    connection ages out, when idle_seconds is lowered, or when the pool closes."""
    from shared.control.pool import ConnectionPool

    server = _Server(tmp_path / "x.db", allowed=100)
    pool = ConnectionPool(server.connect, 5, idle_seconds=60)
    waits = []
    sleep = pool._reaper_wake.wait

    def counted(timeout=None):
        waits.append(timeout)
        return sleep(timeout)

    pool._reaper_wake.wait = counted
    for _ in range(300):
        pool.give("work", pool.take("work"))
        time.sleep(0.0005)                            # a run's work: other threads get to run
    time.sleep(0.2)
    assert 1 <= len(waits) <= 2, len(waits)          # the first look, at most one more
    assert server.open == 1
    pool.idle_seconds = 0.1                           # lowered: it looks again, and closes it
    deadline = time.monotonic() + 3
    while server.open and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.open == 0
    pool.close()


def test_a_connection_given_back_inside_a_transaction_is_closed_not_lent_again(db_url):
    """Issue 35: a connection handed back with a transaction open (a bug: here, PostgreSQL's
    autocommit left off, or SQLite's BEGIN left open) holding the start lock would be lent to the
    next worker, which would run inside that transaction, and every other worker would wait for the
    lock (30 s, the bench's "lock timeout" lines). The pool closes it instead: the server rolls
    back, the lock is free at once, and the next taker gets a connection with no transaction."""
    agent = make_agent(db_url)
    pool = agent.pool
    postgres = agent.target.dialect == "postgres"
    try:
        leaked = pool.take("work")
        idle = pool.stats().idle
        if postgres:
            leaked.autocommit = False
            leaked.cursor().execute("LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE")
        else:
            leaked.execute("BEGIN IMMEDIATE")
            leaked.execute("UPDATE agent_start_lock SET lock_id = lock_id")
        pool.give("work", leaked)
        assert pool.refused_back == 1 and pool.stats().idle == idle           # closed, not kept
        taken = pool.take("work")
        assert taken is not leaked
        # The lock the leaked transaction held is free: another connection takes it at once.
        if postgres:
            taken.autocommit = False
            cursor = taken.cursor()
            cursor.execute("SET LOCAL lock_timeout = '2s'")
            cursor.execute("LOCK TABLE agent.start_lock IN SHARE ROW EXCLUSIVE MODE")
            taken.rollback()
            taken.autocommit = True
        else:
            taken.execute("PRAGMA busy_timeout = 2000")
            taken.execute("BEGIN IMMEDIATE")
            taken.execute("UPDATE agent_start_lock SET lock_id = lock_id")
            taken.execute("ROLLBACK")
            taken.execute("PRAGMA busy_timeout = 30000")
        idle = pool.stats().idle
        pool.give("work", taken)
        assert pool.refused_back == 1 and pool.stats().idle == idle + 1      # a clean one goes back as ever
    finally:
        agent.close()
