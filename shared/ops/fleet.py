"""Fleet targets seen from the operator's side: a job's fleet steps resolved now, for
``grant-sql --targets`` (which databases need the app's user) and ``doctor`` (can the agent
reach each of them).

Resolution is the one the executor does at every run (shared/engine/fleet.py, shared/jobs/targets.py): one
listing per server or elastic pool the members need, shared here by every step and job that
needs it, then the members turned into databases.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Callable, Iterable

from shared.control.db import connector
from shared.control.sqlerrors import describe
from shared.control.store import Store
from shared.engine.fleet import FleetStep, fleet_steps, unwrap_cause
from shared.engine.planning import PROCEDURE
from shared.errors import NotFoundError, UsageError
from shared.jobs.steps import run_steps
from shared.jobs.targets import Target, dialect_problem, parse_targets

# doctor connects to this many targets at once.
PROBE_PARALLELISM = 8


# doctor tries each target once: a refusing database answers at once, and a check that waited
# out every target's retries would take minutes on a large fleet. (A paused serverless target
# answers 40613 and is reported with that reason; runs retry it.)
PROBE_RETRY_SECONDS = 0.0


def database_fleet_jobs(agent: Any) -> dict[str, list[FleetStep]]:
    """The fleet steps of the valid jobs defined from T-SQL (agent.add_scheduled_job @targets),
    as the engine planned them, by job name: one query."""

    fleets: dict[str, list[FleetStep]] = {}
    setting = f"{PROCEDURE} @targets"
    store = agent.store()
    if store.schema_version() == 0:
        return fleets                  # no schema yet: no job defined from T-SQL either
    store.require_schema()
    for row in store.execute("list_database_fleet_jobs").rows:
        steps = [FleetStep(row["job_name"], s.step, setting, parse_targets(setting, s.targets))
                 for s in run_steps(row) if s.targets]
        if steps:
            fleets[row["job_name"]] = steps
    return fleets


def job_fleet(agent: Any, name: str) -> list[FleetStep]:
    """The fleet steps of the job ``name``, from the agent's settings or, for a job defined from
    T-SQL, from the control database; UsageError naming the job when there is no such valid job,
    or it has no fleet step, or the control database cannot run fleets."""
    job = agent.settings.job(name)
    if job is None:
        invalid = next((bad for bad in agent.settings.invalid_jobs if bad.name == name), None)
        if invalid is not None:
            raise UsageError(f"--targets {name}: the job is invalid: {invalid.message}", setting="--targets",
                             value=name, expected="a valid job with fleet targets")
        defined_in_database = database_fleet_jobs(agent)
        if name not in defined_in_database:
            fleets = sorted({j.name for j in agent.settings.jobs if any(s.targets for s in j.steps)}
                            | set(defined_in_database))
            known = ", ".join(fleets) or "none"
            raise NotFoundError(f"--targets {name}: no valid job named {name!r} with fleet targets in the settings or "
                                f"defined from T-SQL (jobs with fleet targets: {known})", setting="--targets",
                                value=name, expected=f"one of the jobs with fleet targets: {known}")
        steps = defined_in_database[name]
    else:
        steps = fleet_steps(job)
        if not steps:
            raise UsageError(f"--targets {name}: job {name!r} has no fleet step (expected JOB__{name}__TARGETS or "
                             f"JOB__{name}__STEPS__<n>__TARGETS; it runs in "
                             f"{'database ' + repr(job.database) if job.database else 'the control database'})",
                             setting="--targets", value=name, expected="a job with fleet targets")
    problem = dialect_problem([m for s in steps for m in s.members], agent.target.dialect)
    if problem:
        raise UsageError(f"--targets {name}: {problem} (the control database is {agent.target.display})")
    return steps


def probe_target(agent_target: Any, target: Target) -> str | None:
    """Connect to ``target`` once and run SELECT 1: None when it answers, else why not."""

    fast = replace(agent_target, connect_retry_seconds=PROBE_RETRY_SECONDS)
    try:
        connection = connector(fast, target.database, target.server)()
    except Exception as exc:
        return describe(unwrap_cause(exc))
    try:
        cursor = connection.cursor()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        cursor.close()
        return None
    except Exception as exc:
        return describe(unwrap_cause(exc))
    finally:
        try:
            connection.close()
        except Exception:  # noqa: BLE001 - the answer is already known
            pass


def probe_targets(agent_target: Any, targets: Iterable[Target], *,
                  parallelism: int = PROBE_PARALLELISM) -> dict[Target, str | None]:
    """Each target probed once, ``parallelism`` at a time."""
    targets = list(dict.fromkeys(targets))
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(parallelism, len(targets)), thread_name_prefix="probe") as pool:
        answers = list(pool.map(lambda t: probe_target(agent_target, t), targets))
    return dict(zip(targets, answers))


def fast_target_store(agent: Any) -> Callable[..., Store]:
    """A target_store like Agent.target_store, trying each connection once (doctor)."""

    fast = replace(agent.target, connect_retry_seconds=PROBE_RETRY_SECONDS)

    def open_store(database: str, server: str | None = None) -> Store:
        return Store(fast, connector(fast, database, server), job_principal=agent.settings.agent.job_principal,
                     control=False)

    return open_store
