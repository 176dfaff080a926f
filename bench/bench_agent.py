"""Benchmarks (figures, not pass/fail): tick time and statements per tick for 100, 1,000
and 10,000 jobs on SQLite and PostgreSQL; no-op task throughput of the local runner; cold
import of function_app.

    .venv/bin/python bench/bench_agent.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--sizes 100,1000,10000]

Targets on a 2-core machine: statements per tick constant in the job count; a 10,000-job
tick under 250 ms on PostgreSQL; cold import under 300 ms.
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


def agent_for(db: str, jobs: int, *, spread: bool = False, **settings: str) -> Agent:
    """``jobs`` hourly jobs: all at minute 0 (every job due in the same tick), or spread over
    the 60 minutes of the hour (a typical tick claims a sixtieth of them)."""
    env = {"AGENT_MAX_CONCURRENCY": "10000", "AGENT_DISPATCH_LEASE_SECONDS": "86400", **settings}
    for i in range(jobs):
        env[f"JOB__job{i:05d}__SCHEDULE"] = f"0 {i % 60 if spread else 0} * * * *"
        env[f"JOB__job{i:05d}__COMMAND"] = "SELECT 1"
    agent = Agent(load_settings(environ=env), db=db)
    agent.init()
    return agent


class Databases:
    def __init__(self, pg: str | None) -> None:
        self.pg = pg
        self.tmp = tempfile.TemporaryDirectory()
        self.created: list[str] = []

    def new(self, dialect: str) -> str:
        if dialect == "sqlite":
            return f"sqlite:///{self.tmp.name}/{uuid.uuid4().hex}.db"
        import pyodbc

        name = f"agent_bench_{uuid.uuid4().hex[:10]}"
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
        self.tmp.cleanup()


def bench_ticks(dbs: Databases, dialect: str, sizes: list[int]) -> None:
    print(f"\n== tick, {dialect}: jobs configured; 'all due' = every job due in the same tick (claim + advance +"
          f" dispatch + enqueue of each); 'typical' = hourly jobs spread over the hour (1/60 due per tick);"
          f" 'idle' = nothing due")
    print(f"{'jobs':>7} {'all due ms':>11} {'stmts':>6} {'typical ms':>11} {'stmts':>6} {'idle ms':>8} {'stmts':>6}")
    base = datetime(2030, 1, 1, 12, 40, tzinfo=UTC)
    for size in sizes:
        agent = agent_for(dbs.new(dialect), size)
        agent.tick(base)                                           # sync settings (once per change)
        due = agent.tick(base + timedelta(minutes=20, seconds=5))   # 13:00:05: every job due
        assert len(due.claimed) == size, (len(due.claimed), due.errors)
        idle = [agent.tick(base + timedelta(minutes=20, seconds=10 + i)) for i in range(5)]
        agent.close()
        spread = agent_for(dbs.new(dialect), size, spread=True)
        spread.tick(base)
        typical = [spread.tick(base + timedelta(minutes=m, seconds=5)) for m in range(1, 11)]
        assert sum(len(r.claimed) for r in typical) > 0
        spread.close()
        print(f"{size:>7} {due.duration_ms:>11.1f} {due.statements:>6} "
              f"{statistics.median(r.duration_ms for r in typical):>11.1f} {typical[0].statements:>6} "
              f"{statistics.median(r.duration_ms for r in idle):>8.1f} {idle[0].statements:>6}")


def bench_throughput(dbs: Databases, dialect: str, tasks: int, concurrency: int) -> None:
    agent = agent_for(dbs.new(dialect), 0)
    store = agent.store()
    now = datetime.now(UTC)
    for _ in range(tasks):
        store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None, max_attempts=1,
                      timeout_seconds=60, lease_seconds=60, now=now, operation_id=uuid.uuid4().hex)
    runner = LocalRunner(agent, concurrency=concurrency, visibility_timeout=0)
    started = time.perf_counter()
    done = 0
    while done < tasks:
        agent.tick()
        done += runner.work_until_idle()
    elapsed = time.perf_counter() - started
    print(f"\n== local runner, {dialect}: {tasks} no-op tasks, concurrency {concurrency}: "
          f"{elapsed:.2f} s, {tasks / elapsed:.0f} tasks/s")
    agent.close()


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
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    dbs = Databases(args.pg or None)
    try:
        dialects = ["sqlite"] + (["postgres"] if args.pg else [])
        for dialect in dialects:
            bench_ticks(dbs, dialect, sizes)
        for dialect in dialects:
            bench_throughput(dbs, dialect, args.tasks, args.concurrency)
        bench_cold_import()
    finally:
        dbs.close()


if __name__ == "__main__":
    main()
