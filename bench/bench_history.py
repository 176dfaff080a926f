"""History at scale (figures, not pass/fail), on PostgreSQL: 10 million finished runs of 1,000
jobs (one attempt each), 100,000 job events and 10,000 poison messages, then the history
listings the CLI runs and the tick's retention purge, timed with migration 0003's indexes and,
as the peer, with the same queries on the schema without them (the schema before this release).

    .venv/bin/python bench/bench_history.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--runs 10000000]

Targets on a 2-core machine: every listing and one purge batch well under 100 ms at 10 million
runs, whatever the job; the purge's cost per tick bounded by its batch (1,000 rows of each kind).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.engine.agent import Agent  # noqa: E402
from shared.engine.scheduler import PURGE_BATCH  # noqa: E402
from shared.settings import load_settings  # noqa: E402

UTC = timezone.utc
DEFAULT_PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"
NOW = datetime(2027, 3, 1, tzinfo=UTC)
INDEXES_0003 = ("runs_finished", "runs_job_run", "job_events_job_event", "job_events_at",
                "poison_messages_at", "poison_messages_run")


def admin(base: str):
    import pyodbc

    return pyodbc.connect(base + "Database=postgres;", autocommit=True)


def load(agent: Agent, runs: int, jobs: int) -> float:
    """Bulk-load the history in a few set-based statements; returns the seconds it took."""
    started = time.perf_counter()
    cursor = agent.store().connection.cursor()
    # Slot g // jobs of job g % jobs, an hour apart: 10 million runs of 1,000 jobs span 417
    # days, so most of them are past a 45-day retention (the backlog a first upgrade meets).
    first = NOW - timedelta(hours=runs // jobs)
    cursor.execute(f"""
        INSERT INTO agent.runs (job_name, kind, scheduled_for, status, command, overlap, attempt, failures,
                                max_attempts, timeout_seconds, lease_seconds, token, runnable_at, created_at,
                                started_at, finished_at, worker, operation_id, note)
        SELECT 'job' || lpad((g % {jobs})::text, 5, '0'), 'scheduled', s, CASE WHEN g % 50 = 0 THEN 'failed' ELSE 'succeeded' END,
               'SELECT 1', 'skip', 1, CASE WHEN g % 50 = 0 THEN 1 ELSE 0 END, 1, 1800, 60, 1, s, s,
               s + interval '1 second', s + interval '2 seconds', 'bench', md5(g::text), NULL
        FROM generate_series(0, {runs - 1}) AS g,
             LATERAL (SELECT TIMESTAMP '{first:%Y-%m-%d %H:%M:%S}' + (g / {jobs}) * interval '1 hour' AS s) AS t""")
    cursor.execute("""
        INSERT INTO agent.attempts (run_id, attempt, token, worker, dequeue_count, started_at, finished_at, outcome)
        SELECT run_id, 1, 1, 'bench', 1, started_at, finished_at, status FROM agent.runs""")
    cursor.execute(f"""
        INSERT INTO agent.job_events (job_name, event_at, kind, detail)
        SELECT 'job' || lpad((g % {jobs})::text, 5, '0'), TIMESTAMP '{first:%Y-%m-%d %H:%M:%S}' + g * interval '5 minutes',
               'config_invalid', 'bench'
        FROM generate_series(0, 99999) AS g""")
    cursor.execute("""
        INSERT INTO agent.poison_messages (run_id, message_id, body, dequeue_count, reason, errors, poisoned_at, requeued_at)
        SELECT run_id, md5(run_id::text), '{}', 6, 'bench', '[]', finished_at, finished_at
        FROM agent.runs WHERE run_id % 1000 = 7""")
    cursor.execute("ANALYZE agent.runs")
    cursor.execute("ANALYZE agent.attempts")
    cursor.execute("ANALYZE agent.job_events")
    cursor.execute("ANALYZE agent.poison_messages")
    agent.store().connection.commit()
    return time.perf_counter() - started


def timed(fn, repeat: int = 7) -> tuple[float, float]:
    """Median and worst of ``repeat`` calls, in ms (the first call warms the cache and is dropped)."""
    fn()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times)


def listings(agent: Agent) -> dict[str, tuple[float, float]]:
    store = agent.store()
    recent = [r["run_id"] for r in store.execute("list_history", job_name=None, limit=50).rows]
    return {
        "history (all jobs, 50 newest)": timed(lambda: store.execute("list_history", job_name=None, limit=50)),
        "history --job job00042 (50 newest)": timed(lambda: store.execute("list_history", job_name="job00042", limit=50)),
        "attempts of 50 runs": timed(lambda: store.execute("list_attempts", run_ids=recent)),
        "jobs (every job, last outcome each)": timed(lambda: store.execute("list_jobs"), repeat=5),
        "job events of job00042 (50 newest)": timed(lambda: store.execute("list_job_events", job_name="job00042", limit=50)),
        "poison list (50 newest)": timed(lambda: store.execute("list_poison", limit=50)),
    }


def purge(agent: Agent, rounds: int = 5) -> tuple[float, float, int]:
    """Median and worst ms of one purge batch (each really deletes), and the rows it removed."""
    store = agent.store()
    times, removed = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        with store.transaction():
            rows = store.execute("purge_history", history_before=NOW - timedelta(days=45),
                                 poison_before=NOW - timedelta(days=180), batch=PURGE_BATCH).rows
        times.append((time.perf_counter() - started) * 1000)
        removed += sum(int(r["rows_purged"]) for r in rows)
    return statistics.median(times), max(times), removed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL ODBC string without Database=")
    parser.add_argument("--runs", type=int, default=10_000_000)
    parser.add_argument("--jobs", type=int, default=1000)
    args = parser.parse_args()
    name = f"agent_bench_history_{uuid.uuid4().hex[:8]}"
    connection = admin(args.pg)
    connection.cursor().execute(f'CREATE DATABASE "{name}"')
    agent = None
    try:
        env = {f"JOB__job{i:05d}__SCHEDULE": "0 0 0 1 1 *" for i in range(args.jobs)}
        env.update({f"JOB__job{i:05d}__COMMAND": "SELECT 1" for i in range(args.jobs)})
        env["AGENT_HISTORY_RETENTION_DAYS"] = "0"             # the bench purges by hand
        agent = Agent(load_settings(environ=env), db=args.pg + f"Database={name};", clock=lambda: NOW)
        agent.init()
        agent.tick()                                          # syncs the 1,000 jobs
        seconds = load(agent, args.runs, args.jobs)
        print(f"loaded {args.runs:,} runs (+ as many attempts, 100,000 events, {args.runs // 1000:,} poison "
              f"messages) of {args.jobs:,} jobs in {seconds:.0f} s")
        with_indexes = listings(agent)
        purge_with = purge(agent)
        cursor = agent.store().connection.cursor()
        for index in INDEXES_0003:
            cursor.execute(f"DROP INDEX agent.{index}")
        agent.store().connection.commit()
        without = listings(agent)
        purge_without = purge(agent, rounds=3)
        print(f"\n{'query':42} {'with 0003':>18} {'without':>18} {'ratio':>7}")
        for label, (median, worst) in with_indexes.items():
            peer, peer_worst = without[label]
            print(f"{label:42} {median:8.1f} ms ({worst:5.1f}) {peer:8.1f} ms ({peer_worst:5.1f}) {peer / median:6.1f}x")
        print(f"{'purge batch (1,000 runs + attempts, events, poison)':42} {purge_with[0]:8.1f} ms ({purge_with[1]:5.1f}) "
              f"{purge_without[0]:8.1f} ms ({purge_without[1]:5.1f}) {purge_without[0] / purge_with[0]:6.1f}x")
        print(f"\nrows removed by {5} purge batches with the indexes: {purge_with[2]:,}")
        print("(median of 7 calls, worst in parentheses; 'without' = the same queries on the schema before 0003)")
    finally:
        if agent is not None:
            agent.close()
        connection.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
