"""No-op throughput side by side with procrastinate, the best Python task queue on PostgreSQL,
on the same PostgreSQL: 1,000 no-op tasks at concurrency 1, 4 and 8, the two alternating in one
run (a 2-core machine is noisy: the ratio between neighbouring runs is the figure, not an
absolute rate), plus the database round trips and commits per task, counted by a wrapper
around the driver, on the local runner's path and on the queue trigger's.

    .venv/bin/python bench/bench_vs_procrastinate.py [--tasks 1000] [--concurrency 1,4,8] [--repeats 2]

procrastinate runs in its own virtual environment (.bench-venv, created and filled from
bench/requirements-procrastinate.txt on first use). Targets: the agent at >= 1.2x procrastinate
at concurrency 1 and >= 1.5x at 4, throughput growing with concurrency; at most 5 round trips
and 2 commits per task and per message.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

UTC = timezone.utc
PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"
VENV = ROOT / ".bench-venv"


def peer_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print("bench: creating .bench-venv with procrastinate (first run only)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r",
                        str(ROOT / "bench" / "requirements-procrastinate.txt")], check=True)
    return python


class Database:
    def __init__(self) -> None:
        import pyodbc

        self.name = f"bench_{uuid.uuid4().hex[:10]}"
        admin = pyodbc.connect(PG + "Database=postgres;", autocommit=True)
        admin.cursor().execute(f"CREATE DATABASE {self.name}")
        admin.close()
        self.odbc = f"{PG}Database={self.name};"
        self.libpq = f"host=127.0.0.1 port=5432 user=root dbname={self.name}"

    def drop(self) -> None:
        import pyodbc

        admin = pyodbc.connect(PG + "Database=postgres;", autocommit=True)
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        admin.close()


def agent_on(db: Database, concurrency: int, **settings: str):
    from shared.engine.agent import Agent
    from shared.settings import load_settings

    env = {"AGENT_MAX_CONCURRENCY": str(max(concurrency, 8)), **settings}
    agent = Agent(load_settings(environ=env), db=db.odbc, **({"queue": settings.pop("_queue")} if "_queue" in settings else {}))
    agent.init()
    return agent


def insert_tasks(agent, tasks: int) -> None:
    store = agent.store()
    now = datetime.now(UTC)
    with store.transaction():
        for _ in range(tasks):
            store.execute("insert_task", command="SELECT 1", target_database=None, task_order=None,
                          max_attempts=1, timeout_seconds=60, lease_seconds=60, now=now,
                          operation_id=uuid.uuid4().hex)


def agent_run(tasks: int, concurrency: int) -> float:
    from shared.engine.runner import LocalRunner

    db = Database()
    try:
        agent = agent_on(db, concurrency)
        insert_tasks(agent, tasks)
        runner = LocalRunner(agent, concurrency=concurrency)
        started = time.perf_counter()
        done = runner.work_until_idle()
        elapsed = time.perf_counter() - started
        assert done == tasks, (done, tasks)
        agent.close()
        return elapsed
    finally:
        db.drop()


def peer_run(python: Path, tasks: int, concurrency: int) -> float:
    db = Database()
    try:
        out = subprocess.run([str(python), str(ROOT / "bench" / "procrastinate_noop.py"), db.libpq, str(tasks),
                              str(concurrency)], capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        db.drop()


# ---------------------------------------------------------------- counting round trips


class Counter:
    def __init__(self) -> None:
        self.executes = 0
        self.commits = 0
        self.rollbacks = 0
        self.connects = 0
        self.lock = threading.Lock()

    def add(self, field: str) -> None:
        with self.lock:
            setattr(self, field, getattr(self, field) + 1)


def counting_driver(counter: Counter):
    """Wrap pyodbc.connect so every execute (one simple-protocol message with the lean psqlODBC
    options: one round trip), commit and rollback is counted, whoever issues it."""
    import pyodbc

    real_connect = pyodbc.connect

    class Cursor:
        def __init__(self, cursor):
            self._cursor = cursor

        def execute(self, *args, **kwargs):
            counter.add("executes")
            return self._cursor.execute(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self._cursor, name)

    class Connection:
        def __init__(self, connection):
            self._connection = connection

        def cursor(self):
            return Cursor(self._connection.cursor())

        def commit(self):
            counter.add("commits")
            return self._connection.commit()

        def rollback(self):
            counter.add("rollbacks")
            return self._connection.rollback()

        def __getattr__(self, name):
            return getattr(self._connection, name)

    def connect(*args, **kwargs):
        counter.add("connects")
        return Connection(real_connect(*args, **kwargs))

    return real_connect, connect


def count_round_trips(tasks: int, concurrency: int) -> None:
    import pyodbc

    from shared.engine.dispatch import dispatch
    from shared.engine.runner import LocalRunner
    from shared.messaging.memory import MemoryQueue

    for path in ("local runner (claims from agent.runs)", "queue trigger (one message per run)"):
        db = Database()
        counter = Counter()
        real, wrapped = counting_driver(counter)
        try:
            queue = MemoryQueue() if path.startswith("queue") else None
            agent = agent_on(db, concurrency, AGENT_POLL_SECONDS="300", **({"_queue": queue} if queue else {}))
            insert_tasks(agent, tasks)
            if queue is not None:
                dispatch(agent.store(), queue, agent.settings, agent.clock(), agent.telemetry)
            agent.close()
            agent = agent_on(db, concurrency, AGENT_POLL_SECONDS="300", **({"_queue": queue} if queue else {}))
            agent.store()                                 # its setup queries are not a task's
            pyodbc.connect = wrapped
            runner = LocalRunner(agent, concurrency=concurrency, visibility_timeout=0)
            done = runner.work_until_idle()
            pyodbc.connect = real
            idle_checks = concurrency * 2                 # each worker's last empty look, and its idle query
            print(f"  {path}, concurrency {concurrency}: {done} tasks; per task "
                  f"{(counter.executes + counter.commits - idle_checks) / done:.2f} round trips "
                  f"({counter.executes / done:.2f} executes, {counter.commits / done:.2f} commits), "
                  f"{counter.connects} connections opened for {concurrency} workers")
            agent.close()
        finally:
            pyodbc.connect = real
            db.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    python = peer_python()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"== {args.tasks} no-op tasks, the agent (local runner, PostgreSQL through pyodbc) and procrastinate 3.10 "
          f"(psycopg 3), alternating; tasks/s and the ratio agent/procrastinate per pair")
    ratios: dict[int, list[float]] = {c: [] for c in levels}
    rates: dict[int, list[float]] = {c: [] for c in levels}
    for repeat in range(args.repeats):
        for concurrency in levels:
            peer = args.tasks / peer_run(python, args.tasks, concurrency)
            mine = args.tasks / agent_run(args.tasks, concurrency)
            ratios[concurrency].append(mine / peer)
            rates[concurrency].append(mine)
            print(f"  repeat {repeat + 1}, concurrency {concurrency}: agent {mine:7.0f}/s   procrastinate "
                  f"{peer:7.0f}/s   ratio {mine / peer:.2f}")
    print("== median ratio agent/procrastinate: " + ", ".join(
        f"c={c}: {statistics.median(r):.2f}" for c, r in ratios.items()))
    print("== median agent throughput: " + ", ".join(f"c={c}: {statistics.median(r):.0f}/s" for c, r in rates.items()))
    print("== database round trips per task (counting wrapper around pyodbc)")
    for concurrency in (1, 4):
        count_round_trips(min(args.tasks, 400), concurrency)


if __name__ == "__main__":
    main()
