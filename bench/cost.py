"""Monthly cost of four job profiles on Azure (issue 31 item 4), from a simulated day.

    python bench/cost.py                 # the tables, from bench/cost_measured.json and bench/cost_prices.json
    python bench/cost.py --measure       # simulate a day of each profile again, write bench/cost_measured.json
    python bench/cost.py --write-doc     # put the tables into docs/cost.md (tests/repo: the doc equals the output)

The measured side runs the real engine on an embedded (SQLite) control database, in simulated
time: one timer tick a minute through the timer's own code (shared.engine.quiet.timer_tick, quiet
ticks on with the prices file's quiet_max_minutes), the due runs worked as the queue trigger
would; it counts the ticks that connected, the runs, the moments the database was used, and the
engine's telemetry (items and JSON bytes) per run and per connected tick. The price side is
bench/cost_prices.json: dated list prices, to be checked against Azure's pages (see its note).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

UTC = timezone.utc
MEASURED = ROOT / "bench" / "cost_measured.json"
PRICES = ROOT / "bench" / "cost_prices.json"
DOC = ROOT / "docs" / "cost.md"
START, END = "<!-- cost-table:start (python bench/cost.py --write-doc) -->", "<!-- cost-table:end -->"
# A fixed past day (a Monday): runs are worked by the database's real clock, which has passed it.
DAY = datetime(2026, 1, 5, tzinfo=UTC)


def profiles() -> dict[str, dict[str, dict[str, str]]]:
    nightly = {name: {"SCHEDULE": f"0 {minute} 2 * * *", "COMMAND": "SELECT 1"}
               for name, minute in (("index_upkeep", 0), ("statistics", 20), ("purge", 40))}
    hourly = {name: {"SCHEDULE": f"0 {minute} * * * *", "COMMAND": "SELECT 1"}
              for name, minute in (("rollup", 5), ("export", 25), ("cleanup", 45))}
    minutely = {"heartbeat": {"SCHEDULE": "0 * * * * *", "COMMAND": "SELECT 1"}}
    # The fleet job over 50 databases: one run per target database at the same nightly slot (its
    # 50 target executions, each a queue message and a run); the fleet's own parent run and
    # statements are not simulated (they add one run and a constant number of statements).
    fleet = {f"fleet_db{index:02d}": {"SCHEDULE": "0 0 3 * * *", "COMMAND": "SELECT 1"} for index in range(1, 51)}
    return {"nightly jobs only (3 a night)": nightly, "hourly jobs (3 an hour)": hourly,
            "every-minute job (1)": minutely, "fleet job over 50 databases, nightly": fleet}


class RecordingTelemetry:
    """The engine's telemetry calls, counted: items and the bytes of their JSON."""

    enabled = True

    def __init__(self) -> None:
        self.items = 0
        self.bytes = 0

    def _add(self, kind: str, name: str, properties: Any, **extra: Any) -> None:
        self.items += 1
        self.bytes += len(json.dumps({"type": kind, "name": name, "properties": dict(properties or {}), **extra},
                                     default=str))

    def event(self, name, properties=None, *, operation_id=None) -> None:
        self._add("event", name, properties, operation_id=operation_id)

    def metric(self, name, value, properties=None, *, operation_id=None) -> None:
        self._add("metric", name, properties, value=value, operation_id=operation_id)

    def dependency(self, name, *, target, duration_ms, success, operation_id=None, data=None,
                   dependency_type="SQL", properties=None, result_code=None) -> None:
        self._add("dependency", name, properties, target=target, duration_ms=duration_ms, data=data)

    def sql_call(self, name, *, target, operation_id=None, data=None):
        import contextlib

        from shared.telemetry.client import DependencyCall

        @contextlib.contextmanager
        def call():
            yield DependencyCall()
            self._add("dependency", name, {}, target=target, data=data)
        return call()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def measure_profile(jobs: dict[str, dict[str, str]], quiet_max_minutes: int) -> dict[str, Any]:
    from shared.engine import quiet
    from shared.engine.agent import Agent
    from shared.engine.runner import LocalRunner
    from shared.settings import load_settings

    class Clock:
        def __init__(self, now: datetime) -> None:
            self.now = now

        def __call__(self) -> datetime:
            return self.now

    with tempfile.TemporaryDirectory() as folder:
        env = {f"JOB__{name}__{key}": value for name, job in jobs.items() for key, value in job.items()}
        env["AGENT_QUIET_MAX_MINUTES"] = str(quiet_max_minutes)
        settings = load_settings(environ=env)
        clock = Clock(DAY)
        telemetry = RecordingTelemetry()
        agent = Agent(settings, db=f"sqlite:///{Path(folder) / 'agent.db'}", clock=clock, telemetry=telemetry,
                      simulated_time=True)
        agent.init()
        agent.release()
        record = quiet.FileRecord(Path(folder) / "horizon.json")
        connected, active = 0, []
        tick_items = tick_bytes = run_items = run_bytes = 0
        for _ in range(1440):
            items, size = telemetry.items, telemetry.bytes
            _, report = quiet.timer_tick(agent, clock.now, record)
            agent.release()
            if report is not None:
                connected += 1
                active.append(int((clock.now - DAY).total_seconds()))
                tick_items += telemetry.items - items
                tick_bytes += telemetry.bytes - size
                items, size = telemetry.items, telemetry.bytes
                LocalRunner(agent, concurrency=4, poll_interval=0.05).work_until_idle(max_seconds=60)
                agent.release()
                run_items += telemetry.items - items
                run_bytes += telemetry.bytes - size
            clock.now += timedelta(minutes=1)
        store = agent.store()
        runs = store.connection.execute("SELECT COUNT(*) FROM agent_runs WHERE status = 'succeeded'").fetchone()[0]
        agent.close()
    return {"ticks": 1440, "connected_ticks": connected, "runs": runs, "active_minutes": [s // 60 for s in active],
            "telemetry_items_per_run": round(run_items / runs, 1) if runs else 0.0,
            # Rounded to 50 bytes: durations and ids vary by a digit from one measurement to the next.
            "telemetry_bytes_per_run": int(round(run_bytes / runs / 50) * 50) if runs else 0,
            "telemetry_bytes_per_connected_tick": int(round(tick_bytes / max(connected, 1) / 50) * 50)}


def measure(prices: dict[str, Any]) -> dict[str, Any]:
    import logging

    logging.disable(logging.WARNING)
    return {"simulated_day": DAY.date().isoformat(), "quiet_max_minutes": prices["quiet_max_minutes"],
            "profiles": {name: measure_profile(jobs, prices["quiet_max_minutes"]) for name, jobs in profiles().items()}}


# ------------------------------------------------------------------ prices × figures


def online_seconds(active_minutes: list[int], delay_minutes: int) -> int:
    """Seconds a serverless database is online in the day: from each use (a connected tick, and
    the doorbells and runs of the minute after it) until the auto-pause delay has passed."""
    covered: list[tuple[int, int]] = []
    for minute in sorted(active_minutes):
        start, end = minute * 60, (minute + 1 + delay_minutes) * 60
        if covered and start <= covered[-1][1]:
            covered[-1] = (covered[-1][0], max(covered[-1][1], end))
        else:
            covered.append((start, end))
    return min(86400, sum(end - start for start, end in covered))


def monthly(figures: dict[str, Any], prices: dict[str, Any], *, quiet_on: bool) -> dict[str, float]:
    month = prices["days_per_month"]
    fx, st, sql, ai = prices["functions_flex"], prices["storage"], prices["sql"], prices["application_insights"]
    connected = figures["connected_ticks"] if quiet_on else figures["ticks"]
    active = figures["active_minutes"] if quiet_on else list(range(1440))
    doorbells = connected * 5          # AGENT_POLL_SECONDS 10: five doorbells in the minute after a connected tick
    executions = figures["ticks"] + figures["runs"] + doorbells
    gb_seconds = executions * fx["billed_seconds_per_execution"] * fx["instance_memory_gb"]
    functions = (max(0.0, executions * month - fx["free_executions_per_month"]) / 1e6 * fx["per_million_executions"]
                 + max(0.0, gb_seconds * month - fx["free_gb_seconds_per_month"]) * fx["per_gb_second"])
    operations = (st["host_queue_polls_per_day"] + figures["ticks"] * st["timer_monitor_operations_per_tick"]
                  + (figures["runs"] + doorbells) * st["queue_operations_per_message"]
                  + ((figures["ticks"] + connected) if quiet_on else 0))   # the horizon record: read a tick, write a connected one
    storage = operations * month / 1e4 * st["per_10k_queue_operations"]
    ingested = (figures["runs"] * figures["telemetry_bytes_per_run"]
                + connected * figures["telemetry_bytes_per_connected_tick"]
                + executions * ai["host_bytes_per_execution"]) * month / 1e9
    insights = max(0.0, ingested - ai["free_gb_per_month"]) * ai["per_gb_ingested"]
    vcore_seconds = online_seconds(active, sql["auto_pause_delay_minutes"]) * sql["serverless_min_vcores"] * month
    serverless = vcore_seconds * sql["serverless_per_vcore_second"] + sql["data_gb"] * sql["serverless_storage_per_gb_month"]
    free = (max(0.0, vcore_seconds - sql["free_vcore_seconds_per_month"]) * sql["serverless_per_vcore_second"])
    return {"executions": executions * month, "gb_seconds": gb_seconds * month, "functions": functions,
            "operations": operations * month, "storage": storage, "ingested_gb": ingested, "insights": insights,
            "vcore_seconds": vcore_seconds, "s0": sql["S0_per_month"], "serverless": serverless, "free": free}


def render(measured: dict[str, Any], prices: dict[str, Any]) -> str:
    lines = [f"Prices of {prices['date']} (bench/cost_prices.json, not verified: see its note); figures of a simulated "
             f"day ({measured['simulated_day']}), quiet ticks on with AGENT_QUIET_MAX_MINUTES="
             f"{measured['quiet_max_minutes']}, serverless auto-pause after {prices['sql']['auto_pause_delay_minutes']} "
             "min; a month is 30.44 days; monthly free grants applied; USD.", "",
             "**Measured per day**", "",
             "| profile | ticks | ticks that connected (quiet on) | runs | DB online, serverless (quiet on / off) "
             "| telemetry per run | per connected tick |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    delay = prices["sql"]["auto_pause_delay_minutes"]
    for name, figures in measured["profiles"].items():
        online = online_seconds(figures["active_minutes"], delay) / 3600
        lines.append(f"| {name} | {figures['ticks']} | {figures['connected_ticks']} | {figures['runs']} "
                     f"| {online:.1f} h / 24.0 h | {figures['telemetry_items_per_run']} items, "
                     f"{figures['telemetry_bytes_per_run']} B | {figures['telemetry_bytes_per_connected_tick']} B |")
    lines += ["", "**Monthly cost, USD**", "",
              "| profile | quiet ticks | Functions (executions, GB-s) | storage (operations) | App Insights (GB) "
              "| DB S0 | DB serverless | DB serverless free offer | total with S0 | total serverless |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, figures in measured["profiles"].items():
        for quiet_on in (False, True):
            cost = monthly(figures, prices, quiet_on=quiet_on)
            common = cost["functions"] + cost["storage"] + cost["insights"]
            lines.append(
                f"| {name} | {'on' if quiet_on else 'off'} "
                f"| {cost['functions']:.2f} ({cost['executions'] / 1000:.0f}k, {cost['gb_seconds'] / 1000:.0f}k) "
                f"| {cost['storage']:.2f} ({cost['operations'] / 1e6:.2f}M) "
                f"| {cost['insights']:.2f} ({cost['ingested_gb']:.2f}) "
                f"| {cost['s0']:.2f} | {cost['serverless']:.2f} | {cost['free']:.2f} "
                f"| {common + cost['s0']:.2f} | {common + cost['serverless']:.2f} |")
    return "\n".join(lines) + "\n"


def doc_with_table(doc: str, table: str) -> str:
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="simulate a day of each profile again")
    parser.add_argument("--write-doc", action="store_true", help="write the tables into docs/cost.md")
    args = parser.parse_args(argv)
    prices = json.loads(PRICES.read_text(encoding="utf-8"))
    if args.measure:
        MEASURED.write_text(json.dumps(measure(prices), indent=1) + "\n", encoding="utf-8")
    measured = json.loads(MEASURED.read_text(encoding="utf-8"))
    table = render(measured, prices)
    if args.write_doc:
        DOC.write_text(doc_with_table(DOC.read_text(encoding="utf-8"), table), encoding="utf-8")
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
