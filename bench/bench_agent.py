"""Benchmarks (figures, not pass/fail) on SQLite and PostgreSQL:

* tick time and statements per tick for 100, 1,000 and 10,000 jobs;
* slot-to-start lateness of second-level schedules under the local runner (p50, p99), direct
  and on the queue path (Azurite, the host's polling back-off);
* drain time of 1,000 runs due at once under caps of 8 and 32, after a single tick;
* a 10-level chain of ordered tasks, with no tick at all;
* the whole `tick` process over 10 and 10,000 jobs from settings (steady state);
* cold import of function_app;
* with --mssql (a T-SQL server: SQL Server, Azure SQL or Babelfish for PostgreSQL), the local
  runner's no-op throughput there beside PostgreSQL (--noop-only: that figure alone);
* a job that follows a job (JOB__b__AFTER=a): from the end of a's run to the start of b's,
  against run-now's from the request to the start, as a ratio (--after-only: that figure alone).

    .venv/bin/python bench/bench_agent.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--sizes 100,1000,10000]
    .venv/bin/python bench/bench_agent.py --after-only
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

from shared.engine.agent import Agent  # noqa: E402
from shared.engine.runner import LocalRunner  # noqa: E402
from shared.settings import load_settings  # noqa: E402

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
    from shared.messaging.memory import MemoryQueue

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


def bench_queue_lateness(dbs: Databases, dialect: str, seconds: int = 30) -> None:
    """Slot-to-start lateness on the queue path (Azurite): the local runner's consumers poll as the
    Functions host does (back-off up to host.json's maxPollingInterval, 2 s), beside consumers that
    idle for AGENT_POLL_SECONDS between polls (what they did before). One job every second, as reported."""
    import dataclasses
    import threading

    sys.path.insert(0, str(ROOT))
    from shared.messaging.port import host_queue_options
    from tests.support.azurite import launched_azurite

    env = {f"JOB__q{i}__SCHEDULE": "* * * * * *" for i in range(1)}
    env.update({f"JOB__q{i}__COMMAND": "SELECT 1" for i in range(1)})
    env.update({f"JOB__q{i}__OVERLAP": "allow" for i in range(1)})
    host = host_queue_options()
    figures = {}
    with launched_azurite() as azurite:
        for label, options in (("host.json back-off (maxPollingInterval 2 s)", host),
                               ("idle consumers waiting AGENT_POLL_SECONDS (10 s) between polls", None)):
            settings = load_settings(environ={"AGENT_MAX_CONCURRENCY": "8", "AGENT_QUEUE_NAME": f"lat{uuid.uuid4().hex[:8]}",
                                              "AzureWebJobsStorage": azurite.connection_string, **env})
            agent = Agent(settings, db=dbs.new(dialect))
            agent.init()
            if options is None:
                options = dataclasses.replace(host, max_polling_interval_seconds=float(settings.agent.poll_seconds))
            runner = LocalRunner(agent, concurrency=4, host_options=options)
            thread = threading.Thread(target=runner.run, daemon=True)
            started = datetime.now(UTC)
            thread.start()
            time.sleep(seconds)
            runner.stop()
            thread.join(timeout=30)
            rows = agent.store().execute("list_history", job_name=None, limit=100000).rows
            lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() for r in rows
                        if r["started_at"] is not None and r["scheduled_for"] > started + timedelta(seconds=3)]
            figures[label] = lateness
            print(f"\n== slot-to-start lateness, {dialect}, queue path on Azurite, local runner (4 workers), "
                  f"{label}, a job every second, {seconds} s: {len(lateness)} runs; "
                  f"p50 {_percentile(lateness, 0.5) * 1000:.0f} ms, p99 {_percentile(lateness, 0.99) * 1000:.0f} ms, "
                  f"max {max(lateness) * 1000:.0f} ms (target p99 under 2,500 ms)")
            agent.close()
    (new, old) = (figures[k] for k in figures)
    print(f"   p99 ratio, before / now: {_percentile(old, 0.99) / max(_percentile(new, 0.99), 1e-6):.1f}x")


def bench_clock_behind(dbs: Databases, dialect: str, seconds: int = 25) -> None:
    """The lateness scenario twice, the second time with this process's wall clock an hour
    behind (shifted in-process, as tests/support/clock_shift.py does): the engine's time is the
    database's, so the figures should match, with no misfire, lapse or doubled slot."""
    import threading

    from tests.support.clock_shift import instance_clock_shifted

    env = {f"JOB__every{i}__SCHEDULE": "* * * * * *" if i < 3 else "*/5 * * * * *" for i in range(6)}
    env.update({f"JOB__every{i}__COMMAND": "SELECT 1" for i in range(6)})
    env.update({f"JOB__every{i}__OVERLAP": "allow" for i in range(6)})
    figures = {}
    for label, shift in (("clock right", 0), ("clock 1 h behind", -3600)):
        agent = Agent(load_settings(environ={"AGENT_MAX_CONCURRENCY": "8", **env}), db=dbs.new(dialect))
        agent.init()
        runner = LocalRunner(agent, concurrency=4)
        with instance_clock_shifted(shift):
            started = agent.clock()
            thread = threading.Thread(target=runner.run, daemon=True)
            thread.start()
            time.sleep(seconds)
            runner.stop()
            thread.join(timeout=30)
        rows = agent.store().execute("list_history", job_name=None, limit=100000).rows
        lateness = [(r["started_at"] - r["scheduled_for"]).total_seconds() for r in rows
                    if r["started_at"] is not None and r["scheduled_for"] > started + timedelta(seconds=2)]
        slots = [(r["job_name"], r["scheduled_for"]) for r in rows]
        figures[label] = {
            "runs": len(lateness), "p50": _percentile(lateness, 0.5) if lateness else float("nan"),
            "p99": _percentile(lateness, 0.99) if lateness else float("nan"),
            "skipped": sum(1 for r in rows if r["status"] == "skipped"),
            "lapses": sum(int(r.get("lapses") or 0) for r in rows),
            "doubled": len(slots) - len(set(slots)),
            "skew": agent.database_clock.instance_skew if agent.database_clock else 0.0,
        }
        agent.close()
    print(f"\n== clock 1 h behind, {dialect}, local runner (4 workers), 3 jobs every second + 3 every 5 s, "
          f"{seconds} s each:")
    for label, f in figures.items():
        print(f"  {label:<17} instance skew {f['skew']:>8.1f} s: {f['runs']} runs, p50 {f['p50'] * 1000:.0f} ms, "
              f"p99 {f['p99'] * 1000:.0f} ms, {f['skipped']} skipped, {f['lapses']} lapses, {f['doubled']} doubled")
    right, behind = figures["clock right"], figures["clock 1 h behind"]
    if right["runs"]:
        print(f"  ratio (behind / right): runs {behind['runs'] / right['runs']:.2f}, "
              f"p99 {behind['p99'] / right['p99'] if right['p99'] else float('nan'):.2f}")


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


def bench_tick_process(dbs: Databases, dialect: str, sizes: tuple[int, ...] = (10, 10000), repeats: int = 5) -> None:
    """The whole `tick` process (interpreter start, settings parsing and validation, one steady-state
    tick) over N jobs from settings: the cost the job count adds to every timer invocation. Runs
    alternate between the sizes (2 shared cores: compare within one run, not across runs)."""
    import os

    envs: dict[int, dict[str, str]] = {}
    for n in sizes:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JOB__", "AGENT_"))}
        env.update({"AGENT_DB": dbs.new(dialect), "AGENT_MAX_CONCURRENCY": "10000"})
        for i in range(n):
            env[f"JOB__job{i:05d}__SCHEDULE"] = f"0 {i % 60} * * * *"
            env[f"JOB__job{i:05d}__COMMAND"] = "SELECT 1"
        subprocess.run([sys.executable, "-m", "shared.cli", "init-db"], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        subprocess.run([sys.executable, "-m", "shared.cli", "tick"], cwd=ROOT, env=env, check=True,
                       capture_output=True)  # the first sync writes every job; later ticks are steady state
        envs[n] = env
    import resource

    figures: dict[int, list[float]] = {n: [] for n in sizes}
    cpu: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "shared.cli", "tick"], cwd=ROOT, env=envs[n], check=True,
                           capture_output=True)
            figures[n].append((time.perf_counter() - started) * 1000)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[n].append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    medians = {n: statistics.median(values) for n, values in figures.items()}
    cpu_medians = {n: statistics.median(values) for n, values in cpu.items()}
    smallest, largest = min(sizes), max(sizes)
    print(f"\n== whole `tick` process, {dialect}, steady state (median of {repeats}, alternating): "
          + ", ".join(f"{n} jobs {medians[n]:.0f} ms (CPU {cpu_medians[n]:.0f} ms)" for n in sizes)
          + f"; {largest} jobs cost {medians[largest] - medians[smallest]:+.0f} ms wall, "
          f"{cpu_medians[largest] - cpu_medians[smallest]:+.0f} ms CPU over {smallest} (target: within 250 ms)")


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


def bench_after(dbs: Databases, dialect: str, pairs: int = 50) -> float:
    """Follow-up latency against run-now's, in the local runner (direct mode), from the times the
    database recorded: run-now from the request (the run's created_at) to its start; a follow-up
    (JOB__b__AFTER=a) from the end of a's run (its finished_at, the transaction that also created
    b's run) to the start of b's. Each pair: run-now of 'solo', worked; run-now of 'a', worked
    (a, then b at once). Returns the ratio of the medians, follow-up / run-now."""
    env = {"JOB__solo__COMMAND": "SELECT 1", "JOB__a__COMMAND": "SELECT 1",
           "JOB__b__COMMAND": "SELECT 1", "JOB__b__AFTER": "a", "AGENT_MAX_CONCURRENCY": "4"}
    agent = Agent(load_settings(environ=env), db=dbs.new(dialect))
    agent.init()
    agent.tick()
    store = agent.store()
    runner = LocalRunner(agent, concurrency=2)
    run_now: list[float] = []
    follow_up: list[float] = []
    for _ in range(pairs):
        solo = agent.request_run_now("solo")
        runner.work_until_idle(max_seconds=60)
        run = store.execute("get_run", run_id=solo["run_id"]).one()
        run_now.append((run["started_at"] - run["created_at"]).total_seconds() * 1000)
        first = agent.request_run_now("a")
        runner.work_until_idle(max_seconds=60)
        ended = store.execute("get_run", run_id=first["run_id"]).one()
        (follower,) = [r for r in store.execute("list_history", job_name="b", limit=5).rows
                       if r["followed_run_id"] == first["run_id"]]
        assert follower["status"] == "succeeded", follower
        follow_up.append((follower["started_at"] - ended["finished_at"]).total_seconds() * 1000)
    agent.close()
    ratio = statistics.median(follow_up) / statistics.median(run_now)
    print(f"\n== follow-up vs run-now, {dialect}: {pairs} of each, the local runner working; start latency "
          f"median (p95) follow-up {statistics.median(follow_up):.1f} ms ({_percentile(follow_up, 0.95):.1f}), "
          f"run-now {statistics.median(run_now):.1f} ms ({_percentile(run_now, 0.95):.1f}); "
          f"ratio follow-up / run-now: {ratio:.2f}")
    return ratio


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
    parser.add_argument("--after-only", action="store_true",
                        help="only the follow-up latency against run-now's (SQLite, PostgreSQL)")
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
        if args.after_only:
            for dialect in dialects:
                bench_after(dbs, dialect)
            return
        for dialect in dialects:
            bench_ticks(dbs, dialect, sizes)
        for dialect in dialects:
            bench_lateness(dbs, dialect)
            bench_queue_lateness(dbs, dialect)
            bench_clock_behind(dbs, dialect)
            bench_drain(dbs, dialect)
            bench_order_chain(dbs, dialect)
            bench_after(dbs, dialect)
        for dialect in dialects:
            bench_tick_process(dbs, dialect)
        bench_cold_import()
    finally:
        dbs.close()


if __name__ == "__main__":
    main()
