"""No-op throughput side by side with procrastinate, the best Python task queue on PostgreSQL,
and with the ceiling of any queue on the same PostgreSQL through the same driver: 1,000 no-op
tasks at concurrency 1 and 4, alternating (a 2-core machine is noisy: the ratio between
neighbouring runs is the figure, not an absolute rate; the load average is printed beside each
repeat), plus the database round trips and bytes per task, counted by a wrapper around the
driver, on the local runner's path and on the queue trigger's.

    .venv/bin/python bench/bench_vs_procrastinate.py [--tasks 1000] [--concurrency 1,4] [--repeats 3]

Beside each pair, the ceilings: a loop of C threads, each with one psqlODBC connection (the
agent's options), taking tasks from a table with FOR UPDATE SKIP LOCKED and finishing them, in
one round trip per task (one PL/pgSQL call that claims and finishes) and in two (a claim call,
then a finish call). No queue runs faster than the first on this database and driver; the second
is what a claim and a fenced completion cost with nothing else.

procrastinate runs in its own virtual environment (.bench-venv, or $BENCH_VENV, created and
filled from bench/requirements-procrastinate.txt on first use). Targets (issue 35): the agent at >= 2x
procrastinate at concurrency 1 and >= 3x at 4 (median of at least three alternating pairs), and
>= 0.5 of the two-round-trip ceiling; at most 3 round trips per task on either path (2 on the
local runner's, whose completion claims the worker's next run)
(tests/integration/test_round_trip_budget.py holds the budget in the test suite).
"""

from __future__ import annotations

import argparse
import os
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

from tests.support.round_trips import Tally, count_connections  # noqa: E402

UTC = timezone.utc
PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"
# BENCH_VENV: where procrastinate's virtual environment is (made on first use), e.g. outside the repo.
VENV = Path(os.environ.get("BENCH_VENV") or ROOT / ".bench-venv")


def peer_python() -> Path:
    python = VENV / "bin" / "python"
    if not python.exists():
        print(f"bench: creating {VENV} with procrastinate (first run only)", file=sys.stderr)
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


# ---------------------------------------------------------------- the ceilings

CEILING_SCHEMA = """
CREATE TABLE public.ceiling_tasks (id BIGSERIAL PRIMARY KEY, status TEXT NOT NULL DEFAULT 'todo', done_at TIMESTAMP);
CREATE INDEX ceiling_todo ON public.ceiling_tasks (id) WHERE status = 'todo';
CREATE FUNCTION public.ceiling_claim() RETURNS bigint LANGUAGE sql AS $$
    UPDATE public.ceiling_tasks SET status = 'doing'
    WHERE id = (SELECT id FROM public.ceiling_tasks WHERE status = 'todo' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING id $$;
CREATE FUNCTION public.ceiling_finish(p_id bigint) RETURNS bigint LANGUAGE sql AS $$
    UPDATE public.ceiling_tasks SET status = 'done', done_at = now() WHERE id = p_id AND status = 'doing' RETURNING id $$;
CREATE FUNCTION public.ceiling_claim_and_finish() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE v_id bigint;
BEGIN
    v_id := public.ceiling_claim();
    IF v_id IS NOT NULL THEN PERFORM public.ceiling_finish(v_id); END IF;
    RETURN v_id;
END $$;
"""


def ceiling_run(tasks: int, concurrency: int, round_trips: int) -> float:
    """Seconds for C threads to take and finish ``tasks`` tasks, one or two round trips each."""
    import pyodbc

    from shared.control.connection_strings import with_postgres_defaults

    db = Database()
    try:
        odbc = with_postgres_defaults(db.odbc)
        setup = pyodbc.connect(odbc, autocommit=True)
        cursor = setup.cursor()
        cursor.execute(CEILING_SCHEMA)
        cursor.execute("INSERT INTO public.ceiling_tasks (status) SELECT 'todo' FROM generate_series(1, ?)", tasks)
        setup.close()
        connections = [pyodbc.connect(odbc, autocommit=True) for _ in range(concurrency)]
        done = [0] * concurrency

        def loop(index: int) -> None:
            cursor = connections[index].cursor()
            while True:
                if round_trips == 1:
                    claimed = cursor.execute("SELECT public.ceiling_claim_and_finish()").fetchone()[0]
                else:
                    claimed = cursor.execute("SELECT public.ceiling_claim()").fetchone()[0]
                    if claimed is not None:
                        cursor.execute("SELECT public.ceiling_finish(?)", claimed).fetchone()
                if claimed is None:
                    return
                done[index] += 1

        threads = [threading.Thread(target=loop, args=(i,)) for i in range(concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        for connection in connections:
            connection.close()
        assert sum(done) == tasks, (sum(done), tasks)
        return elapsed
    finally:
        db.drop()


# ---------------------------------------------------------------- counting round trips


def count_round_trips(tasks: int, concurrency: int) -> None:
    """Per task, on each path: every execute, commit and rollback the engine asks of the driver
    (one round trip each with the agent's psqlODBC options), and the bytes of SQL and parameters.
    The wrapper forwards every other attribute to the driver, writes included: autocommit too."""
    from shared.engine.dispatch import dispatch
    from shared.engine.runner import LocalRunner
    from shared.messaging.memory import MemoryQueue

    for path in ("local runner (claims from agent.runs)", "queue trigger (one message per run)"):
        db = Database()
        try:
            queue = MemoryQueue() if path.startswith("queue") else None
            agent = agent_on(db, concurrency, AGENT_POLL_SECONDS="300", **({"_queue": queue} if queue else {}))
            insert_tasks(agent, tasks)
            if queue is not None:
                dispatch(agent.store(), queue, agent.settings, agent.clock(), agent.telemetry)
            tally = Tally()
            count_connections(agent, tally)
            runner = LocalRunner(agent, concurrency=concurrency, visibility_timeout=0)
            done = runner.work_until_idle()
            # Each worker's last look finds nothing: one claim (direct mode), or none (an empty queue).
            idle = concurrency if queue is None else 0
            print(f"  {path}, concurrency {concurrency}: {done} tasks; per task "
                  f"{(tally.round_trips - idle) / done:.2f} round trips ({(tally.executes - idle) / done:.2f} executes, "
                  f"{tally.commits / done:.2f} commits, {tally.rollbacks / done:.2f} rollbacks), "
                  f"{tally.bytes_sent / done / 1000:.2f} KB; {tally.connections} connections for {concurrency} workers")
            agent.close()
        finally:
            db.drop()


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (5 min {five:.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    python = peer_python()
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"== {args.tasks} no-op tasks: the agent (local runner, PostgreSQL through pyodbc), procrastinate 3.10 "
          f"(psycopg 3) and the ceilings (one and two round trips a task, pyodbc), alternating; tasks/s; "
          f"{os.cpu_count()} CPUs, {load()}")
    kinds = ("agent", "procrastinate", "ceiling 1 rt", "ceiling 2 rt")
    rates: dict[int, dict[str, list[float]]] = {c: {k: [] for k in kinds} for c in levels}
    ratios: dict[int, dict[str, list[float]]] = {c: {"procrastinate": [], "ceiling 2 rt": []} for c in levels}
    for repeat in range(args.repeats):
        for concurrency in levels:
            runs = {"procrastinate": lambda: peer_run(python, args.tasks, concurrency),
                    "agent": lambda: agent_run(args.tasks, concurrency),
                    "ceiling 2 rt": lambda: ceiling_run(args.tasks, concurrency, 2),
                    "ceiling 1 rt": lambda: ceiling_run(args.tasks, concurrency, 1)}
            order = list(runs) if repeat % 2 == 0 else list(reversed(runs))   # alternate who goes first
            measured = {kind: args.tasks / runs[kind]() for kind in order}
            for kind, rate in measured.items():
                rates[concurrency][kind].append(rate)
            for peer in ratios[concurrency]:
                ratios[concurrency][peer].append(measured["agent"] / measured[peer])
            print(f"  repeat {repeat + 1}, concurrency {concurrency}: "
                  + "   ".join(f"{kind} {measured[kind]:6.0f}/s" for kind in kinds)
                  + f"   agent/procrastinate {measured['agent'] / measured['procrastinate']:.2f}"
                  + f"   agent/ceiling 2 rt {measured['agent'] / measured['ceiling 2 rt']:.2f}   {load()}")
    for concurrency in levels:
        print(f"== concurrency {concurrency}, medians: "
              + ", ".join(f"{kind} {statistics.median(rates[concurrency][kind]):.0f}/s" for kind in kinds)
              + "; agent/procrastinate "
              + f"{statistics.median(ratios[concurrency]['procrastinate']):.2f}, agent/ceiling 2 rt "
              + f"{statistics.median(ratios[concurrency]['ceiling 2 rt']):.2f}")
    print("== database round trips and bytes per task (a counting wrapper around the driver)")
    for concurrency in levels:
        count_round_trips(min(args.tasks, 400), concurrency)


if __name__ == "__main__":
    main()
