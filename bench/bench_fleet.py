"""Fleet jobs at scale (figures, not pass/fail), on PostgreSQL: a fleet of 200 databases (created
for the run with a unique prefix and always dropped at the end, Ctrl-C included) and one fleet
job whose step is a no-op (``SELECT 1``) over ``db:<prefix>_t*``.

* time from the slot (the run's scheduled_for) to the last of the 200 executions done (the
  parent run's finished_at), at TARGET_PARALLELISM 8 and 32, in direct mode (the local runner's
  workers claim from agent.runs) and in queue mode (an in-memory queue with Azure Storage
  semantics, shared/messaging/memory.py), the settings alternating round by round; medians and the
  ratio 32 vs 8;
* the peer we can run here: the same 200 no-op executions as 200 ad-hoc tasks (``insert_task``,
  the query behind ``submit``, one per database with its target_database) under
  AGENT_MAX_CONCURRENCY 8 and 32, alternating with the fleet runs;
* statements against the control database (Store.statements_executed, summed over every store
  the agent made): the tick, the parent's fan-out (claim or start, resolution, creation, and in
  queue mode the dispatch) and each execution, at two fleet sizes (50 and 200 targets), worked
  by one sequential worker so that the counts are exact.

    .venv/bin/python bench/bench_fleet.py [--pg ODBC-STRING-WITHOUT-DATABASE] [--targets 200] [--rounds 3]

Workers: the runner's concurrency and AGENT_MAX_CONCURRENCY equal the parallelism. Each worker
holds a control connection and, while it runs an execution, one to the execution's database:
parallelism 32 needs about 70 PostgreSQL connections (max_connections is checked first).
Targets on a 2-core machine: statements of the fan-out the same at 50 and 200 targets; per
execution a constant handful; the fleet no slower than the same work as independent tasks.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shared.engine.agent import Agent  # noqa: E402
from shared.engine.runner import LocalRunner  # noqa: E402
from shared.messaging.memory import MemoryQueue  # noqa: E402
from shared.settings import load_settings  # noqa: E402

UTC = timezone.utc
DEFAULT_PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=root;"
ROUND_SECONDS = 300          # a round that has not finished by then is reported and abandoned
TERMINAL = ("succeeded", "failed", "cancelled", "skipped", "poisoned")


# ------------------------------------------------------------------ databases


class Fleet:
    """The fleet's databases and the bench's control databases, all named with one unique
    prefix; ``close`` drops every one of them (WITH (FORCE)) and is called from ``finally``."""

    def __init__(self, pg: str, parallel: int = 4) -> None:
        self.pg = pg
        self.prefix = f"fleetbench_{uuid.uuid4().hex[:6]}"
        self.parallel = parallel
        self.created: list[str] = []
        self._lock = threading.Lock()
        self._controls = 0

    def admin(self):
        import pyodbc

        return pyodbc.connect(self.pg + "Database=postgres;", autocommit=True, timeout=10)

    def _create(self, names: list[str]) -> None:
        connection = self.admin()
        try:
            for name in names:
                connection.cursor().execute(f'CREATE DATABASE "{name}"')
                with self._lock:
                    self.created.append(name)
        finally:
            connection.close()

    def create_targets(self, count: int) -> float:
        names = [self.target(i) for i in range(count)]
        started = time.perf_counter()
        with ThreadPoolExecutor(self.parallel) as pool:
            for future in [pool.submit(self._create, names[i::self.parallel]) for i in range(self.parallel)]:
                future.result()
        return time.perf_counter() - started

    def target(self, i: int) -> str:
        return f"{self.prefix}_t{i:03d}"

    def glob(self, count: int, total: int) -> str:
        """A TARGETS glob matching the first ``count`` targets (50 or all of them)."""
        if count == total:
            return f"db:{self.prefix}_t*"
        if count == 50 and total >= 50:
            return f"db:{self.prefix}_t0[0-4]?"
        if count == 5 and total >= 5:
            return f"db:{self.prefix}_t00[0-4]"
        raise ValueError(f"no glob for {count} of {total} targets")

    def control(self) -> str:
        """A fresh control database (an empty history for every round)."""
        self._controls += 1
        name = f"{self.prefix}ctl{self._controls}"
        self._create([name])
        return name

    def url(self, name: str) -> str:
        return f"{self.pg}Database={name};"

    def drop(self, name: str) -> None:
        connection = self.admin()
        try:
            connection.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            with self._lock:
                if name in self.created:
                    self.created.remove(name)
        finally:
            connection.close()

    def close(self) -> None:
        names = list(self.created)
        if not names:
            return
        started = time.perf_counter()
        failures: list[str] = []

        def drop_all(part: list[str]) -> None:
            connection = self.admin()
            try:
                for name in part:
                    try:
                        connection.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    except Exception as exc:  # noqa: BLE001 - report and go on with the others
                        failures.append(f"{name}: {exc}")
            finally:
                connection.close()

        with ThreadPoolExecutor(self.parallel) as pool:
            for future in [pool.submit(drop_all, names[i::self.parallel]) for i in range(self.parallel)]:
                future.result()
        self.created = []
        print(f"\ndropped {len(names) - len(failures)} databases ({self.prefix}*) in "
              f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
        for failure in failures:
            print(f"  could not drop {failure}", file=sys.stderr)


def check_connections(fleet: Fleet, parallelism: int) -> None:
    connection = fleet.admin()
    try:
        cursor = connection.cursor()
        limit = int(cursor.execute("SHOW max_connections").fetchone()[0])
        used = int(cursor.execute("SELECT COUNT(*) FROM pg_stat_activity").fetchone()[0])
    finally:
        connection.close()
    needed = 2 * parallelism + 8
    if limit - used < needed:
        sys.exit(f"bench: parallelism {parallelism} needs about {needed} connections; PostgreSQL allows "
                 f"{limit} and {used} are in use")


# ------------------------------------------------------------------ the agent, counted


class Counted:
    """An agent whose every store is kept, to add up the statements it sent: the control
    database's (thread stores and the lease renewal's) and the target databases'."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.extra: list[Any] = []
        self.targets: list[Any] = []
        self.chains: list[tuple[tuple[str, ...], float]] = []
        new_store, target_store, store = agent.new_store, agent.target_store, agent.store
        lock = threading.Lock()

        def keep(into: list[Any], made: Any) -> Any:
            with lock:
                into.append(made)
            return made

        def timed(made: Any) -> Any:
            """Time every chain of named queries the store runs (a completion is one)."""
            if getattr(made, "_bench_timed", False):
                return made
            chain = made.chain

            def timed_chain(*calls):
                started = time.perf_counter()
                try:
                    return chain(*calls)
                finally:
                    with lock:
                        self.chains.append((tuple(name for name, _ in calls), time.perf_counter() - started))

            made.chain = timed_chain
            made._bench_timed = True
            return made

        agent.new_store = lambda: keep(self.extra, timed(new_store()))
        agent.target_store = lambda database, server=None: keep(self.targets, target_store(database, server))
        agent.store = lambda: timed(store())

    def control_statements(self) -> int:
        return sum(s.statements_executed for s in list(self.agent._stores) + self.extra)

    def control_commits(self) -> int:
        return sum(s.commits for s in list(self.agent._stores) + self.extra)


def make(url: str, jobs: dict[str, dict[str, str]], *, queue: Any = None, **settings: str) -> tuple[Agent, Counted]:
    env = {"AGENT_POLL_SECONDS": "300", "AGENT_CONNECT_RETRY_SECONDS": "5", **settings}
    for name, values in jobs.items():
        env.update({f"JOB__{name}__{key}": value for key, value in values.items()})
    agent = Agent(load_settings(environ=env), db=url, queue=queue)
    counted = Counted(agent)
    agent.init()
    return agent, counted


def fleet_job(targets: str, parallelism: int, slot: datetime | None = None) -> dict[str, str]:
    """One run at ``slot`` (default: now, the moment the settings are read)."""
    return {"SCHEDULE": "@once " + (slot or datetime.now(UTC)).isoformat(), "TARGETS": targets,
            "COMMAND": "SELECT 1", "TARGET_PARALLELISM": str(parallelism), "MAX_ATTEMPTS": "1"}


def next_whole_second(ahead: float = 1.5) -> datetime:
    """A slot a little ahead, on a whole second: the agent is built and migrated before it."""
    return (datetime.now(UTC) + timedelta(seconds=ahead)).replace(microsecond=0) + timedelta(seconds=1)


def sleep_until(moment: datetime) -> None:
    time.sleep(min(5.0, max(0.0, (moment - datetime.now(UTC)).total_seconds())))


def peek(url: str, sql: str) -> list[tuple]:
    """Read agent.runs on a connection of the bench's own (not counted)."""
    import pyodbc

    connection = pyodbc.connect(url, autocommit=True)
    try:
        return [tuple(row) for row in connection.cursor().execute(sql).fetchall()]
    finally:
        connection.close()


def parent_of(url: str, job: str) -> dict[str, Any]:
    rows = peek(url, "SELECT run_id, status, scheduled_for, started_at, finished_at, targets_total, targets_failed, "
                       f"last_error FROM agent.runs WHERE job_name = '{job}' ORDER BY run_id")
    if len(rows) != 1:
        raise AssertionError(f"expected one run of {job}, found {rows}")
    keys = ("run_id", "status", "scheduled_for", "started_at", "finished_at", "targets_total", "targets_failed",
            "last_error")
    return dict(zip(keys, rows[0]))


# ------------------------------------------------------------------ timed rounds


def completion_times(counted: Counted) -> dict[str, float]:
    """Median and 90th percentile ms of the completion batches (finish_run, and for an execution
    progress_fleets, which locks its parent run's row first: completions of one fleet queue there)."""
    times = sorted(seconds * 1000 for names, seconds in counted.chains if "finish_run" in names)
    if not times:
        return {"completion_ms": float("nan"), "completion_p90": float("nan")}
    return {"completion_ms": statistics.median(times), "completion_p90": times[int(0.9 * (len(times) - 1))]}


def fleet_round(fleet: Fleet, targets: str, count: int, parallelism: int, mode: str) -> dict[str, float]:
    """One run of the fleet job, worked by ``parallelism`` workers: slot to parent done."""
    control = fleet.control()
    url = fleet.url(control)
    try:
        queue = MemoryQueue() if mode == "queue" else None
        base, _ = make(url, {})                                    # the migrations, outside the timing
        base.close()
        job = f"fleet_p{parallelism}"
        slot = next_whole_second()
        agent, counted = make(url, {job: fleet_job(targets, parallelism, slot)}, queue=queue,
                        AGENT_MAX_CONCURRENCY=str(parallelism))
        runner = LocalRunner(agent, concurrency=parallelism, poll_interval=0.05, visibility_timeout=0)
        sleep_until(slot)                                          # the tick comes at the slot
        started = time.perf_counter()
        agent.tick()
        runner.work_until_idle(max_seconds=ROUND_SECONDS)
        wall = time.perf_counter() - started
        parent = parent_of(url, job)
        agent.close()
        if parent["status"] != "succeeded" or parent["targets_total"] != count:
            raise AssertionError(f"{mode} p{parallelism}: the fleet run ended {parent}")
        return {"slot_to_done": (parent["finished_at"] - parent["scheduled_for"]).total_seconds(), "wall": wall,
                **completion_times(counted)}
    finally:
        fleet.drop(control)


def tasks_round(fleet: Fleet, count: int, concurrency: int) -> dict[str, float]:
    """The peer: the same no-op in the same ``count`` databases as independent ad-hoc tasks
    (insert_task, one statement each, in one transaction), AGENT_MAX_CONCURRENCY = workers."""
    control = fleet.control()
    url = fleet.url(control)
    try:
        agent, counted = make(url, {}, AGENT_MAX_CONCURRENCY=str(concurrency))
        runner = LocalRunner(agent, concurrency=concurrency, poll_interval=0.05)
        store = agent.store()
        started = time.perf_counter()
        now = datetime.now(UTC)
        with store.transaction():
            for i in range(count):
                store.execute("insert_task", command="SELECT 1", target_database=fleet.target(i), task_order=None,
                              max_attempts=1, timeout_seconds=60, lease_seconds=60, now=now,
                              operation_id=uuid.uuid4().hex)
        runner.work_until_idle(max_seconds=ROUND_SECONDS)
        wall = time.perf_counter() - started
        rows = peek(url, "SELECT COUNT(*), MIN(created_at), MAX(finished_at), "
                           "COUNT(*) FILTER (WHERE status = 'succeeded') FROM agent.runs WHERE kind = 'task'")
        agent.close()
        total, first, last, succeeded = rows[0]
        if total != count or succeeded != count:
            raise AssertionError(f"tasks c{concurrency}: {succeeded} of {total} succeeded")
        return {"slot_to_done": (last - first).total_seconds(), "wall": wall, **completion_times(counted)}
    finally:
        fleet.drop(control)


# ------------------------------------------------------------------ statement counts


def count_round(fleet: Fleet, targets: str, count: int, mode: str, parallelism: int = 8) -> dict[str, Any]:
    """One worker, one unit of work at a time: the exact statements of the tick, of the parent's
    fan-out and of each execution, against the control database."""
    control = fleet.control()
    url = fleet.url(control)
    try:
        queue = MemoryQueue() if mode == "queue" else None
        base, _ = make(url, {})
        base.close()
        job = "fleet_count"
        agent, counted = make(url, {job: fleet_job(targets, parallelism)}, queue=queue,
                              AGENT_MAX_CONCURRENCY=str(parallelism))
        runner = LocalRunner(agent, concurrency=1, poll_interval=0.05, visibility_timeout=0)
        before = counted.control_statements()
        report = agent.tick()
        tick = counted.control_statements() - before
        sent_by_tick = len(queue.sent) if queue is not None else 0
        # The parent: claimed (direct) or its message started (queue), its targets resolved and
        # its executions created (and, in queue mode, the first TARGET_PARALLELISM dispatched).
        before, commits, chains = counted.control_statements(), counted.control_commits(), len(counted.chains)
        started = time.perf_counter()
        handled = runner.work_one()
        fan_out_ms = (time.perf_counter() - started) * 1000
        fan_out = counted.control_statements() - before
        fan_out_commits = counted.control_commits() - commits
        fan_out_queries = [names for names, _ in counted.chains[chains:]]
        sent_by_fan_out = (len(queue.sent) - sent_by_tick) if queue is not None else 0
        if handled != 1:
            raise AssertionError(f"the fan-out handled {handled} runs")
        # The executions, one after the other, until the parent is done (bounded in count and time).
        before, commits, chains = counted.control_statements(), counted.control_commits(), len(counted.chains)
        targets_before = len(counted.targets)
        executions, deadline = 0, time.monotonic() + ROUND_SECONDS
        while executions < count and time.monotonic() < deadline:
            done = runner.work_one()
            if done == 0:
                break
            executions += done
        per_execution = (counted.control_statements() - before) / max(1, executions)
        per_execution_commits = (counted.control_commits() - commits) / max(1, executions)
        completions = [seconds for names, seconds in counted.chains[chains:] if "progress_fleets" in names]
        target_stores = len(counted.targets) - targets_before
        parent = parent_of(url, job)
        agent.close()
        if parent["status"] != "succeeded" or parent["targets_total"] != count or executions != count:
            raise AssertionError(f"count {mode} {count}: {executions} executions; parent {parent}")
        return {"tick": tick, "tick_report": report.statements, "fan_out": fan_out, "fan_out_commits": fan_out_commits,
                "fan_out_ms": fan_out_ms,
                "fan_out_queries": fan_out_queries, "sent_by_fan_out": sent_by_fan_out,
                "per_execution": per_execution, "per_execution_commits": per_execution_commits,
                "target_connections_per_execution": target_stores / max(1, executions),
                "completion_ms": statistics.median(completions) * 1000 if completions else float("nan"),
                "messages": (len(queue.sent) if queue is not None else 0)}
    finally:
        fleet.drop(control)


def connect_ms(fleet: Fleet, repeats: int = 20) -> float:
    """Median time to open (and close) a connection to a target database, as every execution
    does: the floor under an execution on this machine."""
    from shared.control.db import connector

    agent = Agent(load_settings(environ={}), db=fleet.url(fleet.target(0)))   # its connector only, no init
    try:
        times = []
        for i in range(repeats):
            started = time.perf_counter()
            connection = connector(agent.target, fleet.target(i % 10))()
            connection.cursor().execute("SELECT 1").fetchall()
            connection.close()
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)
    finally:
        agent.close()


# ------------------------------------------------------------------ main


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg", default=DEFAULT_PG, help="PostgreSQL ODBC string without Database=")
    parser.add_argument("--targets", type=int, default=200, help="databases in the fleet (at least 50)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds of every setting (alternating)")
    parser.add_argument("--parallelism", default="8,32", help="TARGET_PARALLELISM values compared (two)")
    parser.add_argument("--modes", default="direct,queue,tasks",
                        help="what to time: direct, queue (the fleet job) and tasks (the peer)")
    parser.add_argument("--count-sizes", default="50,ALL", help="fleet sizes of the statement counts")
    args = parser.parse_args()
    low, high = (int(p) for p in args.parallelism.split(","))
    modes = [m for m in args.modes.split(",") if m]
    sizes = [args.targets if s == "ALL" else int(s) for s in args.count_sizes.split(",") if s]
    fleet = Fleet(args.pg)
    check_connections(fleet, high)
    # Ctrl-C (even when started in the background, where SIGINT comes ignored) and SIGTERM raise
    # KeyboardInterrupt: the finally below drops the databases either way.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, interrupted)
    try:
        seconds = fleet.create_targets(args.targets)
        print(f"created {args.targets} databases {fleet.prefix}_t000..t{args.targets - 1:03d} in {seconds:.0f} s "
              f"({fleet.parallel} connections)")
        everything = fleet.glob(args.targets, args.targets)
        print(f"opening a connection to a target database and running SELECT 1 on it (as every execution does): "
              f"median {connect_ms(fleet):.1f} ms of 20")

        print("\n== statements against the control database (one worker, one unit of work at a time; "
              "TARGET_PARALLELISM 8)")
        print(f"{'mode':7} {'targets':>7} {'tick*':>5} {'fan-out':>8} {'commits':>8} {'msgs':>5} "
              f"{'per execution':>14} {'commits':>8} {'target conns':>13} {'completion ms':>14} {'fan-out ms':>11}")
        counts: dict[tuple[str, int], dict[str, Any]] = {}
        for mode in [m for m in ("direct", "queue") if m in modes or m == "direct"]:
            for size in sizes:
                c = count_round(fleet, fleet.glob(size, args.targets), size, mode)
                counts[(mode, size)] = c
                print(f"{mode:7} {size:>7} {c['tick']:>5} {c['fan_out']:>8} {c['fan_out_commits']:>8} "
                      f"{c['sent_by_fan_out']:>5} {c['per_execution']:>14.2f} {c['per_execution_commits']:>8.2f} "
                      f"{c['target_connections_per_execution']:>13.2f} {c['completion_ms']:>14.1f} {c['fan_out_ms']:>11.1f}")
        for mode in ("direct", "queue"):
            pair = [counts.get((mode, s)) for s in sizes]
            if len(sizes) == 2 and all(pair):
                print(f"  {mode}: fan-out {pair[0]['fan_out']} statements at {sizes[0]} targets, {pair[1]['fan_out']} at "
                      f"{sizes[1]} ({'constant' if pair[0]['fan_out'] == pair[1]['fan_out'] else 'NOT constant'}); "
                      f"per execution {pair[0]['per_execution']:.2f} and {pair[1]['per_execution']:.2f}; its chains: "
                      + "; ".join("+".join(q) for q in pair[1]["fan_out_queries"]))
        print("  (tick* = the first tick: settings sync and the claim (and, in queue mode, the dispatch) of the slot; "
              "fan-out = the parent's claim or start, the resolution (one pg_database listing), the creation "
              "of every execution and, in queue mode, their dispatch; msgs = messages it sent; completion ms = "
              "median time of an execution's completion batch, which runs progress_fleets; fan-out ms = the parent's "
              "unit of work, from its claim to its executions created)")

        print(f"\n== {args.targets} no-op executions: slot (scheduled_for) to the parent run done (finished_at); "
              f"{args.rounds} rounds, the settings alternating; workers = AGENT_MAX_CONCURRENCY = parallelism")
        settings = [(mode, p) for mode in modes for p in (low, high)]
        figures: dict[tuple[str, int], list[dict[str, float]]] = {s: [] for s in settings}
        for r in range(1, args.rounds + 1):
            for mode, p in settings:
                if mode == "tasks":
                    result = tasks_round(fleet, args.targets, p)
                else:
                    result = fleet_round(fleet, everything, args.targets, p, mode)
                figures[(mode, p)].append(result)
                label = (f"{args.targets} tasks, concurrency {p}" if mode == "tasks"
                         else f"fleet {mode}, parallelism {p}")
                print(f"  round {r}: {label:34} slot to done {result['slot_to_done']:6.2f} s "
                      f"({args.targets / result['slot_to_done']:5.0f} executions/s), tick to idle {result['wall']:6.2f} s; "
                      f"completion batch median {result['completion_ms']:5.1f} ms, p90 {result['completion_p90']:5.1f} ms")
        print(f"\n{'':34} {'median s':>9} {'exec/s':>7}   ratio {high} vs {low} (time {low} / time {high}, per round)")
        for mode in modes:
            lows = [f["slot_to_done"] for f in figures[(mode, low)]]
            highs = [f["slot_to_done"] for f in figures[(mode, high)]]
            ratios = [a / b for a, b in zip(lows, highs)]
            for p, values in ((low, lows), (high, highs)):
                label = f"tasks, concurrency {p}" if mode == "tasks" else f"fleet {mode}, parallelism {p}"
                tail = (f"   {median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})" if p == high
                        else "")
                print(f"{label:34} {median(values):9.2f} {args.targets / median(values):7.0f}{tail}")
        if "tasks" in modes and "direct" in modes:
            for p in (low, high):     # the tasks run in direct mode: compared with the fleet in direct mode
                ratios = [t["slot_to_done"] / f["slot_to_done"]
                          for t, f in zip(figures[("tasks", p)], figures[("direct", p)])]
                print(f"fleet direct vs tasks at {p}: {median(ratios):.2f}x (tasks time / fleet time, per round: "
                      f"{', '.join(f'{x:.2f}' for x in ratios)})")
        if "direct" in modes and "queue" in modes:
            for p in (low, high):
                ratios = [d["slot_to_done"] / q["slot_to_done"] for d, q in zip(figures[("direct", p)],
                                                                                 figures[("queue", p)])]
                print(f"fleet queue vs direct at {p}: {median(ratios):.2f}x (direct time / queue time)")
    finally:
        fleet.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
