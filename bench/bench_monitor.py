"""Benchmark (figures, not pass/fail) of the Job Activity Monitor's pages on PostgreSQL:

* the jobs page over 1,000 jobs (each with a last run);
* a job page over a job with 100,000 runs in its history (the 24-hour window, which the
  timeline cuts at 1,500 runs, and the 7-day window);
* a run page, the poison page and the stuck page;
* 64 concurrent requests to the local server (target: p99 under 1 s), beside the standard
  library's listen backlog of 5.

Each page is rendered by shared.web.app.Monitor exactly as both servers do (queries, HTML,
escaping), on one connection, after a warm-up; it prints the median and p95 in ms, the number
of statements a page sends and the size of its HTML. Target: under 100 ms each on PostgreSQL.

    .venv/bin/python bench/bench_monitor.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--repeat 30]

The history is written with one INSERT ... SELECT generate_series (the engine would take hours
to run 100,000 jobs); the jobs come from settings through a real tick.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.engine.agent import Agent  # noqa: E402
from shared.settings import load_settings  # noqa: E402
from shared.web.app import Monitor, MonitorSettings  # noqa: E402

UTC = timezone.utc
DEFAULT_PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"
JOBS = 1000
HISTORY = 100_000
BUSY = "job00000"


def build(db: str) -> Agent:
    env = {}
    for i in range(JOBS):
        env[f"JOB__job{i:05d}__SCHEDULE"] = f"0 {i % 60} * * * *"
        env[f"JOB__job{i:05d}__COMMAND"] = "SELECT 1"
    agent = Agent(load_settings(environ=env), db=db)
    agent.init()
    agent.tick()
    connection = agent.new_store().connection
    cursor = connection.cursor()
    now = datetime.now(UTC).replace(tzinfo=None, microsecond=0)
    # 100,000 runs of one job, one every 6 seconds over the last week (one in fifty failed)...
    cursor.execute(f"""
        INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, overlap, attempt, failures,
                                max_attempts, timeout_seconds, lease_seconds, token, runnable_at, created_at,
                                dispatched_at, started_at, finished_at, worker, operation_id, last_error)
        SELECT '{BUSY}', 'scheduled', s, CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END, 'SELECT 1', 'skip',
               1, CASE WHEN g % 50 = 0 THEN 1 ELSE 0 END, 1, 1800, 60, 1, s, s, s, s, s + (g % 5 + 1) * INTERVAL '1 second',
               'bench-worker', md5(g::text), CASE WHEN g % 50 = 0 THEN 'deadlock victim <&>' END
        FROM generate_series(1, {HISTORY}) AS g, LATERAL (SELECT CAST(? AS timestamp) - g * INTERVAL '6 seconds' AS s) AS t
    """, now)
    # ... one run for each other job (its last outcome), a few stuck and poisoned ones ...
    cursor.execute("""
        INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, overlap, attempt, max_attempts,
                                timeout_seconds, lease_seconds, token, runnable_at, created_at, started_at,
                                finished_at, lease_expires_at, worker, operation_id)
        SELECT j.job_name, 'scheduled', CAST(? AS timestamp) - INTERVAL '1 hour',
               CASE WHEN n % 100 = 1 THEN 'running' WHEN n % 100 = 2 THEN 'poisoned' ELSE 'succeeded' END,
               'SELECT 1', 'skip', 1, 3, 1800, 60, 1, CAST(? AS timestamp) - INTERVAL '1 hour',
               CAST(? AS timestamp) - INTERVAL '1 hour', CAST(? AS timestamp) - INTERVAL '1 hour',
               CASE WHEN n % 100 = 1 THEN NULL ELSE CAST(? AS timestamp) - INTERVAL '59 minutes' END,
               CASE WHEN n % 100 = 1 THEN CAST(? AS timestamp) - INTERVAL '50 minutes' END, 'bench-worker', md5(j.job_name)
        FROM (SELECT job_name, row_number() OVER (ORDER BY job_name) AS n FROM agent.jobs WHERE job_name <> ?) AS j
    """, now, now, now, now, now, now, BUSY)
    cursor.execute("""
        INSERT INTO agent.attempts (run_id, attempt, token, worker, started_at, finished_at, outcome, error_message)
        SELECT run_id, 1, 1, worker, started_at, finished_at, status, last_error FROM agent.runs WHERE started_at IS NOT NULL
    """)
    cursor.execute("""
        INSERT INTO agent.poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at)
        SELECT run_id, operation_id, '{"run_id": 1}', 5, 'transient error on delivery 5', '["timeout"]', finished_at
        FROM agent.runs WHERE status = 'poisoned'
    """)
    cursor.execute("ANALYZE")
    connection.commit()
    return agent


def measure(monitor: Monitor, store, path: str, query: str, repeat: int) -> tuple[float, float, int, int]:
    monitor.handle("GET", path, query)                      # warm-up: plans, caches
    before = store.statements_executed
    response = monitor.handle("GET", path, query)
    assert response.status == 200, (path, response.status, response.body[:300])
    statements = store.statements_executed - before
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        monitor.handle("GET", path, query)
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
    return statistics.median(times), p95, statements, len(response.body)


def burst(agent: Agent, run_id: int, concurrent: int = 64, rounds: int = 3, backlog: int | None = None) -> list[float]:
    """``concurrent`` clients at once against the local server (make_server), over the page set
    (jobs, jobs JSON, a run, poison, stuck), ``rounds`` times; each request's latency in ms.
    ``backlog``: listen again with this backlog (the standard library's default was 5)."""
    import threading
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from shared.web.local_server import make_server

    server = make_server(agent, 0)
    if backlog is not None:
        server.socket.listen(backlog)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    targets = ["/", "/?format=json", f"/runs/{run_id}", "/poison", "/stuck"]

    def one(i: int) -> float:
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{targets[i % len(targets)]}", timeout=60) as response:
            response.read()
        return (time.perf_counter() - started) * 1000

    latencies: list[float] = []
    try:
        for _ in range(rounds):
            with ThreadPoolExecutor(max_workers=concurrent) as clients:
                latencies += list(clients.map(one, range(concurrent)))
    finally:
        server.shutdown()
        server.server_close()
    return latencies


def _p(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default=DEFAULT_PG, help="ODBC connection string without Database")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    import pyodbc

    name = f"agent_bench_{uuid.uuid4().hex[:10]}"
    admin = pyodbc.connect(args.pg + "Database=postgres;", autocommit=True)
    admin.cursor().execute(f"CREATE DATABASE {name}")
    db = f"{args.pg}Database={name};"
    agent = None
    try:
        started = time.perf_counter()
        agent = build(db)
        print(f"PostgreSQL: {JOBS:,} jobs, {HISTORY:,} runs of {BUSY} (built in {time.perf_counter() - started:.0f} s); "
              f"{args.repeat} renders per page after a warm-up\n")
        store = agent.new_store()
        monitor = Monitor(lambda: contextlib.nullcontext(store), clock=lambda: datetime.now(UTC),
                          settings=lambda: MonitorSettings())
        run_id = store.execute("list_history", job_name=BUSY, limit=1).rows[0]["run_id"]
        pages = [
            (f"jobs page ({JOBS:,} jobs)", "/", ""),
            (f"job page, 24 h ({HISTORY:,} runs)", f"/jobs/{BUSY}", ""),
            (f"job page, 7 days ({HISTORY:,} runs)", f"/jobs/{BUSY}", "window=7d"),
            ("run page", f"/runs/{run_id}", ""),
            ("poison page", "/poison", ""),
            ("stuck page", "/stuck", ""),
            (f"jobs JSON twin ({JOBS:,} jobs)", "/", "format=json"),
        ]
        print(f"{'page':<34} {'median ms':>10} {'p95 ms':>8} {'stmts':>6} {'KB':>7}")
        for label, path, query in pages:
            median, p95, statements, size = measure(monitor, store, path, query, args.repeat)
            print(f"{label:<34} {median:>10.1f} {p95:>8.1f} {statements:>6} {size / 1024:>7.0f}")
        store.close()
        print("\n64 concurrent requests x 3 rounds to the local server (make_server), pages as above "
              "but the 100,000-run job page; latency ms:")
        for label, backlog in (("listen backlog 5 (the standard library's default)", 5),
                               ("listen backlog 128 (the monitor's)", None)):
            latencies = burst(agent, run_id, backlog=backlog)
            print(f"  {label:<52} p50 {_p(latencies, 0.5):>7.0f}  p99 {_p(latencies, 0.99):>7.0f}  "
                  f"max {max(latencies):>7.0f}")
    finally:
        if agent is not None:
            agent.close()
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()


if __name__ == "__main__":
    main()
