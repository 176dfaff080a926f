"""Benchmarks (figures, not pass/fail) on SQLite and PostgreSQL:

* tick time and statements per tick for 100, 1,000 and 10,000 jobs;
* slot-to-start lateness of second-level schedules under the local runner (p50, p99);
* drain time of 1,000 runs due at once under caps of 8 and 32, after a single tick;
* a 10-level chain of ordered tasks, with no tick at all;
* cold import of function_app;
* with --mssql (a T-SQL server: SQL Server, Azure SQL or Babelfish for PostgreSQL), the local
  runner's no-op throughput there beside PostgreSQL (--noop-only: that figure alone).

    .venv/bin/python bench/bench_agent.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--sizes 100,1000,10000]
    .venv/bin/python bench/bench_agent.py --noop-only --mssql "Driver={FreeTDS};Server=127.0.0.1;Port=1433;Uid=...;Pwd=...;"

Throughput against procrastinate is bench/bench_vs_procrastinate.py. Targets on a 2-core
machine: statements per tick constant in the job count; a 10,000-job tick under 250 ms on
PostgreSQL; slots started within 2 s (p99); cold import under 300 ms.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.agent import Agent  # noqa: E402
from shared.config import load_settings  # noqa: E402
from shared.runner import LocalRunner  # noqa: E402

UTC = timezone.utc
DEFAULT_PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"


class Clock:
    """The bench's own clock: the agent and its ticks follow it (a simulated hour)."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def agent_for(db: str, jobs: int, *, spread: bool = False, clock=None, queue=None, **settings: str) -> Agent:
    """``jobs`` hourly jobs: all at minute 0 (every job due in the same tick), or spread over
    the 60 minutes of the hour (a typical tick claims a sixtieth of them)."""
    env = {"AGENT_MAX_CONCURRENCY": "10000", "AGENT_DISPATCH_LEASE_SECONDS": "86400", **settings}
    for i in range(jobs):
        env[f"JOB__job{i:05d}__SCHEDULE"] = f"0 {i % 60 if spread else 0} * * * *"
        env[f"JOB__job{i:05d}__COMMAND"] = "SELECT 1"
    agent = Agent(load_settings(environ=env), db=db, clock=clock, queue=queue)
    agent.init()
    return agent


class Databases:
    def __init__(self, pg: str | None, mssql: str | None = None) -> None:
        self.pg = pg
        self.mssql = mssql
        self.tmp = tempfile.TemporaryDirectory()
        self.created: list[str] = []
        self.created_mssql: list[str] = []

    def new(self, dialect: str) -> str:
        if dialect == "sqlite":
            return f"sqlite:///{self.tmp.name}/{uuid.uuid4().hex}.db"
        import pyodbc

        name = f"agent_bench_{uuid.uuid4().hex[:10]}"
        if dialect == "mssql":
            base = self.mssql if self.mssql.rstrip().endswith(";") else self.mssql + ";"
            admin = pyodbc.connect(base + "Database=master;", autocommit=True)
            admin.cursor().execute(f"CREATE DATABASE [{name}]")
            admin.close()
            self.created_mssql.append(name)
            return f"{base}Database={name};"
        admin = pyodbc.connect(self.pg + "Database=postgres;", autocommit=True)
        admin.cursor().execute(f"CREATE DATABASE {name}")
        admin.close()
        self.created.append(name)
        return f"{self.pg}Database={name};"

    def close(self) -> None:
        if self.created:
            import pyodbc

            admin = pyodbc.connect(self.pg + "Database=postgres;", autocommit=True)
            for name in self.created:
                admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            admin.close()
        if self.created_mssql:
            import pyodbc

            base = self.mssql if self.mssql.rstrip().endswith(";") else self.mssql + ";"
            admin = pyodbc.connect(base + "Database=master;", autocommit=True)
            for name in self.created_mssql:
                admin.cursor().execute(f"IF DB_ID(N'{name}') IS NOT NULL DROP DATABASE [{name}]")
            admin.close()
        self.tmp.cleanup()


def bench_ticks(dbs: Databases, dialect: str, sizes: list[int]) -> None:
    from tests.memory_queue import MemoryQueue

    print(f"\n== tick, {dialect} (queue mode: the tick dispatches): jobs configured; 'all due' = every job due in "
          f"the same tick (claim + advance + dispatch + send of each); 'typical' = hourly jobs spread over the hour "
          f"(1/60 due per tick); 'idle' = nothing due")
    print(f"{'jobs':>7} {'all due ms':>11} {'stmts':>6} {'typical ms':>11} {'stmts':>6} {'idle ms':>8} {'stmts':>6}")
    base = datetime(2030, 1, 1, 12, 40, tzinfo=UTC)
    for size in sizes:
        clock = Clock(base)
        agent = agent_for(dbs.new(dialect), size, clock=clock, queue=MemoryQueue(), AGENT_POLL_SECONDS="300")
        agent.tick()                                               # sync settings (once per change)
        clock.now = base + timedelta(minutes=20, seconds=5)        # 13:00:05: every job due
        due = agent.tick()
        assert len(due.claimed) == size, (len(due.claimed), due.errors)
        idle = []
        for i in range(5):
            clock.now = base + timedelta(minutes=20, seconds=10 + i)
            idle.append(agent.tick())
        agent.close()
        clock = Clock(base)
        spread = agent_for(dbs.new(dialect), size, spread=True, clock=clock, queue=MemoryQueue(),
                           AGENT_POLL_SECONDS="300")
        spread.tick()
        typical = []
        for minute in range(1, 11):
            clock.now = base + timedelta(minutes=minute, seconds=5)
            typical.append(spread.tick())
        assert sum(len(r.claimed) for r in typical) > 0
        spread.close()
        print(f"{size:>7} {due.duration_ms:>11.1f} {due.statements:>6} "
              f"{statistics.median(r.duration_ms for r in typical):>11.1f} {typical[0].statements:>6} "
              f"{statistics.median(r.duration_ms for r in idle):>8.1f} {idle[0].statements:>6}")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def bench_lateness(dbs: Databases, dialect: str, seconds: int = 40) -> None:
    """Ten jobs on `* * * * * *` and `*/5` schedules under the local runner, the tick at its
    default minute: how late each slot starts."""
    import threading

    env = {f"JOB__every{i}__SCHEDULE": "* * * * * *" if i < 5 else "*/5 * * * * *" for i in range(10)}
    env.update({f"JOB__every{i}__COMMAND": "SELECT 1" for i in range(10)})
    env.update({f"JOB__every{i}__OVERLAP": "allow" for i in range(10)})
    agent = Agent(load_settings(environ={"AGENT_MAX_CONCURRENCY": "8", **env}), db=dbs.new(dialect))
    agent.init()
    runner = LocalRunner(agent, concurrency=4)
    thread = threading.Thread(target=runner.run, daemon=True)
    started = datetime.now(UTC)
    thread.start()
    time.sleep(seconds)
    runner.stop()
    thread.join(timeout=30)
    rows = agent.store().execute("list_history", job_name=None, limit=100000).rows
    lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() for r in rows
                if r["started_at"] is not None and r["scheduled_for"] > started + timedelta(seconds=2)]
    skipped = sum(1 for r in rows if r["status"] == "skipped")
    print(f"\n== slot-to-start lateness, {dialect}, local runner (4 workers), 5 jobs every second + 5 every 5 s, "
          f"{seconds} s: {len(lateness)} runs; p50 {_percentile(lateness, 0.5) * 1000:.0f} ms, "
          f"p99 {_percentile(lateness, 0.99) * 1000:.0f} ms, max {max(lateness) * 1000:.0f} ms; "
          f"never early: {min(lateness) >= 0}; {skipped} skipped")
    agent.close()


def bench_drain(dbs: Databases, dialect: str, runs: int = 1000) -> None:
    for cap in (8, 32):
        clock = Clock(datetime(2030, 1, 1, 12, 30, tzinfo=UTC))
        agent = agent_for(dbs.new(dialect), runs, clock=clock, AGENT_MAX_CONCURRENCY=str(cap))
        agent.tick()
        clock.now = datetime(2030, 1, 1, 13, 0, 1, tzinfo=UTC)
        agent.tick()                                               # the only tick: claims every run
        runner = LocalRunner(agent, concurrency=cap)
        started = time.perf_counter()
        done = runner.work_until_idle()
        elapsed = time.perf_counter() - started
        print(f"\n== drain, {dialect}: {runs} runs due at once, AGENT_MAX_CONCURRENCY={cap} ({cap} workers), one tick: "
              f"{done} done in {elapsed:.2f} s ({done / elapsed:.0f} runs/s)")
        agent.close()


def bench_order_chain(dbs: Databases, dialect: str, levels: int = 10) -> None:
    agent = agent_for(dbs.new(dialect), 0, AGENT_MAX_CONCURRENCY="8")
    store = agent.store()
    clock_sql = "strftime('%Y-%m-%d %H:%M:%f', 'now')" if dialect == "sqlite" else "CAST(clock_timestamp() AS VARCHAR)"
    with store.transaction():
        store.run_script("CREATE TABLE chain (level INT, at VARCHAR(40))")
    now = datetime.now(UTC)
    for level in range(levels, 0, -1):
        store.execute("insert_task", command=f"INSERT INTO chain (level, at) VALUES ({level}, {clock_sql})",
                      target_database=None, task_order=level, max_attempts=1, timeout_seconds=60, lease_seconds=60,
                      now=now, operation_id=uuid.uuid4().hex)
    runner = LocalRunner(agent, concurrency=4)
    started = time.perf_counter()
    done = runner.work_until_idle()
    elapsed = time.perf_counter() - started
    cursor = store.connection.cursor()
    cursor.execute("SELECT level FROM chain ORDER BY at")
    order = [row[0] for row in cursor.fetchall()]
    print(f"\n== order chain, {dialect}: {levels} levels, no tick: {done} tasks in {elapsed * 1000:.0f} ms "
          f"({elapsed * 1000 / levels:.1f} ms per level); in order (as the tasks recorded it): "
          f"{order == list(range(1, levels + 1))}")
    agent.close()


def bench_noop(dbs: Databases, dialect: str, tasks: int = 500, concurrency: int = 4) -> float:
    """The local runner's no-op throughput: ``tasks`` tasks of SELECT 1 submitted, then drained
    by ``concurrency`` workers (each start is claim_runs, each end finish_run; no tick). The
    workers' first statements on a new connection are in the figure (Babelfish compiles each
    batch once per connection)."""
    agent = agent_for(dbs.new(dialect), 0, AGENT_MAX_CONCURRENCY=str(concurrency))
    store = agent.store()
    now = datetime.now(UTC)
    for _ in range(tasks):
        store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None, max_attempts=1,
                      timeout_seconds=60, lease_seconds=60, now=now, operation_id=uuid.uuid4().hex)
    runner = LocalRunner(agent, concurrency=concurrency)
    started = time.perf_counter()
    done = runner.work_until_idle(max_seconds=600)
    elapsed = time.perf_counter() - started
    rate = done / elapsed
    print(f"\n== no-op throughput, {dialect}: {done} of {tasks} tasks (SELECT 1) by {concurrency} workers of the "
          f"local runner in {elapsed:.2f} s: {rate:.0f} runs/s")
    agent.close()
    return rate


def bench_cold_import(repeats: int = 5) -> None:
    code = "import time; t = time.perf_counter(); import function_app; print((time.perf_counter() - t) * 1000)"
    figures = [float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                    check=True).stdout) for _ in range(repeats)]
    print(f"\n== cold `import function_app`: median {statistics.median(figures):.0f} ms "
          f"(min {min(figures):.0f}, max {max(figures):.0f}, {repeats} fresh interpreters)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL ODBC string without Database; '' to skip")
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--mssql", default="", help="T-SQL server ODBC string without Database (SQL Server, Azure SQL, "
                                                    "Babelfish); the login creates and drops its databases")
    parser.add_argument("--noop-only", action="store_true", help="only the no-op throughput (PostgreSQL, --mssql)")
    parser.add_argument("--noop-tasks", type=int, default=500)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    dbs = Databases(args.pg or None, args.mssql or None)
    try:
        if args.mssql or args.noop_only:
            rates = {dialect: bench_noop(dbs, dialect, args.noop_tasks)
                     for dialect in (["postgres"] if args.pg else []) + (["mssql"] if args.mssql else [])}
            if len(rates) == 2:
                print(f"\n== no-op throughput ratio, the T-SQL server / PostgreSQL: {rates['mssql'] / rates['postgres']:.2f}")
            if args.noop_only:
                return
        dialects = ["sqlite"] + (["postgres"] if args.pg else [])
        for dialect in dialects:
            bench_ticks(dbs, dialect, sizes)
        for dialect in dialects:
            bench_lateness(dbs, dialect)
            bench_drain(dbs, dialect)
            bench_order_chain(dbs, dialect)
        bench_cold_import()
    finally:
        dbs.close()


if __name__ == "__main__":
    main()
